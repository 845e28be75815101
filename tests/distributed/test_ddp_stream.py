"""A StreamingShardedDataset under real Lightning DDP: 2 CPU processes over gloo.

64 ids in 6 uneven shards (one empty) streamed by 2 ranks x 2 persistent
workers, batches of 8, ``steps_per_epoch=3``: both ranks step exactly 3 times
an epoch although their shards hold different numbers of samples (no hang);
the checkpointed state is the same on both ranks and holds both ranks'
cursors (gathered); a run interrupted after step 4 (inside epoch 1) and
resumed on 2 processes continues each rank's stream exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.helpers import assert_resume_exact, read_records
from tests.support.jobs import job, run_jobs

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

JOB = "tests.support.lightning_job"
STEPS = 3


def job_args(out: Path, *extra: object) -> list[object]:
    return ["--out", out, "--devices", 2, "--num-workers", 2, "--size", 64,
            "--batch-size", 8, "--stream", "--steps-per-epoch", STEPS, *extra]  # fmt: skip


def records(out: Path) -> list[list[dict[str, object]]]:
    return [read_records(out / f"records-rank{r}.jsonl") for r in range(2)]


def test_ddp_stream_equal_steps_symmetric_state_and_exact_resume(tmp_path: Path) -> None:
    # The uninterrupted and the interrupted run share a launch; the resume gets fresh processes.
    runs = run_jobs(
        tmp_path,
        [job("full", JOB, *job_args(tmp_path / "full", "--every", 1)),
         job("cut", JOB, *job_args(tmp_path / "cut", "--every", 4, "--fail-at", 4))],
        phase="DDP stream fits: uninterrupted, interrupted",
    )  # fmt: skip
    assert runs.rc("full") == 0
    full = records(tmp_path / "full")
    assert [len(r) for r in full] == [2 * STEPS, 2 * STEPS], "ranks stepped differently"
    # Every rank wrote its own state_dict() at each step: equal, with both ranks' cursors.
    for step in range(1, 2 * STEPS + 1):
        states = [
            json.loads((tmp_path / "full" / f"loader-state-rank{r}-step{step}.json").read_text())
            for r in range(2)
        ]
        assert states[0] == states[1], f"step {step}: rank states differ"
        assert all(entry is not None for entry in states[0]["ranks"])
    assert runs.rc("cut") == 3, "the planned interruption did not happen"
    ckpt = tmp_path / "cut" / "ckpt" / "step004.ckpt"
    resume = job("resumed", JOB, *job_args(tmp_path / "resumed", "--resume", ckpt))
    resumed = run_jobs(tmp_path / "second", [resume], phase="DDP stream fit resumed")
    assert resumed.rc("resumed") == 0
    cut, after = records(tmp_path / "cut"), records(tmp_path / "resumed")
    for rank in range(2):
        assert_resume_exact(full[rank], cut[rank], after[rank])
