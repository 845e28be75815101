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
    def __init__(self, pause: float, validation: float = 0.0) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.pause, self.validation = pause, validation

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        time.sleep(self.pause)
        return self.layer(batch).sum()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        time.sleep(self.validation)

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


# ------------------------------------------------ what counts as waiting (a fake clock)
class _Clock:
    """``time.perf_counter`` and ``time.sleep`` for a run: sleeping advances the clock at
    once (and each reading by 1 ns), so the fractions are exact whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-9
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _SlowHook(L.Callback):
    def on_train_batch_end(self, *args: Any) -> None:
        time.sleep(VALIDATION)


STEP, VALIDATION = 0.01, 1.0


def _timed_fit(
    monkeypatch: pytest.MonkeyPatch, *, torch_loader: bool, load: float, slow_hook: bool
) -> dict[str, float]:
    clock = _Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    make = torch.utils.data.DataLoader if torch_loader else ResumableDataLoader
    monitor = DataWaitMonitor(window=4)
    callbacks: list[L.Callback] = [monitor] + ([_SlowHook()] if slow_hook else [])
    trainer = L.Trainer(
        **trainer_kwargs(
            max_epochs=1, callbacks=callbacks, val_check_interval=1, limit_val_batches=1
        )
    )
    trainer.fit(
        _Model(STEP, validation=VALIDATION),
        train_dataloaders=make(_Slow(load), batch_size=1),
        val_dataloaders=make(_Slow(0.0), batch_size=1),
    )
    return monitor.summary()


@pytest.mark.parametrize("torch_loader", [False, True], ids=["resumable", "DataLoader"])
def test_validation_between_batches_is_not_data_wait(
    monkeypatch: pytest.MonkeyPatch, torch_loader: bool
) -> None:
    # On 84cc6ec each step's 1 s validation counted as waiting: data_wait 0.99.
    summary = _timed_fit(monkeypatch, torch_loader=torch_loader, load=0.0, slow_hook=False)
    assert summary["steps"] == 8
    assert summary["data_wait"] < 1e-3
    assert summary["step_ms"] == pytest.approx(1e3 * STEP, rel=1e-3)


def test_a_slow_later_callback_is_not_data_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # The ResumableDataLoader times its own next(): a checkpoint or another callback's
    # on_train_batch_end after the monitor's (1 s here) is not waiting (0.99 on 84cc6ec).
    summary = _timed_fit(monkeypatch, torch_loader=False, load=0.0, slow_hook=True)
    assert summary["data_wait"] < 1e-3


@pytest.mark.parametrize("torch_loader", [False, True], ids=["resumable", "DataLoader"])
def test_loading_time_is_the_wait(monkeypatch: pytest.MonkeyPatch, torch_loader: bool) -> None:
    summary = _timed_fit(monkeypatch, torch_loader=torch_loader, load=0.05, slow_hook=False)
    assert summary["data_wait"] == pytest.approx(0.05 / (0.05 + STEP), rel=1e-3)
    assert summary["wait_ms"] == pytest.approx(50.0, rel=1e-3)


@pytest.mark.parametrize("name", ["steps", "step_ms", "wait_ms"])
def test_a_name_summary_already_uses_is_refused(name: str) -> None:
    # On 84cc6ec name="steps" replaced the step count in summary() with the fraction.
    with pytest.raises(ValueError, match=rf"name='{name}' is one of the keys summary\(\) reports"):
        DataWaitMonitor(name=name)
