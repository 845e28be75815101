"""Trainer options that change how the fit loop drives a loader keep resume exact.

The oracle is the one of ``tests/support/helpers.py``: the first k steps of a
run plus the run resumed from its step-k checkpoint equal the uninterrupted
run, over three epochs. k covers a mid-epoch and an end-of-epoch checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from loaderkit import ElasticResume, ResumableDataLoader
from tests.support.helpers import (
    IdDataModule,
    IdModule,
    assert_resume_exact,
    by_epoch,
    fit_or_interrupt,
    step_checkpoints,
    trainer_kwargs,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]

SIZE, BATCH, EPOCHS = 40, 4, 3


def fit(
    root: Path,
    options: dict[str, Any],
    *,
    num_workers: int = 0,
    fail_at: int | None = None,
    resume: Path | None = None,
) -> list[dict[str, Any]]:
    """One ``trainer.fit`` over EPOCHS epochs with a fresh model and DataModule."""
    model = IdModule(fail_at=fail_at)
    dm = IdDataModule(size=SIZE, batch_size=BATCH, num_workers=num_workers)
    callbacks: list[Callback] = [step_checkpoints(root, 1)] if fail_at is not None else []
    trainer = L.Trainer(
        **trainer_kwargs(
            max_epochs=EPOCHS,
            enable_checkpointing=fail_at is not None,
            callbacks=callbacks,
            **options,
        )
    )
    fit_or_interrupt(trainer, model, dm, interrupted=fail_at is not None, resume=resume)
    return model.records


def steps_per_epoch(options: dict[str, Any]) -> int:
    limit = options.get("limit_train_batches")
    return limit if isinstance(limit, int) else SIZE // BATCH


OPTIONS = {
    "reload_every_epoch": {"reload_dataloaders_every_n_epochs": 1},
    "limit_train_batches": {"limit_train_batches": 3},
    "limit_and_reload": {"limit_train_batches": 3, "reload_dataloaders_every_n_epochs": 1},
    "val_check_interval_int": {"val_check_interval": 4, "limit_val_batches": 0},
    "accumulate_grad_batches": {"accumulate_grad_batches": 2},
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
@pytest.mark.parametrize("where", ["mid_epoch", "end_of_epoch"])
def test_resume_is_exact_under_trainer_options(tmp_path: Path, name: str, where: str) -> None:
    options = OPTIONS[name]
    per_epoch = steps_per_epoch(options)
    k = per_epoch + 1 if where == "mid_epoch" else per_epoch
    full = fit(tmp_path / "full", options)
    before = fit(tmp_path / "cut", options, fail_at=k)
    after = fit(tmp_path / "resumed", options, resume=tmp_path / "cut" / f"step{k:03d}.ckpt")
    assert len(full) == EPOCHS * per_epoch
    assert_resume_exact(full, before, after)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_epoch_has_its_own_order_when_loaders_are_rebuilt(
    tmp_path: Path, num_workers: int
) -> None:
    # Measured: Lightning never calls set_epoch on the loader itself, so a loader
    # rebuilt every epoch counted its own iter() calls: every epoch had epoch 0's order.
    rebuilt = fit(tmp_path, {"reload_dataloaders_every_n_epochs": 1}, num_workers=num_workers)
    kept = fit(tmp_path, {}, num_workers=num_workers)
    orders = by_epoch(rebuilt)
    assert len({tuple(ids) for ids in orders.values()}) == EPOCHS
    assert orders == by_epoch(kept)  # the same epochs as one loader kept for the whole fit


def test_limited_epochs_restart_the_order_after_an_end_of_epoch_resume(tmp_path: Path) -> None:
    # Measured: resumed from an end-of-epoch checkpoint under limit_train_batches=3,
    # the loader finished the old epoch's order instead of starting the next.
    options = {"limit_train_batches": 3}
    full = fit(tmp_path / "full", options)
    before = fit(tmp_path / "cut", options, fail_at=3)
    after = fit(tmp_path / "resumed", options, resume=tmp_path / "cut" / "step003.ckpt")
    assert by_epoch(before + after)[1] == by_epoch(full)[1]


class _ValidatingModule(IdModule):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validated: list[tuple[int, int]] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self.validated.append((self.current_epoch, self.global_step))


class _WithVal(IdDataModule):
    def val_dataloader(self) -> ResumableDataLoader:
        data = [{"id": i, "x": torch.zeros(4)} for i in range(4)]
        return ResumableDataLoader(data, batch_size=2, seed=0, rank=0, world_size=1)


def test_resumed_on_fewer_ranks_validates_at_the_end_of_the_resumed_epoch(tmp_path: Path) -> None:
    # Measured: saved on 2 ranks, resumed on 1, the resumed epoch (shorter than len())
    # ended without its validation, with or without ElasticResume.
    def fit_on(world_size: int, **kwargs: Any) -> _ValidatingModule:
        model = _ValidatingModule(fail_at=kwargs.pop("fail_at", None))
        dm = _WithVal(size=64, batch_size=8, rank=0, world_size=world_size)
        callbacks = [step_checkpoints(tmp_path, 1), ElasticResume()]
        trainer = L.Trainer(
            **trainer_kwargs(enable_checkpointing=True, callbacks=callbacks, limit_val_batches=1)
        )
        fit_or_interrupt(trainer, model, dm, interrupted=model.fail_at is not None, **kwargs)
        return model

    fit_on(2, fail_at=2)  # 2 steps of 2 ranks x 8: 32 of 64 samples done
    resumed = fit_on(1, resume=tmp_path / "step002.ckpt")
    # Epoch 0 resumes at step 2 and has 4 steps left on one rank; epoch 1 is whole (8).
    assert resumed.validated == [(0, 6), (1, 14)]
    assert [r["epoch"] for r in resumed.records].count(0) == 4
