"""Orders, seeding keys and fingerprints pinned to the values loaderkit computed before the
plan modules were simplified (one keyed permutation, one bucketing options object).

A saved position refers to these orders: any change to one of them is a change of
the checkpoint format, not a refactoring.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import numpy as np
import pytest

from loaderkit.plan._permutation import permutation_digest
from loaderkit.plan.bucket import BucketPlan
from loaderkit.plan.mix import MixBucketPlan, MixPlan, _mix_check
from loaderkit.plan.sample import permutation_check
from loaderkit.plan.shard_bucket import ShardBucketPlan, _shard_bucket_check

LENGTHS = np.arange(300) * 37 % 101


def crc(arrays: Iterable[np.ndarray]) -> int:
    return zlib.crc32(np.concatenate(list(arrays)).tobytes())


def test_mix_order_and_draw_keys_are_pinned() -> None:
    plan = MixPlan(source_sizes=(4, 2, 7), per_epoch=(9, 3, 5), batch_size=2, seed=11)
    assert plan.order(0).tolist() == [7, 1, 0, 0, 12, 8, 1, 6, 3, 3, 2, 4, 4, 5, 9, 2, 3]
    assert plan.order(2).tolist() == [3, 3, 1, 2, 6, 5, 1, 6, 12, 4, 2, 2, 10, 0, 7, 3, 5]
    keys = plan.order_map(0).keys_at(np.arange(17)).tolist()
    assert keys == [7, 1, 13, 0, 12, 8, 14, 6, 16, 29, 2, 17, 4, 5, 9, 15, 3]
    keys = plan.order_map(2).keys_at(np.arange(17)).tolist()
    assert keys == [3, 29, 14, 2, 19, 18, 27, 6, 12, 4, 15, 28, 10, 13, 7, 16, 5]


@pytest.mark.parametrize(
    ("epoch", "order_crc", "keys_crc"), [(0, 3535337925, 2838162984), (5, 3639279412, 1032250539)]
)
def test_a_large_mix_order_is_pinned(epoch: int, order_crc: int, keys_crc: int) -> None:
    # Upsampled (3 -> 4000, thousands of source-epochs), downsampled and one-sample sources.
    plan = MixPlan(
        source_sizes=(1000, 3, 50000, 1),
        per_epoch=(2500, 4000, 20000, 7),
        batch_size=8,
        seed=2**40 + 3,
    )
    order = plan.order(epoch).numpy()
    keys = plan.order_map(epoch).keys_at(np.arange(order.size))
    assert (zlib.crc32(order.tobytes()), zlib.crc32(keys.tobytes())) == (order_crc, keys_crc)


def test_order_checks_in_states_are_pinned() -> None:
    assert _mix_check() == 3274616319
    assert _shard_bucket_check() == 3168646633
    assert permutation_check() == 2236424086
    assert permutation_digest() == 849464119


# max_tokens=400, pad_to_multiple_of=8, seed=5 over LENGTHS: the bucket plan's fields.
BUDGET_FINGERPRINT = {
    "num_samples": 300,
    "lengths_crc32": 2107673116,
    "batch_size": None,
    "max_tokens": 400,
    "pad_to_multiple_of": 8,
    "window": 1792,
    "shuffle": True,
    "seed": 5,
    "drop_last": False,
    "order_check": 2236424086,
}


def test_mix_bucket_plan_batches_keys_and_fingerprint_are_pinned() -> None:
    plan = MixBucketPlan(
        LENGTHS,
        source_sizes=(100, 200),
        per_epoch=(250, 50),
        max_tokens=400,
        pad_to_multiple_of=8,
        seed=5,
    )
    assert crc(b.numpy() for b in plan.batches(1)) == 3774854215
    sched = plan.schedule(1, start=3, rank=1, world_size=2)
    assert [sched.seed_keys(i).tolist() for i in range(2)] == [
        [684, 286, 13, 313, 613],
        [45, 345, 645, 247, 75, 375, 675],
    ]
    assert plan.fingerprint() == {
        **BUDGET_FINGERPRINT,
        "kind": "mix-bucket",
        "oversize": "error",
        "source_names": ["0", "1"],
        "source_sizes": [100, 200],
        "per_epoch": [250, 50],
        "mix_check": 3274616319,
        "repeat_seeding": "per_draw",
    }


def test_bucket_plans_batches_and_fingerprints_are_pinned() -> None:
    plan = BucketPlan(LENGTHS, max_tokens=400, pad_to_multiple_of=8, seed=5, oversize="skip")
    assert crc(b.numpy() for b in plan.batches(1)) == 3694236237
    assert plan.fingerprint() == {**BUDGET_FINGERPRINT, "kind": "bucket", "oversize": "skip"}
    for oversize, batches_crc, tokens in (
        ("skip", 3191027603, (4761, 5440)),
        ("truncate", 2927952092, (12041, 12744)),
    ):
        plan = BucketPlan(
            LENGTHS, max_tokens=60, pad_to_multiple_of=8, seed=9, oversize=oversize, window=40
        )
        assert (plan.max_length, plan.oversize_indices.size) == (56, 130)
        assert crc(b.numpy() for b in plan.batches(0)) == batches_crc
        assert plan.token_counts(0) == tokens
    fixed = BucketPlan(LENGTHS, batch_size=6, shuffle=False, drop_last=True, window=20)
    assert fixed.window == 24
    assert crc(b.numpy() for b in fixed.batches(0)) == 2352415932


def test_shard_bucket_plan_batches_and_fingerprint_are_pinned() -> None:
    plan = ShardBucketPlan(
        LENGTHS, shard_sizes=(100, 0, 150, 50), batch_size=7, seed=5, window=30, drop_last=True
    )
    assert crc(b.numpy() for b in plan.batches(1)) == 3808864517
    assert plan.fingerprint() == {
        "kind": "shard-bucket",
        "num_samples": 300,
        "lengths_crc32": 2107673116,
        "batch_size": 7,
        "max_tokens": None,
        "pad_to_multiple_of": None,
        "window": 35,
        "shuffle": True,
        "seed": 5,
        "drop_last": True,
        "oversize": "error",
        "order_check": 3168646633,
        "num_shards": 4,
        "shard_sizes_crc32": 167036799,
        "mix_shards": 8,
        "shard_window": 8192,
    }


def test_the_mix_permutes_its_sources_with_the_one_keyed_permutation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One Feistel implementation (plan/_permutation.py): the mix's per-source-epoch
    # permutations go through permute_many, not a copy of the network.
    from loaderkit.plan import _permutation, mix

    sizes: list[np.ndarray] = []

    def spy(n: np.ndarray, keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
        sizes.append(np.asarray(n))
        return _permutation.permute_many(n, keys, positions)

    monkeypatch.setattr(mix, "permute_many", spy)
    plan = MixPlan(source_sizes=(4, 2, 7), per_epoch=(9, 3, 5), batch_size=2, seed=11)
    assert plan.order(0).tolist() == [7, 1, 0, 0, 12, 8, 1, 6, 3, 3, 2, 4, 4, 5, 9, 2, 3]
    assert sizes and set(np.concatenate(sizes).tolist()) == {4, 2, 7}
    assert not hasattr(mix, "keyed_at")
