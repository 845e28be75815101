"""An ``IterableDataset`` passed directly: edges where a loader returned other data, silently.

Each case was measured wrong on 84cc6ec (issue 21): a worker's augmentation
after a resume through the dataset's own state, a dataset whose ``__iter__``
resets itself and returns ``self`` (its first item forever), and the resume
edges torchdata's ``StatefulDataLoader`` tests exercise (an epoch counter the
dataset advances after its last item, a state saved between ``iter()`` and the
first batch, a position the dataset creates in ``__iter__``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from loaderkit import ResumableDataLoader


def as_lists(batches: list[Any]) -> list[Any]:
    """Batches as plain nested lists (tensors and tuples of tensors alike)."""

    def plain(obj: Any) -> Any:
        if isinstance(obj, list | tuple):
            return [plain(o) for o in obj]
        return torch.as_tensor(obj).tolist()

    return [plain(b) for b in batches]


def worker_of() -> tuple[int, int]:
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


# ------------------------------------------------------- point 4: worker randomness
class NoisyPositions(IterableDataset[torch.Tensor]):
    """Keeps its own position (state_dict); each sample draws from all three global RNGs."""

    def __init__(self, per_worker: int = 12) -> None:
        self.per_worker, self.pos = per_worker, 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        worker, _ = worker_of()
        while self.pos < self.per_worker:
            self.pos += 1
            noise = [torch.rand(()).item(), float(np.random.rand()), random.random()]
            yield torch.tensor([100.0 * worker + self.pos, *noise], dtype=torch.float64)

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


def test_resume_through_the_datasets_state_keeps_each_workers_augmentation() -> None:
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(NoisyPositions(), batch_size=2, num_workers=2, seed=5)

    full = as_lists(list(loader()))
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    got = as_lists(head) + as_lists(list(resumed))
    assert [[s[0] for s in b] for b in got] == [[s[0] for s in b] for b in full]  # same samples
    assert got == full  # and the same noise, from every generator
    noise = [s[1] for b in full for s in b]
    assert len(set(noise)) == len(noise)  # the noise is real: no two samples share it


# ------------------------------------------------- point 9: __iter__ resets, returns self
class ResetsOnIter(IterableDataset[int]):
    """A common pattern: ``__iter__`` rewinds the dataset and returns it."""

    def __init__(self, size: int = 5) -> None:
        self.size, self.i = size, 0

    def __iter__(self) -> ResetsOnIter:
        self.i = 0
        return self

    def __next__(self) -> int:
        if self.i >= self.size:
            raise StopIteration
        self.i += 1
        return self.i - 1


@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_dataset_that_resets_in_iter_and_returns_itself_is_read_once(
    num_workers: int, batch_size: int | None
) -> None:
    theirs = as_lists(
        list(islice(DataLoader(ResetsOnIter(), batch_size=batch_size, num_workers=num_workers), 12))
    )
    ours = ResumableDataLoader(ResetsOnIter(), batch_size=batch_size, num_workers=num_workers)
    assert as_lists(list(islice(ours, 12))) == theirs
    assert theirs in ([0, 1, 2, 3, 4], [[0, 1], [2, 3], [4]])


# ------------------------------------- point 11: resume edges (torchdata's own tests)
class CountsEpochsAfterItsEnd(IterableDataset[tuple[int, int]]):
    """Yields ``(i, epoch)``; advances its epoch counter once its stream is exhausted."""

    def __init__(self, size: int = 8) -> None:
        self.size, self.i, self.epoch, self.resume_at = size, 0, 0, 0

    def __iter__(self) -> Iterator[tuple[int, int]]:
        worker, workers = worker_of()
        self.i, self.resume_at = self.resume_at, 0
        for i in range(worker + self.i * workers, self.size, workers):
            self.i += 1
            yield i, self.epoch
        self.i = 0
        self.epoch += 1  # after the last item: a state saved at the end must carry it

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_at, self.epoch = state["i"], state["epoch"]


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True)])
def test_an_epoch_counter_advanced_after_the_last_item_resumes_advanced(
    num_workers: int, persistent: bool
) -> None:
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(
            CountsEpochsAfterItsEnd(),
            batch_size=2,
            num_workers=num_workers,
            persistent_workers=persistent,
            seed=0,
        )

    first = loader()
    epochs = [as_lists(list(first)) for _ in range(3)]
    assert set(epochs[2][0][1]) == {2}  # the uninterrupted run's counter in its third epoch
    saving = loader()
    assert as_lists(list(saving)) == epochs[0]
    state = saving.state_dict()  # after epoch 0 ended: the dataset counts 1 now
    resumed = loader()
    resumed.load_state_dict(state)
    assert as_lists(list(resumed)) == epochs[1]
    assert as_lists(list(resumed)) == epochs[2]


class RngIterator:
    """An iterator that draws from the global RNG and saves that RNG in its state."""

    def __init__(self, size: int) -> None:
        self.size, self.i = size, 0

    def __iter__(self) -> RngIterator:
        return self

    def __next__(self) -> int:
        if self.i >= self.size:
            raise StopIteration
        self.i += 1
        return int(torch.randint(1000, ()).item())

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i, "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = state["i"]
        torch.set_rng_state(state["rng"])


class DrawsFromTheGlobalRng(IterableDataset[int]):
    def __iter__(self) -> RngIterator:
        return RngIterator(12)


def test_a_state_saved_before_the_first_batch_restores_the_streams_start_in_process() -> None:
    loader = ResumableDataLoader(DrawsFromTheGlobalRng(), batch_size=3)
    it = iter(loader)
    state = loader.state_dict()  # after iter(), before the first batch
    saved_run = as_lists(list(it))
    torch.rand(7)  # the global RNG moves on, as a training step would
    loader.load_state_dict(state)
    assert as_lists(list(loader)) == saved_run


class SelfIterating(IterableDataset[int]):
    """Its own iterator, never rewound by ``__iter__``: one pass exhausts the object."""

    def __init__(self, size: int = 100) -> None:
        self.size, self.i = size, 0

    def __iter__(self) -> SelfIterating:
        return self

    def __next__(self) -> int:
        if self.i >= self.size:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.i = state["i"]


def test_a_state_saved_before_the_first_batch_rewinds_a_reused_exhausted_dataset() -> None:
    dataset = SelfIterating()
    loader = ResumableDataLoader(dataset, batch_size=10)
    it = iter(loader)
    state = loader.state_dict()
    assert len(as_lists(list(it))) == 10  # the object is exhausted now
    again = ResumableDataLoader(dataset, batch_size=10)
    again.load_state_dict(state)
    assert [s for b in as_lists(list(again)) for s in b] == list(range(100))


class PositionMadeInIter(IterableDataset[int]):
    """Creates its position in ``__iter__`` (it has none before); ``load_state_dict`` writes
    into it, as torchdata's own test dataset does."""

    def __init__(self, size: int = 40) -> None:
        self.size = size

    def __iter__(self) -> PositionMadeInIter:
        worker, workers = worker_of()
        share = self.size // workers
        self.position = {"next": worker * share, "end": (worker + 1) * share}
        return self

    def __next__(self) -> int:
        if self.position["next"] >= self.position["end"]:
            raise StopIteration
        self.position["next"] += 1
        return self.position["next"] - 1

    def state_dict(self) -> dict[str, Any]:
        return dict(self.position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position.update(state)  # AttributeError if loaded before __iter__


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_position_created_in_iter_resumes(num_workers: int) -> None:
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(PositionMadeInIter(), batch_size=4, num_workers=num_workers)

    full = as_lists(list(islice(loader(), 20)))  # bounded: a reset per batch never ends
    assert sorted(s for b in full for s in b) == list(range(40))
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert as_lists(head) + as_lists(list(islice(resumed, 20))) == full
