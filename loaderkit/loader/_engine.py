"""The engine interface of :class:`~loaderkit.ResumableDataLoader` (private): the front end
builds one engine (planned, stream or iterable), which sees the loader only through a Host.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import itertools
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from torch.utils.data import DataLoader, IterableDataset

from loaderkit._callers import Host as Caller
from loaderkit._callers import host_of
from loaderkit.env import detect, group_exists, topology_known
from loaderkit.errors import LoaderkitError, StateMismatchError
from loaderkit.loader._auto import AutoWorkers
from loaderkit.loader._fetch import FailedBatch, Unbatched
from loaderkit.loader._workers import (
    Describe,
    WorkerPool,
    outdated,
    start_workers,
    stop_inner,
    stop_workers,
)
from loaderkit.plan._cursor import STATE_VERSION, PlanCursor, check_envelope, seal
from loaderkit.plan.samplers import _LenWatch

# seed=None across ranks: DistributedSampler's default, so a script moved from it keeps its order.
DDP_DEFAULT_SEED = 0


@dataclass(slots=True, eq=False)
class Run:
    """One iteration's ticks on the loader's clock (no reference to its iterator)."""

    began: int = 0  # the tick of its first batch; 0: not begun
    last: int = 0  # the tick of its latest batch
    finished: bool = False
    schedule: Any = None
    steps_before: int = 0
    handed: int = 0  # batches handed out (a counted failure included)
    taken_before: int | None = None  # the host's count of batches taken as it began
    taken_last: int | None = None  # and as the latest batch was handed out
    # The latest draw failed: "counted" (its batch counts as handed out) or "raised" (not;
    # "told" once the next draw said the iteration is over).
    failure: str = ""


class Engine(Protocol):
    """How one kind of data is iterated, measured and resumed."""

    plan: Any  # the sample plan (a stand-in where the data has none)
    one_iterator: bool  # a new iter() supersedes the old one (the engine's cursors are shared)

    carries_over: bool  # an epoch goes on where the last ended: a state saved at its end matters

    def length(self) -> int: ...
    def set_epoch(self, epoch: int, *, late: bool = False) -> None: ...
    def iterate(self, run: Run) -> Generator[Any, None, None]: ...
    def state(self) -> dict[str, Any]: ...
    def load(self, state: Any, *, adopt_seed: bool) -> int | None: ...
    def adopt_seed(self, seed: int) -> None: ...
    def describe(self) -> dict[str, Any]: ...
    def close(self) -> None: ...  # stop persistent workers; the next iteration starts new ones


def set_epoch_keeping(
    host: Host, cursor: PlanCursor, plan: Any, epoch: int, *, late: bool = False, sized: bool = True
) -> None:
    """``set_epoch(epoch)``, unless the host only replays an earlier epoch over a loaded one."""
    loaded = cursor.loaded(plan)
    if loaded is not None and epoch != loaded[0]:
        if _replaces_loaded(host, cursor, plan, epoch, *loaded):
            cursor.set_epoch(epoch, late=late)
        return
    if sized and loaded is not None and loaded[1] and host.caller().restored_ended(host.loader):
        # The host ended that epoch at its last batch (limit_train_batches): its rest is empty.
        cursor.end_loaded(plan)
    elif loaded is not None and host.caller().restored_past(host.loader):
        # The restored epoch ended at the saved batch: a loader cycled into this one starts it.
        dropped = cursor.host_starts(epoch)
        if dropped:
            return
    _told_epoch(host, cursor, epoch, late=late, loaded=loaded is not None)


def _told_epoch(
    host: Host, cursor: PlanCursor, epoch: int, *, late: bool, loaded: bool = False
) -> None:
    """``cursor.set_epoch(epoch)``, told whether a loop calls it (a Trainer's calls are handled
    as it makes them) and whether an iteration runs (a step hook: a state saved at its last
    batch then keeps that epoch's end)."""
    caller = host.caller()
    loop = caller.restarting_mid_epoch(host.loader) is None and caller.evaluating() is None
    run = host.live_run()
    in_run = loop and not (late or loaded) and run is not None and not run.finished
    cursor.set_epoch(epoch, late=late, in_run=in_run, by_loop=loop)


def _replaces_loaded(
    host: Host, cursor: PlanCursor, plan: Any, epoch: int, resumes: int, mid_epoch: bool
) -> bool:
    """Whether ``set_epoch(epoch)`` replaces a loaded position in epoch ``resumes``."""
    caller, loader = host.caller(), host.loader
    restarting = caller.restarting_mid_epoch(loader)
    if restarting is False:
        # Lightning starts its epoch afresh (limit_train_batches, a CombinedLoader cycle).
        return True
    if restarting and epoch < resumes:
        # Lightning replays set_epoch after this loader cycled into a later epoch; one it
        # does not cycle ("max_size") ran out in this epoch: its empty rest is kept.
        return not caller.cycles(loader)
    if not mid_epoch and not restarting:
        return True
    raise StateMismatchError(
        f"ResumableDataLoader.set_epoch: epoch={epoch}, but the loaded state is part-way "
        f"through epoch {resumes} (position {cursor.position} of "
        f"{plan.epoch_length(cursor.epoch)}). Call set_epoch({resumes}) or none to resume it, "
        f"or load no state to start epoch {epoch} afresh."
    )


def ran_out() -> Generator[Any, None, None]:
    yield from ()


class Host:
    """What an engine may use of its loader: shared settings, topology and live iterations."""

    def __init__(
        self,
        loader: object,
        *,
        seed: int,
        seed_drawn: bool,
        seed_chosen: bool = False,
        rank: int | None,
        world_size: int | None,
        pool: WorkerPool,
        auto: AutoWorkers | None,
    ) -> None:
        self._loader = weakref.ref(loader)
        self.seed, self.seed_drawn = seed, seed_drawn
        self.seed_chosen = seed_chosen  # drawn from a generator the user seeded: kept on ranks
        self.rank, self.world_size = rank, world_size
        self.pool, self.auto = pool, auto
        self.started = False  # an iteration began: the topology is fixed from then on
        self.topology_cache: tuple[int, int] | None = None
        self._defaulted = False  # the cache is (0, 1) for want of a host or group
        self.len_watch = _LenWatch()
        # Weak: a strong reference would make a cycle that leaves workers to a slow join.
        self.live: weakref.ref[EpochIterator] | None = None
        self.iterators: weakref.WeakSet[EpochIterator] = weakref.WeakSet()
        self.current: Run | None = None
        # (run, its last tick, batches held): what a failed fit's host held of that run
        self.settled: tuple[Run, int, int | LoaderkitError] | None = None
        self.ticks = itertools.count(1)
        self.waited = 0.0

    @property
    def loader(self) -> object:
        loader = self._loader()
        assert loader is not None, "the engine outlived its loader"
        return loader

    def alive(self) -> bool:
        """Whether the loader still exists (a dropped iterator may close after it)."""
        return self._loader() is not None

    def caller(self) -> Caller:
        """The host that drives the loader (Lightning), or ``NO_HOST``."""
        return host_of(self.loader)

    def own_part(self) -> tuple[int, int] | None:
        """This process's ``(rank, world_size)`` where the loader reads one rank's own data in
        a larger data-parallel group (``use_distributed_sampler=False``, ``world_size=1``)."""
        if self.topology()[1] != 1:
            return None
        group = self.caller().data_parallel()
        if group is None:
            env = detect()  # torch.distributed's group, else (0, 1)
            group = (env.rank, env.world_size)
        return (group[0], group[1]) if group[1] > 1 else None

    def held_of(self, run: Run | None) -> int:
        """Batches of ``run`` the host holds untrained (Lightning prefetches without a length)."""
        caller = self.caller()
        drawn = None if run is None else (run.handed, run.failure, run.taken_before, run.taken_last)
        held = caller.held_batches(self.loader, drawn)
        if held is None and self.settled is not None:
            settled_run, last, kept = self.settled
            if settled_run is run and run.last == last:  # no batch drawn since
                if isinstance(kept, LoaderkitError):
                    raise kept
                return kept
        held = held or 0
        if run is None or not run.finished:
            return held
        if caller.sole_loader(self.loader):
            # It ran out with the epoch: the host holds a failed last step's batch, its own last.
            return held
        cycles = caller.cycles(self.loader)
        if held and cycles is False:
            raise LoaderkitError(
                "ResumableDataLoader: this loader ran out inside a CombinedLoader('max_size') "
                "epoch that holds batches ahead, so a resume would start its next epoch there. "
                "Give every combined loader a length (steps_per_epoch= for a stream)."
            )
        if held and cycles is None and not caller.sized_epoch(self.loader):
            # Failing, with no epoch length: which held steps hold its batches is unknown.
            raise LoaderkitError(
                "ResumableDataLoader: a step failed as this combined train loader ran out, so "
                "whether that step held its batch is unknown. Resume from a step checkpoint "
                "saved before the failure."
            )
        return 0

    def settle(self) -> None:
        """A failed fit stops driving the current run: later states leave out what it held."""
        run = self.current
        if run is None:
            return
        try:
            held: int | LoaderkitError = self.held_of(run)
        except LoaderkitError as exc:
            held = exc
        self.settled = (run, run.last, held)

    def name_epoch(self, cursor: PlanCursor, plan: Any) -> bool:
        """Name the epoch the host trains; True: the iteration is empty (``host_names``)."""
        caller = self.caller()
        epoch = caller.epoch_starting(self.loader)
        if not caller.counts_run_outs(self.loader):
            after = caller.epoch_after_restore(self.loader, counted=True)
            loaded = cursor.loaded(plan)
            if after is not None and loaded is not None and loaded < (after, False):
                # The host ended the loaded epoch short (min_size) and begins the next afresh.
                cursor.host_starts(after, ended=True)
            return cursor.host_names(epoch, plan)
        restored = caller.epoch_after_restore(self.loader)
        if restored is not None and cursor.host_starts(restored):
            return False
        # After an epoch's last batch the host goes on to a new epoch: nothing ran out in it.
        return cursor.host_names(epoch, plan, cycles=restored is None)

    def topology(self) -> tuple[int, int]:
        """``(rank, world_size)``; fixed from the first batch on, but a default ``(0, 1)``
        only until a group exists (a loader peeked at before ``init_process_group`` would
        read everything on each rank)."""
        cached = self.topology_cache
        if cached is not None and not (self._defaulted and group_exists()):
            return cached
        env = detect(rank=self.rank, world_size=self.world_size, loader=self.loader)
        if self.started:
            given = self.rank is not None or self.world_size is not None
            self._defaulted = not (given or topology_known(self.loader))
            self.topology_cache = (env.rank, env.world_size)
        return env.rank, env.world_size

    def live_run(self) -> Run | None:
        """The current iterator's run: the one whose position ``state_dict()`` reports."""
        live = None if self.live is None else self.live()
        return None if live is None else live.run

    def awaiting_first_batch(self) -> bool:
        """Whether an iterator has not drawn its first batch, and no begun one is mid-epoch."""
        run = self.live_run()
        if run is not None and not run.finished:
            return False
        return any(not it.begun for it in list(self.iterators))

    def began(self, iterator: EpochIterator) -> None:
        """``iterator`` drew its first batch: its position is the loader's."""
        iterator.run.began = next(self.ticks)
        iterator.run.taken_before = self.caller().batches_taken(self.loader)
        self.current = iterator.run
        self.live = weakref.ref(iterator)

    def stop_iterators(self) -> None:
        """Make every iterator refuse its next batch, and stop its workers now."""
        for old in list(self.iterators):
            old.stopped = True
            old.close()

    def supersede(self) -> None:
        """Stop iterators that can no longer yield; the position is the next one's."""
        self.stop_iterators()
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
                "part-way through an epoch, and a state holds one position. Finish or drop (del) "
                "the older one before saving, or use one loader per iterator (a Trainer's train "
                "and val loaders too)."
            )


class WorkerStreams:
    """The stream and iterable engines' shared part: position, workers, the last hand-outs."""

    carries_over = False  # see Engine
    begun_fields: tuple[str, ...] = ("complete",)  # what beginning an iteration sets

    def __init__(
        self,
        host: Host,
        dataset: Any,
        *,
        plan: Any,
        reseed: Callable[[int], Any] | None,
        batch_size: int,
        drop_last: bool,
        collate_fn: Callable[[list[Any]], Any],
    ) -> None:
        self.host, self.plan, self._reseed = host, plan, reseed
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.collate_fn = collate_fn
        self.workers = max(host.pool.num_workers, 1)
        self._position = PlanCursor()
        self.complete = False
        self._history: deque[Any] = deque(maxlen=16)
        self._inner: DataLoader[Any] | None = None
        self._inner_next: int | None = None  # the epoch persistent workers would serve next
        self.keyed = False  # whether samples draw under per-sample seeds (a stream's transform)

    @property
    def epoch(self) -> int:
        return self._position.epoch

    @property
    def steps_done(self) -> int:
        return self._position.steps_done

    def epoch_length(self, epoch: int) -> int:
        """The batches so far, plus one while the epoch goes on (its length is unknown)."""
        return self.steps_done + (not self.complete)

    def iterate(self, run: Run) -> Generator[Any, None, None]:
        """One epoch's batches (``epoch_batches``). A loaded pass the host was first given an
        empty iteration of (``PlanCursor.host_names``) and whose rest is empty ended where it
        was saved: that empty iteration stood for its end, so the next pass follows."""
        ended_once = self._position.ran_out and self._position.loaded(self) is not None
        handed = run.handed
        yield from self.epoch_batches(run)
        if ended_once and run.handed == handed:
            yield from self.epoch_batches(run)

    def epoch_batches(self, run: Run) -> Generator[Any, None, None]:
        raise NotImplementedError

    def set_epoch(self, epoch: int, *, late: bool = False) -> None:
        if self.host.caller().restarting_mid_epoch(self.host.loader) is None:
            # No fit drives it: set_epoch names the epoch (a last batch may not be known last).
            _told_epoch(self.host, self._position, epoch, late=late)
        else:
            set_epoch_keeping(self.host, self._position, self, epoch, late=late, sized=False)

    def adopt_seed(self, seed: int) -> None:
        assert self._reseed is not None
        self.plan = self._reseed(seed)

    def identity(self) -> dict[str, Any]:
        """What names the data in :meth:`fingerprint` (first, before the loader's settings)."""
        raise NotImplementedError

    def fingerprint(self) -> dict[str, Any]:
        return {
            **self.identity(),
            "seed": self.host.seed,
            # batch_size=None (samples as they come) is not batches of 1.
            "batch_size": None if isinstance(self.collate_fn, Unbatched) else self.batch_size,
            "drop_last": self.drop_last,
        }

    def taken_back(self) -> list[Any]:
        """The last hand-outs, newest first, of the batches the consumer holds untrained."""
        held = self.host.held_of(self.host.current)
        if held > len(self._history):
            raise LoaderkitError(
                f"ResumableDataLoader: the consumer holds {held} batches, but this iteration's "
                f"last {len(self._history)} hand-outs are all that is known (an iteration "
                "begun since, as a cycled loader ran out, holds the rest). Save the state at "
                "another step."
            )
        return list(self._history)[::-1][:held]

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

    def sealed(
        self, kind: str, fields: tuple[str, ...], world_size: int, **state: Any
    ) -> dict[str, Any]:
        """A checksummed state of ``kind`` holding ``fields``: ``state``'s and the common ones."""
        topology = {"world_size": world_size, "num_workers": self.host.pool.num_workers}
        state |= {"version": STATE_VERSION, "kind": kind, "topology": topology}
        return seal({name: state[name] for name in fields}, fields)

    def resume(self, state: Any, adopted: int | None) -> int | None:
        """Take a checked ``state``'s position and ``adopted`` seed (returned); workers restart."""
        if adopted is not None and self._reseed is not None:
            self.adopt_seed(adopted)  # the plan reports the seed the batches are drawn with
        steps_done = int(state["steps_done"])
        self._position.resume_at(int(state["epoch"]), steps_done, steps_done)
        self.complete = bool(state["complete"])
        self._history.clear()
        self.close()
        return adopted

    def workers_for(self, source: Any, epoch: int, *, fresh: bool) -> DataLoader[Any]:
        """The persistent workers at ``epoch``, else a new DataLoader (``fresh``: not kept)."""
        pool = self.host.pool
        persistent = pool.persistent and not fresh
        kept = not outdated(self._inner)  # else numpy's bit generator changed since
        if persistent and self._inner is not None and self._inner_next == epoch and kept:
            return self._inner
        self.close()
        rank, _ = self.host.topology()
        inner = pool.build(
            source,
            seed=self.host.seed,
            epoch=epoch,
            rank=rank,
            persistent=persistent,
            keyed=self.keyed,
        )
        if persistent:
            self._inner, self._inner_next = inner, None
        return inner

    def kept(self) -> tuple[PlanCursor, list[Any], tuple[Any, ...]]:
        """What beginning an iteration changes, for :meth:`start` to put back."""
        fields = tuple(copy.copy(getattr(self, name)) for name in self.begun_fields)
        return dataclasses.replace(self._position), list(self._history), fields

    def start(
        self,
        inner: DataLoader[Any],
        describe: Describe,
        kept: tuple[PlanCursor, list[Any], tuple[Any, ...]],
    ) -> Iterator[Any]:
        """The workers of ``inner``; where they fail to start (one died while idle), the
        iteration did not begin (:meth:`undo`)."""
        try:
            return start_workers(inner, describe)
        except Exception:
            self.close()
            self.undo(kept)
            raise

    def undo(self, kept: tuple[PlanCursor, list[Any], tuple[Any, ...]]) -> None:
        """Put back what beginning an iteration changed (``kept`` before it): it failed before
        its first batch, so the next iteration serves its epoch, as its state says."""
        position, history, fields = kept
        self._position.restore(position)
        self._history.clear()
        self._history.extend(history)
        for name, value in zip(self.begun_fields, fields, strict=True):
            setattr(self, name, value)

    def _drop_inner(self, inner: DataLoader[Any], workers: Iterator[Any]) -> None:
        stop_workers(inner, workers)
        if self._inner is inner:
            self._inner, self._inner_next = None, None

    def close(self) -> None:
        """Stop persistent workers."""
        stop_inner(self._inner)
        self._inner, self._inner_next = None, None


class EngineSource(IterableDataset[Any]):
    """The inner DataLoader's dataset for a stream or iterable engine."""

    def __init__(self, engine: Any) -> None:
        self.user_dataset, self.collate = engine.dataset, engine.collate_fn
        self.batch_size, self.drop_last = engine.batch_size, engine.drop_last


def settle_seed(host: Host, engine: Engine, *, final: bool = True) -> None:
    """Give ``engine`` the ranks' common seed in place of a drawn one (``final=False``: only
    where ``world_size > 1`` is known)."""
    if not host.seed_drawn:
        return
    # A world_size given is checked at the first batch (its group may come after the loader).
    world_size = host.world_size if host.world_size is not None else host.topology()[1]
    if world_size > 1 or host.own_part() is not None:  # rank 0's seed is every rank's
        host.seed_drawn = False
        # The draw of the user's seeded generator is every rank's too (ranks compare orders).
        if host.seed != DDP_DEFAULT_SEED and not host.seed_chosen:
            host.seed = DDP_DEFAULT_SEED
            engine.adopt_seed(DDP_DEFAULT_SEED)
    elif final:
        host.seed_drawn = False


class EpochIterator(Iterator[Any]):
    """One epoch's iteration (its epoch fixed at the first ``next()``)."""

    def __init__(self, loader: Any, host: Host, engine: Engine) -> None:
        self.loader = loader  # kept alive while iterated, as DataLoader's iterator does
        self.host, self.engine = host, engine
        self.run = Run()
        _LIVE.add(self)
        self.stopped = False  # superseded, or the loader closed
        self._batches: Generator[Any, None, None] | None = None

    def __next__(self) -> Any:
        asked = time.perf_counter()
        if self.stopped:
            raise RuntimeError(
                "ResumableDataLoader: this iterator was stopped by close(), or superseded by "
                "a newer iter() or load_state_dict() (under persistent_workers or a stream, "
                "the workers and cursors are the loader's); iterate the loader again, or give "
                "each iterator its own loader (a Trainer's train and val loaders too)."
            )
        if self._batches is None:
            self._batches = self.engine.iterate(self.run)
            self.host.began(self)
        elif self.run.failure == "raised":  # a StopIteration would end the epoch unread
            self.run.failure = "told"  # once: a loop going on past errors then ends
            raise LoaderkitError(
                "ResumableDataLoader: this iteration stopped at the error it raised, before the "
                "end of its epoch; to read the rest, call loader.load_state_dict("
                "loader.state_dict()) and iterate again."
            )
        try:
            batch = next(self._batches)
        except StopIteration:
            self.run.finished = True
            raise
        except BaseException:  # the generator is done: a Ctrl-C too
            self.run.failure = "raised"
            raise
        self.run.last = next(self.host.ticks)
        self.run.handed += 1
        if self.run.taken_before is not None:  # a host counting batches (Lightning's loop)
            self.run.taken_last = self.host.caller().batches_taken(self.loader)
        self.host.waited += time.perf_counter() - asked
        self.run.failure = "counted" if type(batch) is FailedBatch else ""
        if type(batch) is FailedBatch:
            # The traceback must not hold this iterator, or a kept error keeps its workers.
            error = batch.error
            del self, batch
            try:
                raise error
            finally:
                del error
        return batch

    @property
    def begun(self) -> bool:
        return self._batches is not None

    def close(self) -> None:
        """Stop this iteration (and its workers) now."""
        if self._batches is not None:
            self._batches.close()


_LIVE: weakref.WeakSet[EpochIterator] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Stop the workers of iterations still open at exit, before module globals are cleared."""
    for iterator in list(_LIVE):
        iterator.close()
