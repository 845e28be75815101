"""Two gloo ranks build loaders that disagree (or agree) and report what each one saw.

``run(rank, world, port, OUT)``: a scenario of ``_gloo_loops.py``
(``test_gloo_loops.py``). Each rank writes
``OUT/rank<r>.json``: per case, the ids it iterated or the error it raised.
Cases run in order on both ranks; the last one has rank 1 skip the epoch on
purpose (with a short timeout), so it must stay last.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from loaderkit import (
    IterableReader,
    PlanBatchSampler,
    ResumableDataLoader,
    SamplePlan,
    StreamingShardedDataset,
)
from tests.support.helpers import mark_phase

SIZE, BATCH = 290, 5


class _ShuffledAfterEpoch0(torch.utils.data.Sampler[int]):
    """In order in epoch 0 (a curriculum), then shuffled by ``(seed, epoch)``."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        if self.epoch == 0:
            return iter(range(self.size))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self) -> int:
        return self.size


def read_shard(shard: tuple[int, int]) -> Any:
    start, n = shard
    yield from range(start, start + n)


def ids(loader: Any) -> list[int]:
    return [int(i) for batch in loader for i in batch]


def case(name: str, rank: int, results: dict[str, Any], fn: Any) -> None:
    mark_phase(f"rank {rank}: case {name}")
    try:
        results[name] = {"ids": fn()}
    except Exception as exc:
        results[name] = {
            "error": type(exc).__name__,
            "message": str(exc),
            "trace": traceback.format_exc(limit=3),
        }
    # Keep the ranks in step between cases (a failed case left no collective pending).
    dist.barrier()


def run(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    mark_phase(f"rank {rank}: init_process_group")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict[str, Any] = {}
    data = list(range(SIZE))
    case("agree", rank, results, lambda: ids(ResumableDataLoader(data, BATCH, True, seed=7)))
    case(
        "seeds",
        rank,
        results,
        lambda: ids(ResumableDataLoader(data, BATCH, True, seed=rank + 1)),
    )
    case(
        "sizes",
        rank,
        results,
        lambda: ids(ResumableDataLoader(list(range(SIZE + 10 * rank)), BATCH, True, seed=7)),
    )
    case(
        "workers_ok",  # num_workers may differ across ranks for map-style data
        rank,
        results,
        lambda: ids(ResumableDataLoader(data, BATCH, True, seed=7, num_workers=rank)),
    )
    case(
        "sampler_seeds",
        rank,
        results,
        lambda: ids(
            torch.utils.data.DataLoader(
                data,
                batch_sampler=PlanBatchSampler(
                    SamplePlan(num_samples=SIZE, batch_size=BATCH, shuffle=True, seed=rank)
                ),
            )
        ),
    )

    def later_epoch_orders() -> list[int]:
        # The same epoch 0 on both ranks; epoch 1 seeded by rank (its checksum was not compared).
        loader = ResumableDataLoader(data, BATCH, sampler=_ShuffledAfterEpoch0(SIZE, seed=rank))
        return ids(loader) + ids(loader)

    case("later_epoch_orders", rank, results, later_epoch_orders)
    shards = [(0, 50), (50, 60), (110, 70), (180, 80), (260, 30)]

    def stream() -> list[int]:
        mine = shards if rank == 0 else shards[:-1]
        ds = StreamingShardedDataset(mine, IterableReader(read_shard), steps_per_epoch=3)
        return ids(ResumableDataLoader(ds, batch_size=BATCH, seed=7))

    case("stream_shards", rank, results, stream)
    os.environ["LOADERKIT_RANK_CHECK_TIMEOUT"] = "3"

    def only_rank0() -> list[int]:
        if rank == 1:
            return []
        return ids(ResumableDataLoader(data, BATCH, True, seed=7))

    case("only_rank0", rank, results, only_rank0)
    # The same loader on both ranks afterwards: the rank that waited alone must not stay
    # a comparison round ahead (it would compare against another loader's fingerprint).
    case("after_alone", rank, results, lambda: ids(ResumableDataLoader(data, BATCH, True, seed=7)))
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()
