"""The data a DataModule serves after ``load_from_checkpoint`` and where its splits meet:
never silently other samples than the saved module's."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from loaderkit import TokenReader, write_shards
from loaderkit.lightning.datamodules import (
    MixedDataModule,
    SequenceDataModule,
    ShardedDataModule,
    TensorDataModule,
)
from tests.support.datamodules import AnyBatchModule
from tests.support.helpers import trainer_kwargs

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]


def _saved(tmp_path: Path, dm: L.LightningDataModule) -> Path:
    trainer = L.Trainer(**trainer_kwargs(max_epochs=1))
    trainer.fit(AnyBatchModule(), datamodule=dm)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    return path


def test_load_from_checkpoint_without_the_data_given_as_objects_is_refused(
    tmp_path: Path,
) -> None:
    # Was: val=(tensor,) stayed out of hparams, so the restored module had val=None and a fit
    # with it validated on nothing (0 of 5 val samples), without a word.
    torch.save((torch.arange(20.0),), tmp_path / "x.pt")
    val = (torch.arange(100.0, 105.0),)
    dm = TensorDataModule(train=str(tmp_path / "x.pt"), val=val, batch_size=4)
    path = _saved(tmp_path, dm)
    with pytest.raises(ValueError, match=r"given \['val'\] as objects.*load_from_checkpoint"):
        TensorDataModule.load_from_checkpoint(path, weights_only=False)
    restored = TensorDataModule.load_from_checkpoint(path, val=val, weights_only=False)
    restored.setup("fit")
    assert torch.equal(restored.val_dataset.tensors[0], val[0])
    # Positional tensors are data too; paths and settings alone restore as they were.
    positional = _saved(tmp_path, TensorDataModule(torch.arange(20.0), batch_size=4))
    with pytest.raises(ValueError, match=r"no data"):
        TensorDataModule.load_from_checkpoint(positional, weights_only=False)
    dm = TensorDataModule(train=str(tmp_path / "x.pt"), val_fraction=0.25, seed=5, batch_size=4)
    restored = TensorDataModule.load_from_checkpoint(_saved(tmp_path, dm), weights_only=False)
    restored.setup("fit")
    assert [s.tolist() for s in restored.split] == [s.tolist() for s in dm.split]


class _Masked(list):  # type: ignore[type-arg]
    """Sequences whose reads draw: a random token appended, as random masking would."""

    def __getitem__(self, i: int) -> torch.Tensor:  # type: ignore[override]
        return torch.cat([super().__getitem__(i), torch.randint(0, 10**6, (1,))])


def test_sequence_samples_that_draw_are_the_same_for_any_num_workers() -> None:
    # Was: per_sample_seeding=False, so the draws followed the worker processes' RNGs:
    # num_workers=0 and 2 gave other tokens in every batch.
    samples = _Masked(torch.full((1 + i % 4,), i) for i in range(16))
    runs = [
        [
            b.values
            for b in SequenceDataModule(
                samples, batch_size=4, num_workers=w, seed=1
            ).train_dataloader()
        ]
        for w in (0, 2)
    ]
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_token_options_beside_a_reader_object_are_refused(tmp_path: Path) -> None:
    # Was: ignored (samples of the reader's 8 tokens), yet kept in hparams, so a module
    # restored from the checkpoint read 5-token samples (seq_len=4, targets=True).
    write_shards(tmp_path, [np.arange(64)], TokenReader(seq_len=8))
    for make in (ShardedDataModule, lambda root, **kw: MixedDataModule({"a": root}, **kw)):
        with pytest.raises(ValueError, match=r"token options seq_len, targets .* TokenReader"):
            make(str(tmp_path), reader=TokenReader(seq_len=8), seq_len=4, targets=True)


def test_val_or_test_shards_that_train_reads_too_are_warned_of(tmp_path: Path) -> None:
    # Was: silent; val on the train folder measured the samples the model trains on.
    root = tmp_path / "train"
    write_shards(root, [np.arange(32), np.arange(32)], TokenReader(seq_len=4))
    (tmp_path / "link").symlink_to(root)
    shared = r"the val data shares 2 shard files with train .* trains on"
    with pytest.warns(UserWarning, match=shared):
        ShardedDataModule(str(root), val_shards=str(tmp_path / "link"), seq_len=4).setup("fit")
    with pytest.warns(UserWarning, match=r"the test data shares 1 shard files"):
        test = sorted(root.glob("*.npy"))[:1]
        MixedDataModule({"a": str(root)}, test=[str(test[0])], seq_len=4).setup("test")
    write_shards(tmp_path / "val", [np.arange(32)], TokenReader(seq_len=4))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ShardedDataModule(str(root), val_shards=str(tmp_path / "val"), seq_len=4).setup("fit")
    assert not [w for w in seen if "shard files with train" in str(w.message)]
