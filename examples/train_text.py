"""Train a byte-level language model on Python's standard library, bucketed by length.

    python examples/train_text.py                        # about a minute on 2 CPU cores
    python examples/train_text.py --max-steps 40         # a short run
    python examples/train_text.py --resume last          # continue from the last checkpoint

Everything it writes goes under one folder, ``--out`` (default ``runs/train_text``):
checkpoints in ``OUT/checkpoints``. A run without ``--resume`` starts afresh (it
replaces the checkpoints of the previous run there).

The corpus is the code blocks of this interpreter's own ``.py`` files
(:class:`loaderkit.lightning.demo.StdlibBytes`: no download), and the model the demo's
small causal convolutional byte model. The data path is one
:class:`~loaderkit.lightning.datamodules.SequenceDataModule`: samples of similar length
are batched together under a token budget (``--max-tokens``, rows x padded
length) and padded by :class:`~loaderkit.PadCollate` with a mask that keeps
the padding out of the loss; 5% of the blocks are held out (seeded) for
validation. Checkpoints are written every ``--ckpt-every`` steps and at the
end (``last.ckpt``); ``--resume`` continues from one at the exact next sample,
mid-epoch included, and says so when the run it continues had already finished
(raise ``--epochs`` or ``--max-steps`` to train on). Runs on CPU or CUDA
unchanged (``accelerator="auto"``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint

from loaderkit import ElasticResume, SequenceDataModule
from loaderkit.lightning.demo import PAD_ID, ByteLM, StdlibBytes


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-samples", type=_positive, default=3000, help="code blocks used")
    parser.add_argument("--max-len", type=_positive, default=256, help="bytes per block, at most")
    parser.add_argument("--max-tokens", type=_positive, default=8192, help="token budget per batch")
    parser.add_argument("--epochs", type=_positive, default=2)
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ckpt-every", type=_positive, default=50, help="steps per checkpoint")
    parser.add_argument(
        "--out",
        "--workdir",
        dest="out",
        type=Path,
        default=Path("runs/train_text"),
        help="the folder everything is written under (default: runs/train_text)",
    )
    parser.add_argument(
        "--resume", default=None, metavar="PATH", help="checkpoint to resume from, or 'last'"
    )
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)
    if args.num_workers < 0:
        parser.error(f"--num-workers must be >= 0, got {args.num_workers}")
    if args.max_len + 1 > args.max_tokens:
        parser.error(
            f"--max-tokens {args.max_tokens} cannot hold one block of --max-len {args.max_len}; "
            f"pass --max-tokens >= {args.max_len + 1}"
        )
    return args


class TextLM(ByteLM):
    """The demo's byte model, with a validation loss."""

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        logits = self(batch["input_ids"])
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        self.log("val_loss", loss, prog_bar=True, batch_size=len(batch["lengths"]))


class LastAtEnd(L.Callback):
    """Writes ``last.ckpt`` at the run's last step too (``max_steps`` or the last epoch's end).

    ModelCheckpoint writes every ``--ckpt-every`` steps only: without this, ``--resume
    last`` after a finished run would train its last steps again. The checkpoint is
    written inside the loop, where Lightning's own checkpoints are, not after ``fit``
    (whose loop state would no longer match the loader's).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.save_checkpoint(self.path)

    def on_train_epoch_end(self, trainer: L.Trainer, *args: Any) -> None:
        stopped = 0 < trainer.max_steps <= trainer.global_step  # the step's checkpoint stays
        last = trainer.max_epochs is not None and trainer.current_epoch + 1 >= trainer.max_epochs
        if last and not stopped:
            trainer.save_checkpoint(self.path)


def datamodule(args: argparse.Namespace) -> SequenceDataModule:
    """The bucketed, padded, seeded, resumable data of this example.

    Also usable by ``loaderkit inspect examples/train_text.py:default_datamodule``
    (with the defaults).
    """
    corpus = StdlibBytes(args.max_samples, max_len=args.max_len + 1)
    return SequenceDataModule(
        [corpus[i] for i in range(len(corpus))],  # {"id", "input_ids", "labels"} per block
        length_key="input_ids",
        max_tokens=args.max_tokens,
        pad_value={"input_ids": PAD_ID, "labels": -100},
        pad_to_multiple_of=8,
        val_fraction=0.05,
        eval_batch_size=64,
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
        seed=args.seed,
    )


def default_datamodule() -> SequenceDataModule:
    """:func:`datamodule` with the command line's defaults (for ``loaderkit inspect``)."""
    return datamodule(parse_args([]))


def resolve_checkpoint(args: argparse.Namespace) -> Path | None:
    if args.resume is None:
        return None
    path = args.out / "checkpoints" / "last.ckpt" if args.resume == "last" else Path(args.resume)
    if not path.is_file():
        raise SystemExit(
            f"train_text.py: error: --resume {args.resume}: no checkpoint at {path}; run once "
            "without --resume first (checkpoints go to --out/checkpoints)"
        )
    return path


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", ".*LeafSpec.*")  # Lightning 2.6 on torch 2.14, harmless
    args = parse_args(argv)
    checkpoint = resolve_checkpoint(args)
    checkpoints = args.out / "checkpoints"
    if checkpoint is None and checkpoints.exists():
        # A new run: the previous run's checkpoints would mix with this one's (last.ckpt).
        shutil.rmtree(checkpoints)
        print(f"train_text: a new run: removed the previous run's checkpoints in {checkpoints}")
    L.seed_everything(args.seed, verbose=False)
    data = datamodule(args)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        accelerator="auto",
        devices=1,
        # Token-budget epochs differ in batch count: ElasticResume lets Lightning re-read it.
        callbacks=[
            ElasticResume(),
            ModelCheckpoint(
                dirpath=checkpoints,
                every_n_train_steps=args.ckpt_every,
                save_top_k=-1,
                save_last=True,
            ),
            LastAtEnd(checkpoints / "last.ckpt"),
        ],
        logger=False,
        enable_model_summary=False,
        enable_progress_bar=not args.no_progress_bar,
        default_root_dir=args.out,
        num_sanity_val_steps=0,
    )
    model = TextLM()
    trainer.fit(model, datamodule=data, ckpt_path=checkpoint)
    if checkpoint is not None and not model.seen_ids:
        print(
            f"train_text: nothing left to train: {checkpoint} is the end of a finished run "
            f"(step {trainer.global_step}, --epochs {args.epochs}, --max-steps {args.max_steps}); "
            "raise --epochs or --max-steps to train on, or run without --resume to start afresh"
        )
        return 0
    info = data.describe()
    start = f"resumed from {checkpoint}, " if checkpoint else ""
    val = trainer.callback_metrics.get("val_loss")  # none before the first epoch ends
    val_text = f"{float(val):.3f}" if val is not None else "not run yet"
    print(
        f"train_text: {start}{trainer.global_step} steps in total, {len(model.seen_ids)} samples "
        f"this run; padding {info['padding_fraction']:.1%} of tokens (max_tokens="
        f"{args.max_tokens}); train loss {model.last_loss:.3f}, val loss {val_text}; "
        f"last checkpoint {checkpoints / 'last.ckpt'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
