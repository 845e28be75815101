"""Lightning Fabric drives a ResumableDataLoader exactly: 2 processes over gloo on CPU.

``_fabric_job.py`` is a plain Fabric loop (``fabric.launch(train)``): the
loader is iterated directly and saved with ``fabric.save(path, {"loader":
loader, ...})`` after every step; a run resumes with ``fabric.load``. The
oracle is the one of every resume test: the first k steps plus the resumed
run equal the uninterrupted run, step by step on each rank, over 2 epochs,
for a mid-epoch k with 2 workers. The loader learns the data-parallel
rank and size from the launching Fabric's strategy (``--one-replica``: one
data-parallel rank, so both processes get the same batches).

64 samples, batch 8, 2 ranks: 4 steps an epoch, 8 in all. Launches take
10-40 s each on a loaded 2-core machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import (
    assert_epochs_exactly_once,
    assert_resume_exact,
    by_epoch,
    log_tail,
    read_records,
    run_script,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parent / "_fabric_job.py"
SIZE, BATCH, WORLD, EPOCHS = 64, 8, 2, 2
PER_EPOCH = SIZE // (BATCH * WORLD)


def launch(out: Path, *extra: str) -> list[list[dict[str, Any]]]:
    """Run the Fabric script; returns each rank's records. Fails on a hang."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "run.log"
    rc = run_script(SCRIPT, ["--out", str(out), *extra], log, phase="Fabric on 2 gloo ranks")
    expected = 3 if "--fail-at" in extra else 0
    assert rc == expected, f"exit status {rc}, expected {expected}; log:\n{log_tail(log)}"
    return [read_records(out / f"records-rank{r}.jsonl") for r in range(WORLD)]


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    return launch(tmp_path_factory.mktemp("fabric-full"))


def test_ranks_split_each_epoch_exactly_once(full: list[list[dict[str, Any]]]) -> None:
    assert [len(r) for r in full] == [EPOCHS * PER_EPOCH] * WORLD
    assert_epochs_exactly_once(by_epoch(full[0] + full[1]), SIZE, EPOCHS)


def test_save_and_load_resume_exactly(full: list[list[dict[str, Any]]], tmp_path: Path) -> None:
    # Mid-epoch 1 with workers: Fabric's save/load around the loader (the epoch-end and
    # in-process cases of the same loader are covered under Lightning, tests/lightning/).
    k, workers = PER_EPOCH + 1, ["--num-workers", "2"]
    before = launch(tmp_path / "cut", "--fail-at", str(k), *workers)
    ckpt = tmp_path / "cut" / "ckpt" / f"step{k:03d}.ckpt"
    after = launch(tmp_path / "resumed", "--resume", str(ckpt), *workers)
    for rank in range(WORLD):
        assert_resume_exact(full[rank], before[rank], after[rank])


def test_a_one_replica_strategy_gives_both_processes_the_same_batches(tmp_path: Path) -> None:
    r0, r1 = launch(tmp_path, "--one-replica")
    assert [(r["epoch"], r["ids"]) for r in r0] == [(r["epoch"], r["ids"]) for r in r1]
    assert len(r0) == EPOCHS * SIZE // BATCH
    assert_epochs_exactly_once(by_epoch(r0), SIZE, EPOCHS)
