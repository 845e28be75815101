"""How much of each training step waits for data: a Lightning callback.

A GPU idling at 30 % because the loader can't keep up looks, from the
training script, like a slow model. :class:`DataWaitMonitor` separates the
two: the wall time from the end of one training batch to the start of the
next is the time Lightning's loop spent getting the next batch (the loader's
``next()``, plus the few hooks in between); the time from one batch end to
the next is the whole step. Their ratio, averaged over a window of steps, is
logged as ``data_wait`` (and shown in the progress bar): near 0 the loader
keeps up; near 1 the model waits for data (raise ``num_workers``, pin
memory, bucket by length, or move decoding out of ``__getitem__``).

Host wall time: on CUDA, kernels run asynchronously, so a step's time is what
the host spent on it, which is what the loader competes with.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from loaderkit._checks import check_bool, check_int

__all__ = ["DataWaitMonitor"]


class DataWaitMonitor(Callback):
    """Log the fraction of each training step spent waiting for the next batch.

    Args:
        window: Steps the logged fraction averages over (a moving window).
        name: The logged metric's name.
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
                "name='data_wait'"
            )
        self.name = name
        self.prog_bar = check_bool("prog_bar", prog_bar, owner="DataWaitMonitor")
        self._last_end: float | None = None
        self._wait: float | None = None
        self._recent: deque[tuple[float, float]] = deque(maxlen=self.window)
        self._steps = 0
        self._total_wait = 0.0
        self._total_step = 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Start the clock: the epoch's first step includes creating its iterator."""
        self._last_end = time.perf_counter()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """The batch has arrived: the time since the last step ended was spent getting it."""
        if self._last_end is not None:
            self._wait = time.perf_counter() - self._last_end

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Close the step and log the window's fraction of time spent waiting."""
        now = time.perf_counter()
        if self._last_end is not None and self._wait is not None:
            step = now - self._last_end
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
        self._wait = None
        self._last_end = now

    def summary(self) -> dict[str, float]:
        """Steps measured, the overall fraction spent waiting, and mean step and wait times."""
        steps = self._steps
        if steps == 0:
            return {"steps": 0, self.name: 0.0, "step_ms": 0.0, "wait_ms": 0.0}
        return {
            "steps": steps,
            self.name: self._total_wait / self._total_step if self._total_step else 0.0,
            "step_ms": 1e3 * self._total_step / steps,
            "wait_ms": 1e3 * self._total_wait / steps,
        }
