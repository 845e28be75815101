"""ShardedDataModule and SequenceDataModule over Parquet files (local and at an s3:// URL),
``.arrow`` files and Hugging Face ``datasets.Dataset`` objects."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

from loaderkit import ParquetReader, SequenceDataModule, ShardedDataModule, write_shards  # noqa: E402
from tests.support.helpers import PassThrough  # noqa: E402

N = 40


def rows(first: int, n: int) -> list[dict[str, Any]]:
    return [{"id": i, "input_ids": [i] * (1 + i % 6)} for i in range(first, first + n)]


@pytest.fixture
def parquet_dir(tmp_path: Path) -> Path:
    write_shards(tmp_path / "pq", [rows(0, 15), rows(15, 25)], ParquetReader(row_group_size=4))
    return tmp_path / "pq"


def epoch_ids(dm: Any, split: str = "train") -> list[int]:
    loader = dm.train_dataloader() if split == "train" else dm.val_dataloader()
    return [int(i) for batch in loader for i in batch["id"]]


def test_sharded_datamodule_reads_parquet(parquet_dir: Path) -> None:
    dm = ShardedDataModule(
        str(parquet_dir),
        reader="parquet",
        columns=["id", "input_ids"],
        batch_size=6,
        window=4,
        seed=1,
    )
    dm.setup("fit")
    assert isinstance(dm.reader, ParquetReader) and dm.train_dataset.sizes == (15, 25)
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape[0] == 6 and "attention_mask" in batch
    assert sorted(epoch_ids(dm)) == list(range(N))
    budget = ShardedDataModule(str(parquet_dir), reader="parquet", max_tokens=12, seed=0)
    budget.setup("fit")
    seen = []
    for batch in budget.train_dataloader():
        assert batch["input_ids"].numel() <= 12
        seen += [int(i) for i in batch["id"]]
    assert sorted(seen) == list(range(N))
    assert budget.describe()["padding_fraction"] is not None


@pytest.mark.parametrize("column", ["labels", None])
def test_a_token_budget_counts_length_key_not_the_readers_length_column(
    tmp_path: Path, column: str | None
) -> None:
    # The batches were planned by the reader's length_column ('labels', 1 token a row) and
    # padded by length_key: 20x over max_tokens. Without a length_column: refused.
    from loaderkit import HFDataset, MixedDataModule

    datasets = pytest.importorskip("datasets")
    ids = [[1] * (1 + i % 20) for i in range(N)]
    table = {"input_ids": ids, "labels": [[0]] * N}
    samples = [{"input_ids": i, "labels": [0]} for i in ids]
    write_shards(tmp_path / "pq", [samples], ParquetReader())
    reader = ParquetReader(length_column=column)
    hf = HFDataset(datasets.Dataset.from_dict(table), length_column=column)
    for dm in (
        ShardedDataModule(str(tmp_path / "pq"), reader=reader, max_tokens=24, seed=0),
        MixedDataModule({"a": hf}, max_tokens=24, seed=0),
    ):
        dm.setup("fit")
        shapes = [b["input_ids"].shape for b in dm.train_dataloader()]
        assert max(r * n for r, n in shapes) <= 24 and sum(r for r, _ in shapes) == N


def test_pad_to_multiple_of_pads_a_batch_of_equal_lengths(tmp_path: Path) -> None:
    # Rows 0, 6, 12, ... all hold one token: such a batch was left at length 1.
    write_shards(tmp_path / "pq", [rows(0, 40)], ParquetReader(row_group_size=4))
    dm = ShardedDataModule(
        str(tmp_path / "pq"), reader="parquet", batch_size=1, pad_to_multiple_of=8, seed=0
    )
    dm.setup("fit")
    shapes = {tuple(b["input_ids"].shape) for b in dm.train_dataloader()}
    assert shapes == {(1, 8)}


def test_rows_of_two_sequences_of_other_lengths_are_refused_naming_length_key(
    tmp_path: Path,
) -> None:
    # Hunter 379: the lengths and mask followed src in one batch and tgt in the next; review
    # 382: the refusal named PadCollate's length_field, which the module does not take.
    (tmp_path / "s2s").mkdir()
    (tmp_path / "s2s" / "a.jsonl").write_text(
        "".join(f'{{"src": {list(range(i % 5 + 1))}, "tgt": [1, 2]}}\n' for i in range(8))
    )
    dm = ShardedDataModule(str(tmp_path / "s2s"), reader="jsonl", batch_size=4, seed=0)
    dm.setup("fit")
    with pytest.raises(Exception, match=r"pass the module's length_key= one of 'src', 'tgt'"):
        next(iter(dm.train_dataloader()))
    dm = ShardedDataModule(
        str(tmp_path / "s2s"), reader="jsonl", batch_size=4, seed=0, length_key="src"
    )
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    lengths = batch["lengths"]
    assert lengths.max() == batch["src"].shape[1] and lengths.tolist() == (
        batch["attention_mask"].sum(1).tolist()
    )


def test_sharded_datamodule_bad_arguments(parquet_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="columns=\\['id'\\] applies to reader='parquet' only"):
        ShardedDataModule(str(parquet_dir), columns=["id"], seq_len=4)
    with pytest.raises(ValueError, match="options seq_len need reader='tokens', got reader='parq"):
        ShardedDataModule(str(parquet_dir), reader="parquet", seq_len=4)
    with pytest.raises(ValueError, match="storage_options and cache_dir are for shards at URLs"):
        ShardedDataModule(str(parquet_dir), reader="parquet", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="reader must be one of"):
        ShardedDataModule(str(parquet_dir), reader="csv")  # type: ignore[arg-type]


def test_sharded_datamodule_parquet_at_an_s3_url(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from tests.support.s3 import LocalS3

    with LocalS3(log=tmp_path / "moto.log") as s3:
        url = f"s3://{s3.bucket}/dm"
        write_shards(url, [rows(0, 15), rows(15, 25)], ParquetReader(), storage_options=s3.options)
        dm = ShardedDataModule(
            url,
            reader="parquet",
            batch_size=8,
            storage_options=s3.options,
            cache_dir=str(tmp_path / "cache"),
            num_workers=2,
        )
        dm.setup("fit")
        assert sorted(epoch_ids(dm)) == list(range(N))
        assert dm.train_dataset.describe()["remote"]["fetched"] >= 2


def test_sequence_datamodule_reads_parquet_arrow_and_datasets(
    parquet_dir: Path, tmp_path: Path
) -> None:
    path = str(sorted(parquet_dir.glob("*.parquet"))[1])  # ids 15..39
    dm = SequenceDataModule(path, max_tokens=16, val_fraction=0.2, seed=0)
    dm.setup("fit")
    assert dm._lengths["train"].sum() + dm._lengths["val"].sum() == sum(
        1 + i % 6 for i in range(15, N)
    )
    train, val = epoch_ids(dm), epoch_ids(dm, "val")
    assert sorted(train + val) == list(range(15, N)) and len(val) == 5
    datasets = pytest.importorskip("datasets")
    hf = datasets.Dataset.from_list(rows(0, N))
    dm = SequenceDataModule(hf, columns=["id", "input_ids"], batch_size=7, bucket=True)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    assert Counter(int(i) for b in batches for i in b["id"]) == Counter(range(N))
    assert all(int(b["lengths"].max()) == b["input_ids"].shape[1] for b in batches)
    hf.save_to_disk(str(tmp_path / "saved"))
    arrow = str(next((tmp_path / "saved").glob("data-*.arrow")))
    dm = SequenceDataModule(train=arrow, batch_size=10)
    dm.setup("fit")
    assert sorted(epoch_ids(dm)) == list(range(N))


def test_sequence_datamodule_reads_a_list_of_parquet_paths(parquet_dir: Path) -> None:
    # A list of paths was taken for a list of samples: "train sample 0 is a str".
    paths = [str(p) for p in sorted(parquet_dir.glob("*.parquet"))]
    dm = SequenceDataModule(paths, batch_size=6, val_fraction=0.25, columns=["id", "input_ids"])
    dm.setup("fit")
    assert sorted(epoch_ids(dm) + epoch_ids(dm, "val")) == list(range(N))
    arrow = parquet_dir / "x.arrow"
    arrow.touch()
    with pytest.raises(ValueError, match="list of paths that are not all Parquet files"):
        SequenceDataModule([paths[0], str(arrow)])
    with pytest.raises(FileNotFoundError, match=r"train\[1\]='.*nope.parquet' does not exist"):
        SequenceDataModule([paths[0], str(parquet_dir / "nope.parquet")])


def test_sequence_datamodule_bad_arguments(parquet_dir: Path, tmp_path: Path) -> None:
    path = str(next(parquet_dir.glob("*.parquet")))
    with pytest.raises(ValueError, match="leaves out length_key='input_ids'"):
        SequenceDataModule(path, columns=["id"])
    with pytest.raises(ValueError, match="columns=\\['id'\\] applies to Parquet, Arrow"):
        SequenceDataModule([[1, 2]], columns=["id"])
    with pytest.raises(ValueError, match="URLs must name a Parquet file"):
        SequenceDataModule("s3://bucket/train.jsonl")
    with pytest.raises(ValueError, match="storage_options and cache_dir are for a Parquet URL"):
        SequenceDataModule(path, storage_options={})
    with pytest.raises(ValueError, match=r"must end with \.jsonl or \.arrow or \.parquet or \.pq"):
        SequenceDataModule(str(tmp_path / "x.csv"))


def test_a_split_wrapped_by_a_subclass_is_refused_by_name(parquet_dir: Path) -> None:
    # Hunt 371: AttributeError: 'Wrapped' object has no attribute 'batch_sampler'.
    class Wrapped(PassThrough):
        pass

    class Module(ShardedDataModule):
        def build_datasets(self, stage: str) -> dict[str, Any]:
            return {k: Wrapped(v) for k, v in super().build_datasets(stage).items()}

    dm = Module(parquet_dir, reader=ParquetReader(), batch_size=4)
    dm.setup("fit")
    with pytest.raises(TypeError, match=r"the train split is a Wrapped, which has no batch_sa"):
        dm.train_dataloader()
