"""The keyed permutation behind SamplePlan's shuffled order, and the lazy schedule over it.

- it is a bijection of ``[0, n)``: exhaustively for many small ``n`` (1, primes,
  powers of two and their neighbours, where cycle walking is heaviest or
  absent), in full for one ``n`` of a few million, and on samples for 10^10;
- different keys (seeds, epochs) give different orders, and an order is far
  from the identity and spreads every position evenly over the indices;
- a schedule that maps positions chunk by chunk deals exactly what the
  materialized order deals, across chunk boundaries and in any step order;
- taking a batch deep in a 10^10-sample epoch allocates a bounded amount
  (tracemalloc), not the epoch's order.
"""

from __future__ import annotations

import doctest
import pickle
import tracemalloc

import numpy as np
import pytest
import torch

import loaderkit.plan._permutation
from loaderkit import SamplePlan
from loaderkit.plan._permutation import (
    GroupedPermutation,
    KeyedPermutation,
    permutation_digest,
    permute_many,
)
from loaderkit.plan.sample import CHUNK, _FixedSchedule

PRIMES = [2, 3, 5, 7, 11, 13, 31, 127, 257, 521, 4099, 65521]
POWERS = sorted({p + d for k in range(0, 17) for d in (-1, 0, 1) if (p := 2**k) + d >= 1})


def is_permutation(values: np.ndarray, n: int) -> bool:
    return values.dtype == np.int64 and np.array_equal(np.sort(values), np.arange(n))


@pytest.mark.parametrize("n", sorted({*range(1, 130), *PRIMES, *POWERS}))
def test_every_small_n_is_permuted_exactly_under_several_keys(n: int) -> None:
    for key in (0, 1, 2**63 + 5, 2**64 - 1):
        assert is_permutation(KeyedPermutation(n, key).at(np.arange(n)), n), (n, key)


def test_a_few_million_are_permuted_exactly() -> None:
    n = 3 * 2**20 + 7  # the domain is 4**11: ~1.3 encryptions per entry on average
    assert is_permutation(SamplePlan(num_samples=n, batch_size=1, shuffle=True).order(3).numpy(), n)


def test_a_ten_billion_order_is_injective_and_in_range_on_samples() -> None:
    n = 10**10
    perm = KeyedPermutation(n, key=99)
    rng = np.random.default_rng(0)
    positions = np.unique(rng.integers(0, n, size=200_000))
    positions = np.concatenate([positions, [0, 1, n - 2, n - 1]])
    positions = np.unique(positions)
    values = perm.at(positions)
    assert values.min() >= 0 and values.max() < n
    assert np.unique(values).size == positions.size  # distinct positions, distinct entries
    # Evaluating one position alone gives what it gave among others (no batch effects).
    assert [int(perm.at(np.array([p]))[0]) for p in positions[:5]] == values[:5].tolist()
    # Spread over the whole range, not clustered near the positions themselves.
    assert abs(float(values.mean()) / n - 0.5) < 0.01


def test_multi_dimensional_positions_keep_their_shape() -> None:
    perm = KeyedPermutation(1000, key=4)
    grid = np.arange(600).reshape(20, 30)
    assert np.array_equal(perm.at(grid), perm.at(grid.ravel()).reshape(20, 30))


def test_seeds_and_epochs_give_different_orders() -> None:
    n = 5000
    orders = {
        (seed, epoch): SamplePlan(num_samples=n, batch_size=8, shuffle=True, seed=seed)
        .order(epoch)
        .numpy()
        for seed in (0, 1, 2**40)
        for epoch in (0, 1, 2)
    }
    keys = list(orders)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            # Unrelated orders agree in ~1 place of n; allow a few.
            assert int((orders[a] == orders[b]).sum()) < 10, (a, b)


def test_an_order_is_far_from_the_identity() -> None:
    n = 1_000_003
    order = SamplePlan(num_samples=n, batch_size=8, shuffle=True, seed=3).order(0).numpy()
    p = np.arange(n, dtype=np.float64)
    v = order.astype(np.float64)
    assert int((order == np.arange(n)).sum()) < 10  # fixed points: ~1 expected
    # Mean displacement |v - p| of a uniform shuffle is n/3; position and index uncorrelated,
    # and neighbouring positions hold unrelated indices.
    assert abs(float(np.abs(v - p).mean()) / n - 1 / 3) < 0.01
    assert abs(float(np.corrcoef(p, v)[0, 1])) < 0.01
    assert abs(float(np.corrcoef(v[:-1], v[1:])[0, 1])) < 0.01


def test_each_position_is_spread_evenly_over_the_indices_across_keys() -> None:
    """Chi-square of where positions land over 4000 keys, n = 10 (a 2-bit-half network)."""
    n, keys = 10, 4000
    table = np.stack([KeyedPermutation(n, key).at(np.arange(n)) for key in range(keys)])
    expected = keys / n
    for position in range(n):
        counts = np.bincount(table[:, position], minlength=n)
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        # 9 degrees of freedom: P(chi2 > 40) ~ 5e-6 for a uniform shuffle; a near-identity
        # or a biased map (counts piled on a few indices) scores in the hundreds.
        assert chi2 < 40, (position, counts.tolist())


def test_a_lazy_schedule_deals_what_the_materialized_order_deals() -> None:
    # Several chunks (CHUNK positions each), batches that straddle nothing, a wrapped tail.
    plan = SamplePlan(num_samples=3 * CHUNK + 1001, batch_size=37, shuffle=True, seed=5)
    order = plan.order(2)
    for start, rank, ws in ((0, 0, 1), (4 * 37 * 3, 2, 3), (plan.num_samples - 50, 1, 2)):
        lazy = plan.schedule(2, start=start, rank=rank, world_size=ws)
        eager = _FixedSchedule(plan, order, 2, start, rank, ws)
        assert lazy.num_steps == eager.num_steps
        steps = list(range(lazy.num_steps))
        for step in [*steps, *reversed(steps[:: max(1, len(steps) // 50)])]:  # any order
            assert torch.equal(lazy.indices(step), eager.indices(step)), (start, rank, step)
        with pytest.raises(IndexError, match="step must be in"):
            lazy.indices(lazy.num_steps)


def test_a_batch_larger_than_a_chunk_is_one_row() -> None:
    plan = SamplePlan(num_samples=3 * CHUNK, batch_size=CHUNK + 3, shuffle=True, seed=1)
    sched = plan.schedule(0, start=0, rank=0, world_size=1)
    got = np.concatenate([sched.indices_numpy(s) for s in range(sched.num_steps)])
    assert np.array_equal(got[: plan.num_samples], plan.order(0).numpy())


def test_a_batch_deep_in_a_ten_billion_epoch_allocates_a_bounded_amount() -> None:
    n, batch, ws = 10**10, 256, 8
    plan = SamplePlan(num_samples=n, batch_size=batch, shuffle=True, seed=0)
    start = 9 * 10**9  # 90 % through the epoch
    tracemalloc.start()
    try:
        sched = plan.schedule(0, start=start, rank=3, world_size=ws)
        first = sched.indices_numpy(0).copy()
        sched.indices_numpy(1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # One chunk of positions and its temporaries: a few MB (the materialized order: 75 GiB).
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    positions = start + 3 * batch + np.arange(batch)
    assert np.array_equal(first, plan.order_at(0, positions))
    assert np.unique(first).size == batch and first.min() >= 0 and first.max() < n
    assert sched.num_steps == -(-(n - start) // (batch * ws))  # with the short last step


def test_order_at_checks_its_positions() -> None:
    plan = SamplePlan(num_samples=100, batch_size=4, shuffle=True)
    with pytest.raises(ValueError, match=r"positions must lie in \[0, num_samples=100\), got "):
        plan.order_at(0, np.array([5, 100]))
    with pytest.raises(ValueError, match=r"got \[-1, 5\]"):
        plan.order_at(0, np.array([-1, 5]))
    with pytest.raises(TypeError, match=r"positions must be an integer array, got dtype float64"):
        plan.order_at(0, np.array([1.0]))
    assert plan.order_at(0, np.array([], dtype=np.int64)).size == 0
    assert SamplePlan(num_samples=100, batch_size=4).order_at(7, np.array([3, 99])).tolist() == [
        3,
        99,
    ]


def test_sizes_past_int64_are_refused_naming_the_limit() -> None:
    with pytest.raises(ValueError, match=r"num_samples must be < 2\*\*63"):
        SamplePlan(num_samples=2**63, batch_size=1)
    with pytest.raises(ValueError, match=r"KeyedPermutation: key must be < 2\*\*64"):
        KeyedPermutation(5, key=2**64)


def test_the_algorithm_is_pinned() -> None:
    # Re-pinned for state version 4 (the keyed permutation replaced torch.randperm): a
    # change here changes every shuffled order a saved position refers to, so it needs a
    # new STATE_VERSION in plan/_cursor.py, not just new literals.
    plan = SamplePlan(num_samples=10, batch_size=2, shuffle=True, seed=0)
    assert plan.order(0).tolist() == [7, 0, 5, 9, 3, 2, 1, 4, 6, 8]
    assert plan.order(1).tolist() == [3, 7, 4, 0, 2, 9, 6, 1, 8, 5]
    assert permutation_digest() == 849464119
    assert plan.fingerprint()["order_check"] == permutation_digest()


@pytest.mark.parametrize(
    "sizes", [[5], [1000], [3, 17, 64, 1], [1525, 8192, 7, 4096], [2**20], [2**30]]
)
def test_round_tables_give_the_values_of_the_computed_rounds(
    sizes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Round functions are computed (splitmix64) or looked up in tables built from it,
    # depending on sizes and on how much was evaluated: both must give one permutation.
    keys = np.arange(len(sizes), dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(3)
    group = np.repeat(np.arange(len(sizes)), np.minimum(sizes, 50_000))
    pos = np.concatenate([np.arange(min(n, 50_000)) for n in sizes])
    half = len(pos) // 2
    split = GroupedPermutation(np.array(sizes), keys)  # the defaults: may switch part-way
    in_two = np.concatenate(
        [split.at(group[:half], pos[:half]), split.at(group[half:], pos[half:])]
    )
    module = loaderkit.plan._permutation

    def run(limit: int) -> tuple[GroupedPermutation, np.ndarray]:
        monkeypatch.setattr(module, "_TABLE_LIMIT", limit)
        monkeypatch.setattr(module, "_TABLE_EAGER", limit)
        perm = GroupedPermutation(np.array(sizes), keys)
        return perm, perm.at(group, pos)

    computed, want = run(0)
    tabled, got = run(1 << 17)
    assert computed._tables is None
    assert (tabled._tables is not None) == (sizes != [2**30])  # 2**15 wide: over the limit
    assert got.tolist() == want.tolist() == in_two.tolist()
    assert permute_many(np.array(sizes)[group], keys[group], pos).tolist() == want.tolist()
    for n in sizes:
        if n <= 50_000:
            assert sorted(KeyedPermutation(n, 7).at(np.arange(n)).tolist()) == list(range(n))


def test_round_tables_are_not_pickled() -> None:
    perm = GroupedPermutation(np.array([1000, 3000]), np.array([1, 2], dtype=np.uint64))
    group, pos = np.repeat([0, 1], 1000), np.tile(np.arange(1000), 2)
    want = perm.at(group, pos)
    assert perm._tables is not None
    copy = pickle.loads(pickle.dumps(perm))
    assert copy._tables is None and len(pickle.dumps(perm)) < 2000
    assert copy.at(group, pos).tolist() == want.tolist()


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.uint64, np.int64])
def test_groups_of_any_integer_dtype_give_the_same_entries(dtype: type) -> None:
    # group * width was computed in the group's dtype: int8 wrapped, uint64 raised.
    sizes = np.array([100] * 40)
    keys = np.arange(40, dtype=np.uint64)
    group, pos = np.repeat(np.arange(40), 100), np.tile(np.arange(100), 40)
    want = GroupedPermutation(sizes, keys).at(group, pos)
    got = GroupedPermutation(sizes, keys).at(group.astype(dtype), pos)
    assert got.tolist() == want.tolist()


def test_module_docstring_example() -> None:
    result = doctest.testmod(loaderkit.plan._permutation, raise_on_error=False, verbose=False)
    assert result.attempted > 0
    assert result.failed == 0


def test_num_indices_counts_what_the_schedule_yields() -> None:
    for n, batch, ws, drop in (
        (1, 4, 3, False),
        (100, 7, 3, False),
        (100, 7, 3, True),
        (64, 8, 2, False),
    ):
        plan = SamplePlan(num_samples=n, batch_size=batch, shuffle=True, drop_last=drop)
        for start in (0, n // 3, n):
            for rank in range(ws):
                sched = plan.schedule(0, start=start, rank=rank, world_size=ws)
                yielded = sum(len(sched.indices(s)) for s in range(sched.num_steps))
                assert sched.num_indices() == yielded, (n, batch, ws, drop, start, rank)
