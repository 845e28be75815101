"""Worker start under a process group: time to the first batch of an in-memory dataset.

Inside a torch.distributed process group ``ResumableDataLoader`` starts its
workers by ``forkserver`` (forking a process that runs gloo's or NCCL's
threads can deadlock the child). A forkserver worker receives the dataset by
pickling; a large in-memory tensor dataset pickled once per worker made the
first batch of a ~200 MiB dataset several times slower than with ``fork``.

This bench builds a ``--mib`` MiB float32 dataset (loaderkit ``TensorDataset``
and torch's ``TensorDataset``), opens a one-process gloo group (so the loader
picks forkserver by itself), and times ``next(iter(loader))`` with
``--workers`` workers, best of ``--repeats`` (a fresh dataset each repeat, so
no run reuses the shared memory of another), against the same loader with
``multiprocessing_context="fork"`` outside the group.

Run: ``python benchmarks/workers/bench.py`` (about 30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.data

import loaderkit
from loaderkit import ResumableDataLoader
from loaderkit.cli.bench import Ratio, report


def first_batch_s(make: Callable[[], Any], context: str | None, workers: int) -> float:
    data = make()
    loader = ResumableDataLoader(
        data, batch_size=256, num_workers=workers, seed=0, multiprocessing_context=context
    )
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    elapsed = time.perf_counter() - start
    del it, loader, data
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = args.mib * 2**20 // (4 * 256)

    kinds: dict[str, Callable[[], Any]] = {
        "loaderkit.TensorDataset": lambda: loaderkit.TensorDataset(torch.randn(rows, 256)),
        "torch TensorDataset": lambda: torch.utils.data.TensorDataset(torch.randn(rows, 256)),
    }
    print(
        f"workers bench: {args.mib} MiB float32 ({rows:,} rows x 256), {args.workers} workers, "
        f"time to the first batch, best of {args.repeats}"
    )
    ratios = []
    for name, make in kinds.items():
        fork = min(first_batch_s(make, "fork", args.workers) for _ in range(args.repeats))
        with tempfile.TemporaryDirectory() as tmp:
            dist.init_process_group(
                "gloo", init_method=f"file://{os.path.join(tmp, 'pg')}", rank=0, world_size=1
            )
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the once-per-process forkserver notice
                    server = min(first_batch_s(make, None, args.workers) for _ in range(args.repeats))
            finally:
                dist.destroy_process_group()
        print(f"  {name:26s} fork {fork:6.3f} s   forkserver (process group) {server:6.3f} s")
        ratios.append(Ratio(f"forkserver / fork first batch, {name}", server / fork, goal=2.0,
                            higher_is_better=False))
    for r in ratios:
        print(f"  {r.name}: {r.format()} (goal {r.goal_text()})")
    report(ratios)


if __name__ == "__main__":
    main()
