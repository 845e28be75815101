"""One epoch of a :class:`~loaderkit.ResumableDataLoader`: the in-process and the worker path.

Private. The loader decides *which* batches (its plan and position); this
module hands them out, counting each batch as consumed when the caller gets
it, and stops worker processes as soon as an iteration can no longer yield.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from functools import partial
from typing import Any

from loaderkit.loader._host import LoaderHost
from loaderkit.loader._workers import guard_workers, stop_workers
from loaderkit.plan.sample import Schedule
from loaderkit.transfer import pin_batch

__all__ = ["EpochIterator", "describe_step", "run_epoch"]


class EpochIterator(Iterator[Any]):
    """One epoch's iteration; decides its epoch at the first ``next()``."""

    def __init__(self, loader: LoaderHost) -> None:
        self.loader = loader
        self.schedule: Schedule | None = None
        self.steps_before = 0
        self._batches: Generator[Any, None, None] | None = None

    def __next__(self) -> Any:
        loader = self.loader
        if loader._live_iterator() is not self:
            raise RuntimeError(
                "ResumableDataLoader: this iterator was superseded by a newer iter() or "
                "load_state_dict(); iterate the loader again."
            )
        if self._batches is None and loader._stream is not None:
            self._batches = loader._stream.iterate()
        elif self._batches is None:
            self.schedule, self.steps_before = loader._begin()
            self._batches = run_epoch(loader, self.schedule)
        return next(self._batches)

    def close(self) -> None:
        """Stop this iteration (and its workers) now."""
        if self._batches is not None:
            self._batches.close()


def run_epoch(loader: LoaderHost, sched: Schedule) -> Generator[Any, None, None]:
    # A function, not an EpochIterator method: the generator must not
    # reference the iterator that owns it (see ResumableDataLoader._live).
    consumed = loader._cursor.consumed
    if loader.num_workers == 0:
        fetch, pin = loader._fetch, loader.pin_memory
        for step in range(sched.num_steps):
            batch = fetch(sched.epoch, sched.indices(step))
            if pin:
                batch = pin_batch(batch)
            consumed(sched.position_after(step))
            yield batch
        return
    loader._keys.schedule = sched
    inner = loader._inner_loader(sched.epoch)
    workers = iter(inner)
    try:
        # Task k of torch's worker iterator is step k of the schedule (keys in order).
        for step, batch in enumerate(guard_workers(workers, partial(describe_step, sched))):
            consumed(sched.position_after(step))
            yield batch
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


def describe_step(sched: Schedule, task: int, worker: int) -> tuple[str, Any]:
    """What batch ``task`` of ``sched`` holds, for a message about a dead worker."""
    if not 0 <= task < sched.num_steps:
        return f"batch {task} (past the epoch's {sched.num_steps})", None
    indices = sched.indices(task).tolist()
    shown = indices if len(indices) <= 16 else [*indices[:16], "..."]
    return f"sample indices {shown} (epoch {sched.epoch}, batch {task})", indices
