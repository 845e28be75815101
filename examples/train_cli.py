"""Train from Parquet shards with ``LightningCLI`` and a YAML config.

    python examples/train_cli.py make-data        # 4 demo Parquet files in runs/parquet_cli/data
    python examples/train_cli.py fit --config examples/parquet_cli.yaml

    python examples/train_cli.py make-mix         # two sources in runs/mix_cli/data/{web,books}
    python examples/train_cli.py fit --config examples/mix_cli.yaml

Each config writes under its own folder, ``trainer.default_root_dir``
(``runs/parquet_cli``, ``runs/mix_cli``): LightningCLI's ``config.yaml``
(replaced by the next run) and the checkpoints (a later run's are kept beside
the earlier ones, Lightning naming them ``-v1``...). The data goes where
``make-data``/``make-mix`` are told (the configs' ``shards:`` point there). So
both run twice in a row and one after the other.

The config (``examples/parquet_cli.yaml``) picks the DataModule by class path
(``loaderkit.ShardedDataModule`` with ``reader: parquet``): Parquet files
read a row group at a time, shards shuffled per epoch and split across DDP
ranks and workers exactly once, variable-length ``input_ids`` padded by
``PadCollate`` under a token budget (``max_tokens``), and ``ElasticResume``
so a checkpoint resumes at the exact next sample. Any option can be
overridden from the command line, e.g. ``--data.init_args.shards=s3://bucket/corpus``
(with ``--data.init_args.storage_options``) or ``--trainer.max_steps=20``.

The mix config (``examples/mix_cli.yaml``) trains on two Parquet folders drawn
70/30 per epoch by ``loaderkit.MixedDataModule`` (the smaller one upsampled),
under the same token budget and the same exact resume.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LightningCLI

from loaderkit import ParquetReader, write_shards

VOCAB = 64


class TinyLM(L.LightningModule):
    """A next-token model small enough for a CPU demo: embedding, then a linear layer."""

    def __init__(self, vocab: int = VOCAB, dim: int = 32, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        ids, mask = batch["input_ids"].long(), batch["attention_mask"]
        logits = self.head(self.embed(ids[:, :-1]))
        keep = mask[:, 1:]  # padding stays out of the loss
        loss = F.cross_entropy(logits[keep], ids[:, 1:][keep])
        self.log("loss", loss, prog_bar=True, batch_size=ids.shape[0])
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams["lr"])


def make_data(folder: str, files: int = 4, rows: int = 200, seed: int = 0) -> list[Path]:
    """Demo Parquet shards: rows of 4..48 token ids counting up from a random start."""
    rng = np.random.default_rng(seed)
    tables = []
    for _ in range(files):
        lengths = rng.integers(4, 49, rows)
        starts = rng.integers(0, VOCAB, rows)
        pairs = zip(starts.tolist(), lengths.tolist(), strict=True)
        tables.append({"input_ids": [[(s + k) % VOCAB for k in range(n)] for s, n in pairs]})
    return write_shards(folder, tables, ParquetReader(row_group_size=64))


def main(args: list[str] | None = None) -> None:
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["make-data"]:
        folder = argv[1] if len(argv) > 1 else "runs/parquet_cli/data"
        paths = make_data(folder)
        print(f"train_cli: wrote {len(paths)} Parquet files to {folder}")
        return
    if argv[:1] == ["make-mix"]:
        folder = Path(argv[1] if len(argv) > 1 else "runs/mix_cli/data")
        web = make_data(str(folder / "web"), files=3, rows=200, seed=0)
        books = make_data(str(folder / "books"), files=1, rows=100, seed=1)
        print(f"train_cli: wrote {len(web)} + {len(books)} Parquet files to {folder}/web, /books")
        return
    # overwrite: a second run replaces the config.yaml the first one saved beside its
    # checkpoints (LightningCLI refuses by default).
    LightningCLI(
        TinyLM,
        L.LightningDataModule,
        subclass_mode_data=True,
        save_config_kwargs={"overwrite": True},
        args=argv,
    )


if __name__ == "__main__":
    main()
