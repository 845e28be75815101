"""F6: rank and world size come from the data-parallel group, not the global process group.

Two Lightning DDP processes over gloo under a strategy whose
``distributed_sampler_kwargs`` name one data-parallel replica (the way
``ModelParallelStrategy`` groups tensor-parallel peers; that one needs CUDA).
Measured before: the loader split by the global group, so the two peers
trained on different halves of every epoch. Now both train on the same
batches, and each epoch is every sample exactly once. The Fabric side of the
same contract runs in ``test_fabric.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.helpers import (
    assert_epochs_exactly_once,
    by_epoch,
    log_tail,
    read_records,
    run_script,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parent / "_dp_group.py"
SIZE, BATCH, EPOCHS = 32, 4, 2


def test_peers_of_one_data_parallel_rank_train_on_the_same_batches(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    rc = run_script(SCRIPT, [str(tmp_path)], log, phase="2 DDP processes, 1 data-parallel rank")
    assert rc == 0, f"exit status {rc}; log:\n{log_tail(log)}"
    r0, r1 = (read_records(tmp_path / f"records-rank{r}.jsonl") for r in range(2))
    assert len(r0) == len(r1) == EPOCHS * SIZE // BATCH
    steps = [[(r["epoch"], r["step"], r["ids"]) for r in records] for records in (r0, r1)]
    assert steps[0] == steps[1], "the two peers of data-parallel rank 0 got different batches"
    assert_epochs_exactly_once(by_epoch(r0), SIZE, EPOCHS)
