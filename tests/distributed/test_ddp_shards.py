"""The example ``examples/train_shards_ddp.py`` trains on sharded data with 2 DDP processes.

Run as a user runs it, in its own launch; the same shards under the test
suite's own DDP fits are checked in ``test_trainer_ddp.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import REPO_ROOT, log_tail, run_script

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

EXAMPLE = REPO_ROOT / "examples" / "train_shards_ddp.py"


def test_the_example_trains_on_shards_with_two_processes(tmp_path: Path) -> None:
    log = tmp_path / "example.log"
    rc = run_script(EXAMPLE, [], log, phase="DDP shards example")
    text = log.read_text()
    assert rc == 0, f"exit status {rc}; log:\n{log_tail(log)}"
    assert "every sample exactly once" in text, log_tail(log)
