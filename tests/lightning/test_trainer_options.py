"""Trainer options that change how the fit loop drives a loader keep resume exact.

The oracle is the one of ``tests/support/helpers.py``: the first k steps of a
run plus the run resumed from its step-k checkpoint equal the uninterrupted
run, over three epochs. k covers a mid-epoch and an end-of-epoch checkpoint.
The options: reloading loaders, limited epochs, validation intervals (int
and float, every n epochs), gradient accumulation, max_steps, and resuming
on fewer and more ranks than were saved (ranks simulated in this process
with explicit ``rank=``/``world_size=``; there the oracle is the global
sequence: each step's batches of all ranks in rank order, which every world
size deals alike). The ``num_workers=2`` cases are slow-marked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import CombinedLoader

from loaderkit import (
    ElasticResume,
    IterableReader,
    ResumableDataLoader,
    StateMismatchError,
    StreamingShardedDataset,
    attach_host,
)
from tests.support.helpers import (
    IdDataModule,
    IdDataset,
    IdModule,
    Interrupted,
    assert_resume_exact,
    by_epoch,
    fit_or_interrupt,
    id_stream_shards,
    no_entry_point_callbacks,
    read_id_shard,
    step_checkpoints,
    trainer_kwargs,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]

SIZE, BATCH, EPOCHS = 40, 4, 3


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


class Run:
    """What one ``fit`` trained on (``records``) and when it validated (``validated``)."""

    def __init__(self, model: IdModule) -> None:
        self.records = model.records
        self.validated = getattr(model, "validated", [])


def fit(
    root: Path,
    options: dict[str, Any],
    *,
    num_workers: int = 0,
    fail_at: int | None = None,
    resume: Path | None = None,
) -> list[dict[str, Any]]:
    """One ``trainer.fit`` over EPOCHS epochs with a fresh model and DataModule."""
    return fit_run(root, options, num_workers=num_workers, fail_at=fail_at, resume=resume).records


def fit_run(
    root: Path,
    options: dict[str, Any],
    *,
    num_workers: int = 0,
    fail_at: int | None = None,
    resume: Path | None = None,
    size: int = SIZE,
    rank: int | None = None,
    world_size: int | None = None,
    epochs: int = EPOCHS,
    extra_callbacks: tuple[Callback, ...] = (),
) -> Run:
    """:func:`fit` with a validation loader where ``limit_val_batches`` asks for one, and
    simulated ranks."""
    validating = options.get("limit_val_batches", 0) != 0
    model = _ValidatingModule(fail_at=fail_at) if validating else IdModule(fail_at=fail_at)
    kind = _WithVal if validating else IdDataModule
    dm = kind(
        size=size, batch_size=BATCH, num_workers=num_workers, rank=rank, world_size=world_size
    )
    callbacks: list[Callback] = [step_checkpoints(root, 1)] if fail_at is not None else []
    callbacks.extend(extra_callbacks)
    trainer = L.Trainer(
        **trainer_kwargs(
            max_epochs=epochs,
            enable_checkpointing=fail_at is not None,
            callbacks=callbacks,
            **options,
        )
    )
    fit_or_interrupt(trainer, model, dm, interrupted=fail_at is not None, resume=resume)
    return Run(model)


def steps_per_epoch(options: dict[str, Any]) -> int:
    limit = options.get("limit_train_batches")
    return limit if isinstance(limit, int) else SIZE // BATCH


OPTIONS = {
    "reload_every_epoch": {"reload_dataloaders_every_n_epochs": 1},
    "limit_train_batches": {"limit_train_batches": 3},
    "limit_and_reload": {"limit_train_batches": 3, "reload_dataloaders_every_n_epochs": 1},
    "val_check_interval_int": {"val_check_interval": 4, "limit_val_batches": 0},
    "val_check_interval_float": {"val_check_interval": 0.5, "limit_val_batches": 1},
    "check_val_every_n_epoch": {"check_val_every_n_epoch": 2, "limit_val_batches": 1},
    "accumulate_grad_batches": {"accumulate_grad_batches": 2},
    # Stops inside the last epoch (EPOCHS * 10 batches would be 30).
    "max_steps": {"max_steps": 25},
}
# The options added for issue 11 also run with workers (slow: each fit starts them).
_WITH_WORKERS = ("val_check_interval_float", "check_val_every_n_epoch", "max_steps")


def _cases() -> list[Any]:
    cases: list[Any] = []
    for name in sorted(OPTIONS):
        for where in ("mid_epoch", "end_of_epoch"):
            cases.append(pytest.param(name, where, 0, id=f"{name}-{where}-0"))
        if name in _WITH_WORKERS:
            cases.append(
                pytest.param(name, "mid_epoch", 2, id=f"{name}-mid_epoch-2", marks=pytest.mark.slow)
            )
    return cases


@pytest.mark.parametrize(("name", "where", "num_workers"), _cases())
def test_resume_is_exact_under_trainer_options(
    tmp_path: Path, name: str, where: str, num_workers: int
) -> None:
    options = OPTIONS[name]
    per_epoch = steps_per_epoch(options)
    k = per_epoch + 1 if where == "mid_epoch" else per_epoch
    full = fit_run(tmp_path / "full", options, num_workers=num_workers)
    before = fit_run(tmp_path / "cut", options, num_workers=num_workers, fail_at=k)
    after = fit_run(
        tmp_path / "resumed",
        options,
        num_workers=num_workers,
        resume=tmp_path / "cut" / f"step{k:03d}.ckpt",
    )
    assert len(full.records) == min(EPOCHS * per_epoch, options.get("max_steps", 10**9))
    assert_resume_exact(full.records, before.records, after.records)
    # Validation runs at the same steps: the resumed epoch is as long as the saved one.
    assert sorted(set(before.validated + after.validated)) == full.validated
    if options.get("limit_val_batches"):
        assert full.validated, "the validation these options schedule never ran"


def _global_sequence(runs: list[Run]) -> dict[int, list[int]]:
    """Per epoch, every rank's batches step by step in rank order: the plan's global order."""
    out: dict[int, list[int]] = {}
    for step in zip(*(run.records for run in runs), strict=True):
        assert len({r["epoch"] for r in step}) == 1, f"ranks in different epochs: {step}"
        for record in step:
            out.setdefault(record["epoch"], []).extend(record["ids"])
    return out


RANKS_SIZE, SAVED_WORLD, RANKS_EPOCHS = 48, 2, 2


@pytest.mark.parametrize(
    ("world_size", "where", "num_workers"),
    [
        (1, "mid_epoch", 0),
        (1, "end_of_epoch", 0),
        (4, "mid_epoch", 0),
        (4, "end_of_epoch", 0),
        pytest.param(1, "mid_epoch", 2, marks=pytest.mark.slow),
        pytest.param(4, "mid_epoch", 2, marks=pytest.mark.slow),
    ],
)
def test_resume_on_fewer_and_more_ranks_is_exact(
    tmp_path: Path, world_size: int, where: str, num_workers: int
) -> None:
    # Saved by 2 ranks (6 steps an epoch), resumed by 1 (12) or 4 (3). The mid-epoch
    # k leaves 32 samples of epoch 1: whole steps for 1 and for 4 ranks.
    per_epoch = RANKS_SIZE // (BATCH * SAVED_WORLD)
    k = per_epoch + 2 if where == "mid_epoch" else per_epoch

    def ranks(root: Path, world: int, **kwargs: Any) -> list[Run]:
        return [
            fit_run(
                root / f"rank{r}",
                {},
                size=RANKS_SIZE,
                rank=r,
                world_size=world,
                epochs=RANKS_EPOCHS,
                num_workers=num_workers,
                extra_callbacks=(ElasticResume(),),
                **kwargs,
            )
            for r in range(world)
        ]

    full = _global_sequence(ranks(tmp_path / "full", 1))
    before = ranks(tmp_path / "cut", SAVED_WORLD, fail_at=k)
    # The state is rank-symmetric: rank 0's checkpoint resumes every rank.
    after = ranks(
        tmp_path / "resumed", world_size, resume=tmp_path / "cut/rank0" / f"step{k:03d}.ckpt"
    )
    steps = {len(run.records) for run in after}
    assert len(steps) == 1, f"resumed ranks step different counts: {steps}"
    joined = _global_sequence(before)
    for epoch, ids in _global_sequence(after).items():
        joined.setdefault(epoch, []).extend(ids)
    assert joined == full, (
        f"saved on {SAVED_WORLD} ranks at step {k}, resumed on {world_size}: the global "
        "sequence differs from the uninterrupted run's"
    )


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


def test_end_of_epoch_resume_on_fewer_ranks_without_elastic_resume_is_an_error(
    tmp_path: Path,
) -> None:
    # Measured: saved on 2 ranks at the end of epoch 0 (6 steps), resumed on 1 rank
    # without ElasticResume, Lightning counted the 6 steps as done in the 12-step epoch 1
    # and trained only 6 of its batches, silently.
    per_epoch = RANKS_SIZE // (BATCH * SAVED_WORLD)
    for r in range(SAVED_WORLD):
        fit_run(
            tmp_path / "cut" / f"rank{r}",
            {},
            size=RANKS_SIZE,
            rank=r,
            world_size=SAVED_WORLD,
            epochs=RANKS_EPOCHS,
            fail_at=per_epoch,
        )
    with (
        no_entry_point_callbacks(),
        pytest.raises(
            StateMismatchError,
            match=rf"counts {per_epoch} batches of epoch 1 as done, but the loader's position is 0 "
            r"batches into it \(on 1 rank\(s\)\).*ElasticResume",
        ),
    ):
        fit_run(
            tmp_path / "resumed",
            {},
            size=RANKS_SIZE,
            rank=0,
            world_size=1,
            epochs=RANKS_EPOCHS,
            resume=tmp_path / "cut/rank0" / f"step{per_epoch:03d}.ckpt",
        )


class _DropsLast(IdDataModule):
    def train_dataloader(self) -> ResumableDataLoader:
        self.loader = ResumableDataLoader(
            IdDataset(self.size),
            batch_size=self.batch_size,
            shuffle=True,
            seed=self.seed,
            drop_last=True,
            rank=self.rank,
            world_size=self.world_size,
        )
        return attach_host(self.loader, self.trainer)


def test_an_elastic_resume_into_a_dropped_tail_names_it(tmp_path: Path) -> None:
    # Saved on 1 rank after 2 of 3 batches (15 samples, batch 4): the 7 left are short of
    # 2 ranks' global step and dropped, and Lightning restarts an epoch with no batch left.
    # The refusal named ElasticResume (there) and step checkpoints (this is one).
    def fit_on(world_size: int, **kwargs: Any) -> None:
        model = IdModule(fail_at=kwargs.pop("fail_at", None))
        dm = _DropsLast(size=15, batch_size=BATCH, rank=0, world_size=world_size)
        callbacks = [step_checkpoints(tmp_path, 1), ElasticResume()]
        trainer = L.Trainer(**trainer_kwargs(enable_checkpointing=True, callbacks=callbacks))
        fit_or_interrupt(trainer, model, dm, interrupted=model.fail_at is not None, **kwargs)

    fit_on(1, fail_at=2)
    with pytest.raises(
        StateMismatchError,
        match=r"saved position 8 of epoch 0 leaves only a tail that drop_last drops on 2 rank",
    ):
        fit_on(2, resume=tmp_path / "step002.ckpt")


class _BudgetModule(L.LightningModule):
    """Trains on token-budget batches of ``_LENGTHS`` (epochs of 14, 14, 13, 14 batches);
    raises once, in ``where`` ("train" or "val"), at epoch ``fail``'s last batch."""

    def __init__(self, fail: int | None = None, where: str = "train") -> None:
        super().__init__()
        self.layer, self.records = torch.nn.Linear(1, 1), []
        self.fail, self.where = fail, where

    def train_dataloader(self) -> ResumableDataLoader:
        from loaderkit import BucketBatchSampler, PadCollate

        data = [torch.full((n,), i) for i, n in enumerate(_LENGTHS)]
        plan = BucketBatchSampler(_LENGTHS, max_tokens=12, shuffle=True, seed=67, window=8)
        return ResumableDataLoader(data, batch_sampler=plan, collate_fn=PadCollate(), seed=67)

    def val_dataloader(self) -> ResumableDataLoader:
        return ResumableDataLoader(list(range(4)), batch_size=2)

    def _raise(self, where: str) -> None:
        last = self.trainer.num_training_batches - 1
        at_last = self.trainer.fit_loop.epoch_loop.batch_progress.current.ready > last
        if self.where == where and self.current_epoch == self.fail and at_last:
            self.fail = None
            raise RuntimeError("interrupted")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._raise("train")
        self.records.append((self.current_epoch, batch.values[:, 0].tolist()))
        return self.layer(torch.ones(1, 1)).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._raise("val")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


_LENGTHS = [1 + (i * 7) % 5 for i in range(36)]


@pytest.mark.parametrize("where", ["train", "val"])
def test_an_exception_at_a_limited_epochs_last_batch_resumes_without_an_extra_batch(
    where: str, tmp_path: Path
) -> None:
    # Measured before: saved by OnExceptionCheckpoint in epoch 2's last step or the validation
    # after it (limit_train_batches=0.3: 4, 4, 3 and 4 batches), the resumed run trained a
    # batch of epoch 2 past its limit (16 batches in all, 15 uninterrupted). The loader's len()
    # was the next epoch's (13: limit 3), so Lightning's count (4 == limit) never ended epoch 2.
    from lightning.pytorch.callbacks import OnExceptionCheckpoint

    kwargs = trainer_kwargs(max_epochs=4, limit_train_batches=0.3, num_sanity_val_steps=0)
    full = _BudgetModule()
    L.Trainer(**kwargs).fit(full)
    assert [sum(e == k for e, _ in full.records) for k in range(4)] == [4, 4, 3, 4]
    failed = _BudgetModule(fail=2, where=where)
    save = OnExceptionCheckpoint(dirpath=tmp_path, filename="interrupted")
    with pytest.raises(RuntimeError, match="interrupted"):
        L.Trainer(**{**kwargs, "enable_checkpointing": True}, callbacks=[save]).fit(failed)
    resumed = _BudgetModule()
    L.Trainer(**kwargs).fit(resumed, ckpt_path=tmp_path / "interrupted.ckpt")
    assert failed.records + resumed.records == full.records


@pytest.mark.parametrize("limit", [0.3, 1.0])
def test_a_validation_end_checkpoint_resumes_exactly_when_epochs_differ_in_length(
    limit: float, tmp_path: Path
) -> None:
    # As above, for a plain checkpoint at each validation's end. Measured before: with limit
    # 0.3 the resume from epoch 1's or 2's trained 16 batches where the whole run trained 15
    # (review 153); without a limit it was refused ("Lightning's fit loop counts 14 batches of
    # epoch 2 as done"): the loader answered the next epoch's length, 13.
    from lightning.pytorch.callbacks import ModelCheckpoint

    kwargs = trainer_kwargs(max_epochs=4, limit_train_batches=limit, num_sanity_val_steps=0)
    save = ModelCheckpoint(tmp_path, "{epoch}", save_top_k=-1, save_on_train_epoch_end=False)
    full = _BudgetModule()
    L.Trainer(**{**kwargs, "enable_checkpointing": True}, callbacks=[save]).fit(full)
    for epoch in (1, 2):
        done = sum(e <= epoch for e, _ in full.records)
        resumed = _BudgetModule()
        L.Trainer(**kwargs).fit(resumed, ckpt_path=tmp_path / f"epoch={epoch}.ckpt")
        assert full.records[:done] + resumed.records == full.records, epoch


class _TorchLoaderModule(_BudgetModule):
    """``_BudgetModule`` with its batch sampler in a plain ``torch.utils.data.DataLoader``."""

    def train_dataloader(self) -> Any:
        from loaderkit import BucketBatchSampler, PadCollate

        data = [torch.full((n,), i) for i, n in enumerate(_LENGTHS)]
        plan = BucketBatchSampler(_LENGTHS, max_tokens=12, shuffle=True, seed=67, window=8)
        return torch.utils.data.DataLoader(data, batch_sampler=plan, collate_fn=PadCollate())


@pytest.mark.parametrize("limit", [0.3, 1.0])
def test_a_batch_sampler_in_a_torch_loader_rebuilt_every_epoch_draws_each_epochs_order(
    limit: float,
) -> None:
    # Measured before: Lightning sets no batch sampler's epoch, so a BucketBatchSampler in a
    # torch DataLoader rebuilt every epoch counted its own iterations: every epoch trained
    # epoch 0's batches, [[3, 18, 20], [33, 5, 30], ...], and limit 0.3 took 4 of each.
    kwargs = trainer_kwargs(max_epochs=4, limit_train_batches=limit)
    kept = _BudgetModule()
    L.Trainer(**kwargs).fit(kept)
    for module in (_TorchLoaderModule(), _BudgetModule()):
        L.Trainer(**kwargs, reload_dataloaders_every_n_epochs=1).fit(module)
        assert module.records == kept.records, type(module).__name__


@pytest.mark.parametrize("limit", [0.3, 1.0])
def test_a_reloaded_loader_resumes_from_an_epochs_last_batch_when_epochs_differ_in_length(
    limit: float, tmp_path: Path
) -> None:
    # Measured before: under reload_dataloaders_every_n_epochs=1, resumed from the step
    # checkpoint of epoch 1's last batch, the loader rebuilt for epoch 2 (13 batches) first
    # answered epoch 0's length (14) and was refused ("epoch 2 yields 13 batches, fewer than
    # the 14 len() first answered ... add loaderkit.ElasticResume()"), which the Trainer had.
    from lightning.pytorch.callbacks import ModelCheckpoint

    kwargs = trainer_kwargs(
        max_epochs=4, limit_train_batches=limit, reload_dataloaders_every_n_epochs=1
    )
    save = ModelCheckpoint(tmp_path, "{step}", save_top_k=-1, every_n_train_steps=1)
    full = _BudgetModule()
    L.Trainer(**{**kwargs, "enable_checkpointing": True}, callbacks=[save]).fit(full)
    for epoch in (0, 1, 2):
        done = sum(e <= epoch for e, _ in full.records)
        resumed = _BudgetModule()
        L.Trainer(**kwargs).fit(resumed, ckpt_path=tmp_path / f"step={done}.ckpt")
        assert full.records[:done] + resumed.records == full.records, epoch


def test_a_batch_sampler_in_a_torch_loader_draws_each_epoch_after_a_max_steps_restart(
    tmp_path: Path,
) -> None:
    # Measured before (review 158): restored from the last.ckpt a max_steps stop wrote
    # mid-epoch, the fit loop's epoch count runs one ahead: epoch 2 drew plan 3, and so on.
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(max_steps: int, root: Path, ckpt: Path | None = None) -> list[Any]:
        module = _TorchLoaderModule()
        save = ModelCheckpoint(root, save_last=True)
        kwargs = trainer_kwargs(max_epochs=-1, max_steps=max_steps, enable_checkpointing=True)
        L.Trainer(**kwargs, callbacks=[save]).fit(module, ckpt_path=ckpt)
        return module.records

    full = fit(55, tmp_path / "full")
    fit(20, tmp_path / "cut")  # epoch 0 (14 steps) and 6 of epoch 1
    resumed = fit(55, tmp_path / "resumed", tmp_path / "cut" / "last.ckpt")
    later = [record for record in full if record[0] >= 2]
    assert [record for record in resumed if record[0] >= 2] == later


def test_a_checkpoint_of_a_fit_resumed_from_an_epochs_last_batch_is_refused(
    tmp_path: Path,
) -> None:
    # Hunter 241: Lightning counts the epochs of a fit resumed from an epoch's last-batch
    # checkpoint one short, so its later step checkpoints read as "epoch ended" and the next
    # resume started that epoch over without the loader state (its batches trained twice).
    per_epoch = SIZE // BATCH

    def run(root: Path, fail_at: int, resume: Path | None = None) -> None:
        trainer = L.Trainer(
            **trainer_kwargs(enable_checkpointing=True, callbacks=[step_checkpoints(root, 1)])
        )
        dm = IdDataModule(size=SIZE, batch_size=BATCH)
        with pytest.raises(Interrupted):
            trainer.fit(IdModule(fail_at=fail_at), datamodule=dm, ckpt_path=resume)

    run(tmp_path / "a", per_epoch)
    last = tmp_path / "a" / f"step{per_epoch:03d}.ckpt"  # epoch 0's last batch
    run(tmp_path / "b", per_epoch + 3, resume=last)
    saved = tmp_path / "b" / f"step{per_epoch + 3:03d}.ckpt"
    # The Lightning internal this guards against: a batch training in an epoch counted as done.
    progress = torch.load(saved, weights_only=False)["loops"]["fit_loop"]["epoch_progress"]
    assert progress["current"]["ready"] == progress["current"]["processed"] == 1
    trainer = L.Trainer(**trainer_kwargs())
    with pytest.raises(StateMismatchError, match="epoch 0 ended while batch 2 of the next"):
        trainer.fit(
            IdModule(), datamodule=IdDataModule(size=SIZE, batch_size=BATCH), ckpt_path=saved
        )


class _EndsEpochsEarly(IdModule):
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        return -1 if batch_idx == 2 else None  # Lightning's documented early epoch end


def test_a_checkpoint_of_an_epoch_ended_early_is_no_miscount(tmp_path: Path) -> None:
    # Review 247: an epoch ended by on_train_batch_start leaves a batch uncompleted too; its
    # epoch-end checkpoints were refused (and trainer.validate with one).
    from lightning.pytorch.callbacks import ModelCheckpoint

    every_epoch = ModelCheckpoint(
        dirpath=tmp_path,
        filename="ep{epoch}",
        every_n_epochs=1,
        save_top_k=-1,
        auto_insert_metric_name=False,
    )
    trainer = L.Trainer(**trainer_kwargs(enable_checkpointing=True, callbacks=[every_epoch]))
    trainer.fit(_EndsEpochsEarly(), datamodule=IdDataModule(size=SIZE, batch_size=BATCH))
    saved = tmp_path / "ep0.ckpt"
    trainer = L.Trainer(**trainer_kwargs())
    trainer.validate(
        _ValidatingModule(), datamodule=_WithVal(size=SIZE, batch_size=BATCH), ckpt_path=saved
    )
    resumed = _EndsEpochsEarly()
    trainer = L.Trainer(**trainer_kwargs())
    trainer.fit(resumed, datamodule=IdDataModule(size=SIZE, batch_size=BATCH), ckpt_path=saved)
    assert [r["epoch"] for r in resumed.records] == [1, 1]


@pytest.mark.parametrize("peek", [False, True])
def test_a_drawn_seed_is_kept_by_a_fit_resumed_from_an_epoch_end_checkpoint(
    peek: bool, tmp_path: Path
) -> None:
    # seed=None: Lightning loads no loader state at an epoch end, and the resumed process drew
    # another seed; epochs 1-2 were another order with other augmentations (hunter 294). A
    # batch read before the fit (a peek at its shapes) settles the drawn seed (review 297).
    from lightning.pytorch.callbacks import ModelCheckpoint

    runs = []
    for draw, ckpt in ((1, None), (2, tmp_path / "epoch=0.ckpt")):
        torch.manual_seed(draw)
        loader = ResumableDataLoader(IdDataset(16), batch_size=BATCH, shuffle=True)
        if peek and ckpt is not None:
            next(iter(loader))
        module = IdModule(keep_x=True)
        save = ModelCheckpoint(tmp_path, "{epoch}", save_top_k=-1)
        kwargs = trainer_kwargs(max_epochs=EPOCHS, enable_checkpointing=True)
        L.Trainer(**kwargs, callbacks=[save]).fit(module, loader, ckpt_path=ckpt)
        runs.append(module)
    full, resumed = runs
    later = [k for k, r in enumerate(full.records) if r["epoch"] >= 1]
    assert [r["ids"] for r in resumed.records] == [full.records[k]["ids"] for k in later]
    assert all(torch.equal(resumed.features[j], full.features[k]) for j, k in enumerate(later))


class _DrawnSeedData(L.LightningDataModule):
    def train_dataloader(self) -> ResumableDataLoader:
        return ResumableDataLoader(IdDataset(16), batch_size=BATCH, shuffle=True)  # seed drawn


@pytest.mark.parametrize("k", [2, 4, 6, 9])
def test_loaders_reloaded_with_a_drawn_seed_resume_exactly(tmp_path: Path, k: int) -> None:
    # Hunter 340: each loader Lightning rebuilt drew a seed from torch's global RNG, which a
    # resumed fit has moved otherwise: the epochs after the resumed one had another order and
    # other augmentations. The fit's loaders keep their first (or loaded) seed.
    runs = []
    for ckpt in (None, tmp_path / f"step{k:03d}.ckpt"):
        module = IdModule(keep_x=True)  # seeds torch's RNG, as seed_everything would
        kwargs = trainer_kwargs(
            max_epochs=3, enable_checkpointing=True, reload_dataloaders_every_n_epochs=1
        )
        trainer = L.Trainer(**kwargs, callbacks=[step_checkpoints(tmp_path, 1)])
        trainer.fit(module, datamodule=_DrawnSeedData(), ckpt_path=ckpt)
        runs.append(module)
    full, resumed = runs
    assert len(full.records) == 3 * 16 // BATCH
    assert [r["ids"] for r in resumed.records] == [r["ids"] for r in full.records[k:]]
    assert all(torch.equal(x, y) for x, y in zip(resumed.features, full.features[k:], strict=True))


class _ValDraws(IdModule):
    def __init__(self) -> None:
        super().__init__()
        self.val_x: list[torch.Tensor] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_x.append(batch["x"])


def test_every_evaluation_of_a_checkpoint_reads_the_same_draws(tmp_path: Path) -> None:
    # Hunter 345: Lightning sets an eval loader's epoch to its fit epoch count (0 outside a
    # fit), so trainer.validate(ckpt_path=...) drew other augmentation than the fit's
    # validation of that checkpoint: another metric for the same model.
    class Noisy(L.LightningDataModule):
        def train_dataloader(self) -> ResumableDataLoader:
            return ResumableDataLoader(IdDataset(8, noise=False), batch_size=4, seed=0)

        def val_dataloader(self) -> ResumableDataLoader:
            return ResumableDataLoader(IdDataset(8), batch_size=4, seed=0)  # draws torch.rand

    module = _ValDraws()
    kwargs = trainer_kwargs(max_epochs=3, enable_checkpointing=True)
    trainer = L.Trainer(**kwargs, callbacks=[step_checkpoints(tmp_path, 2)])
    trainer.fit(module, datamodule=Noisy())
    per_epoch = [torch.cat(module.val_x[k : k + 2]) for k in range(0, 6, 2)]
    assert all(torch.equal(x, per_epoch[0]) for x in per_epoch)
    again = _ValDraws()
    L.Trainer(**trainer_kwargs()).validate(again, Noisy(), ckpt_path=tmp_path / "step004.ckpt")
    assert torch.equal(torch.cat(again.val_x), per_epoch[1])
    after = _ValDraws()  # the fit's Trainer, its epoch count at 3 (review 346)
    trainer.validate(after, Noisy())
    assert torch.equal(torch.cat(after.val_x), per_epoch[0])

    class OwnEpochs(_ValDraws):  # an epoch set on the loader stands, even the fit's (review 347)
        def on_validation_epoch_start(self) -> None:
            self.trainer.val_dataloaders.set_epoch(self.current_epoch)

    own = OwnEpochs()
    L.Trainer(**trainer_kwargs(max_epochs=3)).fit(own, datamodule=Noisy())
    drawn = [torch.cat(own.val_x[k : k + 2]) for k in range(0, 6, 2)]
    assert torch.equal(drawn[0], per_epoch[0]) and not torch.equal(drawn[1], drawn[0])


class _StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True  # as EarlyStopping, max_time or a preemption handler


class _FirstOfTwo(IdModule):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return super().training_step(batch.get("a", batch), batch_idx)


@pytest.mark.parametrize(
    "how", ["should_stop", "combined", "limit_train_batches", "min_size_beside_a_stream"]
)
def test_a_fit_stopped_early_is_refused_from_its_epoch_end_checkpoint(
    how: str, tmp_path: Path
) -> None:
    # Lightning counts the stopped epoch as processed and starts the next: 6 of 10 batches of
    # epoch 0 were never trained, with no error (hunter 295). A limited epoch ends as meant.
    from lightning.pytorch.callbacks import ModelCheckpoint

    def loader() -> Any:
        one = ResumableDataLoader(IdDataset(SIZE), batch_size=BATCH, shuffle=True, seed=0)
        if how == "min_size_beside_a_stream":
            # An unsized stream first runs out at 8 batches with is_last_batch False and
            # both loaders 8 in: an epoch's end, refused as an early stop (review 298).
            reader = IterableReader(read_id_shard)
            stream = StreamingShardedDataset(id_stream_shards(32), reader)
            first = ResumableDataLoader(stream, batch_size=BATCH, seed=0)
            return CombinedLoader({"a": first, "b": one}, mode="min_size")
        if how != "combined":
            return one
        # max_size_cycle: the shorter loader has cycled by step 7 (review 297: not refused).
        short = ResumableDataLoader(IdDataset(SIZE // 2), batch_size=BATCH, seed=1)
        return CombinedLoader({"a": one, "b": short}, mode="max_size_cycle")

    ends = how in ("limit_train_batches", "min_size_beside_a_stream")
    stop = {} if ends else {"callbacks": [_StopAt(7)]}
    limit = {"limit_train_batches": 4} if how == "limit_train_batches" else {}
    kwargs = trainer_kwargs(max_epochs=EPOCHS, enable_checkpointing=True, **limit)
    save = ModelCheckpoint(tmp_path, save_last=True)
    callbacks = [save, *stop.get("callbacks", [])]
    L.Trainer(**{**kwargs, "max_epochs": 1 if ends else EPOCHS}, callbacks=callbacks).fit(
        _FirstOfTwo(), loader()
    )
    resumed = _FirstOfTwo()
    if not ends:
        with pytest.raises(StateMismatchError, match=r"stopped early in epoch 0 .*every_n_train"):
            L.Trainer(**kwargs).fit(resumed, loader(), ckpt_path=tmp_path / "last.ckpt")
        return
    L.Trainer(**kwargs).fit(resumed, loader(), ckpt_path=tmp_path / "last.ckpt")
    per_epoch = 4 if limit else 8
    assert [r["epoch"] for r in resumed.records] == [1] * per_epoch + [2] * per_epoch


class _FirstRows(L.LightningModule):
    """Records each train batch's first value per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.firsts: dict[int, list[int]] = {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        rows = batch[0] if isinstance(batch, (tuple, list)) else batch.values
        self.firsts.setdefault(self.current_epoch, []).append(
            int(rows.reshape(len(rows), -1)[0, 0])
        )
        return self.weight.sum() * 0

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("module", ["tensors", "sequences under max_tokens"])
def test_overfit_batches_gets_the_same_unshuffled_batches_every_epoch(module: str) -> None:
    # Hunter 375: Lightning turns a shuffled loader's shuffle off by rebuilding it as a
    # DataLoader, which a ResumableDataLoader is not ("needs to subclass DataLoader").
    from loaderkit.lightning.datamodules import SequenceDataModule, TensorDataModule

    ids = torch.arange(1, 41)
    dm: L.LightningDataModule = TensorDataModule(ids, batch_size=4, seed=0)
    if module != "tensors":
        seqs = [torch.full((int(i) % 7 + 1,), int(i)) for i in ids]
        dm = SequenceDataModule(seqs, batch_size=4, max_tokens=16, seed=0)
    model = _FirstRows()
    L.Trainer(**trainer_kwargs(overfit_batches=2)).fit(model, datamodule=dm)
    assert model.firsts[0] == model.firsts[1] and len(model.firsts[0]) == 2
    if module == "tensors":
        assert model.firsts[0] == [1, 5]  # unshuffled, as Lightning makes a DataLoader's
