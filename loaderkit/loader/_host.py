"""What the engines need of the loader that drives them (private).

The engines (:mod:`._planned`, :mod:`._stream`) are driven by
:class:`~loaderkit.ResumableDataLoader`; typing them against this protocol
instead of the class keeps the import graph one-way (the front end imports
the engines, never the reverse).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol

from torch.utils.data import DataLoader

from loaderkit.loader._auto import AutoWorkers
from loaderkit.loader._fetch import BatchFetcher, KeySource
from loaderkit.loader._workers import WorkerPool
from loaderkit.plan._cursor import PlanCursor
from loaderkit.plan.sample import Schedule

__all__ = ["IterableBatches", "LoaderHost", "StreamBatches"]


class StreamBatches(Protocol):
    """The stream engine as the planned engine's iterator sees it."""

    def iterate(self) -> Generator[Any, None, None]: ...


class IterableBatches(Protocol):
    """The engine of an ``IterableDataset`` passed directly, as the iterator sees it."""

    def iterate(self, run: Any) -> Generator[Any, None, None]: ...


class LoaderHost(Protocol):
    """The loader as its engines see it."""

    seed: int
    _cursor: PlanCursor
    _fetch: BatchFetcher
    _keys: KeySource
    _pool: WorkerPool
    _auto: AutoWorkers | None

    @property
    def num_workers(self) -> int: ...

    @property
    def pin_memory(self) -> bool: ...

    @property
    def _stream(self) -> StreamBatches | None: ...

    @property
    def _iterable(self) -> IterableBatches | None: ...

    @property
    def _current(self) -> object | None: ...

    def _topology(self) -> tuple[int, int]: ...

    def _settle_seed(self) -> None: ...

    def _begin(self) -> tuple[Schedule, int]: ...

    def _began(self, iterator: Any) -> None: ...

    def _handed(self, run: Any, waited: float) -> None: ...

    def _live_iterator(self) -> object | None: ...

    def _awaiting_first_batch(self) -> bool: ...

    def _inner_loader(self, sched: Schedule) -> DataLoader[Any]: ...

    def _use_workers(self, count: int) -> None: ...

    def _rest_of_epoch(self, epoch: int, position: int) -> Schedule: ...
