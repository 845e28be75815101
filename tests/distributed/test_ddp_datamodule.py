"""ShardedDataModule and MixedDataModule under real Lightning DDP: 2 CPU processes over gloo, 2
workers each.

Both fits run in one launch (``tests/support/jobs.py``): the ranks start once."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from loaderkit import MixedDataset, ShardedDataset, TokenReader, write_shards
from tests.support.helpers import by_epoch, read_records
from tests.support.jobs import Jobs, job, run_jobs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.distributed,
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

JOB = "tests.support.datamodule_ddp"
SIZES = (9, 0, 14, 6)  # 29 samples: 3 global steps of 8, tail 5
WEB_IDS, BOOKS_IDS = np.arange(29), np.arange(100, 105)


def token_shards(folder: Path, ids: list[np.ndarray]) -> Path:
    """Shards whose every token of sample ``i`` is ``i``."""
    arrays = [np.repeat(part, 4).astype(np.uint16) for part in ids]
    write_shards(folder, arrays, TokenReader(seq_len=4))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    root = tmp_path_factory.mktemp("ddp-datamodules")
    cuts = np.cumsum((0, *SIZES))
    token_shards(root / "data", [np.arange(a, b) for a, b in itertools.pairwise(cuts)])
    token_shards(root / "web", [WEB_IDS])
    token_shards(root / "books", [BOOKS_IDS])
    jobs = [
        job("sharded", JOB, "--data", root / "data", "--out", root / "sharded"),
        job("mixed", JOB, "--data", root / "web", "--books", root / "books",
            "--out", root / "mixed"),
    ]  # fmt: skip
    return run_jobs(root, jobs, phase="DDP DataModule fits: sharded, mixed")


def test_sharded_datamodule_under_real_ddp(runs: Jobs) -> None:
    """``strategy="ddp"``, 2 CPU ranks (gloo), 2 workers each: both ranks step the same count
    and together train every sample once per epoch (plus the documented tail repeat)."""
    assert runs.rc("sharded") == 0
    r0, r1 = (read_records(runs.out / "sharded" / f"records-rank{r}.jsonl") for r in (0, 1))
    assert len(r0) == len(r1) == 2 * 4  # ceil(29 / 8) steps per epoch on each rank
    for epoch in (0, 1):
        ids = by_epoch(r0)[epoch] + by_epoch(r1)[epoch]
        assert set(ids) == set(range(29)) and len(ids) == 29 + 1  # tail 5 dealt as 3 + 3


def test_mixed_datamodule_under_real_ddp(runs: Jobs) -> None:
    """A 3:1 mix (32 draws an epoch: 24 of 29 web samples, 8 of 5 books) on 2 ranks: both step
    4 times an epoch and together draw exactly the mix plan's multiset each epoch."""
    assert runs.rc("mixed") == 0
    r0, r1 = (read_records(runs.out / "mixed" / f"records-rank{r}.jsonl") for r in (0, 1))
    assert len(r0) == len(r1) == 2 * 4  # 32 draws / (2 ranks x 4) per epoch
    reader = TokenReader(seq_len=4)
    mix = MixedDataset(
        {
            "web": ShardedDataset(str(runs.out / "web"), reader),
            "books": ShardedDataset(str(runs.out / "books"), reader),
        },
        weights={"web": 3, "books": 1},
        epoch_size=32,
    )
    ids = np.concatenate([WEB_IDS, BOOKS_IDS])
    for epoch in (0, 1):
        got = by_epoch(r0)[epoch] + by_epoch(r1)[epoch]
        want = ids[mix.plan(4, seed=0).order(epoch).numpy()].tolist()
        assert Counter(got) == Counter(want) and sum(i >= 100 for i in got) == 8
