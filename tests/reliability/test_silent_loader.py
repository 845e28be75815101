"""Silent edges of the loader: the data the user asked for, or what torch gives, never other data.

Each test is a case measured on 84cc6ec returning other data than the user
asked for, with no error (issue 21): a subclass's ``__getitem__`` bypassed by a
batched fast path, a sampler's seeded generator overridden, a
``DistributedSampler`` split differently from torch, per-sample seeds hidden
from ``torch.initial_seed()``, and ``__getitems__`` datasets seeded per batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    Sampler,
    StackDataset,
    Subset,
    SubsetRandomSampler,
    WeightedRandomSampler,
    default_collate,
    random_split,
)

import loaderkit
from loaderkit import ArrayDataset, ResumableDataLoader, ShardedDataset, TokenReader, write_shards
from loaderkit.loader._fetch import index_subset
from loaderkit.plan._cursor import field_digest
from tests.support.loops import check_resume_oracle


def ids_of(loader: Any) -> list[list[int]]:
    return [[int(i) for i in batch] for batch in loader]


# ------------------------------------------ 1. a subclass's __getitem__ is never bypassed
class Masked(ShardedDataset):
    """MLM-style masking in ``__getitem__``: the first token of every sample becomes -1."""

    def __getitem__(self, index: int) -> Any:
        sample = super().__getitem__(index).clone()
        sample[0] = -1
        return sample


class MaskedInBatches(Masked):
    """Overrides the batched method too: that one is the dataset's batched read."""

    def __getitems__(self, indices: Any) -> list[Any]:
        return [self[i] - 1000 for i in indices]


def _tokens(tmp_path: Path, cls: type[ShardedDataset]) -> ShardedDataset:
    reader = TokenReader(seq_len=4)
    paths = write_shards(tmp_path, [np.arange(40), np.arange(100, 148)], reader, progress=False)
    return cls(paths, reader)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("collate", [None, torch.stack])
def test_a_sharded_subclass_getitem_is_called_not_the_base_batched_read(
    tmp_path: Path, num_workers: int, collate: Any
) -> None:
    # Read through ShardedDataset.__getitems__: every batch came back unmasked.
    ds = _tokens(tmp_path, Masked)
    loader = ResumableDataLoader(
        ds, batch_size=4, shuffle=True, seed=0, num_workers=num_workers, collate_fn=collate
    )
    batches = list(loader)
    assert sum(len(b) for b in batches) == len(ds) == 22
    assert all((b[:, 0] == -1).all() for b in batches), batches[0]
    assert all((b[:, 1:] >= 0).all() for b in batches)
    # A subclass that overrides the batched read as well is read through it.
    both = ResumableDataLoader(
        _tokens(tmp_path / "both", MaskedInBatches), batch_size=4, seed=0, num_workers=num_workers
    )
    assert all((b[:, 0] == -1001).all() for b in both)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_subset_of_such_a_subclass_calls_its_getitem_too(
    tmp_path: Path, num_workers: int
) -> None:
    # A DataModule's validation split (index_subset) forwarded to the base __getitems__.
    subset = index_subset(_tokens(tmp_path, Masked), np.arange(3, 13))
    loader = ResumableDataLoader(subset, batch_size=4, seed=0, num_workers=num_workers)
    batches = list(loader)
    assert sum(len(b) for b in batches) == 10
    assert all((b[:, 0] == -1).all() for b in batches)


# ------------------------------ 2. a sampler's seeded generator decides the order (seed=None)
def _samplers(data: list[int]) -> dict[str, Any]:
    def gen() -> torch.Generator:
        return torch.Generator().manual_seed(1)

    weights = torch.linspace(0.1, 1.0, len(data))
    return {
        "random": lambda: RandomSampler(data, generator=gen()),
        "subset": lambda: SubsetRandomSampler(list(range(0, len(data), 2)), generator=gen()),
        "weighted": lambda: WeightedRandomSampler(weights, num_samples=30, generator=gen()),
    }


class Noisy(Dataset[tuple[int, float]]):
    """Sample ``i`` with a draw from torch's global generator (random augmentation)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, float]:
        return index, float(torch.rand(()))


@pytest.mark.parametrize("kind", ["random", "subset", "weighted"])
def test_a_user_seeded_sampler_generator_decides_the_order(kind: str) -> None:
    # Each loader drew its own seed and reseeded the sampler: two fresh loaders differed
    # from each other and from torch's order for the same sampler.
    data = list(range(40))
    make = _samplers(data)[kind]
    torch_epoch0 = ids_of(DataLoader(data, batch_size=4, sampler=make()))
    runs = []
    for _ in range(2):
        torch.manual_seed(len(runs))  # the global generator must not matter
        loader = ResumableDataLoader(data, batch_size=4, sampler=make())
        runs.append([ids_of(loader), ids_of(loader), ids_of(loader)])
    assert runs[0] == runs[1]
    assert runs[0][0] == torch_epoch0
    assert runs[0][1] != runs[0][0] and runs[0][2] != runs[0][1]
    assert ResumableDataLoader(data, batch_size=4, sampler=make()).seed == 1


@pytest.mark.parametrize("kind", ["random", "subset", "weighted"])
def test_another_sampler_seed_gives_another_order(kind: str) -> None:
    data = list(range(40))
    sampler = _samplers(data)[kind]()
    sampler.generator.manual_seed(2)
    torch_epoch0 = ids_of(DataLoader(data, batch_size=4, sampler=_reseeded(sampler, 2)))
    loader = ResumableDataLoader(data, batch_size=4, sampler=sampler)
    first = ids_of(loader)
    assert first == torch_epoch0
    assert first != ids_of(ResumableDataLoader(data, batch_size=4, sampler=_samplers(data)[kind]()))


def test_a_generator_drawn_from_before_gives_torchs_epoch_0_and_stays_the_users() -> None:
    data = list(range(40))
    gen = torch.Generator().manual_seed(1)
    torch.rand(3, generator=gen)  # the user's script drew from it first
    twin = torch.Generator()
    twin.set_state(gen.get_state())
    reference = RandomSampler(data, generator=twin)
    torch_epoch0 = ids_of(DataLoader(data, batch_size=4, sampler=reference))
    sampler = RandomSampler(data, generator=gen)
    loader = ResumableDataLoader(data, batch_size=4, sampler=sampler)
    assert ids_of(loader) == torch_epoch0
    assert loader.seed != 1  # not the fresh manual_seed(1) state: its own seed
    assert sampler.generator is gen  # lent a generator per listing, then given back


def test_a_resume_with_another_sampler_seed_is_refused_by_name() -> None:
    from loaderkit import StateMismatchError

    data = list(range(40))

    def make(seed: int) -> ResumableDataLoader:
        gen = torch.Generator().manual_seed(seed)
        return ResumableDataLoader(data, batch_size=4, sampler=RandomSampler(data, generator=gen))

    cut = make(1)
    next(iter(cut))
    with pytest.raises(
        StateMismatchError,
        match=r"seed=1, this object has seed=2; build sampler=RandomSampler's generator",
    ):
        make(2).load_state_dict(cut.state_dict())


def _reseeded(sampler: Any, seed: int) -> Any:
    import copy

    twin = copy.copy(sampler)
    twin.generator = torch.Generator().manual_seed(seed)
    return twin


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["random", "weighted"])
def test_a_user_seeded_sampler_resumes_exactly(kind: str, num_workers: int) -> None:
    size = 40

    fresh = iter(range(100, 10**6))

    def make(nw: int) -> ResumableDataLoader:
        torch.manual_seed(next(fresh))  # each run a new process: the global RNG must not matter
        sampler = _samplers(list(range(size)))[kind]()
        return ResumableDataLoader(Noisy(size), batch_size=4, sampler=sampler, num_workers=nw)

    def ids(batch: Any) -> list[Any]:
        return [(int(i), round(float(x), 6)) for i, x in zip(*batch, strict=True)]  # type: ignore[misc]

    full = check_resume_oracle(make, ids, cuts=(1, 4, 9), num_workers=num_workers)
    assert [r["ids"] for r in full] == [r["ids"] for r in check_resume_oracle(make, ids, (), 0)]


class EpochSeeded(Sampler[int]):
    """Reseeds its own generator in set_epoch (a common pattern in user samplers)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed
        self.generator = torch.Generator().manual_seed(seed)

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.seed + epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.size, generator=self.generator).tolist())

    def __len__(self) -> int:
        return self.size


@pytest.mark.parametrize("seed", [None, 0])
def test_a_sampler_whose_set_epoch_reseeds_its_generator_decides_every_epoch(
    seed: int | None,
) -> None:
    # Review of issue 21: loaderkit lent its own (seed, epoch) generator after set_epoch
    # ran, so the order differed from torch's from epoch 1 (from epoch 0 with seed=0).
    data = list(range(20))
    reference = EpochSeeded(20, 7)
    want = []
    for epoch in range(3):
        reference.set_epoch(epoch)
        want.append(ids_of(DataLoader(data, batch_size=4, sampler=reference)))

    def make(num_workers: int) -> ResumableDataLoader:
        sampler = EpochSeeded(20, 7)
        return ResumableDataLoader(data, batch_size=4, sampler=sampler, seed=seed)

    loader = make(0)
    assert [ids_of(loader) for _ in range(3)] == want
    full = check_resume_oracle(make, lambda batch: [int(i) for i in batch], (2, 7), 0)
    assert [r["ids"] for r in full] == want[0] + want[1]


def test_a_generator_the_user_reseeds_before_each_epoch_decides_that_epoch() -> None:
    # Review of issue 21: g.manual_seed(100 + epoch) before each epoch was overridden
    # by loaderkit's (seed, epoch) generator: every epoch differed from torch's.
    data = list(range(12))

    def run(cls: Any) -> list[list[list[int]]]:
        gen = torch.Generator()
        loader = cls(data, batch_size=4, sampler=RandomSampler(data, generator=gen))
        out = []
        for epoch in range(3):
            gen.manual_seed(100 + epoch)
            out.append(ids_of(loader))
        return out

    want = run(DataLoader)
    assert run(ResumableDataLoader) == want
    gen = torch.Generator()
    cut = ResumableDataLoader(data, batch_size=4, sampler=RandomSampler(data, generator=gen))
    ids_of(cut)
    gen.manual_seed(101)
    it = iter(cut)
    head = [[int(i) for i in next(it)]]
    state = cut.state_dict()
    del it
    gen = torch.Generator()
    resumed = ResumableDataLoader(data, batch_size=4, sampler=RandomSampler(data, generator=gen))
    resumed.load_state_dict(state)
    gen.manual_seed(101)  # the user's loop reseeds as before the epoch it resumes
    assert head + ids_of(resumed) == want[1]


# ------------------------- 3. a user's DistributedSampler yields torch's indices on each rank
def _torch_batches(data: list[int], sampler: Any, batch_size: int, drop_last: bool) -> Any:
    return ids_of(DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=drop_last))


class Balanced(DistributedSampler):  # type: ignore[type-arg]
    """A subclass with its own ``__iter__`` (DistributedSampler's own order, as a list)."""

    def __iter__(self) -> Any:
        return iter(list(super().__iter__()))


class Contiguous(DistributedSampler):  # type: ignore[type-arg]
    """Its own split: each rank a contiguous block of the (shuffled, padded) order."""

    def __iter__(self) -> Any:
        order = list(range(len(self.dataset)))  # type: ignore[arg-type]
        if self.shuffle:
            order = torch.randperm(len(order), generator=self._keyed()).tolist()
        order = (order * 2)[: self.total_size]
        return iter(order[self.rank * self.num_samples : (self.rank + 1) * self.num_samples])

    def _keyed(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed + self.epoch)


class Uneven(DistributedSampler):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        return iter(range(self.rank, len(self.dataset) - self.rank))  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", [DistributedSampler, Balanced, Contiguous])
@pytest.mark.parametrize("size", [40, 41, 43])
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("sampler_drop", [False, True])
@pytest.mark.parametrize("loader_drop", [False, True])
def test_a_distributed_sampler_yields_torchs_indices_on_every_rank(
    cls: Any, size: int, world: int, shuffle: bool, sampler_drop: bool, loader_drop: bool
) -> None:
    # Rank 0 of 2, 40 samples, shuffle=False: it yielded [0, 1, 2, ...]; torch [0, 2, 4, ...].
    data = list(range(size))
    for rank in range(world):

        def sampler(r: int = rank) -> Any:
            return cls(data, num_replicas=world, rank=r, shuffle=shuffle, seed=5,
                       drop_last=sampler_drop)  # fmt: skip

        loader = ResumableDataLoader(data, batch_size=4, sampler=sampler(), drop_last=loader_drop)
        for epoch in range(2):
            reference = sampler()
            reference.set_epoch(epoch)
            expected = _torch_batches(data, reference, 4, loader_drop)
            assert len(loader) == len(expected)
            assert ids_of(loader) == expected, (rank, epoch)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_distributed_sampler_resumes_exactly_on_its_rank(num_workers: int) -> None:
    data = list(range(43))

    def make(nw: int) -> ResumableDataLoader:
        sampler = DistributedSampler(data, num_replicas=3, rank=1, shuffle=True, seed=2)
        return ResumableDataLoader(data, batch_size=4, sampler=sampler, num_workers=nw)

    full = check_resume_oracle(make, lambda b: b.tolist(), cuts=(1, 3, 6), num_workers=num_workers)
    reference = DistributedSampler(data, num_replicas=3, rank=1, shuffle=True, seed=2)
    assert [r["ids"] for r in full[:4]] == _torch_batches(data, reference, 4, False)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_subclass_with_its_own_rank_split_keeps_it_and_resumes(num_workers: int) -> None:
    # Review of issue 21: a subclass dealing contiguous blocks was re-dealt with torch's
    # stride (10 samples, 2 ranks: torch rank 0 [[0,1],[2,3],[4]], loaderkit [[0,2],[4,6],[8]]).
    data = list(range(43))

    def make(nw: int) -> ResumableDataLoader:
        sampler = Contiguous(data, num_replicas=3, rank=1, shuffle=True, seed=2)
        return ResumableDataLoader(data, batch_size=4, sampler=sampler, num_workers=nw)

    full = check_resume_oracle(make, lambda b: b.tolist(), cuts=(1, 5), num_workers=num_workers)
    for epoch in range(2):
        reference = Contiguous(data, num_replicas=3, rank=1, shuffle=True, seed=2)
        reference.set_epoch(epoch)
        assert [r["ids"] for r in full if r["epoch"] == epoch] == _torch_batches(
            data, reference, 4, False
        )


def test_a_subclass_giving_its_ranks_unequal_shares_is_refused_by_name() -> None:
    data = list(range(10))
    sampler = Uneven(data, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match=r"sampler=Uneven gives its ranks \[10, 8\] indices"):
        ResumableDataLoader(data, batch_size=2, sampler=sampler)


def test_a_distributed_sampler_resumed_on_another_world_size_sees_every_sample() -> None:
    # The documented difference: the rest of the epoch is re-split across the new ranks.
    data = list(range(43))

    def loader(rank: int, world: int) -> ResumableDataLoader:
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=2)
        return ResumableDataLoader(data, batch_size=4, sampler=sampler)

    seen: list[int] = []
    cuts = [loader(rank, 2) for rank in range(2)]
    for rank, cut in enumerate(cuts):
        it = iter(cut)
        before = [next(it).tolist() for _ in range(3)]
        reference = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=2)
        assert before == _torch_batches(data, reference, 4, False)[:3]
        seen += [i for batch in before for i in batch]
    state = cuts[0].state_dict()
    for rank in range(3):
        resumed = loader(rank, 3)
        resumed.load_state_dict(state)
        seen += [int(i) for b in resumed for i in b]
    assert set(seen) == set(data)
    assert len(seen) - len(data) < 3  # only the padding of the last step repeats


def test_a_drop_last_distributed_sampler_resumed_on_another_world_size_repeats_nothing() -> None:
    # 12 entries under 1 and 2 ranks alike; 11 left after a batch on 1 rank: the one short of
    # the 2 ranks is dropped, as DistributedSampler(drop_last=True) drops (it was wrapped).
    data = list(range(12))

    def loader(rank: int, world: int) -> ResumableDataLoader:
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=5, drop_last=True)
        return ResumableDataLoader(data, batch_size=1, sampler=sampler, drop_last=True)

    cut = loader(0, 1)
    seen = [int(next(iter(cut)))]
    state = cut.state_dict()
    for rank in range(2):
        resumed = loader(rank, 2)
        resumed.load_state_dict(state)
        seen += [int(b) for b in resumed]
    assert len(seen) == len(set(seen)) == 11


@pytest.mark.parametrize("epoch", [0, 1])
def test_a_drop_last_distributed_sampler_resumed_on_another_world_size_names_the_cause(
    epoch: int,
) -> None:
    # Review of issue 21: "field 'num_samples' differs ... build it with num_samples=44",
    # an argument the user cannot pass; the cause is drop_last trimming per world size.
    # Saved in epoch 1 it got a generic "set its settings (weights)" (hunter 276).
    from loaderkit import StateMismatchError

    data = list(range(44))

    def loader(world: int) -> ResumableDataLoader:
        sampler = DistributedSampler(data, num_replicas=world, rank=0, seed=2, drop_last=True)
        return ResumableDataLoader(data, batch_size=4, sampler=sampler)

    cut = loader(2)
    cut.set_epoch(epoch)
    it = iter(cut)
    next(it)
    state = cut.state_dict()
    del it
    with pytest.raises(
        StateMismatchError,
        match=r"DistributedSampler\(drop_last=True\) order has 44 entries under the saved world "
        r"size of 2 and 42 under this one \(trimmed .*Resume on the saved world size of 2, or "
        r"build the sampler with drop_last=False",
    ):
        loader(3).load_state_dict(state)


@pytest.mark.parametrize("inner", ["random", "weighted"])
def test_lightnings_sampler_wrapper_around_a_random_sampler_is_keyed_and_resumes(
    inner: str,
) -> None:
    # Review of issue 21: refused with "lists a different order each time ... give it
    # set_epoch or a generator"; the wrapper has set_epoch, the generator is its sampler's.
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    data = list(range(20))

    def make(rank: int) -> Callable[[int], ResumableDataLoader]:
        def loader(num_workers: int) -> ResumableDataLoader:
            base = (
                RandomSampler(data)
                if inner == "random"
                else WeightedRandomSampler(torch.linspace(0.1, 1, 20), 20)
            )
            sampler = DistributedSamplerWrapper(base, num_replicas=2, rank=rank, shuffle=False)
            return ResumableDataLoader(data, batch_size=4, sampler=sampler, num_workers=num_workers)

        return loader

    ranks = [check_resume_oracle(make(r), lambda b: b.tolist(), (1, 4), 0) for r in range(2)]
    epochs = [
        sorted(i for run in ranks for r in run if r["epoch"] == e for i in r["ids"]) for e in (0, 1)
    ]
    if inner == "random":
        assert epochs == [data, data]  # each epoch every sample once across the two ranks
    assert ranks[0][0]["ids"] != next(r for r in ranks[0] if r["epoch"] == 1)["ids"]


# ------------------- 5. a dataset seeding itself from torch.initial_seed() sees per-sample seeds
class SeedReader(Dataset[int]):
    """Seeds its own generator from ``torch.initial_seed()`` (a common pattern)."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index: int) -> int:
        gen = torch.Generator().manual_seed(torch.initial_seed())
        return int(torch.randint(0, 2**62, (), generator=gen))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_lazy_seeding_shows_each_sample_its_seed(num_workers: int) -> None:
    # Lazy seeding left torch in one fixed sentinel state: every sample of every epoch
    # read the same initial_seed().
    def epochs(per_sample_seeding: Any) -> list[list[int]]:
        loader = ResumableDataLoader(
            SeedReader(),
            batch_size=4,
            seed=3,
            num_workers=num_workers,
            per_sample_seeding=per_sample_seeding,
        )
        return [[i for batch in ids_of(loader) for i in batch] for _ in range(2)]

    lazy = epochs("auto")
    assert lazy == epochs(True)  # what eager seeding shows
    assert len(set(lazy[0] + lazy[1])) == 24  # a seed per sample and epoch


# ------------------------------- 6. __getitems__ datasets are seeded per sample, not per batch
def _subsets() -> dict[str, Any]:
    base = Noisy(40)
    return {
        "subset": lambda: Subset(base, list(range(10, 34))),
        "random_split": lambda: random_split(base, [24, 16], torch.Generator().manual_seed(0))[0],
    }


@pytest.mark.parametrize("kind", ["subset", "random_split"])
def test_a_getitems_dataset_is_seeded_by_sample_not_by_its_batch(kind: str) -> None:
    # Seeded from each batch's first sample: 12 of 24 samples changed between batch
    # sizes 4 and 2, and again after a resume from 2 ranks to 1.
    def samples(batch_size: int, num_workers: int = 0, **topology: int) -> dict[int, float]:
        loader = ResumableDataLoader(
            _subsets()[kind](),
            batch_size=batch_size,
            shuffle=True,
            seed=4,
            num_workers=num_workers,
            **topology,
        )
        return {int(i): float(x) for b in loader for i, x in zip(*b, strict=True)}

    by_4 = samples(4)
    assert len(by_4) == 24 and len(set(by_4.values())) == 24
    assert samples(2) == by_4
    assert samples(3, num_workers=2) == by_4
    two_ranks = {**samples(2, rank=0, world_size=2), **samples(2, rank=1, world_size=2)}
    assert two_ranks == by_4


class BatchedDict(Dataset[Any]):
    """``__getitems__`` returning a collated dict: not torch's list-of-samples contract."""

    def __len__(self) -> int:
        return 8

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        return {"x": torch.tensor(indices)}


def test_a_getitems_that_returns_no_list_is_handed_to_collate_as_torch_does() -> None:
    # Read one index at a time, such a dict would have been unpacked into its keys; it
    # draws no randomness, so it is read a whole batch per call, as under torch.
    for seeding in ("auto", True, False):
        loader = ResumableDataLoader(
            BatchedDict(), batch_size=4, seed=0, collate_fn=lambda b: b, per_sample_seeding=seeding
        )
        assert next(iter(loader))["x"].tolist() == [0, 1, 2, 3]


class Centred(Dataset[float]):
    """A batch-level ``__getitems__``: each batch centred on its mean (batch statistics)."""

    calls = 0

    def __len__(self) -> int:
        return 8

    def __getitems__(self, indices: list[int]) -> list[float]:
        Centred.calls += 1
        x = torch.tensor(indices, dtype=torch.float32)
        return list(x - x.mean())


class NoisyBatch(Centred):
    def __getitems__(self, indices: list[int]) -> list[float]:
        return [float(torch.rand(())) + i for i in indices]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_level_getitems_is_read_a_whole_batch_per_call(num_workers: int) -> None:
    # Review of issue 21: read one index per call, each batch came out as zeros
    # (torch: [-1.5, -0.5, 0.5, 1.5]) in 8 calls instead of 2.
    want = [b.tolist() for b in DataLoader(Centred(), batch_size=4)]
    Centred.calls = 0
    loader = ResumableDataLoader(Centred(), batch_size=4, seed=0, num_workers=num_workers)
    assert [b.tolist() for b in loader] == want
    if num_workers == 0:
        assert Centred.calls == 2


def test_a_getitems_drawing_randomness_per_batch_is_refused_naming_the_fix() -> None:
    loader = ResumableDataLoader(NoisyBatch(), batch_size=4, seed=0)
    refused = r"NoisyBatch.__getitems__ draws from a global RNG .*without __getitems__.*"
    with pytest.raises(ValueError, match=refused + r"sample_generator.*per_sample_seeding=False"):
        next(iter(loader))
    unseeded = ResumableDataLoader(NoisyBatch(), batch_size=4, seed=0, per_sample_seeding=False)
    assert len(next(iter(unseeded))) == 4


class _Jittered(Dataset[float]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> float:
        return i + float(torch.rand(()))


class _Parity(Dataset[int]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return i % 2

    def __getitems__(self, indices: list[int]) -> list[int]:
        return [i % 2 for i in indices]


def test_a_torch_wrapper_read_whole_for_one_part_names_that_part() -> None:
    # Hunter 333: StackDataset(an augmenting dataset, one with a batch read) was refused as
    # "StackDataset.__getitems__ draws", naming neither part.
    stacked = StackDataset(_Jittered(), _Parity())
    refused = (
        r"StackDataset.__getitems__ \(read whole for _Parity.__getitems__\) draws .*wrap _Parity"
    )
    with pytest.raises(ValueError, match=refused):
        next(iter(ResumableDataLoader(stacked, batch_size=4, seed=0)))


def test_torch_wrappers_of_datasets_that_cannot_draw_read_under_any_numpy_bit_generator(
    tmp_path: Path,
) -> None:
    # Review 335: under PCG64 a Subset or StackDataset of a ShardedDataset was refused ("cannot
    # be checked for draws"), where the bare ShardedDataset read.
    sharded = _tokens(tmp_path, ShardedDataset)
    kept = np.random.mtrand.get_bit_generator()
    np.random.mtrand.set_bit_generator(np.random.PCG64(0))
    try:

        class Rows(list):  # type: ignore[type-arg]  # review 339: a list subclass's own [i]
            pass

        picked = (Subset(sharded, Rows([3, 1, 2, 0])), Subset(sharded, np.array([3, 1, 2, 0])))
        for ds in (*picked, StackDataset(sharded, sharded)):
            assert len(list(ResumableDataLoader(ds, batch_size=2, seed=0))) == -(-len(ds) // 2)
    finally:
        np.random.mtrand.set_bit_generator(kept)


class _RandomCopy(Sequence[int]):
    """Indices whose ``[i]`` draws: one of 4 stored copies of row ``i``."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: Any) -> Any:
        if not -16 <= int(i) < 16:
            raise IndexError(i)
        return 4 * int(i) + int(np.random.randint(4))


def test_a_subset_whose_indices_draw_is_seeded_per_sample() -> None:
    # Review 338: a Subset of an ArrayDataset was read whole, unseeded, whatever its indices
    # did: two identical runs differed.
    def run(num_workers: int) -> list[list[int]]:
        subset = Subset(ArrayDataset(np.arange(64)), _RandomCopy())  # type: ignore[arg-type]
        loader = ResumableDataLoader(
            subset, batch_size=4, seed=1, num_workers=num_workers, per_sample_seeding=True
        )
        return [b[0].tolist() for b in loader]

    assert run(0) == run(0) == run(2)


class InitialSeedReader(Dataset[float]):
    """Draws nothing from a global generator: reads ``torch.initial_seed()`` (issue 21.5)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> float:
        rng = np.random.default_rng([torch.initial_seed() % 2**63, i])
        return round(float(rng.random()), 6)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_subset_reading_the_initial_seed_gets_new_values_each_epoch(num_workers: int) -> None:
    # Second review of issue 21: a random_split's batch read under parked generators saw
    # one fixed initial_seed(), the same values every epoch and for every seed=.
    train, _ = random_split(InitialSeedReader(), [6, 2], generator=torch.Generator().manual_seed(0))

    def epochs(seed: int) -> list[list[float]]:
        loader = ResumableDataLoader(train, batch_size=3, seed=seed, num_workers=num_workers)
        return [sorted(torch.cat(list(loader)).tolist()) for _ in range(2)]

    first, second = epochs(0)
    assert first != second
    assert epochs(0) == [first, second] and epochs(1)[0] != first


class InitialSeedBatch(Dataset[float]):
    """A batch read of its own that seeds a generator from ``torch.initial_seed()``."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> float:
        return self.__getitems__([i])[0]

    def __getitems__(self, rows: list[int]) -> list[float]:
        rng = np.random.default_rng(torch.initial_seed() % 2**63)
        return [round(float(rng.random()), 6) + i for i in rows]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_getitems_reading_the_initial_seed_gets_new_values_each_epoch(num_workers: int) -> None:
    """Measured before: torch's generator was parked at one fixed seed for every batch read
    whole, so such a read gave the same values in every batch, epoch and for every seed=."""

    def epochs(seed: int, workers: int = num_workers) -> list[list[float]]:
        loader = ResumableDataLoader(
            InitialSeedBatch(), batch_size=2, seed=seed, num_workers=workers
        )
        return [torch.cat(list(loader)).tolist() for _ in range(2)]

    first, second = epochs(0)
    fractions = {round(v % 1, 6) for v in first}
    assert len(fractions) == 8 and first != second  # before: one batch's 2 values, repeated
    assert epochs(0) == [first, second] == epochs(0, 2 - num_workers)
    assert epochs(1)[0] != first


class UserGetBatch(Dataset[torch.Tensor]):
    """A user's ``get_batch`` (not loaderkit's): its samples draw noise."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(float(i)) + torch.rand(())

    def get_batch(self, indices: Any) -> Any:
        return default_collate([self[int(i)] for i in indices])


def _noisy_rows(indices: Any) -> tuple[torch.Tensor]:
    return (torch.rand(len(indices)),)


def test_a_user_get_batch_dataset_is_seeded_per_sample() -> None:
    # Second review of issue 21: any get_batch turned per-sample seeding off, so the
    # noise differed between num_workers 0 and 2 and after a resume. It runs under
    # global generators seeded per batch (a digest of its samples' keys).
    def make(num_workers: int = 0) -> ResumableDataLoader:
        return ResumableDataLoader(
            UserGetBatch(), batch_size=4, shuffle=True, seed=0, num_workers=num_workers
        )

    full = [b.tolist() for b in make()]
    assert [b.tolist() for b in make(2)] == full
    # A DataModule's split of it (loaderkit's subset, whose get_batch reads the user's)
    # was read unseeded: other values with 2 workers.
    split = index_subset(UserGetBatch(), np.arange(2, 12))
    parts = [
        [b.tolist() for b in ResumableDataLoader(split, batch_size=4, seed=0, num_workers=nw)]
        for nw in (0, 2)
    ]
    assert parts[0] == parts[1]
    # A get_batch set on an instance of loaderkit's TensorDataset is the user's: seeded.
    own = loaderkit.TensorDataset(torch.zeros(12))
    own.get_batch = _noisy_rows  # type: ignore[method-assign]
    runs = [list(ResumableDataLoader(own, batch_size=4, seed=0, num_workers=nw)) for nw in (0, 2)]
    assert [b[0].tolist() for b in runs[0]] == [b[0].tolist() for b in runs[1]]
    cut = make()
    it = iter(cut)
    head = [next(it).tolist()]
    resumed = make()
    resumed.load_state_dict(cut.state_dict())
    assert head + [b.tolist() for b in resumed] == full


def test_a_getitems_read_is_refused_where_numpy_cannot_be_checked() -> None:
    # Second review of issue 21: under a non-MT19937 numpy generator the batch-level
    # __getitems__ was split per sample (zeros instead of [-1.5, -0.5, 0.5, 1.5]).
    saved = np.random.get_state(legacy=False)
    np.random.set_bit_generator(np.random.PCG64(0))
    try:
        loader = ResumableDataLoader(Centred(), batch_size=4, seed=0)
        with pytest.raises(ValueError, match=r"numpy's global generator is not an MT19937.*"
                           r"Pass per_sample_seeding=False"):  # fmt: skip
            next(iter(loader))
    finally:
        np.random.set_bit_generator(np.random.MT19937(0))
        np.random.set_state(saved)


class _Rows(Dataset[dict[str, Any]]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.tensor(float(i))}


class _VectorReads:
    """A mixin: the batch in one read (what a vectorised store does)."""

    def __getitems__(self, indices: list[int]) -> dict[str, Any]:
        return {"x": torch.tensor(indices, dtype=torch.float32), "batched": True}


class _Mixed(_Rows, _VectorReads):
    pass


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_mixins_getitems_beside_the_getitem_is_read_as_torch_reads_it(num_workers: int) -> None:
    # Hunter 229: _Rows.__getitem__ earlier in the MRO counted as an override of the mixin's
    # batch read (no subclass of it), so the batch was read per sample: no "batched".
    def same(batch: Any) -> Any:
        return batch

    want = next(iter(DataLoader(_Mixed(), batch_size=4, collate_fn=same)))
    loader = ResumableDataLoader(
        _Mixed(), batch_size=4, collate_fn=same, num_workers=num_workers, seed=0
    )
    got = next(iter(loader))
    assert got["batched"] and got["x"].tolist() == want["x"].tolist()


class _Batched(_Rows):
    def __getitems__(self, indices: list[int]) -> list[dict[str, Any]]:
        return [{"x": torch.tensor(float(i))} for i in indices]


class _Scaled(_Batched):
    """Overrides the per-sample read below the batch read: loaderkit never bypasses it."""

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.tensor(10.0 * i)}


class _Augmenting(_Rows):
    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.tensor(float(i)) + torch.rand(())}


class _NamedSubset(Subset[Any]):
    name = "named"


@pytest.mark.parametrize(
    "wrap",
    [
        lambda d: d,
        lambda d: Subset(d, range(8)),
        lambda d: torch.utils.data.StackDataset(d),
    ],
    ids=["alone", "Subset", "StackDataset"],
)
def test_a_subclass_getitem_is_read_inside_torchs_wrappers_too(wrap: Any) -> None:
    # Hunter 229: Subset/StackDataset called the base's batch read: [0, 1, 2, 3].
    loader = ResumableDataLoader(wrap(_Scaled()), batch_size=4, seed=0)
    batch = next(iter(loader))
    x = batch[0]["x"] if isinstance(batch, list | tuple) else batch["x"]
    assert x.tolist() == [0.0, 10.0, 20.0, 30.0]


@pytest.mark.parametrize(
    "wrap",
    [lambda d: _NamedSubset(d, range(8)), lambda d: torch.utils.data.StackDataset(d)],
    ids=["Subset-subclass", "StackDataset"],
)
def test_torchs_wrappers_over_an_augmenting_dataset_are_seeded_per_sample(wrap: Any) -> None:
    # Hunter 229: refused as a batch read that draws (per_sample_seeding would be lost).
    def first(num_workers: int) -> Any:
        loader = ResumableDataLoader(
            wrap(_Augmenting()), batch_size=4, seed=0, num_workers=num_workers
        )
        return next(iter(loader))

    a, b = first(0), first(2)
    xa = a[0]["x"] if isinstance(a, list | tuple) else a["x"]
    xb = b[0]["x"] if isinstance(b, list | tuple) else b["x"]
    assert torch.equal(xa, xb)


class _AddTen:
    """A mixin augmenting the per-sample read of the class beside it."""

    def __getitem__(self, i: int) -> Any:
        return super().__getitem__(i)[0] + 10  # type: ignore[misc]


class _Augmented(_AddTen, loaderkit.TensorDataset):
    pass


def test_a_mixins_getitem_before_a_batch_read_is_not_bypassed() -> None:
    # Review 232: the first fix for mixins let loaderkit's get_batch skip a __getitem__ a
    # mixin puts before it ([0, 1, 2, 3] for torch's [10, 11, 12, 13]).
    dataset = _Augmented(torch.arange(8))
    want = [b.tolist() for b in DataLoader(dataset, batch_size=4)]
    assert [b.tolist() for b in ResumableDataLoader(dataset, batch_size=4, seed=0)] == want


class _Index(Dataset[int]):
    def __init__(self, n: int = 100) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def _mid_epoch_state(dataset: Any) -> dict[str, Any]:
    loader = ResumableDataLoader(dataset, batch_size=4, shuffle=True, seed=1)
    it = iter(loader)
    next(it)
    return loader.state_dict()


def test_a_random_split_drawn_again_on_resume_is_refused_by_name() -> None:
    # random_split without generator= draws another split in each process: the resumed run
    # trained on other samples (validation ones among them) at the same length, silently.
    train, _ = random_split(_Index(), [0.8, 0.2], generator=torch.Generator().manual_seed(1))
    state = _mid_epoch_state(train)
    other, _ = random_split(_Index(), [0.8, 0.2], generator=torch.Generator().manual_seed(2))
    resumed = ResumableDataLoader(other, batch_size=4, shuffle=True, seed=1)
    with pytest.raises(loaderkit.StateMismatchError, match=r"listing_crc32.*random_split"):
        resumed.load_state_dict(state)
    again, _ = random_split(_Index(), [0.8, 0.2], generator=torch.Generator().manual_seed(1))
    check_resume_oracle(
        lambda w: ResumableDataLoader(again, batch_size=4, shuffle=True, seed=1, num_workers=w),
        lambda batch: [int(i) for i in batch],
        (3, 25),
        0,
    )


@pytest.mark.parametrize("keyed", [False, True])
def test_what_a_stack_dataset_reads_is_compared_on_resume(tmp_path: Path, keyed: bool) -> None:
    # Hunter 341: a random_split drawn again inside a torch StackDataset was resumed over other
    # samples (4 repeated, 4 lost of 10); its shards were not compared either.
    def stack(*parts: Any) -> StackDataset[Any]:
        return (
            StackDataset(**dict(zip("ab", parts, strict=False))) if keyed else StackDataset(*parts)
        )

    labels = list(range(80))
    split = [
        random_split(_Index(), [0.8, 0.2], torch.Generator().manual_seed(s))[0] for s in (1, 2)
    ]
    state = _mid_epoch_state(stack(split[0], labels))
    with pytest.raises(loaderkit.StateMismatchError, match=r"listing_crc32.*random_split"):
        ResumableDataLoader(
            stack(split[1], labels), batch_size=4, shuffle=True, seed=1
        ).load_state_dict(state)
    for name, shards in (("a", 1), ("b", 2)):  # 12 samples each, in other shard files
        parts = np.array_split(np.arange(48, dtype=np.uint16), shards)
        write_shards(tmp_path / name, parts, TokenReader(seq_len=4))
    sharded = [ShardedDataset(tmp_path / name, TokenReader(seq_len=4)) for name in "ab"]
    state = _mid_epoch_state(stack(sharded[0], labels[:12]))
    with pytest.raises(loaderkit.StateMismatchError, match="shard_names_crc32"):
        ResumableDataLoader(
            stack(sharded[1], labels[:12]), batch_size=4, shuffle=True, seed=1
        ).load_state_dict(state)
    if keyed:  # the same samples by key, the keywords in another order (review 343)
        swapped = StackDataset(b=labels[:12], a=sharded[0])
        ResumableDataLoader(swapped, batch_size=4, shuffle=True, seed=1).load_state_dict(state)


def test_a_state_saved_before_the_listing_checksum_loads() -> None:
    train = Subset(_Index(), list(range(0, 100, 2)))
    state = _mid_epoch_state(train)
    del state["plan"]["listing_crc32"]
    state["checksum"]["plan"] = field_digest("plan", state["plan"])
    resumed = ResumableDataLoader(train, batch_size=4, shuffle=True, seed=1)
    resumed.load_state_dict(state)
    assert sum(len(b) for b in resumed) == 46


def test_an_image_folder_listing_other_files_at_its_length_is_refused(tmp_path: Path) -> None:
    datasets = pytest.importorskip("torchvision.datasets")
    for name in ("a.png", "b.png", "c.png", "d.png"):
        (tmp_path / "cls").mkdir(exist_ok=True)
        (tmp_path / "cls" / name).write_bytes(b"")
    state = _mid_epoch_state(datasets.ImageFolder(tmp_path, loader=str))
    (tmp_path / "cls" / "d.png").rename(tmp_path / "cls" / "e.png")  # one file for another
    resumed = ResumableDataLoader(
        datasets.ImageFolder(tmp_path, loader=str), batch_size=4, shuffle=True, seed=1
    )
    with pytest.raises(loaderkit.StateMismatchError, match="listing_crc32"):
        resumed.load_state_dict(state)
    (tmp_path / "cls" / "e.png").rename(tmp_path / "cls" / "d.png")
    moved = tmp_path.rename(tmp_path.with_name(tmp_path.name + "-moved"))  # a job's scratch
    same = ResumableDataLoader(
        datasets.ImageFolder(f"{moved}/", loader=str), batch_size=4, shuffle=True, seed=1
    )
    same.load_state_dict(state)  # reviews 266/270: known below its root, however spelt


def test_an_image_folder_whose_classes_changed_without_its_files_is_refused(
    tmp_path: Path,
) -> None:
    # Hunter 355: an empty class folder added under ImageFolder(allow_empty=True) moved every
    # label after it ([0, 0, 0, 1] read as [1, 1, 1, 2]); the files alone were compared.
    datasets = pytest.importorskip("torchvision.datasets")
    from loaderkit.data.mixing import listing_crc32

    for name in ("a.png", "b.png", "c.png", "d.png"):
        (tmp_path / "cls").mkdir(exist_ok=True)
        (tmp_path / "cls" / name).write_bytes(b"")

    def folder() -> Any:
        return datasets.ImageFolder(tmp_path, loader=str, allow_empty=True)

    assert listing_crc32(folder()) == 3407660005  # an earlier version's: its states load
    state = _mid_epoch_state(folder())
    (tmp_path / "bird").mkdir()
    resumed = ResumableDataLoader(folder(), batch_size=4, shuffle=True, seed=1)
    with pytest.raises(loaderkit.StateMismatchError, match=r"listing_crc32.*other classes"):
        resumed.load_state_dict(state)
    state = _mid_epoch_state(folder())  # saved with the empty class: removing it is refused
    (tmp_path / "bird").rmdir()
    with pytest.raises(loaderkit.StateMismatchError, match="listing_crc32"):
        ResumableDataLoader(folder(), batch_size=4, shuffle=True, seed=1).load_state_dict(state)


def _refuse_c(path: str) -> str:
    if path.endswith("c.png"):
        raise OSError("image file is truncated")
    return path


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_folder_sample_that_fails_to_load_names_its_file(
    tmp_path: Path, num_workers: int
) -> None:
    # Hunter 355: the index alone, which under a split is not the folder's own.
    datasets = pytest.importorskip("torchvision.datasets")
    (tmp_path / "cls").mkdir()
    for name in ("a.png", "b.png", "c.png", "d.png"):
        (tmp_path / "cls" / name).write_bytes(b"")
    folder = datasets.ImageFolder(tmp_path, loader=_refuse_c)
    split = Subset(torch.utils.data.ConcatDataset([folder, folder]), [3, 6])
    loader = ResumableDataLoader(split, batch_size=2, num_workers=num_workers, collate_fn=list)
    with pytest.raises(loaderkit.WorkerError, match=r"sample index 1 \(file '.*cls/c\.png'\)"):
        next(iter(loader))


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_random_split_beside_shards_is_checked_too(tmp_path: Path, wrapped: bool) -> None:
    # Review 270: with shard files in the dataset, only they were compared (review 271: and
    # inside a Subset of the whole).
    write_shards(tmp_path, [np.arange(40, dtype=np.uint16)], TokenReader(seq_len=4))
    shards = ShardedDataset(tmp_path, TokenReader(seq_len=4))

    def both(seed: int) -> Any:
        part, _ = random_split(_Index(), [0.5, 0.5], generator=torch.Generator().manual_seed(seed))
        whole = torch.utils.data.ConcatDataset([shards, part])
        return Subset(whole, range(len(whole) - 1)) if wrapped else whole

    def loader(seed: int) -> ResumableDataLoader:
        return ResumableDataLoader(both(seed), batch_size=4, shuffle=True, seed=1, collate_fn=list)

    saved = loader(1)
    next(iter(saved))
    state = saved.state_dict()
    with pytest.raises(loaderkit.StateMismatchError, match="listing_crc32"):
        loader(2).load_state_dict(state)
    loader(1).load_state_dict(state)


def test_a_state_over_a_subset_resumes_over_the_same_samples_bare() -> None:
    evens = Subset(_Index(), list(range(0, 100, 2)))
    state = _mid_epoch_state(evens)
    bare = ResumableDataLoader([2 * i for i in range(50)], batch_size=4, shuffle=True, seed=1)
    bare.load_state_dict(state)  # review 266: named "another kind of plan" before
    assert sum(len(b) for b in bare) == 46
