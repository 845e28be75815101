"""Shared pieces of the DataModule tests: tiny data on disk, and fits that record their ids.

The resume tests reuse the oracle and the recording model of ``tests/support/helpers.py``
(:func:`~helpers.assert_resume_exact`, :class:`~helpers.IdModule`); this module
only adapts each DataModule's batch to the ``{"id": ..., "x": ...}`` batch that
``IdModule`` records, and runs a fit with checkpoints at every step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from tests.support.helpers import IdModule, fit_or_interrupt, step_checkpoints, trainer_kwargs

__all__ = [
    "AnyBatchModule",
    "FitRun",
    "RecordingModule",
    "fit_recording",
    "make_image_tree",
    "sequence_samples",
    "write_id_token_shards",
]


def sequence_samples(size: int, max_len: int = 24, seed: int = 0) -> list[dict[str, Any]]:
    """``{"id": i, "input_ids": <1-D int64 of random length>}`` samples."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_len + 1, (size,), generator=g)
    return [
        {"id": i, "input_ids": torch.arange(int(n), dtype=torch.long) + i}
        for i, n in enumerate(lengths)
    ]


def write_id_token_shards(root: Path, size: int = 64) -> Path:
    """Token shards under ``root`` where sample ``i`` (``seq_len=4``) is ``[i, i, i, i]``:
    five uneven shards, one of them empty, so streams cross shard ends mid-batch."""
    from loaderkit import TokenReader, write_shards

    cuts = [0, 20, 27, 27, 40, size]
    ids = [np.arange(lo, hi) for lo, hi in itertools.pairwise(cuts)]
    write_shards(root, [np.repeat(a, 4) for a in ids], TokenReader(seq_len=4))
    return root


def write_id_documents(root: Path, size: int = 64) -> Path:
    """Document shards under ``root`` (``TokenReader(eos=0)``): document ``i`` is ``i + 1``
    repeated 1 to 12 times, then the end token 0; five uneven shards."""
    from loaderkit import TokenReader, write_shards

    lengths = np.random.default_rng(7).integers(1, 13, size)
    cuts = [0, 11, 30, 34, 50, size]
    shards = [
        np.concatenate([[i + 1] * int(lengths[i]) + [0] for i in range(lo, hi)])
        for lo, hi in itertools.pairwise(cuts)
    ]
    write_shards(root, shards, TokenReader(eos=0, dtype=np.int32))
    return root


def make_image_tree(
    root: Path, classes: Sequence[str] = ("cat", "dog"), per_class: int = 6
) -> Path:
    """``root/<class>/<k>.png``: small RGB PNGs of random noise (a fixed seed)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            pixels = rng.integers(0, 256, size=(12, 10, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{k}.png")
    return root


def _as_id_batch(batch: Any) -> dict[str, torch.Tensor]:
    """The ``{"id", "x"}`` batch of IdModule from a TensorDataModule or SequenceDataModule batch,
    or a ShardedDataModule token batch whose rows repeat their id (``write_id_token_shards``),
    or its padded documents of ``write_id_documents``."""
    if isinstance(batch, torch.Tensor):  # (B, 4) token rows [i, i, i, i]
        return {"id": batch[:, 0], "x": batch[:, :4].float() / 100}
    if hasattr(batch, "values") and hasattr(batch, "lengths"):  # id documents, padded
        lengths = batch.lengths.float()
        x = torch.stack([lengths, batch.values.sum(1).float() / 100, lengths, lengths], 1)
        return {"id": batch.values[:, 0] - 1, "x": x}
    if isinstance(batch, dict):  # SequenceDataModule, dict samples
        lengths = batch["lengths"].float()
        x = torch.stack([lengths, batch["input_ids"].sum(1).float() / 100, lengths, lengths], 1)
        return {"id": batch["id"], "x": x}
    ids, x = batch  # TensorDataModule(ids, features)
    return {"id": ids, "x": x}


class RecordingModule(IdModule):
    """:class:`~helpers.IdModule` for DataModule batches; counts validation batches too."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.val_batches = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(_as_id_batch(batch), batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_batches += 1


class AnyBatchModule(L.LightningModule):
    """Trains on any batch (a parameter times nothing); counts batches and rows per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.rows: dict[int, int] = {}
        self.val_batches = 0
        self.last_batch: Any = None

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        first = batch[0] if isinstance(batch, (tuple, list)) else batch
        if isinstance(first, dict):
            first = next(iter(first.values()))
        elif hasattr(first, "values") and not isinstance(first, torch.Tensor):
            first = first.values
        self.rows[self.current_epoch] = self.rows.get(self.current_epoch, 0) + len(first)
        self.last_batch = batch
        return (self.w - 1).pow(2).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_batches += 1

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@dataclass
class FitRun:
    records: list[dict[str, Any]]
    ckpt_dir: Path | None = None
    model: Any = None
    trainer: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def ckpt(self, step: int) -> Path:
        assert self.ckpt_dir is not None
        path = self.ckpt_dir / f"step{step:03d}.ckpt"
        assert path.exists(), f"no checkpoint at step {step}"
        return path


def fit_recording(
    root: Path,
    make_dm: Callable[[], L.LightningDataModule],
    *,
    fail_at: int | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
    **trainer_overrides: Any,
) -> FitRun:
    """One ``trainer.fit`` of a fresh :class:`RecordingModule` and DataModule.

    With ``fail_at=k`` a checkpoint is written at every step and the run stops
    with :class:`~helpers.Interrupted` at global step k, so the checkpoints of
    every step before k are there to resume from.
    """
    model = RecordingModule(fail_at=fail_at)
    cbs = list(callbacks)
    if fail_at is not None:
        cbs.append(step_checkpoints(root, 1))
    kwargs = trainer_kwargs(enable_checkpointing=fail_at is not None, callbacks=cbs)
    kwargs.update(trainer_overrides)
    trainer = L.Trainer(**kwargs)
    dm = make_dm()
    fit_or_interrupt(trainer, model, dm, interrupted=fail_at is not None, resume=resume)
    return FitRun(model.records, root if fail_at is not None else None, model, trainer)
