"""Short text in the plan modules: functions fit on a screen, error messages are at most two
sentences (what is wrong with which value; the fix) and at most 250 characters."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import loaderkit.plan
from loaderkit import BucketBatchSampler
from loaderkit.plan import samplers
from loaderkit.plan.bucket import BucketPlan
from loaderkit.plan.mix import MixPlan, mix_allotments
from loaderkit.plan.shard_bucket import ShardBucketPlan

PLAN = Path(loaderkit.plan.__file__).parent
# The _cursor, _sampler_plan and _agree modules are the loader engine's (simplified with it).
FILES = [
    "sample.py",
    "mix.py",
    "shard_bucket.py",
    "shard.py",
    "_permutation.py",
    "samplers.py",
    "bucket.py",
    "_bucket_order.py",
    "__init__.py",
]


@pytest.mark.parametrize("name", FILES)
def test_no_function_is_longer_than_60_lines(name: str) -> None:
    tree = ast.parse((PLAN / name).read_text())
    long = [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []


def sentences(message: str) -> int:
    body = re.sub(r"\b(e\.g|i\.e)\.", "", message)
    return len(re.findall(r"[.!?](?=\s+[A-Z]|\s*$)", body))


def _len_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(samplers, "under_lightning_loop", lambda: True)
    watch = samplers._LenWatch()
    watch.answered(5)
    watch.check("ResumableDataLoader", 1, 7)


def _unplanned_batch_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    samplers.check_resumable_sampler(object(), parameter="batch_sampler")


CASES: dict[str, Callable[[pytest.MonkeyPatch], object]] = {
    "oversize": lambda m: BucketPlan([3, 40, 5], max_tokens=8),
    "oversize padded": lambda m: BucketPlan([505, 3, 900], max_tokens=511, pad_to_multiple_of=8),
    "oversize without budget": lambda m: BucketPlan([1, 2], batch_size=1, oversize="skip"),
    "oversize value": lambda m: BucketPlan([1, 2], max_tokens=8, oversize="drop"),  # type: ignore[typeddict-item]
    "neither size": lambda m: BucketPlan([1, 2]),
    "budget below padding": lambda m: BucketPlan([1, 2], max_tokens=4, pad_to_multiple_of=8),
    "all skipped": lambda m: BucketPlan([9, 9], max_tokens=8, oversize="skip"),
    "start past end": lambda m: BucketPlan([1, 2, 3], batch_size=2).schedule(
        0, start=3, rank=0, world_size=1
    ),
    "shard sizes": lambda m: ShardBucketPlan([1, 2, 3], shard_sizes=(1, 1), batch_size=2),
    "weights and repeat": lambda m: mix_allotments((3, 4), weights=(1, 1), repeat=(1, 1)),
    "epoch_size alone": lambda m: mix_allotments((3, 4), epoch_size=5),
    "repeat to 0": lambda m: mix_allotments((300, 4), repeat=(0.001, 1)),
    "weight to 0": lambda m: mix_allotments((3, 4), weights=(100, 1), epoch_size=10),
    "mix names": lambda m: MixPlan(
        source_sizes=(3, 4), per_epoch=(3, 4), batch_size=2, source_names=("a", "a")
    ),
    "mix and shards": lambda m: BucketBatchSampler([1, 2, 3], batch_size=2, source_sizes=(3,)),
    "mix_shards without shards": lambda m: BucketBatchSampler([1, 2], batch_size=1, mix_shards=3),
    "len() changed": _len_watch,
    "batch_sampler without plan": _unplanned_batch_sampler,
}


@pytest.mark.parametrize("make", CASES.values(), ids=CASES.keys())
def test_error_messages_are_two_short_sentences(
    make: Callable[[pytest.MonkeyPatch], object], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(Exception) as info:
        make(monkeypatch)
    message = str(info.value)
    assert sentences(message) <= 2, message
    assert len(message) <= 250, message
