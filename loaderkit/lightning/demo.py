"""The ``loaderkit demo`` job: a byte-level language model on Python's own sources.

A Trainer trains on token-budget buckets of standard-library code blocks, is interrupted
mid-epoch right after a checkpoint, resumes from it, and compares the samples trained on
with an uninterrupted pass.
"""

from __future__ import annotations

import shutil
import sysconfig
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

from loaderkit.collate import PadCollate
from loaderkit.data.lengths import compute_lengths
from loaderkit.lightning.callbacks import ElasticResume, attach_host
from loaderkit.loader.resumable import ResumableDataLoader
from loaderkit.plan.samplers import BucketBatchSampler
from loaderkit.transfer import move_to_device

__all__ = ["DemoConfig", "DemoResult", "StdlibBytes", "run_demo"]

PAD_ID = 256  # bytes are 0..255; one extra token id for padding


class StdlibBytes(torch.utils.data.Dataset[dict[str, Any]]):
    """Code blocks (between blank lines) of the standard library's ``.py`` files, as bytes.

    Args:
        max_samples: Keep the first this many blocks (files sorted by path).
        min_len: Skip blocks shorter than this many bytes.
        max_len: Keep at most this many bytes of each block.
        root: Folder to read (default: this interpreter's standard library).
    """

    def __init__(
        self, max_samples: int, *, min_len: int = 16, max_len: int = 256, root: Path | None = None
    ) -> None:
        if max_samples < 1:
            raise ValueError(
                f"StdlibBytes: max_samples must be >= 1, got {max_samples}; pass e.g. 1000."
            )
        if not 2 <= min_len <= max_len:
            raise ValueError(
                f"StdlibBytes: need 2 <= min_len <= max_len, got {min_len} and {max_len}; "
                "pass e.g. min_len=16, max_len=256."
            )
        base = Path(sysconfig.get_paths()["stdlib"]) if root is None else Path(root)
        self.samples: list[bytes] = []
        for path in sorted(base.rglob("*.py")):
            if "site-packages" in path.parts or len(self.samples) >= max_samples:
                continue
            for block in path.read_bytes().split(b"\n\n"):
                block = block.strip(b"\n")[:max_len]
                if len(block) >= min_len and len(self.samples) < max_samples:
                    self.samples.append(block)
        if not self.samples:
            raise ValueError(
                f"StdlibBytes: no code block of >= {min_len} bytes under {base}; pass a root "
                "with .py files, or a smaller min_len."
            )

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        data = torch.frombuffer(bytearray(self.samples[index]), dtype=torch.uint8).long()
        return {"id": index, "input_ids": data[:-1], "labels": data[1:]}


class ByteLM(L.LightningModule):
    """A small causal convolutional byte model."""

    def __init__(self, width: int = 64, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(PAD_ID + 1, width, padding_idx=PAD_ID)
        self.dilations = (1, 2, 4)
        self.convs = nn.ModuleList(nn.Conv1d(width, width, 4, dilation=d) for d in self.dilations)
        self.head = nn.Linear(width, 256)
        self.lr = lr
        self.seen_ids: list[int] = []
        self.last_loss = float("nan")

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids).transpose(1, 2)
        for conv, dilation in zip(self.convs, self.dilations, strict=True):
            # Left-pad so position t only sees bytes <= t (causal).
            h = h + F.gelu(conv(F.pad(h, (3 * dilation, 0))))
        return self.head(h.transpose(1, 2))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        logits = self(batch["input_ids"])
        # labels are padded with -100, which cross_entropy ignores.
        loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
        self.seen_ids.extend(batch["id"].tolist())
        self.last_loss = float(loss.detach())
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def _input_length(sample: dict[str, Any]) -> int:
    return int(sample["input_ids"].shape[0])


class StdlibDataModule(L.LightningDataModule):
    """:class:`StdlibBytes` in token-budget buckets; ``config.batch_size`` sizes the random
    batches compared with."""

    def __init__(self, dataset: StdlibBytes, lengths: Any, max_tokens: int, config: DemoConfig):
        super().__init__()
        self.dataset, self.lengths = dataset, lengths
        self.max_tokens, self.config = max_tokens, config
        self.collate = PadCollate(pad_value={"input_ids": PAD_ID, "labels": -100})

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        return move_to_device(batch, device)  # non_blocking where pinned

    def train_dataloader(self) -> ResumableDataLoader:
        workers, seed = self.config.num_workers, self.config.seed
        sampler = BucketBatchSampler(self.lengths, max_tokens=self.max_tokens, seed=seed)
        loader = ResumableDataLoader(
            self.dataset,
            batch_sampler=sampler,
            num_workers=workers,
            collate_fn=self.collate,
            pin_memory="auto",
            persistent_workers=workers > 0,
        )
        return attach_host(loader, self.trainer)

    def random_dataloader(self) -> ResumableDataLoader:
        return ResumableDataLoader(
            self.dataset,
            batch_size=self.config.batch_size,
            shuffle=True,
            collate_fn=self.collate,
            seed=self.config.seed,
        )


class _Interrupt(Callback):
    """Raise at the start of step ``at_step``, after that step's checkpoint."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.at_step:
            raise _Interrupted(self.at_step)


class _Interrupted(RuntimeError):
    pass


class _Clock(Callback):
    """Seconds inside training loops, summed over fits."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def on_train_start(self, *args: Any) -> None:
        self._start = time.perf_counter()

    def on_train_end(self, *args: Any) -> None:
        self.seconds += time.perf_counter() - self._start

    def on_exception(self, *args: Any) -> None:
        self.on_train_end()


@dataclass(frozen=True)
class DemoConfig:
    """Knobs of the demo; ``max_tokens`` defaults to ``batch_size * max_len``."""

    max_samples: int = 3000
    max_len: int = 256
    batch_size: int = 32
    max_tokens: int | None = None
    epochs: int = 2
    num_workers: int = 2
    seed: int = 0
    workdir: Path = Path("runs/demo")
    progress_bar: bool = True


@dataclass(frozen=True)
class DemoResult:
    """What the summary reports."""

    samples: int
    steps: int
    seconds: float
    padded_fraction: float
    padded_fraction_random: float
    batch_size: int
    max_tokens: int
    final_loss: float
    interrupted_at: int
    resume_exact: bool
    repeated: int
    skipped: int

    def summary(self) -> str:
        """The lines printed at the end of ``loaderkit demo``."""
        verdict = "exact" if self.resume_exact else "NOT exact"
        return "\n".join(
            [
                "loaderkit demo summary",
                f"  trained        {self.steps} steps, {self.samples} samples in "
                f"{self.seconds:.1f} s of training loop ({self.samples / self.seconds:.0f} "
                "samples/s)",
                f"  padding        {self.padded_fraction_random:.1%} of tokens with random "
                f"batches of {self.batch_size} -> {self.padded_fraction:.1%} with length "
                f"buckets (max_tokens={self.max_tokens}, BucketBatchSampler + PadCollate)",
                f"  final loss     {self.final_loss:.3f} (byte-level cross-entropy, nats)",
                f"  resume         interrupted at step {self.interrupted_at}, resumed from its "
                f"checkpoint: sample stream {verdict} vs an uninterrupted run "
                f"({self.repeated} repeated, {self.skipped} skipped)",
            ]
        )


def _padding_fraction(loader: ResumableDataLoader) -> float:
    real = padded = 0
    for batch in loader:
        real += int(batch["lengths"].sum())
        padded += batch["input_ids"].numel()
    return 1.0 - real / padded


def _trainer(config: DemoConfig, callbacks: list[Callback]) -> L.Trainer:
    return L.Trainer(
        max_epochs=config.epochs,
        accelerator="auto",
        devices=1,
        # Token-budget epochs differ in batch count; Lightning reads it once per fit.
        callbacks=[ElasticResume(), *callbacks],
        logger=False,
        enable_model_summary=False,
        enable_progress_bar=config.progress_bar,
        default_root_dir=config.workdir,
        num_sanity_val_steps=0,
    )


def run_demo(config: DemoConfig) -> DemoResult:
    """Train, interrupt, resume, and check the resumed sample stream."""
    if config.max_len < 15:  # StdlibBytes' blocks are at least 16 bytes: 15 inputs
        raise ValueError(f"demo: --max-len must be >= 15, got {config.max_len}; pass e.g. 64.")
    dataset = StdlibBytes(config.max_samples, max_len=config.max_len + 1)
    lengths = compute_lengths(dataset, _input_length, progress=False)
    max_tokens = config.max_tokens or config.batch_size * config.max_len
    if max_tokens < config.max_len:
        raise ValueError(
            f"demo: --max-tokens must be >= --max-len ({config.max_len}) to fit the longest "
            f"sample, got {max_tokens}; raise --max-tokens or lower --max-len."
        )

    datamodule = partial(StdlibDataModule, dataset, lengths, max_tokens, config)

    plan = datamodule().train_dataloader().plan
    steps = [plan.epoch_length(epoch) for epoch in range(config.epochs)]
    if steps[-1] < 2:
        raise ValueError(
            f"demo: the last epoch has {steps[-1]} batch, too few to interrupt it mid-epoch; "
            "raise --max-samples, or lower --batch-size or --max-tokens."
        )
    interrupt_at = sum(steps[:-1]) + steps[-1] // 2
    config.workdir.mkdir(parents=True, exist_ok=True)
    # Its own fresh folder: the user's files in workdir are never touched.
    ckpt_dir = Path(tempfile.mkdtemp(prefix="demo-checkpoints-", dir=config.workdir))
    try:
        return _interrupted_run(config, datamodule, interrupt_at, ckpt_dir, max_tokens)
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)


def _interrupted_run(
    config: DemoConfig, datamodule: Any, interrupt_at: int, ckpt_dir: Path, max_tokens: int
) -> DemoResult:
    """Train until ``interrupt_at``, resume from the checkpoint in ``ckpt_dir``, compare."""
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir, every_n_train_steps=interrupt_at, save_top_k=-1, save_last=True
    )

    clock = _Clock()
    L.seed_everything(config.seed, verbose=False)
    first = ByteLM()
    try:
        _trainer(config, [checkpoint, _Interrupt(interrupt_at), clock]).fit(
            first, datamodule=datamodule()
        )
        raise RuntimeError("the demo's interruption did not happen")  # pragma: no cover
    except _Interrupted:
        print(f"\n[demo] interrupted after step {interrupt_at}; resuming from its checkpoint")
    second = ByteLM()
    resumed = _trainer(config, [clock])
    resumed.fit(second, datamodule=datamodule(), ckpt_path=ckpt_dir / "last.ckpt")

    # The uninterrupted reference: the same loader alone decides the stream.
    loader = datamodule().train_dataloader()
    reference = [i for _ in range(config.epochs) for b in loader for i in b["id"].tolist()]
    trained = first.seen_ids + second.seen_ids
    extra, missing = Counter(trained) - Counter(reference), Counter(reference) - Counter(trained)
    return DemoResult(
        samples=len(trained),
        steps=resumed.global_step,
        seconds=clock.seconds,
        padded_fraction=_padding_fraction(datamodule().train_dataloader()),
        padded_fraction_random=_padding_fraction(datamodule().random_dataloader()),
        batch_size=config.batch_size,
        max_tokens=max_tokens,
        final_loss=second.last_loss,
        interrupted_at=interrupt_at,
        resume_exact=trained == reference,
        repeated=sum(extra.values()),
        skipped=sum(missing.values()),
    )
