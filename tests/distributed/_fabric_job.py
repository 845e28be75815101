"""A Lightning Fabric training loop over a ResumableDataLoader on 2 gloo ranks.

Run by ``test_fabric.py``::

    python _fabric_job.py --out DIR [--num-workers N] [--fail-at K] [--resume CKPT]
        [--one-replica]

A plain user loop: the loader is iterated directly (``fabric.setup_dataloaders``
takes only torch DataLoaders; the loader, handed the Fabric with ``attach_host``,
splits across its data-parallel ranks itself), and
after every step rank 0 saves ``{"loader": loader, "epoch", "done", "step"}``
with ``fabric.save`` to ``DIR/ckpt/step{S:03d}.ckpt``; ``--resume`` restores
it with ``fabric.load``. Each rank writes ``DIR/records-rank{R}.jsonl``.
``--fail-at K`` stops both ranks before step K (exit status 3).
``--one-replica`` uses a DDP strategy whose data-parallel group has one
rank, so both processes must get the same batches. Fabric's launcher re-runs
this command line for rank 1, which is why it is a script.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.strategies import DDPStrategy

from loaderkit import ResumableDataLoader, attach_host
from tests.support.helpers import IdDataset, mark_phase

SIZE, BATCH, EPOCHS = 64, 8, 2


class OneDataParallelRank(DDPStrategy):
    """DDP over every process, but one data-parallel replica: all processes are its peers."""

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": 1, "rank": 0}


def train(fabric: L.Fabric, args: argparse.Namespace) -> int:
    rank = fabric.global_rank
    mark_phase(f"rank {rank}: launched")
    loader = ResumableDataLoader(
        IdDataset(SIZE),
        batch_size=BATCH,
        shuffle=True,
        seed=0,
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
    )
    attach_host(loader, fabric)
    per_epoch = len(loader)
    epoch, done, step = 0, 0, 0
    if args.resume is not None:
        rest = fabric.load(args.resume, {"loader": loader})
        epoch, done, step = rest["epoch"], rest["done"], rest["step"]
    if done == per_epoch:  # saved after an epoch's last step: the next one starts
        epoch, done = epoch + 1, 0
    ckpt = args.out / "ckpt"
    records = args.out / f"records-rank{rank}.jsonl"
    while epoch < EPOCHS:
        mark_phase(f"rank {rank}: epoch {epoch}")
        for batch in loader:
            if step == args.fail_at:
                fabric.barrier()
                return 3
            record = {"rank": rank, "epoch": epoch, "step": step, "batch_idx": done}
            record["ids"] = batch["id"].tolist()
            with open(records, "a") as f:
                f.write(json.dumps(record) + "\n")
            step, done = step + 1, done + 1
            state = {"loader": loader, "epoch": epoch, "done": done, "step": step}
            fabric.save(ckpt / f"step{step:03d}.ckpt", state)
        epoch, done = epoch + 1, 0
    mark_phase(f"rank {rank}: done")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--fail-at", type=int, default=None)
    parser.add_argument("--resume", type=Path, default=None)
    parser.add_argument("--one-replica", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    args.out.mkdir(parents=True, exist_ok=True)
    strategy: Any = OneDataParallelRank(process_group_backend="gloo") if args.one_replica else "ddp"
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=strategy)
    return int(fabric.launch(train, args))


if __name__ == "__main__":
    sys.exit(main())
