"""Rank agreement is counted per loader, under real 2-process gloo.

Measured on 84cc6ec: one process-wide count of comparison rounds paired a
rank-0-only ``next(iter(val_loader))`` with rank 1's next training epoch, so
that epoch failed on both ranks with "the ranks disagree on 'epoch'". Now a
loader's n-th epoch start pairs only with the same loader's n-th on the other
ranks (``loaderkit.plan._agree.Rounds``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import log_tail, run_script

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parent / "_agree_per_loader.py"
SIZE = 40


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("agree_per_loader")
    log = out / "run.log"
    rc = run_script(SCRIPT, [str(out)], log, phase="2 gloo ranks, a rank-0-only peek")
    assert rc == 0, f"exit status {rc}; log:\n{log_tail(log)}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("name", ["train0", "train1", "val", "train2"])
def test_every_epoch_after_a_rank0_peek_runs_on_both_ranks_exactly_once(
    results: list[dict[str, Any]], name: str
) -> None:
    got = [results[rank][name] for rank in range(2)]
    assert all("ids" in g for g in got), got
    assert sorted(got[0]["ids"] + got[1]["ids"]) == list(range(SIZE))


def test_the_peek_alone_waits_for_its_peer_and_says_so(results: list[dict[str, Any]]) -> None:
    # The validation loader on rank 0 alone: its epoch start has no partner on rank 1.
    got = results[0]["peek"]
    assert got.get("error") == "LoaderkitError", got
    assert "waited 3 s for ranks [1] to start it too" in got["message"]
    assert "rank=0, world_size=1" in got["message"]
    assert "peek" not in results[1]
