"""A loader passed to ``trainer.fit`` under ``ddp_spawn``: pickled into each spawned
process, rebuilt on its rank, it splits the epoch as a loader built there would (it
did not pickle: ``cannot pickle 'weakref.ReferenceType'``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loaderkit import SamplePlan
from tests.distributed._spawn_job import BATCH, EPOCHS, SIZE
from tests.support.helpers import log_tail, run_script

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def test_a_loader_passed_to_a_ddp_spawn_fit_splits_each_epoch_across_the_ranks(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    rc = run_script(Path(__file__).with_name("_spawn_job.py"), [str(tmp_path)], log)
    assert rc == 0, log_tail(log)
    plan = SamplePlan(num_samples=SIZE, batch_size=BATCH, shuffle=True, seed=7)
    for rank in range(2):
        got = json.loads((tmp_path / f"records-rank{rank}.json").read_text())
        want = [
            {"epoch": epoch, "ids": schedule.indices(step).tolist()}
            for epoch in range(EPOCHS)
            for schedule in [plan.schedule(epoch, start=0, rank=rank, world_size=2)]
            for step in range(schedule.num_steps)
        ]
        assert got == want, f"rank {rank}"
