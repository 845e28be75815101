"""Train a small CNN on real images, with seeded augmentation, from a folder of PNG files.

    python examples/train_vision.py                      # about a minute on 2 CPU cores
    python examples/train_vision.py --max-steps 20       # a short run

Everything it writes goes under one folder, ``--out`` (default ``runs/train_vision``):
the PNG tree in ``OUT/digits`` (written once, reused by later runs; ``--data-dir``
puts it elsewhere). It writes no checkpoints.

The images are scikit-learn's bundled handwritten digits (1,797 scans of 8x8
pixels, no download: ``pip install -e '.[examples]'``), written once as
PNG files into an ImageFolder tree, ``OUT/digits/{train,val}/<digit>/<n>.png``
(an 80/20 seeded split). :class:`~loaderkit.lightning.datamodules.ImageFolderDataModule`
reads them with torchvision's ``ImageFolder`` and augments the train images
with random crops and rotations. The augmentation is seeded per sample from
``(seed, epoch, index)``, so the batches are the same with any
``num_workers`` and after a resume: the script checks the first batch with
``num_workers=0`` against ``--num-workers`` before training. It then trains 4
epochs (92 steps) and prints the validation accuracy: 95.0% with the default
``--seed 0`` (measured on CPU with torch 2.14.1). Runs on CPU or CUDA
unchanged (``accelerator="auto"``).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from loaderkit import ImageFolderDataModule


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/train_vision"),
        help="the folder everything is written under (default: runs/train_vision)",
    )
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="where the PNG tree goes (default: OUT/digits)"
    )
    parser.add_argument("--image-size", type=_positive, default=24, help="side of the crops")
    parser.add_argument("--batch-size", type=_positive, default=64)
    parser.add_argument("--epochs", type=_positive, default=4)
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress-bar", action="store_true")
    args = parser.parse_args(argv)
    if args.num_workers < 0:
        parser.error(f"--num-workers must be >= 0, got {args.num_workers}")
    if args.data_dir is None:
        args.data_dir = args.out / "digits"
    return args


def write_digits(root: Path, seed: int = 0) -> tuple[int, int]:
    """Write the digits as 8-bit grayscale PNGs under ``root/{train,val}/<digit>/`` (once).

    Returns:
        The number of train and val images.
    """
    from PIL import Image

    try:
        from sklearn.datasets import load_digits
    except ImportError as exc:
        raise SystemExit(
            f"train_vision.py needs scikit-learn for its images ({exc}); "
            "install it with: pip install -e '.[examples]'"
        ) from exc
    images, labels = load_digits(return_X_y=True)
    is_val = np.random.default_rng(seed).random(len(labels)) < 0.2
    done = root / ".complete"  # written last: a half-written tree is rewritten
    if not done.exists():
        for i, (pixels, label) in enumerate(zip(images, labels, strict=True)):
            folder = root / ("val" if is_val[i] else "train") / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            # Values are 0..16: scale to 0..255.
            Image.fromarray((pixels.reshape(8, 8) * 255 / 16).astype(np.uint8)).save(
                folder / f"{i:04d}.png"
            )
        done.touch()
    return int((~is_val).sum()), int(is_val.sum())


def datamodule(args: argparse.Namespace) -> ImageFolderDataModule:
    from torchvision.transforms import v2

    size = args.image_size
    # Digits must not be flipped, and small crops cut strokes off: a gentler
    # augmentation than the module's default. Its randomness is still seeded per sample.
    train_transform = v2.Compose(
        [
            v2.ToImage(),
            v2.RandomResizedCrop(size, scale=(0.7, 1.0), ratio=(0.9, 1.1), antialias=True),
            v2.RandomRotation(10),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize((0.5,) * 3, (0.5,) * 3),
        ]
    )
    return ImageFolderDataModule(
        str(args.data_dir / "train"),
        val_root=str(args.data_dir / "val"),
        image_size=size,
        mean=(0.5, 0.5, 0.5),
        std=(0.5, 0.5, 0.5),
        crop_fraction=1.0,
        train_transform=train_transform,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        persistent_workers=args.num_workers > 0,
        seed=args.seed,
    )


class DigitCNN(L.LightningModule):
    """Two conv blocks and a linear head: enough for >90% on the digits in a few epochs."""

    def __init__(self, lr: float = 3e-3) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(32 * 16, 10),
        )
        self.lr = lr
        self.correct = self.total = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        loss = F.cross_entropy(self(images), labels)
        self.log("loss", loss, prog_bar=True)
        return loss

    def on_validation_epoch_start(self) -> None:
        self.correct = self.total = 0

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels = batch
        self.correct += int((self(images).argmax(1) == labels).sum())
        self.total += len(labels)

    def on_validation_epoch_end(self) -> None:
        # Once per epoch, over every held-out image (what the final line prints).
        self.log("val_acc", self.correct / max(self.total, 1), prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def same_first_batch(data: ImageFolderDataModule, num_workers: int) -> bool:
    """Whether the first augmented train batch is identical with 0 and ``num_workers`` workers."""
    data.setup("fit")
    first = next(iter(data.loader("train", num_workers=0, pin_memory=False)))
    other = next(iter(data.loader("train", num_workers=num_workers, pin_memory=False)))
    return all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", ".*LeafSpec.*")  # Lightning 2.6 on torch 2.14, harmless
    args = parse_args(argv)
    n_train, n_val = write_digits(args.data_dir, seed=0)
    print(f"train_vision: {n_train} train + {n_val} val digit PNGs under {args.data_dir}")
    L.seed_everything(args.seed, verbose=False)
    data = datamodule(args)
    workers = max(args.num_workers, 1)
    same = same_first_batch(data, workers)
    print(
        f"train_vision: seeded augmentation, first batch with num_workers=0 vs {workers}: "
        f"{'identical' if same else 'DIFFERENT'}"
    )
    trainer = L.Trainer(
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=not args.no_progress_bar,
        num_sanity_val_steps=0,
        default_root_dir=args.out,
    )
    model = DigitCNN()
    trainer.fit(model, datamodule=data)
    trainer.validate(model, datamodule=data, verbose=False)
    print(
        f"train_vision: {trainer.global_step} steps, val accuracy "
        f"{model.correct / model.total:.1%} on {model.total} held-out digits"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
