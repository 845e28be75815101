"""Lightning Fabric drives a ResumableDataLoader exactly: 2 processes over gloo on CPU.

``_fabric_job.py`` is a plain Fabric loop (``fabric.launch(train)``): the
loader is iterated directly and saved with ``fabric.save(path, {"loader":
loader, ...})`` after every step; a run resumes with ``fabric.load``. The
oracle is the one of every resume test: the first k steps plus the resumed
run equal the uninterrupted run, step by step on each rank, over 2 epochs,
for a mid-epoch k with 2 workers. The loader learns the data-parallel
rank and size from the launching Fabric's strategy (``--one-replica``: one
data-parallel rank, so both processes get the same batches).

64 samples, batch 8, 2 ranks: 4 steps an epoch, 8 in all. Two launches: the
uninterrupted, the interrupted and the one-replica loops one after the other
(``tests/support/jobs.py``: the ranks start once), then the resume in fresh
processes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import (
    assert_epochs_exactly_once,
    assert_resume_exact,
    by_epoch,
    read_records,
)
from tests.support.jobs import Jobs, job, run_jobs

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

JOB = "tests.distributed._fabric_job"
SIZE, BATCH, WORLD, EPOCHS = 64, 8, 2, 2
PER_EPOCH = SIZE // (BATCH * WORLD)
CUT_AT, WORKERS = PER_EPOCH + 1, ("--num-workers", 2)


def records(out: Path) -> list[list[dict[str, Any]]]:
    return [read_records(out / f"records-rank{r}.jsonl") for r in range(WORLD)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    out = tmp_path_factory.mktemp("fabric")
    jobs = [
        job("full", JOB, "--out", out / "full"),
        job("cut", JOB, "--out", out / "cut", "--fail-at", CUT_AT, *WORKERS),
        job("one_replica", JOB, "--out", out / "one_replica", "--one-replica"),
    ]
    return run_jobs(out, jobs, phase="Fabric on 2 gloo ranks: full, cut, one replica")


@pytest.fixture(scope="module")
def full(runs: Jobs) -> list[list[dict[str, Any]]]:
    assert runs.rc("full") == 0
    return records(runs.out / "full")


def test_ranks_split_each_epoch_exactly_once(full: list[list[dict[str, Any]]]) -> None:
    assert [len(r) for r in full] == [EPOCHS * PER_EPOCH] * WORLD
    assert_epochs_exactly_once(by_epoch(full[0] + full[1]), SIZE, EPOCHS)


def test_save_and_load_resume_exactly(
    full: list[list[dict[str, Any]]], runs: Jobs, tmp_path: Path
) -> None:
    # Mid-epoch 1 with workers: Fabric's save/load around the loader (the epoch-end and
    # in-process cases of the same loader are covered under Lightning, tests/lightning/).
    assert runs.rc("cut") == 3, "the planned interruption did not happen"
    ckpt = runs.out / "cut" / "ckpt" / f"step{CUT_AT:03d}.ckpt"
    resumed = run_jobs(
        tmp_path,
        [job("resumed", JOB, "--out", tmp_path / "resumed", "--resume", ckpt, *WORKERS)],
        phase="Fabric on 2 gloo ranks: resumed",
    )
    assert resumed.rc("resumed") == 0
    before, after = records(runs.out / "cut"), records(tmp_path / "resumed")
    for rank in range(WORLD):
        assert_resume_exact(full[rank], before[rank], after[rank])


def test_a_one_replica_strategy_gives_both_processes_the_same_batches(runs: Jobs) -> None:
    assert runs.rc("one_replica") == 0
    r0, r1 = records(runs.out / "one_replica")
    assert [(r["epoch"], r["ids"]) for r in r0] == [(r["epoch"], r["ids"]) for r in r1]
    assert len(r0) == EPOCHS * SIZE // BATCH
    assert_epochs_exactly_once(by_epoch(r0), SIZE, EPOCHS)
