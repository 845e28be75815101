"""``num_workers="auto"``: workers start where loading is a real part of the step, and stay
only if they shorten it by :data:`MIN_GAIN` (private; ``docs/design.md``).
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field

MAX_AUTO_WORKERS = 8
# Batches measured before a decision (fewer once they waited PROBE_SECONDS in all), and
# batches skipped first (they pay for lazy set-up).
PROBE_BATCHES = 8
MIN_PROBE_BATCHES = 2
PROBE_SECONDS = 0.2
WARMUP_BATCHES = 1
MAX_IDLE_WAIT = 0.10  # below this fraction of the step waiting, workers cannot pay off
MIN_GAIN = 0.10  # workers stay only if they shorten the step by this fraction
# New workers' first batches (start-up, first prefetch) are skipped, this many per worker.
WORKER_WARMUP_PER_WORKER = 2


def local_processes(world_size: int) -> int:
    """Processes of this job on this machine: torchrun's ``LOCAL_WORLD_SIZE``, else all ranks."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else world_size


@dataclass
class AutoWorkers:
    """One loader's ``num_workers="auto"`` measurements (``record``) and choice (``decide``)."""

    cap: int
    workers: int = 0
    settled: bool = False
    in_process_wait: float | None = None
    in_process_step: float | None = None
    worker_wait: float | None = None
    reason: str = "measuring the first batches in-process"
    _waits: list[float] = field(default_factory=list)
    _steps: list[float] = field(default_factory=list)
    _skip: int = WARMUP_BATCHES

    def record(self, wait: float, step: float) -> None:
        """One batch: ``wait`` seconds to get it, ``step`` seconds until the next was asked."""
        if self.settled:
            return
        if self._skip > 0:
            self._skip -= 1
            return
        self._waits.append(wait)
        self._steps.append(step)

    def decide(self) -> int | None:
        """The worker count to switch to now, or None to go on as is."""
        measured = len(self._waits)
        if self.settled or measured < MIN_PROBE_BATCHES:
            return None
        if measured < PROBE_BATCHES and sum(self._waits) < PROBE_SECONDS:
            return None
        wait, step = statistics.median(self._waits), statistics.median(self._steps)
        self._waits.clear()
        self._steps.clear()
        if self.workers == 0:
            return self._from_in_process(wait, step)
        return self._from_workers(wait, step)

    def _from_in_process(self, wait: float, step: float) -> int | None:
        self.in_process_wait, self.in_process_step = wait, step
        fraction = wait / (wait + step) if wait + step > 0 else 0.0
        if fraction <= MAX_IDLE_WAIT or self.cap < 1:
            self.settled = True
            self.reason = (
                f"in-process: loading is {fraction:.0%} of the step "
                f"({wait * 1e3:.2f} ms of {(wait + step) * 1e3:.2f} ms per batch)"
            )
            return None
        # w workers deliver a batch every wait/w seconds; the loop asks every `step`.
        wanted = math.ceil(1.25 * wait / step) if step > 0 else self.cap
        self.workers = max(1, min(self.cap, wanted))
        self._skip = WORKER_WARMUP_PER_WORKER * self.workers
        self.reason = (
            f"trying {self.workers} worker(s): loading in-process was {fraction:.0%} of the step"
        )
        return self.workers

    def _from_workers(self, wait: float, step: float) -> int | None:
        assert self.in_process_wait is not None and self.in_process_step is not None
        self.worker_wait = wait
        self.settled = True
        before = self.in_process_wait + self.in_process_step
        after = wait + step
        if after <= (1 - MIN_GAIN) * before:
            self.reason = (
                f"{self.workers} worker(s): step {after * 1e3:.2f} ms vs "
                f"{before * 1e3:.2f} ms in-process"
            )
            return None
        tried = self.workers
        self.workers = 0
        self.reason = (
            f"in-process: {tried} worker(s) gave a step of {after * 1e3:.2f} ms vs "
            f"{before * 1e3:.2f} ms in-process (handing batches between processes "
            "costs more than it hides)"
        )
        return 0

    def describe(self) -> dict[str, object]:

        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1e3, 3)

        return {
            "workers": self.workers,
            "settled": self.settled,
            "cap": self.cap,
            "in_process_wait_ms": ms(self.in_process_wait),
            "in_process_step_ms": ms(self.in_process_step),
            "worker_wait_ms": ms(self.worker_wait),
            "reason": self.reason,
        }
