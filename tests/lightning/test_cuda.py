"""Lightning on ``accelerator="cuda"``: the batches of a CPU fit, pinned, and an exact resume.

Skipped where no CUDA device is (gpu marker). A loaderkit DataModule under a CUDA
Trainer must pin its batches (``pin_memory="auto"``), train on the same batches in
the same order as under a CPU Trainer, and resume from a mid-epoch checkpoint to
the exact next batch (the oracle of ``tests/support/helpers.py``), with 0 and 2
workers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from loaderkit import ElasticResume, SequenceDataModule, TensorDataModule
from tests.support.datamodules import RecordingModule, sequence_samples
from tests.support.helpers import (
    REPO_ROOT,
    assert_resume_exact,
    fit_or_interrupt,
    step_checkpoints,
    trainer_kwargs,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]

SIZE, BATCH = 64, 8
FEATURES = torch.randn(SIZE, 4, generator=torch.Generator().manual_seed(0))


def make_dm(kind: str, nw: int) -> L.LightningDataModule:
    if kind == "tensor":
        return TensorDataModule(torch.arange(SIZE), FEATURES, batch_size=BATCH, num_workers=nw)
    return SequenceDataModule(
        sequence_samples(SIZE), max_tokens=64, pad_to_multiple_of=4, window=16, num_workers=nw
    )


def tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        batch = list(batch.values())
    if not isinstance(batch, (list, tuple)):
        return []  # a string, a number
    return [t for item in batch for t in tensors(item)]


class CudaRecordingModule(RecordingModule):
    """Records each train batch as the loader gave it (pinned?) and as it trained (device)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.host: list[list[torch.Tensor]] = []
        self.trained: list[list[torch.Tensor]] = []
        self.pinned: list[bool] = []
        self.devices: set[str] = set()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.trainer.training:
            self.host.append([t.clone() for t in tensors(batch)])
            self.pinned.append(all(t.is_pinned() for t in tensors(batch)))
        return batch

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.devices.update(t.device.type for t in tensors(batch))
        self.trained.append([t.cpu() for t in tensors(batch)])
        return super().training_step(batch, batch_idx)


def fit(
    root: Path, kind: str, nw: int, accelerator: str, **options: Any
) -> tuple[CudaRecordingModule, L.LightningDataModule]:
    fail_at, resume = options.get("fail_at"), options.get("resume")
    model = CudaRecordingModule(fail_at=fail_at)
    callbacks: list[Any] = [ElasticResume()] if kind == "sequence" else []
    if fail_at is not None:
        callbacks.append(step_checkpoints(root, 1))
    trainer = L.Trainer(
        **trainer_kwargs(
            accelerator=accelerator, enable_checkpointing=fail_at is not None, callbacks=callbacks
        )
    )
    dm = make_dm(kind, nw)
    fit_or_interrupt(trainer, model, dm, interrupted=fail_at is not None, resume=resume)
    return model, dm


@pytest.mark.parametrize(("kind", "nw"), [("tensor", 0), ("tensor", 2), ("sequence", 2)])
def test_a_cuda_fit_trains_on_the_cpu_fits_batches_pinned_and_resumes_exactly(
    tmp_path: Path, kind: str, nw: int
) -> None:
    on_cpu, _ = fit(tmp_path / "cpu", kind, nw, "cpu")
    on_cuda, dm = fit(tmp_path / "cuda", kind, nw, "cuda")

    assert dm.resolve_pin_memory() is True  # type: ignore[attr-defined]
    assert on_cuda.pinned and all(on_cuda.pinned), on_cuda.pinned
    assert on_cuda.devices == {"cuda"}
    assert not any(on_cpu.pinned)
    assert [(r["epoch"], r["ids"]) for r in on_cuda.records] == [
        (r["epoch"], r["ids"]) for r in on_cpu.records
    ]
    # Bit for bit: the loader's batches under either Trainer, and what reached the GPU.
    for want, host, trained in zip(on_cpu.host, on_cuda.host, on_cuda.trained, strict=True):
        for a, b, c in zip(want, host, trained, strict=True):
            assert torch.equal(a, b) and torch.equal(b, c)

    steps = len(on_cuda.records)
    for k in (3, steps // 2 + 3):  # inside epoch 0, inside epoch 1
        before, _ = fit(tmp_path / f"cut{k}", kind, nw, "cuda", fail_at=k)
        ckpt = tmp_path / f"cut{k}" / f"step{k:03d}.ckpt"
        after, _ = fit(tmp_path / f"resumed{k}", kind, nw, "cuda", resume=ckpt)
        assert_resume_exact(on_cuda.records, before.records, after.records)
        assert after.pinned and all(after.pinned)


def test_a_process_that_built_a_loader_and_a_datamodule_can_still_fork_a_cuda_user() -> None:
    # Deciding to pin must not start CUDA: a process forked after that cannot use CUDA
    # ("Cannot re-initialize CUDA in forked subprocess"), and Lightning's ddp_fork refuses.
    code = (
        "import os, torch\n"
        "from loaderkit import ResumableDataLoader, TensorDataModule\n"
        "ResumableDataLoader(list(range(8)), batch_size=2, num_workers=2, pin_memory=True)\n"
        "dm = TensorDataModule(torch.arange(8), batch_size=2, num_workers=2)\n"
        "dm.setup('fit')\n"
        "assert dm.resolve_pin_memory() and dm.train_dataloader() is not None\n"
        "assert not torch.cuda.is_initialized()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if torch.ones(2, device='cuda').sum().item() == 2 else 1)\n"
        "print('child exit status', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "0", done.stdout + done.stderr[-3000:]
