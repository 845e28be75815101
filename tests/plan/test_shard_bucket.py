"""Token budgets over shards: ``ShardBucketPlan`` and ``ShardedDataset.bucket_batch_sampler``.

Exactly once, the budget, the dealing and elastic resume are checked with the
other bucket plans in ``test_bucket.py`` (its hypothesis configurations draw
shard layouts too). Here, what is particular to shards:

- the order is the shard plan's (``mix_shards`` lanes), each batch lies inside
  one length-sorted window of it, and the epoch goes through the windows in
  order (so a process reads a bounded range of each lane at a time);
- batches draw from many shards: measured on a realistic layout against
  ``mix_shards=1``;
- the resume oracle through ``ResumableDataLoader`` over document shards
  (``PadCollate``, 0 and 2 workers), and a state refused under other settings.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loaderkit import (
    BucketBatchSampler,
    PadCollate,
    ResumableDataLoader,
    ShardBucketPlan,
    ShardedDataset,
    StateMismatchError,
    TokenReader,
    write_shards,
)


@settings(max_examples=150, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 500), max_size=15),
    n=st.integers(1, 500),
    mix=st.integers(1, 9),
    window=st.integers(1, 300),
    budget=st.integers(64, 2048),
    seed=st.integers(0, 2**31),
    skip=st.booleans(),
    epoch=st.integers(0, 2),
)
def test_batches_lie_in_one_sorted_window_of_the_shard_order_visited_in_order(
    cuts: list[int],
    n: int,
    mix: int,
    window: int,
    budget: int,
    seed: int,
    skip: bool,
    epoch: int,
) -> None:
    sizes = tuple(np.diff([0, *sorted(c % (n + 1) for c in cuts), n]).tolist())
    lengths = np.random.default_rng(seed).integers(1, min(300, budget) + 1, n)
    if skip:
        lengths[1::7] = budget + 1  # oversize, left out of the order
    plan = ShardBucketPlan(
        lengths, shard_sizes=sizes, max_tokens=budget, mix_shards=mix, window=window, seed=seed,
        oversize="skip" if skip else "error",
    )  # fmt: skip
    order = plan.shards.order(epoch).numpy()
    kept = order[lengths[order] <= budget]
    where = {int(i): p for p, i in enumerate(kept)}
    windows = []
    for batch in plan.batches(epoch):
        homes = {where[int(i)] // plan.window for i in batch}
        assert len(homes) == 1, f"batch {batch.tolist()} crosses windows {homes}"
        windows.append(homes.pop())
    assert windows == sorted(windows), "the epoch must go through the windows in order"
    assert Counter(int(i) for b in plan.batches(epoch) for i in b) == Counter(kept.tolist())


def lognormal_lengths(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(5.5, 1.0, n), 16, 2048).astype(np.int64)


def uneven(num_shards: int, mean: int) -> tuple[int, ...]:
    return tuple(int(mean * f) for f in np.linspace(0.75, 1.25, num_shards))


def test_token_budget_batches_draw_from_many_shards() -> None:
    """16 uneven shards of lognormal documents, 16,384-token budget (~40 rows a batch): a
    length-sorted window (10,752 samples) spans about 5 shards of the order, so even one
    shard at a time draws ~5.2 shards a batch (7% of batches from one); the default 8 lanes
    draw ~9.6 (none from one), near a global shuffle's ~12, with the same padding."""
    sizes = uneven(16, 2_000)
    lengths = lognormal_lengths(sum(sizes), 0)
    budget = {"max_tokens": 16_384, "pad_to_multiple_of": 8, "seed": 0}
    mixed = ShardBucketPlan(lengths, shard_sizes=sizes, **budget)
    local = ShardBucketPlan(lengths, shard_sizes=sizes, mix_shards=1, **budget)
    spread = BucketBatchSampler(lengths, **budget).plan
    assert mixed.window == local.window == spread.window == 10_752
    ends = np.cumsum(sizes)
    for epoch in (0, 1):
        mix, one = mixed.batch_mix(epoch), local.batch_mix(epoch)
        assert mix.batches == mixed.epoch_length(epoch)
        assert mix.mean > 9.0 and mix.single == 0.0, mix
        assert 4.5 < one.mean < 6.0 and one.single > 0.05, one
        everywhere = [
            np.unique(np.searchsorted(ends, b.numpy(), side="right")).size
            for b in spread.batches(epoch)
        ]
        assert mix.mean < np.mean(everywhere) < mix.mean + 4
        padding = [
            1 - real / total for real, total in (p.token_counts(epoch) for p in (mixed, spread))
        ]
        assert padding[0] < 0.02 and padding[0] == pytest.approx(padding[1], abs=0.005)
    with_ranks = mixed.batch_mix(0, world_size=3)
    assert with_ranks.batches == -(-mixed.epoch_length(0) // 3) * 3  # the repeats counted


def test_sampler_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"shard_sizes hold 5 samples in all but there are 6"):
        BucketBatchSampler([1] * 6, batch_size=2, shard_sizes=(2, 3))
    with pytest.raises(ValueError, match=r"mix_shards=4 applies to shards only; pass shard_sizes="):
        BucketBatchSampler([1] * 6, batch_size=2, mix_shards=4)
    with pytest.raises(ValueError, match=r"shard_window=3 applies to shards only"):
        BucketBatchSampler([1] * 6, batch_size=2, shard_window=3)
    with pytest.raises(ValueError, match=r"ShardPlan: mix_shards must be >= 1, got 0"):
        BucketBatchSampler([1] * 6, batch_size=2, shard_sizes=(6,), mix_shards=0)
    with pytest.raises(ValueError, match=r"BucketBatchSampler: shard_window must be >= 1, got 0"):
        BucketBatchSampler([1] * 6, batch_size=2, shard_sizes=(6,), shard_window=0)


# ------------------------------------------------------------------------ through the loader
@pytest.fixture
def documents(tmp_path: Path) -> ShardedDataset:
    """9 shards of 6-40 documents; document i's tokens are i + 1 (the id, recoverable),
    its length 1-12 plus the end token 0."""
    rng = np.random.default_rng(4)
    shards, first = [], 0
    for count in rng.integers(6, 41, 9):
        docs = [[first + i + 1] * int(rng.integers(1, 13)) + [0] for i in range(count)]
        shards.append(np.concatenate(docs))
        first += int(count)
    reader = TokenReader(eos=0, dtype=np.int32)
    return ShardedDataset(write_shards(tmp_path, shards, reader), reader)


def doc_ids(batch: Any) -> list[int]:
    return [int(row[0]) - 1 for row in batch.values]


def loader(ds: ShardedDataset, num_workers: int = 0, **kwargs: Any) -> ResumableDataLoader:
    args = {"max_tokens": 48, "mix_shards": 4, "seed": 2, "window": 40, **kwargs}
    return ResumableDataLoader(
        ds,
        batch_sampler=ds.bucket_batch_sampler(**args),
        collate_fn=PadCollate(),
        num_workers=num_workers,
    )


@pytest.mark.parametrize(("nw_before", "nw_after"), [(0, 0), (2, 2), (0, 2)])
def test_resume_oracle_over_two_epochs(
    documents: ShardedDataset, nw_before: int, nw_after: int
) -> None:
    """The first k batches plus the run resumed at k equal the uninterrupted run, k in epoch 0
    and epoch 1 (epochs of different lengths); every document once per epoch."""
    n = len(documents)
    assert documents.lengths().tolist()[:3] == [len(documents[i]) for i in range(3)]
    full_run = loader(documents, nw_before)
    epochs = [[doc_ids(b) for b in full_run] for _ in range(2)]
    for ids in epochs:
        assert sorted(i for b in ids for i in b) == list(range(n))
    full = epochs[0] + epochs[1]
    assert len(epochs[0]) != len(epochs[1]) or epochs[0] != epochs[1]
    for k in (5, len(epochs[0]) + 3):
        run, before = loader(documents, nw_before), []
        for _ in range(2):
            for batch in run:
                before.append(doc_ids(batch))
                if len(before) == k:
                    break
            if len(before) == k:
                break
        state = run.state_dict()
        assert state["plan"]["kind"] == "shard-bucket" and state["plan"]["mix_shards"] == 4
        resumed = loader(documents, nw_after)
        resumed.load_state_dict(state)
        after = [doc_ids(b) for _ in range(2 - state["epoch"]) for b in resumed]
        assert before + after == full, f"resume at {k} is not exact"


def test_a_state_is_refused_under_other_shard_settings(documents: ShardedDataset) -> None:
    run = loader(documents)
    next(iter(run))
    state = run.state_dict()
    for change, field in (
        ({"mix_shards": 2}, "mix_shards"),
        ({"shard_window": 5}, "shard_window"),
        ({"window": 41}, "window"),
    ):
        with pytest.raises(StateMismatchError, match=rf"field '{field}' differs"):
            loader(documents, **change).load_state_dict(state)
    global_plan = ResumableDataLoader(
        documents,
        batch_sampler=BucketBatchSampler(documents.lengths(), max_tokens=48, seed=2, window=40),
        collate_fn=PadCollate(),
    )
    with pytest.raises(StateMismatchError, match=r"different kind of plan"):
        global_plan.load_state_dict(state)


def test_lengths_of_fixed_length_and_user_samples(tmp_path: Path) -> None:
    fixed = TokenReader(seq_len=4, targets=True)
    ds = ShardedDataset(write_shards(tmp_path / "f", [np.arange(21), np.arange(9)], fixed), fixed)
    assert ds.lengths().tolist() == [5] * 7  # 5 + 2 samples of 4 tokens plus a target
    assert ds.lengths(lambda s: int(s[0] % 3)).tolist() == [int(ds[i][0] % 3) for i in range(7)]
    from loaderkit import JsonlReader

    docs = [[{"ids": [1] * (i % 4 + 1)} for i in range(5)]]
    js = ShardedDataset(write_shards(tmp_path / "j", docs, JsonlReader()), JsonlReader())
    with pytest.raises(TypeError, match=r"pass length_fn, e.g. length_fn=lambda s"):
        js.lengths()
    assert js.lengths(lambda s: len(s["ids"])).tolist() == [1, 2, 3, 4, 1]
    sampler = js.bucket_batch_sampler(lengths=js.lengths(lambda s: len(s["ids"])), batch_size=2)
    assert sorted(i for b in sampler for i in b) == list(range(5))
    assert torch.is_tensor(ds.get_batch(np.arange(7)))
