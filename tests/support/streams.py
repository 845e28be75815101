"""Iterable datasets the loader tests share: streams that keep, lose or rebuild their place.

Light on purpose (torch only): spawned DataLoader workers import the test modules
that use these.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info


def worker_of() -> tuple[int, int]:
    """``(worker id, workers)``, ``(0, 1)`` in the main process."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class Walk(IterableDataset[Any]):
    """Its own iterator over ``range(size)``, never rewound by ``__iter__`` (one pass
    exhausts the object); ``state_dict`` saves its place."""

    def __init__(self, size: int = 100) -> None:
        self.size, self.i = size, 0

    def __iter__(self) -> Walk:
        return self

    def __next__(self) -> Any:
        if self.i >= self.size:
            raise StopIteration
        self.i += 1
        return self.item(self.i - 1)

    def item(self, i: int) -> Any:
        return i

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = state["i"]


class ResetsOnIter(Walk):
    """A common pattern: ``__iter__`` rewinds the dataset and returns it."""

    def __iter__(self) -> ResetsOnIter:
        self.i = 0
        return self


class EpochWalk(Walk):
    """Its own iterator yielding ``(i, epoch)``: at its end it rewinds and counts an epoch,
    so what it holds after one epoch is where the next starts (its state saves both)."""

    def __init__(self, size: int = 10) -> None:
        super().__init__(size)
        self.epoch = 0

    def __next__(self) -> Any:
        if self.i >= self.size:
            self.i, self.epoch = 0, self.epoch + 1
            raise StopIteration
        self.i += 1
        return self.i - 1, self.epoch

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i, self.epoch = state["i"], state["epoch"]


class ShuffledWalk(Walk):
    """Its own iterator: each ``iter()`` draws the epoch's order from the global torch RNG
    (kept in its state), so an extra ``iter()`` call changes the next epoch."""

    def __iter__(self) -> ShuffledWalk:
        self.i, self.order = 0, torch.randperm(self.size).tolist()
        return self

    def item(self, i: int) -> int:
        return int(self.order[i])

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i, "order": list(getattr(self, "order", []))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i, self.order = state["i"], list(state["order"])


class NumpyDrawWalk(Walk):
    """Each item a draw from numpy's global RNG; only the position is in its state."""

    def item(self, i: int) -> int:
        return int(np.random.randint(1000))


def use_bit_generator(name: str, worker_id: int) -> None:
    """A ``worker_init_fn`` (with ``functools.partial``): numpy's global RNG on ``name``."""
    np.random.set_bit_generator(getattr(np.random, name)(worker_id))


class RngWalk(Walk):
    """Each item a draw from the global torch RNG, which its state saves too."""

    def item(self, i: int) -> int:
        return int(torch.randint(1000, ()).item())

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i, "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = state["i"]
        torch.set_rng_state(state["rng"])


class ResumableGenerator(IterableDataset[tuple[int, int]]):
    """A generator ``__iter__`` yielding ``(id, epoch)``: worker ``w`` its block of
    ``sizes[w]`` ids (in-process: all). It resumes from its saved count, resets it after
    its last item, and with ``count_epochs`` advances its epoch counter there too."""

    def __init__(self, sizes: list[int], count_epochs: bool = False) -> None:
        self.sizes, self.count_epochs = sizes, count_epochs
        self.i, self.epoch, self.resume_at = 0, 0, 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        info = get_worker_info()
        sizes, worker = (self.sizes, info.id) if info is not None else ([sum(self.sizes)], 0)
        self.i, self.resume_at = self.resume_at, 0
        start = sum(sizes[:worker])
        for i in range(start + self.i, start + sizes[worker]):
            self.i += 1
            yield i, self.epoch
        self.i = 0  # after the end: a state saved now starts the next pass
        if self.count_epochs:
            self.epoch += 1

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_at, self.epoch = state["i"], state["epoch"]


class PositionFromIter(IterableDataset[int]):
    """Its own iterator, its position made in ``__iter__`` (none before) and split by
    worker; ``load_state_dict`` writes into that position (AttributeError before
    ``__iter__``), as torchdata's CountIterCallsIter does."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __iter__(self) -> PositionFromIter:
        worker, workers = worker_of()
        share = self.length // workers
        self.position = {"curr": share * worker, "end": share * (worker + 1)}
        return self

    def __next__(self) -> int:
        if self.position["curr"] >= self.position["end"]:
            raise StopIteration
        self.position["curr"] += 1
        return self.position["curr"] - 1

    def state_dict(self) -> dict[str, Any]:
        return {"state": dict(self.position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position.update(state["state"])
