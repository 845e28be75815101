"""The one engine interface of :class:`~loaderkit.ResumableDataLoader` and what an engine may use.

Private. The front end validates its arguments into a spec and builds one
engine (the sample plan, a stream's cursors, or an ``IterableDataset``'s
workers); after that it only delegates. An engine sees the loader through a
:class:`Host`: the settings they share (seed, worker pool), the topology and
the loader's live iterations, never the front end's own members.
"""

from __future__ import annotations

import atexit
import itertools
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import Any, Protocol

from torch.utils.data import DataLoader, IterableDataset

from loaderkit._callers import Host as Caller
from loaderkit._callers import host_of
from loaderkit.env import detect
from loaderkit.errors import LoaderkitError, StateMismatchError
from loaderkit.loader._auto import AutoWorkers
from loaderkit.loader._fetch import FailedBatch
from loaderkit.loader._workers import WorkerPool, stop_workers
from loaderkit.plan._cursor import PlanCursor, check_envelope
from loaderkit.plan.samplers import _LenWatch

__all__ = [
    "DDP_DEFAULT_SEED",
    "Engine",
    "EngineSource",
    "EpochIterator",
    "Host",
    "Run",
    "WorkerStreams",
    "settle_seed",
]

# The seed of ``seed=None`` across ranks: DistributedSampler's default, so a
# script moved from it keeps its order.
DDP_DEFAULT_SEED = 0


class Run:
    """One iteration's place among a loader's live iterations (no reference to its iterator).

    The loader's state is the position of its *current* run, the one that began
    last; ``last`` (a tick of the loader's clock) says whether an older run kept
    handing out batches after that, which would make a single saved position
    ambiguous. A planned run also keeps its schedule (``len()`` reads it).
    """

    __slots__ = ("began", "finished", "last", "schedule", "steps_before")

    def __init__(self) -> None:
        self.began = 0  # the tick of its first batch; 0: not begun
        self.last = 0  # the tick of its latest batch
        self.finished = False
        self.schedule: Any = None
        self.steps_before = 0


class Engine(Protocol):
    """How one kind of data is iterated, measured and resumed."""

    plan: Any  # the sample plan (a stand-in where the data has none)
    one_iterator: bool  # a new iter() supersedes the old one (the engine's cursors are shared)

    def length(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def iterate(self, run: Run) -> Generator[Any, None, None]: ...

    def state(self) -> dict[str, Any]: ...

    def load(self, state: Any, *, adopt_seed: bool) -> int | None: ...

    def adopt_seed(self, seed: int) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class Host:
    """What an engine may use of its loader: shared settings, topology and live iterations."""

    def __init__(
        self,
        loader: object,
        *,
        seed: int,
        seed_drawn: bool,
        rank: int | None,
        world_size: int | None,
        pool: WorkerPool,
        auto: AutoWorkers | None,
    ) -> None:
        # Weak: the loader holds its host; it is the key of the host's answers.
        self._loader = weakref.ref(loader)
        self.seed, self.seed_drawn = seed, seed_drawn
        self.rank, self.world_size = rank, world_size
        self.pool, self.auto = pool, auto
        self.started = False  # an iteration began: the topology is fixed from then on
        self.topology_cache: tuple[int, int] | None = None
        # Warns when an epoch outgrows the first len(), which Lightning keeps per fit.
        self.len_watch = _LenWatch()
        # The current iterator (the one that began last; its position is the state)
        # and every live one. Weak references: a strong one would put the live
        # iterator, its generator and torch's worker iterator in a reference cycle,
        # whose collection leaves workers to a slow join.
        self.live: weakref.ref[EpochIterator] | None = None
        self.iterators: weakref.WeakSet[EpochIterator] = weakref.WeakSet()
        self.current: Run | None = None
        self.ticks = itertools.count(1)
        self.waited = 0.0

    @property
    def loader(self) -> object:
        """The loader (the key of its caller's answers)."""
        loader = self._loader()
        assert loader is not None, "the engine outlived its loader"
        return loader

    def alive(self) -> bool:
        """Whether the loader still exists (a dropped iterator may close after it)."""
        return self._loader() is not None

    def caller(self) -> Caller:
        """The host that drives the loader (Lightning), or ``NO_HOST``."""
        return host_of(self.loader)

    @property
    def num_workers(self) -> int:
        return self.pool.num_workers

    @property
    def pin_memory(self) -> bool:
        return self.pool.pin_memory

    def topology(self) -> tuple[int, int]:
        """``(rank, world_size)``; fixed from the first batch on."""
        if self.topology_cache is not None:
            return self.topology_cache
        env = detect(rank=self.rank, world_size=self.world_size, loader=self.loader)
        if self.started:
            # The process group exists by then (Lightning builds loaders after it),
            # and state_dict() stays cheap.
            self.topology_cache = (env.rank, env.world_size)
        return env.rank, env.world_size

    def settle_seed(self, *, final: bool = True) -> int | None:
        """The seed to adopt when a drawn one must give way to the ranks' common one.

        Args:
            final: At the first batch the topology is the run's, and a drawn seed
                is kept from then on. Earlier (at construction, in ``state_dict()``)
                only a known ``world_size > 1`` settles it: a process group may
                still be set up after that.
        """
        if not self.seed_drawn:
            return None
        _, world_size = self.topology()
        if world_size > 1:
            self.seed_drawn = False
            if self.seed != DDP_DEFAULT_SEED:
                self.seed = DDP_DEFAULT_SEED
                return self.seed
        elif final:
            self.seed_drawn = False
        return None

    # ------------------------------------------------------------ iterations
    def is_current(self, run: Run) -> bool:
        """Whether ``run`` is the iteration whose position is the loader's."""
        return self.current is run

    def live_run(self) -> Run | None:
        """The current iterator's run: the one whose position ``state_dict()`` reports."""
        live = None if self.live is None else self.live()
        return None if live is None else live.run

    def awaiting_first_batch(self) -> bool:
        """Whether an iterator was made that has not drawn its first batch, while no
        iteration that began is part-way through its epoch (that one is the state)."""
        run = self.live_run()
        if run is not None and not run.finished:
            return False
        return any(not it.begun for it in list(self.iterators))

    def began(self, iterator: EpochIterator) -> None:
        """``iterator`` drew its first batch: its position is the loader's from now on."""
        iterator.run.began = next(self.ticks)
        self.current = iterator.run
        self.live = weakref.ref(iterator)

    def supersede(self) -> None:
        """Stop the workers of iterators that can no longer yield, now."""
        for old in list(self.iterators):
            old.superseded = True
            old.close()
        self.iterators = weakref.WeakSet()
        self.live, self.current = None, None

    def check_one_position(self) -> None:
        """Refuse a state while two live iterators have both moved since the newer began."""
        current = self.current
        if current is None:
            return
        for other in list(self.iterators):
            run = other.run
            if run is current or run.finished or run.last <= current.began:
                continue
            raise LoaderkitError(
                "ResumableDataLoader.state_dict: two live iterators over this loader are both "
                "part-way through their epochs, and the older one handed out batches after the "
                "newer one began. A state holds one position (the newer iterator's), so "
                "resuming from it would silently drop the rest of the older iterator's epoch. "
                "Finish or drop (del) one of them before saving, or use one loader per "
                "iterator."
            )


class WorkerStreams:
    """What the stream and iterable engines share: a position counted in batches, each
    worker's own stream (persistent workers kept between whole epochs), and the last
    hand-outs, to take back the batches a consumer holds unused (Lightning's prefetch)."""

    def __init__(self, host: Host, plan: Any, reseed: Callable[[int], Any] | None) -> None:
        self.host, self.plan, self._reseed = host, plan, reseed
        self.workers = max(host.num_workers, 1)
        self._position = PlanCursor()
        self.complete = False  # the current epoch's streams ended
        self._history: deque[Any] = deque(maxlen=16)
        self._inner: DataLoader[Any] | None = None  # persistent workers between whole epochs
        self._inner_next: int | None = None  # the epoch they would serve next
        self.held_batches: Callable[[], int] | None = None  # else the host says

    @property
    def started(self) -> bool:
        return self._position.started

    @property
    def epoch(self) -> int:
        return self._position.epoch

    def set_epoch(self, epoch: int) -> None:
        self._position.set_epoch(epoch)

    def adopt_seed(self, seed: int) -> None:
        assert self._reseed is not None
        self.plan = self._reseed(seed)

    def held(self) -> int:
        """Batches handed out that the consumer holds untrained (not consumed)."""
        if self.held_batches is not None:
            held = self.held_batches()
        else:
            held = self.host.caller().held_batches(self.host.loader) or 0
        if held > len(self._history):
            raise LoaderkitError(
                f"ResumableDataLoader: the consumer holds {held} batches but only "
                f"{len(self._history)} hand-outs are remembered; the state cannot be exact: "
                "save the state while the consumer holds at most that many batches."
            )
        return held

    def open_state(
        self, state: Any, kind: str, fields: tuple[str, ...], over: str, hint: str
    ) -> None:
        """Stop every iteration, then refuse a ``state`` that is not a whole one of ``kind``."""
        self.host.supersede()
        check_envelope(state, fields, owner="ResumableDataLoader", hint=hint)
        if state["kind"] != kind:
            raise StateMismatchError(
                f"ResumableDataLoader.load_state_dict: field 'kind' is {state['kind']!r}, "
                f"expected {kind!r}; pass the state of a loader over {over}."
            )

    def resume(self, state: Any) -> None:
        """Take the position of a checked ``state``; workers start afresh."""
        steps_done = int(state["steps_done"])
        self._position.resume_at(int(state["epoch"]), steps_done, steps_done)
        self.complete = bool(state["complete"])
        self._history.clear()
        self.close()

    def _drop_inner(self, inner: DataLoader[Any], workers: Iterator[Any]) -> None:
        # Persistent workers ran ahead of what was handed out: they cannot serve on.
        stop_workers(inner, workers)
        if self._inner is inner:
            self._inner, self._inner_next = None, None

    def close(self) -> None:
        """Stop persistent workers (a state was loaded, or they are not at the next epoch)."""
        inner = self._inner
        if inner is not None and inner._iterator is not None:
            stop_workers(inner, inner._iterator)
        self._inner, self._inner_next = None, None


class EngineSource(IterableDataset[Any]):
    """What the inner DataLoader of a stream or iterable engine iterates: the user's data,
    batched as the engine batches."""

    def __init__(self, engine: Any) -> None:
        self.ds, self.collate = engine.dataset, engine.collate_fn
        self.batch_size, self.drop_last = engine.batch_size, engine.drop_last

    @property
    def user_dataset(self) -> Any:
        """The dataset the user gave the loader (what ``get_worker_info().dataset`` shows)."""
        return self.ds


def settle_seed(host: Host, engine: Engine, *, final: bool = True) -> None:
    """Settle a drawn seed (:meth:`Host.settle_seed`) and give the engine the one adopted."""
    seed = host.settle_seed(final=final)
    if seed is not None:
        engine.adopt_seed(seed)


class EpochIterator(Iterator[Any]):
    """One epoch's iteration; its engine decides the epoch at the first ``next()``.

    Independent of the loader's other iterators, as ``DataLoader``'s are,
    except where the loader marks it ``superseded`` (persistent workers, which
    torch also resets, and streams, whose cursors are the loader's).
    """

    def __init__(self, loader: Any, host: Host, engine: Engine) -> None:
        self.loader = loader  # kept alive while iterated, as DataLoader's iterator keeps its own
        self.host, self.engine = host, engine
        self.run = Run()
        _LIVE.add(self)
        self.superseded = False
        self._batches: Generator[Any, None, None] | None = None

    def __next__(self) -> Any:
        asked = time.perf_counter()
        if self.superseded:
            raise RuntimeError(
                "ResumableDataLoader: this iterator was superseded by a newer iter() or "
                "load_state_dict() (with persistent_workers=True the loader has one set of "
                "workers, which torch's DataLoader also resets for each iter(); a stream's "
                "cursors belong to the loader); iterate the loader again."
            )
        if self._batches is None:
            self._batches = self.engine.iterate(self.run)
            self.host.began(self)
        try:
            batch = next(self._batches)
        except StopIteration:
            self.run.finished = True
            raise
        self.run.last = next(self.host.ticks)
        self.host.waited += time.perf_counter() - asked
        if type(batch) is FailedBatch:
            # Raised in the batch's place; the next next() goes on with the epoch, as
            # DataLoader's does. The traceback must not hold this iterator: an error the
            # caller keeps would keep its workers running after the caller dropped it.
            error = batch.error
            del self, batch
            try:
                raise error
            finally:
                del error
        return batch

    @property
    def begun(self) -> bool:
        """Whether the first ``next()`` was called (it fixes the epoch)."""
        return self._batches is not None

    def close(self) -> None:
        """Stop this iteration (and its workers) now."""
        if self._batches is not None:
            self._batches.close()


# Every iterator not yet collected, closed at interpreter exit (see _close_at_exit).
_LIVE: weakref.WeakSet[EpochIterator] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Stop the workers of iterations still open at exit, as torch's own iterators do
    (left to interpreter teardown, their cleanup ran after module globals were cleared)."""
    for iterator in list(_LIVE):
        iterator.close()
