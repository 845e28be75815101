"""Where two gloo ranks learn their topology; a scenario of ``_gloo_loops.py``.

``run(rank, world, port, OUT)``: each rank peeks at a loader (a batch, ``len()``,
``state_dict()``) before ``init_process_group``, then reads two epochs under the group, as
does a loader built before it with ``world_size=`` alone;
it also builds loaders with a ``world_size=`` larger than the group and with
``world_size=1`` alone. Each rank writes ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch.distributed as dist

from loaderkit import (
    IterableReader,
    LoaderkitError,
    ResumableDataLoader,
    StreamingShardedDataset,
    attach_host,
)
from tests.support.helpers import mark_phase

SIZE, BATCH = 20, 2


def read(shard: tuple[int, int]) -> Iterator[int]:
    yield from range(shard[0], shard[0] + shard[1])


class _Strategy:  # as ModelParallelStrategy reports tensor-parallel peers of one replica
    distributed_sampler_kwargs: ClassVar[dict[str, int]] = {"rank": 0, "num_replicas": 1}


class _Host:  # a Fabric-like host
    strategy = _Strategy()


def streamed() -> ResumableDataLoader:
    shards = StreamingShardedDataset([(0, 6), (6, 6)], IterableReader(read), steps_per_epoch=2)
    return ResumableDataLoader(shards, batch_size=BATCH, seed=0)


def run(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    results: dict[str, Any] = {}
    mark_phase(f"rank {rank}: a peek before init_process_group")
    peeked = ResumableDataLoader(list(range(SIZE)), batch_size=BATCH, seed=0)
    next(iter(peeked))
    len(peeked), peeked.state_dict()
    peeked.set_epoch(0)  # the peek is not the run: epoch 0 from its start
    early = ResumableDataLoader(list(range(SIZE)), batch_size=BATCH, seed=0, world_size=world)
    stream, loaded = streamed(), streamed()
    next(iter(stream))  # its slots dealt for one process
    next(iter(loaded))
    one_rank = streamed()  # loaded before the group from a state saved on one process
    one_rank.load_state_dict(stream.state_dict())
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results["epochs"] = [[int(i) for b in peeked for i in b] for _ in range(2)]
    results["early"] = [int(i) for b in early for i in b]  # its rank from the group
    try:
        results["stream"] = {"ids": [int(i) for b in stream for i in b]}
    except LoaderkitError as exc:
        results["stream"] = {"error": str(exc)}
    try:
        results["one_rank"] = {"ids": [int(i) for b in one_rank for i in b]}
    except LoaderkitError as exc:
        results["one_rank"] = {"error": str(exc)}
    # A model-parallel host naming one data-parallel rank, and world_size=2 alone (review 388).
    host = _Host()  # held: a loader keeps its host weakly
    try:
        hosted = attach_host(ResumableDataLoader(list(range(SIZE)), batch_size=BATCH, seed=0,
                                                 world_size=2), host)  # fmt: skip
        results["hosted"] = {"ids": [int(i) for b in hosted for i in b]}
    except ValueError as exc:
        results["hosted"] = {"error": str(exc)}
    # A state saved under the group puts the peeked one's slots back in its world (review 387).
    saver = streamed()
    it = iter(saver)
    next(it)
    loaded.load_state_dict(saver.state_dict())
    results["stream_loaded"] = [[int(i) for b in rest for i in b] for rest in (it, loaded)]
    cases = {"larger": {"rank": rank, "world_size": 4}, "one": {"world_size": 1}}
    for name, kwargs in cases.items():
        try:
            loader = ResumableDataLoader(list(range(SIZE)), batch_size=BATCH, seed=0, **kwargs)
            results[name] = {"ids": [int(i) for b in loader for i in b]}
        except ValueError as exc:
            results[name] = {"error": str(exc)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    mark_phase(f"rank {rank}: done")
    dist.barrier()
    dist.destroy_process_group()
