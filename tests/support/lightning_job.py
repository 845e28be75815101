"""A training run in its own process, for the kill -9 and DDP resume tests.

Usage::

    python tests/support/lightning_job.py --out DIR [--num-workers N] [--devices D]
        [--every K] [--kill-at K | --fail-at K] [--resume CKPT]
        [--stream [--steps-per-epoch N]]

Writes ``DIR/records-rank{R}.jsonl`` (one line per trained batch, flushed at
once, so a killed run leaves a complete trail), checkpoints every ``--every``
steps as ``DIR/ckpt/step{S:03d}.ckpt``, and ``DIR/loader-state-rank{R}-step{S}.json``:
each rank's own ``loader.state_dict()`` at every checkpoint, to compare with
the one rank 0 wrote into the checkpoint. Exit status 3 means the planned
``--fail-at`` interruption happened.

``--devices 2`` runs Lightning DDP (gloo, CPU). Lightning relaunches this very
command line for rank 1, so it is a script, not test code.
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
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from loaderkit import ElasticResume
from tests.support.helpers import IdDataModule, IdModule, Interrupted, PhaseLog, trainer_kwargs


class DumpLoaderState(Callback):
    """Every rank writes its own loader state at each checkpointed step."""

    def __init__(self, out: Path, every: int) -> None:
        self.out, self.every = out, every

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step % self.every:
            return
        dm = trainer.datamodule
        assert isinstance(dm, IdDataModule) and dm.loader is not None
        path = self.out / f"loader-state-rank{trainer.global_rank}-step{trainer.global_step}.json"
        path.write_text(json.dumps(dm.loader.state_dict(), sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--every", type=int, default=1, help="checkpoint every N steps")
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--resume", type=str, default=None)
    parser.add_argument("--stream", action="store_true", help="a StreamingShardedDataset")
    parser.add_argument("--steps-per-epoch", type=int, default=None)
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")  # keep the logs the tests print on failure readable
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = args.out / "ckpt"
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    kill_when = None
    if args.kill_at is not None:
        kill_when = str(ckpt_dir / f"step{args.kill_at:03d}.ckpt")
    model = IdModule(
        fail_at=args.fail_at,
        kill_at=args.kill_at,
        kill_when=kill_when,
        records_path=str(args.out / f"records-rank{rank}.jsonl"),
    )
    ddp = args.devices > 1
    # Under DDP, workers forked afresh at each epoch intermittently deadlocked in
    # os.fork (see tests/distributed/_train_shards.py): fork them once per fit.
    dm = IdDataModule(
        size=args.size,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        persistent_workers=ddp and args.num_workers > 0,
        stream=args.stream,
        steps_per_epoch=args.steps_per_epoch,
    )
    trainer = L.Trainer(
        **trainer_kwargs(
            devices=args.devices,
            strategy="ddp" if ddp else "auto",
            enable_checkpointing=True,
            callbacks=[
                ModelCheckpoint(
                    dirpath=ckpt_dir,
                    filename="step{step:03d}",
                    auto_insert_metric_name=False,
                    every_n_train_steps=args.every,
                    save_top_k=-1,
                ),
                DumpLoaderState(args.out, args.every),
                # Rewinds the batch Lightning prefetches from a stream without a length.
                ElasticResume(),
                PhaseLog(),
            ],
        )
    )
    try:
        trainer.fit(model, datamodule=dm, ckpt_path=args.resume)
    except Interrupted:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
