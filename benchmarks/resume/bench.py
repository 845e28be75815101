"""Resume latency: time from ``load_state_dict`` to the first batch, by position in the epoch.

Map-style data of ``--samples`` (default 10M) samples, batch ``--batch-size``
(256), ``shuffle=True``, ``num_workers=0``. For each position (0 %, 10 %, 50 %,
90 % of an epoch) a state is taken from a run stopped there, then a fresh
loader (built before the clock starts) is timed from ``load_state_dict(state)``
to ``next(iter(loader))``; the first batch is checked to be the one the
stopped run would have yielded next.

Loaders:

- ResumableDataLoader over ``IndexDataset`` (``__getitem__`` returns the index;
  ``per_sample_seeding=False``: there is no randomness to seed, and the
  per-sample path is then what StatefulDataLoader runs too), and over
  ``loaderkit.TensorDataset(torch.arange(N))`` (the ``get_batch`` path). Both
  use the same states: they come from one run of the TensorDataset loader
  stopped at each position (its state only holds the plan's settings and the
  position, so it is valid for both). Median and best of ``--repeats``, the
  positions visited in a different order each repeat. A "warm" row resumes a
  loader that already holds the epoch's order (a resume in the same process):
  the part of the resume that depends on the position at all.
- torchdata ``StatefulDataLoader`` over ``IndexDataset`` with the same
  arguments. Its states come from one uninterrupted run over
  ``--sdl-samples`` samples (default: the same 10M), stopped (state_dict taken)
  at each position in turn; each resume is timed once (it takes seconds).

Before state version 4 the resume time of ResumableDataLoader was dominated
by the epoch's ``randperm``, computed once per epoch whatever the position;
that time alone is still printed for reference. Since then the order is a
keyed permutation evaluated per position (``benchmarks/plans``), so the
"warm" row no longer holds anything a cold resume lacks.

Streams (``--stream-samples``, default 2M, in ``--stream-shards`` generator
shards): ``StreamingShardedDataset`` (per-slot cursors: resume skips whole
shards unopened; seeks inside a seekable shard, drops the head of a generator
shard) vs ``StatefulDataLoader``
over the same shards as one plain ``IterableDataset`` (resumed by replay).

Run: ``python benchmarks/resume/bench.py`` (about 70 s on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torchdata
from torch.utils.data import Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

import loaderkit
from loaderkit import IterableReader, ResumableDataLoader, SamplePlan, StreamingShardedDataset
from loaderkit.cli.bench import Ratio, report

FRACTIONS = (0.0, 0.1, 0.5, 0.9)


class IndexDataset(Dataset[int]):
    """Sample ``i`` is the int ``i``: the cheapest possible map-style dataset."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        return index


def _seconds(t: float) -> str:
    return f"{t:.3f} s" if t >= 0.01 else f"{t * 1e6:.0f} us"


def first_ids(batch: Any) -> list[int]:
    if isinstance(batch, (tuple, list)):
        batch = batch[0]
    return batch.tolist()


def steps_at(fraction: float, samples: int, batch_size: int) -> int:
    return int(fraction * samples) // batch_size


def ours_states(args: argparse.Namespace, data: torch.Tensor) -> dict[float, dict[str, Any]]:
    """States of one real run stopped at each position."""
    loader = ResumableDataLoader(
        loaderkit.TensorDataset(data), batch_size=args.batch_size, shuffle=True, seed=0
    )
    states: dict[float, dict[str, Any]] = {}
    it = iter(loader)
    done = 0
    start = time.perf_counter()
    for fraction in FRACTIONS:
        for _ in range(steps_at(fraction, args.samples, args.batch_size) - done):
            next(it)
        done = steps_at(fraction, args.samples, args.batch_size)
        states[fraction] = loader.state_dict()
    print(
        f"ResumableDataLoader states: one run to 90 % took {time.perf_counter() - start:.1f} s "
        "(TensorDataset path)"
    )
    return states


def time_ours(loader: ResumableDataLoader, state: dict[str, Any], expected: list[int]) -> float:
    start = time.perf_counter()
    loader.load_state_dict(state)
    batch = next(iter(loader))
    elapsed = time.perf_counter() - start
    if first_ids(batch) != expected:
        raise AssertionError("ResumableDataLoader: the first batch after resume is wrong")
    return elapsed


def time_stateful(args: argparse.Namespace) -> dict[float, tuple[float, float]]:
    """(seconds to resume, seconds the run took to get there) per position."""
    n, bs = args.sdl_samples, args.batch_size

    def make() -> StatefulDataLoader:
        return StatefulDataLoader(IndexDataset(n), batch_size=bs, shuffle=True)

    run = make()
    it = iter(run)
    done = 0
    captured: dict[float, tuple[dict[str, Any], list[int], float]] = {}
    start = time.perf_counter()
    for fraction in FRACTIONS:
        for _ in range(steps_at(fraction, n, bs) - done):
            next(it)
        done = steps_at(fraction, n, bs)
        state = run.state_dict()
        reached = time.perf_counter() - start
        following = first_ids(next(it))  # what the stopped run yields next
        done += 1
        captured[fraction] = (state, following, reached)
    del it, run
    results: dict[float, tuple[float, float]] = {}
    for fraction, (state, following, reached) in captured.items():
        loader = make()
        start = time.perf_counter()
        loader.load_state_dict(state)
        batch = next(iter(loader))
        elapsed = time.perf_counter() - start
        if first_ids(batch) != following:
            raise AssertionError(
                f"StatefulDataLoader: wrong first batch after resume at {fraction}"
            )
        results[fraction] = (elapsed, reached)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10_000_000)
    parser.add_argument("--sdl-samples", type=int, default=None, help="default: --samples")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stream-samples", type=int, default=2_000_000, help="0: skip")
    parser.add_argument("--stream-shards", type=int, default=64)
    args = parser.parse_args(argv)
    if args.sdl_samples is None:
        args.sdl_samples = args.samples
    warnings.filterwarnings("ignore", message=".*set_vital.*")

    print(
        f"torch {torch.__version__}, torchdata {torchdata.__version__}, loaderkit "
        f"{loaderkit.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs"
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at start (1, 5, 15 min): {load} (other processes skew the timings)")
    print(
        f"{args.samples:,} samples, batch {args.batch_size}, shuffle=True, num_workers=0; "
        "time = load_state_dict(state) + next(iter(loader)) on a fresh loader"
    )
    print()
    begin = time.perf_counter()
    data = torch.arange(args.samples)
    plan = SamplePlan(num_samples=args.samples, batch_size=args.batch_size, shuffle=True)
    states = ours_states(args, data)
    expected = {}
    for fraction, state in states.items():
        sched = plan.schedule(0, start=state["position"], rank=0, world_size=1)
        expected[fraction] = sched.indices(0).tolist()

    makers: dict[str, Callable[[], ResumableDataLoader]] = {
        "IndexDataset (per-sample)": lambda: ResumableDataLoader(
            IndexDataset(args.samples),
            batch_size=args.batch_size,
            shuffle=True,
            seed=0,
            per_sample_seeding=False,
        ),
        "loaderkit.TensorDataset (get_batch)": lambda: ResumableDataLoader(
            loaderkit.TensorDataset(data), batch_size=args.batch_size, shuffle=True, seed=0
        ),
    }
    ours: dict[str, dict[float, list[float]]] = {}
    rng = random.Random(0)
    for name, make in makers.items():
        cold: dict[float, list[float]] = {f: [] for f in FRACTIONS}
        warm: dict[float, list[float]] = {f: [] for f in FRACTIONS}
        for _ in range(args.repeats):
            order = list(FRACTIONS)
            rng.shuffle(order)
            for fraction in order:
                loader = make()
                cold[fraction].append(time_ours(loader, states[fraction], expected[fraction]))
                warm[fraction].append(time_ours(loader, states[fraction], expected[fraction]))
        ours[name] = cold
        ours[f"{name}, warm"] = warm

    perms = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        gen = torch.Generator().manual_seed(1)
        torch.randperm(args.samples, generator=gen)
        perms.append(time.perf_counter() - start)

    stateful = time_stateful(args)

    head = " | ".join(f"{int(f * 100)} %" for f in FRACTIONS)
    print()
    print(f"| loader | data | samples | {head} | 90 % / 0 % |")
    print("|---|---|---:|" + "---:|" * (len(FRACTIONS) + 1))
    for name, times in ours.items():
        for label, pick in (("median", statistics.median), ("best", min)):
            t = {f: pick(v) for f, v in times.items()}
            cells = " | ".join(_seconds(t[f]) for f in FRACTIONS)
            print(
                f"| ResumableDataLoader | {name}, {label} | {args.samples:,} | {cells} | "
                f"{t[0.9] / t[0.0]:.2f}x |"
            )
    cells = " | ".join(f"{stateful[f][0]:.3f} s" for f in FRACTIONS)
    print(
        f"| torchdata StatefulDataLoader | IndexDataset (per-sample) | {args.sdl_samples:,} | "
        f"{cells} | {stateful[0.9][0] / stateful[0.0][0]:.2f}x |"
    )
    print()
    print(
        f"For reference: torch.randperm({args.samples:,}) alone takes "
        f"{statistics.median(perms):.3f} s (median of {args.repeats}); ResumableDataLoader "
        "computes it once per epoch, whatever the position."
    )
    reached = ", ".join(f"{int(f * 100)} %: {stateful[f][1]:.1f} s" for f in FRACTIONS)
    print(
        f"StatefulDataLoader states came from one run over {args.sdl_samples:,} samples; "
        f"reaching each point took ({reached}); each resume timed once."
    )
    ratios = []  # for `loaderkit bench`
    for name, times in ours.items():
        if name.endswith("warm"):
            continue
        t = {f: statistics.median(v) for f, v in times.items()}
        ratio = t[0.9] / t[0.0]
        ratios.append(Ratio(f"90 % / 0 %, {name}", ratio, 1.2, higher_is_better=False))
        sdl = stateful[0.9][0] / t[0.9]
        ratios.append(Ratio(f"StatefulDataLoader / this at 90 %, {name}", sdl))
        verdict = "met" if ratio <= 1.2 else "MISSED"
        print(
            f"Goal ResumableDataLoader ({name}) 90 % <= 1.2x 0 % (medians): {ratio:.2f}x, {verdict}"
        )
    sdl = stateful[0.9][0] / stateful[0.0][0]
    ratios.append(Ratio("90 % / 0 %, StatefulDataLoader", sdl, higher_is_better=False))
    if args.stream_samples:
        ratios += stream_rows(args)
    print(f"total bench time {time.perf_counter() - begin:.1f} s")
    report(ratios)


# ------------------------------------------------------------------ streams
def read_span(shard: tuple[int, int]) -> Any:
    """A stream shard ``(start, n)``: a generator, readable only front to back."""
    start, n = shard
    return iter(range(start, start + n))


class SeekableSpans:
    """The same shards in a format that can seek (like a memory map): ``iter_from`` jumps."""

    suffixes = ()

    def iter_from(self, shard: tuple[int, int], offset: int) -> Any:
        start, n = shard
        return iter(range(start + offset, start + n))


class SpanStream(IterableDataset[int]):
    """The same shards as one plain iterable (what StatefulDataLoader resumes by replay)."""

    def __init__(self, shards: list[tuple[int, int]]) -> None:
        self.shards = shards

    def __iter__(self) -> Any:
        for shard in self.shards:
            yield from read_span(shard)


def stream_rows(args: argparse.Namespace) -> list[Ratio]:
    """Resume latency of a stream: StreamingShardedDataset vs StatefulDataLoader's replay."""
    n, bs, k = args.stream_samples, args.batch_size, args.stream_shards
    shards = [(i * n // k, (i + 1) * n // k - i * n // k) for i in range(k)]
    ds = StreamingShardedDataset(shards, IterableReader(read_span), shuffle_shards=False)
    seekable = StreamingShardedDataset(shards, SeekableSpans(), shuffle_shards=False)
    makers: dict[str, Callable[[], Any]] = {
        "ResumableDataLoader(StreamingShardedDataset), seekable shards": lambda: (
            ResumableDataLoader(seekable, batch_size=bs, seed=0)
        ),
        "ResumableDataLoader(StreamingShardedDataset), generator shards": lambda: (
            ResumableDataLoader(ds, batch_size=bs, seed=0)
        ),
        "torchdata StatefulDataLoader(IterableDataset)": lambda: StatefulDataLoader(
            SpanStream(shards), batch_size=bs
        ),
    }
    print()
    print(
        f"Stream: {n:,} samples in {k} generator shards (a shard can only be read front to "
        f"back), batch {bs}, num_workers=0; states from one run stopped at each position, "
        "each resume timed on a fresh loader (ours: median of --repeats; the replay: once) "
        "and its first batch checked"
    )
    times: dict[str, dict[float, float]] = {}
    for name, make in makers.items():
        run, captured, done = make(), {}, 0
        it = iter(run)
        for fraction in FRACTIONS:
            for _ in range(steps_at(fraction, n, bs) - done):
                next(it)
            done = steps_at(fraction, n, bs)
            state = run.state_dict()
            captured[fraction] = (state, first_ids(next(it)))
            done += 1
        del it, run
        times[name] = {}
        # Ours takes microseconds: median of --repeats. A replay takes seconds: once.
        reps = args.repeats if name.startswith("Resumable") else 1
        for fraction, (state, following) in captured.items():
            spent = []
            for _ in range(reps):
                loader = make()
                start = time.perf_counter()
                loader.load_state_dict(state)
                batch = next(iter(loader))
                spent.append(time.perf_counter() - start)
                if first_ids(batch) != following:
                    raise AssertionError(f"{name}: wrong first batch after resume at {fraction}")
            times[name][fraction] = statistics.median(spent)
    head = " | ".join(f"{int(f * 100)} %" for f in FRACTIONS)
    print(f"| loader | {head} | 90 % / 0 % |")
    print("|---|" + "---:|" * (len(FRACTIONS) + 1))
    for name, t in times.items():
        cells = " | ".join(_seconds(t[f]) for f in FRACTIONS)
        print(f"| {name} | {cells} | {t[0.9] / t[0.0]:.2f}x |")
    seek, gen, theirs = times.values()
    ratios = []
    for label, ours in (("seekable shards", seek), ("generator shards", gen)):
        ratio = ours[0.9] / ours[0.0]
        verdict = "met" if ratio <= 1.2 else "MISSED"
        print(
            f"Goal stream ({label}) 90 % <= 1.2x 0 %: {ratio:.2f}x, {verdict}; "
            f"StatefulDataLoader is {theirs[0.9] / ours[0.9]:.0f}x slower at 90 %"
        )
        ratios += [
            Ratio(f"90 % / 0 %, stream, {label}", ratio, 1.2, higher_is_better=False),
            Ratio(f"StatefulDataLoader / this at 90 %, stream, {label}", theirs[0.9] / ours[0.9]),
        ]
    print(
        f"Generator shards drop the head of the shard they resume in (up to {n // k:,} "
        "samples here): bounded by the shard size, not by the position."
    )
    return ratios


if __name__ == "__main__":
    main()
