"""Length bucketing: padded tokens and training-step throughput, random batches vs loaderkit.

Three ways to batch the same lengths, each over one whole epoch (every sample once):

- ``random``: a seeded shuffle cut into batches of ``--batch-size`` rows (what
  ``ResumableDataLoader(shuffle=True)`` or a ``RandomSampler`` give);
- ``loaderkit buckets``: ``BucketBatchSampler(lengths, batch_size=--batch-size)``;
- ``loaderkit tokens``: ``BucketBatchSampler(lengths, max_tokens=--max-tokens)``;
  both with the default window (256 batches' worth of samples).

Length distributions: ``uniform`` draws integers in 16..512; ``lognormal`` draws
``exp(N(mu=5.5, sigma=1.0))`` (median ~245 tokens, long tail) clipped to
16..4096, as ``benchmarks/collate`` does (``--lognormal MU SIGMA MAX`` changes it).

Columns:

- *padded %*: padded tokens / all tokens of the padded batches, counted exactly
  over an epoch of ``--samples`` lengths (no sampling);
- *train Mtok/s*: real (non-padding) tokens per second of training steps over
  an epoch of ``--train-samples`` token sequences: ``PadCollate`` pads each
  batch (with the mask), then a small model runs forward and backward:
  ``Embedding(1024, 32) -> Linear(32, 32) -> GELU``, loss = masked mean of the
  squared output. Its cost is proportional to the padded tokens, as a real
  step's is (a real model spends more per token, so bucketing gains more).
  The three competitors run one after another in a shuffled order per repeat,
  after a warm-up; the table shows the median.

Then the samplers' own cost for ``--big`` (10M) uniform lengths: building an
epoch (shuffle, sort, cut) and handing out every batch's indices, next to the
time the measured training steps would take for that epoch.

Run: ``python benchmarks/bucketing/bench.py``  (about a minute on 2 CPU cores)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from loaderkit import BucketBatchSampler, SamplePlan
from loaderkit.cli.bench import Ratio, report
from loaderkit.collate import PadCollate

VOCAB = 1024
WIDTH = 32


def draw_lengths(dist: str, n: int, rng: np.random.Generator, lognormal: list[float]) -> np.ndarray:
    if dist == "uniform":
        return rng.integers(16, 513, n)
    mu, sigma, top = lognormal
    return np.clip(rng.lognormal(mu, sigma, n), 16, top).astype(np.int64)


def random_batches(n: int, batch_size: int, seed: int) -> list[np.ndarray]:
    order = SamplePlan(num_samples=n, batch_size=batch_size, shuffle=True, seed=seed).order(0)
    return list(np.split(order.numpy(), range(batch_size, n, batch_size)))


def bucket_batches(lengths: np.ndarray, seed: int, **kwargs: Any) -> list[np.ndarray]:
    plan = BucketBatchSampler(lengths, seed=seed, rank=0, world_size=1, **kwargs).plan
    return [b.numpy() for b in plan.batches(0)]


def padded_fraction(lengths: np.ndarray, batches: list[np.ndarray]) -> float:
    """Exact: 1 - real / (rows x longest), summed over the batches."""
    flat = np.concatenate(batches)
    starts = np.cumsum([0] + [len(b) for b in batches[:-1]])
    rows = np.diff(np.append(starts, flat.size))
    per_batch = lengths[flat]
    longest = np.maximum.reduceat(per_batch, starts)
    return 1.0 - per_batch.sum() / (rows * longest).sum()


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = nn.functional.gelu(self.proj(self.embed(ids)))
        per_token = out.pow(2).mean(-1)
        return (per_token * mask).sum() / mask.sum()


def train_epoch(
    model: TinyModel, collate: PadCollate, tokens: list[torch.Tensor], batches: list[np.ndarray]
) -> float:
    start = time.perf_counter()
    for idx in batches:
        batch = collate([tokens[i] for i in idx])
        model(batch.values, batch.mask).backward()
        model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def competitors(lengths: np.ndarray, args: argparse.Namespace) -> dict[str, list[np.ndarray]]:
    return {
        f"random, batch {args.batch_size}": random_batches(
            lengths.size, args.batch_size, args.seed
        ),
        f"loaderkit buckets, batch {args.batch_size}": bucket_batches(
            lengths, args.seed, batch_size=args.batch_size
        ),
        f"loaderkit tokens, max_tokens {args.max_tokens}": bucket_batches(
            lengths, args.seed, max_tokens=args.max_tokens
        ),
    }


def bench_distribution(dist: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = np.random.default_rng(args.seed)
    lengths = draw_lengths(dist, args.samples, rng, args.lognormal)
    pads = {name: padded_fraction(lengths, b) for name, b in competitors(lengths, args).items()}

    train_lengths = draw_lengths(dist, args.train_samples, rng, args.lognormal)
    tokens = [torch.from_numpy(rng.integers(0, VOCAB, int(n))) for n in train_lengths]
    runs = competitors(train_lengths, args)
    real = int(train_lengths.sum())
    collate = PadCollate()
    torch.manual_seed(args.seed)
    model = TinyModel()
    for batches in runs.values():  # warm-up: allocator, kernels
        train_epoch(model, collate, tokens, batches[:3])
    times: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for _ in range(args.repeats):
        rng.shuffle(order)
        for name in order:
            times[name].append(train_epoch(model, collate, tokens, runs[name]))
    rows = []
    for name, batches in runs.items():
        seconds = statistics.median(times[name])
        rows.append(
            {
                "dist": dist,
                "name": name,
                "epoch_batches": len(batches),
                "padded": pads[name],
                "train_padded": padded_fraction(train_lengths, batches),
                "mtok_s": real / seconds / 1e6,
                "seconds": seconds,
            }
        )
    return rows


def sampler_cost(args: argparse.Namespace, tok_s: float) -> tuple[list[dict[str, Any]], float]:
    """Seconds per epoch of the samplers themselves over ``--big`` uniform lengths."""
    lengths = np.random.default_rng(args.seed).integers(16, 513, args.big)
    makers: dict[str, Any] = {
        f"random (SamplePlan), batch {args.batch_size}": lambda: SamplePlan(
            num_samples=args.big, batch_size=args.batch_size, shuffle=True, seed=args.seed
        ),
        f"loaderkit buckets, batch {args.batch_size}": lambda: (
            BucketBatchSampler(
                lengths, batch_size=args.batch_size, seed=args.seed, rank=0, world_size=1
            ).plan
        ),
        f"loaderkit tokens, max_tokens {args.max_tokens}": lambda: (
            BucketBatchSampler(
                lengths, max_tokens=args.max_tokens, seed=args.seed, rank=0, world_size=1
            ).plan
        ),
    }
    epoch_seconds = float(lengths.sum()) / tok_s
    rows = []
    for name, make in makers.items():
        t0 = time.perf_counter()
        plan = make()
        t1 = time.perf_counter()
        sched = plan.schedule(0, start=0, rank=0, world_size=1)  # builds the epoch
        t2 = time.perf_counter()
        for step in range(sched.num_steps):
            sched.indices(step)
        t3 = time.perf_counter()
        total = t3 - t0
        rows.append(
            {
                "name": name,
                "setup": t1 - t0,
                "build": t2 - t1,
                "per_batch_us": (t3 - t2) / sched.num_steps * 1e6,
                "batches": sched.num_steps,
                "total": total,
                "share": total / epoch_seconds,
            }
        )
        del plan, sched
    return rows, epoch_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=1_000_000, help="lengths for padded %%")
    parser.add_argument("--train-samples", type=int, default=4096, help="sequences trained on")
    parser.add_argument("--batch-size", type=int, default=64, help="rows of fixed-size batches")
    parser.add_argument("--max-tokens", type=int, default=16384, help="token budget per batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per competitor")
    parser.add_argument("--big", type=int, default=10_000_000, help="lengths for sampler cost")
    parser.add_argument("--seed", type=int, default=0, help="seed of lengths, tokens, samplers")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch default)")
    parser.add_argument(
        "--lognormal",
        type=float,
        nargs=3,
        default=[5.5, 1.0, 4096],
        metavar=("MU", "SIGMA", "MAX"),
        help="lognormal lengths exp(N(MU, SIGMA)) clipped to 16..MAX",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    mu, sigma, top = args.lognormal
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"torch {torch.__version__}, numpy {np.__version__}, {torch.get_num_threads()} torch "
        f"threads, load average {os.getloadavg()[0]:.2f}; seed {args.seed}\n"
        f"lengths: uniform 16..512; lognormal exp(N({mu}, {sigma})) clipped to 16..{top:g}. "
        f"padded % over {args.samples:,} lengths; train Mtok/s = real tokens/s of PadCollate + "
        f"forward/backward over {args.train_samples:,} sequences (median of {args.repeats})\n"
    )
    rows = [r for dist in ("uniform", "lognormal") for r in bench_distribution(dist, args)]
    print(
        "| lengths | batching | padded % | train batches | train padded % | train Mtok/s "
        "| vs random |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        base = next(r for r in rows if r["dist"] == row["dist"] and r["name"].startswith("random"))
        print(
            f"| {row['dist']} | {row['name']} | {100 * row['padded']:.1f} | "
            f"{row['epoch_batches']} | {100 * row['train_padded']:.1f} | {row['mtok_s']:.2f} | "
            f"**{row['mtok_s'] / base['mtok_s']:.2f}x** |"
        )
    loaderkit = [r for r in rows if r["name"].startswith("loaderkit")]
    worst = max(r["padded"] for r in loaderkit)
    verdict = "met" if worst <= 0.03 else "NOT met"
    print(
        f"\ngoal: loaderkit padded tokens <= 3.0% on both distributions: worst "
        f"{100 * worst:.2f}% ({verdict})\n"
    )

    tok_s = (
        next(r["mtok_s"] for r in rows if r["dist"] == "uniform" and "tokens" in r["name"]) * 1e6
    )
    cost, epoch_seconds = sampler_cost(args, tok_s)
    print(
        f"sampler cost per epoch, {args.big:,} uniform lengths (an epoch of the training steps "
        f"above would take {epoch_seconds / 3600:.1f} h at {tok_s / 1e6:.2f} Mtok/s):\n"
    )
    print(
        "| sampler | setup s | epoch build s | per batch us | batches | total s | share of epoch |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in cost:
        print(
            f"| {row['name']} | {row['setup']:.2f} | {row['build']:.2f} | "
            f"{row['per_batch_us']:.1f} | {row['batches']:,} | {row['total']:.2f} | "
            f"{100 * row['share']:.3f}% |"
        )
    print(f"\nbench wall time {time.perf_counter() - start:.0f} s")
    # For `loaderkit bench`: the padding goal per loaderkit row, then the training speed-ups.
    ratios = [
        Ratio(f"padded %, {r['dist']}, {r['name']}", 100 * r["padded"], 3.0, False, "%")
        for r in loaderkit
    ]
    for r in loaderkit:
        base = next(b for b in rows if b["dist"] == r["dist"] and b["name"].startswith("random"))
        ratios.append(
            Ratio(f"tok/s vs random, {r['dist']}, {r['name']}", r["mtok_s"] / base["mtok_s"])
        )
    report(ratios)


if __name__ == "__main__":
    main()
