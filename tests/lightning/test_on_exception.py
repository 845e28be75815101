"""A checkpoint written by Lightning's ``OnExceptionCheckpoint`` when a training step
raises resumes exactly: Lightning trains the failed batch again, so it is no more
consumed than the one its fetcher prefetched. Was: map-style loaders refused the resume
(their position one batch ahead of the fit loop's count), unsized ones skipped two
batches. ``AttachLoaders`` keeps hosting the loaders until the fit's failure handling
is over (Lightning calls checkpoint callbacks' ``on_exception`` last).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
from lightning.pytorch.callbacks import OnExceptionCheckpoint

from loaderkit import AttachLoaders
from loaderkit._callers import NO_HOST, host_of
from tests.support.helpers import (
    IdDataModule,
    IdModule,
    Interrupted,
    assert_resume_exact,
    fit_or_interrupt,
    trainer_kwargs,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]


def fit(root: Path, *, stream: bool, host: bool, fail_at: int | None = None) -> list[Any]:
    model = IdModule(fail_at=fail_at)
    dm = IdDataModule(size=48, batch_size=8, stream=stream, host=host)
    callbacks = [AttachLoaders()] if not host else []
    if fail_at is not None:
        callbacks.append(OnExceptionCheckpoint(root))
    trainer = L.Trainer(
        **trainer_kwargs(enable_checkpointing=fail_at is not None, callbacks=callbacks)
    )
    fit_or_interrupt(trainer, model, dm, interrupted=fail_at is not None)
    return model.records


@pytest.mark.parametrize("stream", [False, True], ids=["map", "stream"])
@pytest.mark.parametrize("host", [True, False], ids=["attached", "AttachLoaders"])
@pytest.mark.parametrize("k", [2, 8])  # inside epoch 0, inside epoch 1
def test_an_on_exception_checkpoint_resumes_exactly(
    tmp_path: Path, stream: bool, host: bool, k: int
) -> None:
    full = fit(tmp_path / "full", stream=stream, host=host)
    before = fit(tmp_path / "cut", stream=stream, host=host, fail_at=k)
    model = IdModule()
    dm = IdDataModule(size=48, batch_size=8, stream=stream, host=host)
    callbacks = [AttachLoaders()] if not host else []
    trainer = L.Trainer(**trainer_kwargs(callbacks=callbacks))
    trainer.fit(model, datamodule=dm, ckpt_path=tmp_path / "cut" / "on_exception.ckpt")
    assert_resume_exact(full, before, model.records)


def test_a_failed_fit_hosts_no_loader_after_its_failure_handling(tmp_path: Path) -> None:
    trainer = L.Trainer(**trainer_kwargs(callbacks=[AttachLoaders()]))
    with pytest.raises(Interrupted):
        trainer.fit(IdModule(fail_at=2), datamodule=IdDataModule(size=48, host=False))
    assert host_of(object()) is NO_HOST  # the trainer lives on; its run is over
