"""The sample plan: a pure function from a few integers to every rank's batches.

The central properties, checked with hypothesis over dataset sizes, batch sizes,
world sizes 1..8, drop_last, shuffle and start positions:

- every rank steps the same number of times, and ``num_steps`` agrees with the
  schedule without computing the order;
- the ranks together cover ``order[start:]`` exactly once, in the documented
  dealing (rank ``r`` takes the ``r``-th block of each global step), with
  wrap-around repeats from ``order[0:]`` only in the last step (or, with
  ``drop_last``, a dropped tail smaller than one global step);
- positions are monotone and end at ``num_samples``;
- resuming at a position reached under one world size with another covers the
  rest of the epoch exactly once.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderkit import SamplePlan
from loaderkit.plan._permutation import permutation_digest
from tests.support.proptest import examples

PLANS = st.builds(
    SamplePlan,
    num_samples=st.integers(1, 2000),
    batch_size=st.integers(1, 300),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**40),
    drop_last=st.booleans(),
)


def deal(plan: SamplePlan, epoch: int, start: int, world_size: int) -> list[list[list[int]]]:
    """``steps[s][r]``: rank r's batch at step s, checking every rank has as many steps."""
    schedules = [
        plan.schedule(epoch, start=start, rank=r, world_size=world_size) for r in range(world_size)
    ]
    counts = {s.num_steps for s in schedules}
    assert len(counts) == 1, f"ranks step different counts: {counts}"
    (num_steps,) = counts
    assert num_steps == plan.num_steps(0, start=start, world_size=world_size)
    return [[s.indices(step).tolist() for s in schedules] for step in range(num_steps)]


def flat(steps: list[list[list[int]]]) -> list[int]:
    return [i for step in steps for batch in step for i in batch]


@settings(max_examples=examples(250), deadline=None)
@given(
    plan=PLANS,
    world_size=st.integers(1, 8),
    epoch=st.integers(0, 3),
    start_frac=st.floats(0, 1),
)
def test_ranks_cover_the_rest_of_the_order_exactly_once(
    plan: SamplePlan, world_size: int, epoch: int, start_frac: float
) -> None:
    n, b = plan.num_samples, plan.batch_size
    start = round(start_frac * n)
    order = plan.order(epoch).tolist()
    steps = deal(plan, epoch, start, world_size)
    remaining = n - start
    full, tail = divmod(remaining, world_size * b)

    # Full steps: every rank a whole batch, nothing repeated.
    for step in steps[:full]:
        assert [len(batch) for batch in step] == [b] * world_size
    dealt = flat(steps)
    if plan.drop_last or tail == 0:
        assert len(steps) == full
        # A dropped tail is smaller than one global step; nothing repeats.
        assert dealt == order[start : start + full * world_size * b]
        assert remaining - len(dealt) < world_size * b
        return
    # The last step: the tail split evenly, each rank ceil(tail / world_size).
    assert len(steps) == full + 1
    tail_batch = -(-tail // world_size)
    assert [len(batch) for batch in steps[-1]] == [tail_batch] * world_size
    # In rank order the ranks deal order[start:] and then wrap to order[0:]
    # (modulo: a tiny dataset may wrap more than once).
    total = len(dealt)
    assert dealt == [order[i % n] for i in range(start, start + total)]
    assert Counter(dealt[:remaining]) == Counter(order[start:])
    repeats = dealt[remaining:]
    assert len(repeats) < world_size  # ceil padding adds fewer than one entry per rank
    assert len(flat(steps[:-1])) <= remaining  # repeats only in the last step


@settings(max_examples=examples(150), deadline=None)
@given(plan=PLANS, world_size=st.integers(1, 8), start_frac=st.floats(0, 1))
def test_positions_are_monotone_and_end_at_num_samples(
    plan: SamplePlan, world_size: int, start_frac: float
) -> None:
    start = round(start_frac * plan.num_samples)
    for rank in {0, world_size - 1}:
        sched = plan.schedule(0, start=start, rank=rank, world_size=world_size)
        positions = [sched.position_after(s) for s in range(sched.num_steps)]
        assert positions == sorted(set(positions))  # strictly increasing
        if positions:
            assert positions[-1] == plan.num_samples
            assert positions[0] > start
        # Before the last step a position is the start plus whole global steps,
        # the same number on every rank.
        global_step = world_size * plan.batch_size
        for s, pos in enumerate(positions[:-1]):
            assert pos == start + (s + 1) * global_step


@settings(max_examples=examples(200), deadline=None)
@given(
    plan=PLANS,
    before=st.integers(1, 8),
    after=st.integers(1, 8),
    stop_frac=st.floats(0, 1),
)
def test_resume_with_a_different_world_size_covers_the_rest_exactly_once(
    plan: SamplePlan, before: int, after: int, stop_frac: float
) -> None:
    n = plan.num_samples
    order = plan.order(1).tolist()
    first = deal(plan, 1, 0, before)
    if not first:
        return  # drop_last and fewer samples than one global step: nothing to stop in
    # Stop after k steps, before the last (the last step ends the epoch).
    k = min(int(stop_frac * len(first)), len(first) - 1)
    sched = plan.schedule(1, start=0, rank=0, world_size=before)
    position = 0 if k == 0 else sched.position_after(k - 1)
    seen = flat(first[:k])
    assert seen == order[:position]  # no repeat before the last step
    rest = flat(deal(plan, 1, position, after))
    both = seen + rest
    if plan.drop_last:
        assert both == order[: len(both)]
        assert n - len(both) < after * plan.batch_size
    else:
        assert Counter(both[:n]) == Counter(range(n))  # every sample exactly once ...
        assert both == [order[i % n] for i in range(len(both))]  # ... then wraps from order[0:]
        assert len(both) - n < after


@settings(max_examples=examples(60), deadline=None)
@given(plan=PLANS, world_size=st.integers(1, 8))
def test_a_start_at_the_end_of_the_epoch_yields_nothing(plan: SamplePlan, world_size: int) -> None:
    n = plan.num_samples
    assert plan.num_steps(0, start=n, world_size=world_size) == 0
    assert plan.schedule(0, start=n, rank=0, world_size=world_size).num_steps == 0


def test_order_is_a_deterministic_permutation_per_seed_and_epoch() -> None:
    plan = SamplePlan(num_samples=1000, batch_size=8, shuffle=True, seed=7)
    again = SamplePlan(num_samples=1000, batch_size=8, shuffle=True, seed=7)
    other_seed = SamplePlan(num_samples=1000, batch_size=8, shuffle=True, seed=8)
    e0, e1 = plan.order(0), plan.order(1)
    assert e0.dtype == torch.int64
    assert sorted(e0.tolist()) == list(range(1000))
    assert torch.equal(e0, again.order(0))
    assert torch.equal(e1, again.order(1))
    assert torch.equal(plan.order(0), e0)  # asked again after another epoch
    assert not torch.equal(e0, e1)
    assert not torch.equal(e0, other_seed.order(0))
    assert not torch.equal(e0, torch.arange(1000))
    # The batch size and drop_last do not change the order, so a position is
    # comparable across them (the fingerprint still pins them).
    assert torch.equal(
        e0, SamplePlan(num_samples=1000, batch_size=3, shuffle=True, seed=7).order(0)
    )


def test_unshuffled_order_is_the_identity_every_epoch() -> None:
    plan = SamplePlan(num_samples=17, batch_size=4, seed=3)
    for epoch in (0, 1, 5):
        assert plan.order(epoch).tolist() == list(range(17))


def test_replace_gives_the_order_of_the_new_settings() -> None:
    plan = SamplePlan(num_samples=50, batch_size=4, shuffle=True, seed=0)
    plan.order(0)
    other = dataclasses.replace(plan, seed=1)
    fresh = SamplePlan(num_samples=50, batch_size=4, shuffle=True, seed=1)
    assert torch.equal(other.order(0), fresh.order(0))
    assert not torch.equal(other.order(0), plan.order(0))


def test_fingerprint_lists_the_settings_a_position_depends_on() -> None:
    plan = SamplePlan(num_samples=10, batch_size=2, shuffle=True, seed=5, drop_last=True)
    assert plan.fingerprint() == {
        "num_samples": 10,
        "batch_size": 2,
        "shuffle": True,
        "seed": 5,
        "drop_last": True,
        "order_check": permutation_digest(),
    }
    assert isinstance(permutation_digest(), int)
    assert permutation_digest() == permutation_digest()
    # Without shuffling there is no permutation to check.
    assert SamplePlan(num_samples=10, batch_size=2).fingerprint()["order_check"] == 0
    # The world size is not in it: a position is valid under any topology.
    assert "world_size" not in plan.fingerprint()
    assert plan.epoch_length(0) == 10


def test_tiny_dataset_wraps_more_than_once() -> None:
    plan = SamplePlan(num_samples=2, batch_size=4, shuffle=False)
    steps = deal(plan, 0, 0, 5)
    assert steps == [[[0], [1], [0], [1], [0]]]


def test_indices_outside_the_schedule_raise() -> None:
    sched = SamplePlan(num_samples=10, batch_size=4).schedule(0, start=0, rank=0, world_size=1)
    assert sched.num_steps == 3
    with pytest.raises(IndexError, match=r"step must be in \[0, 3\), got 3"):
        sched.indices(3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_samples": 0, "batch_size": 1}, ValueError, r"num_samples must be >= 1, got 0"),
        ({"num_samples": 2.0, "batch_size": 1}, TypeError, r"num_samples must be an int"),
        ({"num_samples": True, "batch_size": 1}, TypeError, r"num_samples must be an int"),
        ({"num_samples": 5, "batch_size": 0}, ValueError, r"batch_size must be >= 1, got 0"),
        ({"num_samples": 5, "batch_size": "4"}, TypeError, r"batch_size must be an int"),
        ({"num_samples": 5, "batch_size": 1, "seed": -1}, ValueError, r"seed must be >= 0"),
        ({"num_samples": 5, "batch_size": 1, "seed": None}, TypeError, r"seed must be an int"),
        ({"num_samples": 5, "batch_size": 1, "shuffle": 1}, TypeError, r"shuffle must be a bool"),
        ({"num_samples": 5, "batch_size": 1, "drop_last": "no"}, TypeError, r"drop_last must"),
    ],
)
def test_bad_plan_arguments_are_named(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SamplePlan(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"start": 0, "rank": 0, "world_size": 0}, ValueError, r"world_size must be >= 1"),
        ({"start": 0, "rank": 2, "world_size": 2}, ValueError, r"rank must be < world_size=2"),
        ({"start": 0, "rank": -1, "world_size": 2}, ValueError, r"rank must be >= 0"),
        ({"start": -1, "rank": 0, "world_size": 1}, ValueError, r"start must be >= 0"),
        ({"start": 11, "rank": 0, "world_size": 1}, ValueError, r"start must be <= num_samples=10"),
        ({"start": 1.5, "rank": 0, "world_size": 1}, TypeError, r"start must be an int"),
    ],
)
def test_bad_schedule_arguments_are_named(kwargs: dict, error: type, match: str) -> None:
    plan = SamplePlan(num_samples=10, batch_size=2)
    with pytest.raises(error, match=match):
        plan.schedule(0, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"start": 0, "world_size": 0}, ValueError, r"world_size must be >= 1"),
        ({"start": -1, "world_size": 1}, ValueError, r"start must be >= 0"),
        ({"start": 11, "world_size": 1}, ValueError, r"start must be <= num_samples=10"),
    ],
)
def test_bad_num_steps_arguments_are_named(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SamplePlan(num_samples=10, batch_size=2).num_steps(0, **kwargs)


def test_negative_epoch_is_refused() -> None:
    plan = SamplePlan(num_samples=10, batch_size=2, shuffle=True)
    with pytest.raises(ValueError, match=r"epoch must be >= 0, got -1"):
        plan.order(-1)
    with pytest.raises(ValueError, match=r"epoch must be >= 0"):
        plan.schedule(-1, start=0, rank=0, world_size=1)
