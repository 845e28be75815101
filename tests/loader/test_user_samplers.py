"""Samplers the user passes to ResumableDataLoader behave as under torch's DataLoader.

Each test is a way a user's sampler once gave silently different data (or an
error from inside the sampler with no hint why).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Sampler

from loaderkit import ResumableDataLoader, StateMismatchError


def epoch_ids(loader: ResumableDataLoader) -> list[int]:
    return [int(i) for batch in loader for i in batch]


# --------------------------------------------------- a non-torch generator
class NumpySampler(Sampler[int]):
    """Draws from a numpy Generator kept in ``generator``: a common pattern."""

    def __init__(self, n: int) -> None:
        self.n, self.generator = n, np.random.default_rng(0)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return iter(self.generator.permutation(self.n).tolist())


class NumpyEpochSampler(NumpySampler):
    """A numpy generator reseeded by set_epoch: its order is a function of the epoch."""

    def set_epoch(self, epoch: int) -> None:
        self.generator = np.random.default_rng(epoch)


def test_a_numpy_generator_is_not_replaced_and_an_unseeded_one_is_refused_by_name() -> None:
    # It was overwritten with a torch.Generator: AttributeError from inside __iter__.
    with pytest.raises(
        TypeError,
        match=r"sampler=NumpySampler lists a different order each time.*Its `generator` is a "
        r"numpy\.random\._generator\.Generator, which loaderkit does not reseed.*set_epoch",
    ):
        ResumableDataLoader(list(range(8)), batch_size=2, sampler=NumpySampler(8))


def test_a_numpy_generator_reseeded_by_set_epoch_is_kept() -> None:
    sampler = NumpyEpochSampler(8)
    loader = ResumableDataLoader(list(range(8)), batch_size=2, sampler=sampler, seed=0)
    assert isinstance(sampler.generator, np.random.Generator)
    first, second = epoch_ids(loader), epoch_ids(loader)
    assert first == np.random.default_rng(0).permutation(8).tolist()
    assert second == np.random.default_rng(1).permutation(8).tolist()


# ------------------------------------------- samplers the plan must not replace
class Balanced(torch.utils.data.DistributedSampler):  # type: ignore[type-arg]
    """A subclass with its own ``__iter__`` (here DistributedSampler's order, as a list)."""

    def __iter__(self) -> Any:
        return iter(list(super().__iter__()))


def distributed_sampler_wrapper(data: list[int], rank: int) -> Any:
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
    from torch.utils.data import SequentialSampler

    return DistributedSamplerWrapper(
        SequentialSampler(data), num_replicas=2, rank=rank, shuffle=False
    )


@pytest.mark.parametrize("kind", ["subclass", "lightning_wrapper"])
def test_a_distributed_sampler_subclass_is_split_once(kind: str) -> None:
    # Its own order is one rank's share; dealt across ranks again, each epoch lost half.
    data = list(range(16))

    def make(rank: int) -> Any:
        if kind == "subclass":
            return Balanced(data, num_replicas=2, rank=rank, shuffle=True, seed=0)
        return distributed_sampler_wrapper(data, rank)

    for epoch in range(2):
        seen: list[int] = []
        for rank in (0, 1):
            loader = ResumableDataLoader(data, batch_size=2, sampler=make(rank))
            assert loader._host.topology() == (rank, 2)
            loader.set_epoch(epoch)
            seen += epoch_ids(loader)
        assert sorted(seen) == data, f"epoch {epoch}: {sorted(seen)}"


def test_a_distributed_sampler_subclass_resumes_exactly() -> None:
    data = list(range(16))

    def make() -> ResumableDataLoader:
        sampler = Balanced(data, num_replicas=2, rank=1, shuffle=True, seed=3)
        return ResumableDataLoader(data, batch_size=2, sampler=sampler)

    loader = make()
    full = epoch_ids(loader) + epoch_ids(loader)
    cut = make()
    it = iter(cut)
    before = [int(i) for _ in range(3) for i in next(it)]
    resumed = make()
    resumed.load_state_dict(cut.state_dict())
    assert before + epoch_ids(resumed) + epoch_ids(resumed) == full


def test_a_sequential_sampler_over_another_source_yields_its_own_length() -> None:
    # SequentialSampler(range(4)) with 16 samples: torch yields 0..3, it yielded 0..15.
    from torch.utils.data import DataLoader, SequentialSampler

    data = list(range(16))
    sampler = SequentialSampler(range(4))
    expected = [int(i) for b in DataLoader(data, batch_size=3, sampler=sampler) for i in b]
    assert epoch_ids(ResumableDataLoader(data, batch_size=3, sampler=sampler)) == expected
    assert expected == [0, 1, 2, 3]
    whole = SequentialSampler(data)  # over the dataset itself: the loader's own plan
    assert epoch_ids(ResumableDataLoader(data, batch_size=3, sampler=whole)) == data


# ------------------------------------------------- sampler.set_epoch(e) is heard
class EpochSampler(Sampler[int]):
    """A custom sampler whose order is a function of the epoch set on it."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        gen = torch.Generator().manual_seed(100 + self.epoch)
        return iter(torch.randperm(self.n, generator=gen).tolist())


SET_EPOCH_SAMPLERS = {
    "distributed": lambda data: torch.utils.data.DistributedSampler(
        data, num_replicas=1, rank=0, shuffle=True, seed=7
    ),
    "custom": lambda data: EpochSampler(len(data)),
}


@pytest.mark.parametrize("kind", sorted(SET_EPOCH_SAMPLERS))
def test_the_ddp_idiom_sampler_set_epoch_drives_the_loader(kind: str) -> None:
    # for epoch in range(start, E): loader.sampler.set_epoch(epoch); for batch in loader
    # restarted at epoch 2 yielded epoch 0's order: the call never reached the loader.
    data = list(range(12))
    make = SET_EPOCH_SAMPLERS[kind]
    uninterrupted = ResumableDataLoader(data, batch_size=4, sampler=make(data))
    epochs = []
    for epoch in range(3):
        uninterrupted.sampler.set_epoch(epoch)
        epochs.append(epoch_ids(uninterrupted))
    assert epochs[0] != epochs[2]
    sampler = make(data)
    restarted = ResumableDataLoader(data, batch_size=4, sampler=sampler)
    assert restarted.sampler is sampler and type(sampler) is type(make(data))
    sampler.set_epoch(2)
    assert sampler.epoch == 2  # the sampler's own set_epoch ran too
    assert epoch_ids(restarted) == epochs[2]


def test_a_hooked_sampler_copies_pickles_and_drives_every_loader_sharing_it() -> None:
    import copy
    import pickle

    data = list(range(12))
    sampler = EpochSampler(12)
    a = ResumableDataLoader(data, batch_size=4, sampler=sampler)
    b = ResumableDataLoader(data, batch_size=4, sampler=sampler)
    reference = ResumableDataLoader(data, batch_size=4, sampler=EpochSampler(12))
    reference.set_epoch(1)
    expected = epoch_ids(reference)
    sampler.set_epoch(1)
    assert epoch_ids(a) == expected == epoch_ids(b)
    next_epoch = epoch_ids(reference)
    for clone in (copy.deepcopy(sampler), pickle.loads(pickle.dumps(sampler))):
        clone.set_epoch(5)  # its own method, tied to no loader
        assert (clone.epoch, sampler.epoch) == (5, 1)
    assert epoch_ids(a) == next_epoch  # a's next epoch is still 2


def test_a_slotted_sampler_with_set_epoch_is_refused_by_name() -> None:
    class Slotted:
        __slots__ = ("epoch",)

        def __init__(self) -> None:
            self.epoch = 0

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

        def __iter__(self) -> Any:
            return iter(range(4))

        def __len__(self) -> int:
            return 4

    with pytest.raises(
        TypeError, match=r"sampler=Slotted has set_epoch\(\), but loaderkit cannot.*__slots__"
    ):
        ResumableDataLoader(list(range(4)), batch_size=2, sampler=Slotted())


# ------------------------------------- an index drawn twice gets fresh randomness
class Augmenting(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, int(torch.randint(0, 10**9, ()))])


def _weighted(num_workers: int) -> ResumableDataLoader:
    from torch.utils.data import WeightedRandomSampler

    sampler = WeightedRandomSampler([1.0, 1.0, 1.0, 1.0], num_samples=32, replacement=True)
    return ResumableDataLoader(
        Augmenting(), batch_size=8, sampler=sampler, seed=0, num_workers=num_workers
    )


def test_each_draw_of_a_repeated_index_gets_its_own_augmentation() -> None:
    # Keyed by (seed, epoch, index), every copy of an oversampled index was identical.
    batches = torch.cat(list(_weighted(0)))
    draws = batches[:, 1]
    assert draws.unique().numel() == draws.numel() == 32
    assert torch.equal(torch.cat(list(_weighted(2))), batches)  # any num_workers


def test_repeated_draws_resume_with_the_same_augmentation() -> None:
    loader = _weighted(0)
    full = torch.cat(list(loader) + list(loader))
    cut = _weighted(0)
    it = iter(cut)
    before = [next(it) for _ in range(2)]
    resumed = _weighted(0)
    resumed.load_state_dict(cut.state_dict())
    assert torch.equal(torch.cat(before + list(resumed) + list(resumed)), full)


def test_a_state_saved_when_repeated_draws_shared_a_seed_is_refused_by_name() -> None:
    from loaderkit.plan._cursor import seal

    loader = _weighted(0)
    next(iter(loader))
    state = loader.state_dict()
    old = {**state, "plan": {k: v for k, v in state["plan"].items() if k != "repeat_seeding"}}
    seal(old, ("version", "epoch", "position", "steps_done", "plan", "topology"))
    with pytest.raises(
        StateMismatchError, match=r"kind of plan \(fields .*, here .*repeat_seeding"
    ):
        _weighted(0).load_state_dict(old)


class DrawsInSetEpoch(Sampler[int]):
    """Draws its epoch's order from its own generator in ``set_epoch``."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.n, self.generator, self.order = n, generator, list(range(n))

    def set_epoch(self, epoch: int) -> None:
        self.order = torch.randperm(self.n, generator=self.generator).tolist()

    def __iter__(self) -> Any:
        return iter(self.order)

    def __len__(self) -> int:
        return self.n


def test_a_sampler_drawing_in_set_epoch_gets_a_new_order_each_epoch_from_its_seed() -> None:
    # Its set_epoch ran on a fixed marker generator: one order for every epoch and seed.
    def epochs(user_seed: int, state: Any = None) -> list[list[int]]:
        data = list(range(16))
        sampler = DrawsInSetEpoch(16, torch.Generator().manual_seed(user_seed))
        loader = ResumableDataLoader(data, batch_size=4, sampler=sampler)
        if state is not None:
            loader.load_state_dict(state)
        return [[int(i) for b in loader for i in b] for _ in range(3)]

    one, two = epochs(1), epochs(2)
    assert len({tuple(e) for e in one}) == 3 and one != two
    assert all(sorted(e) == list(range(16)) for e in one)
    data = list(range(16))
    loader = ResumableDataLoader(
        data, batch_size=4, sampler=DrawsInSetEpoch(16, torch.Generator().manual_seed(1))
    )
    it = iter(loader)
    head = [int(i) for _ in range(2) for i in next(it)]
    resumed = epochs(1, state=loader.state_dict())
    assert head + resumed[0] == one[0] and resumed[1] == one[1]


def test_a_plan_batch_samplers_seed_is_never_replaced_by_a_saved_one() -> None:
    # It took the state's seed 9 while loader.batch_sampler.plan.seed still said 5.
    from loaderkit import PlanBatchSampler, SamplePlan

    def loader(seed: int) -> ResumableDataLoader:
        plan = SamplePlan(num_samples=10, batch_size=2, shuffle=True, seed=seed)
        return ResumableDataLoader(list(range(10)), batch_sampler=PlanBatchSampler(plan))

    saved = loader(9)
    next(iter(saved))
    with pytest.raises(StateMismatchError, match=r"field 'seed' differs.*seed=9.*seed=5"):
        loader(5).load_state_dict(saved.state_dict())


class SeedsItself(Sampler[int]):
    """Its own seed and epoch decide its order; a generator given would override them."""

    def __init__(self, n: int, seed: int, generator: torch.Generator | None = None) -> None:
        self.n, self.seed, self.epoch, self.generator = n, seed, 0, generator

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        generator = self.generator
        if generator is None:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n


def test_a_sampler_seeding_itself_keeps_its_empty_generator_slot() -> None:
    # A generator lent into the empty slot replaced its seed: seeds 1 and 2 listed alike.
    for seed in (1, 2):
        loader = ResumableDataLoader(list(range(8)), batch_size=8, sampler=SeedsItself(8, seed))
        got = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            got.append(next(iter(loader)).tolist())
        want = [
            torch.randperm(8, generator=torch.Generator().manual_seed(seed + e)).tolist()
            for e in range(2)
        ]
        assert got == want


class SeedsItselfOnce(Sampler[int]):
    """As SeedsItself without set_epoch: the same order every epoch, as torch lists it."""

    def __init__(self, n: int, seed: int, generator: torch.Generator | None = None) -> None:
        self.n, self.seed, self.generator = n, seed, generator

    def __iter__(self) -> Any:
        generator = self.generator or torch.Generator().manual_seed(self.seed)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n


class SeedsItselfLazily(SeedsItselfOnce):
    """Fills its own slot on its first listing: each order depends on the listings before."""

    def __iter__(self) -> Any:
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.seed)
        return super().__iter__()


def test_a_sampler_seeding_itself_without_set_epoch_keeps_its_order() -> None:
    # Hunter 301: without set_epoch it was lent a generator: with seed=None two fresh runs
    # listed two orders, and with seed=0 the loader's order replaced the sampler's own.
    want = torch.randperm(8, generator=torch.Generator().manual_seed(4)).tolist()
    for run, seed in ((0, None), (1, None), (0, 0)):
        torch.manual_seed(run)
        loader = ResumableDataLoader(range(8), batch_size=8, sampler=SeedsItselfOnce(8, 4),
                                     seed=seed)  # fmt: skip
        assert [next(iter(loader)).tolist() for _ in range(2)] == [want, want]
    with pytest.raises(ValueError, match=r"sampler=SeedsItselfLazily sets its generator as it"):
        ResumableDataLoader(range(8), batch_size=8, sampler=SeedsItselfLazily(8, 4))


class KeepsEpoch(torch.utils.data.RandomSampler):
    def set_epoch(self, epoch: int) -> None:  # does not reseed its generator
        self.epoch = epoch


def test_a_seeded_generator_that_set_epoch_does_not_reseed_conflicts_with_another_seed() -> None:
    sampler = KeepsEpoch(list(range(8)), generator=torch.Generator().manual_seed(7))
    with pytest.raises(ValueError, match=r"seed=3 would replace the order of the sampler's own"):
        ResumableDataLoader(list(range(8)), batch_size=4, sampler=sampler, seed=3)


def seeded_random_sampler(data: list[int], *, drawn: bool) -> torch.utils.data.RandomSampler:
    generator = torch.Generator().manual_seed(5)
    if drawn:  # e.g. random_split drew from it first
        torch.randperm(5, generator=generator)
    return torch.utils.data.RandomSampler(data, generator=generator)


@pytest.mark.parametrize("drawn", [False, True])
def test_seed_none_lists_epoch_0_from_the_generator_and_a_seed_given_is_refused(
    drawn: bool,
) -> None:
    # seed=None follows DataLoader's epoch 0 and resumes it. Another seed= keyed it to (seed, 0),
    # silently not the generator's order (hunter 161); a state saved mid-epoch 0 cannot tell the
    # two (review 128: 33 unique samples of 40), so it is refused. The generator's own seed is
    # seed=None (a DataModule hook seeding it from self.seed could not be built).
    data = list(range(20))
    want = epoch_ids(
        torch.utils.data.DataLoader(data, 4, sampler=seeded_random_sampler(data, drawn=drawn))
    )
    saver = ResumableDataLoader(data, 4, sampler=seeded_random_sampler(data, drawn=drawn))
    it = iter(saver)
    head = [b.tolist() for b in (next(it), next(it))]
    resumed = ResumableDataLoader(data, 4, sampler=seeded_random_sampler(data, drawn=drawn))
    resumed.load_state_dict(saver.state_dict())
    assert [x for b in head for x in b] + epoch_ids(resumed) == want
    with pytest.raises(ValueError, match=r"seed=4 would replace the order of the sampler's own"):
        ResumableDataLoader(data, 4, sampler=seeded_random_sampler(data, drawn=drawn), seed=4)
    own_seed = ResumableDataLoader(
        data, 4, sampler=seeded_random_sampler(data, drawn=False), seed=5
    )
    assert epoch_ids(own_seed) == epoch_ids(
        torch.utils.data.DataLoader(data, 4, sampler=seeded_random_sampler(data, drawn=False))
    )


@pytest.mark.parametrize("saved_with_generator", [True, False])
def test_a_sampler_generator_added_or_removed_mid_epoch_0_is_refused(
    saved_with_generator: bool,
) -> None:
    # Hunter 373: epoch 0 is listed from the sampler's own generator, else keyed to the seed;
    # the state could not tell the two, so the rest of epoch 0 went on in another order (76
    # unique samples of 100). Later epochs are keyed alike either way and resume.
    data = list(range(20))

    def build(own: bool) -> ResumableDataLoader:
        if own:
            return ResumableDataLoader(data, 4, sampler=seeded_random_sampler(data, drawn=False))
        return ResumableDataLoader(data, 4, sampler=torch.utils.data.RandomSampler(data), seed=5)

    for epoch in (0, 1):
        saver = build(saved_with_generator)
        saver.set_epoch(epoch)
        it = iter(saver)
        head = [int(i) for _ in range(2) for i in next(it)]
        state = saver.state_dict()
        resumed = build(not saved_with_generator)
        if epoch == 0:
            with pytest.raises(StateMismatchError, match=r"'epoch0_from' differs: epoch 0 was"):
                resumed.load_state_dict(state)
            continue
        resumed.load_state_dict(state)
        assert sorted(head + epoch_ids(resumed)) == data


def test_a_drawn_generator_seeded_otherwise_conflicts_with_seed() -> None:
    # Its state was silently replaced by seed=3's order.
    sampler = seeded_random_sampler(list(range(8)), drawn=True)
    with pytest.raises(
        ValueError,
        match=r"seed=3 would replace the order of the sampler's own generator \(seeded 5\)",
    ):
        ResumableDataLoader(list(range(8)), batch_size=4, sampler=sampler, seed=3)


def test_a_seeded_loader_generator_conflicts_with_seed_too() -> None:
    # generator= had no effect beside seed=, with no error (hunter 275).
    seeded = torch.Generator().manual_seed(5)
    with pytest.raises(ValueError, match=r"seed=1 would replace the order of generator="):
        ResumableDataLoader(list(range(8)), batch_size=4, shuffle=True, generator=seeded, seed=1)
    data = list(range(8))
    bare = ResumableDataLoader(data, 4, shuffle=True, generator=torch.Generator(), seed=1)
    assert epoch_ids(bare) == epoch_ids(ResumableDataLoader(data, 4, shuffle=True, seed=1))


def test_a_seed_from_a_generator_in_another_state_is_refused_with_a_fix_that_works() -> None:
    # Hunter 333: the refusal said "build it with seed=S", which these loaders refuse beside
    # their seeded generator (for a sampler's: back to "leave seed=None", a loop).
    data = list(range(12))

    def saved(loader: ResumableDataLoader) -> dict[str, Any]:
        it = iter(loader)
        next(it)
        return loader.state_dict()

    state = saved(ResumableDataLoader(data, 3, sampler=seeded_random_sampler(data, drawn=True)))
    undrawn = ResumableDataLoader(data, 3, sampler=seeded_random_sampler(data, drawn=False))
    with pytest.raises(
        StateMismatchError,
        match=r"build sampler=RandomSampler's generator in the saved run's state",
    ):
        undrawn.load_state_dict(state)
    ResumableDataLoader(data, 3, sampler=seeded_random_sampler(data, drawn=True)).load_state_dict(
        state
    )

    def drawn(draws: int) -> torch.Generator:
        generator = torch.Generator().manual_seed(8)
        torch.rand(draws, generator=generator)
        return generator

    state = saved(ResumableDataLoader(data, 3, shuffle=True, generator=drawn(5)))
    with pytest.raises(
        StateMismatchError, match=r"build it with seed=(\d+) and no generator="
    ) as e:
        ResumableDataLoader(data, 3, shuffle=True, generator=drawn(0)).load_state_dict(state)
    seed = int(re.search(r"seed=(\d+) and no", str(e.value))[1])  # type: ignore[index]
    ResumableDataLoader(data, 3, shuffle=True, seed=seed).load_state_dict(state)


# ------------------------------------------ later epochs from a global RNG
class CurriculumSampler(Sampler[int]):
    """In order in epoch 0; later epochs shuffled from torch's global RNG (or, with
    ``seed``, from ``(seed, epoch)``)."""

    def __init__(self, n: int, seed: int | None = None) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        if self.epoch == 0:
            return iter(range(self.n))
        generator = None if self.seed is None else torch.Generator().manual_seed(self.seed)
        return iter(torch.randperm(self.n, generator=generator).tolist())


@pytest.mark.parametrize("seed", [None, 5])
def test_a_resume_into_an_epoch_the_sampler_lists_from_a_global_rng_is_refused(
    seed: int | None,
) -> None:
    # Epoch 0 was checked at construction; a resume in epoch 1 relisted another order.
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(
            list(range(37)), batch_size=4, sampler=CurriculumSampler(37, seed)
        )

    torch.manual_seed(0)
    saving = loader()
    epoch_ids(saving)
    it = iter(saving)
    head = [int(i) for _ in range(3) for i in next(it)]
    state, rest = saving.state_dict(), [int(i) for batch in it for i in batch]
    torch.manual_seed(1)  # another process
    resumed = loader()
    if seed is None:
        with pytest.raises(StateMismatchError, match=r"lists epoch 1 differently each time"):
            resumed.load_state_dict(state)
        assert epoch_ids(resumed) == list(range(37))  # refused: it starts epoch 0, unmoved
        return
    resumed.load_state_dict(state)
    assert head + epoch_ids(resumed) == head + rest


def test_a_state_that_resumes_no_part_of_such_an_epoch_is_taken() -> None:
    # No saved order comes back from an epoch's end, nor from a set_epoch not yet begun.
    loader = ResumableDataLoader(list(range(12)), batch_size=4, sampler=CurriculumSampler(12))
    states = []
    for _ in range(2):
        epoch_ids(loader)
        states.append(loader.state_dict())  # an epoch's end
    loader.set_epoch(2)
    states.append(loader.state_dict())
    for state in states:
        resumed = ResumableDataLoader(list(range(12)), batch_size=4, sampler=CurriculumSampler(12))
        resumed.load_state_dict(state)
        assert sorted(epoch_ids(resumed)) == list(range(12))


class _Shrinking(torch.utils.data.Sampler[int]):
    """An epoch of 10 - epoch indices: its length changes with the epoch."""

    def __init__(self) -> None:
        self.epoch, self.generator = 0, None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        return iter(range(10 - self.epoch))

    def __len__(self) -> int:
        return 10 - self.epoch


def test_a_sampler_whose_epochs_change_length_is_refused_by_name() -> None:
    # A saved position counts samples of a fixed-length epoch: a resume would lose or repeat.
    loader = ResumableDataLoader(list(range(10)), batch_size=2, sampler=_Shrinking(), seed=0)
    assert len(list(loader)) == 5  # epoch 0: 10 indices
    with pytest.raises(ValueError, match=r"sampler=_Shrinking yielded 9 indices in epoch 1 but 10"):
        list(loader)


class _Endless(Sampler[int]):
    """detectron2's TrainingSampler pattern: endless shuffled passes (torch iterates it lazily).
    Drawing far past one pass fails the test instead of hanging it."""

    def __init__(self, n: int) -> None:
        self.n, self.drawn = n, 0

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(0)
        while self.drawn < 100 * self.n:
            for i in torch.randperm(self.n, generator=g).tolist():
                self.drawn += 1
                yield i
        raise AssertionError("the loader listed an endless sampler")


class _EndlessSized(_Endless):
    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize("sized", [False, True])
def test_an_endless_sampler_is_refused_by_name_without_listing_it(sized: bool) -> None:
    # Listing it whole hung at construction, its memory growing.
    sampler = (_EndlessSized if sized else _Endless)(10)
    error, match = (
        (ValueError, r"sampler=_EndlessSized yields more than 10 indices, past its len\(\) of 10")
        if sized
        else (TypeError, r"sampler=_Endless has no __len__.*Give _Endless a __len__")
    )
    with pytest.raises(error, match=match):
        ResumableDataLoader(list(range(10)), batch_size=4, sampler=sampler)
    assert sampler.drawn <= (11 if sized else 0)  # at most len() + 1 drawn, none without len()


def test_an_endless_distributed_sampler_subclass_is_refused_by_name() -> None:
    class EndlessShares(torch.utils.data.DistributedSampler):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            for k in range(1000 * self.num_samples):
                yield k % self.num_samples

    sampler = EndlessShares(list(range(10)), num_replicas=2, rank=0)
    with pytest.raises(
        ValueError,
        match=r"sampler=EndlessShares yields more than \d+ indices, past its len\(\) of 5",
    ):
        ResumableDataLoader(list(range(10)), batch_size=4, sampler=sampler)


class _ReadOnlyGenerator(Sampler[int]):
    """Its ``generator`` a read-only property (torch's DataLoader iterates it as it is)."""

    def __init__(self) -> None:
        self._g, self.epoch = torch.Generator().manual_seed(0), 0

    @property
    def generator(self) -> torch.Generator:
        return self._g

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        return iter(torch.randperm(5, generator=self._g).tolist())

    def __len__(self) -> int:
        return 5


@pytest.mark.parametrize("seed", [None, 3])  # 3: probed by set_epoch_reseeds first
def test_a_read_only_generator_is_refused_by_name(seed: int | None) -> None:
    # A bare AttributeError ("property 'generator' ... has no setter") named no parameter or fix.
    with pytest.raises(TypeError, match=r"sampler=_ReadOnlyGenerator has a `generator`.*setter"):
        ResumableDataLoader(list(range(5)), batch_size=2, sampler=_ReadOnlyGenerator(), seed=seed)


class _EpochSeeded(Sampler[int]):
    """Its order a function of its ``epoch`` alone (no generator slot)."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        generator = torch.Generator().manual_seed(self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n


def _distributed(data: list[int]) -> Any:
    return torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, seed=0)


@pytest.mark.parametrize("make", [_distributed, lambda data: _EpochSeeded(len(data))])
def test_a_sampler_set_to_an_epoch_before_the_loader_starts_it_there(make: Any) -> None:
    # sampler.set_epoch(3), then the loader: torch yields epoch 3's order, loaderkit yielded
    # epoch 0's, and building the loader reset sampler.epoch to 0.
    data = list(range(8))

    def run(cls: Any) -> tuple[list[list[int]], int]:
        sampler = make(data)
        sampler.set_epoch(3)  # e.g. a resumed script's own epoch counter
        loader = cls(data, batch_size=4, sampler=sampler)
        built_at = sampler.epoch
        epochs = []
        for epoch in (3, 4):
            epochs.append(epoch_ids(loader))
            sampler.set_epoch(epoch + 1)
        return epochs, built_at

    torch_epochs, _ = run(torch.utils.data.DataLoader)
    epochs, built_at = run(ResumableDataLoader)
    assert built_at == 3
    assert epochs == torch_epochs and epochs[0] != epochs[1]


def test_a_loader_rebuilt_each_epoch_around_one_sampler_follows_its_epoch() -> None:
    data = list(range(8))

    def run(cls: Any) -> list[list[int]]:
        sampler, epochs = _distributed(data), []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            epochs.append(epoch_ids(cls(data, batch_size=4, sampler=sampler)))
        return epochs

    assert run(ResumableDataLoader) == run(torch.utils.data.DataLoader)


class _WeightedShares(torch.utils.data.DistributedSampler):  # type: ignore[type-arg]
    """Weighted draws split like DistributedSampler (hard-example mining updates ``weights``)."""

    def __init__(self, dataset: Any, weights: torch.Tensor, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.weights = weights

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        drawn = torch.multinomial(self.weights, self.total_size, replacement=True, generator=g)
        return iter(drawn.tolist()[self.rank : self.total_size : self.num_replicas])


class _Squaring(_WeightedShares):
    """Its set_epoch updates the weights from their previous value."""

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.weights = self.weights**2


class _Oversampling(torch.utils.data.DistributedSampler):  # type: ignore[type-arg]
    """Each rank draws its own share of 18 from 12 samples (with replacement), counted in
    ``num_samples`` (torch's ``__len__``)."""

    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.num_samples, self.total_size = 18, 18 * self.num_replicas

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(self.seed + 1000 * self.epoch + self.rank)
        return iter(torch.randint(0, 12, (self.num_samples,), generator=g).tolist())


def test_a_set_epoch_updating_its_own_state_is_refused_and_oversampled_shares_taken() -> None:
    """A set_epoch squaring its weights lists another order each time; shares larger than
    the dataset were refused as endless."""
    data = list(range(12))
    with pytest.raises(TypeError, match=r"sampler=_Squaring lists a different order each time"):
        squaring = _Squaring(data, torch.linspace(1, 3, 12), num_replicas=1, rank=0, seed=0)
        ResumableDataLoader(data, sampler=squaring)
    sampler = _Oversampling(data, num_replicas=2, rank=0, seed=0)
    assert epoch_ids(ResumableDataLoader(data, batch_size=6, sampler=sampler)) == list(sampler)


class _LengthRefused(Sampler[int]):
    def __iter__(self) -> Any:
        return iter(range(6))

    def __len__(self) -> int:
        raise TypeError("length unknown")


def test_a_sampler_whose_len_raises_is_named() -> None:
    with pytest.raises(TypeError, match=r"sampler=_LengthRefused's len\(\) raised"):
        ResumableDataLoader(list(range(6)), sampler=_LengthRefused(), batch_size=2)


def _reseeded_epochs(cls: Any, read: Any) -> list[list[int]]:
    """Three epochs of a RandomSampler whose generator the user reseeds before each, after
    ``read(loader)``."""
    data = list(range(10))
    g = torch.Generator().manual_seed(1)
    loader = cls(data, batch_size=3, sampler=torch.utils.data.RandomSampler(data, generator=g))
    epochs = []
    for epoch in range(3):
        read(loader)
        g.manual_seed(100 + epoch)  # reseeded for this epoch
        epochs.append(epoch_ids(loader))
    return epochs


@pytest.mark.parametrize(
    "read",
    [
        lambda loader: len(loader.batch_sampler),  # steps per epoch, for an LR schedule
        lambda loader: list(loader.batch_sampler),
    ],
    ids=["len", "iter"],
)
def test_a_reseed_after_reading_the_batch_sampler_applies_to_that_epoch(read: Any) -> None:
    # len(loader.batch_sampler) listed and cached the epoch: the reseed applied one epoch late.
    want = _reseeded_epochs(torch.utils.data.DataLoader, read)
    assert _reseeded_epochs(ResumableDataLoader, read) == want


class _SortaGrad(Sampler[int]):
    """The first ``warmup`` epochs sorted by length; later ones drawn from the ``generator``
    slot (None here)."""

    def __init__(self, n: int, warmup: int = 1) -> None:
        self.n, self.warmup, self.generator, self.epoch = n, warmup, None, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        if self.epoch < self.warmup:
            return iter(sorted(range(self.n), key=lambda i: (i * 7 % 13, i)))
        return iter(torch.randperm(self.n, generator=self.generator).tolist())


@pytest.mark.parametrize("warmup", [1, 2])
def test_a_sampler_that_draws_only_after_a_warm_up_is_lent_a_keyed_generator(warmup: int) -> None:
    # Was: judged to seed itself from epoch 0 alone (review 226: then epochs 0 and 1), it drew
    # the next epoch from torch's global RNG: seed=7 gave another order each run, and a
    # resume in that epoch was refused.
    def after_warm_up(global_seed: int) -> list[list[int]]:
        torch.manual_seed(global_seed)
        sampler = _SortaGrad(24, warmup)
        loader = ResumableDataLoader(list(range(24)), batch_size=4, seed=7, sampler=sampler)
        for _ in range(warmup):
            list(loader)
        return [b.tolist() for b in loader]

    assert after_warm_up(1) == after_warm_up(2)


class _Annealed(Sampler[int]):
    """Epoch ``e`` draws with weights ``w ** (1 - e / anneal)`` (epoch 0: the weights)."""

    def __init__(self, anneal: int) -> None:
        self.weights = torch.tensor([31.0 if i % 4 == 0 else 1.0 for i in range(24)])
        self.anneal, self.generator, self.epoch = anneal, None, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return 24

    def __iter__(self) -> Any:
        p = self.weights ** (1 - min(self.epoch, self.anneal) / self.anneal)
        return iter(torch.multinomial(p, 24, replacement=True, generator=self.generator).tolist())


def test_a_state_inside_a_later_epoch_is_refused_by_a_sampler_listing_it_otherwise() -> None:
    # Was: only epoch 0's order was checked, so a state saved in epoch 1 under anneal=4 went
    # on under anneal=2 with the rest of another order (repeats and losses).
    def loader(anneal: int) -> ResumableDataLoader:
        return ResumableDataLoader(list(range(24)), batch_size=4, seed=7, sampler=_Annealed(anneal))

    saved = loader(4)
    list(saved)
    it = iter(saved)
    next(it), next(it)
    state = saved.state_dict()
    same = loader(4)
    same.load_state_dict(state)
    assert len(list(same)) == 4
    with pytest.raises(StateMismatchError, match="sampler=_Annealed lists epoch 1 otherwise"):
        loader(2).load_state_dict(state)


def test_a_distributed_samplers_negative_seed_is_named_as_its_own() -> None:
    # Hunter 234: the refusal named the loader's seed=, which the user never passed.
    sampler = torch.utils.data.DistributedSampler(list(range(8)), num_replicas=1, rank=0, seed=-1)
    with pytest.raises(
        ValueError, match=r"the DistributedSampler's seed must be an int >= 0.*got seed=-1"
    ):
        ResumableDataLoader(list(range(8)), batch_size=2, sampler=sampler)


def test_a_batch_sampler_subclass_batching_as_torchs_is_taken_as_it() -> None:
    # Hunter 269: `class MyBS(BatchSampler): pass` was refused as a custom batch sampler.
    class MyBS(torch.utils.data.BatchSampler):
        pass

    batches = MyBS(torch.utils.data.SequentialSampler(range(10)), 3, False)
    got = [b.tolist() for b in ResumableDataLoader(range(10), batch_sampler=batches)]
    assert got == [list(range(i, min(i + 3, 10))) for i in range(0, 10, 3)]


class _WithShares(Sampler[int]):
    """Keyed by epoch, with a ``shares`` attribute of its own (a mixing sampler's)."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch, self.shares = n, 0, torch.tensor([0.7, 0.3])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(1000 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())


def test_a_sampler_with_its_own_shares_attribute_resumes_in_a_later_epoch() -> None:
    # Review 278: the check naming a split sampler's class read the user's `shares`.
    data = list(range(16))
    saver = ResumableDataLoader(data, batch_size=4, sampler=_WithShares(16))
    epoch_ids(saver)
    it = iter(saver)
    next(it)
    state = saver.state_dict()
    resumed = ResumableDataLoader(data, batch_size=4, sampler=_WithShares(16))
    resumed.load_state_dict(state)
    assert [x for b in resumed for x in b.tolist()] == [x for b in it for x in b.tolist()]


@pytest.mark.parametrize("n", [2, 3])
def test_a_small_random_sampler_is_keyed_whatever_the_global_rng(n: int) -> None:
    # Review 305: without the set_epoch gate, two global seeds listing a 2-item permutation
    # alike made torch's RandomSampler "seed itself": its order followed the global RNG.
    orders = []
    for g in range(6):
        torch.manual_seed(g)
        sampler = torch.utils.data.RandomSampler(range(n))
        loader = ResumableDataLoader(list(range(n)), batch_size=n, sampler=sampler, seed=0)
        orders.append([next(iter(loader)).tolist() for _ in range(4)])
    assert all(o == orders[0] for o in orders)


def test_numpy_ints_are_taken_where_torch_takes_them(tmp_path: Any) -> None:
    # A DistributedSampler of numpy rank and num_replicas was refused naming WorkerEnv; a
    # ShardedDataset's batch_sampler refused a numpy seed its bucket sampler takes (hunt 368).
    from torch.utils.data import DataLoader, DistributedSampler

    from loaderkit import ShardedDataset, TokenReader, write_shards

    def sampler() -> DistributedSampler[int]:
        return DistributedSampler(range(10), num_replicas=np.int64(1), rank=np.int64(0), seed=3)

    ours = [
        b.tolist() for b in ResumableDataLoader(list(range(10)), sampler=sampler(), batch_size=4)
    ]
    assert ours == [
        b.tolist() for b in DataLoader(list(range(10)), sampler=sampler(), batch_size=4)
    ]
    reader = TokenReader(seq_len=2)
    data = ShardedDataset(write_shards(tmp_path, [np.arange(8)], reader), reader)
    assert data.batch_sampler(2, seed=np.int64(1)).plan.seed == 1
