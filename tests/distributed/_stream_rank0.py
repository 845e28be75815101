"""Two gloo ranks stream in a plain loop; only rank 0 calls ``state_dict()`` and saves it.

``run(rank, world, port, OUT)``: a scenario of ``_gloo_loops.py``
(``test_gloo_loops.py``). For
``num_workers`` 0 and 2, each rank iterates two epochs of a
``StreamingShardedDataset`` with no collective in the loop; rank 0 saves the
loader's state after steps :data:`SAVE_AT` (``torch.save``), rank 1 never
calls ``state_dict()`` and pauses after its second batch, so rank 0's save at
step 3 waits for it. Then every rank resumes a fresh loader from each state
rank 0 saved (:data:`RESUME_AT`). Each rank writes ``OUT/rank<r>.json``: per ``num_workers``, the
uninterrupted batches, the batches resumed from each save, and how long
rank 0's ``state_dict()`` calls took.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from loaderkit import IterableReader, ResumableDataLoader, StreamingShardedDataset
from tests.support.helpers import mark_phase

SIZES = (13, 0, 21, 6, 17, 9, 30, 4)
BATCH, STEPS, SEED = 3, 4, 11
SAVE_AT = (1, 3, 4, 6)  # inside epoch 0, at its end, inside epoch 1
# Each worker start under a process group is a fresh forkserver child (slow on a
# loaded machine): with workers, resume from the save inside epoch 1 only.
RESUME_AT = {0: SAVE_AT, 2: (6,)}
TOTAL = 2 * STEPS


def read_shard(shard: tuple[int, int]) -> Iterator[int]:
    start, n = shard
    yield from range(start, start + n)


def dataset() -> StreamingShardedDataset:
    # Workers (forkserver under a process group) unpickle the reader by module
    # name, which __main__ is not.
    from tests.distributed._stream_rank0 import read_shard as importable

    starts = itertools.accumulate([0, *SIZES[:-1]])
    shards = [(s, n) for s, n in zip(starts, SIZES, strict=True)]
    return StreamingShardedDataset(shards, IterableReader(importable), steps_per_epoch=STEPS)


def make_loader(num_workers: int) -> ResumableDataLoader:
    return ResumableDataLoader(dataset(), batch_size=BATCH, seed=SEED, num_workers=num_workers)


def batches(loader: ResumableDataLoader) -> Iterator[list[int]]:
    """The loader's batches over epochs, starting the next epoch whenever one ends."""
    while True:
        yield from ([int(i) for i in b] for b in loader)


def run(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    mark_phase(f"rank {rank}: init_process_group")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict[str, Any] = {}
    for nw in (0, 2):
        mark_phase(f"rank {rank}: num_workers={nw}, uninterrupted run")
        loader = make_loader(nw)
        full: list[list[int]] = []
        waits: dict[int, float] = {}
        for step, batch in enumerate(batches(loader), 1):
            full.append(batch)
            if rank == 0 and step in SAVE_AT:
                mark_phase(f"rank 0: num_workers={nw}, state_dict() after step {step}")
                started = time.perf_counter()
                state = loader.state_dict()
                waits[step] = time.perf_counter() - started
                torch.save(state, Path(out, f"nw{nw}-step{step}.pt"))
            if rank == 1 and step == 2:
                time.sleep(1.0)  # rank 0's save after step 3 waits for this rank's step 3
            if step == TOTAL:
                break
        del loader
        mark_phase(f"rank {rank}: num_workers={nw}, barrier before the resumes")
        dist.barrier()  # rank 0's files are written before anyone reads them
        resumed: dict[str, list[list[int]]] = {}
        for k in RESUME_AT[nw]:
            mark_phase(f"rank {rank}: num_workers={nw}, resumed from step {k}")
            loader = make_loader(nw)
            loader.load_state_dict(torch.load(Path(out, f"nw{nw}-step{k}.pt")))
            resumed[str(k)] = list(itertools.islice(batches(loader), TOTAL - k))
            del loader
        results[str(nw)] = {"full": full, "resumed": resumed, "state_dict_s": waits}
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    mark_phase(f"rank {rank}: done")
    dist.barrier()
    dist.destroy_process_group()
