"""ResumableDataLoader keeps torch.utils.data's contracts where users rely on them.

Each test is a measured way a drop-in swap of ``DataLoader`` went silently wrong.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from loaderkit import (
    MixedDataset,
    PlanBatchSampler,
    ResumableDataLoader,
    SamplePlan,
    StateMismatchError,
    TensorDataset,
)

N = 1000


def epoch_ids(loader: ResumableDataLoader) -> list[int]:
    return [int(i) for batch in loader for i in batch]


# ------------------------------------------------------------------- seeds
def test_seed_none_on_two_ranks_still_covers_every_sample_once() -> None:
    # Each process of a DDP job draws its own seed; ranks splitting one order by
    # different seeds lost 244 of 1000 samples per epoch. Here the two ranks'
    # global generators differ, as they do without seed_everything.
    seen: list[int] = []
    for rank in (0, 1):
        torch.manual_seed(100 + rank)
        loader = ResumableDataLoader(
            list(range(N)), batch_size=10, shuffle=True, rank=rank, world_size=2
        )
        seen += epoch_ids(loader)
    assert sorted(seen) == list(range(N))


def test_seed_none_on_two_ranks_is_still_a_shuffle() -> None:
    loader = ResumableDataLoader(list(range(N)), batch_size=10, shuffle=True, rank=0, world_size=2)
    ids = epoch_ids(loader)
    assert loader.seed == 0  # DistributedSampler's default seed
    assert ids != sorted(ids)


def test_seed_none_loaders_in_one_process_differ_like_dataloaders() -> None:
    torch.manual_seed(7)
    a = epoch_ids(ResumableDataLoader(list(range(N)), batch_size=10, shuffle=True))
    b = epoch_ids(ResumableDataLoader(list(range(N)), batch_size=10, shuffle=True))
    assert a != b
    torch.manual_seed(7)  # ... and torch.manual_seed makes them reproducible
    assert epoch_ids(ResumableDataLoader(list(range(N)), batch_size=10, shuffle=True)) == a


def test_seed_none_draws_from_the_generator_given() -> None:
    def seed_from(gen_seed: int) -> int:
        gen = torch.Generator().manual_seed(gen_seed)
        return ResumableDataLoader(list(range(8)), batch_size=2, generator=gen).seed

    assert seed_from(5) == seed_from(5) != seed_from(6)


def test_a_state_of_another_seeded_generator_is_refused() -> None:
    # generator=G(6) resumed from G(5)'s state took G(5)'s order on (hunter 182), where the
    # same change as seed= or RandomSampler(generator=) was refused.
    def make(gen: torch.Generator) -> ResumableDataLoader:
        return ResumableDataLoader(list(range(N)), batch_size=4, shuffle=True, generator=gen)

    saved = make(torch.Generator().manual_seed(5))
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    with pytest.raises(StateMismatchError, match="field 'seed' differs"):
        make(torch.Generator().manual_seed(6)).load_state_dict(state)
    same = make(torch.Generator().manual_seed(5))
    same.load_state_dict(state)
    unseeded = make(torch.Generator())  # torch's default seed: no choice, the state's is kept
    unseeded.load_state_dict(state)
    assert same.seed == unseeded.seed == saved.seed


def test_a_seeded_generator_resumes_a_state_saved_on_two_ranks() -> None:
    # On several ranks the seed is their common one, not the generator's draw: refusing it
    # on one rank refused an exact resume (review 186).
    def make(**topology: int) -> ResumableDataLoader:
        gen = torch.Generator().manual_seed(5)
        return ResumableDataLoader(list(range(N)), batch_size=4, generator=gen, **topology)

    saved = make(rank=0, world_size=2)
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert resumed.seed == saved.seed


def test_an_explicit_seed_is_kept_on_two_ranks() -> None:
    loader = ResumableDataLoader(
        list(range(N)), batch_size=10, shuffle=True, seed=42, rank=1, world_size=2
    )
    epoch_ids(loader)
    assert loader.seed == 42


def test_a_resumed_seed_none_loader_keeps_the_saved_seed_on_two_ranks() -> None:
    def make() -> ResumableDataLoader:
        return ResumableDataLoader(
            list(range(N)), batch_size=10, shuffle=True, seed=None, rank=0, world_size=2
        )

    saved = ResumableDataLoader(
        list(range(N)), batch_size=10, shuffle=True, seed=123, rank=0, world_size=2
    )
    it = iter(saved)
    next(it)
    state = saved.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = epoch_ids(resumed)
    assert resumed.seed == 123
    assert len(rest) == N // 2 - 10


# ------------------------------------------------- datasets and their hooks
class Augmented(TensorDataset):
    """A loaderkit TensorDataset whose subclass augments per sample."""

    def __getitem__(self, index: Any) -> Any:
        (x,) = super().__getitem__(index)
        return x + 1000 + torch.rand(())


def test_a_subclass_that_overrides_getitem_is_not_bypassed() -> None:
    data = Augmented(torch.arange(20, dtype=torch.float32))
    batches = list(ResumableDataLoader(data, batch_size=5, seed=0))
    values = torch.cat(batches)
    assert values.min() >= 1000  # every sample went through __getitem__
    # ... under per-sample seeding (auto), so the augmentation does not depend on workers
    with_workers = torch.cat(list(ResumableDataLoader(data, batch_size=5, seed=0, num_workers=2)))
    assert torch.equal(values, with_workers)


def test_a_plain_tensor_dataset_still_fetches_whole_batches() -> None:
    from loaderkit.loader._fetch import batch_fetch_is_faithful

    assert batch_fetch_is_faithful(TensorDataset(torch.arange(4)))
    assert not batch_fetch_is_faithful(Augmented(torch.arange(4)))
    assert not batch_fetch_is_faithful(list(range(4)))


@pytest.mark.parametrize("hook", ["__getitem__", "__getitems__"])
def test_any_per_sample_hook_below_get_batch_counts_as_an_override(hook: str) -> None:
    from loaderkit.loader._fetch import batch_fetch_is_faithful

    def fetch(self: Any, index: Any) -> Any:
        return index

    cls = type("Custom", (TensorDataset,), {hook: fetch})
    assert not batch_fetch_is_faithful(cls(torch.arange(4)))


# ------------------------------------------------------------- worker info
def split_by_worker(shard: Any) -> Any:
    """The torch docs' pattern: an iterable that shards itself by get_worker_info()."""
    start, end = shard
    info = torch.utils.data.get_worker_info()
    if info is not None:
        per = -(-(end - start) // info.num_workers)
        start = start + info.id * per
        end = min(start + per, end)
    yield from range(start, end)


@pytest.mark.parametrize("shards", [[(0, 10)], [(0, 10), (10, 20)]])
def test_a_reader_that_splits_by_worker_info_loses_nothing(shards: list[Any]) -> None:
    # Measured: 5 of 10 samples (10 of 20 with 2 shards) came back with 2 workers.
    from loaderkit import IterableReader, StreamingShardedDataset

    data = StreamingShardedDataset(shards, IterableReader(split_by_worker), shuffle_shards=False)
    loader = ResumableDataLoader(data, batch_size=2, num_workers=2, seed=0)
    got = sorted(i for batch in loader for i in batch.tolist())
    assert got == list(range(shards[-1][1]))


class Recorded(torch.utils.data.Dataset[Any]):
    """Remembers, per worker, what get_worker_info() said its dataset was."""

    def __init__(self) -> None:
        self.opened = False

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> Any:
        info = torch.utils.data.get_worker_info()
        same = info is not None and info.dataset is self
        return torch.tensor([index, int(same), int(self.opened)])


def open_in_worker(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    info.dataset.opened = True  # the docs' per-worker set-up on the user's dataset


def test_worker_info_shows_the_users_dataset() -> None:
    loader = ResumableDataLoader(
        Recorded(), batch_size=4, num_workers=2, seed=0, worker_init_fn=open_in_worker
    )
    rows = torch.cat(list(loader))
    assert sorted(rows[:, 0].tolist()) == list(range(8))
    assert rows[:, 1].all(), "get_worker_info().dataset was not the user's dataset"
    assert rows[:, 2].all(), "per-worker set-up on get_worker_info().dataset had no effect"


# ------------------------------------------------------ DataLoader attributes
def test_sampler_set_epoch_drives_the_loader() -> None:
    # Lightning calls loader.sampler.set_epoch(e) (and batch_sampler.sampler's),
    # never the loader's own set_epoch.
    loader = ResumableDataLoader(list(range(20)), batch_size=4, shuffle=True, seed=1)
    reference = ResumableDataLoader(list(range(20)), batch_size=4, shuffle=True, seed=1)
    reference.set_epoch(3)
    loader.sampler.set_epoch(3)
    assert epoch_ids(loader) == epoch_ids(reference)
    assert loader.batch_sampler.sampler is loader.sampler


def test_sampler_and_batch_sampler_list_the_next_epoch() -> None:
    loader = ResumableDataLoader(list(range(20)), batch_size=4, shuffle=True, seed=1)
    batches = list(loader.batch_sampler)
    assert list(loader.sampler) == [i for b in batches for i in b]
    assert len(loader.sampler) == 20 and len(loader.batch_sampler) == 5
    assert [b.tolist() for b in loader] == batches  # what the loader then yields


def test_an_unshuffled_loader_has_a_sequential_sampler() -> None:
    # Lightning checks isinstance(sampler, SequentialSampler), e.g. for overfit_batches.
    from torch.utils.data import SequentialSampler

    assert isinstance(ResumableDataLoader(list(range(4))).sampler, SequentialSampler)
    assert not isinstance(
        ResumableDataLoader(list(range(4)), shuffle=True, seed=0).sampler, SequentialSampler
    )


def test_dataloader_attributes_are_there() -> None:
    gen = torch.Generator()
    loader = ResumableDataLoader(
        list(range(8)), batch_size=2, drop_last=True, generator=gen, timeout=5, num_workers=1
    )
    assert loader.drop_last is True and loader.generator is gen and loader.timeout == 5
    assert loader.collate_fn is torch.utils.data.default_collate
    assert loader.persistent_workers is False and loader.prefetch_factor is None
    assert loader.num_workers == 1
    assert loader.worker_init_fn is None and loader.multiprocessing_context is None


# ---------------------------------------------------------------- samplers
def run_and_resume(make: Any, k: int) -> tuple[list[int], list[int]]:
    """Two epochs uninterrupted, and the same cut after k batches and resumed."""
    loader = make()
    full = epoch_ids(loader) + epoch_ids(loader)
    cut = make()
    it = iter(cut)
    before = [i for _ in range(k) for i in next(it).tolist()]
    resumed = make()
    resumed.load_state_dict(cut.state_dict())
    after = epoch_ids(resumed) + epoch_ids(resumed)
    return full, before + after


def test_distributed_sampler_is_not_a_second_split() -> None:
    from torch.utils.data import DistributedSampler

    data = list(range(40))
    per_rank = []
    for rank in (0, 1):
        sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=7)
        loader = ResumableDataLoader(data, batch_size=4, sampler=sampler)
        assert (loader.seed, loader._host.topology()) == (7, (rank, 2))
        per_rank.append(epoch_ids(loader))
    assert [len(ids) for ids in per_rank] == [20, 20]  # split once, not twice (10 each)
    assert sorted(per_rank[0] + per_rank[1]) == data


def test_distributed_sampler_settings_that_contradict_the_loader_are_refused() -> None:
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(list(range(8)), num_replicas=2, rank=0, seed=7)
    with pytest.raises(ValueError, match=r"seed=3 differs from the DistributedSampler's 7"):
        ResumableDataLoader(list(range(8)), sampler=sampler, seed=3)
    with pytest.raises(ValueError, match=r"covers 8 samples but the dataset has 9"):
        ResumableDataLoader(list(range(9)), sampler=sampler)
    dropped = DistributedSampler(range(3), num_replicas=4, rank=0, drop_last=True)
    with pytest.raises(ValueError, match=r"yields no index.*needs at least one sample per rank"):
        ResumableDataLoader(range(3), sampler=dropped)


def test_a_batch_samplers_topology_that_contradicts_the_loader_is_refused() -> None:
    # The loader's rank 1 of 2 was dealt silently; the sampler still said rank 0 of 3.
    from loaderkit import PlanBatchSampler, SamplePlan

    def sampler(**topology: int) -> PlanBatchSampler:
        return PlanBatchSampler(SamplePlan(num_samples=12, batch_size=2), **topology)

    with pytest.raises(ValueError, match=r"rank=1 differs from the batch_sampler's 0"):
        ResumableDataLoader(range(12), batch_sampler=sampler(rank=0, world_size=3), rank=1)
    with pytest.raises(ValueError, match=r"world_size=2 differs from the batch_sampler's 3"):
        ResumableDataLoader(range(12), batch_sampler=sampler(rank=0, world_size=3), world_size=2)
    agreed = ResumableDataLoader(range(12), batch_sampler=sampler(), rank=1, world_size=2)
    assert epoch_ids(agreed) == [2, 3, 6, 7, 10, 11]


def test_a_seed_contradicting_the_samplers_own_generator_is_refused() -> None:
    """Two runs seeding their samplers' generators 7 and 8 read one order under seed=1."""
    from torch.utils.data import RandomSampler

    def sampler(seed: int) -> RandomSampler:
        return RandomSampler(range(20), generator=torch.Generator().manual_seed(seed))

    with pytest.raises(ValueError, match=r"seed=1 would replace the order of the"):
        ResumableDataLoader(list(range(20)), sampler=sampler(7), seed=1)
    # Its own seed is the generator's order, as seed=None (a DataModule hook seeds it so).
    assert epoch_ids(ResumableDataLoader(list(range(20)), sampler=sampler(7), seed=7)) == (
        epoch_ids(ResumableDataLoader(list(range(20)), sampler=sampler(7)))
    )
    assert epoch_ids(ResumableDataLoader(list(range(20)), sampler=sampler(7))) != epoch_ids(
        ResumableDataLoader(list(range(20)), sampler=sampler(8))
    )


@pytest.mark.parametrize("k", [1, 5, 8])
def test_random_subset_and_weighted_samplers_resume_exactly(k: int) -> None:
    from torch.utils.data import RandomSampler, SubsetRandomSampler, WeightedRandomSampler

    data = list(range(50))
    weights = torch.tensor([0.0] * 10 + [1.0] * 40)
    makers = {
        "random": lambda: RandomSampler(data),
        "subset": lambda: SubsetRandomSampler(list(range(0, 50, 2))),
        "weighted": lambda: WeightedRandomSampler(weights, num_samples=40),
    }
    for name, sampler in makers.items():
        full, joined = run_and_resume(
            lambda sampler=sampler: ResumableDataLoader(
                data, batch_size=3, sampler=sampler(), seed=5
            ),
            k,
        )
        assert joined == full, name
        epoch0, epoch1 = full[: len(full) // 2], full[len(full) // 2 :]
        assert epoch0 != epoch1, f"{name}: every epoch had the same order"
        if name == "subset":
            assert sorted(epoch0) == list(range(0, 50, 2))
        if name == "weighted":
            assert min(full) >= 10  # weight 0 is never drawn


def test_a_sampler_with_set_epoch_is_driven_by_the_epoch() -> None:
    class Rotating(torch.utils.data.Sampler[int]):
        def __init__(self) -> None:
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self) -> Any:
            return iter([(i + self.epoch) % 6 for i in range(6)])

        def __len__(self) -> int:
            return 6

    loader = ResumableDataLoader(list(range(6)), batch_size=2, sampler=Rotating(), seed=0)
    assert epoch_ids(loader) == [0, 1, 2, 3, 4, 5]
    assert epoch_ids(loader) == [1, 2, 3, 4, 5, 0]


def test_a_random_sampler_is_dealt_across_ranks_once() -> None:
    from torch.utils.data import RandomSampler

    data = list(range(30))
    seen = []
    for rank in (0, 1):
        loader = ResumableDataLoader(
            data, batch_size=5, sampler=RandomSampler(data), seed=9, rank=rank, world_size=2
        )
        seen += epoch_ids(loader)
    assert sorted(seen) == data


def test_a_sampler_index_outside_the_dataset_is_refused() -> None:
    with pytest.raises(ValueError, match=r"yielded index 9 in epoch 0, outside the dataset's"):
        ResumableDataLoader(list(range(5)), sampler=[0, 9, 1])


# ------------------------------------------------------------ loading modes
def test_batch_size_none_yields_single_samples_like_dataloader() -> None:
    import numpy as np
    from torch.utils.data import DataLoader

    data = [np.array([i, i + 1]) for i in range(6)]
    ours = list(ResumableDataLoader(data, batch_size=None, seed=0))
    theirs = list(DataLoader(data, batch_size=None))
    assert len(ours) == 6
    assert all(torch.equal(a, b) and a.shape == (2,) for a, b in zip(ours, theirs, strict=True))
    loader = ResumableDataLoader(data, batch_size=None, shuffle=True, seed=0)
    it = iter(loader)
    first = [next(it) for _ in range(2)]
    resumed = ResumableDataLoader(data, batch_size=None, shuffle=True, seed=0)
    resumed.load_state_dict(loader.state_dict())
    rest = list(resumed)
    assert sorted(int(x[0]) for x in first + rest) == list(range(6))
    assert loader.batch_size is None and loader.collate_fn is torch.utils.data.default_convert


def test_batch_size_is_none_beside_a_batch_sampler_as_torch_has_it() -> None:
    # Hunter 375: it read 1 (the default) beside a batch sampler of 7, so len * batch_size
    # undercounted an epoch's samples 7x.
    data = list(range(30))
    mix = MixedDataset({"a": TensorDataset(torch.arange(20)), "b": TensorDataset(torch.arange(9))})
    batch_samplers = [
        PlanBatchSampler(SamplePlan(num_samples=30, batch_size=5)),
        torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(data), 7, False),
    ]
    for given in batch_samplers:
        assert torch.utils.data.DataLoader(data, batch_sampler=given).batch_size is None
        assert ResumableDataLoader(data, batch_sampler=given, seed=0).batch_size is None
    assert ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(7, seed=0)).batch_size is None
    assert ResumableDataLoader(data, batch_size=7).batch_size == 7
    # describe() says what the batches hold (review 377): the batch sampler's size.
    assert ResumableDataLoader(data, batch_sampler=batch_samplers[1]).describe()["batch_size"] == 7


def test_batch_size_none_calls_collate_fn_on_each_sample() -> None:
    calls = []

    def collate(sample: Any) -> Any:
        calls.append(sample)
        return sample * 10

    loader = ResumableDataLoader(list(range(4)), batch_size=None, collate_fn=collate, seed=0)
    assert list(loader) == [0, 10, 20, 30] and calls == [0, 1, 2, 3]


class ColumnItems(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A batch read that returns columns (as Hugging Face datasets do), not a list."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.tensor([i, i])}

    def __getitems__(self, rows: list[int]) -> dict[str, torch.Tensor]:
        return {"x": torch.tensor([[i, i] for i in rows])}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batch_size_none_reads_getitem_as_dataloader_does(num_workers: int) -> None:
    from torch.utils.data import DataLoader

    theirs = list(DataLoader(ColumnItems(), batch_size=None, num_workers=num_workers))
    ours = ResumableDataLoader(ColumnItems(), batch_size=None, num_workers=num_workers, seed=0)
    assert (
        [b["x"].tolist() for b in ours]
        == [b["x"].tolist() for b in theirs]
        == [[0, 0], [1, 1], [2, 2]]
    )


class Listed(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, items: torch.Tensor) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return (self.items[i],)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("make", [torch.utils.data.TensorDataset, TensorDataset, Listed])
def test_a_getitems_set_on_the_instance_is_called_as_dataloader_calls_it(
    make: Any, num_workers: int
) -> None:
    from torch.utils.data import DataLoader

    x = torch.arange(6.0)

    def build() -> Any:
        ds = make(x)
        ds.__getitems__ = lambda rows: [(x[i] * 100,) for i in rows]
        return ds

    theirs = [b[0].tolist() for b in DataLoader(build(), batch_size=3, num_workers=num_workers)]
    ours = ResumableDataLoader(build(), batch_size=3, num_workers=num_workers, seed=0)
    assert [b[0].tolist() for b in ours] == theirs == [[0, 100, 200], [300, 400, 500]]


def test_a_subset_over_reversed_numpy_indices_reads_as_dataloader() -> None:
    import numpy as np
    from torch.utils.data import DataLoader, Subset

    ds = Subset(torch.utils.data.TensorDataset(torch.arange(6)), np.arange(6)[::-1])
    theirs = [b[0].tolist() for b in DataLoader(ds, batch_size=3)]
    assert [b[0].tolist() for b in ResumableDataLoader(ds, batch_size=3)] == theirs


class WorkerSeeds(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        yield info.seed - info.id


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_info_seed_is_new_each_epoch_unless_workers_persist(persistent: bool) -> None:
    loader = ResumableDataLoader(
        WorkerSeeds(), batch_size=None, num_workers=2, persistent_workers=persistent, seed=0
    )
    bases = [set(map(int, loader)) for _ in range(3)]
    assert all(len(b) == 1 for b in bases)  # one base per epoch, as torch's
    assert len(set.union(*bases)) == (1 if persistent else 3)
    again = ResumableDataLoader(
        WorkerSeeds(), batch_size=None, num_workers=2, persistent_workers=persistent, seed=0
    )
    assert [set(map(int, again)) for _ in range(3)] == bases  # a function of (seed, epoch)


def test_in_order_false_is_refused_and_pin_memory_device_accepted() -> None:
    with pytest.raises(ValueError, match=r"in_order=False .* pass in_order=True"):
        ResumableDataLoader(list(range(4)), in_order=False)
    with pytest.raises(TypeError, match=r"pin_memory_device must be a str, got 3"):
        ResumableDataLoader(list(range(4)), pin_memory_device=3)  # type: ignore[arg-type]
    loader = ResumableDataLoader(list(range(4)), pin_memory_device="cuda")
    assert loader.pin_memory_device == "cuda" and loader.in_order is True


def test_worker_settings_cannot_drift_from_the_pool() -> None:
    # The worker pool and a saved state's topology are built from them at construction.
    loader = ResumableDataLoader(list(range(4)), num_workers=0)
    with pytest.raises(ValueError, match=r"num_workers cannot be set after the loader is built"):
        loader.num_workers = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"pin_memory cannot be set after the loader is built"):
        loader.pin_memory = True  # type: ignore[misc]


def test_a_state_before_the_first_batch_carries_the_ranks_common_seed() -> None:
    # seed=None on 2 ranks: a state taken before the first batch carried the drawn,
    # provisional seed; the resumed run adopted it and listed another order.
    def make(rank: int) -> ResumableDataLoader:
        return ResumableDataLoader(
            list(range(16)), batch_size=2, shuffle=True, rank=rank, world_size=2
        )

    full = {rank: epoch_ids(make(rank)) for rank in (0, 1)}
    state = make(0).state_dict()
    assert state["plan"]["seed"] == 0
    for rank in (0, 1):
        resumed = make(rank)
        resumed.load_state_dict(state)
        assert epoch_ids(resumed) == full[rank]


def test_a_state_settles_the_seed_once_the_ranks_are_known() -> None:
    # The topology may become known after construction (a process group set up later).
    torch.manual_seed(3)
    loader = ResumableDataLoader(list(range(16)), batch_size=2, shuffle=True)
    drawn = loader.seed
    assert drawn != 0 and loader.state_dict()["plan"]["seed"] == drawn  # one process: kept
    loader._host.rank, loader._host.world_size = 0, 2  # as if torch.distributed came up now
    assert loader.state_dict()["plan"]["seed"] == 0 == loader.seed


# ------------------------------------------------- set_epoch after a loaded state
def _state_at(epoch: int, batches: int) -> dict[str, Any]:
    loader = ResumableDataLoader(list(range(12)), batch_size=4, shuffle=True, seed=2)
    for _ in range(epoch):
        epoch_ids(loader)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return loader.state_dict()


def _resumed(state: dict[str, Any]) -> ResumableDataLoader:
    loader = ResumableDataLoader(list(range(12)), batch_size=4, shuffle=True, seed=2)
    loader.load_state_dict(state)
    return loader


def test_set_epoch_of_another_epoch_after_a_mid_epoch_state_is_refused() -> None:
    # It silently started that epoch from its beginning: the loaded position was lost.
    loader = _resumed(_state_at(1, 2))
    with pytest.raises(
        StateMismatchError,
        match=r"set_epoch: epoch=0, but the loaded state is part-way through epoch 1 "
        r"\(position 8 of 12\)\. Call set_epoch\(1\) or none to resume it",
    ):
        loader.sampler.set_epoch(0)


def test_set_epoch_that_agrees_with_the_loaded_state_resumes_it() -> None:
    reference = ResumableDataLoader(list(range(12)), batch_size=4, shuffle=True, seed=2)
    epochs = [epoch_ids(reference) for _ in range(3)]
    mid = _resumed(_state_at(1, 2))
    mid.set_epoch(1)  # Lightning's resume: the saved epoch
    assert epoch_ids(mid) == epochs[1][8:]
    finished = _resumed(_state_at(1, 3))
    finished.set_epoch(2)  # an epoch's end moving on to the next one
    assert epoch_ids(finished) == epochs[2]
    skipped = _resumed(_state_at(1, 0))
    skipped.set_epoch(2)  # epoch 0 finished, epoch 1 never drawn from: nothing to lose
    assert epoch_ids(skipped) == epochs[2]
