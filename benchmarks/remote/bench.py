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

Peers (issue 13), where installed: litdata (``optimize`` chunks with
``TokensLoader``, ``StreamingDataset("s3://...", storage_options=...)``) and
mosaic streaming (``MDSWriter`` shards, ``StreamingDataset(remote="s3://...",
local=cache)``, the endpoint from ``S3_ENDPOINT_URL``) read the same tokens,
written in their own format on the local disk and uploaded to the same server,
with the same sample length, batch size, shuffling and ``num_workers``, one
cold epoch (an empty cache) then one warm epoch (the cache kept), int64
batches from one fast collate. A peer that is not installed, is named in
``--without``, or cannot talk to the custom endpoint is skipped with a message.

Usage: ``python benchmarks/remote/bench.py [--shards 16] [--tokens 2000000] [--workers 2]
[--without litdata mosaic]``
"""

from __future__ import annotations

import argparse
import multiprocessing
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


PEERS = ("litdata", "mosaic")


def stack_int64(samples: list[Any]) -> Any:
    """The peers' collate: rows (uint16 tensors, or mosaic's dicts) -> one int64 batch."""
    import torch

    if isinstance(samples[0], dict):
        samples = [s["tokens"] for s in samples]
    rows = [s.numpy() if isinstance(s, torch.Tensor) else s for s in samples]
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def litdata_rows(path: str) -> Any:
    """litdata ``optimize`` input function: one shard's tokens (TokensLoader concatenates)."""
    import torch

    yield torch.from_numpy(np.load(path).astype(np.int32))


def peer_epoch(loader: Any) -> float:
    start = time.perf_counter()
    samples = sum(len(batch) for batch in loader)
    return samples / (time.perf_counter() - start)


def litdata_epochs(
    local: list[Path], work: Path, options: dict[str, Any], args: argparse.Namespace
) -> tuple[float, float]:
    """(cold, warm) samples/s of litdata reading its chunks from the S3 server."""
    import s3fs
    from litdata import StreamingDataLoader, StreamingDataset, optimize
    from litdata.streaming.item_loader import TokensLoader

    out = work / "litdata"
    method = multiprocessing.get_start_method(allow_none=True)
    optimize(
        fn=litdata_rows,
        inputs=[str(p) for p in local],
        output_dir=str(out),
        chunk_bytes="64MB",
        item_loader=TokensLoader(),
        num_workers=1,
        reorder_files=False,
        verbose=False,
    )
    # optimize() sets the process-wide start method (force=True): put it back, or every
    # later DataLoader here would start its workers under litdata's choice (spawn).
    multiprocessing.set_start_method(method, force=True)
    s3fs.S3FileSystem(skip_instance_cache=True, **options).put(
        str(out) + "/", "bench/litdata/", recursive=True
    )
    storage = {
        "endpoint_url": options["endpoint_url"],
        "aws_access_key_id": options["key"],
        "aws_secret_access_key": options["secret"],
    }
    ds = StreamingDataset(
        "s3://bench/litdata",
        cache_dir=str(work / "litdata-cache"),
        item_loader=TokensLoader(block_size=args.seq_len),
        shuffle=True,
        seed=0,
        storage_options=storage,
    )

    def loader() -> Any:
        return StreamingDataLoader(
            ds, batch_size=args.batch_size, num_workers=args.workers, collate_fn=stack_int64
        )

    return peer_epoch(loader()), peer_epoch(loader())


def mosaic_epochs(
    local: list[Path], work: Path, options: dict[str, Any], args: argparse.Namespace
) -> tuple[float, float]:
    """(cold, warm) samples/s of mosaic streaming reading its shards from the S3 server."""
    import s3fs
    from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    out = work / "mosaic"
    column = f"ndarray:uint16:{args.seq_len}"
    with MDSWriter(out=str(out), columns={"tokens": column}, size_limit=1 << 26) as writer:
        for p in local:
            tokens = np.load(p)
            rows = len(tokens) // args.seq_len
            for row in tokens[: rows * args.seq_len].reshape(rows, args.seq_len):
                writer.write({"tokens": row})
    s3fs.S3FileSystem(skip_instance_cache=True, **options).put(
        str(out) + "/", "bench/mosaic/", recursive=True
    )
    # mosaic's S3 client takes its endpoint and keys from the environment only
    os.environ["S3_ENDPOINT_URL"] = options["endpoint_url"]
    os.environ["AWS_ACCESS_KEY_ID"] = options["key"]
    os.environ["AWS_SECRET_ACCESS_KEY"] = options["secret"]
    ds = StreamingDataset(
        remote="s3://bench/mosaic",
        local=str(work / "mosaic-cache"),
        shuffle=True,
        shuffle_seed=0,
        batch_size=args.batch_size,
    )

    rates = tuple(
        peer_epoch(
            StreamingDataLoader(
                ds, batch_size=args.batch_size, num_workers=args.workers, collate_fn=stack_int64
            )
        )
        for _ in range(2)
    )
    del ds
    clean_stale_shared_memory()
    return rates[0], rates[1]


def peer_rates(
    local: list[Path], work: Path, options: dict[str, Any], args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """Each installed peer's (cold, warm) epoch from the S3 server; a message for the others."""
    runs = {"litdata": litdata_epochs, "mosaic": mosaic_epochs}
    out: dict[str, tuple[float, float]] = {}
    for name, fn in runs.items():
        try:
            if name in args.without:
                raise ImportError(f"{name} hidden by --without")
            out[name] = fn(local, work, options, args)
        except ImportError as exc:
            print(f"skipped {name}: not installed ({exc})")
        except Exception as exc:  # a peer that cannot use the custom endpoint, or fails there
            print(f"skipped {name}: failed against the S3 server at {options['endpoint_url']}: "
                  f"{type(exc).__name__}: {str(exc)[:300]}")  # fmt: skip
    return out


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
    parser.add_argument(
        "--without", nargs="*", default=[], choices=PEERS, help="act as if not installed"
    )
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
        peers = peer_rates(local, work, options, args)
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
        for peer, (cold, warm) in peers.items():
            for what, rate in (("cold", cold), ("warm", warm)):
                print(f"| {peer}, s3://, {what} cache (one epoch) | {rate:,.0f} | "
                      f"{rate / med['l']:.2f}x |")  # fmt: skip
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
        for peer, (cold, warm) in peers.items():
            ratios.append(Ratio(f"loaderkit / {peer}, s3:// cold cache", med["c"] / cold))
            ratios.append(Ratio(f"loaderkit / {peer}, s3:// warm cache", med["w"] / warm))
        print()
        for ratio in ratios:
            if ratio.goal is None:
                print(f"{ratio.name}: {ratio.format()}")
                continue
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
