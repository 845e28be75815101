"""Loader throughput on in-memory tensors: ResumableDataLoader vs torch, torchdata and the bound.

Data: ``--samples`` x ``--dim`` float32 rows (default 200k x 64), batches of
``--batch-size`` (256), shuffled, for each ``--workers`` value (default 0 and 2).
Competitors, all with ``batch_size``, ``shuffle=True`` and ``num_workers``:

- (a) ``ResumableDataLoader(loaderkit.TensorDataset(x), seed=0)``: one ``get_batch``
  (``index_select``) per batch.
- (b) ``torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x))``: one
  ``__getitem__`` per sample, then ``default_collate`` stacks them.
- (c) torchdata ``StatefulDataLoader`` with the same arguments as (b).
- (d) the bound: ``x.index_select(0, perm[i:i + batch])`` over a fresh ``randperm``
  per epoch, in this process (no loader at all). It is listed under every
  ``num_workers`` for the ratio but never uses workers.
- (e) only with workers: torch's worker floor, a plain ``DataLoader`` whose
  dataset's ``__getitems__`` does the same single ``index_select`` per batch
  (no per-sample calls, no collate). It is what any loader built on torch's
  worker processes can reach: each batch crosses to the main process as a new
  shared-memory tensor.
- (f) ``ResumableDataLoader(torch.utils.data.TensorDataset(x), seed=0)`` with the
  defaults (``default_collate``): torch's own ``TensorDataset`` is gathered a batch
  at a time (one ``index_select`` per tensor), the same batches as (b) gives.

Method: a repeat runs every competitor once, in a shuffled order (machine noise
hits all alike); the table shows the median and the best over ``--repeats``
after one warm-up repeat. A run takes the first batch untimed (worker start-up
and first-batch latency are excluded), then times the next batches: for (a),
(d), (e) and (f) the rest of the epoch, and with ``num_workers=0`` the
``--fast-epochs - 1`` epochs after it too (an epoch of (a) is only ~20 ms; each
new epoch's ``randperm`` is timed, for (a), (d) and (f) alike); for (b) and (c),
which are slow, only the next ``--torch-batches`` batches. samples/s is
measured on what was timed (a rate: nothing is scaled; the batch counts are
printed).

The ``state_dict()`` cost is measured on (a) with ``num_workers=0``: (1) the
rest of an epoch with a ``loader.state_dict()`` call after every batch, against
the same loop without; (2) the mean time of one call mid-epoch, over
``--state-calls`` calls, as a fraction of one loop step. A breakdown shows what
the call spends its time on (the first call builds and caches the constant part).

Run: ``python benchmarks/loader/bench.py`` (about 30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torchdata
from torch.utils.data import DataLoader
from torch.utils.data import TensorDataset as TorchTensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import loaderkit
from loaderkit import ResumableDataLoader
from loaderkit.cli.bench import Ratio, report
from loaderkit.env import detect
from loaderkit.plan._cursor import new_state

SHORT = {
    "a": "ResumableDataLoader + loaderkit.TensorDataset",
    "b": "DataLoader",
    "c": "StatefulDataLoader",
    "d": "slicing bound",
    "e": "worker floor",
}
NAMES = {
    "a": "(a) ResumableDataLoader + loaderkit.TensorDataset",
    "b": "(b) torch DataLoader + torch TensorDataset",
    "c": "(c) torchdata StatefulDataLoader + torch TensorDataset",
    "d": "(d) bound: index_select by shuffled index batches",
    "e": "(e) torch worker floor: DataLoader + __getitems__ (one index_select)",
    "f": "(f) ResumableDataLoader + torch TensorDataset, defaults",
}


class _BatchRows(torch.utils.data.Dataset[torch.Tensor]):
    """(e): rows fetched a batch per call through ``__getitems__``."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.x[index]

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        return self.x.index_select(0, torch.as_tensor(indices))


def _identity(batch: Any) -> Any:
    return batch


def timed_rate(batches: Iterator[Any], limit: int | None, batch_size: int) -> tuple[float, int]:
    """Samples/s over up to ``limit`` batches after the first (untimed) one."""
    next(batches)
    count = 0
    start = time.perf_counter()
    for _ in batches:
        count += 1
        if limit is not None and count >= limit:
            break
    elapsed = time.perf_counter() - start
    return count * batch_size / elapsed, count


def bound_batches(x: torch.Tensor, batch_size: int, gen: torch.Generator) -> Iterator[torch.Tensor]:
    perm = torch.randperm(x.shape[0], generator=gen)
    for i in range(0, x.shape[0], batch_size):
        yield x.index_select(0, perm[i : i + batch_size])


def epochs(make: Callable[[], Iterator[Any]], count: int) -> Iterator[Any]:
    for _ in range(count):
        yield from make()


def make_runners(
    x: torch.Tensor, args: argparse.Namespace, num_workers: int
) -> dict[str, Callable[[], tuple[float, int]]]:
    bs = args.batch_size
    ours = ResumableDataLoader(
        loaderkit.TensorDataset(x), batch_size=bs, shuffle=True, seed=0, num_workers=num_workers
    )
    torch_ds = TorchTensorDataset(x)
    theirs = ResumableDataLoader(
        torch_ds, batch_size=bs, shuffle=True, seed=0, num_workers=num_workers
    )
    plain = DataLoader(torch_ds, batch_size=bs, shuffle=True, num_workers=num_workers)
    stateful = StatefulDataLoader(torch_ds, batch_size=bs, shuffle=True, num_workers=num_workers)
    gen = torch.Generator().manual_seed(0)
    n_epochs = args.fast_epochs if num_workers == 0 else 1
    runners = {
        "a": lambda: timed_rate(epochs(lambda: iter(ours), n_epochs), None, bs),
        "b": lambda: timed_rate(iter(plain), args.torch_batches, bs),
        "c": lambda: timed_rate(iter(stateful), args.torch_batches, bs),
        "d": lambda: timed_rate(epochs(lambda: bound_batches(x, bs, gen), n_epochs), None, bs),
        "f": lambda: timed_rate(epochs(lambda: iter(theirs), n_epochs), None, bs),
    }
    if num_workers > 0:
        floor = DataLoader(
            _BatchRows(x),
            batch_size=bs,
            shuffle=True,
            num_workers=num_workers,
            collate_fn=_identity,
        )
        runners["e"] = lambda: timed_rate(iter(floor), None, bs)
    return runners


def throughput(x: torch.Tensor, args: argparse.Namespace) -> dict[int, dict[str, list[float]]]:
    results: dict[int, dict[str, list[float]]] = {}
    counts: dict[tuple[int, str], int] = {}
    rng = random.Random(0)
    for nw in args.workers:
        runners = make_runners(x, args, nw)
        rates: dict[str, list[float]] = {k: [] for k in runners}
        for repeat in range(args.repeats + 1):
            keys = list(runners)
            rng.shuffle(keys)
            for key in keys:
                rate, count = runners[key]()
                counts[nw, key] = count
                if repeat > 0:  # the first repeat warms up caches and allocators
                    rates[key].append(rate)
        results[nw] = rates
    print("| num_workers | loader | samples/s, median | samples/s, best | batches timed |")
    print("|---:|---|---:|---:|---:|")
    for nw, rates in results.items():
        for key in sorted(rates):
            r = rates[key]
            print(
                f"| {nw} | {NAMES[key]} | {statistics.median(r):,.0f} | {max(r):,.0f} | "
                f"{counts[nw, key]} |"
            )
    return results


def state_dict_cost(x: torch.Tensor, args: argparse.Namespace) -> Ratio:
    bs = args.batch_size
    loader = ResumableDataLoader(loaderkit.TensorDataset(x), batch_size=bs, shuffle=True, seed=0)

    def epoch(with_state: bool) -> float:
        it = iter(loader)
        next(it)
        start = time.perf_counter()
        steps = 0
        if with_state:
            for _ in it:
                loader.state_dict()
                steps += 1
        else:
            for _ in it:
                steps += 1
        return (time.perf_counter() - start) / steps

    plain: list[float] = []
    with_state: list[float] = []
    for repeat in range(args.state_epochs + 1):
        pair = [(False, plain), (True, with_state)]
        if repeat % 2:
            pair.reverse()
        for flag, out in pair:
            t = epoch(flag)
            if repeat > 0:
                out.append(t)
    step_plain, step_state = statistics.median(plain), statistics.median(with_state)
    best_plain, best_state = min(plain), min(with_state)

    it = iter(loader)
    for _ in range(len(loader) // 2):
        next(it)
    n = args.state_calls
    start = time.perf_counter()
    for _ in range(n):
        loader.state_dict()
    call = (time.perf_counter() - start) / n
    for _ in it:
        pass

    def per_call(fn: Callable[[], Any]) -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n

    fingerprint = loader.plan.fingerprint()
    skeleton = new_state(
        epoch=0, position=1, steps_done=1, plan=fingerprint, world_size=1, num_workers=0
    )
    parts = {
        "every call: copy the cached constant part (dict.copy of 6 keys)": per_call(skeleton.copy),
        "first call only: detect() (loader._topology)": per_call(
            lambda: detect(rank=None, world_size=None)
        ),
        "first call only: new_state(...) (building the constant part)": per_call(
            lambda: new_state(
                epoch=0, position=1, steps_done=1, plan=fingerprint, world_size=1, num_workers=0
            )
        ),
    }

    print()
    print(
        f"state_dict() cost, (a) with num_workers=0, {args.state_epochs} epochs each way "
        "(interleaved):"
    )
    print()
    print("| measure | median | min |")
    print("|---|---:|---:|")
    print(
        f"| loop step without state_dict() | {step_plain * 1e6:.2f} us | "
        f"{best_plain * 1e6:.2f} us |"
    )
    print(
        f"| loop step with state_dict() every step | {step_state * 1e6:.2f} us | "
        f"{best_state * 1e6:.2f} us |"
    )
    print(
        f"| overhead, loop with vs without (goal < 1 %) | "
        f"{(step_state / step_plain - 1) * 100:.1f} % | "
        f"{(best_state / best_plain - 1) * 100:.1f} % |"
    )
    print(f"| one state_dict() call, mean of {n} mid-epoch | {call * 1e6:.2f} us | |")
    share = Ratio("state_dict() call / loop step", call / step_plain * 100, 1.0, False, "%")
    print(
        f"| one call / one loop step (goal < 1 %) | {call / step_plain * 100:.1f} % | "
        f"{call / best_plain * 100:.1f} % |"
    )
    print()
    print("Where one state_dict() call spends its time (each part timed alone):")
    print()
    print("| part | us per call |")
    print("|---|---:|")
    for name, t in parts.items():
        print(f"| {name} | {t * 1e6:.2f} |")
    return share


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--fast-epochs",
        type=int,
        default=4,
        help="epochs per timed run of (a) and (d) with num_workers=0",
    )
    parser.add_argument(
        "--torch-batches",
        type=int,
        default=300,
        help="batches timed for (b) and (c) per run (a subset of the epoch: they are slow)",
    )
    parser.add_argument("--state-calls", type=int, default=20_000)
    parser.add_argument("--state-epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    x = torch.randn(args.samples, args.dim)
    print(
        f"torch {torch.__version__}, torchdata {torchdata.__version__}, loaderkit "
        f"{loaderkit.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"torch threads {torch.get_num_threads()}"
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at start (1, 5, 15 min): {load} (other processes skew the timings)")
    print(
        f"data {args.samples} x {args.dim} float32, batch {args.batch_size}, shuffled; "
        f"{args.repeats} repeats after 1 warm-up; (b)/(c) timed on "
        f"{args.torch_batches} batches per run, (a)/(d) on {args.fast_epochs} epochs "
        "(num_workers=0) or 1 epoch (workers), first batch untimed"
    )
    print()
    start = time.perf_counter()
    results = throughput(x, args)
    print()
    ratios = []  # for `loaderkit bench`, from the medians
    for nw, rates in results.items():
        med = {k: statistics.median(v) for k, v in rates.items()}
        for key, goal in (("b", 25.0 if nw == 0 else None), ("c", None), ("d", 0.6), ("e", None)):
            if key in med:
                name = f"a/{key} (vs {SHORT[key]}), num_workers={nw}"
                ratios.append(Ratio(name, med["a"] / med[key], goal))
        for key, goal in (("b", 10.0 if nw == 0 else None), ("a", None)):
            name = f"f/{key} (torch TensorDataset vs {SHORT[key]}), num_workers={nw}"
            ratios.append(Ratio(name, med["f"] / med[key], goal))
        for label, pick in (("median", statistics.median), ("best", max)):
            r = {k: pick(v) for k, v in rates.items()}
            line = (
                f"num_workers={nw}, {label}: a/b = {r['a'] / r['b']:.1f}x, "
                f"a/c = {r['a'] / r['c']:.1f}x, a/d = {r['a'] / r['d']:.2f}x"
            )
            if "e" in r:
                line += f", a/e = {r['a'] / r['e']:.2f}x"
            line += f", f/b = {r['f'] / r['b']:.1f}x, f/a = {r['f'] / r['a']:.2f}x"
            goals = []
            if nw == 0:
                goals.append(f"a/b >= 25x: {'met' if r['a'] / r['b'] >= 25 else 'MISSED'}")
            goals.append(f"a/d >= 0.6x: {'met' if r['a'] / r['d'] >= 0.6 else 'MISSED'}")
            if nw == 0:
                goals.append(f"f/b >= 10x: {'met' if r['f'] / r['b'] >= 10 else 'MISSED'}")
            print(f"{line} (goals: {'; '.join(goals)})")
    ratios.append(state_dict_cost(x, args))
    report(ratios)
    print()
    print(f"total bench time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
