"""ElasticResume: a mid-epoch resume under Lightning with more ranks trains the whole rest."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from loaderkit import ElasticResume, ResumableDataLoader, SamplePlan


class _Ids(torch.utils.data.Dataset[torch.Tensor]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, 1.0])


def make(dataset: Any, **kwargs: Any) -> ResumableDataLoader:
    return ResumableDataLoader(dataset, shuffle=True, seed=11, **kwargs)


class _Stop(RuntimeError):
    """The planned interruption of a Lightning run."""


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore:.*is deprecated")
def test_lightning_resume_with_more_ranks_trains_the_rest_of_the_epoch(tmp_path: Any) -> None:
    lightning = pytest.importorskip("lightning")

    class Recorder(lightning.LightningModule):
        def __init__(self, stop_at: int | None) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.stop_at = stop_at
            self.ids: list[list[int]] = []

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            if self.global_step == self.stop_at:
                raise _Stop
            self.ids.append(batch[:, 0].long().tolist())
            return self.layer(batch[:, 1:2].float()).sum()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)

    def fit(
        world_size: int, stop_at: int | None = None, ckpt: str | None = None, epochs: int = 1
    ) -> Recorder:
        # rank 0 of world_size ranks, in one process: the loader splits the plan itself.
        loader = make(_Ids(64), batch_size=8, rank=0, world_size=world_size)
        module = Recorder(stop_at)
        # ElasticResume: Lightning takes the epoch's length before it restores
        # the loader, which falls short when resuming with more ranks.
        callbacks: list[Any] = [ElasticResume()]
        if stop_at is not None:
            callbacks.append(
                lightning.pytorch.callbacks.ModelCheckpoint(
                    dirpath=tmp_path, filename="cut", every_n_train_steps=stop_at
                )
            )
        trainer = lightning.Trainer(
            max_epochs=epochs,
            accelerator="cpu",
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=stop_at is not None,
            num_sanity_val_steps=0,
            callbacks=callbacks,
        )
        with contextlib.suppress(_Stop):
            trainer.fit(module, train_dataloaders=loader, ckpt_path=ckpt)
        return module

    before = fit(world_size=1, stop_at=3)  # 3 steps of 8: position 24
    assert len(before.ids) == 3
    after = fit(world_size=2, ckpt=str(tmp_path / "cut.ckpt"), epochs=2)
    plan = SamplePlan(num_samples=64, batch_size=8, shuffle=True, seed=11)
    remaining = plan.schedule(0, start=24, rank=0, world_size=2)
    expected = [remaining.indices(s).tolist() for s in range(remaining.num_steps)]
    assert len(expected) == 3  # 40 left: two global steps of 2 x 8, then 2 x 4
    next_epoch = plan.schedule(1, start=0, rank=0, world_size=2)
    expected += [next_epoch.indices(s).tolist() for s in range(next_epoch.num_steps)]
    assert next_epoch.num_steps == 4  # the epoch after the resume is whole again
    assert after.ids == expected


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("entry", ["fit", "validate", "failed fit", "prefetched fit"])
def test_a_run_stops_the_persistent_workers_of_its_loaders(entry: str) -> None:
    """As Lightning stops a DataLoader's: none are left to outlive the Trainer's run."""
    import multiprocessing

    import lightning as L

    from loaderkit import DevicePrefetcher, TensorDataModule
    from tests.support.datamodules import AnyBatchModule

    class Failing(AnyBatchModule):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            if self.global_step == 3:
                raise _Stop("planned")
            return super().training_step(batch, batch_idx)

    class Prefetched(TensorDataModule):
        def train_dataloader(self) -> Any:
            return DevicePrefetcher(super().train_dataloader(), "cpu")

    kind = Prefetched if entry == "prefetched fit" else TensorDataModule
    dm = kind(
        torch.arange(24), batch_size=4, val_fraction=0.25, num_workers=2, persistent_workers=True
    )
    before = set(multiprocessing.active_children())
    trainer = L.Trainer(
        max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, num_sanity_val_steps=0, accelerator="cpu",
    )  # fmt: skip
    with pytest.raises(_Stop) if entry == "failed fit" else contextlib.nullcontext():
        if entry == "validate":
            trainer.validate(AnyBatchModule(), datamodule=dm)
        else:
            trainer.fit(Failing() if entry == "failed fit" else AnyBatchModule(), datamodule=dm)
    left = [p for p in multiprocessing.active_children() if p not in before]
    assert left == [], f"{len(left)} worker processes outlived trainer.{entry}"
