"""Worker start under a process group: time to the first batch of an in-memory dataset.

Inside a torch.distributed process group ``ResumableDataLoader`` starts its
workers by ``forkserver`` (forking a process that runs gloo's or NCCL's
threads can deadlock the child). A forkserver worker receives the dataset by
pickling. torch pickles a tensor by moving its storage into shared memory
while the worker starts; loaderkit now does that once, before any worker
starts (``loader._workers.share_tensors``).

This bench builds a ``--mib`` MiB float32 dataset (loaderkit's and torch's
``TensorDataset``), opens a one-process gloo group (so the loader picks
forkserver by itself), and times ``next(iter(loader))`` with ``--workers``
workers from a freshly built loader (so the sharing counts), best of
``--repeats`` (a fresh tensor each time, never one already shared):

- fork: ``multiprocessing_context="fork"`` outside the group (the baseline);
- forkserver, pickled: the tensors left in ordinary memory (``share_tensors``
  disabled: the behaviour before it existed);
- forkserver, shared: the default now.

The forkserver itself is started once before timing (its start, ~1 s of
importing torch in the server, is paid once per process).

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
from loaderkit.loader import _workers


def first_batch_s(make: Callable[[], Any], context: str | None, workers: int) -> float:
    data = make()
    start = time.perf_counter()
    loader = ResumableDataLoader(
        data, batch_size=256, num_workers=workers, seed=0, multiprocessing_context=context
    )
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
        f"seconds to the first batch from a fresh loader, best of {args.repeats}"
    )
    ratios = []
    share = _workers.share_tensors
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            "gloo", init_method=f"file://{os.path.join(tmp, 'pg')}", rank=0, world_size=1
        )
        warnings.simplefilter("ignore", RuntimeWarning)  # the once-per-process notice
        try:
            first_batch_s(lambda: list(range(1024)), None, args.workers)  # start the server
            for name, make in kinds.items():
                _workers.share_tensors = lambda dataset: 0  # type: ignore[assignment]
                pickled = min(first_batch_s(make, None, args.workers) for _ in range(args.repeats))
                _workers.share_tensors = share
                shared = min(first_batch_s(make, None, args.workers) for _ in range(args.repeats))
                dist_group = dist.group.WORLD
                dist.destroy_process_group(dist_group)
                fork = min(first_batch_s(make, "fork", args.workers) for _ in range(args.repeats))
                dist.init_process_group(
                    "gloo", init_method=f"file://{os.path.join(tmp, name)}", rank=0, world_size=1
                )
                print(
                    f"  {name:24s} fork {fork:6.3f} s | forkserver: pickled {pickled:6.3f} s, "
                    f"shared {shared:6.3f} s"
                )
                ratios.append(Ratio(f"pickled / shared first batch, {name}", pickled / shared))
                ratios.append(
                    Ratio(
                        f"forkserver (shared) / fork first batch, {name}",
                        shared / fork,
                        goal=2.0,
                        higher_is_better=False,
                    )
                )
        finally:
            _workers.share_tensors = share
            dist.destroy_process_group()
    for r in ratios:
        goal = f" (goal {r.goal_text()})" if r.goal is not None else ""
        print(f"  {r.name}: {r.format()}{goal}")
    report(ratios)


if __name__ == "__main__":
    main()
