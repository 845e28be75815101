"""Writing a token corpus into shards: loaderkit write_shards vs litdata optimize vs MDSWriter.

Corpus: ``--tokens`` uint16 tokens (Zipf 1.2 over a 50,257-token vocabulary),
cut into ``--shards`` pieces; piece ``i`` is made from seed ``i`` by
``make_piece(i)``, the same function for every writer, called in whichever
process writes it (as litdata's ``optimize(fn, inputs)`` does).

- loaderkit: ``write_shards(dir, range(shards), TokenReader(...), fn=make_piece,
  num_workers=W)``, one ``.npy`` file per piece plus the index; W = 0 and
  ``--workers``.
- litdata: ``optimize(fn=yield make_piece(i), inputs=range(shards),
  item_loader=TokensLoader(), chunk_size=tokens per piece, num_workers=W)``, W = 1
  and ``--workers`` (it has no in-caller mode).
- mosaic: ``MDSWriter`` (one process, as the library offers it), samples of
  ``--seq-len`` tokens as ``bytes``, ``size_limit`` = the piece's bytes.

Uncompressed, no hashes, to a local temporary folder; each figure is the wall
time of the whole write including process start, the median of ``--repeats``.

CPU-bound rows (issue 25): ``write_shards`` with W = 0 and ``--workers``, where
``fn`` makes each of ``--cpu-samples`` samples of a shard by a per-sample numpy
computation of about a millisecond (``cpu_piece``), timed interleaved (0, W, 0,
W, ...) in this process, each call including its writers' start; each ratio is
the median over repeats of the ratio within one repeat (on a shared machine the
load changes between repeats), next to the ceiling the machine gives at that time:
a plain fork ``Pool`` mapping ``fn`` alone. ``--cpu-only`` runs these rows alone.
A competitor that is not installed is skipped with a message (they are not
loaderkit dependencies: ``pip install litdata mosaicml-streaming``, with
``--no-deps`` where their pins conflict; mosaic's package imports transformers
for its dataloader only, so without it a stub is installed, see ``_stub.py``).

Usage: ``python benchmarks/writers/bench.py [--tokens 50000000] [--shards 12] [--workers 2]
[--cpu-only]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np

from loaderkit import TokenReader, write_shards
from loaderkit.cli.bench import Ratio, report


def make_piece(i: int, tokens: int) -> np.ndarray:
    """Piece ``i`` of the corpus: ``tokens`` Zipf-distributed uint16 tokens from seed ``i``."""
    rng = np.random.default_rng(i)
    return np.minimum(rng.zipf(1.2, tokens) - 1, 50_256).astype(np.uint16)


def cpu_piece(i: int, samples: int, seq_len: int) -> np.ndarray:
    """Shard ``i`` of the CPU-bound rows: each sample's tokens are the ranks of a sorted,
    smoothed random walk, a per-sample computation of about a millisecond."""
    out = np.empty((samples, seq_len), dtype=np.uint16)
    for s in range(samples):
        walk = np.cumsum(np.random.default_rng((i, s)).standard_normal(4 * seq_len))
        smooth = np.convolve(walk, np.ones(4) / 4, mode="valid")[::4]
        out[s] = np.argsort(np.argsort(smooth, kind="stable"), kind="stable")[:seq_len] % 50_257
    return out.reshape(-1)


def cpu_rows(args: argparse.Namespace, root: Path) -> list[Ratio]:
    """``--workers`` writers vs the caller on a CPU-bound ``fn``, interleaved in this run,
    and the ceiling the machine gives now: a plain fork ``Pool`` mapping ``fn`` alone."""
    reader = TokenReader(seq_len=args.seq_len, dtype=np.uint16)
    piece = partial(cpu_piece, samples=args.cpu_samples, seq_len=args.seq_len)
    per_sample = timed(lambda _: piece(0), root, 3) / args.cpu_samples
    w = args.workers
    runs: dict[str, Callable[[Path], object]] = {
        "loaderkit w=0": lambda out: write_shards(
            out, range(args.shards), reader, fn=piece, progress=False
        ),
        f"loaderkit w={w}": lambda out: write_shards(
            out, range(args.shards), reader, fn=piece, num_workers=w, progress=False
        ),
        "fn alone, serial": lambda _: [piece(i) for i in range(args.shards)],
        f"fn alone, Pool({w})": lambda _: _pool_map(piece, args.shards, w),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.repeats):
        for name, run in runs.items():
            out = root / f"cpu{r}"
            start = time.perf_counter()
            run(out)
            times[name].append(time.perf_counter() - start)
            shutil.rmtree(out, ignore_errors=True)
    print(
        f"CPU-bound fn: {args.shards} shards x {args.cpu_samples} samples, "
        f"{per_sample * 1e3:.2f} ms per sample, interleaved, median of {args.repeats}"
    )
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"{name:>18}: {med[name]:6.2f} s  [{', '.join(f'{t:.2f}' for t in ts)}]")

    def paired(fast: str, slow: str) -> float:
        """The median over repeats of one repeat's ratio: both ran within seconds."""
        return statistics.median(s / f for s, f in zip(times[slow], times[fast], strict=True))

    lk = paired(f"loaderkit w={w}", "loaderkit w=0")
    ceiling = paired(f"fn alone, Pool({w})", "fn alone, serial")
    return [
        Ratio(f"CPU-bound fn: loaderkit w={w} speed / w=0 (paired)", lk, 1.5),
        Ratio(f"CPU-bound fn, the machine's ceiling now: Pool({w}) speed / serial", ceiling),
    ]


def _pool_map(piece: Callable[[int], np.ndarray], shards: int, workers: int) -> None:
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(piece, range(shards))


def litdata_piece(i: int, tokens: int) -> Iterator[object]:
    import torch

    yield torch.from_numpy(make_piece(i, tokens))


def timed(fn: Callable[[Path], None], root: Path, repeats: int) -> float:
    times = []
    for r in range(repeats):
        out = root / f"run{r}"
        start = time.perf_counter()
        fn(out)
        times.append(time.perf_counter() - start)
        shutil.rmtree(out, ignore_errors=True)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=50_000_000)
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpu-samples", type=int, default=200)
    parser.add_argument("--cpu-only", action="store_true")
    args = parser.parse_args()
    if args.cpu_only:
        with tempfile.TemporaryDirectory(prefix="loaderkit-bench-writers-") as tmp:
            cpu = cpu_rows(args, Path(tmp))
        for r in cpu:
            print(f"{r.name}: {r.format()} {r.goal_text()}")
        report(cpu)
        return
    per = args.tokens // args.shards
    piece = partial(make_piece, tokens=per)
    mib = per * 2 * args.shards / 2**20
    reader = TokenReader(seq_len=args.seq_len, dtype=np.uint16)
    print(
        f"{args.shards} shards x {per:,} uint16 tokens ({per * 2 / 2**20:.1f} MiB each, "
        f"{mib:.0f} MiB in all), Zipf 1.2, local temp folder, median of {args.repeats}; "
        f"{os.cpu_count()} CPUs"
    )
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="loaderkit-bench-writers-") as tmp:
        root = Path(tmp)
        for w in (0, args.workers):
            seconds[f"loaderkit w={w}"] = timed(
                lambda out, w=w: write_shards(
                    out, range(args.shards), reader, fn=piece, num_workers=w, progress=False
                ),
                root,
                args.repeats,
            )
        try:
            from litdata import TokensLoader, optimize
        except ImportError as exc:
            print(f"litdata: skipped, not installed ({exc}); pip install litdata")
        else:
            for w in (1, args.workers):
                seconds[f"litdata w={w}"] = timed(
                    lambda out, w=w: optimize(
                        fn=partial(litdata_piece, tokens=per),
                        inputs=list(range(args.shards)),
                        output_dir=str(out),
                        chunk_size=per,
                        item_loader=TokensLoader(),
                        num_workers=w,
                        verbose=False,
                        start_method="fork",
                    ),
                    root,
                    args.repeats,
                )
        sys.path.insert(0, str(Path(__file__).parent))
        from _stub import stub_transformers

        stubbed = stub_transformers()
        try:
            from streaming import MDSWriter
        except ImportError as exc:
            print(f"mosaic: skipped, not installed ({exc}); pip install mosaicml-streaming")
        else:
            if stubbed:
                print("mosaic: transformers is not installed; stubbed (MDSWriter never uses it)")

            def mds(out: Path) -> None:
                with MDSWriter(
                    out=str(out), columns={"tokens": "bytes"}, size_limit=per * 2 + 4096
                ) as writer:
                    for i in range(args.shards):
                        tokens = piece(i)
                        for lo in range(0, len(tokens) - args.seq_len + 1, args.seq_len):
                            writer.write({"tokens": tokens[lo : lo + args.seq_len].tobytes()})

            seconds["mosaic MDSWriter"] = timed(mds, root, args.repeats)
        cpu = cpu_rows(args, root)
    for name, s in seconds.items():
        print(f"{name:>18}: {s:6.2f} s  {mib / s:7.1f} MiB/s")
    base, par = seconds["loaderkit w=0"], seconds[f"loaderkit w={args.workers}"]
    ratios = [Ratio(f"loaderkit w={args.workers} speed / w=0", base / par, None), *cpu]
    for other in ("litdata w=1", f"litdata w={args.workers}", "mosaic MDSWriter"):
        if other in seconds:
            mine = par if other.endswith(f"w={args.workers}") else base
            label = f"w={args.workers}" if other.endswith(f"w={args.workers}") else "w=0"
            ratios.append(Ratio(f"loaderkit {label} speed / {other}", seconds[other] / mine, 1.0))
    for r in ratios:
        print(f"{r.name}: {r.format()} {r.goal_text()}")
    report(ratios)


if __name__ == "__main__":
    main()
