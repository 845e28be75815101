"""zstd-compressed token shards vs raw ones: size on disk and epoch throughput.

Data: ``--shards`` ``.npy`` token shards of ``--tokens`` uint16 tokens each,
drawn from a Zipf law over a 50,257-token vocabulary (text-like frequencies:
random uniform tokens would not compress, real text tokens do), samples of
``--seq-len`` (1024) tokens, batches of 32, ``mix_shards=8``, ``--workers``
DataLoader workers.

- (r) raw: ``write_shards(...)``; the shards in the page cache.
- (c) cold: ``write_shards(..., compression="zstd", level=--level)`` read with an
  empty decode cache: every shard is decoded during the epoch, when first read.
- (w) warm: the same, the decoded copies already in the cache (a later epoch,
  process or run on the machine); one untimed epoch first, as for raw.

Each figure is one epoch through ``ResumableDataLoader`` (samples/s, batches
only iterated); median of ``--repeats`` epochs (a fresh decode cache for each
cold one). Goals: warm >= 0.9x raw (the same memory maps), cold >= 0.3x raw.

Usage: ``python benchmarks/compression/bench.py [--shards 8] [--tokens 4000000] [--level 3]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from loaderkit import ResumableDataLoader, ShardedDataset, TokenReader, write_shards
from loaderkit.cli.bench import Ratio, report


def epoch(folder: Path, reader: TokenReader, workers: int) -> float:
    ds = ShardedDataset(folder, reader)
    loader = ResumableDataLoader(
        ds, batch_sampler=ds.batch_sampler(32, seed=0, mix_shards=8), num_workers=workers
    )
    start = time.perf_counter()
    n = sum(len(b) for b in loader)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4_000_000)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--level", type=int, default=3)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    shards = [
        np.minimum(rng.zipf(1.2, args.tokens) - 1, 50_256).astype(np.uint16)
        for _ in range(args.shards)
    ]
    reader = TokenReader(seq_len=args.seq_len, dtype=np.uint16)
    with tempfile.TemporaryDirectory(prefix="loaderkit-bench-zstd-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        raw = write_shards(root / "raw", shards, reader)
        t1 = time.perf_counter()
        packed = write_shards(
            root / "zst", shards, reader, compression="zstd", level=args.level, hash="xxh3_64"
        )
        t2 = time.perf_counter()
        raw_bytes = sum(p.stat().st_size for p in raw)
        zst_bytes = sum(p.stat().st_size for p in packed)
        print(
            f"{args.shards} shards x {args.tokens:,} uint16 tokens (Zipf 1.2), seq_len "
            f"{args.seq_len}, batch 32, mix_shards=8, workers={args.workers}, zstd level "
            f"{args.level}, xxh3_64 hashes"
        )
        print(
            f"size: raw {raw_bytes / 2**20:.1f} MiB, zstd {zst_bytes / 2**20:.1f} MiB "
            f"({raw_bytes / zst_bytes:.2f}x smaller); write {t1 - t0:.2f} s raw, "
            f"{t2 - t1:.2f} s zstd"
        )
        runs: dict[str, list[float]] = {"r": [], "c": [], "w": []}
        epoch(root / "raw", reader, args.workers)  # warm-up: page cache, imports
        for _ in range(args.repeats):
            runs["r"].append(epoch(root / "raw", reader, args.workers))
            cache = root / "cache"
            shutil.rmtree(cache, ignore_errors=True)
            os.environ["LOADERKIT_CACHE_DIR"] = str(cache)
            runs["c"].append(epoch(root / "zst", reader, args.workers))
            # Untimed, as raw's warm-up: the first read of just-written pages is slower
            # (measured: 0.86x right after the decode, then on par with raw).
            epoch(root / "zst", reader, args.workers)
            runs["w"].append(epoch(root / "zst", reader, args.workers))
        med = {k: statistics.median(v) for k, v in runs.items()}
        names = {"r": "raw", "c": "zstd, cold decode cache", "w": "zstd, warm decode cache"}
        for key, name in names.items():
            print(f"  {name:26s} {med[key]:12,.0f} samples/s")
        ratios = [
            Ratio("zstd warm / raw shards, epoch", med["w"] / med["r"], 0.9),
            Ratio("zstd cold / raw shards, epoch", med["c"] / med["r"], 0.3),
            Ratio("raw / zstd bytes on disk", raw_bytes / zst_bytes),
        ]
        for r in ratios:
            print(f"{r.name}: {r.format()} {r.goal_text()}")
        report(ratios)


if __name__ == "__main__":
    main()
