"""A StreamingShardedDataset under a real ``lightning.Trainer`` (CPU): exact resume.

DESIGN fact 1: Lightning prefetches one batch ahead from a loader without a
length, so a state read at checkpoint time is one batch ahead. A stream with
no ``steps_per_epoch`` is such a loader; the Lightning adapter tells it how
many batches Lightning's fetcher holds (so does :class:`loaderkit.ElasticResume`),
and it leaves them out of the state. The oracle is the
one of ``tests/support/helpers.py``: the first k steps plus the steps resumed from the
step-k checkpoint equal the uninterrupted run, over two epochs, for k inside
epoch 0 and inside epoch 1, with ``num_workers`` 0 and 2.

64 ids in 6 uneven shards (one empty), batches of 8; ``num_workers=2`` gives
two streams per epoch, each ending in a partial batch.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from loaderkit import DevicePrefetcher, ElasticResume, StateMismatchError
from tests.support.cuda_stub import cuda_prefetcher, stub_cuda
from tests.support.helpers import (
    SUPPORT_DIR,
    IdDataModule,
    IdModule,
    assert_epochs_exactly_once,
    assert_resume_exact,
    by_epoch,
    fit_or_interrupt,
    log_tail,
    read_records,
    run_script,
    step_checkpoints,
    trainer_kwargs,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]

SIZE, BATCH = 64, 8


class _Prefetched(IdDataModule):
    """The train loader behind a DevicePrefetcher: a pass-through on the CPU, or (``cuda``)
    its look-ahead path with the copies stubbed."""

    def __init__(self, *, cuda: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cuda = cuda

    def train_dataloader(self) -> Any:
        loader = super().train_dataloader()
        return cuda_prefetcher(loader) if self.cuda else DevicePrefetcher(loader, "cpu")


def fit(
    root: Path,
    *,
    nw: int,
    fail_at: int | None = None,
    resume: Path | None = None,
    steps_per_epoch: int | None = None,
    elastic: bool = True,
    prefetched: str | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    model = IdModule(fail_at=fail_at)
    data = {"size": SIZE, "batch_size": BATCH, "num_workers": nw, "stream": True}
    if prefetched is None:
        dm = IdDataModule(**data, steps_per_epoch=steps_per_epoch)
    else:
        dm = _Prefetched(**data, steps_per_epoch=steps_per_epoch, cuda=prefetched == "cuda")
    callbacks: list[Callback] = [ElasticResume()] if elastic else []
    if fail_at is not None:
        callbacks.append(step_checkpoints(root, fail_at))
    trainer = L.Trainer(
        **trainer_kwargs(enable_checkpointing=fail_at is not None, callbacks=callbacks),
        **options,
    )
    fit_or_interrupt(trainer, model, dm, interrupted=fail_at is not None, resume=resume)
    return model.records


@cache
def _full(root: Path, nw: int, steps_per_epoch: int | None) -> tuple[dict[str, Any], ...]:
    return tuple(fit(root / f"full-{nw}-{steps_per_epoch}", nw=nw, steps_per_epoch=steps_per_epoch))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stream")


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("where", ["epoch0", "end0", "epoch1"])
def test_unsized_stream_resume_after_exception_is_exact(root: Path, nw: int, where: str) -> None:
    # end0: the checkpoint of epoch 0's last step (Lightning set epoch 0 after prefetching its
    # first batch; that late call made the saved state epoch 0's start: epoch 0 was replayed).
    full = list(_full(root, nw, None))
    epoch0 = len(by_epoch(full)[0]) // BATCH  # a lower bound: partial batches count once
    first_epoch1 = next(i for i, r in enumerate(full) if r["epoch"] == 1)
    k = {"epoch0": 3, "end0": first_epoch1, "epoch1": first_epoch1 + 2}[where]
    assert 0 < k < len(full) and epoch0 > 3
    cut_dir = root / f"cut-{nw}-{k}"
    before = fit(cut_dir, nw=nw, fail_at=k)
    after = fit(root / f"resumed-{nw}-{k}", nw=nw, resume=cut_dir / f"step{k:03d}.ckpt")
    assert_resume_exact(full, before, after)
    assert_epochs_exactly_once(by_epoch(full), SIZE, 2)


@pytest.mark.parametrize("limit", [None, 5])
@pytest.mark.parametrize("prefetched", ["cpu", "cuda"])
def test_an_unsized_stream_behind_a_prefetcher_resumes_exactly(
    root: Path, monkeypatch: pytest.MonkeyPatch, prefetched: str, limit: int | None
) -> None:
    """Lightning holds the prefetcher; the loader behind it still leaves the fetcher's batch
    out of its state (it was one batch ahead: a batch lost on resume), and hears the epoch
    Lightning sets through the prefetcher's sampler (limit_train_batches: resumed at a cut
    epoch's last step, it trained the rest of epoch 0 as epoch 1)."""
    stub_cuda(monkeypatch)
    options = {} if limit is None else {"limit_train_batches": limit}
    tag = f"prefetched-{prefetched}-{limit}"
    full = fit(root / f"{tag}-full", nw=0, **options)
    first_epoch1 = next(i for i, r in enumerate(full) if r["epoch"] == 1)
    for k in (3, first_epoch1, first_epoch1 + 2):
        cut_dir = root / f"{tag}-{k}"
        before = fit(cut_dir, nw=0, fail_at=k, prefetched=prefetched, **options)
        ckpt = cut_dir / f"step{k:03d}.ckpt"
        after = fit(
            root / f"{cut_dir.name}-resumed", nw=0, resume=ckpt, prefetched=prefetched, **options
        )
        assert_resume_exact(full, before, after)


def test_unsized_stream_resumed_from_an_epoch_end_checkpoint_trains_the_next_epoch(
    root: Path,
) -> None:
    """Lightning loads no loader state from an epoch-end checkpoint and iterates an unsized
    loader before it sets the epoch: the loader takes the epoch from the fit loop (it
    trained epoch 0 again, as epoch 1)."""
    full = list(_full(root, 2, None))
    ends = ModelCheckpoint(dirpath=root / "ends", filename="end{epoch}", save_top_k=-1)
    dm = IdDataModule(size=SIZE, batch_size=BATCH, num_workers=2, stream=True)
    trainer = L.Trainer(**trainer_kwargs(max_epochs=1, enable_checkpointing=True, callbacks=[ends]))
    trainer.fit(IdModule(), datamodule=dm)
    model = IdModule()
    dm = IdDataModule(size=SIZE, batch_size=BATCH, num_workers=2, stream=True)
    trainer = L.Trainer(**trainer_kwargs())
    trainer.fit(model, datamodule=dm, ckpt_path=root / "ends" / "endepoch=0.ckpt")
    want = [(r["epoch"], r["ids"]) for r in full if r["epoch"] == 1]
    assert [(r["epoch"], r["ids"]) for r in model.records] == want


def _resume_from_epoch_end(
    root: Path, nw: int, steps: int = 5, **options: Any
) -> list[dict[str, Any]]:
    """Epoch 1 (of 2) resumed from epoch 0's end checkpoint, with ``steps`` per epoch."""
    ends = root / f"sps-ends-{nw}-{sorted(options.items())}"
    data = {"size": SIZE, "batch_size": BATCH, "num_workers": nw, "stream": True}
    if not ends.exists():
        saver = ModelCheckpoint(dirpath=ends, filename="end{epoch}", save_top_k=-1)
        kwargs = trainer_kwargs(max_epochs=1, enable_checkpointing=True, callbacks=[saver])
        dm = IdDataModule(**data, steps_per_epoch=5)
        L.Trainer(**kwargs, **options).fit(IdModule(), datamodule=dm)
    model = IdModule()
    dm = IdDataModule(**data, steps_per_epoch=steps)
    trainer = L.Trainer(**trainer_kwargs(**options))
    trainer.fit(model, datamodule=dm, ckpt_path=ends / "endepoch=0.ckpt")
    return [{"epoch": r["epoch"], "ids": r["ids"]} for r in model.records]


@pytest.mark.parametrize("nw", [0, 2])
def test_a_stream_with_steps_per_epoch_resumed_from_an_epoch_end_checkpoint_goes_on(
    root: Path, nw: int
) -> None:
    """Its streams go on across epochs, and Lightning loads no loader state from an
    epoch-end checkpoint: the loader takes its own from it (its streams started over)."""
    full = list(_full(root, nw, 5))
    want = [{"epoch": r["epoch"], "ids": r["ids"]} for r in full if r["epoch"] == 1]
    assert _resume_from_epoch_end(root, nw) == want


def test_a_stream_made_anew_each_epoch_starts_over_after_an_epoch_end_resume(root: Path) -> None:
    # Under reload_dataloaders_every_n_epochs each epoch's loader is new (its streams
    # start over), so the restored epoch's must not take the saved state.
    reload = {"reload_dataloaders_every_n_epochs": 1}
    model = IdModule()
    dm = IdDataModule(size=SIZE, batch_size=BATCH, stream=True, steps_per_epoch=5)
    L.Trainer(**trainer_kwargs(**reload)).fit(model, datamodule=dm)
    want = [{"epoch": r["epoch"], "ids": r["ids"]} for r in model.records if r["epoch"] == 1]
    assert _resume_from_epoch_end(root, 0, **reload) == want


@pytest.mark.parametrize("nw", [0, 2])
def test_a_stream_with_steps_per_epoch_reloaded_every_second_epoch_is_refused(nw: int) -> None:
    # Note 15: a resume reloads it at other epochs than the uninterrupted run (Lightning does
    # not save when it last reloaded), and a reloaded stream starts over: epoch 1 after an
    # epoch-end checkpoint trained [0, 4], [8, 1] for [5, 9], [2, 6].
    dm = IdDataModule(size=SIZE, batch_size=BATCH, num_workers=nw, stream=True, steps_per_epoch=5)
    trainer = L.Trainer(**trainer_kwargs(reload_dataloaders_every_n_epochs=2))
    with pytest.raises(StateMismatchError, match="reload_dataloaders_every_n_epochs=2; reload"):
        trainer.fit(IdModule(), datamodule=dm)


def test_a_stream_iterated_before_an_epoch_end_resume_takes_the_checkpoints_state(
    root: Path,
) -> None:
    # It took the state only at its first iteration: one peeked at before the fit went on
    # from the peek.
    full = list(_full(root, 0, 5))
    _resume_from_epoch_end(root, 0)  # writes the checkpoint
    dm = IdDataModule(size=SIZE, batch_size=BATCH, stream=True, steps_per_epoch=5)
    loader = dm.train_dataloader()
    next(iter(loader))
    model = IdModule()
    ckpt = root / f"sps-ends-0-{sorted({}.items())}" / "endepoch=0.ckpt"
    L.Trainer(**trainer_kwargs()).fit(model, train_dataloaders=loader, ckpt_path=ckpt)
    want = [(r["epoch"], r["ids"]) for r in full if r["epoch"] == 1]
    assert [(r["epoch"], r["ids"]) for r in model.records] == want


def test_an_epoch_end_resume_with_another_count_of_loaders_is_refused(root: Path) -> None:
    from lightning.pytorch.utilities import CombinedLoader

    _resume_from_epoch_end(root, 0)  # writes the checkpoint of one loader
    make = IdDataModule(size=SIZE, batch_size=BATCH, stream=True, steps_per_epoch=5)
    loaders = CombinedLoader([make.train_dataloader(), make.train_dataloader()])
    ckpt = root / f"sps-ends-0-{sorted({}.items())}" / "endepoch=0.ckpt"
    with pytest.raises(StateMismatchError, match=r"holds 1 train loader states, this fit has 2"):
        L.Trainer(**trainer_kwargs()).fit(IdModule(), train_dataloaders=loaders, ckpt_path=ckpt)


def test_an_epoch_end_resume_with_other_steps_per_epoch_is_refused_by_name(root: Path) -> None:
    with pytest.raises(StateMismatchError, match="'steps_per_epoch' differs: saved 5, here 3"):
        _resume_from_epoch_end(root, 0, steps=3)


def test_unsized_stream_without_the_callback_resumes_exactly(root: Path) -> None:
    """Lightning checkpoints while it holds a prefetched batch: the loader asks the
    Lightning adapter how many it holds (was: an error asking for ElasticResume)."""
    full = list(_full(root, 0, None))
    k = 3
    cut_dir = root / "no-callback-cut"
    before = fit(cut_dir, nw=0, fail_at=k, elastic=False)
    after = fit(
        root / "no-callback-resumed", nw=0, resume=cut_dir / f"step{k:03d}.ckpt", elastic=False
    )
    assert_resume_exact(full, before, after)


@pytest.mark.parametrize("nw", [0, 2])
def test_stream_with_steps_per_epoch_resumes_exactly(root: Path, nw: int) -> None:
    """A length: Lightning does not prefetch, and epochs continue the streams."""
    full = list(_full(root, nw, 5))
    assert [r["epoch"] for r in full] == [0] * 5 + [1] * 5
    cut_dir = root / f"cut-limited-{nw}"
    before = fit(cut_dir, nw=nw, fail_at=7, steps_per_epoch=5)
    after = fit(
        root / f"resumed-limited-{nw}",
        nw=nw,
        resume=cut_dir / "step007.ckpt",
        steps_per_epoch=5,
    )
    assert_resume_exact(full, before, after)


def test_unsized_stream_resume_after_kill_9_is_exact(tmp_path: Path) -> None:
    script = SUPPORT_DIR / "lightning_job.py"
    job = ["--size", str(SIZE), "--batch-size", str(BATCH), "--num-workers", "2", "--stream"]
    full_dir, first, second = tmp_path / "full", tmp_path / "killed", tmp_path / "resumed"
    for out, extra in ((full_dir, []), (first, ["--kill-at", "5"])):
        rc = run_script(
            script, [*job, "--out", str(out), "--every", "1", *extra], tmp_path / "a.log"
        )
        assert rc == (-9 if extra else 0), log_tail(tmp_path / "a.log")
    ckpt = first / "ckpt" / "step005.ckpt"
    rc = run_script(script, [*job, "--out", str(second), "--resume", str(ckpt)], tmp_path / "b.log")
    assert rc == 0, log_tail(tmp_path / "b.log")
    before = read_records(first / "records-rank0.jsonl")
    assert len(before) == 5
    assert_resume_exact(
        read_records(full_dir / "records-rank0.jsonl"),
        before,
        read_records(second / "records-rank0.jsonl"),
    )
