"""Train a tiny next-token model on token shards with 2 CPU processes (Lightning DDP, gloo).

    python examples/train_shards_ddp.py

The script writes 7 token shards of uneven sizes into ``OUT/shards`` (``--out``,
default ``runs/train_shards_ddp``: everything it writes goes there; a new run
writes them again) with :func:`loaderkit.write_shards` (which also writes their index),
then trains with ``Trainer(strategy="ddp", accelerator="cpu", devices=2)``.
The data path is the three lines in ``train_dataloader``: a
:class:`~loaderkit.data.sharded.ShardedDataset`, its batch sampler (shards shuffled
per epoch, samples shuffled within a window, split across the ranks), and a
:class:`~loaderkit.ResumableDataLoader` with 2 workers per rank.

At the end of each epoch the ranks gather a fingerprint of every sample they
trained on and rank 0 checks that the union is every sample exactly once.
Takes about 15 s on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

from loaderkit import ResumableDataLoader, ShardedDataset, TokenReader, attach_host, write_shards

VOCAB, SEQ_LEN, BATCH = 64, 32, 16
SAMPLES_PER_SHARD = (70, 12, 101, 33, 58, 6, 104)  # 384 = 12 steps x 2 ranks x 16
DATA_ENV = "LOADERKIT_EXAMPLE_SHARDS"  # tells the rank Lightning relaunches where the data is


def token_reader() -> TokenReader:
    # targets=True: each sample has SEQ_LEN + 1 tokens, x = s[:-1], y = s[1:].
    return TokenReader(seq_len=SEQ_LEN, targets=True, dtype=np.uint16)


def write_data(root: Path) -> None:
    """A noisy affine 'language': the next token is (5 t + 3) mod 64, 10% of the time random."""
    rng = np.random.default_rng(0)
    shards = []
    for samples in SAMPLES_PER_SHARD:
        tokens = np.empty(samples * SEQ_LEN + 1, dtype=np.int64)
        tokens[0] = rng.integers(VOCAB)
        noise, random = rng.random(len(tokens)) < 0.1, rng.integers(VOCAB, size=len(tokens))
        for k in range(1, len(tokens)):
            tokens[k] = random[k] if noise[k] else (5 * tokens[k - 1] + 3) % VOCAB
        shards.append(tokens)
    write_shards(root, shards, token_reader())


def fingerprint(batch: torch.Tensor) -> torch.Tensor:
    """One int64 per sample (its tokens, hashed), to check which samples a rank saw."""
    weights = torch.arange(1, batch.shape[1] + 1, dtype=torch.int64) * 1_000_003
    return (batch.long() * weights).sum(dim=1) ^ batch[:, :4].long().sum(dim=1)


class TinyLM(L.LightningModule):
    def __init__(self, expected: torch.Tensor) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.head = torch.nn.Linear(32, VOCAB)
        self.expected = expected  # every sample's fingerprint, sorted
        self.seen: list[torch.Tensor] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(fingerprint(batch))
        x, y = batch[:, :-1], batch[:, 1:]
        loss = torch.nn.functional.cross_entropy(self.head(self.embed(x)).transpose(1, 2), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def on_train_epoch_end(self) -> None:
        everyone = self.all_gather(torch.cat(self.seen)).reshape(-1)  # (ranks, n) -> all
        self.seen = []
        if self.global_rank == 0:
            exact = torch.equal(everyone.sort().values, self.expected)
            loss = float(self.trainer.callback_metrics["loss"])
            print(
                f"epoch {self.current_epoch}: {self.trainer.world_size} ranks x "
                f"{self.trainer.num_training_batches} steps, {len(everyone)} samples, "
                f"{'every sample exactly once' if exact else 'MISMATCH'}; loss {loss:.3f}",
                flush=True,
            )
            if not exact:
                raise RuntimeError("the ranks did not see every sample exactly once")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=3e-2)


class Shards(L.LightningDataModule):
    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root

    def train_dataloader(self) -> Any:
        ds = ShardedDataset(self.root, token_reader())  # sizes come from the index
        sampler = ds.batch_sampler(BATCH, seed=0, window=64)  # rank/world size: from DDP
        # Workers forked once per fit: forking afresh at each epoch from a DDP
        # (gloo) process intermittently deadlocked in os.fork in our tests.
        loader = ResumableDataLoader(
            ds, batch_sampler=sampler, num_workers=2, persistent_workers=True
        )
        return attach_host(loader, self.trainer)  # the loader learns what the trainer knows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/train_shards_ddp"),
        help="the folder everything is written under (default: runs/train_shards_ddp)",
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", ".*(LeafSpec|all_gather is deprecated).*")
    if DATA_ENV not in os.environ:  # the launching process writes the data once, for all ranks
        write_data(args.out / "shards")
        os.environ[DATA_ENV] = str(args.out / "shards")
    root = os.environ[DATA_ENV]
    ds = ShardedDataset(root, token_reader())
    expected = fingerprint(ds.get_batch(np.arange(len(ds)))).sort().values
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=args.out,
    )
    trainer.fit(TinyLM(expected), datamodule=Shards(root))


if __name__ == "__main__":
    main()
