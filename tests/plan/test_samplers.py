"""PlanBatchSampler in a plain torch DataLoader, and which samplers can be resumed at all."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, Sampler, SequentialSampler

from loaderkit import PlanBatchSampler, SamplePlan, StateMismatchError, check_resumable_sampler
from loaderkit.plan._cursor import seal

N, B = 23, 4


def plan(**kwargs: object) -> SamplePlan:
    settings: dict = {"num_samples": N, "batch_size": B, "shuffle": True, "seed": 3}
    settings.update(kwargs)
    return SamplePlan(**settings)


def loader(sampler: PlanBatchSampler) -> DataLoader:
    return DataLoader(torch.arange(N) * 10, batch_sampler=sampler, num_workers=0)


def expected(p: SamplePlan, epoch: int, rank: int = 0, world_size: int = 1) -> list[list[int]]:
    s = p.schedule(epoch, start=0, rank=rank, world_size=world_size)
    return [(s.indices(i) * 10).tolist() for i in range(s.num_steps)]


def test_batches_follow_the_plan_in_a_torch_dataloader() -> None:
    p = plan()
    sampler = PlanBatchSampler(p, rank=0, world_size=1)
    dl = loader(sampler)
    assert [b.tolist() for b in dl] == expected(p, 0)
    assert len(sampler) == len(dl) == 6  # ceil(23 / 4)
    assert sampler.state_dict()["position"] == N


def test_ranks_split_the_epoch() -> None:
    p = plan()
    batches = [
        [b.tolist() for b in loader(PlanBatchSampler(p, rank=r, world_size=2))] for r in (0, 1)
    ]
    assert batches[0] == expected(p, 0, 0, 2)
    assert batches[1] == expected(p, 0, 1, 2)
    assert len(batches[0]) == len(batches[1]) == 3  # 23 = 2 * 8 + 7: a padded last step
    seen = sorted(i // 10 for rank in batches for b in rank for i in b)
    assert set(seen) == set(range(N))
    assert len(seen) == 24  # one wrapped repeat to even out the last step
    assert len(PlanBatchSampler(p, rank=1, world_size=2)) == 3


def test_iter_advances_epochs_and_set_epoch_chooses_one() -> None:
    p = plan()
    sampler = PlanBatchSampler(p, rank=0, world_size=1)
    dl = loader(sampler)
    assert [b.tolist() for b in dl] == expected(p, 0)
    assert [b.tolist() for b in dl] == expected(p, 1)
    sampler.set_epoch(5)
    assert [b.tolist() for b in dl] == expected(p, 5)
    assert sampler.state_dict()["epoch"] == 5
    assert expected(p, 0) != expected(p, 1)


def test_set_epoch_after_iter_before_first_batch_retargets() -> None:
    # Lightning creates the iterator before it calls set_epoch.
    p = plan()
    sampler = PlanBatchSampler(p, rank=0, world_size=1)
    it = iter(loader(sampler))
    sampler.set_epoch(2)
    assert [b.tolist() for b in it] == expected(p, 2)


def _run(sampler: PlanBatchSampler, epochs: range) -> list[tuple[int, list[int]]]:
    dl = loader(sampler)
    out = []
    for epoch in epochs:
        sampler.set_epoch(epoch)
        out += [(epoch, b.tolist()) for b in dl]
    return out


@pytest.mark.parametrize("k", [2, 6, 9], ids=["in-epoch-0", "at-boundary", "in-epoch-1"])
def test_state_dict_resume_is_exact(k: int) -> None:
    p = plan()
    full = _run(PlanBatchSampler(p, rank=0, world_size=1), range(2))
    assert len(full) == 12

    first = PlanBatchSampler(p, rank=0, world_size=1)
    dl = loader(first)
    before: list[tuple[int, list[int]]] = []
    for epoch in range(2):
        first.set_epoch(epoch)
        for batch in dl:
            before.append((epoch, batch.tolist()))
            if len(before) == k:
                break
        if len(before) == k:
            break
    state = first.state_dict()

    resumed = PlanBatchSampler(plan(), rank=0, world_size=1)
    resumed.load_state_dict(state)
    next_epoch = state["epoch"] + (state["position"] == N)
    assert len(resumed) == len(full) - k - 6 * (1 - next_epoch)
    after = _run(resumed, range(next_epoch, 2))
    assert before + after == full


def test_state_is_rank_symmetric_and_versioned() -> None:
    states = []
    for rank in (0, 1):
        sampler = PlanBatchSampler(plan(), rank=rank, world_size=2)
        it = iter(loader(sampler))
        next(it)
        states.append(sampler.state_dict())
    assert states[0] == states[1]
    assert states[0]["version"] == 5
    assert states[0]["position"] == 2 * B
    assert states[0]["topology"] == {"world_size": 2, "num_workers": 0}
    assert "rank" not in states[0]


def test_load_state_dict_refuses_a_different_plan() -> None:
    state = PlanBatchSampler(plan(seed=1), rank=0, world_size=1).state_dict()
    sampler = PlanBatchSampler(plan(seed=2), rank=0, world_size=1)
    with pytest.raises(StateMismatchError, match=r"field 'seed' differs.*seed=1.*seed=2"):
        sampler.load_state_dict(state)
    with pytest.raises(TypeError, match=r"PlanBatchSampler.load_state_dict: state_dict must be"):
        sampler.load_state_dict([("epoch", 0)])  # type: ignore[arg-type]


def test_load_state_dict_refuses_a_position_past_the_epoch() -> None:
    sampler = PlanBatchSampler(plan(), rank=0, world_size=1)
    state = sampler.state_dict()
    state["position"] = N + 1
    with pytest.raises(StateMismatchError, match=r"field 'position' does not match.*checksum"):
        sampler.load_state_dict(state)
    # Sealed again (a state a buggy writer produced consistently): still refused by range.
    with pytest.raises(StateMismatchError, match=r"'position' is 24, past the epoch length 23"):
        sampler.load_state_dict(seal(state | {"steps_done": 1}))


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match=r"plan must be a loaderkit Plan.*got list"):
        PlanBatchSampler([1, 2, 3])  # type: ignore[arg-type]
    sampler = PlanBatchSampler(plan(), rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"set_epoch: epoch must be >= 0, got -1; pass the epoch"):
        sampler.set_epoch(-1)
    # The topology is validated when it is read, at the first batch.
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 2"):
        list(PlanBatchSampler(plan(), rank=2, world_size=2))


class _GlobalRandomSampler(Sampler[int]):
    """Draws from torch's global generator: a new order every listing."""

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(10).tolist())

    def __len__(self) -> int:
        return 10


class _FixedSampler(Sampler[int]):
    def __iter__(self) -> Iterator[int]:
        return iter([2, 0, 1])

    def __len__(self) -> int:
        return 3


def test_check_resumable_sampler_refuses_a_sampler_that_changes_its_order() -> None:
    with pytest.raises(
        TypeError, match=r"sampler=_GlobalRandomSampler lists a different order each time"
    ) as info:
        check_resumable_sampler(_GlobalRandomSampler(), parameter="sampler")
    assert "set_epoch(epoch)" in str(info.value)  # the message gives the fix


@pytest.mark.parametrize(
    "sampler",
    [
        RandomSampler(range(10)),
        RandomSampler(range(10), generator=torch.Generator().manual_seed(0)),
        _FixedSampler(),
    ],
    ids=["random-unseeded", "random-with-generator", "fixed"],
)
def test_check_resumable_sampler_accepts_samplers_with_a_reproducible_order(
    sampler: Sampler,
) -> None:
    check_resumable_sampler(sampler, parameter="sampler")
    with pytest.raises(TypeError, match=rf"^batch_sampler={type(sampler).__name__} cannot"):
        check_resumable_sampler(sampler, parameter="batch_sampler")


def test_check_resumable_sampler_accepts_sequential_and_plan_samplers() -> None:
    check_resumable_sampler(SequentialSampler(range(10)), parameter="sampler")
    check_resumable_sampler(PlanBatchSampler(plan()), parameter="batch_sampler")


def test_numpy_rank_and_world_size_are_plain_ints_and_a_bad_one_is_named() -> None:
    """BucketBatchSampler refused np.int64 ranks, naming WorkerEnv (every other option
    takes numpy ints)."""
    import numpy as np

    from loaderkit import BucketBatchSampler

    bucketed = BucketBatchSampler(
        [3, 1, 4, 1, 5, 9, 2, 6], batch_size=2, rank=np.int64(1), world_size=np.int64(2)
    )
    planned = PlanBatchSampler(SamplePlan(num_samples=8, batch_size=2), rank=np.int32(0))
    assert (type(bucketed.rank), type(bucketed.world_size), type(planned.rank)) == (int, int, int)
    assert [len(b) for b in bucketed] == [2, 2]
    with pytest.raises(ValueError, match=r"PlanBatchSampler: rank must be >= 0, got -1"):
        PlanBatchSampler(SamplePlan(num_samples=8, batch_size=2), rank=-1, world_size=2)
