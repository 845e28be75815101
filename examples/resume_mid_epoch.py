"""Kill a training run with SIGKILL mid-epoch, resume it, and check the sample stream is exact.

    python examples/resume_mid_epoch.py            # about 20 s on 2 CPU cores

Everything it writes goes under one folder, ``--out`` (default
``runs/resume_mid_epoch``): the three runs' records and checkpoints, replaced by
the next run.

Three training runs, each a subprocess of this script (``--role train``):

1. an uninterrupted run, the reference;
2. a run that pauses right after its step-``--kill-at`` checkpoint is written,
   in the middle of the second epoch, and is killed there by this process
   with SIGKILL (no exception handler, no ``finally``, no clean-up runs);
3. a run resumed from that checkpoint (``trainer.fit(..., ckpt_path=...)``).

Every run appends the sample ids of each step to a JSON-lines file, flushed
at once, so the killed run leaves a complete trail. The check: the ids of
run 2 plus those of run 3, step by step, equal those of run 1. The samples
carry a random augmentation (``torch.rand`` noise) and the check covers it
too: loaderkit seeds it per sample, so the resumed run draws the same noise.
The exit code is 0 only if both match.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from loaderkit import LoaderDataModule

# Its own folder under --out, removed between runs: never a folder of the user's.
CHECKPOINTS = "resume_mid_epoch-checkpoints"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=_positive, default=240, help="dataset size")
    parser.add_argument("--batch-size", type=_positive, default=8)
    parser.add_argument("--num-workers", type=int, default=2, help="loader workers per run")
    parser.add_argument("--epochs", type=_positive, default=2)
    parser.add_argument(
        "--kill-at", type=_positive, default=None, help="global step (default: mid 2nd epoch)"
    )
    parser.add_argument(
        "--out",
        "--workdir",
        dest="out",
        type=Path,
        default=Path("runs/resume_mid_epoch"),
        help="the folder everything is written under (default: runs/resume_mid_epoch)",
    )
    # Internal: how this script runs itself as the training subprocess.
    parser.add_argument("--role", choices=["main", "train"], default="main", help=argparse.SUPPRESS)
    parser.add_argument("--records", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--pause-at", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--resume", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.num_workers < 0:
        parser.error(f"--num-workers must be >= 0, got {args.num_workers}")
    return args


# ---------------------------------------------------------------- training (subprocess)
# At module level, not inside train(): loader workers started with spawn (the macOS and
# Windows default) unpickle the dataset by its qualified name, which a class defined in a
# function does not have ("Can't pickle local object").
class NoisyIds(torch.utils.data.Dataset):
    """Sample ``i`` is its id and features with random noise (an augmentation)."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int) -> dict[str, Any]:
        # Global RNG on purpose: what torchvision-style augmentations draw from.
        return {"id": index, "x": torch.full((4,), index / self.samples) + torch.rand(4)}


class Data(LoaderDataModule):
    """``samples`` noisy ids as the train split, under loaderkit's loader policy."""

    def __init__(self, samples: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.samples = samples

    def build_datasets(self, stage: str) -> dict[str, Any]:
        return {"train": NoisyIds(self.samples)}


class Model(L.LightningModule):
    """Records ``{"step", "epoch", "ids", "noise"}`` per step; pauses after step ``pause_at``'s
    checkpoint until this script's main process kills it."""

    def __init__(self, records: Path, workdir: Path, pause_at: int | None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.records, self.workdir, self.pause_at = records, workdir, pause_at

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        record = {
            "step": self.global_step,
            "epoch": self.current_epoch,
            "ids": batch["id"].tolist(),
            "noise": round(float(batch["x"].sum()), 5),
        }
        with open(self.records, "a") as f:  # flushed per step: SIGKILL loses nothing
            f.write(json.dumps(record) + "\n")
        return self.layer(batch["x"]).pow(2).mean()

    def on_train_batch_end(self, *_: Any) -> None:
        # Runs after ModelCheckpoint's hook: this step's checkpoint is on disk.
        if self.global_step == self.pause_at:
            (self.workdir / "checkpoint-written").touch()
            time.sleep(600)  # wait for the SIGKILL

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def train(args: argparse.Namespace) -> None:
    """One training run; records ``{"step", "epoch", "ids", "noise"}`` per step."""
    # Keep the output to this script's lines: Lightning's banner repeats for every run.
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    every = args.pause_at or args.kill_at
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
        callbacks=[
            ModelCheckpoint(
                dirpath=args.out / CHECKPOINTS,
                every_n_train_steps=every,
                save_top_k=-1,
                save_last=True,
            )
        ],
    )
    data = Data(
        args.samples,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
        seed=0,
    )
    model = Model(args.records, args.out, args.pause_at)
    trainer.fit(model, datamodule=data, ckpt_path=args.resume)


# ---------------------------------------------------------------- orchestration
def run_child(args: argparse.Namespace, records: Path, *extra: str, kill: bool = False) -> None:
    """Run one training subprocess; with ``kill``, SIGKILL it once its checkpoint is written."""
    records.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--role", "train", "--records", str(records)]
    for flag in ("samples", "batch_size", "num_workers", "epochs", "kill_at", "out"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    # Its own session: the SIGKILL goes to the trainer and its loader workers together.
    proc = subprocess.Popen([*command, *extra], env=env, start_new_session=True)
    marker = args.out / "checkpoint-written"
    while proc.poll() is None:
        if kill and marker.exists():
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            print(f"[resume_mid_epoch] SIGKILL after the step-{args.kill_at} checkpoint")
            return
        time.sleep(0.05)
    if proc.returncode != 0 or kill:
        raise SystemExit(f"the training subprocess ended with exit code {proc.returncode}")


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "train":
        train(args)
        return 0
    steps_per_epoch = -(-args.samples // args.batch_size)
    if steps_per_epoch * args.epochs < 2:
        raise SystemExit(
            f"the run has {steps_per_epoch * args.epochs} step, too few to kill mid-run; raise "
            "--samples or --epochs"
        )
    if args.kill_at is None:
        args.kill_at = steps_per_epoch * (args.epochs - 1) + steps_per_epoch // 2
    if not 1 <= args.kill_at < steps_per_epoch * args.epochs:
        raise SystemExit(
            f"--kill-at must be in 1..{steps_per_epoch * args.epochs - 1} (a step before the "
            f"run ends), got {args.kill_at}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "checkpoint-written").unlink(missing_ok=True)
    shutil.rmtree(args.out / CHECKPOINTS, ignore_errors=True)
    full, before, after = (args.out / f"{n}.jsonl" for n in ("full", "before", "after"))

    print("[resume_mid_epoch] 1/3 uninterrupted run (the reference)")
    run_child(args, full)
    shutil.rmtree(args.out / CHECKPOINTS)  # run 2 must resume from its own checkpoint
    print(f"[resume_mid_epoch] 2/3 run to step {args.kill_at}, killed after its checkpoint")
    run_child(args, before, "--pause-at", str(args.kill_at), kill=True)
    checkpoint = args.out / CHECKPOINTS / "last.ckpt"
    print(f"[resume_mid_epoch] 3/3 resume from {checkpoint}")
    run_child(args, after, "--resume", str(checkpoint))

    reference, joined = read(full), read(before) + read(after)
    killed = len(read(before))
    same_ids = [r["ids"] for r in joined] == [r["ids"] for r in reference]
    same_noise = [r["noise"] for r in joined] == [r["noise"] for r in reference]
    seen = sum(len(r["ids"]) for r in joined)
    print(
        f"killed at step {killed} of {len(reference)} (epoch {joined[killed - 1]['epoch']}, "
        f"mid-epoch); ids before kill + after resume: {seen} samples in {len(joined)} steps"
    )
    print(f"sample stream   {'exact' if same_ids else 'DIFFERENT'} vs the uninterrupted run")
    print(f"augmentation    {'identical' if same_noise else 'DIFFERENT'} (per-sample seeded noise)")
    return 0 if same_ids and same_noise else 1


if __name__ == "__main__":
    sys.exit(main())
