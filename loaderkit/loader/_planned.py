"""One epoch of a :class:`~loaderkit.ResumableDataLoader`: the in-process and the worker path.

Private. The loader decides *which* batches (its plan and position); this
module hands them out, counting each batch as consumed when the caller gets
it, and stops worker processes as soon as an iteration can no longer yield.
"""

from __future__ import annotations

import atexit
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from functools import partial
from typing import Any

from loaderkit.loader._fetch import FailedBatch, seed_keys
from loaderkit.loader._host import LoaderHost
from loaderkit.loader._workers import guard_workers, stop_workers
from loaderkit.plan.sample import Schedule
from loaderkit.transfer import pin_batch

__all__ = ["EpochIterator", "Run", "describe_step", "run_epoch"]


class Run:
    """One iteration's place among a loader's live iterations (no reference to its iterator).

    The loader's state is the position of its *current* run, the one that began
    last; ``last`` (a tick of the loader's clock) says whether an older run kept
    handing out batches after that, which would make a single saved position
    ambiguous.
    """

    __slots__ = ("began", "finished", "last")

    def __init__(self) -> None:
        self.began = 0  # the tick of its first batch; 0: not begun
        self.last = 0  # the tick of its latest batch
        self.finished = False


class EpochIterator(Iterator[Any]):
    """One epoch's iteration; decides its epoch at the first ``next()``.

    Independent of the loader's other iterators, as ``DataLoader``'s are,
    except where the loader marks it ``superseded`` (persistent workers, which
    torch also resets, and streams, whose cursors are the loader's).
    """

    def __init__(self, loader: LoaderHost) -> None:
        self.loader = loader
        self.run = Run()
        _LIVE.add(self)
        self.schedule: Schedule | None = None
        self.steps_before = 0
        self.superseded = False
        self._batches: Generator[Any, None, None] | None = None

    def __next__(self) -> Any:
        asked = time.perf_counter()
        loader = self.loader
        if self.superseded:
            raise RuntimeError(
                "ResumableDataLoader: this iterator was superseded by a newer iter() or "
                "load_state_dict() (with persistent_workers=True the loader has one set of "
                "workers, which torch's DataLoader also resets for each iter(); a stream's "
                "cursors belong to the loader); iterate the loader again."
            )
        if self._batches is None:
            if loader._stream is not None:
                self._batches = loader._stream.iterate()
            elif loader._iterable is not None:
                self._batches = loader._iterable.iterate(self.run)
            else:
                self.schedule, self.steps_before = loader._begin()
                self._batches = run_epoch(loader, self.schedule, self.run)
            loader._began(self)
        try:
            batch = next(self._batches)
        except StopIteration:
            self.run.finished = True
            raise
        loader._handed(self.run, time.perf_counter() - asked)
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
    """Stop the workers of iterations still open at exit, as torch's own iterators do.

    Left to interpreter teardown, an abandoned iteration's generator was finalized
    after the module globals its cleanup calls had been cleared, and printed
    tracebacks on stderr. Here every module is still whole.
    """
    for iterator in list(_LIVE):
        iterator.close()


def run_epoch(loader: LoaderHost, sched: Schedule, run: Run) -> Generator[Any, None, None]:
    # A function, not an EpochIterator method: the generator must not
    # reference the iterator that owns it (see ResumableDataLoader._live).
    cursor = loader._cursor

    def consumed(position: int) -> None:
        # Only the current run moves the loader's position; an older live iterator
        # yields its own epoch without touching it (as a second DataLoader iterator does).
        if loader._current is run:
            cursor.consumed(position)

    if loader._auto is not None and not loader._auto.settled:
        yield from _run_auto(loader, sched, consumed)
        return
    for step, batch in _batches(loader, sched):
        consumed(sched.position_after(step))
        yield batch


def _batches(loader: LoaderHost, sched: Schedule) -> Generator[tuple[int, Any], None, None]:
    """``(step, batch)`` of ``sched``, in this process or from the loader's workers."""
    if loader.num_workers == 0:
        fetch, pin = loader._fetch, loader.pin_memory
        for step in range(sched.num_steps):
            try:
                batch = fetch(sched.epoch, sched.indices(step), seed_keys(sched, step))
            except Exception as exc:  # raised in the batch's place (EpochIterator)
                batch = FailedBatch(exc)
            else:
                batch = pin_batch(batch) if pin else batch
            yield step, batch
        return
    inner = loader._inner_loader(sched)
    workers = iter(inner)
    try:
        # Task k of torch's worker iterator is step k of the schedule (keys in order).
        yield from enumerate(guard_workers(workers, partial(describe_step, sched)))
    except GeneratorExit:
        if not loader._pool.persistent:
            stop_workers(inner, workers)
        raise
    except BaseException:
        # A worker's exception holds torch's worker iterator in a reference
        # cycle through its traceback: without this, the workers live until
        # the cycle collector runs, then stall 5 s each in join().
        stop_workers(inner, workers)
        raise


def _run_auto(
    loader: LoaderHost, sched: Schedule, consumed: Callable[[int], None]
) -> Generator[Any, None, None]:
    """One epoch under ``num_workers="auto"``: measure, and switch workers at a batch boundary.

    A switch starts the new way of loading at the plan position reached so far
    (as a resume with another ``num_workers`` would): batches the old workers
    had prefetched are dropped, never handed out, so nothing repeats or skips.
    """
    auto = loader._auto
    assert auto is not None
    while True:
        source = _batches(loader, sched)
        switch_to: int | None = None
        asked = time.perf_counter()
        for step, batch in source:
            got = time.perf_counter()
            consumed(sched.position_after(step))
            yield batch
            back = time.perf_counter()
            auto.record(got - asked, back - got)
            asked = back
            switch_to = auto.decide()
            if switch_to is not None and step + 1 < sched.num_steps:
                position = sched.position_after(step)
                break
            switch_to = None
        else:
            return
        source.close()
        loader._use_workers(switch_to)
        # The rest of the epoch, dealt from the position reached (as a resume deals it).
        sched = loader._rest_of_epoch(sched.epoch, position)


def describe_step(sched: Schedule, task: int, worker: int) -> tuple[str, Any]:
    """What batch ``task`` of ``sched`` holds, for a message about a dead worker."""
    if not 0 <= task < sched.num_steps:
        return f"batch {task} (past the epoch's {sched.num_steps})", None
    indices = sched.indices(task).tolist()
    shown = indices if len(indices) <= 16 else [*indices[:16], "..."]
    return f"sample indices {shown} (epoch {sched.epoch}, batch {task})", indices
