"""Two train loaders under one Trainer (a CombinedLoader) resume exactly.

``"max_size_cycle"``: the shorter loader is re-iterated (cycled) by Lightning inside
the trainer's epoch, into later epochs of its own. Restored from a mid-epoch
checkpoint, Lightning replays the epoch start's ``set_epoch(current_epoch)`` on it,
which used to discard its loaded position and restart it at the trainer's epoch.
With an unsized member the combined loader has no length and Lightning holds a batch
ahead (the map-style one skipped it); in ``"max_size"`` mode a loader that ran out
came back with its next epoch's batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import IterableDataset, get_worker_info

from loaderkit import (
    AttachLoaders,
    IterableReader,
    LoaderkitError,
    ResumableDataLoader,
    StreamingShardedDataset,
)
from tests.support.helpers import id_stream_shards, read_id_shard, step_checkpoints, trainer_kwargs

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]


class _Stop(RuntimeError):
    pass


def _ids(batch: Any) -> Any:
    if isinstance(batch, dict):  # a stream's samples
        return batch["id"].tolist()
    return None if batch is None else batch.tolist()


class _Recorder(L.LightningModule):
    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.stop_at = stop_at
        self.seen: list[dict[str, list[int]]] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.seen.append({k: _ids(v) for k, v in batch.items()})
        return self.layer(torch.ones(1, 1)).sum()

    def on_train_batch_end(self, *args: Any) -> None:
        if self.stop_at is not None and self.global_step == self.stop_at:
            raise _Stop

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


class _Ids(IterableDataset[int]):
    """Ids without a length (12 by default): the combined loader has none, so Lightning
    prefetches."""

    def __init__(self, first: int = 200, stop: int = 212) -> None:
        self.first, self.stop = first, stop

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        yield from range(self.first + worker, self.stop, workers)


class _SizedIds(_Ids):
    """Ids with a length: the combined loader has one, so Lightning sets epochs first."""

    def __len__(self) -> int:
        return self.stop - self.first


def _stream(steps: int, num_workers: int) -> ResumableDataLoader:
    data = StreamingShardedDataset(
        id_stream_shards(36), IterableReader(read_id_shard), steps_per_epoch=steps
    )
    return ResumableDataLoader(data, batch_size=4, seed=0, num_workers=num_workers)


class _TwoLoaders(L.LightningDataModule):
    def __init__(self, kind: str = "cycle") -> None:
        super().__init__()
        self.kind = kind

    def train_dataloader(self) -> Any:
        loaders = {  # a: 10 batches per epoch; b: 3, cycled into its epochs 1..3 meanwhile
            "a": ResumableDataLoader(list(range(40)), batch_size=4, shuffle=True, seed=1),
            "b": ResumableDataLoader(list(range(100, 112)), batch_size=4, shuffle=True, seed=2),
        }
        if self.kind in ("unsized", "max_size_unsized"):
            loaders["b"] = ResumableDataLoader(_Ids(), batch_size=4)
        if self.kind == "sized_iterable":
            loaders["b"] = ResumableDataLoader(_SizedIds(100, 112), batch_size=4)
        if self.kind == "unsized_longer":  # the sized one cycles
            loaders["a"] = ResumableDataLoader(_Ids(0, 40), batch_size=4)
        if self.kind.startswith("stream"):  # b: 3 steps a pass, its streams go on across them
            workers = int(self.kind[-1])
            loaders["a"] = ResumableDataLoader(list(range(20)), batch_size=4, shuffle=True,
                                               seed=1, num_workers=workers)  # fmt: skip
            loaders["b"] = _stream(3, workers)
        if self.kind == "unsized_stream":  # b: a stream of 6 batches a pass, no length
            shards = StreamingShardedDataset(id_stream_shards(24), IterableReader(read_id_shard))
            loaders["b"] = ResumableDataLoader(shards, batch_size=4, seed=0)
        if self.kind == "min_size":  # 5 steps an epoch: a's last 7 ids are never trained
            loaders = {
                "a": ResumableDataLoader(_Ids(0, 27), batch_size=4),
                "b": ResumableDataLoader(_Ids(100, 110), batch_size=2),
            }
            return CombinedLoader(loaders, mode="min_size")
        if self.kind == "one_unsized":  # as Lightning wraps a lone loader
            return CombinedLoader({"a": ResumableDataLoader(_Ids(0, 40), batch_size=4)})
        mode = "max_size" if self.kind.startswith("max_size") else "max_size_cycle"
        return CombinedLoader(loaders, mode=mode)


def _fit_cut_resume(
    tmp_path: Path, k: int, kind: str, recorder: type[_Recorder] | None = None, **options: Any
) -> tuple[list[Any], list[Any]]:
    """The uninterrupted run's batches; the run cut at step ``k``'s plus the resumed run's."""
    recorder = recorder or _Recorder
    full = recorder()
    # AttachLoaders hands both loaders the trainer, whose restart bookkeeping they follow.
    L.Trainer(**trainer_kwargs(max_epochs=2, callbacks=[AttachLoaders()], **options)).fit(
        full, datamodule=_TwoLoaders(kind)
    )
    cut = recorder(stop_at=k)
    trainer = L.Trainer(
        **trainer_kwargs(
            max_epochs=2,
            enable_checkpointing=True,
            callbacks=[step_checkpoints(tmp_path, 1), AttachLoaders()],
            **options,
        )
    )
    with pytest.raises(_Stop):
        trainer.fit(cut, datamodule=_TwoLoaders(kind))
    resumed = recorder()
    L.Trainer(**trainer_kwargs(max_epochs=2, callbacks=[AttachLoaders()], **options)).fit(
        resumed, datamodule=_TwoLoaders(kind), ckpt_path=tmp_path / f"step{k:03d}.ckpt"
    )
    return full.seen, cut.seen + resumed.seen


@pytest.mark.parametrize(
    ("kind", "k"),
    [
        ("cycle", 5),  # mid b's own epoch 1
        ("cycle", 10),  # the trainer's epoch end
        ("cycle", 14),  # epoch 1
        ("unsized", 4),  # b without a length: Lightning holds a batch of each loader ahead
        ("unsized", 14),
        # Lightning saves no record of which loaders ran out: b, cycled before the save,
        # ran on to the end of its own epoch (steps 10, 11) inside the trainer's epoch 0.
        ("unsized", 9),
        ("unsized", 10),  # saved on the epoch's last batch: the next starts afresh
        ("unsized", 19),
        ("unsized_longer", 9),
        ("unsized_longer", 10),
        # Lightning's set_epoch(0) on the restored b restarted its cycled epoch: b repeated.
        ("sized_iterable", 4),
        ("sized_iterable", 5),
        # Saved on the epoch's last batch, a's loaded position mid-epoch 0 was kept: the
        # resumed epoch 1 trained a's untrained tail (24, 25, 26) for 1 step, not 5.
        ("min_size", 5),
        ("min_size", 3),
        ("max_size", 6),  # b ran out at step 3: it yields nothing until the next epoch
        ("max_size", 14),
    ],
)
def test_combined_loaders_resume_each_at_its_own_position(
    tmp_path: Path, kind: str, k: int
) -> None:
    full, joined = _fit_cut_resume(tmp_path, k, kind)
    assert joined == full
    if kind.startswith("max_size"):
        assert [s.get("b") for s in full[3:10]] == [None] * 7


class _DrawsItsBatch(_Recorder):
    """training_step(dataloader_iter): Lightning fetches no batch ahead."""

    def training_step(self, dataloader_iter: Any) -> Any:  # type: ignore[override]
        batch, _, _ = next(dataloader_iter)
        return super().training_step(batch, 0)


@pytest.mark.parametrize("kind", ["unsized", "unsized_stream"])
@pytest.mark.parametrize("k", [6, 10])
def test_a_loader_without_a_length_saved_at_a_pass_end_resumes_without_a_prefetch(
    tmp_path: Path, kind: str, k: int
) -> None:
    # Drawn by training_step(dataloader_iter), b was saved at its pass's end unseen to end:
    # resumed, it ran out twice and ended the epoch 4 steps short (k=6). The stream saved at
    # the epoch's last step in its pass 1 went on mid-pass in the next epoch, 1 (k=10).
    full, joined = _fit_cut_resume(tmp_path, k, kind, _DrawsItsBatch)
    assert joined == full and len(full) == 20


@pytest.mark.parametrize("k", [9, 10])
def test_a_limit_past_the_epoch_keeps_the_run_out_rule(tmp_path: Path, k: int) -> None:
    # limit_train_batches=100 gave the combined loader a length, which turned off "a restored
    # loader that cycled runs out once more first": 0-7 trained twice in epoch 0 (review 367).
    full, joined = _fit_cut_resume(tmp_path, k, "unsized", limit_train_batches=100)
    assert joined == full


@pytest.mark.parametrize("kind", ["cycle", "unsized"])
def test_a_loader_cycled_into_the_next_epoch_starts_it_afresh_after_a_limited_epoch(
    tmp_path: Path, kind: str
) -> None:
    # limit_train_batches=5 ends epoch 0 with b part-way through its own epoch 1; saved
    # there, the resumed b went on mid-epoch where the run started epoch 1 afresh.
    full, joined = _fit_cut_resume(tmp_path, 5, kind, limit_train_batches=5)
    assert joined == full


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stream_cycled_into_the_next_epoch_starts_it_afresh_after_an_epoch_end_resume(
    tmp_path: Path, num_workers: int
) -> None:
    # b cycled into its epoch 1 before epoch 0's end; restored from that checkpoint (whose
    # state Lightning does not load) it went on mid-epoch: other batches from epoch 1 on.
    kind = f"stream{num_workers}"
    full = _Recorder()
    L.Trainer(**trainer_kwargs(max_epochs=2, callbacks=[AttachLoaders()])).fit(
        full, datamodule=_TwoLoaders(kind)
    )
    ends = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)
    cut = _Recorder()
    kwargs = trainer_kwargs(max_epochs=1, enable_checkpointing=True)
    L.Trainer(**kwargs, callbacks=[ends, AttachLoaders()]).fit(cut, datamodule=_TwoLoaders(kind))
    resumed = _Recorder()
    L.Trainer(**trainer_kwargs(max_epochs=2, callbacks=[AttachLoaders()])).fit(
        resumed, datamodule=_TwoLoaders(kind), ckpt_path=tmp_path / "last.ckpt"
    )
    assert cut.seen + resumed.seen == full.seen


@pytest.mark.parametrize("kind", ["one_unsized", "unsized"])
def test_reloaded_loaders_resume_exactly_mid_epoch(tmp_path: Path, kind: str) -> None:
    # Reloading iterates each loader twice as an epoch starts (the second looks like a
    # cycle): a lone loader's restored rest was taken for one that had run out.
    full, joined = _fit_cut_resume(tmp_path, 12, kind, reload_dataloaders_every_n_epochs=1)
    assert joined == full


def test_a_loader_that_ran_out_beside_an_unsized_one_in_max_size_mode_is_refused(
    tmp_path: Path,
) -> None:
    # Lightning prefetches it before any set_epoch: resumed, it started its next epoch there.
    trainer = L.Trainer(
        **trainer_kwargs(
            max_epochs=1, enable_checkpointing=True, callbacks=[step_checkpoints(tmp_path, 1)]
        )
    )
    with pytest.raises(LoaderkitError, match=r"ran out inside a CombinedLoader\('max_size'\)"):
        trainer.fit(_Recorder(), datamodule=_TwoLoaders("max_size_unsized"))


def test_a_cycled_loader_goes_through_its_own_epochs_inside_the_trainers() -> None:
    # Each cycle was named the trainer's epoch: b repeated one shuffled order.
    model = _Recorder()
    L.Trainer(**trainer_kwargs(max_epochs=1, callbacks=[AttachLoaders()])).fit(
        model, datamodule=_TwoLoaders()
    )
    cycles = [[i for s in model.seen[c : c + 3] for i in s["b"]] for c in (0, 3, 6)]
    own = ResumableDataLoader(list(range(100, 112)), batch_size=4, shuffle=True, seed=2)
    assert cycles == [[int(i) for b in own for i in b] for _ in range(3)]
    assert len({tuple(c) for c in cycles}) == 3


def test_a_second_fit_over_the_same_loaders_starts_again_at_epoch_0() -> None:
    # A new Trainer counts epochs from 0; the late set_epoch(0) was ignored as an epoch the
    # loader "already began" (in the first fit): epoch 2's order was trained twice.
    a = ResumableDataLoader(list(range(16)), batch_size=4, shuffle=True, seed=1)
    b = ResumableDataLoader(_Ids(), batch_size=4)
    combined = CombinedLoader({"a": a, "b": b}, mode="max_size_cycle")
    for max_epochs in (2, 4):
        model = _Recorder()
        L.Trainer(**trainer_kwargs(max_epochs=max_epochs, callbacks=[AttachLoaders()])).fit(
            model, train_dataloaders=combined
        )
    per_epoch = [[i for s in model.seen[e * 4 : e * 4 + 4] for i in s["a"]] for e in range(4)]
    own = ResumableDataLoader(list(range(16)), batch_size=4, shuffle=True, seed=1)
    assert per_epoch == [[int(i) for b in own for i in b] for _ in range(4)]
