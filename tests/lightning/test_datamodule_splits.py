"""The data a DataModule serves after ``load_from_checkpoint`` and where its splits meet:
never silently other samples than the saved module's."""

from __future__ import annotations

import collections
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, Subset

from loaderkit import ShardedDataset, TokenReader, write_shards
from loaderkit.errors import StateMismatchError
from loaderkit.lightning.datamodules import (
    ArrayDataModule,
    LoaderDataModule,
    MixedDataModule,
    SequenceDataModule,
    ShardedDataModule,
    TensorDataModule,
)
from tests.support.datamodules import AnyBatchModule
from tests.support.helpers import DataParallelOf, trainer_kwargs

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
    lost = r"given \['val'\] as objects.*setup\('(fit|validate)'\) reads.*\(path, val=\.\.\.\)"
    for stage in ("fit", "validate"):
        with pytest.raises(ValueError, match=lost):
            TensorDataModule.load_from_checkpoint(path, weights_only=False).setup(stage)
    restored = TensorDataModule.load_from_checkpoint(path, val=val, weights_only=False)
    restored.setup("fit")
    assert torch.equal(restored.val_dataset.tensors[0], val[0])
    # val=None passed on purpose goes without it; paths and settings restore as they were.
    restored = TensorDataModule.load_from_checkpoint(path, val=None, weights_only=False)
    restored.setup("fit")
    assert restored.val_dataset is None
    dm = TensorDataModule(train=str(tmp_path / "x.pt"), val_fraction=0.25, seed=5, batch_size=4)
    restored = TensorDataModule.load_from_checkpoint(_saved(tmp_path, dm), weights_only=False)
    restored.setup("fit")
    assert [s.tolist() for s in restored.split] == [s.tolist() for s in dm.split]


def test_a_restore_is_refused_only_for_the_splits_its_stage_reads(tmp_path: Path) -> None:
    # A predict-only restore of a module given train and val as objects serves predict.
    dm = TensorDataModule(torch.arange(20.0), val=(torch.arange(5.0),), batch_size=4)
    path = _saved(tmp_path, dm)
    restored = TensorDataModule.load_from_checkpoint(path, predict=(torch.zeros(3),))
    assert [b[0].tolist() for b in restored.predict_dataloader()] == [[0.0, 0.0, 0.0]]
    restored.setup("test")  # none given, none lost
    with pytest.raises(ValueError, match=r"given \['train', 'val'\] .* setup\('fit'\)"):
        restored.setup("fit")


@pytest.mark.parametrize("cls", [TensorDataModule, SequenceDataModule])
def test_a_restore_that_lost_every_split_names_them(tmp_path: Path, cls: Any) -> None:
    # Hunter 342: the constructor's "no data; pass tensors" came first, naming no split.
    train = [torch.arange(3 + i % 4) for i in range(20)]
    data = (torch.arange(20.0),) if cls is TensorDataModule else train
    path = _saved(tmp_path, cls(train=data, val=data[:5], batch_size=4))
    restored = cls.load_from_checkpoint(path, weights_only=False)
    with pytest.raises(ValueError, match=r"given \['train', 'val'\] as objects.*\(path, train="):
        restored.setup("fit")
    with pytest.raises(ValueError, match="no data; pass"):  # passed None on purpose
        cls.load_from_checkpoint(path, train=None, val=None, weights_only=False)


class _Stream(torch.utils.data.IterableDataset[torch.Tensor]):
    def __iter__(self) -> Any:
        return (torch.tensor([float(i)]) for i in range(10))


class _StreamSplits(LoaderDataModule):
    def build_datasets(self, stage: str) -> dict[str, Any]:
        return {"val": _Stream(), "predict": _Stream()}


def test_an_iterable_predict_split_is_read_on_one_process() -> None:
    # Hunter 345: a bare "object of type '_Stream' has no len()" (val and test read it).
    class Predicts(AnyBatchModule):
        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            return batch

    out = L.Trainer(**trainer_kwargs()).predict(Predicts(), datamodule=_StreamSplits(batch_size=4))
    assert torch.cat(out).flatten().tolist() == [float(i) for i in range(10)]  # type: ignore[arg-type]
    # On 2 ranks each fix the loader named was refused by the module (review 346).
    trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(0, 2)))
    with pytest.raises(ValueError, match=r"predict split is a _Stream, which 2 ranks .*map-style"):
        trainer.predict(Predicts(), datamodule=_StreamSplits(batch_size=4))


def test_trainer_validate_without_a_val_split_is_refused_and_a_fit_without_one_runs() -> None:
    # Lightning validates an empty list in 0 batches with a warning only (review 346 F5b).
    dm = TensorDataModule(torch.arange(16.0), batch_size=4)
    module = AnyBatchModule()
    L.Trainer(**trainer_kwargs(max_epochs=1)).fit(module, datamodule=dm)
    assert module.rows == {0: 16} and module.val_batches == 0
    with pytest.raises(ValueError, match=r"has no val data \(it has \['train'\]\).*val_fraction"):
        L.Trainer(**trainer_kwargs()).validate(module, datamodule=dm)
    held_out = TensorDataModule(torch.arange(16.0), batch_size=4, val_fraction=0.25)
    L.Trainer(**trainer_kwargs()).validate(module, datamodule=held_out)
    assert module.val_batches == 1
    # A subclass whose build_datasets("validate") returns no val is told so (review 353).
    fit_only = _StageAware(torch.arange(8.0), val=(torch.arange(4.0),), batch_size=4)
    fix = r"has no val data \(it has \[\]\); return it from build_datasets\('validate'\)"
    with pytest.raises(ValueError, match=fix):
        L.Trainer(**trainer_kwargs()).validate(module, datamodule=fit_only)


def test_a_subclass_built_by_a_base_class_restore_leaves_no_data_to_it() -> None:
    # Review 347: LightningCLI's checkpoints build the subclass they name when loaded through
    # the base class; its constructor refused "no data" before the lost splits were named.
    import loaderkit.lightning.datamodules.base as base

    class Sub(SequenceDataModule):
        pass

    token = base._LOADING.set(SequenceDataModule)
    try:
        Sub(batch_size=2)  # as load_from_checkpoint builds it: the check is left to it
        with pytest.raises(ValueError, match="no data"):
            Sub(batch_size=2)  # once: a module built inside it is checked
    finally:
        base._LOADING.reset(token)


def test_positional_train_data_lost_by_a_restore_is_refused(tmp_path: Path) -> None:
    # Was: positional tensors/arrays stayed out of the saved state, so a module restored
    # without them had no train data (train_dataset None), without a word.
    torch.save((torch.arange(100.0, 105.0),), tmp_path / "v.pt")
    np.save(tmp_path / "v.npy", np.arange(100.0, 105.0))
    for cls, x, v in (
        (TensorDataModule, torch.arange(20.0), "v.pt"),
        (ArrayDataModule, np.arange(20.0), "v.npy"),
    ):
        path = _saved(tmp_path, cls(x, val=str(tmp_path / v), batch_size=4))
        restored = cls.load_from_checkpoint(path, weights_only=False)
        with pytest.raises(ValueError, match=r"given \['train'\] as objects"):
            restored.setup("fit")
        restored.setup("validate")
        assert len(restored.val_dataset) == 5


def test_a_reader_object_lost_by_a_restore_is_refused(tmp_path: Path) -> None:
    # Was: reader defaults to "tokens", so a lost TokenReader(seq_len=8, targets=True) was
    # never missed: load_from_checkpoint(p, seq_len=8) gave 8-token samples, not 9.
    write_shards(tmp_path, [np.arange(64)], TokenReader(seq_len=8))
    reader = TokenReader(seq_len=8, targets=True)
    for cls, make in (
        (ShardedDataModule, lambda **kw: ShardedDataModule(str(tmp_path), **kw)),
        (MixedDataModule, lambda **kw: MixedDataModule({"a": str(tmp_path)}, **kw)),
    ):
        path = _saved(tmp_path, make(reader=reader, batch_size=2))
        with pytest.raises(ValueError, match=r"reader"):
            cls.load_from_checkpoint(path, weights_only=False)
        with pytest.raises(ValueError, match=r"given \['reader'\] as objects"):
            cls.load_from_checkpoint(path, seq_len=8, weights_only=False)
        restored = cls.load_from_checkpoint(path, reader=reader, weights_only=False)
        assert next(iter(restored.train_dataloader())).shape == (2, 9)


def test_a_mix_given_lists_of_paths_restores_them(tmp_path: Path) -> None:
    # Was: a top-level list of paths stayed out of hparams (it could have been data), so
    # load_from_checkpoint failed with Python's "missing 1 required positional argument".
    a, b = tmp_path / "a", tmp_path / "b"
    write_shards(a, [np.arange(32)], TokenReader(seq_len=4))
    write_shards(b, [np.arange(100, 132)], TokenReader(seq_len=4))
    dm = MixedDataModule([a, str(b)], val=(str(b), a), seq_len=4, batch_size=2, seed=3)
    restored = MixedDataModule.load_from_checkpoint(_saved(tmp_path, dm), weights_only=True)
    assert restored.hparams["sources"] == [str(a), str(b)]
    assert restored.hparams["val"] == (str(b), str(a))
    restored.setup("fit")
    for got, want in zip(restored.train_dataloader(), dm.train_dataloader(), strict=True):
        assert torch.equal(got, want)
    assert [v.tolist() for v in restored.val_dataloader()] == [
        v.tolist() for v in dm.val_dataloader()
    ]


def test_a_namedtuple_setting_is_kept_as_given() -> None:
    # An intermediate version rebuilt every tuple from a generator: a namedtuple refused it.
    size = collections.namedtuple("Size", "h w")(4, 4)

    class Sized(TensorDataModule):
        def __init__(self, data: Any, size: Any, **kwargs: Any) -> None:
            super().__init__(data, **kwargs)
            self.size = size

    assert Sized(torch.arange(8.0), size=size, batch_size=4).hparams["size"] == size


def test_the_datamodule_state_has_a_version_and_refuses_unknown_keys() -> None:
    dm = TensorDataModule(torch.arange(8.0), batch_size=4)
    state = dm.state_dict()
    assert state == {"version": 1, "data_not_in_hparams": ["train"]}
    for bad in ({**state, "extra": 1}, {**state, "version": 2}, {"data_not_in_hparams": []}):
        with pytest.raises(StateMismatchError, match=r"expected the keys .* at version 1"):
            dm.load_state_dict(bad)


def test_a_trainer_resume_with_the_users_own_module_is_never_refused(tmp_path: Path) -> None:
    # The module given to fit/validate(ckpt_path=...) is the user's: with or without val.
    torch.save((torch.arange(20.0),), tmp_path / "x.pt")
    val = (torch.arange(100.0, 105.0),)
    path = _saved(tmp_path, TensorDataModule(train=str(tmp_path / "x.pt"), val=val, batch_size=4))
    for given in ({"val": val}, {}):
        model = AnyBatchModule()
        dm = TensorDataModule(train=str(tmp_path / "x.pt"), batch_size=4, **given)
        L.Trainer(**trainer_kwargs(max_epochs=2)).fit(model, datamodule=dm, ckpt_path=path)
        assert model.rows == {1: 20} and model.val_batches == (2 if given else 0)
        model = AnyBatchModule()
        dm = TensorDataModule(train=str(tmp_path / "x.pt"), batch_size=4, **given)
        if not given:  # refused for lack of val data, not for the restore
            with pytest.raises(ValueError, match=r"has no val data \(it has \['train'\]\)"):
                L.Trainer(**trainer_kwargs()).validate(model, datamodule=dm, ckpt_path=path)
            continue
        L.Trainer(**trainer_kwargs()).validate(model, datamodule=dm, ckpt_path=path)
        assert model.val_batches == 2


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


def test_val_or_test_subsets_and_concatenations_of_train_shards_are_warned_of(
    tmp_path: Path,
) -> None:
    # Was: silent for a torch Subset or ConcatDataset over the train folder's dataset.
    write_shards(tmp_path, [np.arange(32), np.arange(32)], TokenReader(seq_len=4))
    ds = ShardedDataset(str(tmp_path), TokenReader(seq_len=4))
    for val in (Subset(ds, range(8)), ConcatDataset([ds])):
        with pytest.warns(UserWarning, match=r"the val data shares 2 shard files with train"):
            MixedDataModule({"a": str(tmp_path)}, val=val, seq_len=4).setup("fit")
    # A train subset shares files, not samples, with a val subset of the rest.
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        MixedDataModule({"a": Subset(ds, range(8))}, val=Subset(ds, range(8, 16))).setup("fit")
    assert not [w for w in seen if "shard files with train" in str(w.message)]


class _NumpyMasked(list):  # type: ignore[type-arg]
    """Sequences read a batch at a time, masked at random by numpy's global generator."""

    def __getitem__(self, i: int) -> torch.Tensor:  # type: ignore[override]
        sample = super().__getitem__(i).clone()
        sample[np.random.randint(len(sample))] = -1
        return sample

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        return [self[i] for i in indices]


def test_a_sequence_whose_batch_read_draws_is_refused_with_the_datamodule_fix() -> None:
    samples = _NumpyMasked(torch.full((2 + i % 4,), i) for i in range(16))
    with pytest.raises(ValueError, match=r"LoaderDataModule: override per_sample_seeding\(split\)"):
        next(iter(SequenceDataModule(samples, batch_size=4, seed=1).train_dataloader()))


def test_a_val_fraction_restore_without_its_train_data_is_refused_for_validation(
    tmp_path: Path,
) -> None:
    # The val split is cut from train: validate read nothing (val_batches 0), without a word.
    from lightning.pytorch.trainer.states import TrainerFn

    dm = TensorDataModule(torch.arange(20.0), val_fraction=0.25, batch_size=4)
    path = _saved(tmp_path, dm)
    restored = TensorDataModule.load_from_checkpoint(path, test=(torch.zeros(3),))
    with pytest.raises(ValueError, match=r"given \['train'\] as objects.*setup\('validate'\)"):
        restored.setup("validate")
    restored.setup(TrainerFn.TESTING)  # as Lightning passes it; test needs no train
    with pytest.raises(ValueError, match=r"setup\('fit'\) reads them"):
        restored.setup(TrainerFn.FITTING)


class _StageAware(TensorDataModule):
    """Builds only the splits of the stage asked for, as Lightning's own examples do."""

    def build_datasets(self, stage: str) -> dict[str, Any]:
        built = dict(super().build_datasets(stage))
        return {k: v for k, v in built.items() if k == {"fit": "train"}.get(stage, stage)}


def test_a_stage_aware_module_builds_each_split_a_loader_asks_for() -> None:
    # test_dataloader() first: train_dataloader() then said "has no train data".
    dm = _StageAware(torch.arange(8.0), test=(torch.arange(4.0),), batch_size=4)
    assert len(dm.test_dataloader()) == 1
    assert len(dm.train_dataloader()) == 2
    assert sorted(dm.describe()["splits"]) == ["test", "train"]


def test_numpy_settings_are_kept_as_python_values_a_checkpoint_loads() -> None:
    # Accepted (numpy_ok), they were kept as numpy objects: every resume failed to unpickle.
    import io

    from loaderkit.lightning.datamodules._util import path_text

    dm = TensorDataModule(
        torch.arange(8.0), batch_size=np.int64(4), seed=np.int64(3), val_fraction=np.float64(0.25)
    )
    saved = io.BytesIO()
    torch.save({**dict(dm.hparams), "dtype": path_text(np.dtype(">u2"))}, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=True)
    assert (loaded["batch_size"], loaded["seed"], loaded["val_fraction"]) == (4, 3, 0.25)
    assert type(loaded["batch_size"]) is int and np.dtype(loaded["dtype"]) == np.dtype(">u2")


class _Endless(torch.utils.data.Dataset[int]):
    """Computed samples: ``__getitem__`` never raises IndexError, so dict() over it never ends."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i * i


@pytest.mark.parametrize("returned", [_Endless(), [_Endless()], None])
def test_build_datasets_returning_no_dict_is_refused_by_name(returned: Any) -> None:
    # A dataset returned bare was walked by dict() for ever (hunter 275).
    class Bare(LoaderDataModule):
        def build_datasets(self, stage: str) -> Any:
            return returned

    with pytest.raises(TypeError, match=r"Bare.build_datasets must return a dict of splits"):
        Bare(batch_size=2).setup("fit")


def test_storage_options_stay_out_of_checkpoints(tmp_path: Path) -> None:
    # Hunter 312: storage_options (the docs' place for credentials) went into hparams, so the
    # secret was written in plain text into every checkpoint and the logger's hparams.yaml.
    import uuid

    url = f"memory://dm-{uuid.uuid4().hex[:8]}"
    write_shards(url, [np.arange(32), np.arange(32, 64)], TokenReader(seq_len=4))
    options = {"secret": "S3CR3T-VALUE", "anon": False}  # the memory filesystem takes any
    kwargs: dict[str, Any] = {"seq_len": 4, "batch_size": 4, "cache_dir": str(tmp_path / "c")}
    dm = ShardedDataModule(url, storage_options=options, **kwargs)
    assert "storage_options" not in dm.hparams
    trainer = L.Trainer(**trainer_kwargs(max_epochs=1, logger=True, default_root_dir=tmp_path))
    trainer.fit(AnyBatchModule(), datamodule=dm)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    written = [path, *tmp_path.rglob("hparams.yaml")]
    assert len(written) == 2 and not [p for p in written if b"S3CR3T" in p.read_bytes()]
    for again in ({}, {"storage_options": options}):  # they change no sample: not required
        restored = ShardedDataModule.load_from_checkpoint(path, weights_only=False, **again)
        restored.setup("fit")
        assert len(restored.train_dataset) == 16
    # The other DataModules with URLs (built only: they list nothing until setup).
    sources = {"a": f"{url}/a", "b": f"{url}/b"}
    for other in (
        SequenceDataModule(f"{url}/x.parquet", storage_options=options),
        MixedDataModule(sources, seq_len=4, storage_options=options),
    ):
        assert "storage_options" not in other.hparams
