"""Training from s3:// under Lightning, 2 workers, killed with SIGKILL and resumed: exact.

moto's S3 server runs on localhost for the module; the training runs in its
own process (``tests/support/s3_job.py``), which reads the endpoint and dummy
credentials from the environment, checkpoints every step and kills itself
with SIGKILL right after step ``K``'s checkpoint. The resumed process (a fresh
cache directory: nothing carries over but the checkpoint) must continue with
exactly the batches the uninterrupted run trained on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import TokenReader, write_shards
from tests.support.helpers import REPO_ROOT, log_tail, read_records, run_script
from tests.support.s3 import LocalS3

pytest.importorskip("s3fs")
pytest.importorskip("moto")
pytestmark = pytest.mark.slow

SCRIPT = REPO_ROOT / "tests" / "support" / "s3_job.py"
SIZES = (12, 7, 16, 9, 12, 8)  # 64 samples: 16 steps of 4 per epoch
KILL_AT = 21  # in the second epoch


@pytest.fixture(scope="module")
def s3_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalS3, str]]:
    root = tmp_path_factory.mktemp("s3-lightning")
    server = LocalS3(log=root / "moto.log").start()
    arrays, first = [], 0
    for n in SIZES:
        arrays.append(np.repeat(np.arange(first, first + n), 4).astype(np.uint16))
        first += n
    url = f"s3://{server.bucket}/lightning"
    write_shards(url, arrays, TokenReader(seq_len=4), storage_options=server.options)
    yield server, url
    server.stop()


def run(server: LocalS3, url: str, out: Path, *extra: str) -> int:
    saved = dict(os.environ)
    os.environ.update(server.env())  # run_script passes this process's environment on
    try:
        args = ["--url", url, "--out", str(out), "--cache", str(out / "cache"), *extra]
        return run_script(SCRIPT, args, out.with_suffix(".log"), phase="training from s3")
    finally:
        os.environ.clear()
        os.environ.update(saved)


def steps(records: list[dict[str, Any]]) -> list[tuple[int, list[int]]]:
    return [(r["epoch"], r["ids"]) for r in records]


def test_kill_9_while_training_from_s3_resumes_exactly(
    s3_data: tuple[LocalS3, str], tmp_path: Path
) -> None:
    server, url = s3_data
    full, killed, resumed = tmp_path / "full", tmp_path / "killed", tmp_path / "resumed"
    assert run(server, url, full) == 0, log_tail(full.with_suffix(".log"))
    expected = steps(read_records(full / "records-rank0.jsonl"))
    assert len(expected) == 32
    for epoch in (0, 1):
        ids = sorted(i for e, b in expected if e == epoch for i in b)
        assert ids == list(range(64))
    info = json.loads((full / "describe-rank0.json").read_text())["remote"]
    # Each batch was predicted from the plan; the 6 shards were fetched once.
    assert info["unplanned"] == 0 and info["fetched"] == 6 and info["retries"] == 0, info

    rc = run(server, url, killed, "--kill-at", str(KILL_AT))
    assert rc == -9, f"exit status {rc}; log:\n{log_tail(killed.with_suffix('.log'))}"
    before = steps(read_records(killed / "records-rank0.jsonl"))
    assert len(before) == KILL_AT
    ckpt = killed / "ckpt" / f"step{KILL_AT:03d}.ckpt"
    assert run(server, url, resumed, "--resume", str(ckpt)) == 0, log_tail(
        resumed.with_suffix(".log")
    )
    after = steps(read_records(resumed / "records-rank0.jsonl"))
    assert before + after == expected
    info = json.loads((resumed / "describe-rank0.json").read_text())["remote"]
    assert info["unplanned"] == 0, info  # the resumed workers predicted their batches too


def test_the_example_trains_from_s3_and_resumes_exactly(tmp_path: Path) -> None:
    log = tmp_path / "example.log"
    mine = tmp_path / "run" / "notes.txt"  # the user's: --out was deleted whole (hunter 293)
    mine.parent.mkdir()
    mine.write_text("keep")
    args = ["--out", str(tmp_path / "run")]
    rc = run_script(REPO_ROOT / "examples" / "train_from_s3.py", args, log, phase="s3 example")
    text = log.read_text()
    assert rc == 0, log_tail(log)
    assert [p.name for p in mine.parent.iterdir()] == ["notes.txt"]  # its own run folder: gone
    assert "resumed from its checkpoint with a cold cache: exact" in text, log_tail(log)
    assert "unplanned 0" in text, log_tail(log)
