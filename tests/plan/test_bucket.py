"""Length bucketing and token budgets: ``BucketBatchSampler`` and its plan.

The central properties, checked with hypothesis over lengths (1..600 samples of
1..512 tokens), fixed batch sizes, token budgets (with ``pad_to_multiple_of``,
a row cap and the oversize policies), windows, world sizes 1..8, ``drop_last``
and start positions, for a global shuffle and over random shard layouts
(``ShardBucketPlan``, its own properties in ``test_shard_bucket.py``):

- an epoch's global batch sequence is a pure function of ``(seed, epoch)``;
- it holds every (non-skipped) sample exactly once, and every batch fits
  ``max_tokens`` counting padding to ``pad_to_multiple_of``;
- every rank steps the same number of times, and the ranks together yield the
  rest of the sequence in the documented dealing: rank ``r`` takes the ``r``-th
  batch of each global step, with repeats of the epoch's first batches in a
  padded last step, or the remainder dropped under ``drop_last``;
- resuming at a position under another world size yields the rest exactly once.

Then the same under ``ResumableDataLoader`` + ``PadCollate`` (0 and 2 workers)
and under a real ``lightning.Trainer``: every batch of two token-budget epochs
of different lengths trained exactly once, and the resume oracle at steps in
epoch 0 and epoch 1.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

from loaderkit import (
    ElasticResume,
    LoaderkitError,
    PadCollate,
    ResumableDataLoader,
    StateMismatchError,
    attach_host,
    compute_lengths,
)
from loaderkit.plan._cursor import seal
from loaderkit.plan.bucket import BucketPlan
from loaderkit.plan.samplers import BucketBatchSampler
from loaderkit.plan.shard_bucket import ShardBucketPlan
from tests.support.helpers import (
    IdModule,
    Interrupted,
    assert_resume_exact,
    no_entry_point_callbacks,
    trainer_kwargs,
)
from tests.support.proptest import examples


def padded(n: int, multiple: int | None) -> int:
    return -(-n // multiple) * multiple if multiple else n


def sequence(plan: BucketPlan, epoch: int) -> list[list[int]]:
    return [b.tolist() for b in plan.batches(epoch)]


def deal(plan: BucketPlan, epoch: int, start: int, world_size: int) -> list[list[int]]:
    """All ranks' batches from ``start``, step-major, checking every rank steps as often."""
    schedules = [
        plan.schedule(epoch, start=start, rank=r, world_size=world_size) for r in range(world_size)
    ]
    counts = {s.num_steps for s in schedules}
    assert len(counts) == 1, f"ranks step different counts: {counts}"
    (steps,) = counts
    assert steps == plan.num_steps(epoch, start=start, world_size=world_size)
    return [s.indices(step).tolist() for step in range(steps) for s in schedules]


def documented_deal(seq: list[list[int]], start: int, world_size: int, drop_last: bool) -> list:
    """The module docstring's rule: the rest of the sequence, then repeats or a dropped tail."""
    rest = seq[start:]
    if drop_last:
        return rest[: len(rest) // world_size * world_size]
    missing = -len(rest) % world_size
    return rest + [seq[k % len(seq)] for k in range(missing)]


@st.composite
def bucket_configs(draw: st.DrawFn) -> tuple[np.ndarray, dict[str, Any]]:
    n = draw(st.integers(1, 600))
    top = draw(st.integers(1, 512))
    lengths = np.random.default_rng(draw(st.integers(0, 2**32))).integers(1, top + 1, n)
    kwargs: dict[str, Any] = {
        "seed": draw(st.integers(0, 2**40)),
        "shuffle": draw(st.booleans()),
        "drop_last": draw(st.booleans()),
        "window": draw(st.one_of(st.none(), st.integers(1, 700))),
    }
    if draw(st.booleans()):  # over shards: a ShardBucketPlan (uneven shards, some empty)
        cuts = sorted(draw(st.lists(st.integers(0, n), max_size=12)))
        kwargs["shard_sizes"] = tuple(np.diff([0, *cuts, n]).tolist())
        kwargs["mix_shards"] = draw(st.integers(1, 10))
        kwargs["shard_window"] = draw(st.integers(1, 64))
    mode = draw(st.sampled_from(["fixed", "tokens", "tokens+rows"]))
    if mode == "fixed":
        kwargs["batch_size"] = draw(st.integers(1, 64))
        return lengths, kwargs
    multiple = draw(st.sampled_from([None, 1, 8, 64]))
    max_tokens = draw(st.integers(multiple or 1, 4096))
    kwargs.update(max_tokens=max_tokens, pad_to_multiple_of=multiple)
    if mode == "tokens+rows":
        kwargs["batch_size"] = draw(st.integers(1, 64))
    max_length = max_tokens // (multiple or 1) * (multiple or 1)
    if lengths.max() > max_length:
        all_too_long = lengths.min() > max_length
        kwargs["oversize"] = (
            "truncate" if all_too_long else draw(st.sampled_from(["skip", "truncate"]))
        )
    return lengths, kwargs


def make_plan(lengths: np.ndarray, kwargs: dict[str, Any]) -> BucketPlan:
    if "shard_sizes" in kwargs:
        return ShardBucketPlan(lengths, **kwargs)
    return BucketPlan(lengths, **kwargs)


# ------------------------------------------------------------------ the plan, by hypothesis


@settings(max_examples=examples(300), deadline=None)
@given(config=bucket_configs(), world_size=st.integers(1, 8))
def test_epochs_are_pure_exactly_once_within_budget_and_dealt_evenly(
    config: tuple[np.ndarray, dict[str, Any]], world_size: int
) -> None:
    lengths, kwargs = config
    plan, again = make_plan(lengths, kwargs), make_plan(lengths, kwargs)
    max_tokens, multiple = kwargs.get("max_tokens"), kwargs.get("pad_to_multiple_of")
    rows_cap = kwargs.get("batch_size")
    skipped = set(plan.oversize_indices.tolist()) if kwargs.get("oversize") == "skip" else set()
    truncated = set(plan.oversize_indices.tolist()) - skipped
    assert plan.num_skipped == len(skipped) and plan.num_truncated == len(truncated)
    eligible = Counter(i for i in range(len(lengths)) if i not in skipped)
    for epoch in (0, 1):
        seq = sequence(plan, epoch)
        assert seq == sequence(again, epoch), "not a pure function of (seed, epoch)"
        assert plan.epoch_length(epoch) == len(seq)
        seen = Counter(i for batch in seq for i in batch)
        if max_tokens is None and kwargs["drop_last"]:
            # Fixed size: only the one short batch is dropped.
            assert all(len(b) == rows_cap for b in seq)
            assert seen <= eligible and sum((eligible - seen).values()) == len(lengths) % rows_cap
        else:
            assert seen == eligible, "not every sample exactly once"
        if max_tokens is None:
            assert sum(len(b) != rows_cap for b in seq) <= 1
        else:
            for batch in seq:
                longest = max(min(int(lengths[i]), plan.max_length or 0) for i in batch)
                assert len(batch) * padded(longest, multiple) <= max_tokens, batch
                assert len(batch) <= (rows_cap or len(batch))
                if truncated & set(batch):
                    assert len(batch) == 1, "a truncated sample must be batched alone"
        real, total = plan.token_counts(epoch)
        assert real <= total
        if seq:
            dealt = deal(plan, epoch, 0, world_size)
            assert dealt == documented_deal(seq, 0, world_size, kwargs["drop_last"])


@settings(max_examples=examples(300), deadline=None)
@given(
    config=bucket_configs(),
    world_size=st.integers(1, 8),
    new_world_size=st.integers(1, 8),
    cut=st.floats(0, 1),
    epoch=st.integers(0, 3),
)
def test_resume_at_any_position_under_any_world_size_yields_the_rest_exactly_once(
    config: tuple[np.ndarray, dict[str, Any]],
    world_size: int,
    new_world_size: int,
    cut: float,
    epoch: int,
) -> None:
    lengths, kwargs = config
    plan = make_plan(lengths, kwargs)
    seq = sequence(plan, epoch)
    steps = plan.num_steps(epoch, start=0, world_size=world_size)
    k = int(cut * steps)  # steps taken under world_size before the checkpoint
    sched = plan.schedule(epoch, start=0, rank=0, world_size=world_size)
    position = sched.position_after(k - 1) if k else 0
    assert position == (len(seq) if 0 < k == steps else k * world_size)
    after = deal(plan, epoch, position, new_world_size)
    assert after == documented_deal(seq, position, new_world_size, kwargs["drop_last"])
    if not kwargs["drop_last"] and position < len(seq):
        trained = Counter(i for b in seq[:position] + after for i in b)
        assert set(trained) == {i for b in seq for i in b}
        repeats = after[len(seq) - position :]
        assert trained - Counter(i for b in repeats for i in b) == Counter(
            i for b in seq for i in b
        )


# ------------------------------------------------------------------------ the plan, by example


def test_epochs_differ_and_token_budget_epochs_vary_in_length() -> None:
    lengths = np.random.default_rng(0).integers(16, 513, 3000)
    plan = BucketPlan(lengths, max_tokens=4096, seed=3, window=256)
    epochs = [sequence(plan, e) for e in range(4)]
    assert all(a != b for a, b in itertools.pairwise(epochs))
    assert len({len(e) for e in epochs}) > 1, "token budgets give epoch lengths that vary"
    fixed = BucketPlan(lengths, batch_size=32, seed=3)
    assert sequence(fixed, 0) != sequence(fixed, 1)
    assert {fixed.epoch_length(e) for e in range(3)} == {94}  # ceil(3000 / 32)


def test_shuffle_false_sorts_each_window_longest_first_and_keeps_batch_order() -> None:
    lengths = [3, 9, 1, 7, 5, 2, 8, 4]
    plan = BucketPlan(lengths, batch_size=2, window=4, shuffle=False)
    assert sequence(plan, 0) == [[1, 3], [0, 2], [6, 4], [7, 5]] == sequence(plan, 1)
    # One window (the default is larger), longest first: lengths [9 | 8, 7 | 5, 4 | 3, 2, 1];
    # each batch's first length, padded to 12, 8, 8, 4, sets its rows: 16 // padded.
    budget = BucketPlan(lengths, max_tokens=16, pad_to_multiple_of=4, shuffle=False)
    assert budget.max_length == 16
    assert sequence(budget, 0) == [[1], [6, 3], [4, 7], [0, 5, 2]]
    assert budget.token_counts(0) == (39, 12 + 16 + 16 + 12)


def test_fixed_size_windows_are_rounded_up_to_a_multiple_of_batch_size() -> None:
    assert BucketPlan([1] * 50, batch_size=8, window=20).window == 24
    assert BucketPlan([1] * 50, batch_size=8).window == 256 * 8
    assert BucketPlan([10] * 50, max_tokens=100).window == 2560  # 256 batches of 10 rows
    huge = BucketPlan([3, 1, 2], batch_size=2, window=10**12, shuffle=False)
    assert sequence(huge, 0) == [[0, 2], [1]]  # one window: sorted whole, nothing allocated


@pytest.mark.parametrize(
    ("dist", "kwargs"),
    [
        ("uniform", {"batch_size": 64}),
        ("uniform", {"max_tokens": 16384}),
        ("lognormal", {"batch_size": 64}),
        ("lognormal", {"max_tokens": 16384}),
    ],
)
def test_padding_is_at_most_3_percent(dist: str, kwargs: dict[str, int]) -> None:
    """The bench goal, on the bench's distributions (smaller: 50k lengths)."""
    rng = np.random.default_rng(0)
    if dist == "uniform":
        lengths = rng.integers(16, 513, 50_000)
    else:
        lengths = np.clip(rng.lognormal(5.5, 1.0, 50_000), 16, 4096).astype(np.int64)
    plan = BucketPlan(lengths, seed=0, oversize="error", **kwargs)
    real, total = plan.token_counts(0)
    assert 1 - real / total <= 0.03


# --------------------------------------------------------------------------------- oversize


def test_oversize_sample_is_an_error_naming_index_length_and_fix() -> None:
    lengths = [10, 20, 900, 30, 2000]
    with pytest.raises(ValueError, match=r"sample 2 has length 900, above max_tokens=512") as info:
        BucketBatchSampler(lengths, max_tokens=512)
    message = str(info.value)
    assert "2 sample(s) are too long; the longest is sample 4 with 2000" in message
    assert "Raise max_tokens to >= 2000" in message and "oversize='skip'" in message
    with pytest.raises(ValueError, match=r"at most 504 tokens per row with pad_to_multiple_of=8"):
        BucketBatchSampler([505], max_tokens=511, pad_to_multiple_of=8)


def test_oversize_skip_leaves_samples_out_counts_and_warns_once() -> None:
    lengths = [10, 600, 20, 700, 30, 40]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sampler = BucketBatchSampler(lengths, max_tokens=100, oversize="skip", seed=1)
        batches = list(sampler) + list(sampler)
    assert len(caught) == 1
    assert "2 of 6 samples are longer than max_length=100 tokens" in str(caught[0].message)
    assert "skipped" in str(caught[0].message) and "sample 1 with 600" in str(caught[0].message)
    assert sampler.num_skipped == 2 and sampler.num_truncated == 0
    assert sorted(i for b in batches for i in b) == [0, 0, 2, 2, 4, 4, 5, 5]


def test_oversize_truncate_batches_each_alone_at_max_length() -> None:
    lengths = [10, 600, 20, 700, 30, 40]
    with pytest.warns(UserWarning, match=r"batched alone, to be truncated to 96 tokens"):
        sampler = BucketBatchSampler(
            lengths, max_tokens=100, pad_to_multiple_of=32, oversize="truncate"
        )
    assert sampler.num_truncated == 2 and sampler.num_skipped == 0 and sampler.max_length == 96
    batches = list(sampler)
    assert [1] in batches and [3] in batches
    assert sorted(i for b in batches for i in b) == list(range(6))
    real, padded_total = sampler.plan.token_counts(0)
    assert real == 10 + 96 + 20 + 96 + 30 + 40 and padded_total >= real


# ------------------------------------------------------------------------------ bad arguments


@pytest.mark.parametrize(
    ("lengths", "kwargs", "error", "match"),
    [
        ([1, 2], {}, ValueError, r"pass batch_size=<int> .* or max_tokens=<int>"),
        ([1, 2], {"batch_size": 0}, ValueError, r"batch_size must be >= 1, got 0; pass the rows"),
        ([1, 2], {"batch_size": 2.0}, TypeError, r"batch_size must be an int, got 2.0 \(float\)"),
        ([1, 2], {"max_tokens": -5}, ValueError, r"max_tokens must be >= 1, got -5"),
        ([1, 2], {"max_tokens": True}, TypeError, r"max_tokens must be an int, got True"),
        (
            [1, 2],
            {"max_tokens": 8, "pad_to_multiple_of": 0},
            ValueError,
            r"pad_to_multiple_of must be >= 1, got 0",
        ),
        (
            [1, 2],
            {"max_tokens": 4, "pad_to_multiple_of": 8},
            ValueError,
            r"max_tokens=4 is below pad_to_multiple_of=8.*at least 8",
        ),
        ([1, 2], {"batch_size": 1, "window": 0}, ValueError, r"window must be >= 1, got 0"),
        ([1, 2], {"batch_size": 1, "seed": -1}, ValueError, r"seed must be >= 0, got -1"),
        ([1, 2], {"batch_size": 1, "shuffle": 1}, TypeError, r"shuffle must be a bool, got 1"),
        (
            [1, 2],
            {"batch_size": 1, "drop_last": "no"},
            TypeError,
            r"drop_last must be a bool, got 'no'",
        ),
        (
            [1, 2],
            {"max_tokens": 8, "oversize": "clip"},
            ValueError,
            r"oversize must be 'error', 'skip' or 'truncate', got 'clip'",
        ),
        (
            [1, 2],
            {"batch_size": 1, "oversize": "skip"},
            ValueError,
            r"oversize='skip' only applies with max_tokens",
        ),
        (
            [9, 9],
            {"max_tokens": 8, "oversize": "skip"},
            ValueError,
            r"all 2 samples are longer than max_tokens=8",
        ),
        ([1, 2], {"batch_size": 1, "rank": 2, "world_size": 2}, ValueError, r"rank"),
        ([], {"batch_size": 1}, ValueError, r"lengths must be 1-D and non-empty, got shape \(0,\)"),
        (
            [[1, 2]],
            {"batch_size": 1},
            ValueError,
            r"lengths must be 1-D and non-empty, got shape \(1, 2\)",
        ),
        ([1.5, 2.0], {"batch_size": 1}, TypeError, r"lengths must hold ints, got dtype float64"),
        ([3, -1], {"batch_size": 1}, ValueError, r"lengths must be >= 0, got lengths\[1\] = -1"),
        (
            "abc",
            {"batch_size": 1},
            TypeError,
            r"lengths must be a sequence or array of ints.*compute_lengths",
        ),
        (None, {"batch_size": 1}, TypeError, r"got NoneType"),
    ],
)
def test_bad_arguments_name_parameter_value_and_fix(
    lengths: Any, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        BucketBatchSampler(lengths, **kwargs)


def test_bad_plan_calls() -> None:
    plan = BucketPlan([1, 2, 3], batch_size=2)
    with pytest.raises(ValueError, match=r"start must be <= the 2 batches of epoch 0, got 3"):
        plan.schedule(0, start=3, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"rank must be < world_size=2, got 2"):
        plan.schedule(0, start=0, rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"epoch must be >= 0, got -1"):
        plan.epoch_length(-1)
    with pytest.raises(IndexError, match=r"step must be in \[0, 2\), got 2"):
        plan.schedule(0, start=0, rank=0, world_size=1).indices(2)


# ------------------------------------------------------------------------------------- state


def test_state_dict_round_trip_and_mismatches() -> None:
    lengths = np.random.default_rng(1).integers(1, 64, 200)

    def sampler(**overrides: Any) -> BucketBatchSampler:
        kwargs: dict[str, Any] = {"max_tokens": 256, "seed": 4, "window": 40}
        kwargs.update(overrides)
        return BucketBatchSampler(kwargs.pop("lengths", lengths), **kwargs)

    saving = sampler()
    it = iter(saving)
    head = [next(it) for _ in range(5)]
    state = saving.state_dict()
    assert state["position"] == 5 and state["plan"]["kind"] == "bucket"
    resumed = sampler()
    resumed.load_state_dict(state)
    assert head + list(resumed) == sequence(saving.plan, 0)
    assert list(resumed) == sequence(saving.plan, 1)

    other = lengths.copy()
    other[7] += 1
    with pytest.raises(StateMismatchError, match=r"field 'lengths_crc32' differs"):
        sampler(lengths=other).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"max_tokens=256, this object has max_tokens=300"):
        sampler(max_tokens=300).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"field 'seed' differs"):
        sampler(seed=5).load_state_dict(state)
    planned = ResumableDataLoader(list(range(200)), batch_size=8, shuffle=True, seed=4)
    # Hunter 373: the refusal listed two sets of fields; it names the two plans now.
    here = r"\(a plan of the loader's own \(no sampler=\), here a 'bucket' plan under max_tokens="
    with pytest.raises(StateMismatchError, match=r"different kind of plan " + here):
        sampler().load_state_dict(planned.state_dict())
    with pytest.raises(StateMismatchError, match=r"saved by a different kind of plan \(a 'buck"):
        planned.load_state_dict(state)
    past = dict(state, position=saving.plan.epoch_length(0) + 1)
    with pytest.raises(StateMismatchError, match=r"field 'position' does not match"):
        sampler().load_state_dict(past)
    seal(past)
    with pytest.raises(ValueError, match=r"field 'position' is \d+, past the epoch length"):
        sampler().load_state_dict(past)
    # The loader refuses a different saved seed instead of silently keeping its own order.
    loader = ResumableDataLoader(list(range(200)), batch_sampler=sampler(seed=5))
    with pytest.raises(StateMismatchError, match=r"field 'seed' differs"):
        loader.load_state_dict(state)


# ----------------------------------------------------------------------------------- loaders


class Tokens(Dataset[dict[str, Any]]):
    """Sample ``i``: ``{"id": i, "x": features, "tokens": arange(lengths[i])}``; ``x`` has noise."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, Any]:
        x = torch.full((4,), index / len(self.lengths)) + torch.rand(4)
        return {"id": index, "x": x, "tokens": torch.arange(int(self.lengths[index]))}


LENGTHS = np.random.default_rng(7).integers(1, 48, 96)
BUDGET, WINDOW, MULTIPLE = 128, 24, 4


def bucket_loader(
    num_workers: int = 0, *, rank: int | None = None, world_size: int | None = None, seed: int = 0
) -> ResumableDataLoader:
    sampler = BucketBatchSampler(
        LENGTHS,
        max_tokens=BUDGET,
        pad_to_multiple_of=MULTIPLE,
        window=WINDOW,
        seed=seed,
        rank=rank,
        world_size=world_size,
    )
    return ResumableDataLoader(
        Tokens(LENGTHS),
        batch_sampler=sampler,
        collate_fn=PadCollate(
            pad_to_multiple_of=MULTIPLE, pad_keys=["tokens"], length_field="tokens"
        ),
        num_workers=num_workers,
    )


@pytest.mark.parametrize("nw", [0, 2])
def test_resumable_loader_with_pad_collate_follows_the_plan_within_budget(nw: int) -> None:
    loader = bucket_loader(nw)
    plan = loader.plan
    assert isinstance(plan, BucketPlan)
    epochs = [[b for b in loader] for _ in range(2)]
    for epoch, batches in enumerate(epochs):
        assert [b["id"].tolist() for b in batches] == sequence(plan, epoch)
        assert len(batches) == plan.epoch_length(epoch)
        for b in batches:
            assert b["tokens"].numel() <= BUDGET and b["tokens"].shape[1] % MULTIPLE == 0
    # Resume mid-epoch 1 with fresh objects, exact (features included: per-sample seeding).
    saving = bucket_loader(nw)
    list(saving)
    it = iter(saving)
    head = [next(it) for _ in range(3)]
    resumed = bucket_loader(0 if nw else 2)
    resumed.load_state_dict(saving.state_dict())
    rest = list(resumed)
    assert len(head) + len(rest) == len(epochs[1])
    for got, want in zip(head + rest, epochs[1], strict=True):
        assert torch.equal(got["id"], want["id"]) and torch.equal(got["x"], want["x"])


def test_loader_elastic_resume_two_ranks_to_three_covers_the_rest_exactly_once() -> None:
    ranks = [bucket_loader(rank=r, world_size=2) for r in range(2)]
    iters = [iter(r) for r in ranks]
    before = [next(it)["id"].tolist() for _ in range(4) for it in iters]
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict() and state["position"] == 8
    after = []
    for r in range(3):
        loader = bucket_loader(rank=r, world_size=3)
        loader.load_state_dict(state)
        after.append([b["id"].tolist() for b in loader])
    assert len({len(a) for a in after}) == 1
    plan = ranks[0].plan
    assert isinstance(plan, BucketPlan)
    seq = sequence(plan, 0)
    assert before == seq[:8]
    dealt = [batch for step in zip(*after, strict=True) for batch in step]
    assert dealt == documented_deal(seq, 8, 3, drop_last=False)


@pytest.mark.filterwarnings("ignore:PlanBatchSampler. epoch 2 yields")  # see the next test
def test_torch_dataloader_len_follows_each_epoch() -> None:
    sampler = BucketBatchSampler(LENGTHS, max_tokens=BUDGET, window=WINDOW, seed=2)
    collate = PadCollate(length_field="tokens")
    loader = DataLoader(Tokens(LENGTHS), batch_sampler=sampler, collate_fn=collate)
    for epoch in range(3):
        length = len(loader)
        assert length == sampler.plan.epoch_length(epoch)
        assert [b["id"].tolist() for b in loader] == sequence(sampler.plan, epoch)


def first_longer_epoch(seed_range: range = range(50)) -> int:
    """A seed whose epoch 1 has more batches than epoch 0 (so Lightning would cut it short)."""
    for seed in seed_range:
        plan = bucket_loader(seed=seed).plan
        if plan.epoch_length(1) > plan.epoch_length(0):
            return seed
    raise AssertionError("no seed gives a longer epoch 1")


SEED = first_longer_epoch()


PLAN = bucket_loader(seed=SEED).plan
G0, G1 = PLAN.epoch_length(0), PLAN.epoch_length(1)


def test_a_loop_of_ones_own_may_see_epoch_lengths_vary() -> None:
    """Lightning caps an epoch at the first len() (tested with Lightning below, where a
    longer epoch is an error); a loop that iterates each epoch to its end is unaffected."""
    loader = bucket_loader(seed=SEED)
    lengths = []
    for _ in range(2):
        lengths.append(len(loader))
        assert sum(1 for _ in loader) == lengths[-1]
    assert lengths == [G0, G1]


# ------------------------------------------------------------------------------- Lightning


class BucketDataModule(L.LightningDataModule):
    def __init__(self, num_workers: int, world_size: int | None = None) -> None:
        super().__init__()
        self.num_workers = num_workers
        # Rank 0 of world_size ranks, in one process: the loader splits the plan itself.
        self.rank, self.world_size = (None, None) if world_size is None else (0, world_size)
        self.loader: ResumableDataLoader | None = None

    def train_dataloader(self) -> ResumableDataLoader:
        self.loader = bucket_loader(
            self.num_workers, seed=SEED, rank=self.rank, world_size=self.world_size
        )
        return attach_host(self.loader, self.trainer)


class ValDataModule(BucketDataModule):
    def val_dataloader(self) -> DataLoader:
        return DataLoader(torch.zeros(2, 4), batch_size=2)


class ValModule(IdModule):
    """IdModule plus a validation loop that records when it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.validated_at: list[tuple[int, int]] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self.validated_at.append((self.current_epoch, self.global_step))


@dataclass
class Run:
    records: list[dict[str, Any]]
    ckpt: Path | None


def fit(
    root: Path,
    nw: int,
    *,
    fail_at: int | None = None,
    resume: Path | None = None,
    elastic: bool = True,
    model: IdModule | None = None,
    world_size: int | None = None,
) -> Run:
    model = model or IdModule(fail_at=fail_at)
    callbacks: list[Callback] = [ElasticResume()] if elastic else []
    if fail_at is not None:
        callbacks.append(
            ModelCheckpoint(
                dirpath=root, filename="cut", every_n_train_steps=fail_at, save_top_k=-1
            )
        )
    with contextlib.nullcontext() if elastic else no_entry_point_callbacks():
        trainer = L.Trainer(
            **trainer_kwargs(enable_checkpointing=fail_at is not None, callbacks=callbacks)
        )
    if fail_at is not None:
        with pytest.raises(Interrupted):
            trainer.fit(model, datamodule=BucketDataModule(nw))
        return Run(model.records, root / "cut.ckpt")
    trainer.fit(model, datamodule=BucketDataModule(nw, world_size), ckpt_path=resume)
    return Run(model.records, None)


@pytest.fixture(scope="module")
def full_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Run]:
    return {nw: fit(tmp_path_factory.mktemp(f"full{nw}"), nw) for nw in (0, 2)}


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore:.*LeafSpec")
def test_lightning_trains_every_batch_of_two_token_budget_epochs_exactly_once(
    tmp_path: Path, full_runs: dict[int, Run]
) -> None:
    """Epoch 1 has more batches than epoch 0 (Lightning reads len() once per fit);
    with ElasticResume both epochs train every batch of the plan exactly once, in order,
    with 0 and 2 workers, and validation runs once per epoch, after its last batch."""
    assert G1 > G0
    for nw, run in full_runs.items():
        assert [(r["epoch"], r["ids"]) for r in run.records] == [
            (e, b) for e in (0, 1) for b in sequence(PLAN, e)
        ], f"num_workers={nw}"
    model = ValModule()
    trainer = L.Trainer(
        **trainer_kwargs(callbacks=[ElasticResume()], limit_val_batches=1, num_sanity_val_steps=0)
    )
    trainer.fit(model, datamodule=ValDataModule(0))
    assert model.validated_at == [(0, G0), (1, G0 + G1)]


@pytest.mark.filterwarnings("ignore:.*LeafSpec")
def test_without_elastic_resume_the_longer_epoch_is_an_error_not_a_silent_cut(
    tmp_path: Path,
) -> None:
    """Lightning would stop epoch 1 after G0 of its G1 batches: the loader refuses to start it."""
    with pytest.raises(LoaderkitError, match=r"epoch 1 yields \d+ batches.*ElasticResume"):
        fit(tmp_path, 0, elastic=False)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore:.*LeafSpec")
@pytest.mark.parametrize("where", ["epoch0", "epoch1"])
@pytest.mark.parametrize("nw", [0, 2])
def test_lightning_resume_oracle_with_token_budgets(
    tmp_path: Path, full_runs: dict[int, Run], nw: int, where: str
) -> None:
    """Interrupted by an exception right after the step-k checkpoint, resumed from it with a
    fresh model, DataModule and loader: the two runs together are the uninterrupted run."""
    k = G0 // 2 if where == "epoch0" else G0 + G1 // 2
    cut = fit(tmp_path / "cut", nw, fail_at=k)
    assert len(cut.records) == k and cut.ckpt is not None and cut.ckpt.exists()
    after = fit(tmp_path / "after", nw, resume=cut.ckpt)
    assert_resume_exact(full_runs[nw].records, cut.records, after.records)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore:.*LeafSpec")
def test_lightning_resume_with_more_ranks_deals_the_rest_of_the_epoch(tmp_path: Path) -> None:
    """Saved on one rank inside epoch 0, resumed as rank 0 of two: rank 0 trains its share of
    the remaining batches of epoch 0, then its share of the (differently long) epoch 1."""
    k = G0 // 2
    cut = fit(tmp_path / "cut", 0, fail_at=k)
    assert cut.ckpt is not None
    after = fit(tmp_path / "after", 0, resume=cut.ckpt, world_size=2)
    rest = PLAN.schedule(0, start=k, rank=0, world_size=2)
    whole = PLAN.schedule(1, start=0, rank=0, world_size=2)
    expected = [(0, rest.indices(i).tolist()) for i in range(rest.num_steps)]
    expected += [(1, whole.indices(i).tolist()) for i in range(whole.num_steps)]
    assert [(r["epoch"], r["ids"]) for r in after.records] == expected


# ------------------------------------------------------------------------------ lengths


class Counting(Dataset[dict[str, Any]]):
    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.calls = 0

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, index: int) -> dict[str, Any]:
        self.calls += 1
        return {"input_ids": list(range(self.sizes[index]))}


def ids_length(sample: dict[str, Any]) -> int:
    return len(sample["input_ids"])


def test_compute_lengths_with_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    data = Counting([3, 0, 5])
    assert compute_lengths(data, ids_length).tolist() == [3, 0, 5]
    assert "loaderkit: lengths" in capsys.readouterr().err
    assert compute_lengths([np.zeros(4), torch.zeros(2)], progress=False).tolist() == [4, 2]
    assert compute_lengths([], progress=False).tolist() == []  # (argmax of nothing raised)
    sampler = BucketBatchSampler(compute_lengths(data, ids_length, progress=False), batch_size=2)
    assert sorted(i for b in sampler for i in b) == [0, 1, 2]


class _Prompted(torch.utils.data.StackDataset):  # type: ignore[type-arg]
    """A torch StackDataset subclass prepending a 4-token prompt in __getitem__ only."""

    def __getitem__(self, index: int) -> Any:
        return {"ids": torch.cat([torch.full((4,), -1), super().__getitem__(index)["ids"]])}


def test_compute_lengths_reads_a_subclass_as_the_loader_does() -> None:
    # Lengths were read through torch's inherited __getitems__, past the subclass's
    # __getitem__ the loader reads: [3, 1] for [7, 5], batches 3x over max_tokens.
    data = _Prompted(ids=[torch.arange(n) for n in (3, 1, 6, 2)])
    lengths = compute_lengths(data, lambda s: len(s["ids"]), progress=False)
    assert lengths.tolist() == [7, 5, 10, 6]
    sampler = BucketBatchSampler(lengths, max_tokens=12, shuffle=False)
    loader = ResumableDataLoader(data, batch_sampler=sampler, collate_fn=PadCollate())
    assert max(batch["ids"].numel() for batch in loader) <= 12


def test_a_length_fn_error_names_the_sample_and_its_shard(tmp_path: Path) -> None:
    # A KeyError 'input_ids' named neither the sample nor the file it is in.
    from loaderkit import JsonlReader, ShardedDataset, write_shards

    rows = [{"input_ids": [1, 2]}] * 5 + [{"ids": [3]}]
    with pytest.raises(KeyError) as raised:
        compute_lengths(rows, ids_length, progress=False)
    assert raised.value.__notes__ == ["compute_lengths: raised measuring sample 5"]
    write_shards(tmp_path / "j", [rows[:3], rows[3:]], JsonlReader())
    shards = ShardedDataset(tmp_path / "j", JsonlReader())
    with pytest.raises(KeyError) as raised:
        shards.lengths(ids_length)
    assert raised.value.__notes__[0].endswith(f"sample 5 (row 2 of {shards.shards[1]})")


def test_compute_lengths_cache_is_keyed_and_checked(tmp_path: Path) -> None:
    cache = tmp_path / "sub" / "lengths.npy"
    data = Counting([4, 1, 7] * 20)
    first = compute_lengths(data, ids_length, cache=cache, progress=False)
    assert data.calls == 60 + 8  # and 8 read again under a seed
    assert cache.exists() and cache.with_name("lengths.npy.json").exists()
    again = compute_lengths(data, ids_length, cache=cache, progress=False)
    assert data.calls <= 78 and again.tolist() == first.tolist() == [4, 1, 7] * 20
    with pytest.warns(UserWarning, match=r"saved for another dataset, length_fn or key"):
        compute_lengths(data, ids_length, cache=cache, key="v2", progress=False)
    data.calls = 0
    compute_lengths(data, ids_length, cache=cache, key="v2", progress=False)
    assert data.calls <= 10  # the longest, the shortest and 8 drawn measured again
    np.save(cache, np.array([4, 1, 8] * 20))
    with pytest.warns(UserWarning, match=r"checksum does not match"):
        assert (
            compute_lengths(data, ids_length, cache=cache, key="v2", progress=False).tolist()
            == [4, 1, 7] * 20
        )
    cache.write_bytes(b"not an npy file")
    with pytest.warns(UserWarning, match=r"cannot be read"):
        compute_lengths(data, ids_length, cache=cache, key="v2", progress=False)
    bigger = Counting([4, 1, 7] * 20 + [2])
    with pytest.warns(UserWarning, match=r"another dataset"):
        assert compute_lengths(bigger, ids_length, cache=cache, key="v2", progress=False).size == 61


def test_compute_lengths_cache_measures_samples_again(tmp_path: Path) -> None:
    """A dataset class built with other settings (max_len=16, then 64) under one key got
    the lengths cached for the first, and every budget over it was exceeded."""
    cache = tmp_path / "lengths.npy"
    compute_lengths(Counting([4, 1, 7] * 20), ids_length, cache=cache, progress=False)
    longer = Counting([4, 1, 9] * 20)  # its longest samples changed, its length did not
    with pytest.warns(UserWarning, match=r"sample 2 has 9 tokens now, 7 there"):
        got = compute_lengths(longer, ids_length, cache=cache, progress=False)
    assert got.tolist() == [4, 1, 9] * 20 and longer.calls == 69


@dataclass
class _Both:
    a: list[int]
    b: list[int]


def test_compute_lengths_cache_tells_two_lambdas_apart(tmp_path: Path) -> None:
    data = [{"a": [1], "b": [1, 2, 3]}, {"a": [1, 2], "b": []}]
    cache = tmp_path / "lengths.npy"
    assert compute_lengths(data, lambda s: len(s["a"]), cache=cache, progress=False).tolist() == [
        1,
        2,
    ]
    with pytest.warns(UserWarning, match=r"saved for another dataset, length_fn or key"):
        got = compute_lengths(data, lambda s: len(s["b"]), cache=cache, progress=False)
    assert got.tolist() == [3, 0]
    # Attribute reads differ in their names only (co_names), not in the bytecode.
    objects = [_Both(**d) for d in data]
    assert compute_lengths(objects, lambda s: len(s.a), cache=cache, progress=False).tolist() == [
        1,
        2,
    ]
    with pytest.warns(UserWarning, match=r"saved for another dataset, length_fn or key"):
        got = compute_lengths(objects, lambda s: len(s.b), cache=cache, progress=False)
    assert got.tolist() == [3, 0]


def _column_length(sample: dict[str, list[int]], column: str) -> int:
    return len(sample[column])


def test_compute_lengths_cache_tells_two_partials_apart(tmp_path: Path) -> None:
    data = [{"a": [1], "b": [1, 2, 3]}, {"a": [1, 2], "b": []}]
    cache = tmp_path / "lengths.npy"
    a = functools.partial(_column_length, column="a")
    assert compute_lengths(data, a, cache=cache, progress=False).tolist() == [1, 2]
    with pytest.warns(UserWarning, match=r"saved for another dataset, length_fn or key"):
        got = compute_lengths(data, functools.partial(_column_length, column="b"), cache=cache)
    assert got.tolist() == [3, 0]


def test_compute_lengths_cache_tells_two_subsets_apart(tmp_path: Path) -> None:
    # Two splits of one size (another seed or val_fraction) shared a key: type and length.
    data = [[0] * n for n in range(8)]
    cache = tmp_path / "lengths.npy"
    first = torch.utils.data.Subset(data, [1, 2, 3])
    assert compute_lengths(first, cache=cache, progress=False).tolist() == [1, 2, 3]
    with pytest.warns(UserWarning, match=r"saved for another dataset, length_fn or key"):
        got = compute_lengths(torch.utils.data.Subset(data, [5, 6, 7]), cache=cache)
    assert got.tolist() == [5, 6, 7]


def test_compute_lengths_cache_tells_concat_datasets_and_closed_over_dicts_apart(
    tmp_path: Path,
) -> None:
    """Measured before: reordered parts of a ConcatDataset, or a dict a lambda reads changed,
    returned the cached lengths without a word (and a token budget was exceeded)."""
    from torch.utils.data import ConcatDataset

    short, long = [[0] * n for n in (1, 2, 3)], [[0] * n for n in (40, 50)]
    cache = tmp_path / "lengths.npy"
    assert compute_lengths(ConcatDataset([short, long]), cache=cache, progress=False)[0] == 1
    with pytest.warns(UserWarning, match=r"saved for another dataset, length_fn or key"):
        got = compute_lengths(ConcatDataset([long, short]), cache=cache, progress=False)
    assert got.tolist() == [40, 50, 1, 2, 3]
    cfg = {"field": "a"}
    data = [{"a": [1], "b": [1, 2, 3]}, {"a": [1, 2], "b": []}]
    by_field = lambda s: len(s[cfg["field"]])  # noqa: E731
    assert compute_lengths(data, by_field, cache=cache, progress=False).tolist() == [1, 2]
    cfg["field"] = "b"
    with pytest.warns(UserWarning, match=r"saved for another dataset, length_fn or key"):
        assert compute_lengths(data, by_field, cache=cache, progress=False).tolist() == [3, 0]
    cap = {"a": 100, "b": 1}  # read by a key known at run time: all of it is the key
    capped = lambda s: min(len(s["b"]), cap[s["kind"]])  # noqa: E731
    kinds = [{"b": [1, 2, 3], "kind": "a"}, {"b": [1, 2], "kind": "b"}]
    assert compute_lengths(kinds, capped, cache=cache, progress=False).tolist() == [3, 1]
    cap["b"] = 2
    with pytest.warns(UserWarning, match=r"saved for another dataset, length_fn or key"):
        assert compute_lengths(kinds, capped, cache=cache, progress=False).tolist() == [3, 2]


def test_compute_lengths_does_not_cache_under_a_length_fn_it_cannot_key(tmp_path: Path) -> None:
    # A partial of a lambda cannot be pickled: its arguments were left out of the key.
    data = [{"a": [1], "b": [1, 2, 3]}, {"a": [1, 2], "b": []}]
    cache = tmp_path / "lengths.npy"
    for scale in (1, 3):
        fn = functools.partial(lambda s, scale: scale * len(s["a"]), scale=scale)
        with pytest.warns(UserWarning, match=r"cannot be pickled.*computing without"):
            got = compute_lengths(data, fn, cache=cache, progress=False)
        assert got.tolist() == [scale, 2 * scale]
    assert not cache.exists()
    # A numpy scalar a function reads is part of its code's key, as a Python number is.
    for scale in (np.int64(1), np.int64(3)):

        def scaled(s: Any, scale: Any = scale) -> int:
            return int(scale) * len(s["a"])

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert compute_lengths(data, scaled, cache=cache, progress=False)[0] == scale


def test_compute_lengths_errors() -> None:
    data = Counting([2, 3])
    with pytest.raises(
        TypeError, match=r"samples are dicts, whose len\(\) is not a token count; pass length_fn"
    ):
        compute_lengths(data, progress=False)
    with pytest.raises(TypeError, match=r"length_fn returned 2.0 \(float\) for sample 0"):
        compute_lengths(data, lambda s: float(len(s["input_ids"])), progress=False)
    with pytest.raises(ValueError, match=r"length_fn returned -1 for sample 0"):
        compute_lengths(data, lambda s: -1, progress=False)
    with pytest.raises(ValueError, match=r"cache must be a .npy path, got 'lengths.txt'"):
        compute_lengths(data, ids_length, cache="lengths.txt", progress=False)
    with pytest.raises(TypeError, match=r"dataset must be map-style"):
        compute_lengths(iter([1, 2]), progress=False)
    with pytest.raises(TypeError, match=r"length_fn must be callable, got 3"):
        compute_lengths(data, 3, progress=False)  # type: ignore[arg-type]

    class Columns(Counting):
        def __getitems__(self, indices: list[int]) -> dict[str, Any]:
            return {"input_ids": [self[i]["input_ids"] for i in indices]}

    with pytest.raises(TypeError, match=r"Columns.__getitems__ returned dict for 3 indices"):
        compute_lengths(Columns([1, 2, 3]), ids_length, progress=False)


def test_a_collate_padding_to_max_length_under_a_budget_is_refused() -> None:
    """The guide's oversize='truncate' recipe padded every batch to max_length, so a batch
    of 3 rows held 48 tokens under max_tokens=16; pad_to_max_length=False cuts only."""
    lengths = [3, 5, 4, 6, 2, 7, 3, 40]
    data = [{"input_ids": torch.arange(n)} for n in lengths]
    sampler = BucketBatchSampler(lengths, max_tokens=16, oversize="truncate", seed=0)
    padded = PadCollate(max_length=16, truncate=True, pad_keys=["input_ids"])
    with pytest.raises(ValueError, match=r"pads every batch to max_length=16.*pad_to_max_leng"):
        ResumableDataLoader(data, batch_sampler=sampler, collate_fn=padded)
    cut = PadCollate(max_length=16, truncate=True, pad_to_max_length=False, pad_keys=["input_ids"])
    batches = list(ResumableDataLoader(data, batch_sampler=sampler, collate_fn=cut))
    assert max(b["input_ids"].numel() for b in batches) == 16  # the 40 cut, batched alone
    assert sorted(n for b in batches for n in b["lengths"].tolist()) == sorted(
        min(n, 16) for n in lengths
    )
    # Cut at the model's 512 above the budget's 16: the 40 was batched whole, 40 > 16.
    wide = PadCollate(max_length=512, truncate=True, pad_to_max_length=False)
    with pytest.raises(
        ValueError, match=r"cut to max_length=16, but collate_fn cuts them at max_length=512"
    ):
        ResumableDataLoader(data, batch_sampler=sampler, collate_fn=wide)


def test_a_collate_rounding_past_the_budgets_is_refused() -> None:
    # Counted unrounded, padded to 8: 204 of the guide's batches went over max_tokens.
    lengths = [5, 9, 13, 3]
    sampler = BucketBatchSampler(lengths, max_tokens=16, seed=0)
    with pytest.raises(ValueError, match=r"pads to a multiple of 8.*pad_to_multiple_of=8"):
        ResumableDataLoader(
            lengths, batch_sampler=sampler, collate_fn=PadCollate(pad_to_multiple_of=8)
        )
    coarser = BucketBatchSampler(lengths, max_tokens=16, pad_to_multiple_of=16, seed=0)
    ResumableDataLoader(lengths, batch_sampler=coarser, collate_fn=PadCollate(pad_to_multiple_of=8))


class _Noisy(Dataset[torch.Tensor]):
    """Samples that draw from torch's global generator: their length too where ``crop``."""

    def __init__(self, crop: bool) -> None:
        self.crop = crop

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> torch.Tensor:
        noise = torch.rand(int(torch.randint(1, 40, ())) if self.crop else 1 + index % 5)
        return noise + index


def test_compute_lengths_leaves_the_callers_generators_as_they_were(tmp_path: Path) -> None:
    cache = tmp_path / "lengths.npy"
    draws = []
    for _ in range(3):  # uncached, cached, cached
        torch.manual_seed(0)
        assert compute_lengths(_Noisy(False), cache=cache, progress=False).tolist()[:3] == [1, 2, 3]
        draws.append(torch.rand(()).item())
    torch.manual_seed(0)
    assert draws == [torch.rand(()).item()] * 3


def test_compute_lengths_refuses_a_length_that_follows_random_draws() -> None:
    with pytest.raises(ValueError, match=r"sample \d+ is \d+ then \d+ long under other random"):
        compute_lengths(_Noisy(True), progress=False)


def test_lengths_given_as_a_pandas_series_are_taken() -> None:
    # Refused as "got Series; compute them with compute_lengths", which the user had done.
    pd = pytest.importorskip("pandas")
    given = [3, 5, 2, 7, 4, 4]
    series = BucketBatchSampler(pd.Series(given), max_tokens=8, seed=0, rank=0, world_size=1)
    listed = BucketBatchSampler(given, max_tokens=8, seed=0, rank=0, world_size=1)
    assert list(series) == list(listed)
