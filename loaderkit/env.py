"""Where this code runs: the (rank, world_size, worker_id, num_workers) topology."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch.distributed as dist
from torch.utils.data import get_worker_info

from loaderkit._callers import host_of
from loaderkit._checks import check_int

__all__ = ["WorkerEnv", "detect"]  # cpu_budget is private to loaderkit


@dataclass(frozen=True, kw_only=True)
class WorkerEnv:
    """One slot of the rank x worker grid.

    Args:
        rank: This process's rank in ``[0, world_size)``.
        world_size: Number of data-parallel processes.
        worker_id: DataLoader worker id in ``[0, max(num_workers, 1))``.
        num_workers: The DataLoader's ``num_workers`` (0: the main process loads).

    Example:
        >>> env = WorkerEnv(rank=1, world_size=2, worker_id=0, num_workers=2)
        >>> env.slot, env.num_slots
        (2, 4)
    """

    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 0

    def __post_init__(self) -> None:
        for name in ("rank", "worker_id"):
            check_int(
                name, getattr(self, name), None, owner="WorkerEnv", fix="pass a plain Python int"
            )
        check_int(
            "world_size", self.world_size, 1, owner="WorkerEnv", fix="use 1 for a single process"
        )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"WorkerEnv: rank must be in [0, world_size={self.world_size}), got "
                f"{self.rank}; pass the process's torch.distributed rank."
            )
        check_int("num_workers", self.num_workers, 0, owner="WorkerEnv", fix="use 0 in-process")
        if not 0 <= self.worker_id < self.workers_per_rank:
            raise ValueError(
                f"WorkerEnv: worker_id must be in [0, {self.workers_per_rank}) for "
                f"num_workers={self.num_workers}, got {self.worker_id}; pass a worker id in "
                "that range (0 when num_workers=0)."
            )

    @property
    def workers_per_rank(self) -> int:
        """Loading slots per rank: ``num_workers``, or 1 for main-process loading."""
        return max(self.num_workers, 1)

    @property
    def num_slots(self) -> int:
        """Loading slots over all ranks."""
        return self.world_size * self.workers_per_rank

    @property
    def slot(self) -> int:
        """This slot's global index, rank-major: ``rank * workers_per_rank + worker_id``."""
        return self.rank * self.workers_per_rank + self.worker_id


def detect(
    *, rank: int | None = None, world_size: int | None = None, loader: object = None
) -> WorkerEnv:
    """The topology of the calling process, read now.

    Rank and world size come from the host (Trainer or Fabric) of ``loader`` or of the
    running fit, else ``torch.distributed``, else ``(0, 1)``; workers from ``get_worker_info()``.
    A ``loader`` given neither override reads as ``(0, 1)`` where its host leaves the split
    to the user (``Trainer(use_distributed_sampler=False)``).

    Args:
        rank: Override the rank.
        world_size: Override the world size.
        loader: The loader (or batch sampler) asking, whose attached host counts.

    Example:
        >>> detect(rank=1, world_size=4).slot
        1
    """
    # Only a loader's split follows the host; without one this is the process's place in
    # the group (num_workers="auto" shares the machine's CPUs by it).
    unnamed = rank is None and world_size is None and loader is not None
    if unnamed and not host_of(loader).splits_loaders():
        rank, world_size = 0, 1
    if world_size == 1 and rank is None:  # one part: this process reads its own data whole
        rank = 0
    if rank is None or world_size is None:
        hosted = host_of(loader).data_parallel()
        if hosted is not None:  # its rank counts only among as many ranks as it has
            if rank is None and world_size not in (None, hosted[1]):
                raise ValueError(  # the global rank would split tensor-parallel peers
                    f"world_size={world_size} was given without rank=, and the Trainer's "
                    f"data-parallel group has {hosted[1]} rank(s); pass rank= too, or leave "
                    "world_size unset."
                )
            rank = hosted[0] if rank is None else rank
            world_size = hosted[1] if world_size is None else world_size
    initialised = group_exists()
    if world_size is None and not initialised and rank not in (None, 0):
        raise ValueError(
            f"rank={rank} was given without world_size=, and no Trainer or torch.distributed "
            "group gives one; pass world_size=, the number of data-parallel ranks."
        )
    group = dist.get_world_size() if initialised else 1
    if rank is None and world_size is not None and world_size > group:
        raise ValueError(  # every process would read rank 0's part (a job array's group of 1)
            f"world_size={world_size} was given without rank=, and no Trainer or "
            "torch.distributed group of that size gives one; pass rank=, this process's "
            "data-parallel rank."
        )
    if world_size is not None and 1 < group < world_size:  # 1: each job of an array its own
        raise ValueError(  # the parts of the ranks past the group's would be read by none
            f"world_size={world_size} is larger than the torch.distributed group ({group} "
            "processes); pass the number of data-parallel ranks."
        )
    if world_size is None:
        world_size = group
    if rank is None:
        rank = dist.get_rank() if initialised else 0
    info = get_worker_info()
    workers = {} if info is None else {"worker_id": info.id, "num_workers": info.num_workers}
    return WorkerEnv(rank=rank, world_size=world_size, **workers)


def group_exists() -> bool:
    """Whether a torch.distributed default group is initialised."""
    return dist.is_available() and dist.is_initialized()


def topology_known(loader: object = None) -> bool:
    """Whether a host of ``loader`` (or the running fit) or a torch.distributed group tells
    the topology: without either, ``(0, 1)`` stands until one appears."""
    return group_exists() or host_of(loader).data_parallel() is not None


def cpu_budget(processes: int = 1) -> int:
    """CPU cores this process may use, shared among ``processes`` processes on the machine."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, processes))
