"""Per-sample seeding: its cost per sample, and the default loader against torch on per-sample data.

Part 1, the cost of seeding one sample (us/sample over the bare loop that
loads the same samples unseeded), for a "dataset" that draws from no global
generator, from torch only (torchvision's transforms), numpy only, Python's
``random`` only, or all three:

- previous: loaderkit 0.1's per-sample path, inlined here: a SeedSequence per
  sample (``derive_seed``), then save, seed and restore the three global
  generators around every sample (torch and numpy seeded with 32 bits).
- eager: ``SampleSeeder(lazy=False)`` (``per_sample_seeding=True``): every
  generator is seeded for every sample through its own API; the caller's
  states are saved and restored once per batch.
- lazy: ``SampleSeeder(lazy=True)`` (the default, ``per_sample_seeding="auto"``):
  torch's generator for every sample, numpy's and Python's only once the
  dataset is seen drawing from them.

Goals (issue 23): <= 0.5 us per sample when nothing is drawn, <= 10 us per
generator drawn from.

Part 2, samples/s of ``ResumableDataLoader(dataset, batch_size, shuffle=True,
seed=0, num_workers)`` (default arguments otherwise: per-sample seeding on)
against ``torch.utils.data.DataLoader(dataset, batch_size, shuffle=True,
num_workers)`` on three per-sample datasets:

- ``tensors``: ``torch.utils.data.TensorDataset(X, Y)``, X 50k x 64 float32.
- ``list``: a Python list of 50k ints.
- ``png``: 64x64 RGB PNGs in memory, decoded by ``torchvision.io.decode_png``
  and augmented by a torchvision v2 ``RandomResizedCrop(48)`` +
  ``RandomHorizontalFlip`` + ``ToDtype`` (draws from torch's global generator).

Method: each repeat runs every competitor once in a shuffled order (noise hits
all alike); the first batch of each run is untimed (worker start-up excluded),
then ``--batches`` batches are timed. The ratio is ours / DataLoader on the
medians. Goal: >= 1.0x everywhere.

Run: ``python benchmarks/seeding/bench.py`` (about 2 minutes on 2 cores).
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

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import loaderkit
from loaderkit import ResumableDataLoader, derive_seed
from loaderkit._tags import SeedTag
from loaderkit.cli.bench import Ratio, report
from loaderkit.seeding import SampleSeeder

# ------------------------------------------------------------------ part 1


def _previous(seed: int, epoch: int, indices: list[int], load: Callable[[int], Any]) -> list[Any]:
    """loaderkit 0.1 (62985be): SeedSequence + save/seed/restore of three generators per sample."""
    out = []
    gen = torch.default_generator
    for index in indices:
        value = derive_seed(seed, SeedTag.SAMPLE, epoch, index)
        torch_state = gen.get_state()
        python_state = random.getstate()
        numpy_state = np.random.get_state()
        try:
            gen.manual_seed(value)
            random.seed(value)
            np.random.seed(value % 2**32)
            out.append(load(index))
        finally:
            gen.set_state(torch_state)
            random.setstate(python_state)
            np.random.set_state(numpy_state)
    return out


DRAWS: dict[str, Callable[[int], Any]] = {
    "none": lambda i: i,
    "torch": lambda i: torch.rand(1),
    "numpy": lambda i: np.random.random_sample(),
    "random": lambda i: random.random(),
    "all three": lambda i: (torch.rand(1), np.random.random_sample(), random.random()),
}

# us per sample (issue 23): 0.5 when nothing is drawn, 10 per generator drawn from.
GOALS = {"none": 0.5, "torch": 10.0, "numpy": 10.0, "random": 10.0, "all three": 30.0}


def seeding_cost(args: argparse.Namespace) -> list[Ratio]:
    bs = args.seed_batch
    batches = [list(range(k * bs, (k + 1) * bs)) for k in range(args.seed_batches)]
    rows: dict[tuple[str, str], list[float]] = {}
    rng = random.Random(0)
    for repeat in range(args.repeats + 1):
        for kind, load in DRAWS.items():
            lazy, eager = SampleSeeder(lazy=True), SampleSeeder(lazy=False)
            runners: dict[str, Callable[[list[int]], Any]] = {
                "bare": lambda b, load=load: [load(i) for i in b],
                "previous": lambda b, load=load: _previous(0, 0, b, load),
                "eager": lambda b, load=load, s=eager: s.load(0, 0, b, load, []),
                "lazy": lambda b, load=load, s=lazy: s.load(0, 0, b, load, []),
            }
            for run in runners.values():
                run(batches[0])  # lazy: the first batch finds the generators in use
            names = list(runners)
            rng.shuffle(names)
            for name in names:
                start = time.perf_counter()
                for b in batches:
                    runners[name](b)
                per = (time.perf_counter() - start) / (len(batches) * bs) * 1e6
                if repeat:
                    rows.setdefault((kind, name), []).append(per)
    print(
        f"Per-sample seeding cost, batch {bs}, {args.seed_batches} batches, median of "
        f"{args.repeats} (us per sample over the bare, unseeded loop):"
    )
    print()
    print("| dataset draws from | bare loop us/sample | previous (0.1) | eager | lazy (default) |")
    print("|---|---:|---:|---:|---:|")
    ratios = []
    for kind in DRAWS:
        bare = statistics.median(rows[kind, "bare"])
        extra = {n: statistics.median(rows[kind, n]) - bare for n in ("previous", "eager", "lazy")}
        print(
            f"| {kind} | {bare:.2f} | {extra['previous']:.2f} | {extra['eager']:.2f} | "
            f"{extra['lazy']:.2f} |"
        )
        goal = GOALS[kind]
        ratios.append(
            Ratio(f"seeding us/sample, lazy, draws from {kind}", extra["lazy"], goal, False, "us")
        )
    print()
    return ratios


# ------------------------------------------------------------------ part 2


class PngAugment(Dataset[tuple[torch.Tensor, int]]):
    """PNG bytes decoded by torchvision and augmented by v2 transforms (torch's global RNG)."""

    def __init__(self, n: int, size: int = 64) -> None:
        from torchvision.io import encode_png
        from torchvision.transforms import v2

        gen = torch.Generator().manual_seed(0)
        base = [
            torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=gen)
            for _ in range(16)
        ]
        self.pngs = [encode_png(base[i % 16]) for i in range(n)]
        self.transform = v2.Compose(
            [
                v2.RandomResizedCrop(48, antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ToDtype(torch.float32, scale=True),
            ]
        )

    def __len__(self) -> int:
        return len(self.pngs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from torchvision.io import decode_png

        return self.transform(decode_png(self.pngs[index])), index % 10


def datasets(args: argparse.Namespace) -> dict[str, tuple[Any, int]]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 64, generator=gen)
    y = torch.randint(0, 10, (args.samples,), generator=gen)
    return {
        "tensors": (TensorDataset(x, y), args.batch_size),
        "list": (list(range(args.samples)), args.batch_size),
        "png": (PngAugment(args.png_samples), args.png_batch_size),
    }


def timed(loader: Any, batches: int, batch_size: int) -> float:
    it: Iterator[Any] = iter(loader)
    next(it)
    start = time.perf_counter()
    count = 0
    for _ in it:
        count += 1
        if count >= batches:
            break
    rate = count * batch_size / (time.perf_counter() - start)
    del it
    return rate


def loaders(args: argparse.Namespace) -> list[Ratio]:
    rng = random.Random(1)
    ratios = []
    print(
        "| dataset | num_workers | ResumableDataLoader samples/s | DataLoader samples/s | ratio |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, (ds, bs) in datasets(args).items():
        batches = args.png_batches if name == "png" else args.batches
        for nw in args.workers:
            kw: dict[str, Any] = {"batch_size": bs, "shuffle": True, "num_workers": nw}
            if nw:
                kw["persistent_workers"] = True  # both: the start-up is not what is compared
            competitors = {
                "ours": ResumableDataLoader(ds, seed=0, **kw),
                "torch": DataLoader(ds, **kw),
            }
            rates: dict[str, list[float]] = {k: [] for k in competitors}
            for repeat in range(args.repeats + 1):
                keys = list(competitors)
                rng.shuffle(keys)
                for key in keys:
                    rate = timed(competitors[key], batches, bs)
                    if repeat:
                        rates[key].append(rate)
            ours, theirs = statistics.median(rates["ours"]), statistics.median(rates["torch"])
            print(f"| {name} | {nw} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x |")
            ratios.append(
                Ratio(
                    f"ResumableDataLoader / DataLoader, {name}, num_workers={nw}",
                    ours / theirs,
                    1.0,
                )
            )
            del competitors
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed-batch", type=int, default=256)
    parser.add_argument("--seed-batches", type=int, default=8)
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--png-samples", type=int, default=4096)
    parser.add_argument("--png-batch-size", type=int, default=64)
    parser.add_argument("--png-batches", type=int, default=12)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--skip-loaders", action="store_true")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}, numpy {np.__version__}, loaderkit {loaderkit.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, torch threads "
        f"{torch.get_num_threads()}"
    )
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"load average at start (1, 5, 15 min): {load} (other processes skew the timings)")
    print()
    start = time.perf_counter()
    ratios = seeding_cost(args)
    if not args.skip_loaders:
        ratios += loaders(args)
    report(ratios)
    print()
    for r in ratios:
        verdict = "" if r.met is None else ("met" if r.met else "MISSED")
        print(f"{r.name}: {r.format()} (goal {r.goal_text()}: {verdict})")
    print(f"total bench time {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
