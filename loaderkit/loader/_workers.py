"""Worker processes: how they start, how they are seeded, how they stop (private).

Both engines (the planned and the stream engine) hand their work to a
``torch.utils.data.DataLoader`` that only turns keys into batches. This is the
one place that builds it, so the start method, the seeding of workers and
the shutdown rules are the same for both.
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from loaderkit._tags import SeedTag
from loaderkit._worker_info import show_user_dataset
from loaderkit.loader._fetch import identity
from loaderkit.seeding import derive_seed, epoch_worker_init_fn

__all__ = ["WorkerPool", "stop_workers"]


@dataclass(frozen=True, kw_only=True)
class WorkerPool:
    """The worker settings of one loader, and the DataLoaders built from them.

    Attributes:
        num_workers: Worker processes (0: the engines load in-process and never
            build a DataLoader).
        pin_memory: Pin batches in the workers' pin thread.
        timeout: Seconds to wait for a batch from a worker (0: forever).
        prefetch_factor: Batches loaded ahead per worker, or None for torch's default.
        persistent: Keep workers alive across epochs.
        user_init: The user's ``worker_init_fn``, called after loaderkit seeds the worker.
        start_method: The user's ``multiprocessing_context``, or None for the default.
    """

    num_workers: int
    pin_memory: bool
    timeout: float
    prefetch_factor: int | None
    persistent: bool
    user_init: Callable[[int], None] | None
    start_method: Any

    def context(self) -> Any:
        """How worker processes start: the user's choice, else ``forkserver`` under DDP.

        A process in a torch.distributed group runs communication threads
        (gloo's, NCCL's), and ``fork`` copies whatever locks they hold at that
        instant into the child, which can then wait on them forever. Measured:
        DDP runs on 2 CPU ranks with forked workers intermittently hung with a
        worker stuck inside ``os.fork`` (2 in ~20 loaded runs). A forkserver
        forks from a clean single-threaded server instead; the cost is a
        one-off server start and unpickling the dataset in each worker.
        """
        if self.start_method is not None or self.num_workers == 0:
            return self.start_method
        if not (dist.is_available() and dist.is_initialized()):
            return None
        ctx = multiprocessing.get_context("forkserver")
        # Import the heavy modules once in the server, not in every worker.
        # "__main__" (the default) lets workers unpickle classes defined in the script.
        ctx.set_forkserver_preload(["__main__", "torch", "loaderkit"])
        return ctx

    def init_fn(self, seed: int, epoch: int, rank: int) -> Callable[[int], None]:
        """The ``worker_init_fn`` of ``epoch``'s workers.

        Keyed by epoch: non-persistent workers restart every epoch and must not
        replay the previous epoch's random streams.
        """
        seeding = epoch_worker_init_fn(
            derive_seed(seed, SeedTag.WORKERS, epoch), rank, self.user_init
        )
        return functools.partial(_start_worker, init=seeding)

    def build(
        self,
        dataset: Dataset[Any],
        *,
        seed: int,
        epoch: int,
        rank: int,
        batch_sampler: Iterable[Any] | None = None,
        persistent: bool | None = None,
    ) -> DataLoader[Any]:
        """A DataLoader whose workers fetch ``dataset``'s items, already batches.

        Args:
            dataset: Items are whole batches (``collate_fn`` is the identity).
            seed: The loader's seed.
            epoch: The epoch these workers start in (seeds them).
            rank: This process's data-parallel rank (seeds them).
            batch_sampler: Keys handed to ``dataset``; None for an iterable dataset.
            persistent: Overrides the pool's ``persistent`` setting.
        """
        return DataLoader(
            dataset,
            batch_size=None if batch_sampler is None else 1,
            batch_sampler=cast("Iterable[list[Any]] | None", batch_sampler),
            num_workers=self.num_workers,
            collate_fn=identity,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            worker_init_fn=self.init_fn(seed, epoch, rank),
            multiprocessing_context=self.context(),
            # Our own generator: torch would otherwise draw the workers' base
            # seed from the global RNG and perturb the model's randomness.
            generator=torch.Generator().manual_seed(derive_seed(seed, SeedTag.BASE)),
            prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent if persistent is None else persistent,
        )


def _start_worker(worker_id: int, *, init: Callable[[int], None]) -> None:
    # Module-level for pickling under spawn/forkserver. The user's dataset is shown
    # before the user's worker_init_fn (called by ``init``) runs.
    show_user_dataset()
    init(worker_id)


def stop_workers(inner: DataLoader[Any], workers: Iterator[Any]) -> None:
    """Shut down the worker processes behind ``workers`` now, not at garbage collection."""
    shutdown = getattr(workers, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()
    if inner._iterator is workers:  # a persistent iterator must not be reused once stopped
        inner._iterator = None
