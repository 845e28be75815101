"""The bucketing options are declared once (``BucketOptions``) and checked once (``BucketPlan``),
for every bucketing plan and for ``BucketBatchSampler``."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest

from loaderkit import BucketBatchSampler
from loaderkit.plan.bucket import BucketPlan
from loaderkit.plan.mix import MixBucketPlan
from loaderkit.plan.shard_bucket import ShardBucketPlan

OPTIONS = (
    "batch_size",
    "max_tokens",
    "pad_to_multiple_of",
    "window",
    "shuffle",
    "seed",
    "drop_last",
    "oversize",
)
LENGTHS = [5, 1, 4, 2, 8, 3]
MAKERS: dict[str, Any] = {
    "BucketPlan": lambda **o: BucketPlan(LENGTHS, **o),
    "ShardBucketPlan": lambda **o: ShardBucketPlan(LENGTHS, shard_sizes=(2, 4), **o),
    "MixBucketPlan": lambda **o: MixBucketPlan(LENGTHS, source_sizes=(2, 4), per_epoch=(4, 4), **o),
    "BucketBatchSampler": lambda **o: BucketBatchSampler(LENGTHS, rank=0, world_size=1, **o),
}


@pytest.mark.parametrize("cls", [BucketPlan, ShardBucketPlan, MixBucketPlan, BucketBatchSampler])
def test_the_options_are_declared_once(cls: type) -> None:
    from loaderkit.plan.bucket import BucketOptions

    assert set(BucketOptions.__optional_keys__) == set(OPTIONS)
    params = inspect.signature(cls.__init__).parameters
    assert not set(OPTIONS) & set(params), "an option is declared again"
    var = [p for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert [p.annotation for p in var] == ["Unpack[BucketOptions]"]


@pytest.mark.parametrize("maker", MAKERS.values(), ids=MAKERS.keys())
def test_each_plan_checks_the_options_with_the_same_messages(maker: Any) -> None:
    for options, error, match in (
        ({}, ValueError, r"got neither batch_size nor max_tokens; pass batch_size=<int>"),
        ({"batch_size": 0}, ValueError, r"batch_size must be >= 1, got 0; pass the rows"),
        ({"max_tokens": 8, "pad_to_multiple_of": 0}, ValueError, r"pad_to_multiple_of must"),
        ({"batch_size": 2, "window": 0}, ValueError, r"window must be >= 1, got 0"),
        ({"batch_size": 2, "seed": -1}, ValueError, r"seed must be >= 0, got -1"),
        ({"batch_size": 2, "oversize": "skip"}, ValueError, r"oversize='skip' only applies"),
        ({"batch_size": 2, "batchsize": 3}, TypeError, r"unknown option\(s\) \['batchsize'\]"),
    ):
        with pytest.raises(error, match=f"^BucketBatchSampler: {match}"):
            maker(**options)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("epoch", [0, 3])
def test_a_fixed_size_mix_epoch_is_counted_without_building_it(drop_last: bool, epoch: int) -> None:
    lengths = np.arange(30) % 7 + 1
    plan = MixBucketPlan(
        lengths, source_sizes=(10, 20), per_epoch=(25, 12), batch_size=4, drop_last=drop_last
    )
    assert plan.epoch_length(epoch) == len(plan.batches(epoch)) == (37 // 4 if drop_last else 10)
