"""Training from s3:// under 2-process Lightning DDP (gloo, CPU), 2 workers per rank.

moto's S3 server on localhost; ``tests/support/s3_job.py`` with ``--devices 2``.
Each rank's workers are started by forkserver (loaderkit's choice under a
process group), so the dataset, its cache settings and the schedule the loader
starts travel to them pickled. Checked: both ranks step the same count, every
sample is trained on exactly once per epoch over the two ranks, each rank's
batches are its part of the plan, and every batch was predicted from the plan
(its shards fetched ahead), in both epochs (persistent workers follow the
plan into the second).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from loaderkit import TokenReader, write_shards
from loaderkit.data.sharded import ShardedDataset
from tests.lightning.test_remote_s3 import run
from tests.support.helpers import log_tail, read_records
from tests.support.s3 import LocalS3

pytest.importorskip("s3fs")
pytest.importorskip("moto")
pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SIZES = (12, 7, 16, 9, 12, 8)  # 64 samples: 8 global steps of 2 x 4 per epoch


def test_ddp_training_from_s3_reads_every_sample_once(tmp_path: Path) -> None:
    with LocalS3(log=tmp_path / "moto.log") as server:
        arrays, first = [], 0
        for n in SIZES:
            arrays.append(np.repeat(np.arange(first, first + n), 4).astype(np.uint16))
            first += n
        url = f"s3://{server.bucket}/ddp"
        write_shards(url, arrays, TokenReader(seq_len=4), storage_options=server.options)
        out = tmp_path / "out"
        rc = run(server, url, out, "--devices", "2")
        assert rc == 0, log_tail(out.with_suffix(".log"))
        local = ShardedDataset(
            write_shards(tmp_path / "local", arrays, TokenReader(seq_len=4)), TokenReader(seq_len=4)
        )
    records = [read_records(out / f"records-rank{r}.jsonl") for r in range(2)]
    assert len(records[0]) == len(records[1]) == 16
    plan = local.plan(4, seed=7, window=8, mix_shards=2)
    for epoch in range(2):
        union = Counter(
            i for rank in records for r in rank if r["epoch"] == epoch for i in r["ids"]
        )
        assert sorted(union) == list(range(64)) and set(union.values()) == {1}, epoch
        for rank in range(2):
            sched = plan.schedule(epoch, start=0, rank=rank, world_size=2)
            want = [sched.indices(s).tolist() for s in range(sched.num_steps)]
            assert [r["ids"] for r in records[rank] if r["epoch"] == epoch] == want
    for rank in range(2):
        info = json.loads((out / f"describe-rank{rank}.json").read_text())["remote"]
        # The workers' counts reach the rank's process (shared memory across forkserver).
        assert info["hits"] + info["waited"] > 0, (rank, info)
        assert info["unplanned"] == 0 and info["retries"] == 0, (rank, info)
