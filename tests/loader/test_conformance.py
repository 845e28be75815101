"""DataLoader conformance: the torch.utils.data documentation's examples, through both loaders.

Each example (from the docstrings of ``torch/utils/data/{dataloader,sampler,dataset}.py``
and the ``torch.utils.data`` docs page) runs through ``torch.utils.data.DataLoader``
and through ``ResumableDataLoader`` with ``num_workers`` 0 and 2, and the two must
yield the same samples: the same order where torch's order is deterministic, else
the same multiset. A random sampler draws from the generator loaderkit seeds per
epoch (``derive_seed(seed, "sampler", epoch)``); given a generator in that state,
torch's DataLoader draws the same order, so those are compared in order too.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    default_collate,
    get_worker_info,
)

import loaderkit.transfer
from loaderkit import ResumableDataLoader
from loaderkit._tags import SeedTag
from loaderkit.seeding import derive_seed

SEED = 7
WORKERS = [0, 2]


def flat(batches: Any) -> list[Any]:
    """Every batch as nested lists of values (tensors and arrays as lists), in order."""

    def walk(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor | np.ndarray):
            return torch.as_tensor(obj).tolist()
        if isinstance(obj, dict):
            return {key: walk(obj[key]) for key in sorted(obj)}
        if isinstance(obj, list | tuple):
            return [walk(item) for item in obj]
        return obj

    return [walk(batch) for batch in batches]


def leaves(batches: Any) -> list[Any]:
    """Every scalar value of the batches (for multisets: how they were batched aside)."""
    out: list[Any] = []

    def walk(obj: Any) -> None:
        if isinstance(obj, dict):
            for key in sorted(obj):
                walk(obj[key])
        elif isinstance(obj, list | tuple):
            for item in obj:
                walk(item)
        else:
            out.append(obj)

    walk(flat(batches))
    return out


def both(dataset: Any, num_workers: int, **kwargs: Any) -> tuple[list[Any], list[Any]]:
    """The batches of one epoch from torch's DataLoader and from ResumableDataLoader."""
    torch_kwargs = {k: v for k, v in kwargs.items() if k != "ours"}
    ours = kwargs.pop("ours", {})
    theirs = list(DataLoader(dataset, num_workers=num_workers, **torch_kwargs))
    mine = list(ResumableDataLoader(dataset, num_workers=num_workers, seed=SEED, **kwargs, **ours))
    return theirs, mine


def same_order(theirs: list[Any], mine: list[Any]) -> None:
    assert len(mine) == len(theirs)
    assert flat(mine) == flat(theirs)


def same_multiset(theirs: list[Any], mine: list[Any]) -> None:
    assert len(mine) == len(theirs)
    assert collections.Counter(map(repr, leaves(mine))) == collections.Counter(
        map(repr, leaves(theirs))
    )


def epoch_generator(epoch: int = 0) -> torch.Generator:
    """The generator state loaderkit gives a sampler in ``epoch``."""
    return torch.Generator().manual_seed(derive_seed(SEED, SeedTag.SAMPLER, epoch))


# ------------------------------------------------------------------- samplers
@pytest.mark.parametrize("num_workers", WORKERS)
def test_sequential_sampler(num_workers: int) -> None:
    data = list(range(10))
    same_order(*both(data, num_workers, batch_size=3, sampler=SequentialSampler(data)))


@pytest.mark.parametrize("num_workers", WORKERS)
def test_random_sampler_with_a_generator(num_workers: int) -> None:
    # sampler.py: RandomSampler(data_source, replacement=False, num_samples=None, generator=None)
    data = list(range(20))
    theirs = list(
        DataLoader(data, batch_size=4, sampler=RandomSampler(data, generator=epoch_generator()))
    )
    mine = list(
        ResumableDataLoader(
            data,
            batch_size=4,
            sampler=RandomSampler(data, generator=torch.Generator()),
            num_workers=num_workers,
            seed=SEED,
        )
    )
    same_order(theirs, mine)  # the generator in the same state draws the same order
    # any generator: another order, the same samples
    same_multiset(
        list(DataLoader(data, batch_size=4, sampler=RandomSampler(data), num_workers=num_workers)),
        mine,
    )


@pytest.mark.parametrize("num_workers", WORKERS)
def test_random_sampler_with_replacement_and_num_samples(num_workers: int) -> None:
    data = list(range(10))

    def sampler(gen: torch.Generator) -> RandomSampler:
        return RandomSampler(data, replacement=True, num_samples=25, generator=gen)

    theirs = list(DataLoader(data, batch_size=5, sampler=sampler(epoch_generator())))
    mine = list(
        ResumableDataLoader(
            data,
            batch_size=5,
            sampler=sampler(torch.Generator()),
            num_workers=num_workers,
            seed=SEED,
        )
    )
    same_order(theirs, mine)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_subset_random_sampler(num_workers: int) -> None:
    data = list(range(100, 130))
    indices = [3, 5, 8, 13, 21, 29]
    theirs = list(
        DataLoader(
            data, batch_size=2, sampler=SubsetRandomSampler(indices, generator=epoch_generator())
        )
    )
    mine = list(
        ResumableDataLoader(
            data,
            batch_size=2,
            sampler=SubsetRandomSampler(indices),
            num_workers=num_workers,
            seed=SEED,
        )
    )
    same_order(theirs, mine)
    assert sorted(leaves(mine)) == [100 + i for i in indices]


@pytest.mark.parametrize("num_workers", WORKERS)
def test_weighted_random_sampler_docstring_example(num_workers: int) -> None:
    # sampler.py: list(WeightedRandomSampler([0.1, 0.9, 0.4, 0.7, 3.0, 0.6], 5, replacement=True))
    weights = [0.1, 0.9, 0.4, 0.7, 3.0, 0.6]
    data = list(range(6))
    for replacement in (True, False):
        theirs = list(
            DataLoader(
                data,
                batch_size=2,
                sampler=WeightedRandomSampler(
                    weights, 5, replacement=replacement, generator=epoch_generator()
                ),
            )
        )
        mine = list(
            ResumableDataLoader(
                data,
                batch_size=2,
                sampler=WeightedRandomSampler(weights, 5, replacement=replacement),
                num_workers=num_workers,
                seed=SEED,
            )
        )
        same_order(theirs, mine)
        if not replacement:
            assert len(set(leaves(mine))) == 5


@pytest.mark.parametrize("num_workers", WORKERS)
def test_batch_sampler_docstring_example(num_workers: int) -> None:
    # sampler.py: list(BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=False))
    # [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]; drop_last=True: [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    data = list(range(10))
    for drop_last, want in (
        (False, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]),
        (True, [[0, 1, 2], [3, 4, 5], [6, 7, 8]]),
    ):
        sampler = BatchSampler(SequentialSampler(range(10)), batch_size=3, drop_last=drop_last)
        theirs, mine = both(data, num_workers, batch_sampler=sampler)
        same_order(theirs, mine)
        assert [b.tolist() for b in mine] == want


@pytest.mark.parametrize("num_workers", WORKERS)
def test_batch_sampler_over_a_random_sampler(num_workers: int) -> None:
    data = list(range(12))
    theirs = list(
        DataLoader(
            data,
            batch_sampler=BatchSampler(RandomSampler(data, generator=epoch_generator()), 5, False),
        )
    )
    mine = list(
        ResumableDataLoader(
            data,
            batch_sampler=BatchSampler(RandomSampler(data), 5, False),
            num_workers=num_workers,
            seed=SEED,
        )
    )
    same_order(theirs, mine)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_shuffle_true_is_the_same_multiset(num_workers: int) -> None:
    data = list(range(25))
    same_multiset(*both(data, num_workers, batch_size=4, shuffle=True))


# ------------------------------------------------ iterable-style datasets
class MyIterableDataset(IterableDataset[int]):
    """dataset.py, Example 1: splitting workload across all workers in ``__iter__``."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__()
        assert end > start, "this example only works with end >= start"
        self.start = start
        self.end = end

    def __iter__(self) -> Iterator[int]:
        worker_info = get_worker_info()
        if worker_info is None:  # single-process data loading, return the full iterator
            iter_start = self.start
            iter_end = self.end
        else:  # in a worker process
            # split workload
            per_worker = int(math.ceil((self.end - self.start) / float(worker_info.num_workers)))  # noqa: RUF046
            worker_id = worker_info.id
            iter_start = self.start + worker_id * per_worker
            iter_end = min(iter_start + per_worker, self.end)
        return iter(range(iter_start, iter_end))


class RangeIterable(IterableDataset[int]):
    """dataset.py, Example 2: the split is made by ``worker_init_fn``."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__()
        self.start = start
        self.end = end

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end))


def worker_init_fn(worker_id: int) -> None:
    """dataset.py, Example 2: configure each worker's dataset copy."""
    worker_info = get_worker_info()
    assert worker_info is not None
    dataset = worker_info.dataset  # the dataset copy in this worker process
    overall_start = dataset.start
    overall_end = dataset.end
    # configure the dataset to only process the split workload
    per_worker = int(math.ceil((overall_end - overall_start) / float(worker_info.num_workers)))  # noqa: RUF046
    worker_id = worker_info.id
    dataset.start = overall_start + worker_id * per_worker
    dataset.end = min(dataset.start + per_worker, overall_end)


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("batch_size", [1, 2, None])
def test_iterable_split_in_iter(num_workers: int, batch_size: int | None) -> None:
    # torch docs: [tensor([3]), tensor([4]), ...] with num_workers=0; 2 workers interleave.
    ds = MyIterableDataset(start=3, end=7)
    theirs, mine = both(ds, num_workers, batch_size=batch_size)
    same_order(theirs, mine)
    assert sorted(leaves(mine)) == [3, 4, 5, 6]


@pytest.mark.parametrize("num_workers", WORKERS)
def test_iterable_split_by_worker_init_fn(num_workers: int) -> None:
    ds = RangeIterable(start=3, end=7)
    theirs, mine = both(ds, num_workers, worker_init_fn=worker_init_fn)
    same_order(theirs, mine)
    assert sorted(leaves(mine)) == [3, 4, 5, 6]  # every sample once, not per worker


@pytest.mark.parametrize("num_workers", WORKERS)
def test_iterable_without_a_split_repeats_per_worker_as_torch_does(num_workers: int) -> None:
    same_order(*both(RangeIterable(0, 5), num_workers, batch_size=2))


# ------------------------------------------------------ unbatched, worker info
@pytest.mark.parametrize("num_workers", WORKERS)
def test_unbatched_loading(num_workers: int) -> None:
    # "Disable automatic batching": batch_size=None yields samples, default_convert applied.
    data = [np.array([i, i + 1]) for i in range(5)]
    theirs, mine = both(data, num_workers, batch_size=None)
    same_order(theirs, mine)
    assert all(isinstance(s, torch.Tensor) and s.shape == (2,) for s in mine)


class WorkerInfoDataset(torch.utils.data.Dataset[tuple[int, int, str, int]]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, int, str, int]:
        info = get_worker_info()
        if info is None:
            return (-1, 0, "", index)
        return (info.id, info.num_workers, type(info.dataset).__name__, index)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_worker_info(num_workers: int) -> None:
    theirs, mine = both(WorkerInfoDataset(), num_workers, batch_size=None)
    same_multiset(theirs, mine)  # who loads which index may differ; what workers see does not
    ids = {s[0] for s in flat_samples(mine)}
    assert ids == ({-1} if num_workers == 0 else {0, 1})
    names = {s[2] for s in flat_samples(mine)}
    assert names == ({""} if num_workers == 0 else {"WorkerInfoDataset"})


def flat_samples(samples: list[Any]) -> list[tuple[Any, ...]]:
    return [tuple(int(v) if isinstance(v, torch.Tensor) else v for v in s) for s in samples]


# ----------------------------------------------------------- collate functions
Point = collections.namedtuple("Point", ["x", "y"])


class Records(torch.utils.data.Dataset[Any]):
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> Any:
        if self.kind == "dict":
            return {"x": torch.full((2,), float(i)), "label": i, "name": f"s{i}"}
        if self.kind == "namedtuple":
            return Point(np.float64(i), torch.tensor([i, -i]))
        return (np.arange(3) + i, i)


def collate_list(batch: list[Any]) -> list[Any]:
    return list(batch)


def collate_sum(batch: list[Any]) -> torch.Tensor:
    return torch.tensor(sum(b["label"] for b in batch))


@pytest.mark.parametrize("num_workers", WORKERS)
@pytest.mark.parametrize("kind", ["dict", "namedtuple", "tuple"])
@pytest.mark.parametrize("collate_fn", [None, default_collate, collate_list])
def test_collate_fn_variants(num_workers: int, kind: str, collate_fn: Any) -> None:
    theirs, mine = both(Records(kind), num_workers, batch_size=4, collate_fn=collate_fn)
    same_order(theirs, mine)
    if collate_fn is None and kind == "namedtuple":
        assert type(mine[0]).__name__ == "Point"  # default_collate keeps the namedtuple


@pytest.mark.parametrize("num_workers", WORKERS)
def test_a_custom_collate_reducing_a_batch(num_workers: int) -> None:
    same_order(*both(Records("dict"), num_workers, batch_size=4, collate_fn=collate_sum))


# ------------------------------------------------- custom batch type and pinning
class SimpleCustomBatch:
    """The docs' "Memory Pinning" example: a batch type with its own ``pin_memory()``."""

    def __init__(self, data: list[Any]) -> None:
        transposed_data = list(zip(*data, strict=True))
        self.inp = torch.stack(transposed_data[0], 0)
        self.tgt = torch.stack(transposed_data[1], 0)
        self.pinned_by_method = False

    # custom memory pinning method on custom type
    def pin_memory(self) -> SimpleCustomBatch:
        self.inp = self.inp.pin_memory()
        self.tgt = self.tgt.pin_memory()
        self.pinned_by_method = True
        return self


def collate_wrapper(batch: list[Any]) -> SimpleCustomBatch:
    return SimpleCustomBatch(batch)


def docs_dataset() -> TensorDataset:
    inps = torch.arange(10 * 5, dtype=torch.float32).view(10, 5)
    tgts = torch.arange(10 * 5, dtype=torch.float32).view(10, 5)
    return TensorDataset(inps, tgts)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_custom_batch_type_without_pinning(num_workers: int) -> None:
    theirs, mine = both(docs_dataset(), num_workers, batch_size=2, collate_fn=collate_wrapper)
    assert all(isinstance(b, SimpleCustomBatch) for b in mine)
    same_order([(b.inp, b.tgt) for b in theirs], [(b.inp, b.tgt) for b in mine])


def test_custom_batch_pin_memory_method_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without CUDA: the pinning path is stubbed where loaderkit asks for an accelerator,
    and the tensors' own pin_memory() (which needs one) is replaced by a marker."""
    loader = ResumableDataLoader(
        docs_dataset(), batch_size=2, collate_fn=collate_wrapper, seed=SEED
    )
    loader._pool = dataclasses.replace(loader._pool, pin_memory=True)  # as resolved on CUDA
    monkeypatch.setattr(loaderkit.transfer, "_available_accelerator", lambda: torch.device("cuda"))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, *a, **k: self.clone())
    batches = list(loader)
    assert len(batches) == 5 and all(b.pinned_by_method for b in batches)


@pytest.mark.gpu
@pytest.mark.parametrize("num_workers", WORKERS)
def test_custom_batch_is_pinned_on_cuda(num_workers: int) -> None:
    theirs, mine = both(
        docs_dataset(), num_workers, batch_size=2, collate_fn=collate_wrapper, pin_memory=True
    )
    for batch in (*theirs, *mine):
        assert batch.inp.is_pinned() and batch.tgt.is_pinned()
    same_order([(b.inp, b.tgt) for b in theirs], [(b.inp, b.tgt) for b in mine])
