"""The DDP script of ``tests/distributed/test_trainer_ddp.py``: a ``ShardedDataModule`` on 2
CPU ranks.

``python tests/support/datamodule_ddp.py --data DIR --out DIR [--books DIR]``

With ``--books``, a ``MixedDataModule`` draws 3:1 from ``--data`` and ``--books``
(``epoch_size`` 32) instead.

Trains two epochs on the token shards in ``--data`` (every token of global
sample ``i`` is ``i``) with ``strategy="ddp"``, ``devices=2``, 2 persistent
workers per rank, and writes ``OUT/records-rank{R}.jsonl``: the sample ids of
every trained batch. Lightning's DDP launcher re-runs this command line for
rank 1, so it is a script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

import lightning as L
import torch

from loaderkit.lightning.datamodules import MixedDataModule, ShardedDataModule
from tests.support.helpers import PhaseLog

SEQ_LEN = 4


class RecordIds(L.LightningModule):
    def __init__(self, records: Path) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(SEQ_LEN, 1)
        self.records = records

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        ids = batch[:, 0].tolist()
        record = {"rank": self.global_rank, "epoch": self.current_epoch, "ids": ids}
        with open(self.records, "a") as f:
            f.write(json.dumps(record) + "\n")
        return self.layer(batch.float() / 1000).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--books", type=Path, default=None)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    args.out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    # persistent_workers: see the README's known issue on forking workers under gloo.
    dm: L.LightningDataModule = ShardedDataModule(
        str(args.data), seq_len=SEQ_LEN, batch_size=4, num_workers=2, persistent_workers=True
    )
    if args.books is not None:
        dm = MixedDataModule(
            {"web": str(args.data), "books": str(args.books)},
            {"web": 3, "books": 1},
            epoch_size=32,
            seq_len=SEQ_LEN,
            batch_size=4,
            num_workers=2,
            persistent_workers=True,
        )
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
        callbacks=[PhaseLog()],
    )
    trainer.fit(RecordIds(args.out / f"records-rank{rank}.jsonl"), datamodule=dm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
