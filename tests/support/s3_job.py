"""Training from s3:// under Lightning, in its own process (the kill -9 and DDP tests).

Usage::

    python tests/support/s3_job.py --url s3://bucket/folder --out DIR --cache DIR
        [--devices 1] [--num-workers 2] [--epochs 2] [--kill-at K] [--resume CKPT]

The S3 endpoint and the (dummy) credentials come from the environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...; see
``tests/support/s3.py``), as a user's job would get them. The shards are
``TokenReader(seq_len=4)`` token shards whose every token of sample ``i`` is
``i``; each rank appends one record per trained batch to
``DIR/records-rank{R}.jsonl`` and a checkpoint is kept at every step
(``DIR/ckpt/step{S:03d}.ckpt``). ``--kill-at K`` SIGKILLs the process once step
``K``'s checkpoint is written. At the end each rank writes its dataset's
``describe()`` to ``DIR/describe-rank{R}.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from loaderkit import ElasticResume, RemoteCache, ResumableDataLoader, ShardedDataset, TokenReader
from tests.support.helpers import PhaseLog, trainer_kwargs

SEQ = 4


class RecordIds(L.LightningModule):
    def __init__(self, records: Path, kill_at: int | None, kill_when: Path | None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(SEQ, 1)
        self.records, self.kill_at, self.kill_when = records, kill_at, kill_when

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        record = {
            "rank": self.global_rank,
            "epoch": self.current_epoch,
            "step": self.global_step,
            "ids": batch[:, 0].tolist(),
        }
        with open(self.records, "a") as f:
            f.write(json.dumps(record) + "\n")
        return self.layer(batch.float() / 1000).pow(2).mean()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # After the callbacks' hook: ModelCheckpoint has saved this step.
        if self.kill_at == self.global_step and self.kill_when and self.kill_when.exists():
            os.kill(os.getpid(), signal.SIGKILL)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class S3Data(L.LightningDataModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.dataset: ShardedDataset | None = None

    def train_dataloader(self) -> Any:
        a = self.args
        # Endpoint and credentials: from the environment (botocore reads AWS_ENDPOINT_URL).
        self.dataset = ShardedDataset(
            a.url, TokenReader(seq_len=SEQ), remote=RemoteCache(cache_dir=a.cache, prefetch=2)
        )
        sampler = self.dataset.batch_sampler(4, seed=7, window=8, mix_shards=2)
        return ResumableDataLoader(
            self.dataset,
            batch_sampler=sampler,
            num_workers=a.num_workers,
            # Forked once per fit under DDP (see tests/distributed/_train_shards.py).
            persistent_workers=a.devices > 1 and a.num_workers > 0,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    args.out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    ckpt = args.out / "ckpt"
    kill_when = None if args.kill_at is None else ckpt / f"step{args.kill_at:03d}.ckpt"
    model = RecordIds(args.out / f"records-rank{rank}.jsonl", args.kill_at, kill_when)
    data = S3Data(args)
    trainer = L.Trainer(
        **trainer_kwargs(
            max_epochs=args.epochs,
            devices=args.devices,
            strategy="ddp" if args.devices > 1 else "auto",
            enable_checkpointing=True,
            callbacks=[
                ModelCheckpoint(
                    dirpath=ckpt,
                    filename="step{step:03d}",
                    auto_insert_metric_name=False,
                    every_n_train_steps=1,
                    save_top_k=-1,
                ),
                ElasticResume(),
                PhaseLog(),
            ],
        )
    )
    trainer.fit(model, datamodule=data, ckpt_path=args.resume)
    assert data.dataset is not None
    info = data.dataset.describe()
    (args.out / f"describe-rank{rank}.json").write_text(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
