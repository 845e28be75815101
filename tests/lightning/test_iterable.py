"""A torch ``IterableDataset`` passed directly to ``ResumableDataLoader``, under a real Trainer.

Without ``__len__`` Lightning prefetches a batch ahead of the loader, so a
checkpoint is taken while Lightning holds a batch the loader already handed
out. The loader learns that count from the Lightning adapter and leaves the
batch out of its state: the first k steps plus the steps resumed from the
step-k checkpoint equal the uninterrupted run, over two epochs, with no
callback, with ``num_workers`` 0 and 2 (the dataset shards itself by
``get_worker_info()``, the torch docs' pattern).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loaderkit import ResumableDataLoader, attach_host
from tests.support.helpers import (
    IdModule,
    assert_resume_exact,
    by_epoch,
    fit_or_interrupt,
    step_checkpoints,
    trainer_kwargs,
)
from tests.support.streams import Walk

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]

SIZE, BATCH = 48, 4


class WorkerSharded(IterableDataset[dict[str, Any]]):
    """Ids 0..size-1, split between workers by ``get_worker_info()`` (no ``__len__``)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(worker, self.size, workers):
            yield {"id": i, "x": torch.full((4,), i / self.size)}


class IterableModule(L.LightningDataModule):
    def __init__(self, num_workers: int) -> None:
        super().__init__()
        self.num_workers = num_workers

    def train_dataloader(self) -> ResumableDataLoader:
        # The host says how many batches Lightning prefetched from this unsized loader.
        loader = ResumableDataLoader(
            WorkerSharded(SIZE), batch_size=BATCH, num_workers=self.num_workers
        )
        return attach_host(loader, self.trainer)

    def state_dict(self) -> dict[str, Any]:
        return {}


def fit(root: Path, nw: int, *, fail_at: int | None = None, resume: Path | None = None) -> Any:
    model = IdModule(fail_at=fail_at)
    callbacks = [step_checkpoints(root, 1)] if fail_at is not None else []
    trainer = L.Trainer(
        **trainer_kwargs(enable_checkpointing=fail_at is not None, callbacks=callbacks)
    )
    fit_or_interrupt(
        trainer, model, IterableModule(nw), interrupted=fail_at is not None, resume=resume
    )
    return model.records


@pytest.mark.parametrize(
    ("nw", "k"),
    [(0, 3), (0, 14), pytest.param(2, 5, marks=pytest.mark.slow)],
)
def test_unsized_iterable_resumes_exactly_under_the_trainer(
    tmp_path: Path, nw: int, k: int
) -> None:
    full = fit(tmp_path / "full", nw)
    epochs = by_epoch(full)
    assert sorted(epochs[0]) == list(range(SIZE)) == sorted(epochs[1])
    before = fit(tmp_path / "cut", nw, fail_at=k)
    after = fit(tmp_path / "resumed", nw, resume=tmp_path / "cut" / f"step{k:03d}.ckpt")
    assert_resume_exact(full, before, after)


class IdWalk(Walk):
    """Its own iterator, never rewound: each epoch goes on where the last one stopped."""

    def item(self, i: int) -> dict[str, Any]:
        return {"id": i, "x": torch.full((4,), i / SIZE)}


class IdPlace(IterableDataset[dict[str, Any]]):
    """A generator that goes on from the object's place (its state, torchdata-style)."""

    def __init__(self, size: int) -> None:
        self.size, self.i = size, 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while self.i < self.size:
            self.i += 1
            yield {"id": self.i - 1, "x": torch.full((4,), (self.i - 1) / SIZE)}
        self.i = 0

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = state["i"]


class IdRewind(IdPlace):
    """Starts over at each ``iter()`` unless a state was loaded (Hugging Face's pattern)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.start = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.i, self.start = self.start, 0
        return super().__iter__()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = state["i"]


class WalkModule(L.LightningDataModule):
    def __init__(self, kind: type[IterableDataset[Any]] = IdWalk) -> None:
        super().__init__()
        self.kind = kind

    def train_dataloader(self) -> ResumableDataLoader:
        data = self.kind(SIZE)  # type: ignore[call-arg]
        return attach_host(ResumableDataLoader(data, batch_size=BATCH), self.trainer)

    def state_dict(self) -> dict[str, Any]:
        return {}


# IdPlace keeps its place on itself, not on an iterator: resumed at the cut, it starts over
# where the live object goes on. Its state cannot tell it from IdRewind's (Hugging Face's
# pattern), which starts over live too; loading it would make IdRewind go on (design.md).
_PLACE_AT_CUT = pytest.mark.xfail(strict=True, reason="a dataset's own place is not carried")


@pytest.mark.parametrize(
    ("kind", "k"),
    [(IdWalk, 2), (IdWalk, 3), (IdPlace, 2), pytest.param(IdPlace, 3, marks=_PLACE_AT_CUT)],
)
def test_a_walk_cut_by_limit_train_batches_goes_on_after_a_resume(
    tmp_path: Path, k: int, kind: type[IterableDataset[Any]]
) -> None:
    # In-process, the object goes on from the epoch limit_train_batches cut; the resumed one
    # started over (a fresh object, not put where the loaded state left it): epochs 1-2 read
    # samples 0-15 again and never 24-31.
    def fit_walk(root: Path, **kwargs: Any) -> Any:
        model = IdModule(fail_at=kwargs.pop("fail_at", None))
        callbacks = [step_checkpoints(root, 1)]
        options = trainer_kwargs(max_epochs=3, limit_train_batches=3, callbacks=callbacks)
        trainer = L.Trainer(**{**options, "enable_checkpointing": True})
        fit_or_interrupt(
            trainer, model, WalkModule(kind), interrupted=model.fail_at is not None, **kwargs
        )
        return model.records

    full = fit_walk(tmp_path / "full")
    assert [i for r in full for i in r["ids"]] == list(range(9 * BATCH))
    before = fit_walk(tmp_path / "cut", fail_at=k)
    after = fit_walk(tmp_path / "resumed", resume=tmp_path / "cut" / f"step{k:03d}.ckpt")
    assert_resume_exact(full, before, after)


@pytest.mark.parametrize("k", [2, 3])
def test_an_iterable_that_starts_over_at_each_iter_does_so_after_a_cut_epoch(
    tmp_path: Path, k: int
) -> None:
    # Live, the object starts over at each epoch as under DataLoader (an intermediate version
    # loaded it with its own state there: it went on, 0-35), and so does a resumed one.
    def fit_rewind(root: Path, **kwargs: Any) -> Any:
        model = IdModule(fail_at=kwargs.pop("fail_at", None))
        options = trainer_kwargs(
            max_epochs=3, limit_train_batches=3, callbacks=[step_checkpoints(root, 1)]
        )
        trainer = L.Trainer(**{**options, "enable_checkpointing": True})
        fit_or_interrupt(
            trainer, model, WalkModule(IdRewind), interrupted=model.fail_at is not None, **kwargs
        )
        return model.records

    full = fit_rewind(tmp_path / "full")
    assert [i for r in full for i in r["ids"]] == list(range(3 * BATCH)) * 3
    before = fit_rewind(tmp_path / "cut", fail_at=k)
    after = fit_rewind(tmp_path / "resumed", resume=tmp_path / "cut" / f"step{k:03d}.ckpt")
    assert_resume_exact(full, before, after)


class _Noisy(IterableDataset[dict[str, Any]]):
    """Ids 0..3, each with a value drawn from its worker's torch generator."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(4):
            yield {"id": i, "x": torch.full((4,), torch.rand(()).item())}


class _NoisyModule(L.LightningDataModule):
    def train_dataloader(self) -> ResumableDataLoader:
        loader = ResumableDataLoader(_Noisy(), batch_size=2, num_workers=1, seed=5)
        return attach_host(loader, self.trainer)


def test_a_reloaded_loader_without_length_draws_each_epochs_own_randomness() -> None:
    # Measured before: Lightning prefetches a batch from a reloaded unsized loader, names the
    # epoch, then iterates it again; the second iteration was taken for the loader's next
    # epoch, so epoch 1 drew epoch 2's worker randomness (the values of a run without reload
    # shifted by one epoch: a resume from an epoch-end checkpoint drew other values).
    values = []
    for reload in (0, 1):
        model = IdModule(keep_x=True)
        kwargs = trainer_kwargs(max_epochs=3, reload_dataloaders_every_n_epochs=reload)
        L.Trainer(**kwargs).fit(model, datamodule=_NoisyModule())
        pairs = zip(model.records, model.features, strict=True)
        values.append([(r["epoch"], float(x[0, 0])) for r, x in pairs])
    assert len(values[0]) == 6 and values[1] == values[0]


def test_a_walk_cut_by_limit_train_batches_goes_on_after_a_failure_at_the_next_epoch(
    tmp_path: Path,
) -> None:
    # Note 15: the walk started over (epoch 1 read samples 0-11 again): epoch 1's failed first
    # step took back to that epoch's start record, which did not say where the object had
    # stopped. (From an epoch-end checkpoint it still starts over: docs/guide/resume.md.)
    def fit_walk(root: Path, fail_at: int | None = None, resume: Path | None = None) -> Any:
        model = IdModule(fail_at=fail_at)
        ends = L.pytorch.callbacks.ModelCheckpoint(root, filename="e{epoch}", save_top_k=-1)
        callbacks = [ends, L.pytorch.callbacks.OnExceptionCheckpoint(root, "failed")]
        options = trainer_kwargs(max_epochs=3, limit_train_batches=3, callbacks=callbacks)
        trainer = L.Trainer(**{**options, "enable_checkpointing": True})
        fit_or_interrupt(trainer, model, WalkModule(), interrupted=fail_at is not None,
                         resume=resume)  # fmt: skip
        return model.records

    full = fit_walk(tmp_path / "full")
    before, ckpt = fit_walk(tmp_path / "cut", fail_at=3), tmp_path / "cut" / "failed.ckpt"
    after = fit_walk(tmp_path / "resumed", resume=ckpt)
    assert_resume_exact(full, before, after)


class _PlainTen(IterableDataset[dict[str, Any]]):
    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(10):
            yield {"id": i, "x": torch.zeros(4)}


class _IterableModule(L.LightningDataModule):
    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make = make

    def train_dataloader(self) -> ResumableDataLoader:
        return attach_host(ResumableDataLoader(self.make(), batch_size=4), self.trainer)


def test_a_stateless_iterable_reloaded_every_second_epoch_trains() -> None:
    # Review 162: a first version of this session's reload refusal refused it as a stream
    # with steps_per_epoch (each of its epochs starts afresh, as a resume does).
    model = IdModule()
    kwargs = trainer_kwargs(max_epochs=3, reload_dataloaders_every_n_epochs=2)
    L.Trainer(**kwargs).fit(model, datamodule=_IterableModule(_PlainTen))
    assert [r["ids"] for r in model.records] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] * 3


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_state_saved_after_a_max_steps_fit_leaves_out_the_prefetched_batch(
    num_workers: int,
) -> None:
    # Was: Lightning held one batch ahead as the fit ended, and a state saved after it no
    # longer left that batch out: a loop going on from it skipped the batch.
    full = IdModule()
    L.Trainer(**trainer_kwargs(max_epochs=1)).fit(full, datamodule=IterableModule(num_workers))
    cut, dm = IdModule(), IterableModule(num_workers)
    trainer = L.Trainer(**trainer_kwargs(max_steps=5))
    trainer.fit(cut, datamodule=dm)
    loader = ResumableDataLoader(WorkerSharded(SIZE), batch_size=BATCH, num_workers=num_workers)
    loader.load_state_dict(dm.trainer.train_dataloader.state_dict())
    ids = [r["ids"] for r in cut.records] + [b["id"].tolist() for b in loader]
    assert ids == [r["ids"] for r in full.records]
