"""Every DataModule builds from ``lightning.pytorch.cli.LightningCLI``: flags and YAML configs.

LightningCLI reads the DataModules' typed ``__init__`` signatures (and, through
``**kwargs``, the loader policy of ``LoaderDataModule``) with jsonargparse.
Each test builds a module from command-line flags and one from a config file,
checks that the values arrived, and loads a batch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.cli import LightningCLI

from loaderkit import JsonlReader, TokenReader, write_shards
from loaderkit.lightning.datamodules import (
    ArrayDataModule,
    ImageFolderDataModule,
    SequenceDataModule,
    ShardedDataModule,
    TensorDataModule,
)
from tests.support.datamodules import make_image_tree

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    # lightning 2.6 calls jsonargparse APIs that jsonargparse >= 4.49 deprecates.
    pytest.mark.filterwarnings(
        r"ignore:(?s).*(was deprecated in v4|JsonargparseDeprecationWarning):DeprecationWarning"
    ),
]

TRAINER = ["--trainer.accelerator=cpu", "--trainer.logger=false", "--trainer.max_epochs=1"]


class TinyModel(L.LightningModule):
    def __init__(self, hidden: int = 2) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(hidden, 1)


def from_flags(datamodule_class: type, *flags: str) -> Any:
    cli = LightningCLI(
        TinyModel,
        datamodule_class,
        run=False,
        args=[*TRAINER, *flags],
        save_config_callback=None,
        seed_everything_default=False,
    )
    return cli.datamodule


def from_yaml(datamodule_class: type, tmp_path: Path, data: dict[str, Any]) -> Any:
    # JSON is YAML: the config file is written without a YAML library.
    config = tmp_path / f"{datamodule_class.__name__}.yaml"
    config.write_text(
        json.dumps({"trainer": {"accelerator": "cpu", "logger": False}, "data": data})
    )
    return from_flags(datamodule_class, f"--config={config}")


def first_batch(dm: Any) -> Any:
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


def test_tensor_datamodule(tmp_path: Path) -> None:
    torch.save((torch.randn(20, 3), torch.arange(20)), tmp_path / "train.pt")
    torch.save((torch.randn(4, 3), torch.arange(4)), tmp_path / "val.pt")
    dm = from_flags(
        TensorDataModule,
        f"--data.train={tmp_path / 'train.pt'}",
        f"--data.val={tmp_path / 'val.pt'}",
        "--data.batch_size=4",
        "--data.num_workers=auto",
        "--data.pin_memory=false",
        "--data.seed=7",
    )
    assert isinstance(dm, TensorDataModule)
    assert (dm.batch_size, dm.num_workers, dm.pin_memory, dm.seed) == (4, "auto", False, 7)
    dm.num_workers = 0  # the probe is tested elsewhere
    x, _ = first_batch(dm)
    assert x.shape == (4, 3) and len(dm.val_dataset) == 4
    dm = from_yaml(
        TensorDataModule,
        tmp_path,
        {"train": str(tmp_path / "train.pt"), "val_fraction": 0.25, "eval_batch_size": 3},
    )
    dm.setup("fit")
    assert (dm.val_fraction, dm.eval_batch_size, len(dm.val_dataset)) == (0.25, 3, 5)
    assert dm.hparams["train"] == str(tmp_path / "train.pt")


def test_array_datamodule(tmp_path: Path) -> None:
    np.savez(tmp_path / "data.npz", x=np.ones((12, 2), np.float32), y=np.arange(12))
    np.save(tmp_path / "x.npy", np.zeros((10, 5), np.float32))
    dm = from_flags(
        ArrayDataModule,
        f"--data.train={tmp_path / 'data.npz'}",
        "--data.keys=[y, x]",
        "--data.batch_size=6",
        "--data.shuffle=false",
    )
    assert dm.keys == ["y", "x"] and dm.shuffle is False
    y, x = first_batch(dm)
    assert y.tolist() == list(range(6)) and x.shape == (6, 2)
    dm = from_yaml(ArrayDataModule, tmp_path, {"train": str(tmp_path / "x.npy"), "mmap": False})
    (x,) = first_batch(dm)
    assert dm.mmap is False and x.shape == (10, 5)


def test_sequence_datamodule(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    rows = [{"input_ids": list(range(n)), "label": n % 2} for n in (5, 3, 8, 2, 7, 1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = from_flags(
        SequenceDataModule,
        f"--data.train={path}",
        "--data.max_tokens=16",
        "--data.pad_to_multiple_of=4",
        "--data.window=4",
    )
    assert (dm.max_tokens, dm.pad_to_multiple_of, dm.window, dm.bucket) == (16, 4, 4, True)
    batch = first_batch(dm)
    assert batch["input_ids"].numel() <= 16 and batch["input_ids"].shape[1] % 4 == 0
    inline = {"train": [[1, 2, 3], [4, 5], [6]], "batch_size": 2, "pad_value": -1}
    dm = from_yaml(SequenceDataModule, tmp_path, {**inline, "shuffle": False})
    assert first_batch(dm).values.tolist() == [[1, 2, 3], [4, 5, -1]]


def test_image_folder_datamodule(tmp_path: Path) -> None:
    root = make_image_tree(tmp_path / "train", per_class=2)
    val = make_image_tree(tmp_path / "val", per_class=1)
    dm = from_flags(
        ImageFolderDataModule,
        f"--data.root={root}",
        f"--data.val_root={val}",
        "--data.image_size=6",
        "--data.mean=[0.5, 0.5, 0.5]",
        "--data.color_jitter=0",
        "--data.batch_size=2",
    )
    assert (dm.image_size, dm.mean, dm.color_jitter) == (6, (0.5, 0.5, 0.5), 0.0)
    images, _ = first_batch(dm)
    assert images.shape == (2, 3, 6, 6) and len(dm.val_dataset) == 2
    dm = from_yaml(
        ImageFolderDataModule,
        tmp_path,
        {"root": str(root), "std": [0.2, 0.2, 0.2], "val_fraction": 0.5, "image_size": 4},
    )
    dm.setup("fit")
    assert dm.std == (0.2, 0.2, 0.2) and len(dm.val_dataset) == 2


def test_sharded_datamodule(tmp_path: Path) -> None:
    write_shards(tmp_path / "tok", [np.arange(32), np.arange(16)], TokenReader(seq_len=4))
    dm = from_flags(
        ShardedDataModule,
        f"--data.shards={tmp_path / 'tok'}",
        "--data.seq_len=4",
        "--data.window=2",
        "--data.batch_size=3",
    )
    assert (dm.reader.seq_len, dm.window, dm.batch_size) == (4, 2, 3)
    assert first_batch(dm).shape == (3, 4)
    paths = write_shards(
        tmp_path / "js", [[{"input_ids": [1, 2]}, {"input_ids": [3]}]] * 2, JsonlReader()
    )
    dm = from_yaml(
        ShardedDataModule,
        tmp_path,
        {"shards": [str(p) for p in paths], "reader": "jsonl", "batch_size": 2},
    )
    assert isinstance(dm.reader, JsonlReader)
    assert first_batch(dm)["input_ids"].shape[0] == 2
    # A reader object: jsonargparse checks it against the ShardReader protocol, whose
    # parameter names the readers did not share (it exited: "does not implement protocol").
    reader = {"class_path": "loaderkit.TokenReader", "init_args": {"seq_len": 4}}
    dm = from_yaml(ShardedDataModule, tmp_path, {"shards": str(tmp_path / "tok"), "reader": reader})
    assert isinstance(dm.reader, TokenReader) and first_batch(dm).shape[1] == 4


def test_short_class_names_resolve_after_import_loaderkit() -> None:
    # `import loaderkit` defers Lightning; where Lightning is already loaded it loads the
    # DataModules and callbacks at once, since LightningCLI resolves short class names
    # only among imported classes. A fresh interpreter: this process imported them long ago.
    import subprocess
    import sys

    code = (
        "from lightning.pytorch.cli import LightningCLI\n"
        "from lightning.pytorch.demos.boring_classes import BoringModel, BoringDataModule\n"
        "import loaderkit\n"
        "cli = LightningCLI(BoringModel, BoringDataModule, run=False, args=[\n"
        "    '--trainer.callbacks+=ElasticResume', '--trainer.logger=false',\n"
        "    '--trainer.enable_checkpointing=false'])\n"
        "mine = [c for c in cli.trainer.callbacks if not getattr(c, '_auto', False)]\n"
        "print(sum(type(c).__name__ == 'ElasticResume' for c in mine))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1"


def test_parquet_example_config_trains(tmp_path: Path) -> None:
    # examples/parquet_cli.yaml as a user runs it: demo Parquet data, then `fit --config`.
    pytest.importorskip("pyarrow")
    import importlib.util

    root = Path(__file__).resolve().parents[2] / "examples"
    spec = importlib.util.spec_from_file_location("train_cli", root / "train_cli.py")
    assert spec is not None and spec.loader is not None
    train_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_cli)
    train_cli.main(["make-data", str(tmp_path / "pq")])
    args = [
        "fit",
        f"--config={root / 'parquet_cli.yaml'}",
        f"--data.init_args.shards={tmp_path / 'pq'}",
        "--trainer.max_steps=3",
        "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path / 'run'}",
    ]
    train_cli.main(args)
    checkpoints = list((tmp_path / "run").rglob("*.ckpt"))
    assert [c.name for c in checkpoints] == ["last.ckpt"]  # the config's step checkpoint


def test_mix_example_config_trains(tmp_path: Path) -> None:
    # examples/mix_cli.yaml as a user runs it: two demo sources, then `fit --config`
    # (LightningCLI builds the MixedDataModule, its dicts of sources and weights, from YAML).
    pytest.importorskip("pyarrow")
    import importlib.util

    root = Path(__file__).resolve().parents[2] / "examples"
    spec = importlib.util.spec_from_file_location("train_cli", root / "train_cli.py")
    assert spec is not None and spec.loader is not None
    train_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_cli)
    train_cli.main(["make-mix", str(tmp_path / "mix")])
    train_cli.main(
        [
            "fit",
            f"--config={root / 'mix_cli.yaml'}",
            f"--data.init_args.sources.web={tmp_path / 'mix' / 'web'}",
            f"--data.init_args.sources.books={tmp_path / 'mix' / 'books'}",
            "--trainer.max_steps=3",
            "--trainer.accelerator=cpu",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={tmp_path / 'run'}",
        ]
    )
    (ckpt,) = list((tmp_path / "run").rglob("*.ckpt"))
    assert ckpt.name == "last.ckpt"  # the config's step checkpoint
    saved = torch.load(ckpt, weights_only=False)
    assert saved["datamodule_hyper_parameters"]["sources"] == {
        "web": str(tmp_path / "mix" / "web"),
        "books": str(tmp_path / "mix" / "books"),
    }
    assert "mix-bucket" in repr(saved["loops"]["fit_loop"]["state_dict"])
