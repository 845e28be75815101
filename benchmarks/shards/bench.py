"""Read throughput of memory-mapped token shards: ShardedDataset vs a naive iterable vs raw reads.

Data: ``--shards`` ``.npy`` shards of about ``--tokens`` uint16 tokens each
(default 4 shards of 24M-40M tokens, 256 MiB in all; uneven, as real shards
are), written once into a temporary directory (so they are in the page cache:
this measures the loader, not the disk), cut into samples of ``--seq-len``
tokens (1024, 2 KB each), batches of ``--batch-size`` (32). A shard holds
about 4x the default window of 8192 samples, so about one window in four spans
two shards (a real 100M-token shard holds 12 windows); a batch from such a
window is read with one gather per shard and a scatter, about 3x the cost of a
batch inside one shard. For each ``--workers`` value (default 0 and 2):

- (a) ``ResumableDataLoader(ShardedDataset(...), batch_sampler=ds.batch_sampler(...))``:
  shards shuffled, samples shuffled in windows of ``--window`` (8192), one
  fancy-indexing read per batch out of the memory map, returned as ``int64``
  (``TokenReader``'s default, what an embedding takes).
- (a16) the same with ``TokenReader(out_dtype=None)``: the stored ``uint16``
  tokens, no widening (convert on the device).
- (b) naive: an ``IterableDataset`` that memory-maps each shard in file order
  and yields sample ``i`` when ``i % num_workers == worker_id``
  (``get_worker_info()`` striding, the hand-rolled pattern), each sample as an
  ``int64`` tensor, batched by ``torch.utils.data.DataLoader`` (``default_collate``).
  It does not shuffle and is not resumable; it is the speed users give up.
- (r) the bound: the same bytes read raw, in this process: for each shard, a copy
  of each contiguous ``batch_size * seq_len`` range of the map (``np.array(mm[lo:hi])``),
  in file order. Listed under every ``num_workers`` for the ratio; never uses workers.
- (g) the bound for what (a) reads: the same rows in the same shuffled order,
  one ``np.take`` per batch (and shard) straight from the maps, the shard and
  row indices of every batch computed before the clock starts; no loader.

Method: every repeat runs each competitor in a shuffled order over one whole
epoch (``num_workers=0``) or its first ``--worker-batches`` batches (workers);
the first repeat is a warm-up; the table shows the median and the best of
``--repeats``. The first batch of a run is untimed (worker start-up). GB/s
counts the stored bytes (2 per token) of the samples delivered.

Mixing (issue 15): which shards a batch draws from, and what reading them
costs. Data: ``--mix-tokens`` uint16 tokens (default 50M) in ``--mix-shards``
uneven shards (16, 0.75x-1.25x the mean), samples of ``--mix-seq-len`` (2048)
tokens, batches of ``--mix-batch-size`` (8), shuffled, ``num_workers=0``,
``int64`` out, one whole epoch per run:

- (d) ``torch.utils.data.DataLoader(shuffle=True)`` over a map-style dataset
  of the same memory maps (``__getitem__`` slices a sample and widens it to
  int64, ``default_collate``): a global permutation, the usual baseline;
- (p) ``ResumableDataLoader(ShardedDataset, batch_size=..., shuffle=True)``:
  loaderkit with a global permutation (``SamplePlan``);
- (mK) ``ResumableDataLoader`` over ``ds.batch_sampler(..., mix_shards=K)``
  for each ``--mix-k``: the shard plan reading K shards at once; ``m1`` is
  the windowed plan of loaderkit 0.1 (one shard at a time);
- (m8wW) the default ``mix_shards=8`` with ``window=W`` for each
  ``--mix-windows`` (the default window is 8192: whole shards here).

Token budgets over shards (plans only, nothing read): ``--budget-docs``
documents of lognormal lengths in 16 uneven shards, ``--max-tokens`` per
batch: shards per batch and padded tokens of a global ``BucketBatchSampler``
and of ``ShardBucketPlan`` with ``mix_shards`` 1 and 8.

Shards per batch (mean distinct shards over the epoch's batches, and the
share of batches from one shard) come from each loader's own order: the
plan's (``ShardPlan.batch_mix``, what ``describe()`` reports) or the
``RandomSampler`` permutation with the DataLoader's seed. Throughput is the
median over ``--mix-repeats`` epochs per loader (after a warm-up, loaders
in a shuffled order each repeat), by wall clock and by this process's CPU
time. The read section above uses the default plan (``mix_shards=8``).

Run: ``python benchmarks/shards/bench.py`` (about 60 s on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import loaderkit
from loaderkit import (
    BucketBatchSampler,
    ResumableDataLoader,
    ShardBucketPlan,
    ShardedDataset,
    TokenReader,
    write_shards,
)
from loaderkit.cli.bench import Ratio, report
from loaderkit.plan.shard import DEFAULT_MIX, BatchMix, batch_mix

SHORT = {
    "a": "int64",
    "a1": "int64, mix_shards=1",
    "a16": "uint16",
    "b": "naive",
    "r": "raw read",
    "r64": "raw + int64",
    "g": "raw gather",
}
NAMES = {
    "a": "(a) ShardedDataset + ResumableDataLoader, int64 out",
    "a1": "(a1) the same, mix_shards=1 (one shard at a time, loaderkit 0.1's plan)",
    "a16": "(a16) ShardedDataset + ResumableDataLoader, uint16 out",
    "b": "(b) naive IterableDataset, get_worker_info() striding",
    "r": "(r) bound: raw contiguous reads of the map (np.array(mm[lo:hi]))",
    "r64": "(r64) bound for int64 out: (r), then .astype(np.int64)",
    "g": "(g) bound for the same rows: np.take of each batch's shuffled rows, uint16",
}


class NaiveShards(IterableDataset[torch.Tensor]):
    """(b): shards in file order, sample-level striding over the DataLoader workers."""

    def __init__(self, paths: list[Path], seq_len: int) -> None:
        self.paths, self.seq_len = paths, seq_len

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        wid, nw = (0, 1) if info is None else (info.id, info.num_workers)
        i, length = 0, self.seq_len
        for path in self.paths:
            tokens = np.load(path, mmap_mode="r")
            for k in range(len(tokens) // length):
                if i % nw == wid:
                    yield torch.from_numpy(tokens[k * length : (k + 1) * length].astype(np.int64))
                i += 1


def raw_batches(paths: list[Path], seq_len: int, batch_size: int) -> Iterator[np.ndarray]:
    span = seq_len * batch_size
    for path in paths:
        tokens = np.load(path, mmap_mode="r")
        usable = len(tokens) // seq_len * seq_len
        for lo in range(0, usable, span):
            yield np.array(tokens[lo : min(lo + span, usable)]).reshape(-1, seq_len)


def gather_batches(
    paths: list[Path], seq_len: int, batch_size: int, window: int
) -> Iterator[np.ndarray]:
    """(g): the rows (a) reads, in its order, gathered straight from the maps (no loader)."""
    ds = ShardedDataset(paths, TokenReader(seq_len=seq_len, out_dtype=None))
    sched = ds.plan(batch_size, seed=0, window=window).schedule(0, start=0, rank=0, world_size=1)
    rows = [ds._handle(s).rows for s in range(len(paths))]  # type: ignore[attr-defined]
    starts = np.cumsum([0, *ds.sizes])
    # Which shard and rows each batch reads: decided before the first (untimed) batch.
    plan: list[list[tuple[int, np.ndarray]]] = []
    for step in range(sched.num_steps):
        idx = sched.indices_numpy(step)
        shard_of = np.searchsorted(starts, idx, side="right") - 1
        plan.append([(s, idx[shard_of == s] - starts[s]) for s in np.unique(shard_of)])
    for parts in plan:
        if len(parts) == 1:
            yield np.take(rows[parts[0][0]], parts[0][1], axis=0)
        else:
            yield np.concatenate([np.take(rows[s], local, axis=0) for s, local in parts])


def raw_batches_int64(paths: list[Path], seq_len: int, batch_size: int) -> Iterator[np.ndarray]:
    for batch in raw_batches(paths, seq_len, batch_size):
        yield batch.astype(np.int64)


def timed(batches: Iterator[Any], limit: int | None = None) -> tuple[float, int]:
    """(seconds, samples) over the batches after the first (untimed) one, up to ``limit``."""
    next(batches)
    samples = 0
    start = time.perf_counter()
    for count, batch in enumerate(batches, 1):
        samples += len(batch)
        if count == limit:
            break
    elapsed = time.perf_counter() - start
    close = getattr(batches, "close", None)
    if callable(close):
        close()  # stop the workers of a run cut short now
    return elapsed, samples


class MemmapTokens(torch.utils.data.Dataset[torch.Tensor]):
    """(d): the shards' memory maps as a map-style dataset, one int64 sample per ``[i]``."""

    def __init__(self, paths: list[Path], seq_len: int) -> None:
        self.maps = [np.load(p, mmap_mode="r") for p in paths]
        self.seq_len = seq_len
        self.ends = np.cumsum([len(m) // seq_len for m in self.maps])

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __getitem__(self, index: int) -> torch.Tensor:
        shard = int(np.searchsorted(self.ends, index, side="right"))
        row = index - int(self.ends[shard - 1] if shard else 0)
        tokens = self.maps[shard][row * self.seq_len : (row + 1) * self.seq_len]
        return torch.from_numpy(tokens.astype(np.int64))


def mix_of(batches: list[np.ndarray], ends: np.ndarray) -> BatchMix:
    """Shards per batch of explicit index batches."""
    flat = np.concatenate(batches)
    bounds = np.concatenate(([0], np.cumsum([len(b) for b in batches])))
    return batch_mix(np.searchsorted(ends, flat, side="right"), bounds)


def mixing(args: argparse.Namespace, tmp: str, rng: np.random.Generator) -> list[Ratio]:
    """The mixing section (module docstring): shards per batch and throughput per loader."""
    n_shards, seq, batch = args.mix_shards, args.mix_seq_len, args.mix_batch_size
    mean = args.mix_tokens // n_shards
    lengths = [int(mean * f) for f in np.linspace(0.75, 1.25, n_shards)]
    data = (rng.integers(0, 50257, n, dtype=np.uint16) for n in lengths)
    paths = write_shards(Path(tmp) / "mix", data, TokenReader(seq_len=seq))
    ds = ShardedDataset(paths, TokenReader(seq_len=seq))
    ends = np.cumsum(ds.sizes)
    print(
        f"## mixing: {n_shards} shards of {min(lengths):,}..{max(lengths):,} uint16 tokens "
        f"({sum(lengths):,} in all, {len(ds):,} samples of {seq} tokens), batch {batch}, "
        f"shuffled, num_workers=0, int64 out; a run is one epoch (first batch untimed); "
        f"median of {args.mix_repeats} repeats after 1 warm-up, wall clock and this "
        "process's CPU time (the latter less sensitive to other load on the machine)\n"
    )
    gen = torch.Generator().manual_seed(0)
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(range(len(ds)), generator=gen), batch, drop_last=False
    )
    torch_loader = DataLoader(MemmapTokens(paths, seq), batch_sampler=sampler)
    global_loader = ResumableDataLoader(ds, batch_size=batch, shuffle=True, seed=0)
    loaders: dict[str, Any] = {"d": torch_loader, "p": global_loader}
    mixes = {
        "d": mix_of([np.asarray(b) for b in sampler], ends),
        "p": mix_of(
            np.split(global_loader.plan.order(0).numpy(), range(batch, len(ds), batch)), ends
        ),
    }
    names = {
        "d": "(d) DataLoader(shuffle=True) over the memory maps: global permutation",
        "p": "(p) ResumableDataLoader(ShardedDataset, shuffle=True): global permutation",
    }
    for k in args.mix_k:
        sampler_k = ds.batch_sampler(batch, seed=0, mix_shards=k)
        loaders[f"m{k}"] = ResumableDataLoader(ds, batch_sampler=sampler_k)
        mixes[f"m{k}"] = sampler_k.plan.batch_mix(0)
        what = "one shard at a time (loaderkit 0.1's windowed plan)" if k == 1 else "at once"
        default = ", the default" if k == DEFAULT_MIX else ""
        names[f"m{k}"] = f"(m{k}) ShardedDataset plan, mix_shards={k}: {k} shard(s) {what}{default}"
    for w in args.mix_windows:  # the default K with other windows inside the shards
        key = f"m{DEFAULT_MIX}w{w}"
        sampler_w = ds.batch_sampler(batch, seed=0, mix_shards=DEFAULT_MIX, window=w)
        loaders[key] = ResumableDataLoader(ds, batch_sampler=sampler_w)
        mixes[key] = sampler_w.plan.batch_mix(0)
        names[key] = f"({key}) ShardedDataset plan, mix_shards={DEFAULT_MIX}, window={w}"
    rates: dict[str, list[float]] = {key: [] for key in loaders}
    cpu_rates: dict[str, list[float]] = {key: [] for key in loaders}
    order = random.Random(1)
    for repeat in range(args.mix_repeats + 1):
        keys = list(loaders)
        order.shuffle(keys)
        for key in keys:
            cpu = time.process_time()
            seconds, count = timed(iter(loaders[key]))
            cpu = time.process_time() - cpu
            if repeat:
                rates[key].append(count / seconds)
                cpu_rates[key].append(count / cpu)
    med = {key: statistics.median(r) for key, r in rates.items()}
    best = {key: max(r) for key, r in rates.items()}
    cpu_med = {key: statistics.median(r) for key, r in cpu_rates.items()}
    print(
        "| loader | shards / batch, mean | single-shard batches | samples/s, median "
        "| vs (d) | vs (m1) | samples/s, best | vs (d) | samples per CPU s, median | vs (d) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in loaders:
        m = mixes[key]
        vs_window = f"{med[key] / med['m1']:.2f}x" if "m1" in med else "-"
        print(
            f"| {names[key]} | {m.mean:.2f} | {m.single:.1%} | {med[key]:,.0f} | "
            f"{med[key] / med['d']:.2f}x | {vs_window} | {best[key]:,.0f} | "
            f"{best[key] / best['d']:.2f}x | {cpu_med[key]:,.0f} | "
            f"{cpu_med[key] / cpu_med['d']:.2f}x |"
        )
    ratios: list[Ratio] = []
    default = f"m{DEFAULT_MIX}"
    if default in med:
        m = mixes[default]
        checks = [
            (f"shards per batch of {batch}, mean", m.mean, 4.0, True, "shards"),
            ("single-shard batches", 100 * m.single, 5.0, False, "%"),
            ("read speed / DataLoader global permutation", med[default] / med["d"], 3.0, True, "x"),
        ]
        print()
        for what, value, goal, higher, unit in checks:
            ratio = Ratio(f"mix_shards={DEFAULT_MIX}: {what}", value, goal, higher, unit)
            ratios.append(ratio)
            print(
                f"goal {ratio.name} {ratio.goal_text()}: {ratio.format()}, "
                + ("met" if ratio.met else "MISSED")
            )
        if "m1" in med:
            ratios.append(
                Ratio(
                    f"mix_shards={DEFAULT_MIX} / mix_shards=1, samples/s", med[default] / med["m1"]
                )
            )
            print(
                f"mix_shards={DEFAULT_MIX} reads at {med[default] / med['m1']:.2f}x the "
                "windowed plan (m1)"
            )
    ratios.append(Ratio("ResumableDataLoader global permutation / DataLoader", med["p"] / med["d"]))
    return ratios


def token_budgets(args: argparse.Namespace) -> None:
    """Shards per batch and padding of token-budget batches over shards (plans only)."""
    sizes = [int(args.budget_docs / 16 * f) for f in np.linspace(0.75, 1.25, 16)]
    rng = np.random.default_rng(2)
    lengths = np.clip(rng.lognormal(5.5, 1.0, sum(sizes)), 16, 4096).astype(np.int64)
    ends = np.cumsum(sizes)
    budget = {"max_tokens": args.max_tokens, "pad_to_multiple_of": 8, "seed": 0}
    print(
        f"\n## token budgets over shards: 16 shards of {min(sizes):,}..{max(sizes):,} documents "
        f"(lognormal lengths exp(N(5.5, 1)) in 16..4096), max_tokens={args.max_tokens}, "
        "pad_to_multiple_of=8; epoch 0 of each plan (no reading: the plans' batches)\n"
    )
    print("| batches | shards / batch, mean | single-shard batches | padded tokens | batches |")
    print("|---|---:|---:|---:|---:|")
    global_plan = BucketBatchSampler(lengths, **budget).plan
    batches = [b.numpy() for b in global_plan.batches(0)]
    rows: list[tuple[str, Any, BatchMix]] = [
        ("BucketBatchSampler, a global shuffle (reads every shard all the time)", global_plan,
         mix_of(batches, ends)),
    ]  # fmt: skip
    for k in (1, DEFAULT_MIX):
        plan = ShardBucketPlan(lengths, shard_sizes=sizes, mix_shards=k, **budget)
        what = "one shard at a time" if k == 1 else "the default"
        rows.append((f"ShardBucketPlan, mix_shards={k} ({what})", plan, plan.batch_mix(0)))
    for name, plan, m in rows:
        real, padded = plan.token_counts(0)
        print(
            f"| {name} | {m.mean:.2f} | {m.single:.1%} | {1 - real / padded:.2%} | {m.batches:,} |"
        )


def make_runners(
    paths: list[Path], args: argparse.Namespace, nw: int
) -> dict[str, Callable[[], tuple[float, int]]]:
    runners: dict[str, Callable[[], tuple[float, int]]] = {}
    limit = args.worker_batches if nw else None
    for key, out_dtype, mix in (
        ("a", torch.int64, DEFAULT_MIX),
        ("a1", torch.int64, 1),
        ("a16", None, DEFAULT_MIX),
    ):
        ds = ShardedDataset(paths, TokenReader(seq_len=args.seq_len, out_dtype=out_dtype))
        sampler = ds.batch_sampler(args.batch_size, seed=0, window=args.window, mix_shards=mix)
        loader = ResumableDataLoader(ds, batch_sampler=sampler, num_workers=nw)
        runners[key] = lambda loader=loader: timed(iter(loader), limit)
    naive = DataLoader(NaiveShards(paths, args.seq_len), batch_size=args.batch_size, num_workers=nw)
    runners["b"] = lambda: timed(iter(naive), limit)
    runners["r"] = lambda: timed(raw_batches(paths, args.seq_len, args.batch_size))
    runners["r64"] = lambda: timed(raw_batches_int64(paths, args.seq_len, args.batch_size))
    runners["g"] = lambda: timed(gather_batches(paths, args.seq_len, args.batch_size, args.window))
    return runners


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32 * 2**20, help="mean tokens per shard")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker-batches", type=int, default=400)
    parser.add_argument("--mix-tokens", type=int, default=50_000_000, help="tokens in all")
    parser.add_argument("--mix-shards", type=int, default=16)
    parser.add_argument("--mix-seq-len", type=int, default=2048)
    parser.add_argument("--mix-batch-size", type=int, default=8)
    parser.add_argument("--mix-k", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--mix-repeats", type=int, default=9)
    parser.add_argument("--budget-docs", type=int, default=200_000, help="documents in all")
    parser.add_argument("--max-tokens", type=int, default=16_384)
    parser.add_argument(
        "--mix-windows", type=int, nargs="*", default=[1, 256], help="windows tried at mix_shards=8"
    )
    args = parser.parse_args()
    t0 = time.perf_counter()

    print(
        f"torch {torch.__version__}, numpy {np.__version__}, loaderkit {loaderkit.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"torch threads {torch.get_num_threads()}"
    )
    print("load average at start (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="loaderkit-bench-shards-") as tmp:
        # Uneven sizes (0.75x .. 1.25x the mean), so windows do not line up with shards.
        scale = np.linspace(0.75, 1.25, args.shards) if args.shards > 1 else np.ones(1)
        lengths = [int(args.tokens * f) for f in scale]
        data = (rng.integers(0, 50257, n, dtype=np.uint16) for n in lengths)
        paths = write_shards(tmp, data, TokenReader(seq_len=args.seq_len))
        samples = sum(n // args.seq_len for n in lengths)
        print(
            f"data {args.shards} shards of {min(lengths):,}..{max(lengths):,} uint16 tokens = "
            f"{sum(lengths) * 2 / 2**20:.0f} MiB (page cache), {samples:,} samples of "
            f"{args.seq_len} tokens, batch {args.batch_size}, window {args.window}; "
            f"{args.repeats} repeats after 1 warm-up; a run is one epoch (num_workers=0) or "
            f"{args.worker_batches} batches (workers), first batch untimed\n"
        )
        results: dict[int, dict[str, list[float]]] = {}
        order = random.Random(0)
        for nw in args.workers:
            runners = make_runners(paths, args, nw)
            rates: dict[str, list[float]] = {k: [] for k in runners}
            for repeat in range(args.repeats + 1):
                keys = list(runners)
                order.shuffle(keys)
                for key in keys:
                    seconds, n = runners[key]()
                    if repeat:
                        rates[key].append(n / seconds)
            results[nw] = rates

    sample_bytes = args.seq_len * 2
    print("| num_workers | reader | samples/s, median | GB/s, median | samples/s, best |")
    print("|---:|---|---:|---:|---:|")
    for nw, rates in results.items():
        for key in ("a", "a1", "a16", "b", "r", "r64", "g"):
            r = rates[key]
            med = statistics.median(r)
            print(
                f"| {nw} | {NAMES[key]} | {med:,.0f} | {med * sample_bytes / 1e9:.2f} | "
                f"{max(r):,.0f} |"
            )
    print()
    ratios = []  # for `loaderkit bench`
    for nw, rates in results.items():
        med = {k: statistics.median(v) for k, v in rates.items()}
        for k, d in (("a", "r"), ("a16", "r"), ("a", "r64"), ("a16", "g"), ("a", "b")):
            goal = 0.5 if (k, d, nw) == ("a", "r", 0) else None
            name = f"{k}/{d} ({SHORT[k]} / {SHORT[d]}), num_workers={nw}"
            ratios.append(Ratio(name, med[k] / med[d], goal))
        line = ", ".join(
            f"{k}/{d} = {med[k] / med[d]:.2f}x"
            for k, d in (
                ("a", "r"),
                ("a16", "r"),
                ("a", "r64"),
                ("a16", "g"),
                ("g", "r"),
                ("a", "b"),
                ("a", "a1"),
            )
        )
        goal = ""
        if nw == 0:
            met = "met" if med["a"] / med["r"] >= 0.5 else "MISSED"
            goal = f" (goal a/r >= 0.5x at num_workers=0: {met})"
        print(f"num_workers={nw}, median: {line}{goal}")
    with tempfile.TemporaryDirectory(prefix="loaderkit-bench-mix-") as tmp:
        print()
        ratios += mixing(args, tmp, np.random.default_rng(1))
    token_budgets(args)
    print(f"\ntotal bench time {time.perf_counter() - t0:.1f} s")
    report(ratios)


if __name__ == "__main__":
    main()
