"""DataWaitMonitor: the fraction of each training step spent waiting for data."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import pytest
import torch

from loaderkit import DataWaitMonitor, ResumableDataLoader
from tests.support.helpers import trainer_kwargs

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]

PAUSE = 0.03  # seconds; only the order of the two runs' fractions is asserted


class _Slow(torch.utils.data.Dataset[torch.Tensor]):
    def __init__(self, pause: float) -> None:
        self.pause = pause

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.pause)
        return torch.full((4,), float(index))


class _Model(L.LightningModule):
    def __init__(self, pause: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.pause = pause

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        time.sleep(self.pause)
        return self.layer(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(data_pause: float, step_pause: float) -> tuple[dict[str, Any], dict[str, float]]:
    monitor = DataWaitMonitor(window=4)
    trainer = L.Trainer(**trainer_kwargs(max_epochs=1, callbacks=[monitor]))
    loader = ResumableDataLoader(_Slow(data_pause), batch_size=1)
    trainer.fit(_Model(step_pause), train_dataloaders=loader)
    return dict(trainer.progress_bar_metrics), monitor.summary()


def test_waiting_for_data_shows_as_a_larger_fraction_than_a_slow_model() -> None:
    bar_data, slow_data = _fit(PAUSE, 0.0)
    bar_model, slow_model = _fit(0.0, PAUSE)
    assert slow_data["steps"] == slow_model["steps"] == 8
    assert 0.0 <= slow_model["data_wait"] < slow_data["data_wait"] <= 1.0
    # Each run's waits are bounded below by the sleeps they contain.
    assert slow_data["wait_ms"] >= 1e3 * PAUSE * 0.9
    assert slow_model["step_ms"] >= 1e3 * PAUSE * 0.9
    assert 0.0 <= bar_model["data_wait"] < bar_data["data_wait"] <= 1.0  # in the progress bar


def test_summary_before_any_step_and_bad_arguments() -> None:
    assert DataWaitMonitor().summary() == {
        "steps": 0,
        "data_wait": 0.0,
        "step_ms": 0.0,
        "wait_ms": 0.0,
    }
    with pytest.raises(ValueError, match=r"DataWaitMonitor: window must be >= 1, got 0"):
        DataWaitMonitor(window=0)
    with pytest.raises(TypeError, match=r"name must be a non-empty str, got ''; pass e.g."):
        DataWaitMonitor(name="")
    with pytest.raises(TypeError, match=r"prog_bar"):
        DataWaitMonitor(prog_bar="yes")  # type: ignore[arg-type]
