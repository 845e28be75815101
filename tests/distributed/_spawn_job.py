"""A ResumableDataLoader passed to ``Trainer(strategy="ddp_spawn", devices=2).fit``.

Run by ``test_ddp_spawn.py``::

    python _spawn_job.py OUT

The launcher pickles the loader into two spawned processes; each rebuilds it on its
own rank (``ResumableDataLoader.__reduce__``) and writes ``OUT/records-rank{R}.json``:
the epoch and ids of every step it trained.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch

from loaderkit import ResumableDataLoader

SIZE, BATCH, EPOCHS = 64, 8, 2


class Recording(L.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.records: list[dict[str, Any]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.records.append({"epoch": self.current_epoch, "ids": batch.tolist()})
        return (self.weight * batch.float()).sum()

    def on_train_end(self) -> None:
        path = Path(self.out) / f"records-rank{self.global_rank}.json"
        path.write_text(json.dumps(self.records))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main(out: str) -> None:
    loader = ResumableDataLoader(torch.arange(SIZE), batch_size=BATCH, shuffle=True, seed=7)
    trainer = L.Trainer(
        strategy="ddp_spawn", devices=2, accelerator="cpu", max_epochs=EPOCHS, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Recording(out), train_dataloaders=loader)


if __name__ == "__main__":
    main(sys.argv[1])
