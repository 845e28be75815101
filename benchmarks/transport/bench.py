"""Worker transport: batches/s with num_workers=2 through shared-memory slots vs torch's path.

torch sends each tensor of each batch from a worker through a new
shared-memory segment (created, its file descriptor passed over a socket,
mapped, unmapped). ``ResumableDataLoader`` sends batches through slots that
each worker reuses (``loader/_slots.py``): only a small pickled skeleton and a
slot number cross the queue, and the main process copies the tensors out.

Workloads (cheap to load, so the transport is what is measured):

- in-memory: ``loaderkit.TensorDataset`` of ``--rows`` float32 rows of
  ``--dim`` features and int64 labels, batches of ``--batch-size``;
- token shards: ``ShardedDataset`` of ``--shards`` uint16 ``.npy`` shards
  (``--tokens`` tokens in all, page cache), ``TokenReader(seq_len=--seq-len)``
  widened to int64, batches of ``--shard-batch-size`` from its shard plan.

For each: ``num_workers=0``; ``num_workers=--workers`` through torch's path
(``_slots.ENABLED = False``); the same through slots. A run builds a fresh
loader, takes the first batch untimed (worker start-up), then times the next
``--batches`` batches; the best of ``--repeats`` runs (competitors
interleaved) is shown in samples/s.

Run: ``python benchmarks/transport/bench.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import loaderkit
from loaderkit import ResumableDataLoader, ShardedDataset, TokenReader, write_shards
from loaderkit.cli.bench import Ratio, report
from loaderkit.loader import _slots


def samples_per_s(make: Callable[[], ResumableDataLoader], batches: int, slots: bool) -> float:
    _slots.ENABLED = slots
    try:
        loader = make()
        it = iter(loader)
        next(it)  # worker start-up, untimed
        samples = 0
        start = time.perf_counter()
        for _, batch in zip(range(batches), it, strict=False):
            first = batch[0] if isinstance(batch, list | tuple) else batch
            samples += len(first)
        elapsed = time.perf_counter() - start
        del it, loader
        return samples / elapsed
    finally:
        _slots.ENABLED = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32 * 2**20)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--shard-batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, loaderkit {loaderkit.__version__}, {os.cpu_count()} CPUs; "
        "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    rng = np.random.default_rng(0)
    ratios: list[Ratio] = []
    with tempfile.TemporaryDirectory(prefix="loaderkit-bench-transport-") as tmp:
        per = args.tokens // args.shards
        data = (rng.integers(0, 50257, per, dtype=np.uint16) for _ in range(args.shards))
        paths = write_shards(tmp, data, TokenReader(seq_len=args.seq_len))
        tensors = loaderkit.TensorDataset(
            torch.randn(args.rows, args.dim), torch.randint(0, 10, (args.rows,))
        )
        shards = ShardedDataset(paths, TokenReader(seq_len=args.seq_len))

        def in_memory(nw: int) -> Callable[[], ResumableDataLoader]:
            return lambda: ResumableDataLoader(
                tensors, batch_size=args.batch_size, shuffle=True, seed=0, num_workers=nw
            )

        def token_shards(nw: int) -> Callable[[], ResumableDataLoader]:
            sampler = shards.batch_sampler(args.shard_batch_size, seed=0)
            return lambda: ResumableDataLoader(shards, batch_sampler=sampler, num_workers=nw)

        workloads: dict[str, tuple[Callable[[int], Any], str]] = {
            "in-memory tensors": (
                in_memory,
                f"{args.rows:,} x {args.dim} float32 + int64 labels, batch {args.batch_size}",
            ),
            "token shards": (
                token_shards,
                f"{args.shards} shards, {args.tokens:,} uint16 tokens, seq {args.seq_len} "
                f"-> int64, batch {args.shard_batch_size}",
            ),
        }
        nw = args.workers
        print(f"{args.batches} batches timed after the first, best of {args.repeats}")
        for name, (make, what) in workloads.items():
            runs: dict[str, list[float]] = {"0": [], "torch": [], "slots": []}
            for _ in range(args.repeats):
                runs["0"].append(samples_per_s(make(0), args.batches, slots=True))
                runs["torch"].append(samples_per_s(make(nw), args.batches, slots=False))
                runs["slots"].append(samples_per_s(make(nw), args.batches, slots=True))
            best = {key: max(values) for key, values in runs.items()}
            print(
                f"  {name} ({what}): num_workers=0 {best['0']:,.0f} samples/s | "
                f"num_workers={nw}: torch's path {best['torch']:,.0f}, slots {best['slots']:,.0f}"
            )
            ratios += [
                Ratio(
                    f"slots num_workers={nw} / num_workers=0, {name}",
                    best["slots"] / best["0"],
                    goal=1.0,
                ),
                Ratio(
                    f"torch's path num_workers={nw} / num_workers=0, {name}",
                    best["torch"] / best["0"],
                ),
                Ratio(
                    f"slots / torch's path at num_workers={nw}, {name}",
                    best["slots"] / best["torch"],
                ),
            ]
    for r in ratios:
        goal = f" (goal {r.goal_text()})" if r.goal is not None else ""
        print(f"  {r.name}: {r.format()}{goal}")
    report(ratios)


if __name__ == "__main__":
    main()
