"""The DDP training script of tests/distributed/test_trainer_ddp.py (one of its jobs).

``python tests/distributed/_train_shards.py --data DIR --out DIR [--devices 2]
[--num-workers 2] [--batch-size 8] [--epochs 2] [--window 16] [--seed 0]``

Trains a tiny model on the token shards in ``--data`` (written by the test with
``write_shards``; every token of global sample ``i`` is ``i``) through a
:class:`~loaderkit.data.sharded.ShardedDataset` and its plan, and writes
``OUT/records-rank{R}.jsonl``: one line per trained batch with the sample ids.
Lightning's DDP launcher re-runs this command line for rank 1, so it is a script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch

from loaderkit import ResumableDataLoader, TokenReader
from loaderkit.data.sharded import ShardedDataset
from tests.support.helpers import PhaseLog

SEQ_LEN = 4


class RecordIds(L.LightningModule):
    def __init__(self, records: Path) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(SEQ_LEN, 1)
        self.records = records

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        record = {
            "rank": self.global_rank,
            "epoch": self.current_epoch,
            "step": self.global_step,
            "batch_idx": batch_idx,
            "ids": batch[:, 0].tolist(),
        }
        with open(self.records, "a") as f:
            f.write(json.dumps(record) + "\n")
        return self.layer(batch.float() / 1000).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class ShardData(L.LightningDataModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args

    def train_dataloader(self) -> Any:
        a = self.args
        ds = ShardedDataset(a.data, TokenReader(seq_len=SEQ_LEN))
        sampler = ds.batch_sampler(a.batch_size, seed=a.seed, window=a.window)
        # persistent_workers: forking a fresh set of workers at every epoch from a
        # DDP (gloo) process intermittently deadlocked the child inside os.fork
        # (1 run in 3 over 6 epochs); forking once per fit did not.
        return ResumableDataLoader(
            ds,
            batch_sampler=sampler,
            num_workers=a.num_workers,
            persistent_workers=a.num_workers > 0,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    args.out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=[PhaseLog()],
    )
    trainer.fit(RecordIds(args.out / f"records-rank{rank}.jsonl"), datamodule=ShardData(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
