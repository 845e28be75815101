"""Sharded data under real Lightning DDP: 2 CPU processes over gloo, 2 workers each.

``lightning.Trainer(strategy="ddp", accelerator="cpu", devices=2)`` runs in a
subprocess (``_train_shards.py``) with a time limit, so a hang fails the test
instead of blocking CI. The data: 7 uneven ``.npy`` token shards (one of them
empty) written with ``write_shards``, every token of global sample ``i`` being
``i``, so each rank's records say which samples it trained on.

133 samples, batch size 8 per rank, 2 ranks: 8 full global steps and a tail of
5, dealt as 3 + 3 with one sample repeated (the documented padding of
``drop_last=False``): 9 steps per rank per epoch, 2 epochs.

The example script (``examples/train_shards_ddp.py``) is run here too.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import TokenReader, write_shards
from loaderkit.data.sharded import ShardedDataset
from tests.support.helpers import REPO_ROOT, by_epoch, log_tail, read_records, run_script

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parent / "_train_shards.py"
EXAMPLE = REPO_ROOT / "examples" / "train_shards_ddp.py"
SIZES = (23, 7, 41, 0, 18, 11, 33)  # 133 samples
SEQ, BATCH, WORLD, WINDOW, SEED, EPOCHS = 4, 8, 2, 16, 0, 2
STEPS_PER_EPOCH = 9


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ddp-shards")
    arrays, first = [], 0
    for n in SIZES:
        arrays.append(np.repeat(np.arange(first, first + n), SEQ).astype(np.uint16))
        first += n
    write_shards(root / "data", arrays, TokenReader(seq_len=SEQ))
    out = root / "out"
    args = ["--data", str(root / "data"), "--out", str(out), "--devices", str(WORLD),
            "--num-workers", "2", "--batch-size", str(BATCH), "--epochs", str(EPOCHS),
            "--window", str(WINDOW), "--seed", str(SEED)]  # fmt: skip
    out.mkdir(parents=True)
    log = out / "run.log"
    rc = run_script(SCRIPT, args, log, phase="DDP fit over shards")
    assert rc == 0, f"exit status {rc}; log:\n{log_tail(log)}"
    records = [read_records(out / f"records-rank{r}.jsonl") for r in range(WORLD)]
    return {"data": root / "data", "records": records}


def test_both_ranks_step_the_same_count(run: dict[str, Any]) -> None:
    r0, r1 = run["records"]
    assert len(r0) == len(r1) == EPOCHS * STEPS_PER_EPOCH
    assert [(r["epoch"], r["step"]) for r in r0] == [(r["epoch"], r["step"]) for r in r1]


def test_union_over_ranks_is_each_sample_once_plus_the_documented_padding(
    run: dict[str, Any],
) -> None:
    ds = ShardedDataset(run["data"], TokenReader(seq_len=SEQ))
    assert ds.sizes == SIZES
    plan = ds.plan(BATCH, seed=SEED, window=WINDOW)
    n = plan.num_samples
    per_rank = [by_epoch(records) for records in run["records"]]
    for epoch in range(EPOCHS):
        union = Counter(per_rank[0][epoch] + per_rank[1][epoch])
        assert set(union) == set(range(n)), f"epoch {epoch}: lost {set(range(n)) - set(union)}"
        repeats = union - Counter(range(n))
        first = int(plan.order(epoch)[0])
        assert repeats == Counter([first]), f"epoch {epoch}: repeats {repeats}"
        # Each rank trained on exactly its planned batches, in order.
        for rank in range(WORLD):
            sched = plan.schedule(epoch, start=0, rank=rank, world_size=WORLD)
            want = [sched.indices(s).tolist() for s in range(sched.num_steps)]
            got = [r["ids"] for r in run["records"][rank] if r["epoch"] == epoch]
            assert got == want, f"rank {rank} epoch {epoch} differs from the plan"
    assert per_rank[0][0] != per_rank[0][1], "epoch 1 must be reshuffled"


def test_the_example_trains_on_shards_with_two_processes(tmp_path: Path) -> None:
    log = tmp_path / "example.log"
    rc = run_script(EXAMPLE, [], log, phase="DDP shards example")
    text = log.read_text()
    assert rc == 0, f"exit status {rc}; log:\n{log_tail(log)}"
    assert "every sample exactly once" in text, log_tail(log)
