"""Two gloo ranks: a rank-0-only peek at the validation loader between training epochs.

``run(rank, world, port, OUT)``: a scenario of ``_gloo_loops.py``
(``test_gloo_loops.py``). Each
rank writes ``OUT/rank<r>.json``: per step, the ids it iterated or the error it
raised. Rank 0 alone calls ``next(iter(val))`` (with a short rank-check timeout)
while rank 1 goes straight on to the next training epoch, as a script that logs
a validation batch on rank 0 does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist

from loaderkit import ResumableDataLoader
from tests.support.helpers import mark_phase

SIZE, BATCH = 40, 4


def step(name: str, rank: int, results: dict[str, Any], fn: Any) -> None:
    mark_phase(f"rank {rank}: {name}")
    try:
        results[name] = {"ids": fn()}
    except Exception as exc:
        results[name] = {"error": type(exc).__name__, "message": str(exc)}


def ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch]


def run(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    # Rank 1 waits for rank 0's peek to give up; rank 0's peek waits 3 s for rank 1.
    os.environ["LOADERKIT_RANK_CHECK_TIMEOUT"] = "300"
    mark_phase(f"rank {rank}: init_process_group")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict[str, Any] = {}
    data = list(range(SIZE))
    train = ResumableDataLoader(data, batch_size=BATCH, shuffle=True, seed=1)
    val = ResumableDataLoader(data, batch_size=BATCH, seed=1)
    step("train0", rank, results, lambda: ids(train))
    if rank == 0:
        os.environ["LOADERKIT_RANK_CHECK_TIMEOUT"] = "3"
        step("peek", rank, results, lambda: next(iter(val)).tolist())
        os.environ["LOADERKIT_RANK_CHECK_TIMEOUT"] = "300"
    step("train1", rank, results, lambda: ids(train))
    step("val", rank, results, lambda: ids(val))
    step("train2", rank, results, lambda: ids(train))
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
