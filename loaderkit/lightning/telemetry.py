"""How much of each training step waits for data: a Lightning callback."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from loaderkit._checks import check_bool, check_int
from loaderkit.loader.resumable import ResumableDataLoader

__all__ = ["DataWaitMonitor"]

_SUMMARY_KEYS = ("steps", "step_ms", "wait_ms")


class DataWaitMonitor(Callback):
    """Log the fraction of each training step spent waiting for the next batch.

    A step is the wait for its batch plus the work on it (host wall time); the ratio
    over a window of steps is logged as ``name``: near 0 the loader keeps up, near 1
    the model waits for data. The wait is the time in a
    :class:`~loaderkit.ResumableDataLoader`'s ``next()``, else the time between
    batches less validation.

    Args:
        window: Steps the logged fraction averages over (a moving window).
        name: The logged metric's name (not one of :meth:`summary`'s other keys).
        prog_bar: Show the fraction in the progress bar.

    Example:
        >>> trainer = L.Trainer(callbacks=[DataWaitMonitor()])  # doctest: +SKIP
        >>> trainer.fit(model, datamodule=dm)  # doctest: +SKIP
        >>> trainer.callbacks[0].summary()  # doctest: +SKIP
        {'steps': 100, 'data_wait': 0.62, 'step_ms': 41.0, 'wait_ms': 25.4}
    """

    def __init__(self, window: int = 50, name: str = "data_wait", prog_bar: bool = True) -> None:
        self.window = check_int(
            "window", window, 1, owner="DataWaitMonitor", fix="pass a number of steps, e.g. 50"
        )
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"DataWaitMonitor: name must be a non-empty str, got {name!r}; pass e.g. "
                "name='data_wait'."
            )
        if name in _SUMMARY_KEYS:
            raise ValueError(
                f"DataWaitMonitor: name={name!r} is one of the keys summary() reports; pass "
                "another name, e.g. name='data_wait'."
            )
        self.name = name
        self.prog_bar = check_bool("prog_bar", prog_bar, owner="DataWaitMonitor")
        self._last_end: float | None = None  # other loaders: when the wait began
        self._paused: float | None = None  # when a validation run began
        self._loaders: tuple[ResumableDataLoader, ...] | None = None
        self._read = 0.0  # their wait_seconds at the last reading
        self._start: float | None = None
        self._wait: float | None = None
        self._recent: deque[tuple[float, float]] = deque(maxlen=self.window)
        self._steps, self._total_wait, self._total_step = 0, 0.0, 0.0

    def _waited(self) -> float:
        assert self._loaders is not None
        return sum(loader.wait_seconds for loader in self._loaders)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Start the clock."""
        loaders: Any = trainer.train_dataloader
        if isinstance(loaders, Mapping):
            loaders = list(loaders.values())
        elif not isinstance(loaders, list | tuple):
            loaders = [loaders]
        timed = bool(loaders) and all(isinstance(x, ResumableDataLoader) for x in loaders)
        self._loaders = tuple(loaders) if timed else None
        if self._loaders is not None:
            self._read = self._waited()
        self._last_end = time.perf_counter()

    def on_validation_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Pause the clock."""
        self._paused = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Resume the clock."""
        if self._paused is not None and self._last_end is not None:
            self._last_end += time.perf_counter() - self._paused
        self._paused = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """Take the time the loop waited for this batch."""
        now = time.perf_counter()
        if self._loaders is not None:
            waited = self._waited()
            self._wait, self._read = waited - self._read, waited
        elif self._last_end is not None:
            self._wait = now - self._last_end
        self._start = now

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Close the step and log the window's fraction waiting."""
        now = time.perf_counter()
        if self._wait is not None and self._start is not None:
            step = self._wait + (now - self._start)
            self._recent.append((self._wait, step))
            self._steps += 1
            self._total_wait += self._wait
            self._total_step += step
            waited = sum(w for w, _ in self._recent)
            spent = sum(s for _, s in self._recent)
            if spent > 0:
                pl_module.log(
                    self.name,
                    waited / spent,
                    prog_bar=self.prog_bar,
                    on_step=True,
                    on_epoch=False,
                    batch_size=1,
                )
        self._wait = self._start = None
        self._last_end = now

    def summary(self) -> dict[str, float]:
        """Steps measured, the overall fraction spent waiting, and mean step and wait times."""
        steps = max(self._steps, 1)  # no step: every total is 0
        return {
            "steps": self._steps,
            self.name: self._total_wait / self._total_step if self._total_step else 0.0,
            "step_ms": 1e3 * self._total_step / steps,
            "wait_ms": 1e3 * self._total_wait / steps,
        }
