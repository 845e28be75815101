"""Train from shards in S3, interrupt, resume: exact, with a bounded local cache.

Needs the ``remote`` extra and a local S3 server for the demo:
``pip install -e '.[remote]' 'moto[server]'``. The script

1. starts moto's S3 server on a free localhost port (nothing leaves the
   machine; dummy credentials),
2. writes token shards straight to ``s3://demo/corpus`` with ``write_shards``
   (shards and their index are uploaded),
3. trains a tiny Lightning model from ``s3://demo/corpus`` with 2 DataLoader
   workers, each fetching the shards of its next batches into a local cache of
   ``--cache-mb`` MiB, and stops in the middle of the second epoch,
4. resumes from the checkpoint in a fresh process state (a fresh, cold cache),
5. checks the batches of 3 + 4 against an uninterrupted run and prints the
   cache's counts (fetched, prefetched, evicted, retries).

With real S3 you only skip 1: ``ShardedDataset("s3://bucket/corpus", reader,
remote=RemoteCache(cache_dir=..., max_bytes=...))``, credentials and endpoint
from the environment (or ``storage_options=``).

Usage: ``python examples/train_from_s3.py [--shards 8] [--num-workers 2] [--out DIR]``

Everything it writes goes under one folder, ``--out`` (default ``runs/train_from_s3``):
the server's log, the three runs' caches and the checkpoints, replaced by the next run
(the resumed run must start with a cold cache).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from loaderkit import (
    ElasticResume,
    RemoteCache,
    ResumableDataLoader,
    ShardedDataset,
    TokenReader,
    attach_host,
    write_shards,
)

SEQ = 32


def start_s3(log: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """moto's S3 server on a free port; returns it and the s3fs storage options."""
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
    options = {"endpoint_url": endpoint, "key": "demo", "secret": "demo"}
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # never ask a cloud metadata service
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True, **options).mkdir("demo")
    return proc, options


class TinyLM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(1024, 16)
        self.out = torch.nn.Linear(16, 1024)
        self.seen: list[list[int]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch[:, 0].tolist())
        x, y = batch[:, :-1], batch[:, 1:]
        logits = self.out(self.emb(x))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 1024), y.reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class S3Data(L.LightningDataModule):
    def __init__(self, url: str, remote: RemoteCache, num_workers: int) -> None:
        super().__init__()
        self.url, self.remote, self.num_workers = url, remote, num_workers
        self.dataset: ShardedDataset | None = None

    def train_dataloader(self) -> ResumableDataLoader:
        self.dataset = ShardedDataset(self.url, TokenReader(seq_len=SEQ), remote=self.remote)
        sampler = self.dataset.batch_sampler(16, seed=0, window=64, mix_shards=2)
        loader = ResumableDataLoader(
            self.dataset, batch_sampler=sampler, num_workers=self.num_workers
        )
        return attach_host(loader, self.trainer)


def fit(data: S3Data, workdir: Path, *, stop_at: int | None, resume: str | None) -> TinyLM:
    model = TinyLM()
    callbacks: list[Any] = [ElasticResume()]
    if stop_at is not None:
        callbacks.append(
            ModelCheckpoint(
                dirpath=workdir,
                filename="step{step}",
                auto_insert_metric_name=False,
                every_n_train_steps=1,
                save_top_k=-1,
            )
        )
    trainer = L.Trainer(
        max_epochs=2,
        max_steps=-1 if stop_at is None else stop_at,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=stop_at is not None,
        callbacks=callbacks,
        default_root_dir=workdir,
    )
    trainer.fit(model, datamodule=data, ckpt_path=resume)
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--cache-mb", type=float, default=1.0)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/train_from_s3"),
        help="the folder everything is written under (default: runs/train_from_s3)",
    )
    args = parser.parse_args(argv)
    if args.shards < 1 or args.num_workers < 0 or args.cache_mb <= 0:
        parser.error(
            f"--shards must be >= 1, --num-workers >= 0 and --cache-mb > 0, got "
            f"{args.shards}, {args.num_workers} and {args.cache_mb}"
        )
    warnings.filterwarnings("ignore")
    args.out.mkdir(parents=True, exist_ok=True)
    # A fresh folder of its own (a cold cache, fresh checkpoints): nothing else in --out is
    # touched; removed once the run succeeds.
    work = Path(tempfile.mkdtemp(prefix="train_from_s3-", dir=args.out))
    rc = run(args, work)
    if rc == 0:
        shutil.rmtree(work, ignore_errors=True)
    return rc


def run(args: argparse.Namespace, work: Path) -> int:
    server, options = start_s3(work / "moto.log")
    try:
        rng = np.random.default_rng(0)
        shards = [
            rng.integers(0, 1024, size=SEQ * int(rng.integers(40, 80))) for _ in range(args.shards)
        ]
        url = "s3://demo/corpus"
        write_shards(
            url, shards, TokenReader(seq_len=SEQ, dtype=np.uint16), storage_options=options
        )
        print(
            f"train_from_s3: wrote {args.shards} shards to {url} "
            f"(moto on {options['endpoint_url']})"
        )

        def data(cache: str) -> S3Data:
            remote = RemoteCache(
                cache_dir=work / cache,
                max_bytes=int(args.cache_mb * 2**20),
                storage_options=options,
                prefetch=2,
            )
            return S3Data(url, remote, args.num_workers)

        full = fit(data("cache-full"), work, stop_at=None, resume=None).seen
        stop = len(full) // 2 + len(full) // 4  # in the middle of the second epoch
        first = fit(data("cache-first"), work / "ckpt", stop_at=stop, resume=None).seen
        resumed_data = data("cache-resumed")
        rest = fit(
            resumed_data, work, stop_at=None, resume=str(work / "ckpt" / f"step{stop}.ckpt")
        ).seen
        exact = first + rest == full
        assert resumed_data.dataset is not None
        info = resumed_data.dataset.describe()["remote"]
        print(
            f"train_from_s3: {len(full)} steps; interrupted at step {stop}, resumed from its "
            f"checkpoint with a cold cache: {'exact' if exact else 'DIFFERENT'} "
            f"({len(first)} + {len(rest)} steps)"
        )
        print(
            "train_from_s3: resumed run's cache: "
            + ", ".join(f"{k} {info[k]}" for k in ("fetched", "prefetched", "hits", "evicted",
                                                    "retries", "over_budget", "unplanned"))
            + f"; {info['cached_bytes']} of {info['max_bytes']} bytes cached"
        )  # fmt: skip
        return 0 if exact else 1
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    sys.exit(main())
