"""Epoch throughput from a local S3 server vs local files, with a cold and a warm cache.

Data: ``--shards`` ``.npy`` token shards of about ``--tokens`` uint16 tokens each
(default 16 x 2M tokens, 64 MiB), samples of ``--seq-len`` (1024) tokens,
batches of ``--batch-size`` (32), ``mix_shards=8``, ``--workers`` (2)
DataLoader workers. moto's S3 server runs in its own process on localhost
(``python -m moto.server``), so the bytes cross a real HTTP connection through
s3fs/botocore, as from a bucket (without the network's latency and bandwidth
limits: this measures loaderkit's fetching and cache, not a link).

- (l) local: ``ShardedDataset(local folder)``, the shards in the page cache.
- (c) cold: ``ShardedDataset("s3://...", remote=RemoteCache(empty cache dir))``:
  every shard is fetched during the epoch, ahead of the batches that read it.
- (w) warm: the same, with the cache filled by a previous epoch.

- (h) resumed half epoch: a run stopped in the middle of its epoch resumes on a
  fresh dataset and an empty cache, with whole-file downloads and with
  ``RemoteCache(range_reads=True, block_bytes=1 MiB)``: bytes fetched and
  samples/s of the rest of the epoch (the same batches, checked).

Each figure is one epoch through ``ResumableDataLoader`` (samples/s, the
batches only iterated); median of ``--repeats`` epochs (a fresh cache for each
cold one). Goals: warm >= 0.8x local, cold >= 0.5x local.

Usage: ``python benchmarks/remote/bench.py [--shards 16] [--tokens 2000000] [--workers 2]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from loaderkit import RemoteCache, ResumableDataLoader, ShardedDataset, TokenReader, write_shards
from loaderkit.cli.bench import Ratio, report


def start_s3(log: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=open(log, "wb"),  # noqa: SIM115 - the server's log, open while it runs
        stderr=subprocess.STDOUT,
    )
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
            break
        except OSError:
            time.sleep(0.1)
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    options = {"endpoint_url": endpoint, "key": "bench", "secret": "bench"}
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True, **options).mkdir("bench")
    return proc, options


def epoch(ds: ShardedDataset, args: argparse.Namespace) -> float:
    """Samples per second of one epoch."""
    sampler = ds.batch_sampler(args.batch_size, seed=0, mix_shards=8)
    loader = ResumableDataLoader(ds, batch_sampler=sampler, num_workers=args.workers)
    start = time.perf_counter()
    samples = sum(len(batch) for batch in loader)
    return samples / (time.perf_counter() - start)


def resumed_half(make: Any, args: argparse.Namespace) -> tuple[float, int, list[Any]]:
    """Samples/s and bytes fetched of the second half of an epoch, resumed on a cold cache."""
    ds = make("first")
    sampler = ds.batch_sampler(args.batch_size, seed=0, mix_shards=8)
    loader = ResumableDataLoader(ds, batch_sampler=sampler, num_workers=args.workers)
    it = iter(loader)
    for _ in range(len(loader) // 2):
        next(it)
    state = loader.state_dict()
    del it
    again = make("resumed")
    sampler = again.batch_sampler(args.batch_size, seed=0, mix_shards=8)
    resumed = ResumableDataLoader(again, batch_sampler=sampler, num_workers=args.workers)
    resumed.load_state_dict(state)
    start = time.perf_counter()
    batches = [b[:, :4].clone() for b in resumed]
    rate = sum(len(b) for b in batches) / (time.perf_counter() - start)
    info = again.describe()["remote"]
    return rate, int(info["fetched_bytes"] + info["range_bytes"]), batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=2_000_000)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    server, options = start_s3(work / "moto.log")
    try:
        reader = TokenReader(seq_len=args.seq_len, dtype=np.uint16)
        rng = np.random.default_rng(0)
        sizes = (args.tokens * rng.uniform(0.75, 1.25, args.shards)).astype(np.int64)
        arrays = [rng.integers(0, 50_000, size=int(n), dtype=np.uint16) for n in sizes]
        local = write_shards(work / "local", arrays, reader)
        url = "s3://bench/corpus"
        write_shards(url, arrays, reader, storage_options=options)
        total_mb = sum(p.stat().st_size for p in local) / 2**20

        def remote(cache: Path) -> ShardedDataset:
            cached = RemoteCache(cache_dir=cache, storage_options=options, max_bytes=8 << 30)
            return ShardedDataset(url, reader, remote=cached)

        local_ds = ShardedDataset(local, reader)
        epoch(local_ds, args)  # warm-up: page cache, worker start-up paths
        rates: dict[str, list[float]] = {"l": [], "c": [], "w": []}
        stats: dict[str, Any] = {}
        for r in range(args.repeats):
            rates["l"].append(epoch(local_ds, args))
            cache = work / f"cache-{r}"
            ds = remote(cache)
            rates["c"].append(epoch(ds, args))
            rates["w"].append(epoch(ds, args))
            stats = ds.describe()["remote"]
            shutil.rmtree(cache)
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(
            f"## remote: {args.shards} shards, {total_mb:.0f} MiB of uint16 tokens, samples of "
            f"{args.seq_len} tokens, batch {args.batch_size}, mix_shards=8, num_workers="
            f"{args.workers}; moto's S3 server on localhost (its own process); one epoch per "
            f"figure, median of {args.repeats}\n"
        )
        print("| source | samples/s | vs local |")
        print("|---|---:|---:|")
        names = {"l": "(l) local files", "c": "(c) s3://, cold cache", "w": "(w) s3://, warm cache"}
        for key, name in names.items():
            print(f"| {name} | {med[key]:,.0f} | {med[key] / med['l']:.2f}x |")
        print(
            "\nlast remote dataset's cache (cold + warm epoch): "
            + ", ".join(f"{k} {stats[k]}" for k in ("fetched", "prefetched", "hits", "waited",
                                                     "retries", "evicted", "unplanned"))
        )  # fmt: skip
        half: dict[str, tuple[float, int, list[Any]]] = {}
        for mode in (False, True):

            def make(name: str, mode: bool = mode) -> ShardedDataset:
                cached = RemoteCache(
                    cache_dir=work / f"half-{mode}-{name}",
                    storage_options=options,
                    max_bytes=8 << 30,
                    range_reads=mode,
                    block_bytes=1 << 20,
                )
                return ShardedDataset(url, reader, remote=cached)

            half["r" if mode else "f"] = resumed_half(make, args)
        same = all((a == b).all() for a, b in zip(half["f"][2], half["r"][2], strict=True)) and len(
            half["f"][2]
        ) == len(half["r"][2])
        shard_mb = total_mb
        print(
            f"\n### (h) resumed half epoch (cold cache), {shard_mb:.0f} MiB of shards; "
            f"same batches: {same}\n"
        )
        print("| fetching | MiB fetched | samples/s |")
        print("|---|---:|---:|")
        for key, name in (("f", "whole files"), ("r", "range reads, 1 MiB blocks")):
            print(f"| {name} | {half[key][1] / 2**20:.1f} | {half[key][0]:,.0f} |")
        if not same:
            raise SystemExit("range reads gave other batches than whole files")
        ratios = [
            Ratio("s3:// warm cache / local files", med["w"] / med["l"], 0.8),
            Ratio("s3:// cold cache / local files", med["c"] / med["l"], 0.5),
        ]
        print()
        for ratio in ratios:
            print(
                f"goal {ratio.name} {ratio.goal_text()}: {ratio.format()}, "
                + ("met" if ratio.met else "MISSED")
            )
        report(ratios)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
