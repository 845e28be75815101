"""loaderkit.lightning.datamodules: every DataModule trains under a CPU ``lightning.Trainer``,
resumes exactly from a Lightning checkpoint (the oracle of ``tests/support/helpers.py``), and
checks its input.

Tiny data throughout: 64 samples, two epochs, a few batches each.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch

import loaderkit.lightning.datamodules.base as base_module
from loaderkit import (
    BucketBatchSampler,
    ElasticResume,
    JsonlReader,
    MixedDataset,
    ShardedDataset,
    StreamingShardedDataset,
    TensorDataset,
    TokenReader,
    write_shards,
)
from loaderkit.env import cpu_budget
from loaderkit.errors import LoaderkitError, MissingDependencyError
from loaderkit.lightning.datamodules import (
    ArrayDataModule,
    ImageFolderDataModule,
    LoaderDataModule,
    MixedDataModule,
    SequenceDataModule,
    ShardedDataModule,
    TensorDataModule,
)
from loaderkit.transfer import default_device, select_device, should_pin_memory
from tests.support.datamodules import (
    AnyBatchModule,
    FitRun,
    fit_recording,
    make_image_tree,
    sequence_samples,
    write_id_documents,
    write_id_token_shards,
)
from tests.support.helpers import DataParallelOf, assert_resume_exact, by_epoch, trainer_kwargs

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]

SIZE, BATCH, SEED = 64, 8, 3
FEATURES = torch.randn(SIZE, 4, generator=torch.Generator().manual_seed(0))


def tensor_dm(nw: int = 0, **kwargs: Any) -> TensorDataModule:
    kwargs = {"batch_size": BATCH, "num_workers": nw, "seed": SEED, **kwargs}
    return TensorDataModule(torch.arange(SIZE), FEATURES, **kwargs)


def sequence_dm(nw: int = 0, **kwargs: Any) -> SequenceDataModule:
    # A small window and this seed: epoch 1 has more batches than epoch 0 (21, then 23).
    kwargs = {
        "max_tokens": 64,
        "pad_to_multiple_of": 4,
        "window": 16,
        "num_workers": nw,
        "seed": 1,
        **kwargs,
    }
    return SequenceDataModule(sequence_samples(SIZE), **kwargs)


def fit_any(dm: L.LightningDataModule, **overrides: Any) -> tuple[AnyBatchModule, L.Trainer]:
    model = AnyBatchModule()
    trainer = L.Trainer(**trainer_kwargs(**overrides))
    trainer.fit(model, datamodule=dm)
    return model, trainer


# ------------------------------------------------------------ resume through Lightning


def document_dm(nw: int = 0, *, root: Path, **kwargs: Any) -> ShardedDataModule:
    """Token budgets over ``write_id_documents`` shards (64 documents in 5 shards), read 4
    shards at a time."""
    kwargs = {
        "max_tokens": 40,
        "bucket_window": 16,
        "mix_shards": 4,
        "num_workers": nw,
        # A seed whose two epochs differ in length (17 and 18 batches under ShardPlan v5).
        "seed": 4,
        **kwargs,
    }
    return ShardedDataModule(str(root), eos=0, dtype="int32", **kwargs)


KINDS: dict[str, Any] = {
    "tensor": (tensor_dm, lambda: []),
    # Token-budget epochs change length: ElasticResume keeps Lightning's count in step.
    "sequence": (sequence_dm, lambda: [ElasticResume()]),
    "documents": (document_dm, lambda: [ElasticResume()]),
}


def epoch_lengths(kind: str, runs: Runs) -> tuple[int, ...]:
    dm = runs.make(kind, 0)
    dm.setup("fit")
    plan = dm.train_dataloader().plan
    return tuple(plan.num_steps(e, start=0, world_size=1) for e in (0, 1))


class Runs:
    """Each distinct fit once per module: uninterrupted, cut (checkpoint every step), resumed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.documents = write_id_documents(root / "documents", SIZE)
        self._cache: dict[tuple[Any, ...], FitRun] = {}

    def make(self, kind: str, nw: int) -> L.LightningDataModule:
        extra = {"root": self.documents} if kind == "documents" else {}
        return KINDS[kind][0](nw, **extra)

    def _get(self, key: tuple[Any, ...], **kwargs: Any) -> FitRun:
        if key not in self._cache:
            kind, nw = key[0], key[1]
            callbacks = KINDS[kind][1]
            path = self.root.joinpath("-".join(map(str, key)))
            path.mkdir(parents=True)
            self._cache[key] = fit_recording(
                path, lambda: self.make(kind, nw), callbacks=callbacks(), **kwargs
            )
        return self._cache[key]

    def full(self, kind: str, nw: int) -> FitRun:
        return self._get((kind, nw, "full"))

    def cut(self, kind: str, nw: int, at: int) -> FitRun:
        return self._get((kind, nw, "cut", at), fail_at=at)

    def resumed(self, kind: str, nw: int, k: int, cut_at: int) -> FitRun:
        ckpt = self.cut(kind, nw, cut_at).ckpt(k)
        return self._get((kind, nw, "resumed", k), resume=ckpt)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("dm-runs"))


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("kind", ["tensor", "sequence", "documents"])
def test_resume_from_lightning_checkpoint_is_exact(runs: Runs, kind: str, nw: int) -> None:
    """A fit interrupted inside epoch 1, resumed from its checkpoints at a step inside epoch 0
    and one inside epoch 1 with a fresh model and DataModule: the oracle holds each time.
    The sequence and documents cases batch under a token budget (epochs of different
    lengths); documents are shards read 4 at a time."""
    e0, e1 = epoch_lengths(kind, runs)
    if kind in ("sequence", "documents"):
        assert e0 < e1, "the token-budget case should have a longer epoch 1"
    full = runs.full(kind, nw)
    assert len(full.records) == e0 + e1
    assert sorted(by_epoch(full.records)[0]) == list(range(SIZE))
    cut_at = e0 + 2
    cut = runs.cut(kind, nw, cut_at)
    assert len(cut.records) == cut_at
    for k in (3, cut_at):
        after = runs.resumed(kind, nw, k, cut_at)
        assert_resume_exact(full.records, cut.records[:k], after.records)


@pytest.mark.parametrize("kind", ["tensor", "sequence", "documents"])
def test_sample_stream_does_not_depend_on_num_workers(runs: Runs, kind: str) -> None:
    assert runs.full(kind, 0).records == runs.full(kind, 2).records


def test_a_fractional_limit_halves_each_token_budget_epoch_on_resume(tmp_path: Path) -> None:
    # Measured: under limit_train_batches=0.5, len() after set_epoch(1) still answered the
    # unfinished epoch 0 (21 batches): the uninterrupted run cut epoch 1 (23) at 10 batches,
    # a run resumed inside epoch 1 at 11: one batch more, silently. Resumed on epoch 0's
    # last batch, len() answered the rest of epoch 0 until the run began epoch 1 (10 again).
    def fit(name: str, **kwargs: Any) -> FitRun:
        options = {"max_epochs": 3, "limit_train_batches": 0.5, "callbacks": [ElasticResume()]}
        return fit_recording(tmp_path / name, sequence_dm, **options, **kwargs)

    full, cut = fit("full"), fit("cut", fail_at=14)
    for k in (10, 14):  # on epoch 0's last batch (a limit's), inside epoch 1
        after = fit(f"after{k}", resume=cut.ckpt(k))
        assert_resume_exact(full.records, cut.records[:k], after.records)
    steps = [r["epoch"] for r in full.records]
    assert [steps.count(e) for e in range(3)] == [10, 11, 10]  # of 21, 23, 21 batches


# ------------------------------------------------------------- each module trains


def test_tensor_datamodule_trains_with_a_seeded_val_split() -> None:
    dm = tensor_dm(val_fraction=0.25, eval_batch_size=5)
    model, trainer = fit_any(dm, limit_val_batches=1.0)
    assert model.rows == {0: 48, 1: 48}
    assert model.val_batches == 2 * 4  # 16 val samples in batches of 5, after each epoch
    assert isinstance(trainer.train_dataloader, base_module.ResumableDataLoader)


def test_array_datamodule_trains_from_npy_and_npz_paths(tmp_path: Path) -> None:
    x = np.arange(SIZE * 3, dtype=np.float32).reshape(SIZE, 3)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "val.npz", y=np.arange(10), x=x[:10])
    dm = ArrayDataModule(
        train=str(tmp_path / "x.npy"), val=str(tmp_path / "val.npz"), keys=["x", "y"], batch_size=16
    )
    model, _ = fit_any(dm)
    assert model.rows == {0: SIZE, 1: SIZE}
    assert isinstance(dm.train_dataset.arrays[0], np.memmap)  # read lazily, not loaded
    xb, yb = next(iter(dm.val_dataloader()))
    assert xb.shape == (10, 3) and yb.tolist() == list(range(10))
    arrays = ArrayDataModule(x, np.arange(SIZE), batch_size=32)
    model, _ = fit_any(arrays, max_epochs=1)
    assert model.rows == {0: SIZE}


def test_tensor_datamodule_reads_pt_files(tmp_path: Path) -> None:
    torch.save((torch.arange(SIZE), FEATURES), tmp_path / "train.pt")
    torch.save(FEATURES[:7], tmp_path / "test.pt")
    dm = TensorDataModule(train=str(tmp_path / "train.pt"), test=str(tmp_path / "test.pt"))
    assert dm.hparams["train"] == str(tmp_path / "train.pt")  # paths stay in hparams
    dm.setup("fit")
    dm.setup("test")
    assert len(dm.train_dataset) == SIZE
    (xb,) = next(iter(dm.test_dataloader()))
    assert torch.equal(xb, FEATURES[:7])
    torch.save({"x": FEATURES}, tmp_path / "dict.pt")  # named the path it was given
    with pytest.raises(TypeError, match=r"train file '.*dict\.pt' holds a dict, not a tensor"):
        TensorDataModule(train=str(tmp_path / "dict.pt")).setup("fit")


@pytest.mark.parametrize("bucket", [False, True])
def test_sequence_datamodule_trains_and_pads(bucket: bool) -> None:
    window = 16 if bucket else None  # without bucketing a window is refused
    dm = sequence_dm(max_tokens=None, bucket=bucket, window=window, batch_size=8, val_fraction=0.25)
    model, _ = fit_any(dm)
    assert model.rows == {0: 48, 1: 48}
    assert model.val_batches == 2 * 2
    batch = model.last_batch
    assert batch["input_ids"].shape[1] % 4 == 0
    assert batch["attention_mask"].sum(1).tolist() == batch["lengths"].tolist()


def test_sequence_lengths_follow_the_val_split() -> None:
    """Bucketing reads the lengths by dataset index: after a val_fraction split they must be
    the lengths of the subset's samples, or batches would be planned on the wrong lengths."""
    dm = sequence_dm(max_tokens=48, val_fraction=0.3, pad_to_multiple_of=None)
    dm.setup("fit")
    dm.setup("test")  # a later stage must not re-measure the split's lengths
    samples = sequence_samples(SIZE)
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        for batch in loader:
            want = [len(samples[i]["input_ids"]) for i in batch["id"].tolist()]
            assert batch["lengths"].tolist() == want
            assert batch["input_ids"].numel() <= 48 or loader is not dm.train_dataloader()


def test_sequence_datamodule_reads_jsonl_and_bare_samples(tmp_path: Path) -> None:
    path = tmp_path / "seqs.jsonl"
    path.write_text("\n".join(json.dumps(list(range(n))) for n in (3, 1, 5, 2, 4)) + "\n")
    dm = SequenceDataModule(str(path), batch_size=2, shuffle=False, pad_value=-1)
    dm.setup("fit")
    first = next(iter(dm.train_dataloader()))
    assert first.values.tolist() == [[0, 1, 2], [0, -1, -1]]
    assert first.lengths.tolist() == [3, 1]
    # Bare samples in two splits (was: "val mixes dict and bare samples").
    seqs = [torch.arange(1 + i % 5) for i in range(6)]
    both = SequenceDataModule(train=seqs, val=seqs[:3], batch_size=2)
    both.setup("fit")
    assert len(both.val_dataset) == 3


def test_sequence_datamodule_measures_a_tuple_samples_first_field() -> None:
    # A tuple's len() counted its fields: a 2-token length for every sample, the budget 50x over.
    samples = [(torch.ones(9 + i, dtype=torch.long), i % 2) for i in range(6)]
    dm = SequenceDataModule(samples, max_tokens=32, seed=0)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert sorted(n for b in batches for n in b.lengths.tolist()) == list(range(9, 15))
    assert all(b.values[0].numel() <= 32 for b in batches)
    # A namedtuple's field 0 is padded by its name (PadCollate keys it by its fields).
    named = collections.namedtuple("named", "ids y")
    dm = SequenceDataModule([named(s, y) for s, y in samples], max_tokens=32, seed=0)
    dm.setup("fit")
    assert sorted(n for b in dm.train_dataloader() for n in b.lengths.tolist()) == [*range(9, 15)]
    # A label first was "train sample 0 is a int" (hunter 342): the field is named.
    flipped = collections.namedtuple("flipped", "y ids")
    dm = SequenceDataModule([flipped(y, s) for s, y in samples], max_tokens=32, seed=0)
    with pytest.raises(TypeError, match=r"sample 0's first field \('y', .* put the sequence first"):
        dm.setup("fit")
    # Bare train samples beside tuple predict ones failed in collate, naming field 0.
    bare = SequenceDataModule([s for s, _ in samples], predict=samples)
    with pytest.raises(TypeError, match=r"predict samples are not of the other splits' kind"):
        bare.setup("predict")
        bare.setup("fit")


def test_sequence_datamodule_reads_a_jsonl_file_with_a_bom(tmp_path: Path) -> None:
    # Refused as invalid JSON on line 1, while JsonlReader read the same file.
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf[1, 2]\n[3]\n")
    dm = SequenceDataModule(str(path), batch_size=2, shuffle=False)
    dm.setup("fit")
    assert [len(s) for s in dm.train_dataset] == [2, 1]


def test_image_folder_datamodule_trains(tmp_path: Path) -> None:
    root = make_image_tree(tmp_path / "train")
    val = make_image_tree(tmp_path / "val", per_class=2)
    dm = ImageFolderDataModule(str(root), val_root=str(val), image_size=8, batch_size=4)
    model, _ = fit_any(dm)
    assert model.rows == {0: 12, 1: 12}
    assert model.val_batches == 2
    images, labels = model.last_batch
    assert images.shape[1:] == (3, 8, 8) and images.dtype == torch.float32
    assert dm.classes == ["cat", "dog"] and set(labels.tolist()) <= {0, 1}


def test_image_settings_take_numpy_numbers_and_keep_python_ones(tmp_path: Path) -> None:
    # Hunter 355: np.float32 refused as "must be a number"; numpy's float64 was taken.
    import io

    root = make_image_tree(tmp_path / "train")
    mean = (np.float32(0.5), np.float32(0.5), np.float32(0.5))
    dm = ImageFolderDataModule(str(root), image_size=8, mean=mean, color_jitter=np.float32(0.2))
    saved = io.BytesIO()
    torch.save(dict(dm.hparams), saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=True)
    assert loaded["mean"] == (0.5, 0.5, 0.5) and type(loaded["color_jitter"]) is float
    with pytest.raises(ValueError, match=r"mean must be a tuple of 3 numbers.*got array"):
        ImageFolderDataModule(str(root), mean=np.array([0.5, 0.5, 0.5]))


def test_image_augmentation_is_bit_identical_across_workers_and_resume(tmp_path: Path) -> None:
    root = str(make_image_tree(tmp_path / "imgs"))

    def loader(nw: int) -> Any:
        dm = ImageFolderDataModule(root, image_size=8, batch_size=4, num_workers=nw, seed=1)
        dm.setup("fit")
        return dm.train_dataloader()

    runs = {}
    for nw in (0, 2):
        it = loader(nw)
        runs[nw] = [batch for _ in range(2) for batch in it]  # two epochs
    assert len(runs[0]) == 6
    for (x0, y0), (x2, y2) in zip(runs[0], runs[2], strict=True):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)
    saving = loader(2)
    it = iter(saving)
    next(it), next(it)
    resumed = loader(0)
    resumed.load_state_dict(saving.state_dict())
    rest = [*resumed, *resumed]
    for (xa, ya), (xb, yb) in zip(rest, runs[0][2:], strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # The augmentation is random: the same image differs from epoch to epoch.
    dm = ImageFolderDataModule(root, image_size=8, batch_size=12, shuffle=False, seed=1)
    dm.setup("fit")
    sequential = dm.train_dataloader()
    (e0, _), (e1, _) = next(iter(sequential)), next(iter(sequential))
    assert not torch.equal(e0, e1)


def test_a_subclass_default_is_no_setting_its_given_transforms_replace(tmp_path: Path) -> None:
    """The refusal of a replaced setting compares with the built class's own default."""

    class Small(ImageFolderDataModule):
        def __init__(self, root: str, *, image_size: int = 32, **kwargs: Any) -> None:
            super().__init__(root, image_size=image_size, **kwargs)

    root = str(make_image_tree(tmp_path / "train"))
    assert Small(root, train_transform=abs, eval_transform=abs).image_size == 32
    with pytest.raises(ValueError, match=r"image_size=64 has no effect"):
        Small(root, train_transform=abs, eval_transform=abs, image_size=64)


@pytest.mark.parametrize("multiple", [None, 1])
def test_a_token_budget_pads_and_masks_by_length_key(tmp_path: Path, multiple: int | None) -> None:
    """A field that varies ahead of ``length_key`` gave the mask and lengths without
    ``pad_to_multiple_of``: lengths [4, 2, 3, ...] for input_ids of 1 token."""
    rows = [{"prompt": [1] * (2 + i % 3), "input_ids": [1] * (1 + i % 7)} for i in range(40)]
    write_shards(tmp_path / "js", [rows], JsonlReader())
    dm = ShardedDataModule(
        str(tmp_path / "js"), reader="jsonl", max_tokens=64, pad_to_multiple_of=multiple, seed=0
    )
    dm.setup("fit")
    for batch in dm.loader("train", num_workers=0):
        assert batch["lengths"].tolist() == (batch["input_ids"] != 0).sum(1).tolist()
        assert batch["attention_mask"].shape == batch["input_ids"].shape


def test_without_a_budget_dict_rows_pad_and_mask_by_length_key_too(tmp_path: Path) -> None:
    # Hunter 268: length_key went unread without max_tokens or pad_to_multiple_of: lengths and
    # mask followed a list field before it (or a batch where it was empty was refused,
    # naming length_field=, which the DataModules do not take).
    rows = [{"tags": [1] * (i % 2), "input_ids": [1] * (3 + i % 3)} for i in range(8)]
    write_shards(tmp_path / "js", [rows], JsonlReader())
    dm = ShardedDataModule(str(tmp_path / "js"), reader="jsonl", batch_size=2, shuffle=False)
    dm.setup("fit")
    for batch in dm.loader("train", num_workers=0):
        assert batch["lengths"].tolist() == (batch["input_ids"] != 0).sum(1).tolist()
        assert batch["attention_mask"].shape == batch["input_ids"].shape


def test_image_val_fraction_uses_the_eval_transform(tmp_path: Path) -> None:
    root = str(make_image_tree(tmp_path / "imgs"))
    dm = ImageFolderDataModule(root, image_size=8, batch_size=3, val_fraction=0.25, seed=0)
    dm.setup("fit")
    assert len(dm.train_dataset) == 9 and len(dm.val_dataset) == 3
    first = [x for x, _ in dm.val_dataloader()]
    again = [x for x, _ in dm.val_dataloader()]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert dm.val_dataset.dataset.transform is dm.eval_transform


def test_missing_torchvision_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision now fails
    with pytest.raises(ImportError, match=r"pip install '\.\[vision\]'") as info:
        ImageFolderDataModule(str(tmp_path))
    assert isinstance(info.value, (MissingDependencyError, LoaderkitError))


def test_sharded_datamodule_trains_on_tokens_and_jsonl(tmp_path: Path) -> None:
    reader = TokenReader(seq_len=4)
    write_shards(tmp_path / "tok", [np.arange(n * 4) for n in (20, 7, 13)], reader)
    val = write_shards(tmp_path / "tokval", [np.arange(40)], reader)
    dm = ShardedDataModule(
        str(tmp_path / "tok"), val_shards=[str(p) for p in val], seq_len=4, batch_size=8
    )
    model, _ = fit_any(dm)
    assert model.rows == {0: 40, 1: 40}
    assert model.val_batches == 2 * 2
    assert model.last_batch.dtype == torch.int64 and model.last_batch.shape[1] == 4
    docs = [[{"input_ids": list(range(i % 5 + 1)), "label": i % 2} for i in range(9)]] * 2
    write_shards(tmp_path / "js", docs, JsonlReader())
    dm = ShardedDataModule(str(tmp_path / "js"), reader="jsonl", batch_size=4, pad_value=-1)
    model, _ = fit_any(dm, max_epochs=1)
    assert model.rows == {0: 18}
    assert set(model.last_batch) >= {"input_ids", "label", "lengths", "attention_mask"}


def test_a_shard_file_url_names_the_list_a_datamodule_takes(tmp_path: Path) -> None:
    # A local shard file is read as one shard; a URL is a folder unless listed.
    pytest.importorskip("fsspec")
    url = f"memory://dm-file-{tmp_path.name}"
    (first, _) = write_shards(url, [np.arange(64), np.arange(40)], TokenReader(seq_len=8))
    cache = str(tmp_path / "cache")
    dm = ShardedDataModule(first, seq_len=8, batch_size=2, cache_dir=cache)
    with pytest.raises(ValueError, match=rf"to a DataModule too.*: shards=\['{first}'\]\."):
        dm.setup("fit")
    dm = ShardedDataModule([first], seq_len=8, batch_size=2, cache_dir=cache)
    dm.setup("fit")
    assert len(dm.train_dataloader()) == 4


def test_sharded_datamodule_splits_across_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under DDP every rank builds the same module; the loaders read their rank from
    torch.distributed. Simulated here: each rank yields the same number of batches and the
    ranks together see every sample once (the tail padded by repeats, as documented)."""
    from loaderkit.env import WorkerEnv

    # Sample i of the 17 is the tokens [2i, 2i + 1].
    tokens = [np.arange(0, 22), np.arange(0), np.arange(22, 34)]
    write_shards(tmp_path, tokens, TokenReader(seq_len=2))
    seen: dict[int, list[int]] = {}
    for rank in (0, 1):
        env = WorkerEnv(rank=rank, world_size=2)
        for module in (
            "loaderkit.loader.resumable",
            "loaderkit.loader._engine",
            "loaderkit.plan.samplers",
            "loaderkit.lightning.datamodules.base",
        ):
            monkeypatch.setattr(f"{module}.detect", lambda env=env, **_: env)
        dm = ShardedDataModule(str(tmp_path), seq_len=2, batch_size=4, seed=5)
        dm.setup("fit")
        seen[rank] = [int(row[0]) // 2 for batch in dm.train_dataloader() for row in batch]
        assert dm.describe()["splits"]["train"]["batches_per_epoch"] == 3
    # Two global steps of 8 and a tail of 1, dealt as 1 + 1: one sample seen twice.
    assert len(seen[0]) == len(seen[1]) == 9
    both = sorted(seen[0] + seen[1])
    assert set(both) == set(range(17)) and len(both) == 18


# ------------------------------------------------------------------ streamed shards


@pytest.fixture(scope="module")
def id_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_id_token_shards(tmp_path_factory.mktemp("id-shards"), SIZE)


def stream_dm(root: Path, **kwargs: Any) -> ShardedDataModule:
    kwargs = {"seq_len": 4, "batch_size": BATCH, "streaming": True, "seed": SEED, **kwargs}
    return ShardedDataModule(str(root), **kwargs)


@pytest.mark.parametrize("limit", [{}, {"steps_per_epoch": 5}], ids=["one-pass", "steps"])
def test_streamed_shards_train_and_resume_exactly(
    tmp_path: Path, id_shards: Path, limit: dict[str, int]
) -> None:
    """ShardedDataModule(streaming=True) under a CPU Trainer, resumed from its checkpoints
    inside epoch 0 and inside epoch 1: the oracle holds. An epoch of unknown length (one pass)
    needs ElasticResume; a fixed one does not."""

    def fit(name: str, **kwargs: Any) -> FitRun:
        callbacks = [] if limit else [ElasticResume()]
        path = tmp_path / name
        path.mkdir()
        return fit_recording(
            path, lambda: stream_dm(id_shards, **limit), callbacks=callbacks, **kwargs
        )

    full = fit("full")
    steps = 5 if limit else SIZE // BATCH
    assert len(full.records) == 2 * steps
    if not limit:  # one pass per epoch: every sample once, shard order reshuffled
        epochs = by_epoch(full.records)
        assert all(sorted(ids) == list(range(SIZE)) for ids in epochs.values())
        assert epochs[0] != epochs[1]
    cut_at = steps + 2
    cut = fit("cut", fail_at=cut_at)
    for k in (3, cut_at):
        after = fit(f"resumed-{k}", resume=cut.ckpt(k))
        assert_resume_exact(full.records, cut.records[:k], after.records)


@pytest.mark.parametrize("every", [1, 2])
def test_a_stream_with_steps_per_epoch_is_not_reloaded(
    tmp_path: Path, id_shards: Path, every: int
) -> None:
    # Was (1): each epoch's new loader started the streams over, so every epoch trained
    # epoch 0's batches (15 of 23 samples ever seen).
    with pytest.raises(ValueError, match=f"reload_dataloaders_every_n_epochs={every}\\); leave"):
        fit_recording(
            tmp_path,
            lambda: stream_dm(id_shards, steps_per_epoch=5),
            reload_dataloaders_every_n_epochs=every,
        )


def test_streamed_shards_describe_and_split_across_ranks(
    id_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """describe() never asks a stream for its length: samples unknown, batches from the limit;
    the resume reason says the topology must stay. Val shards stay planned (counted)."""
    one_pass = stream_dm(id_shards).describe()
    assert one_pass["splits"]["train"] == {
        "samples": None,
        "batch_size": BATCH,
        "batches_per_epoch": None,
    }
    assert one_pass["resumable_exactly"] is True
    assert "exact only under the same world size and num_workers" in one_pass["resumable_reason"]
    assert "ElasticResume" in one_pass["resumable_reason"]
    limited = stream_dm(id_shards, samples_per_epoch=40, val_shards=str(id_shards)).describe()
    assert limited["splits"]["train"]["batches_per_epoch"] == 5
    assert limited["splits"]["val"] == {
        "samples": SIZE,
        "batch_size": BATCH,
        "batches_per_epoch": 8,
    }
    assert "ElasticResume" not in limited["resumable_reason"]

    class Streamed(LoaderDataModule):  # the base class hosts a stream from any subclass
        def build_datasets(self, stage: str) -> dict[str, Any]:
            return {"train": StreamingShardedDataset(str(id_shards), TokenReader(seq_len=4))}

    assert len(list(Streamed(batch_size=BATCH).train_dataloader())) == SIZE // BATCH

    class StreamedVal(LoaderDataModule):  # each validation read on where the last stopped
        def build_datasets(self, stage: str) -> dict[str, Any]:
            val = StreamingShardedDataset(id_shards, TokenReader(seq_len=4), steps_per_epoch=2)
            return {"train": torch.utils.data.TensorDataset(torch.arange(8)), "val": val}

    with pytest.raises(ValueError, match=r"val split's StreamingShardedDataset has steps_per"):
        StreamedVal(shuffle=False).val_dataloader()
    with pytest.raises(ValueError, match=r"val_fraction=0.25 needs a train split of known size"):
        Streamed(val_fraction=0.25).setup("fit")
    # Simulated rank 1 of 2: the limit makes every rank step the same count; no limit refuses.
    from loaderkit.env import WorkerEnv

    env = WorkerEnv(rank=1, world_size=2)
    for module in (
        "loaderkit.loader.resumable",
        "loaderkit.loader._engine",
        "loaderkit.lightning.datamodules.base",
    ):
        monkeypatch.setattr(f"{module}.detect", lambda env=env, **_: env)
    ranked = stream_dm(id_shards, samples_per_epoch=32)
    assert ranked.describe()["splits"]["train"]["batches_per_epoch"] == 2  # 32 / (2 ranks * 8)
    loader = ranked.train_dataloader()
    assert len(loader) == 2 and len(list(loader)) == 2
    with pytest.raises(LoaderkitError, match=r"steps_per_epoch= \(batches per rank\)"):
        len(stream_dm(id_shards).train_dataloader())


# ----------------------------------------------------------------------- the policy


def test_val_fraction_split_is_seeded_deterministic_and_disjoint() -> None:
    def split(seed: int) -> tuple[list[int], list[int]]:
        dm = TensorDataModule(torch.arange(100), val_fraction=0.2, seed=seed)
        dm.setup("fit")
        (train,) = dm.train_dataset.get_batch(np.arange(len(dm.train_dataset)))
        (val,) = dm.val_dataset.get_batch(np.arange(len(dm.val_dataset)))
        return train.tolist(), val.tolist()

    train, val = split(0)
    assert (train, val) == split(0)
    assert len(val) == 20 and not set(train) & set(val)
    assert sorted(train + val) == list(range(100))
    assert split(1)[1] != val


def test_val_loader_is_empty_without_val_data_and_test_needs_data() -> None:
    dm = tensor_dm()
    model, _ = fit_any(dm, max_epochs=1)
    assert model.val_batches == 0 and dm.val_dataloader() == []
    with pytest.raises(ValueError, match=r"TensorDataModule has no test data .*pass test data"):
        dm.test_dataloader()


def test_num_workers_auto_is_measured_by_the_loader_in_the_run() -> None:
    data = torch.randn(512, 4)
    dm = TensorDataModule(data, batch_size=16, num_workers="auto")
    loader = dm.train_dataloader()
    # No up-front probe: the loader starts in-process and decides from the run's timings.
    assert dm.num_workers_probe is None
    assert loader.num_workers == 0 and loader.describe()["auto_workers"]["settled"] is False
    fixed = TensorDataModule(data, batch_size=16, num_workers=0)
    assert [b[0].tolist() for b in loader] == [b[0].tolist() for b in fixed.train_dataloader()]


def test_probe_num_workers_times_each_count() -> None:
    dm = TensorDataModule(torch.randn(512, 4), batch_size=16, num_workers="auto")
    rates = dm.probe_num_workers(max_workers=1, budget_s=0.5)
    assert sorted(rates) == [0, 1] and all(rate > 0 for rate in rates.values())
    assert dm.num_workers_best in (0, 1)
    assert dm.describe()["num_workers_best"] == dm.num_workers_best
    # The default range: every count up to the cores this process may use (at most 8).
    assert sorted(dm.probe_num_workers(budget_s=0.2)) == [*range(min(cpu_budget(), 8) + 1)]


def test_pin_memory_auto_follows_the_trainer(monkeypatch: pytest.MonkeyPatch) -> None:
    dm = tensor_dm()
    _, trainer = fit_any(dm, max_epochs=1)
    assert trainer.train_dataloader.pin_memory is False
    assert dm.resolve_pin_memory() is False
    assert tensor_dm().resolve_pin_memory() is should_pin_memory(select_device())
    # The decision is asked for the trainer's device, not the machine's default.
    asked: list[torch.device] = []
    monkeypatch.setattr(base_module, "should_pin_memory", lambda d: asked.append(d) or True)
    dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 1)))
    assert dm.resolve_pin_memory() is True and asked == [torch.device("cuda", 1)]
    assert tensor_dm(pin_memory=False).resolve_pin_memory() is False


def test_hparams_keep_settings_but_not_data() -> None:
    dm = tensor_dm(val_fraction=0.5)
    assert dm.hparams["batch_size"] == BATCH and dm.hparams["val_fraction"] == 0.5
    assert "tensors" not in dm.hparams
    assert not any(isinstance(v, torch.Tensor) for v in dm.hparams.values())
    assert "train" not in TensorDataModule(train=(torch.ones(3),)).hparams
    seq = sequence_dm()
    assert "train" not in seq.hparams and seq.hparams["max_tokens"] == 64


def test_a_datamodules_loaders_know_their_trainers_group_wherever_they_are_asked() -> None:
    # The module hands each loader self.trainer: the loader knows the run's data-parallel
    # group outside the Trainer's call stack too (here after the fit, and before a batch).
    dm = tensor_dm()
    L.Trainer(**trainer_kwargs(max_epochs=1, strategy=DataParallelOf(1, 4))).fit(
        AnyBatchModule(), datamodule=dm
    )
    assert len(dm.train_dataloader()) == SIZE // BATCH // 4


def test_use_distributed_sampler_false_on_several_ranks_is_refused_not_guessed() -> None:
    # The flag says the user split the data; a module that splits its data itself cannot
    # tell one rank's part from a flag set out of habit (was: silently a 1/world_size part).
    kwargs = trainer_kwargs(max_epochs=1, use_distributed_sampler=False)
    dm = tensor_dm(val_fraction=0.25)
    dm.trainer = L.Trainer(**kwargs, strategy=DataParallelOf(1, 2))
    refused = (
        r"TensorDataModule deals each split across the 2 .*use_distributed_sampler=False\. "
        r"Drop that argument.*return your own ResumableDataLoader"
    )
    for ask in (dm.train_dataloader, dm.val_dataloader, dm.test_dataloader, dm.describe):
        with pytest.raises(ValueError, match=refused):
            ask()
    dm = tensor_dm()  # one rank: nothing to split
    L.Trainer(**kwargs, strategy=DataParallelOf(0, 1)).fit(AnyBatchModule(), datamodule=dm)
    assert len(dm.train_dataloader()) == SIZE // BATCH


class _Draws(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, int(torch.randint(0, 10**6, ()))])


@pytest.mark.parametrize("bucket", [False, True], ids=["plain", "bucketed"])
def test_eval_splits_on_several_ranks_are_dealt_as_lightning_deals_them(bucket: bool) -> None:
    # As Lightning's UnrepeatedDistributedSamplerWrapper; was: rank 1 predicted sample 0 again.
    seen = []
    for rank in range(2):
        if bucket:
            seqs = [{"input_ids": torch.full((1 + i % 5,), i)} for i in range(5)]
            dm: Any = SequenceDataModule(seqs, predict=seqs, bucket=True, batch_size=4, seed=2)
        else:
            dm = TensorDataModule(train=(torch.arange(5),), predict=(torch.arange(5),), seed=1)
        trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(rank, 2)))
        dm.trainer = trainer
        dm.setup("predict")
        for batch in dm.predict_dataloader():
            seen += (batch["input_ids"][:, 0] if bucket else batch[0]).tolist()
    assert sorted(seen) == [0, 1, 2, 3, 4]
    if bucket:  # val: as DistributedSampler, 5 samples on 2 ranks repeat one (was a batch)
        seqs = [{"input_ids": torch.full((1 + i % 5,), i)} for i in range(5)]
        val = []
        for rank in range(2):
            dm = SequenceDataModule(seqs, val=seqs, bucket=True, eval_batch_size=32)
            dm.trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(rank, 2)))
            dm.setup("fit")
            batches = [b["input_ids"][:, 0].tolist() for b in dm.val_dataloader()]
            assert len(batches) == 1 and len(batches[0]) == 3
            val += batches[0]
        assert sorted(val) == [0, 0, 1, 2, 3, 4]

    # A rank's part draws as on one rank: keyed by the split's indices, not its own.
    class Drawing(LoaderDataModule):
        def build_datasets(self, stage: str) -> dict[str, Any]:
            return {"predict": _Draws()}

    def predicted(rank: int, world_size: int) -> dict[int, int]:
        dm = Drawing(batch_size=2, seed=3)
        dm.trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(rank, world_size)))
        dm.setup("predict")
        return {int(i): int(v) for b in dm.predict_dataloader() for i, v in b.tolist()}

    assert predicted(0, 1) == predicted(0, 2) | predicted(1, 2)
    dm = Drawing(batch_size=2)
    dm.trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(1, 2)))
    dm.setup("predict")
    assert dm.describe()["splits"]["predict"]["batches_per_epoch"] == 2  # 3 samples a rank
    dm = TensorDataModule(train=(torch.arange(5),), predict=(torch.arange(1),))
    dm.trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(1, 2)))
    with pytest.raises(ValueError, match=r"predict split has 1 samples, fewer than the 2 ranks"):
        dm.predict_dataloader()


MAKERS: dict[str, Any] = {
    "sequence": lambda root, **kw: sequence_dm(**kw),
    "sharded": lambda root, **kw: ShardedDataModule(str(root), seq_len=4, **kw),
    "mixed": lambda root, **kw: MixedDataModule({"a": str(root)}, seq_len=4, **kw),
}
SETTINGS = [
    *[("sequence", name) for name in ("max_tokens", "pad_to_multiple_of", "window")],
    *[("sharded", name) for name in ("max_tokens", "bucket_window", "max_open_shards")],
    *[("mixed", name) for name in ("max_tokens", "bucket_window", "max_open_shards")],
    ("mixed", "pad_to_multiple_of"),
]


@pytest.mark.parametrize(("kind", "name"), SETTINGS, ids=[f"{k}-{n}" for k, n in SETTINGS])
def test_a_setting_follows_one_rule_in_every_datamodule(
    tmp_path: Path, kind: str, name: str
) -> None:
    make = functools.partial(MAKERS[kind], write_id_token_shards(tmp_path))
    # Both apply with a token budget only (pad_to_multiple_of: to fixed-length tokens).
    budget = {"max_tokens": 64} if name in ("bucket_window", "pad_to_multiple_of") else {}
    dm = make(**budget, **{name: np.int64(8)})  # numpy ints, as everywhere
    assert getattr(dm, name) == 8 and type(getattr(dm, name)) is int
    with pytest.raises(ValueError, match=rf"{name} must be >= 1, got 0"):
        make(**budget, **{name: 0})
    with pytest.raises(TypeError, match=rf"{name} must be an int, got True \(bool\)"):
        make(**budget, **{name: True})


def test_token_settings_take_numpy_ints(tmp_path: Path) -> None:
    # Was: seq_len=np.int64(4) passed the DataModules' check and TokenReader refused it.
    root = write_id_token_shards(tmp_path)
    for make in (ShardedDataModule, lambda r, **kw: MixedDataModule({"a": r}, **kw)):
        for name, value in (("seq_len", 4), ("eos", 3)):
            got = make(str(root), batch_size=2, seed=0, **{name: np.int64(value)})
            want = make(str(root), batch_size=2, seed=0, **{name: value})
            assert repr(list(got.train_dataloader())) == repr(list(want.train_dataloader()))
    reader = TokenReader(seq_len=np.int64(4), targets=True)
    assert type(reader.seq_len) is int and reader.spec()["seq_len"] == 4


def test_a_datamodule_decides_pinning_without_starting_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Asking the device index starts CUDA; Lightning's ddp_fork then refuses to start.
    def starts_cuda() -> int:
        raise AssertionError("current_device_index() starts CUDA")

    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda check_available=False: torch.device("cuda")
    )
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 1)
    monkeypatch.setattr(torch.accelerator, "current_device_index", starts_cuda)
    assert tensor_dm().resolve_pin_memory() is True


def test_describe_reports_batches_padding_and_resume() -> None:
    plain = sequence_dm(max_tokens=None, window=None, batch_size=8).describe()
    bucketed = sequence_dm().describe()
    assert plain["splits"]["train"] == {"samples": SIZE, "batch_size": 8, "batches_per_epoch": 8}
    assert 0 < bucketed["padding_fraction"] < plain["padding_fraction"]
    assert bucketed["resumable_exactly"] is True
    assert "ElasticResume" in bucketed["resumable_reason"]
    tensors = tensor_dm(val_fraction=0.25).describe()
    assert tensors["splits"]["val"] == {"samples": 16, "batch_size": 8, "batches_per_epoch": 2}
    assert tensors["padding_fraction"] is None
    assert tensors["pin_memory"] is should_pin_memory(default_device())  # "auto", no trainer
    assert tensors["world_size"] == 1 and tensors["num_workers"] == 0
    assert tensors["shards_per_batch"] is None and tensors["single_shard_batches"] is None


def test_describe_reports_shards_per_batch_and_mix_shards_sets_it(tmp_path: Path) -> None:
    """16 uneven shards (sample i's tokens are all i), batch 8: the default mixing puts 8
    shards in every batch, mix_shards=4 four (a few more where a lane passes from one shard
    to the next), mix_shards=1 one; what describe() says is what the loader yields."""
    sizes = [int(30 * f) for f in np.linspace(0.75, 1.25, 16)]
    firsts = np.cumsum([0, *sizes])
    write_shards(
        tmp_path,
        [np.repeat(np.arange(a, b), 2) for a, b in itertools.pairwise(firsts)],
        TokenReader(seq_len=2, dtype=np.int32),
    )
    for mix, mean, single in ((None, 8.0, 0.0), (4, 4.0, 0.0), (1, 1.0, 0.75)):
        dm = ShardedDataModule(
            str(tmp_path), seq_len=2, dtype="int32", batch_size=8, seed=1,
            **({} if mix is None else {"mix_shards": mix}),
        )  # fmt: skip
        info = dm.describe()
        got = [
            len(set(np.searchsorted(firsts, batch[:, 0].numpy(), side="right").tolist()))
            for batch in dm.train_dataloader()
        ]
        assert info["shards_per_batch"] == pytest.approx(np.mean(got))
        assert mean <= info["shards_per_batch"] <= min(mean + 0.3, 8)
        assert info["single_shard_batches"] == pytest.approx(np.mean(np.equal(got, 1)))
        assert info["single_shard_batches"] >= single
    assert stream_dm_describe(tmp_path)["shards_per_batch"] is None  # a stream: not known
    streamed = ShardedDataModule(
        str(tmp_path), seq_len=2, dtype="int32", streaming=True, mix_shards=3, batch_size=3
    )
    streamed.setup("fit")
    assert streamed.train_dataset.mix_shards == 3
    first = next(iter(streamed.train_dataloader()))[:, 0].numpy()
    assert len(set(np.searchsorted(firsts, first, side="right").tolist())) == 3


def stream_dm_describe(root: Path) -> dict[str, Any]:
    return ShardedDataModule(str(root), seq_len=2, dtype="int32", streaming=True).describe()


def test_a_subclass_only_builds_datasets() -> None:
    class Squares(LoaderDataModule):
        def build_datasets(self, stage: str) -> dict[str, Any]:
            return {"train": [torch.tensor([i, i * i]) for i in range(10)]}

    dm = Squares(batch_size=4, val_fraction=0.2)
    model, _ = fit_any(dm, max_epochs=1)
    assert model.rows == {0: 8} and model.val_batches == 1


def test_a_subclass_source_is_measured_by_its_length_key(tmp_path: Path) -> None:
    """A ShardedDataset subclass adding a prompt in dict samples got its shards' lengths, and
    every batch went over max_tokens."""
    reader = TokenReader(eos=0)
    paths = write_shards(tmp_path / "s", [np.array([5, 5, 5, 0, 7, 0] * 8)], reader)

    class Prompted(ShardedDataset):
        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            ids = super().__getitem__(index)
            return {"input_ids": torch.cat([torch.ones(10, dtype=ids.dtype), ids])}

    dm = MixedDataModule([Prompted(paths, reader)], max_tokens=16, seed=0)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert sum(len(b["lengths"]) for b in batches) == 16
    assert max(b["input_ids"].numel() for b in batches) <= 16


# -------------------------------------------------------------------- bad input

BAD_INPUT: list[tuple[str, Any, type[Exception], str]] = [
    ("batch_size 0", lambda: tensor_dm(batch_size=0), ValueError, r"batch_size must be >= 1"),
    ("batch_size str", lambda: tensor_dm(batch_size="8"), TypeError, r"batch_size must be an int"),
    ("eval_batch_size", lambda: tensor_dm(eval_batch_size=0), ValueError, r"eval_batch_size"),
    ("num_workers", lambda: tensor_dm(num_workers=-1), ValueError, r"num_workers must be >= 0"),
    ("num_workers str", lambda: tensor_dm(num_workers="all"), TypeError, r"or 'auto'"),
    (
        "num_workers array",
        lambda: tensor_dm(num_workers=np.array(["auto"])),
        TypeError,
        r"got array\(\['auto'\]",
    ),
    ("pin_memory", lambda: tensor_dm(pin_memory="yes"), ValueError, r"pin_memory must be True"),
    (
        "persistent",
        lambda: tensor_dm(persistent_workers=True),
        ValueError,
        r"persistent_workers=True needs num_workers >= 1, got num_workers=0",
    ),
    ("seed", lambda: tensor_dm(seed=-1), ValueError, r"seed must be >= 0"),
    ("val_fraction", lambda: tensor_dm(val_fraction=1.0), ValueError, r"val_fraction must be in"),
    ("shuffle", lambda: tensor_dm(shuffle=1), TypeError, r"shuffle must be a bool"),
    ("no data", lambda: TensorDataModule(), ValueError, r"TensorDataModule: no data; pass tensor"),
    (
        "both train",
        lambda: TensorDataModule(torch.ones(2), train=torch.ones(2)),
        ValueError,
        r"both positionally .* and as train=",
    ),
    (
        "uneven",
        lambda: TensorDataModule(torch.ones(3), torch.ones(2)),
        ValueError,
        r"TensorDataModule: train: .*same first dimension",
    ),
    (
        "array type",
        lambda: ArrayDataModule(train=[torch.ones(2)]),
        TypeError,
        r"ArrayDataModule: train: .*must be a numpy array",
    ),
    ("path suffix", lambda: TensorDataModule(train="x.csv"), ValueError, r"must end with \.pt"),
    (  # hunter 380: it said "use ArrayDataset for numpy arrays"
        "positional path",
        lambda: ArrayDataModule("x.npy"),
        TypeError,
        r"got the path 'x.npy' positionally, where numpy arrays go; pass it as train='x.npy'",
    ),
    (
        "missing path",
        lambda: ArrayDataModule(val="/nonexistent/x.npy"),
        FileNotFoundError,
        r"val='/nonexistent/x.npy' does not exist",
    ),
    ("keys", lambda: ArrayDataModule(np.ones(2), keys="x"), TypeError, r"keys must be a non-empty"),
    ("seq empty", lambda: SequenceDataModule([]), ValueError, r"train is empty"),
    ("seq type", lambda: SequenceDataModule(5), TypeError, r"train must be a list of samples"),
    (
        "seq splits",
        lambda: SequenceDataModule({"train": [[1]], "test": [[2]]}),
        TypeError,
        r"got dict; pass one split, e\.g\. train=data\['train'\]",
    ),
    ("max_tokens", lambda: sequence_dm(max_tokens=0), ValueError, r"max_tokens must be >= 1"),
    ("pad multiple", lambda: sequence_dm(pad_to_multiple_of=0), ValueError, r"pad_to_multiple_of"),
    ("oversize", lambda: sequence_dm(oversize="cut"), ValueError, r"oversize must be one of"),
    ("pad value", lambda: sequence_dm(pad_value="x"), TypeError, r"pad_value must be a bool, int"),
    ("image root", lambda: ImageFolderDataModule("/nonexistent"), ValueError, r"not a directory"),
    ("shards empty", lambda: ShardedDataModule([]), ValueError, r"shards is an empty list; pass"),
    ("shards type", lambda: ShardedDataModule(5), TypeError, r"shards must be a directory"),
    (
        "val shards empty",
        lambda: ShardedDataModule("/tmp", val_shards=[], seq_len=4),
        ValueError,
        r"val_shards is an empty list",
    ),
    (
        "missing shard",
        lambda: ShardedDataModule(["/nonexistent.npy"], seq_len=4),
        FileNotFoundError,
        r"shard '/nonexistent.npy' does not exist",
    ),
]


@pytest.mark.parametrize(
    ("make", "exc", "match"), [case[1:] for case in BAD_INPUT], ids=[c[0] for c in BAD_INPUT]
)
def test_bad_input_is_refused_with_the_fix(make: Any, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        make()


def test_bad_input_needing_files(tmp_path: Path) -> None:
    root = make_image_tree(tmp_path / "imgs", per_class=1)
    other = make_image_tree(tmp_path / "other", classes=("cat", "emu"), per_class=1)
    shards = write_shards(tmp_path / "tok", [np.arange(8)], TokenReader(seq_len=4))
    cases: list[tuple[Any, type[Exception], str]] = [
        (lambda: ImageFolderDataModule(str(root), image_size=0), ValueError, r"image_size"),
        (lambda: ImageFolderDataModule(str(root), mean=(0.5,)), ValueError, r"mean must be a"),
        (lambda: ImageFolderDataModule(str(root), std=(1, 0, 1)), ValueError, r"std must be a"),
        (lambda: ImageFolderDataModule(str(root), color_jitter=-1), ValueError, r"color_jitter"),
        (lambda: ImageFolderDataModule(str(root), crop_fraction=2), ValueError, r"crop_fraction"),
        (
            lambda: ImageFolderDataModule(str(root), crop_fraction=True),
            TypeError,
            r"crop_fraction must be a number in \(0, 1\], got True \(bool\)",
        ),
        (
            lambda: ImageFolderDataModule(str(root), crop_fraction="0.9"),
            TypeError,
            r"crop_fraction must be a number",
        ),
        (lambda: ImageFolderDataModule(str(root), color_jitter=True), TypeError, r"color_jitter"),
        (lambda: ImageFolderDataModule(str(root), mean=(True, 0, 0)), ValueError, r"mean must"),
        (lambda: tensor_dm(val_fraction=True), TypeError, r"val_fraction must be a float"),
        (
            lambda: ImageFolderDataModule(str(root), train_transform=3),
            TypeError,
            r"train_transform must be callable",
        ),
        (  # the given transforms replace the defaults: it was silently ignored
            lambda: ImageFolderDataModule(
                str(root), train_transform=abs, eval_transform=abs, image_size=32
            ),
            ValueError,
            r"image_size=32 has no effect.*apply it in your transform",
        ),
        (
            lambda: ImageFolderDataModule(str(root), train_transform=abs, color_jitter=0.9),
            ValueError,
            r"color_jitter=0.9 has no effect",
        ),
        (
            lambda: ImageFolderDataModule(str(root), eval_transform=abs, crop_fraction=0.5),
            ValueError,
            r"crop_fraction=0.5 has no effect",
        ),
        (
            lambda: ShardedDataModule(str(tmp_path / "tok"), seq_len=4, val_fraction=0.1),
            ValueError,
            r"val_fraction=0.1 is not supported; pass val_shards",
        ),
        (lambda: ShardedDataModule(shards), ValueError, r"exactly one of seq_len and eos"),
        (lambda: ShardedDataModule(shards, reader="csv"), ValueError, r"reader must be one of"),
        (
            lambda: ShardedDataModule(shards, reader="jsonl", seq_len=4),
            ValueError,
            r"options seq_len need reader='tokens', got reader='jsonl'; drop them",
        ),
        (lambda: ShardedDataModule(shards, seq_len=4, dtype="f4"), ValueError, r"integer dtype"),
        (lambda: ShardedDataModule(shards, reader=object()), TypeError, r"or a ShardReader"),
        (lambda: ShardedDataModule(shards, seq_len=4, pad_value="x"), TypeError, r"pad_value"),
        (lambda: ShardedDataModule(shards, seq_len=4, window=True), TypeError, r"window must"),
        (
            lambda: ShardedDataModule(shards, seq_len=4, streaming=1),
            TypeError,
            r"streaming must be a bool, got 1",
        ),
        (
            lambda: ShardedDataModule(shards, seq_len=4, steps_per_epoch=10),
            ValueError,
            r"steps_per_epoch=10 only applies with streaming=True.*pass streaming=True",
        ),
        (
            lambda: ShardedDataModule(shards, seq_len=4, samples_per_epoch=80),
            ValueError,
            r"samples_per_epoch=80 only applies with streaming=True",
        ),
        (
            lambda: ShardedDataModule(shards, seq_len=4, streaming=True, steps_per_epoch=True),
            TypeError,
            r"steps_per_epoch must be an int, got True \(bool\)",
        ),
        (
            lambda: ShardedDataModule(shards, seq_len=4, streaming=True, samples_per_epoch=0),
            ValueError,
            r"samples_per_epoch must be >= 1, got 0",
        ),
        (
            lambda: ShardedDataModule(
                shards, seq_len=4, streaming=True, steps_per_epoch=2, samples_per_epoch=8
            ),
            ValueError,
            r"pass steps_per_epoch or samples_per_epoch, not both",
        ),
        (
            lambda: ShardedDataModule(shards, seq_len=4, streaming=True, on_error="skip"),
            ValueError,
            r"on_error='skip' needs the planned dataset.*streaming=False",
        ),
        (  # the value is checked before the streaming rule, so the advice is right
            lambda: ShardedDataModule(shards, seq_len=4, streaming=True, on_error="Skip"),
            ValueError,
            r"on_error must be one of",
        ),
        (
            lambda: ShardedDataModule(shards, seq_len=4, streaming=True, window=4),
            ValueError,
            r"window=4 applies to planned shards only.*drop window or use streaming=False",
        ),
        (
            lambda: ShardedDataModule(shards, seq_len=4, streaming=True, max_open_shards=1),
            ValueError,
            r"max_open_shards=1 applies to planned shards only",
        ),
    ]
    for make, exc, match in cases:
        with pytest.raises(exc, match=match):
            make()
    mixed = ImageFolderDataModule(str(root), val_root=str(other))
    with pytest.raises(ValueError, match=r"the val folder has classes \['cat', 'emu'\]"):
        mixed.setup("fit")


def test_a_setting_that_would_have_no_effect_is_refused(tmp_path: Path) -> None:
    # Each was accepted and ignored (helper 101's hunt).
    np.save(tmp_path / "x.npy", np.ones((4, 2)))
    shards = write_shards(tmp_path / "tok", [np.arange(8)], TokenReader(seq_len=4))
    skip = r"oversize='skip' applies with max_tokens only; pass max_tokens or drop oversize\."
    stacked = r"has no effect: these samples are stacked, not padded; drop"
    cases: list[tuple[Any, str]] = [
        (
            lambda: SequenceDataModule([[1]], window=4),
            r"SequenceDataModule: window=4 applies with bucket=True or max_tokens only; pass "
            r"bucket=True or drop window\.",
        ),
        (lambda: SequenceDataModule([[1]], oversize="skip"), skip),
        (lambda: SequenceDataModule([[1]], bucket=True, oversize="skip"), skip),
        (
            lambda: ArrayDataModule(train=str(tmp_path / "x.npy"), keys=["y"]),
            r"ArrayDataModule: keys=\['y'\] applies to \.npz files only, but no split is one; "
            r"drop keys\.",
        ),
        (lambda: ArrayDataModule(np.ones(2), keys=["y"]), r"keys=\['y'\] applies to \.npz"),
        (lambda: ArrayDataModule(np.ones(2), mmap=False), r"mmap=False applies to \.npy files"),
        (
            lambda: ShardedDataModule(shards, seq_len=4, pad_to_multiple_of=16),
            rf"ShardedDataModule: pad_to_multiple_of=16 {stacked} pad_to_multiple_of\.",
        ),
        (lambda: ShardedDataModule(shards, seq_len=4, pad_value=-1), rf"pad_value=-1 {stacked}"),
        (  # a budget counted 8 per 4-token row: fewer rows, none padded (hunt 369)
            lambda: ShardedDataModule(shards, seq_len=4, max_tokens=16, pad_to_multiple_of=8),
            rf"pad_to_multiple_of=8 {stacked}",
        ),
    ]
    for make, match in cases:
        with pytest.raises(ValueError, match=match):
            make()
    assert SequenceDataModule([[1]], bucket=True, window=4).window == 4
    small = TensorDataModule(torch.ones(3), val_fraction=0.1)
    with pytest.raises(ValueError, match=r"leaves 0 for validation"):
        small.setup("fit")
    both = TensorDataModule(torch.ones(8), val=torch.ones(2), val_fraction=0.5)
    with pytest.raises(ValueError, match=r"val data was given too; pass one or the other"):
        both.setup("fit")
    with pytest.raises(ValueError, match=r"stage must be one of"):
        tensor_dm().setup("train")
    with pytest.raises(ValueError, match=r"max_workers must be >= 0"):
        tensor_dm().probe_num_workers(max_workers=-1)
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text("[1, 2]\n{oops\n")
    with pytest.raises(ValueError, match=r"line 2 is not valid JSON"):
        SequenceDataModule(str(bad_line)).setup("fit")
    no_key = SequenceDataModule([{"ids": [1]}])
    with pytest.raises(ValueError, match=r"sample 0 has no 'input_ids' field.*length_key="):
        no_key.setup("fit")


def test_streams_refuse_auto_workers_and_a_mismatched_shuffle(id_shards: Path) -> None:
    """Each rank would probe its own num_workers; a stream's shards are dealt to rank x
    worker slots, so different picks read some shards twice and others never."""
    auto = stream_dm(id_shards, num_workers="auto", steps_per_epoch=2)
    auto.setup("fit")
    with pytest.raises(ValueError, match=r"num_workers='auto' cannot serve a stream"):
        auto.train_dataloader()

    class Unshuffled(LoaderDataModule):
        def build_datasets(self, stage: str) -> dict[str, Any]:
            return {"train": StreamingShardedDataset(id_shards, TokenReader(seq_len=4))}

    dm = Unshuffled(shuffle=False)
    dm.setup("fit")
    with pytest.raises(ValueError, match=r"shuffle_shards=True.*build the dataset with"):
        dm.train_dataloader()


def test_stream_resume_verdict_depends_on_the_world_size(id_shards: Path) -> None:
    one_pass = stream_dm(id_shards)
    one_pass.setup("fit")
    assert one_pass.resume_info(1)[0] is True
    ok, reason = one_pass.resume_info(2)
    assert not ok and "refused on 2 ranks" in reason and "steps_per_epoch" in reason
    small = stream_dm(id_shards, samples_per_epoch=BATCH)
    small.setup("fit")
    ok, reason = small.resume_info(2)
    assert not ok and "less than one global step" in reason


def test_sharded_token_budget_batches_mix_shards_and_describe_padding(tmp_path: Path) -> None:
    """max_tokens over document and .jsonl shards: every batch within the budget, every
    sample once an epoch, batches drawn from several shards; describe() reports both."""
    root = write_id_documents(tmp_path / "docs", SIZE)
    dm = document_dm(root=root, bucket_window=None, max_tokens=64, pad_to_multiple_of=4)
    info = dm.describe()
    seen = []
    for batch in dm.train_dataloader():
        assert batch.values.numel() <= 64 and batch.values.shape[1] % 4 == 0
        seen += (batch.values[:, 0] - 1).tolist()
    assert sorted(seen) == list(range(SIZE))
    assert 0 < info["padding_fraction"] < 0.25
    assert info["shards_per_batch"] > 2 and info["single_shard_batches"] < 0.2
    assert "ElasticResume" in info["resumable_reason"]
    docs = [[{"input_ids": [s] * (i % 5 + 1), "s": s} for i in range(9)] for s in range(3)]
    write_shards(tmp_path / "js", docs, JsonlReader())
    js = ShardedDataModule(str(tmp_path / "js"), reader="jsonl", max_tokens=10, mix_shards=3)
    rows = [b["s"].tolist() for b in js.train_dataloader()]
    assert sum(map(len, rows)) == 27 and js.describe()["shards_per_batch"] > 1
    keyed = ShardedDataModule(str(tmp_path / "js"), reader="jsonl", max_tokens=10, length_key="x")
    with pytest.raises(KeyError, match=r"no field 'x' \(fields \['input_ids', 's'\]\); pass"):
        keyed.train_dataloader()
    with pytest.raises(ValueError, match=r"bucket_window=8 applies with max_tokens only"):
        ShardedDataModule(str(root), eos=0, bucket_window=8)
    with pytest.raises(ValueError, match=r"max_tokens=64 applies to planned shards only"):
        ShardedDataModule(str(root), eos=0, max_tokens=64, streaming=True)


def test_describe_says_a_token_budget_sizes_the_train_batches() -> None:
    # batch_size=8 was reported for train batches of 20-200 rows.
    seqs = [torch.ones(n % 50 + 1, dtype=torch.long) for n in range(200)]
    dm = SequenceDataModule(seqs, batch_size=8, max_tokens=256, val_fraction=0.1)
    dm.setup("fit")
    splits = dm.describe()["splits"]
    assert splits["train"]["batch_size"] is None and splits["val"]["batch_size"] == 8
    assert max(len(b.values) for b in dm.train_dataloader()) > 8


class _HookedBatches(LoaderDataModule):
    """A weighted val mix, and train batches from a batch_sampler() hook (8, not 32)."""

    def build_datasets(self, stage: str) -> dict[str, Any]:
        a, b = TensorDataset(torch.arange(50.0)), TensorDataset(torch.arange(1000.0, 1013.0))
        weights = {"a": 0.7, "b": 0.3}
        return {
            "train": TensorDataset(torch.arange(200.0)),
            "val": MixedDataset({"a": a, "b": b}, weights=weights, epoch_size=23),
        }

    def batch_sampler(self, split: str, dataset: Any, batch_size: int) -> Any | None:
        if split != "train":
            return None
        return BucketBatchSampler([i % 30 + 1 for i in range(200)], batch_size=8, seed=0)


def test_describe_counts_what_the_loaders_yield() -> None:
    # Hunter 375: a val mix's samples were the sources' total (63, not the 23 drawn), and the
    # train batch size the module's setting (32) beside a hook's sampler of 8.
    dm = _HookedBatches(batch_size=32, eval_batch_size=3, seed=0)
    dm.setup("fit")
    splits = dm.describe()["splits"]
    yielded = {
        split: [len(batch[0]) for batch in dm.loader(split, num_workers=0)]
        for split in ("train", "val")
    }
    assert splits["val"]["samples"] == sum(yielded["val"]) == 23
    assert splits["train"]["samples"] == sum(yielded["train"]) == 200
    assert splits["train"]["batch_size"] == max(yielded["train"]) == 8
    assert splits["train"]["batches_per_epoch"] == len(yielded["train"])


class _OwnGeneratorHook(TensorDataModule):
    """A batch_sampler() hook whose sampler has a generator seeded from the module's seed."""

    def batch_sampler(self, split: str, dataset: Any, batch_size: int) -> Any | None:
        if split != "train":
            return None
        generator = torch.Generator().manual_seed(self.seed)
        sampler = torch.utils.data.RandomSampler(dataset, generator=generator)
        return torch.utils.data.BatchSampler(sampler, batch_size, drop_last=False)


def test_a_hook_sampler_seeded_from_the_module_seed_trains_and_resumes(tmp_path: Path) -> None:
    # Session 36: the module's seed= beside the sampler's own generator was refused even when
    # the two agreed, and the module refuses seed=None: no such hook could be built.
    def fit(name: str, **kwargs: Any) -> FitRun:
        make = functools.partial(_OwnGeneratorHook, torch.arange(SIZE), FEATURES, seed=SEED)
        return fit_recording(tmp_path / name, lambda: make(batch_size=BATCH), **kwargs)

    full, cut = fit("full", max_epochs=2), fit("cut", max_epochs=2, fail_at=11)
    for k in (3, 10):  # inside epoch 0, inside epoch 1
        assert_resume_exact(
            full.records, cut.records[:k], fit(f"at{k}", max_epochs=2, resume=cut.ckpt(k)).records
        )
    epochs = by_epoch(full.records)
    own = torch.utils.data.RandomSampler(range(SIZE), generator=torch.Generator().manual_seed(SEED))
    assert epochs[0] == list(own) and sorted(epochs[1]) == list(range(SIZE)) != epochs[1]


class _Counting(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        yield from (torch.tensor([i]) for i in range(10))


def test_an_iterable_train_split_is_described_as_its_loader_resumes_it() -> None:
    """Measured before: resume_info() said "exact for any num_workers and world size" (the
    loader replays it, same num_workers, one process) and describe() raised on its len()."""

    class Streamed(LoaderDataModule):
        def build_datasets(self, stage: str) -> dict[str, Any]:
            return {"train": _Counting()}

    dm = Streamed(batch_size=4, shuffle=False)
    dm.setup("fit")
    exact, reason = dm.resume_info(1)
    assert exact and "replays its stream" in reason and not dm.resume_info(2)[0]
    assert dm.describe()["splits"]["train"]["batches_per_epoch"] is None


def test_a_datamodule_given_path_objects_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    # Measured: ShardedDataModule(pathlib.Path(...)) kept the PosixPath in hparams, so
    # trainer.fit(ckpt_path=...) failed in torch.load(weights_only=True) (UnpicklingError).
    reader = TokenReader(seq_len=4)
    write_shards(tmp_path / "tok", [np.arange(n * 4) for n in (20, 7, 13)], reader)

    def make() -> ShardedDataModule:
        return ShardedDataModule(tmp_path / "tok", seq_len=4, batch_size=8, seed=3)

    assert make().hparams["shards"] == str(tmp_path / "tok")
    full = fit_recording(tmp_path / "full", make)
    cut = fit_recording(tmp_path / "cut", make, fail_at=3)
    after = fit_recording(tmp_path / "after", make, resume=cut.ckpt(2))
    assert_resume_exact(full.records, cut.records[:2], after.records)


def test_in_memory_dict_sources_pad_to_a_multiple_in_a_mix() -> None:
    # A batch whose rows were all one length raised "name the fields in pad_keys", an
    # argument MixedDataModule does not take (hunter 188).
    a = [{"input_ids": torch.full((i % 4 + 1,), i)} for i in range(40)]
    b = [{"input_ids": torch.full((i % 4 + 1,), 100 + i)} for i in range(40)]
    dm = MixedDataModule({"a": a, "b": b}, max_tokens=16, pad_to_multiple_of=8, seed=0)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert all(batch["input_ids"].shape[1] % 8 == 0 for batch in batches)
    seen = sorted(int(row[0]) for batch in batches for row in batch["input_ids"])
    assert seen == [*range(40), *range(100, 140)]


@pytest.mark.parametrize("streaming", [False, True])
def test_jsonl_shards_of_bare_lists_pad_to_a_multiple(tmp_path: Path, streaming: bool) -> None:
    # 'input_ids' (the default length_key) was refused as a field of bare samples (hunter 188,
    # review 189: streams too).
    rows = [[i] * (i % 3 + 1) for i in range(20)]
    write_shards(tmp_path, [rows[:10], rows[10:]], JsonlReader(), progress=False)
    dm = ShardedDataModule(
        tmp_path, reader="jsonl", batch_size=4, pad_to_multiple_of=8, streaming=streaming
    )
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert {tuple(b.values.shape) for b in batches} == {(4, 8)}
    assert sorted(int(v) for b in batches for v in b.values[:, 0]) == list(range(20))


def test_a_bucketed_sequence_module_predicts_in_order_and_skips_oversize_in_training_only() -> None:
    # Predictions came in length-bucketed order ([3, 14, 6, ...]); oversize="skip" refused
    # every eval split ("only applies with max_tokens": eval samplers have no budget).
    seqs = sequence_samples(20)
    dm = SequenceDataModule(seqs, predict=seqs, bucket=True, batch_size=4, seed=2)
    dm.setup("predict")
    assert [i for b in dm.predict_dataloader() for i in b["id"].tolist()] == list(range(20))
    dm = SequenceDataModule(seqs, val_fraction=0.25, max_tokens=48, oversize="skip", seed=2)
    dm.setup("fit")
    val = [i for b in dm.val_dataloader() for i in b["id"].tolist()]
    assert len(val) == 5 and len(dm.train_dataloader()) > 0


class _TrainAtFitOnly(LoaderDataModule):
    """Builds train at stage "fit" only, as Lightning's docs show build-by-stage."""

    def build_datasets(self, stage: str) -> dict[str, Any]:
        return {"train": list(range(20))} if stage == "fit" else {}


def test_val_fraction_is_cut_for_validate_from_a_train_built_at_fit_only() -> None:
    # Hunter 307: trainer.validate() got no val split (validated nothing, no error).
    dm = _TrainAtFitOnly(batch_size=4, val_fraction=0.25)
    dm.setup("validate")
    val = sorted(int(i) for b in dm.val_dataloader() for i in b)
    assert len(val) == 5
    other = _TrainAtFitOnly(batch_size=4, val_fraction=0.25)
    other.setup("fit")
    assert sorted(int(i) for b in other.val_dataloader() for i in b) == val


class _ValAtValidate(_TrainAtFitOnly):
    def build_datasets(self, stage: str) -> dict[str, Any]:
        return {"val": [100, 101, 102]} if stage == "validate" else super().build_datasets(stage)


@pytest.mark.parametrize("first", ["fit", "validate"])
def test_val_data_beside_val_fraction_is_refused_at_any_stage(first: str) -> None:
    # Review 308: given at "validate" and cut at "fit", one val split replaced the other
    # silently, by which stage ran first.
    dm = _ValAtValidate(batch_size=4, val_fraction=0.25)
    with pytest.raises(ValueError, match=r"val data was given too; pass one or the other"):
        dm.setup(first)
        dm.setup("validate" if first == "fit" else "fit")


class _Cropped(list):
    """A random crop in ``__getitem__``: the length follows the draw."""

    def __getitem__(self, i: Any) -> Any:
        full = list.__getitem__(self, i)
        return full[: int(torch.randint(1, len(full) + 1, ()))]


class _Masked(list):
    """Random masking in ``__getitem__``: the length does not follow the draw."""

    def __getitem__(self, i: Any) -> Any:
        t = list.__getitem__(self, i).clone()
        t[torch.rand(t.shape) < 0.15] = 0
        return t


def test_sequence_lengths_that_follow_random_draws_are_refused_and_rngs_put_back() -> None:
    # Hunter 332: setup measured a list subclass once, unseeded, through the caller's RNGs:
    # a random crop's token-budget batches went over max_tokens (16 of them), silently.
    seqs = [torch.full(((i * 7) % 31 + 2,), i) for i in range(200)]
    with pytest.raises(ValueError, match=r"SequenceDataModule: sample \d+ is \d+ then \d+ long"):
        SequenceDataModule(_Cropped(seqs), max_tokens=64, seed=0).setup("fit")
    SequenceDataModule(_Cropped(seqs), batch_size=4).setup("fit")  # no buckets: lengths unused
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    SequenceDataModule(_Masked(seqs), bucket=True, seed=0).setup("fit")
    assert torch.equal(torch.rand(2), expected)


class _WithPrompt(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Samples of ``data`` with 6 prompt tokens before them; ``keep`` filters first."""

    def __init__(self, data: Any, keep: int = 1) -> None:
        self.data = [s for i, s in enumerate(data) if i % keep == 0]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.cat([torch.full((6,), 9), torch.as_tensor(self.data[i])])


class _Prompted(SequenceDataModule):
    keep = 1

    def build_datasets(self, stage: str) -> dict[str, Any]:
        return {k: _WithPrompt(v, self.keep) for k, v in super().build_datasets(stage).items()}


class _Filtered(_Prompted):
    keep = 2


@pytest.mark.parametrize("module", [_Prompted, _Filtered])
def test_a_subclass_wrapping_its_splits_is_measured_as_it_reads(module: Any) -> None:
    # Hunt 371: lengths were the samples' before the subclass's prompt (every batch over
    # max_tokens), or one per sample it had filtered out (refused with a misleading fix).
    samples = [[1] * n for n in range(1, 41)]
    dm = module(samples, max_tokens=64, val_fraction=0.25, seed=0)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert max(b.values.numel() for b in batches) <= 64
    assert sum(len(b.lengths) for b in batches) == len(dm._datasets["train"])
