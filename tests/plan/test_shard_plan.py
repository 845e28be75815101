"""ShardPlan's lazy order: equal to a materialized reference, exactly once, local, O(shards).

The reference below builds the epoch's order the long way (every window's
keyed permutation materialized, the lanes interleaved by a loop), written from
ShardPlan's docstring and not from its position map; the plan must agree with
it position by position.
"""

from __future__ import annotations

import itertools
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderkit import (
    ResumableDataLoader,
    ShardedDataset,
    ShardPlan,
    StateMismatchError,
    TokenReader,
    write_shards,
)
from loaderkit._tags import SeedTag
from loaderkit.plan._permutation import KeyedPermutation, permute_many
from loaderkit.seeding import GOLDEN, M64, derive_seed, mix64
from tests.support.proptest import examples


def reference_order(plan: ShardPlan, epoch: int) -> list[int]:
    """The epoch's order, materialized from the docstring's four steps."""
    n, k, w = plan.num_samples, plan.mix_shards, plan.window
    if not plan.shuffle:
        return list(range(n))
    sizes = plan.shard_sizes
    starts = np.cumsum(sizes) - np.asarray(sizes)
    shards = KeyedPermutation(len(sizes), derive_seed(plan.seed, SeedTag.SHARDS, epoch)).at(
        np.arange(len(sizes))
    )
    # 1. laid out; where each shard ends in the laid-out sequence.
    laid = [int(starts[s]) + j for s in shards for j in range(sizes[s])]
    shard_ends = set(np.cumsum([sizes[s] for s in shards]).tolist())
    # 2. lanes.
    base, extra = divmod(n, k)
    lane_starts = [j * base + min(j, extra) for j in range(k + 1)]
    # 3. windows from the start of each piece, each shuffled by its own keyed permutation.
    cuts = sorted(shard_ends | set(lane_starts) | {0})
    key = derive_seed(plan.seed, SeedTag.WINDOW, epoch)
    shuffled = list(laid)
    if w > 1:
        for lo, hi in itertools.pairwise(cuts):
            for start in range(lo, hi, w):
                end = min(start + w, hi)
                wkey = mix64((key + (start + 1) * GOLDEN) & M64)
                perm = KeyedPermutation(end - start, wkey).at(np.arange(end - start))
                shuffled[start:end] = [laid[start + int(r)] for r in perm]
    # 4. interleave: position p takes the next sample of lane p % k (last round: lanes 0..).
    lanes = [shuffled[lane_starts[j] : lane_starts[j + 1]] for j in range(k)]
    out: list[int] = []
    for r in range(base + 1):
        out.extend(lane[r] for lane in lanes if r < len(lane))
    return out


SHAPES = [
    (1,),  # one sample
    (7,),  # one shard
    (0, 5, 0),  # empty shards around one
    (3, 0, 2, 3),
    (5, 0, 13, 2, 21, 1, 8),
    (1, 1, 1, 1, 1, 1, 1, 1, 1),  # more lanes than samples per lane
    (40, 3),
]


@pytest.mark.parametrize("sizes", SHAPES)
@pytest.mark.parametrize(("window", "mix"), [(1, 1), (4, 1), (4, 3), (6, 8), (100, 2), (2, 60)])
def test_lazy_order_equals_the_materialized_reference(
    sizes: tuple[int, ...], window: int, mix: int
) -> None:
    if sum(sizes) == 0:
        return
    plan = ShardPlan(shard_sizes=sizes, batch_size=2, seed=11, window=window, mix_shards=mix)
    for epoch in (0, 3):
        want = reference_order(plan, epoch)
        assert plan.order(epoch).tolist() == want
        # Any positions, in any order, map like the materialized order.
        pos = np.random.default_rng(epoch).integers(0, plan.num_samples, size=17)
        assert plan.order_at(epoch, pos).tolist() == [want[p] for p in pos]


@settings(max_examples=examples(60), deadline=None)
@given(
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=12).filter(lambda s: sum(s) > 0),
    window=st.integers(1, 40),
    mix=st.integers(1, 10),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
    world=st.integers(1, 4),
    batch=st.integers(1, 5),
)
def test_exactly_once_and_equal_steps_over_odd_shard_sizes(
    sizes: list[int], window: int, mix: int, seed: int, epoch: int, world: int, batch: int
) -> None:
    plan = ShardPlan(shard_sizes=tuple(sizes), batch_size=batch, seed=seed, window=window,
                     mix_shards=mix, drop_last=False)  # fmt: skip
    n = plan.num_samples
    assert sorted(plan.order(epoch).tolist()) == list(range(n))
    scheds = [plan.schedule(epoch, start=0, rank=r, world_size=world) for r in range(world)]
    assert len({s.num_steps for s in scheds}) == 1
    counts = Counter(
        i for s in scheds for step in range(s.num_steps) for i in s.indices(step).tolist()
    )
    assert set(counts) == set(range(n))
    assert sum(counts.values()) - n < world * batch  # only the wrapped tail repeats


def test_windows_larger_than_a_shard_stay_inside_the_shard() -> None:
    plan = ShardPlan(shard_sizes=(3, 0, 2, 9, 1), batch_size=2, seed=5, window=1000, mix_shards=1)
    order = plan.order(2).tolist()
    pos = 0
    for _, first, end in plan.shuffle_blocks(2):
        assert sorted(order[pos : pos + end - first]) == list(range(first, end))
        pos += end - first


@pytest.mark.parametrize("mix", [1, 4])
def test_consecutive_samples_of_a_lane_come_from_a_bounded_set_of_shards(mix: int) -> None:
    """Locality: any run of `window` consecutive samples of a lane spans at most two pieces
    (so at most 2 shards, plus shards crossed whole when they are smaller than the window);
    with shards of >= window samples, at most 2."""
    w = 16
    sizes = tuple(int(x) for x in np.random.default_rng(0).integers(w, 5 * w, size=30))
    plan = ShardPlan(shard_sizes=sizes, batch_size=4, seed=3, window=w, mix_shards=mix)
    ends = np.cumsum(sizes)
    order = plan.order(1).numpy()
    full = plan.num_samples // mix * mix
    for lane in range(mix):
        shard_of = np.searchsorted(ends, order[lane:full:mix], side="right")
        for lo in range(0, shard_of.size - w):
            assert np.unique(shard_of[lo : lo + w]).size <= 2
        # ... and the lane reads each of its shards in one run (never comes back to one).
        runs = shard_of[np.r_[True, shard_of[1:] != shard_of[:-1]]]
        assert runs.size == np.unique(runs).size


def test_plan_over_ten_billion_samples_in_1e5_shards_is_o_shards_in_memory() -> None:
    """Build the plan and take the batch at 90 % of the epoch: memory bounded by the shards'
    arrays and one chunk, nothing proportional to the 10^10 samples."""
    sizes = tuple([10**5] * 10**5)  # 10^10 samples
    tracemalloc.start()
    try:
        plan = ShardPlan(shard_sizes=sizes, batch_size=256, seed=1, mix_shards=8)
        start = plan.num_samples * 9 // 10 // (8 * 256) * (8 * 256)
        sched = plan.schedule(1, start=start, rank=3, world_size=8)
        first = sched.indices(0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first.numel() == 256 and len(set(first.tolist())) == 256
    assert int(first.min()) >= 0 and int(first.max()) < 10**10
    # 10^5 shards: a handful of int64 arrays of 10^5 entries (~0.8 MB each) + one 64k chunk.
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    # The same batch from the position map directly.
    lo = start + 3 * 256
    assert plan.order_at(1, np.arange(lo, lo + 256)).tolist() == first.tolist()


def test_order_at_checks_positions() -> None:
    plan = ShardPlan(shard_sizes=(3, 4), batch_size=2, window=2, mix_shards=2)
    with pytest.raises(ValueError, match=r"positions must lie in \[0, num_samples=7\), got"):
        plan.order_at(0, np.array([0, 7]))
    with pytest.raises(TypeError, match="positions must be an integer array"):
        plan.order_at(0, np.array([0.5]))


def test_permute_many_equals_one_keyed_permutation_per_entry() -> None:
    rng = np.random.default_rng(4)
    sizes = rng.integers(1, 5000, size=300)
    sizes[:5] = [1, 2, 3, 4, 2**40]
    keys = rng.integers(0, 2**63, size=300).astype(np.uint64) * np.uint64(2)
    pos = (rng.random(300) * sizes).astype(np.int64)
    want = [int(KeyedPermutation(int(n), int(k)).at(np.array([p]))[0])
            for n, k, p in zip(sizes, keys, pos, strict=True)]  # fmt: skip
    assert permute_many(sizes, keys, pos).tolist() == want


def test_a_version_4_state_of_a_sharded_loader_is_refused_naming_the_version(
    tmp_path: Path,
) -> None:
    """Version 4 states point into ShardPlan's old randperm order: refused, version named."""
    reader = TokenReader(seq_len=2)
    shards = write_shards(
        tmp_path, [np.arange(2 * n, dtype=np.int32) for n in (5, 0, 13, 2)], reader
    )
    ds = ShardedDataset(shards, reader)
    run = ResumableDataLoader(ds, batch_sampler=ds.batch_sampler(4, seed=1, window=3))
    next(iter(run))
    state = run.state_dict() | {"version": 4}
    fresh = ResumableDataLoader(ds, batch_sampler=ds.batch_sampler(4, seed=1, window=3))
    with pytest.raises(StateMismatchError, match=r"'version' is 4: .*ShardPlan.*reads version 5"):
        fresh.load_state_dict(state)
