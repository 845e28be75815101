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

from tests.support.helpers import assert_resume_exact, log_tail, read_records, run_script

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

SCRIPT = Path(__file__).resolve().parent / "_train_ddp.py"
STEPS = 3


def launch(out: Path, *extra: str) -> list[list[dict[str, object]]]:
    args = [
        "--out", str(out), "--devices", "2", "--num-workers", "2", "--size", "64",
        "--batch-size", "8", "--stream", "--steps-per-epoch", str(STEPS), *extra,
    ]  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    rc = run_script(SCRIPT, args, out / "run.log", phase=f"DDP stream fit {out.name}")
    expected = 3 if "--fail-at" in extra else 0
    assert rc == expected, f"exit status {rc}; log:\n{log_tail(out / 'run.log')}"
    return [read_records(out / f"records-rank{r}.jsonl") for r in range(2)]


def test_ddp_stream_equal_steps_symmetric_state_and_exact_resume(tmp_path: Path) -> None:
    full = launch(tmp_path / "full", "--every", "1")
    assert [len(r) for r in full] == [2 * STEPS, 2 * STEPS], "ranks stepped differently"
    # Every rank wrote its own state_dict() at each step: equal, with both ranks' cursors.
    for step in range(1, 2 * STEPS + 1):
        states = [
            json.loads((tmp_path / "full" / f"loader-state-rank{r}-step{step}.json").read_text())
            for r in range(2)
        ]
        assert states[0] == states[1], f"step {step}: rank states differ"
        assert all(entry is not None for entry in states[0]["ranks"])
    cut = launch(tmp_path / "cut", "--every", "4", "--fail-at", "4")
    resumed = launch(
        tmp_path / "resumed", "--resume", str(tmp_path / "cut" / "ckpt" / "step004.ckpt")
    )
    for rank in range(2):
        assert_resume_exact(full[rank], cut[rank], resumed[rank])
