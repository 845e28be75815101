"""Shared pieces of the resume tests: id-carrying data, a recording model, and the resume oracle.

Importable by name (workers and subprocess scripts unpickle/import it), so it
holds no test functions and needs no pytest.

A *record* is one training step as a dict::

    {"rank": 0, "epoch": 1, "step": 9, "batch_idx": 1, "ids": [12, 40, ...]}

``step`` is the global step when the batch was trained on (0-based), so a run's
records, in order, are its sample stream. The oracle compares such streams.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import Dataset

from loaderkit import IterableReader, ResumableDataLoader, StreamingShardedDataset, attach_host

__all__ = [
    "IdDataModule",
    "IdDataset",
    "IdModule",
    "Interrupted",
    "PhaseLog",
    "assert_epochs_exactly_once",
    "assert_resume_exact",
    "by_epoch",
    "fit_or_interrupt",
    "last_phase",
    "log_tail",
    "mark_phase",
    "read_records",
    "run_script",
    "step_checkpoints",
    "trainer_kwargs",
]

SUPPORT_DIR = Path(__file__).resolve().parent
REPO_ROOT = SUPPORT_DIR.parents[1]

Record = dict[str, Any]


class Interrupted(RuntimeError):
    """The planned interruption of a training run (raised in ``training_step``)."""


class IdDataset(Dataset[dict[str, Any]]):
    """Item ``i`` is ``{"id": i, "x": features}``; ``noise`` adds ``torch.rand`` (global RNG).

    The noise stands for a random augmentation: it is only reproducible if the
    loader seeds the global RNG per sample (loaderkit's ``per_sample_seeding``).
    """

    def __init__(self, size: int, dim: int = 4, noise: bool = True) -> None:
        self.size = size
        self.dim = dim
        self.noise = noise

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        x = torch.full((self.dim,), index / self.size)
        if self.noise:
            x = x + torch.rand(self.dim)
        return {"id": index, "x": x}


# Uneven stream shards (fractions of the dataset), one of them empty.
_STREAM_CUTS = (0.0, 0.2, 0.2, 0.35, 0.65, 0.72, 1.0)


def id_stream_shards(size: int) -> list[tuple[int, int]]:
    """``(first id, count)`` shards covering ``range(size)``: uneven, one empty."""
    cuts = [round(f * size) for f in _STREAM_CUTS]
    return [(lo, hi - lo) for lo, hi in itertools.pairwise(cuts)]


def read_id_shard(shard: tuple[int, int]) -> Any:
    """The samples of an id stream shard (a generator: a stream of unknown length)."""
    start, n = shard
    for i in range(start, start + n):
        yield {"id": i, "x": torch.full((4,), i / 64)}


def add_noise(sample: dict[str, Any]) -> dict[str, Any]:
    """A random augmentation drawing from torch's global RNG."""
    return {**sample, "x": sample["x"] + torch.rand(4)}


class AnswersForGroup:
    """A single-CPU strategy mixin that answers for a data-parallel group (rank, world_size)."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(device=torch.device("cpu"))  # type: ignore[call-arg]
        self._group = {"rank": rank, "num_replicas": world_size}

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        return dict(self._group)


class DataParallelOf(AnswersForGroup, L.pytorch.strategies.SingleDeviceStrategy):
    """A Trainer strategy on one CPU that names a data-parallel group."""


class IdDataModule(L.LightningDataModule):
    """A DataModule whose train loader is a fresh :class:`ResumableDataLoader` per call.

    ``stream=True`` serves the ids as a :class:`StreamingShardedDataset` over
    :func:`id_stream_shards` (``steps_per_epoch`` optional) instead of a map-style dataset.
    The loader gets ``self.trainer`` as its host (``attach_host``), as the README shows;
    ``host=False`` leaves it without one.
    """

    def __init__(
        self,
        size: int = 64,
        batch_size: int = 8,
        num_workers: int = 0,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        noise: bool = True,
        persistent_workers: bool = False,
        stream: bool = False,
        steps_per_epoch: int | None = None,
        host: bool = True,
    ) -> None:
        super().__init__()
        self.host = host
        self.stream, self.steps_per_epoch = stream, steps_per_epoch
        self.size, self.batch_size, self.num_workers = size, batch_size, num_workers
        self.persistent_workers = persistent_workers
        self.seed, self.rank, self.world_size, self.noise = seed, rank, world_size, noise
        self.loader: ResumableDataLoader | None = None

    def train_dataloader(self) -> ResumableDataLoader:
        dataset: Any = IdDataset(self.size, noise=self.noise)
        if self.stream:
            dataset = StreamingShardedDataset(
                id_stream_shards(self.size),
                IterableReader(read_id_shard),
                transform=add_noise if self.noise else None,
                steps_per_epoch=self.steps_per_epoch,
            )
        self.loader = ResumableDataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=not self.stream,
            seed=self.seed,
            num_workers=self.num_workers,
            persistent_workers=self.persistent_workers,
            rank=self.rank,
            world_size=self.world_size,
        )
        return attach_host(self.loader, self.trainer) if self.host else self.loader


class IdModule(L.LightningModule):
    """A tiny linear model that records the ids (and features) of every batch it trains on.

    Args:
        fail_at: Raise :class:`Interrupted` in ``training_step`` when the global
            step equals this, i.e. right after step ``fail_at``'s checkpoint;
            that batch is not recorded.
        kill_at: SIGKILL this process in ``on_train_batch_end`` once the global
            step equals this and ``kill_when`` (a checkpoint file) exists.
        records_path: Append each record to this JSON-lines file, flushed at
            once, so a killed process leaves a complete trail.
        keep_x: Keep the batch features in ``self.features`` (in-process runs).
    """

    def __init__(
        self,
        *,
        fail_at: int | None = None,
        kill_at: int | None = None,
        kill_when: str | None = None,
        records_path: str | None = None,
        keep_x: bool = False,
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.fail_at, self.kill_at, self.kill_when = fail_at, kill_at, kill_when
        self.records_path, self.keep_x = records_path, keep_x
        self.records: list[Record] = []
        self.features: list[torch.Tensor] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.fail_at is not None and self.global_step == self.fail_at:
            raise Interrupted(f"planned interruption at global step {self.global_step}")
        record = {
            "rank": self.global_rank,
            "epoch": self.current_epoch,
            "step": self.global_step,
            "batch_idx": batch_idx,
            "ids": batch["id"].tolist(),
        }
        self.records.append(record)
        if self.keep_x:
            self.features.append(batch["x"].clone())
        if self.records_path is not None:
            with open(self.records_path, "a") as f:
                f.write(json.dumps(record) + "\n")
        return self.layer(batch["x"]).pow(2).mean()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Runs after the callbacks' hook, so ModelCheckpoint has saved this step.
        if (
            self.kill_at is not None
            and self.global_step == self.kill_at
            and self.kill_when is not None
            and os.path.exists(self.kill_when)
        ):
            os.kill(os.getpid(), signal.SIGKILL)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@contextlib.contextmanager
def no_entry_point_callbacks() -> Any:
    """Trainers built inside get no loaderkit callback from Lightning's entry point, as
    when loaderkit runs from a source tree that was never installed."""
    import loaderkit.lightning.callbacks as callbacks

    original = callbacks.entry_point_callbacks
    callbacks.entry_point_callbacks = list  # type: ignore[assignment]
    try:
        yield
    finally:
        callbacks.entry_point_callbacks = original


def trainer_kwargs(**overrides: Any) -> dict[str, Any]:
    """The lean ``lightning.Trainer`` settings every resume test uses."""
    kwargs: dict[str, Any] = {
        "max_epochs": 2,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "num_sanity_val_steps": 0,
    }
    kwargs.update(overrides)
    return kwargs


def step_checkpoints(root: str | Path, every: int) -> ModelCheckpoint:
    """Keep a checkpoint ``root/step{S:03d}.ckpt`` every ``every`` global steps."""
    return ModelCheckpoint(
        dirpath=root,
        filename="step{step:03d}",
        auto_insert_metric_name=False,
        every_n_train_steps=every,
        save_top_k=-1,
    )


def fit_or_interrupt(
    trainer: L.Trainer,
    model: L.LightningModule,
    dm: L.LightningDataModule,
    *,
    interrupted: bool,
    resume: str | Path | None = None,
) -> None:
    """``trainer.fit``; with ``interrupted`` the planned :class:`Interrupted` must end it."""
    if not interrupted:
        trainer.fit(model, datamodule=dm, ckpt_path=resume)
        return
    try:
        trainer.fit(model, datamodule=dm)
    except Interrupted:
        return
    raise AssertionError("the run ended without its planned interruption")


def read_records(path: str | Path) -> list[Record]:
    """The records of a JSON-lines file written by :class:`IdModule` (missing file: none)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def by_epoch(records: Sequence[Record]) -> dict[int, list[int]]:
    """All ids of each epoch, in stream order."""
    out: dict[int, list[int]] = {}
    for r in records:
        out.setdefault(r["epoch"], []).extend(r["ids"])
    return out


def _describe(record: Record | None) -> str:
    if record is None:
        return "<no step>"
    return f"epoch {record['epoch']} batch {record['batch_idx']} ids {record['ids']}"


def _epoch_diff(expected: list[int], got: list[int]) -> str:
    exp, have = Counter(expected), Counter(got)
    dup = sorted(i for i, c in have.items() if c > exp.get(i, 0))
    lost = sorted(i for i, c in exp.items() if c > have.get(i, 0))
    return f"duplicated ids {dup}, lost ids {lost}"


def assert_resume_exact(
    full: Sequence[Record], before: Sequence[Record], after: Sequence[Record]
) -> None:
    """The resume oracle: the first k steps of a run plus a run resumed at step k equal the
    uninterrupted run, step by step (epoch and ids, in order).

    Args:
        full: Records of the uninterrupted run.
        before: Records of the interrupted run (its first k steps).
        after: Records of the run resumed from the step-k checkpoint.

    Raises:
        AssertionError: naming the first step that differs, and per epoch the
            ids duplicated or lost by the resume.
    """
    problems: list[str] = []
    k = len(before)
    if [(r["epoch"], r["ids"]) for r in before] != [(r["epoch"], r["ids"]) for r in full[:k]]:
        problems.append("the interrupted run's first steps differ from the uninterrupted run's")
    joined = [*before, *after]
    for step in range(max(len(full), len(joined))):
        want = full[step] if step < len(full) else None
        got = joined[step] if step < len(joined) else None
        same = want is not None and got is not None
        if same and (want["epoch"], want["ids"]) == (got["epoch"], got["ids"]):
            continue
        side = "before" if step < k else f"after resume (resumed step {step - k})"
        problems.append(
            f"first difference at global step {step} ({side}):\n"
            f"    expected {_describe(want)}\n    got      {_describe(got)}"
        )
        break
    if len(joined) != len(full):
        problems.append(
            f"step count: uninterrupted {len(full)}, "
            f"before {k} + after {len(after)} = {len(joined)}"
        )
    want_epochs, got_epochs = by_epoch(full), by_epoch(joined)
    for epoch in sorted(set(want_epochs) | set(got_epochs)):
        exp, got = want_epochs.get(epoch, []), got_epochs.get(epoch, [])
        if Counter(exp) != Counter(got):
            problems.append(f"epoch {epoch}: {_epoch_diff(exp, got)}")
    if problems:
        raise AssertionError(f"resume at step {k} is not exact:\n  " + "\n  ".join(problems))


def assert_epochs_exactly_once(ids_per_epoch: dict[int, list[int]], size: int, epochs: int) -> None:
    """Each of ``epochs`` epochs holds every id in ``range(size)`` exactly once."""
    problems = []
    if sorted(ids_per_epoch) != list(range(epochs)):
        problems.append(f"epochs seen {sorted(ids_per_epoch)}, expected {list(range(epochs))}")
    for epoch, ids in sorted(ids_per_epoch.items()):
        if sorted(ids) != list(range(size)):
            problems.append(f"epoch {epoch}: {_epoch_diff(list(range(size)), ids)}")
    if problems:
        raise AssertionError("not every id exactly once per epoch:\n  " + "\n  ".join(problems))


PHASE_MARK = "[loaderkit-test phase]"


def spawn_gloo_ranks(run: Any, out: str, world_size: int = 2, num_ports: int = 1) -> None:
    """Start ``run(rank, world_size, ports, out)`` in ``world_size`` spawned processes, with
    ``num_ports`` distinct free localhost ports: one per process group's rendezvous."""
    import socket

    import torch.multiprocessing as mp

    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(num_ports)]
        for s in sockets:  # all bound at once, so the ports differ
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in sockets]
    mp.start_processes(run, args=(world_size, ports, out), nprocs=world_size, start_method="spawn")


def mark_phase(name: str) -> None:
    """Print a phase marker: a script that hangs is reported with the last one it reached."""
    print(f"{PHASE_MARK} {name}", flush=True)


class PhaseLog(L.Callback):
    """Marks the phases of a Lightning run (fit start, each epoch's start and first batch, end)."""

    def _mark(self, trainer: L.Trainer, what: str) -> None:
        mark_phase(f"rank {trainer.global_rank}: {what}")

    def on_fit_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._mark(trainer, "fit started (DDP set up)")

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._mark(trainer, f"epoch {trainer.current_epoch} started")

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._mark(trainer, f"epoch {trainer.current_epoch}, step {trainer.global_step} done")

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._mark(trainer, "training ended")


def last_phase(log: Path) -> str:
    """The last phase marker in a script's log, or a note that it reached none."""
    marks = [
        line[len(PHASE_MARK) :].strip()
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith(PHASE_MARK)
    ]
    return marks[-1] if marks else "none (it hung before its first phase marker: start-up)"


# Generous: a DDP run takes ~170 s alone on 2 cores and over twice that when the
# machine is oversubscribed; a hang still fails, naming the phase it hung in.
SCRIPT_TIMEOUT_S = 900


def run_script(
    script: Path,
    args: Sequence[str],
    log: Path,
    timeout: float = SCRIPT_TIMEOUT_S,
    phase: str | None = None,
    cwd: Path = REPO_ROOT,
) -> int:
    """Run ``python script args`` in its own session (in ``cwd``) and return its exit status.

    Output goes to ``log`` rather than a pipe: DataLoader workers or DDP ranks
    that outlive the main process would hold a pipe open. On a timeout the test
    fails instead of hanging, naming ``phase`` (what the script does) and the
    last phase marker it printed (:func:`mark_phase`, :class:`PhaseLog`).
    Whatever the script left running in its session (orphaned workers, a DDP
    rank) is ended before returning.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    rc: int | None = None
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            # A clean exit may leave a DDP rank finishing; anything else is ended now.
            _end_session(proc.pid, grace=10 if rc == 0 else 0)
            proc.wait()
    if rc is None:
        what = f" ({phase})" if phase else ""
        command = "".join(f" {a}" for a in args)
        raise AssertionError(
            f"{script.name}{what}{command} ran past {timeout} s: it hung in phase "
            f"{last_phase(log)!r}; log:\n{_tail(log)}"
        )
    return rc


def _end_session(pgid: int, grace: float) -> None:
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        if time.monotonic() >= deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            return
        time.sleep(0.1)


def _tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:]


def log_tail(log: Path) -> str:
    """The end of a script's log, for assertion messages."""
    return _tail(log)


class PassThrough(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A user's dataset reading another it holds as an attribute (a transform's shape)."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        return self.data[i]
