"""ShardedDataModule and MixedDataModule under real Lightning DDP: 2 CPU processes over gloo, 2
workers each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loaderkit import TokenReader, write_shards
from tests.support.helpers import SUPPORT_DIR, by_epoch, log_tail, read_records, run_script

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning")]


@pytest.mark.slow
@pytest.mark.distributed
def test_sharded_datamodule_under_real_ddp(tmp_path: Path) -> None:
    """``strategy="ddp"``, 2 CPU ranks (gloo), 2 workers each: both ranks step the same count
    and together train every sample once per epoch (plus the documented tail repeat)."""
    sizes, first, arrays = (9, 0, 14, 6), 0, []  # 29 samples: 3 global steps of 8, tail 5
    for n in sizes:
        arrays.append(np.repeat(np.arange(first, first + n), 4).astype(np.uint16))
        first += n
    write_shards(tmp_path / "data", arrays, TokenReader(seq_len=4))
    out = tmp_path / "out"
    args = ["--data", str(tmp_path / "data"), "--out", str(out)]
    rc = run_script(
        SUPPORT_DIR / "datamodule_ddp.py", args, tmp_path / "run.log", phase="DDP DataModule fit"
    )
    assert rc == 0, log_tail(tmp_path / "run.log")
    r0, r1 = (read_records(out / f"records-rank{r}.jsonl") for r in (0, 1))
    assert len(r0) == len(r1) == 2 * 4  # ceil(29 / 8) steps per epoch on each rank
    for epoch in (0, 1):
        ids = by_epoch(r0)[epoch] + by_epoch(r1)[epoch]
        assert set(ids) == set(range(29)) and len(ids) == 29 + 1  # tail 5 dealt as 3 + 3


@pytest.mark.slow
@pytest.mark.distributed
def test_mixed_datamodule_under_real_ddp(tmp_path: Path) -> None:
    """A 3:1 mix (32 draws an epoch: 24 of 29 web samples, 8 of 5 books) on 2 ranks: both step
    4 times an epoch and together draw exactly the mix plan's multiset each epoch."""
    from collections import Counter

    from loaderkit import MixedDataset, ShardedDataset

    web_ids, books_ids = np.arange(29), np.arange(100, 105)
    write_shards(
        tmp_path / "web", [np.repeat(web_ids, 4).astype(np.uint16)], TokenReader(seq_len=4)
    )
    write_shards(
        tmp_path / "books", [np.repeat(books_ids, 4).astype(np.uint16)], TokenReader(seq_len=4)
    )
    out = tmp_path / "out"
    args = ["--data", str(tmp_path / "web"), "--books", str(tmp_path / "books"), "--out", str(out)]
    rc = run_script(
        SUPPORT_DIR / "datamodule_ddp.py", args, tmp_path / "run.log", phase="DDP mix fit"
    )
    assert rc == 0, log_tail(tmp_path / "run.log")
    r0, r1 = (read_records(out / f"records-rank{r}.jsonl") for r in (0, 1))
    assert len(r0) == len(r1) == 2 * 4  # 32 draws / (2 ranks x 4) per epoch
    reader = TokenReader(seq_len=4)
    mix = MixedDataset(
        {
            "web": ShardedDataset(str(tmp_path / "web"), reader),
            "books": ShardedDataset(str(tmp_path / "books"), reader),
        },
        weights={"web": 3, "books": 1},
        epoch_size=32,
    )
    ids = np.concatenate([web_ids, books_ids])
    for epoch in (0, 1):
        got = by_epoch(r0)[epoch] + by_epoch(r1)[epoch]
        want = ids[mix.plan(4, seed=0).order(epoch).numpy()].tolist()
        assert Counter(got) == Counter(want) and sum(i >= 100 for i in got) == 8
