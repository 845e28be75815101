"""Parquet shards: ParquetReader under ShardedDataset.

Every row holds its global sample id in column ``id``, and ``tokens``, a list
of ``1 + id % 5`` copies of the id (variable-length token sequences), so a
batch says which samples it holds and how long each is.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from loaderkit import (  # noqa: E402
    BucketBatchSampler,
    MissingDependencyError,
    PadCollate,
    ParquetReader,
    RemoteCache,
    ResumableDataLoader,
    ShardedDataset,
    ShardError,
    write_shards,
)
from loaderkit.data import _arrow  # noqa: E402
from tests.support.loops import check_resume_oracle  # noqa: E402

SIZES = (11, 0, 23, 4, 17)  # 55 rows in 5 files, one empty
ROW_GROUP = 5


def tables(sizes: tuple[int, ...] = SIZES) -> list[Any]:
    out, first = [], 0
    for n in sizes:
        ids = list(range(first, first + n))
        out.append(
            pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "score": pa.array([i / 2 for i in ids], pa.float32()),
                    "tokens": pa.array([[i] * (1 + i % 5) for i in ids], pa.list_(pa.int32())),
                    "name": [f"row{i}" for i in ids],
                }
            )
        )
        first += n
    return out


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return write_shards(tmp_path / "pq", tables(), ParquetReader(row_group_size=ROW_GROUP))


def dataset(shards: Any, **kwargs: Any) -> ShardedDataset:
    reader_args = {k: kwargs.pop(k) for k in ("columns", "length_column") if k in kwargs}
    return ShardedDataset(shards, ParquetReader(**reader_args), **kwargs)


def batch_ids(batch: Any) -> list[int]:
    return [int(i) for i in batch["id"]]


def test_rows_equal_pyarrow_and_pandas(shards: list[Path]) -> None:
    ds = dataset(shards)
    frame = pq.read_table(shards).to_pandas()  # every file, end to end
    assert ds.sizes == SIZES and len(ds) == len(frame) == sum(SIZES)
    for i in (0, 10, 11, 33, 54, -1):
        row, want = ds[i], frame.iloc[i]
        assert int(row["id"]) == want["id"] and row["name"] == want["name"]
        assert float(row["score"]) == pytest.approx(want["score"])
        assert row["tokens"].tolist() == list(want["tokens"])
    idx = np.random.default_rng(0).permutation(len(ds))[:20]  # across files and row groups
    batch = ds.get_batch(idx)
    assert batch["id"].dtype == torch.int64 and batch["id"].tolist() == frame["id"][idx].tolist()
    assert batch["score"].dtype == torch.float32
    assert batch["name"] == frame["name"][idx].tolist()
    assert [t.tolist() for t in batch["tokens"]] == [list(x) for x in frame["tokens"][idx]]
    assert all(t.dtype == torch.int32 for t in batch["tokens"])
    rows = ds.__getitems__(idx.tolist())
    assert [int(r["id"]) for r in rows] == frame["id"][idx].tolist()


def test_count_reads_the_footer_only(shards: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def no_data(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("counting read a data page")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", no_data)
    monkeypatch.setattr(pq.ParquetFile, "read", no_data)
    reader = ParquetReader()
    assert [reader.count(p) for p in shards] == list(SIZES)
    assert ShardedDataset(shards, reader, index=shards[0].parent / "other.json").sizes == SIZES


def test_a_batch_reads_each_row_group_once_and_the_cache_is_bounded(shards: list[Path]) -> None:
    ds = dataset(shards, columns=["id"])
    shard = 2  # 23 rows: row groups of 5
    start = sum(SIZES[:shard])
    local = [0, 14, 1, 3, 6, 13, 2]  # row groups 0, 2, 1, 0, 1, 2, 0
    batch = ds.get_batch([start + i for i in local])
    assert batch["id"].tolist() == [start + i for i in local] and list(batch) == ["id"]
    handle: Any = ds._handle(shard)
    assert handle.decoded == 3
    ds.get_batch([start + 4, start + 12])  # cached: nothing decoded
    assert handle.decoded == 3
    for group in range(5):  # 5 groups through a cache of 4: group 0 is evicted ...
        ds.get_batch([start + ROW_GROUP * group])
    assert handle.decoded == 5 and len(handle._cache) == 4
    ds.get_batch([start])  # ... and decoded again
    assert handle.decoded == 6 and len(handle._cache) == 4
    assert ds.get_batch([start])["id"].tolist() == [start]


def test_columns_select(shards: list[Path]) -> None:
    ds = dataset(shards, columns=["tokens", "id"])
    assert set(ds[3]) == {"tokens", "id"}
    with pytest.raises(ShardError, match=r"has no column\(s\) \['nope'\]"):
        dataset(shards, columns=["id", "nope"])[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exactly_once_across_ranks_and_workers(shards: list[Path], num_workers: int) -> None:
    ds = dataset(shards, columns=["id"])
    world = 3
    seen: list[int] = []
    steps = []
    for rank in range(world):
        sampler = ds.batch_sampler(4, seed=1, window=6, rank=rank, world_size=world, drop_last=True)
        loader = ResumableDataLoader(ds, batch_sampler=sampler, num_workers=num_workers)
        batches = [batch_ids(b) for b in loader]
        steps.append(len(batches))
        seen += [i for b in batches for i in b]
    assert len(set(steps)) == 1  # every rank steps the same number of times
    counts = Counter(seen)
    assert max(counts.values()) == 1 and len(seen) == 55 // 12 * 12


# The open file's own check, or the epoch-start check of the shards a process holds open.
CHANGED = r"was replaced or rewritten after it was opened|changed after it was indexed"


@pytest.mark.parametrize("replaced", [False, True])
def test_a_forked_worker_reads_the_file_its_parent_opened(
    shards: list[Path], replaced: bool
) -> None:
    """A forked worker reopened by path a file its parent had open: replaced meanwhile,
    batches mixed the parent's cached rows of the old file with rows of the new one."""
    ds = dataset(shards, columns=["id"])
    assert int(ds[0]["id"]) == 0  # the main process opens the first file
    if replaced:  # same row count and row groups, other ids
        new = tables()[0].set_column(0, "id", pa.array(range(1000, 1011), pa.int64()))
        pq.write_table(new, shards[0], row_group_size=ROW_GROUP)
    loader = ResumableDataLoader(ds, batch_size=11, num_workers=2, multiprocessing_context="fork")
    if replaced:
        with pytest.raises(ShardError, match=CHANGED):
            list(loader)
    else:
        assert sorted(i for b in loader for i in batch_ids(b)) == list(range(55))


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_file_rewritten_in_place_is_refused_not_mixed(tmp_path: Path, on_error: Any) -> None:
    """Rewritten in place (same inode) after a row group was cached: the open file read the
    new bytes next to the cached old rows; under on_error='skip' a forked worker read them."""
    paths = write_shards(tmp_path / "pq", tables((11, 6)), ParquetReader(row_group_size=5))
    ds = dataset(paths, columns=["id"], on_error=on_error)
    assert int(ds[0]["id"]) == 0
    new = tables((11,))[0].set_column(0, "id", pa.array(range(1000, 1011), pa.int64()))
    with open(paths[0], "r+b") as f:  # in place: the inode stays
        f.truncate(0)
        pq.write_table(new, f, row_group_size=ROW_GROUP)
    for num_workers in (0, 2):
        context = "fork" if num_workers else None
        loader = ResumableDataLoader(
            ds, batch_size=11, num_workers=num_workers, multiprocessing_context=context
        )
        with pytest.raises(ShardError, match=CHANGED):
            list(loader)


def test_a_file_replaced_under_an_open_handle_is_read_whole(tmp_path: Path) -> None:
    """Replaced by a rename (a cache copy evicted and fetched again), the open file keeps
    reading its own inode in this process: all old rows, no error, no mix."""
    paths = write_shards(tmp_path / "pq", tables((11,)), ParquetReader(row_group_size=5))
    ds = dataset(paths, columns=["id"])
    assert int(ds[0]["id"]) == 0
    new = tables((11,))[0].set_column(0, "id", pa.array(range(1000, 1011), pa.int64()))
    pq.write_table(new, tmp_path / "new.parquet", row_group_size=ROW_GROUP)
    os.replace(tmp_path / "new.parquet", paths[0])
    assert [int(ds[i]["id"]) for i in range(11)] == list(range(11))


def test_a_prepared_reader_refuses_a_file_retyped_since(tmp_path: Path) -> None:
    """The dtypes are decided once from the footers; a file opened later with a type they
    do not hold would be read into the wrong dtype (datasets' own checks fire first, so the
    prepared reader is reached directly here)."""
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"x": pa.array([1], pa.int32())}), a)
    pq.write_table(pa.table({"x": pa.array([2], pa.int16())}), b)
    prepared = ParquetReader().prepare([(str(a), a), (str(b), b)])
    assert prepared.dtypes(["x"]) == {"x": torch.int32}
    pq.write_table(pa.table({"x": pa.array([7], pa.int8())}), b)  # int32 holds it
    assert prepared.open(b).read(0)["x"].item() == 7
    pq.write_table(pa.table({"x": pa.array([2**40], pa.int64())}), b)
    match = r"column 'x' is int64 in '[^']*b\.parquet', which torch.int32, decided from the files "
    with pytest.raises(ShardError, match=match + r"when the dataset was built, does not hold"):
        prepared.open(b)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_oracle(shards: list[Path], num_workers: int) -> None:
    ds = dataset(shards, columns=["id", "tokens"])

    def make(nw: int) -> ResumableDataLoader:
        sampler = ds.batch_sampler(4, seed=3, window=6, mix_shards=2)
        return ResumableDataLoader(
            ds, batch_sampler=sampler, num_workers=nw, collate_fn=PadCollate(length_field="tokens")
        )

    full = check_resume_oracle(make, batch_ids, cuts=(3, 14 + 5), num_workers=num_workers)
    assert len(full) == 2 * 14
    for epoch in (0, 1):
        assert sorted(i for r in full if r["epoch"] == epoch for i in r["ids"]) == list(range(55))


def test_token_budget_from_the_length_column(shards: list[Path]) -> None:
    ds = dataset(shards, length_column="tokens")
    assert ds.lengths().tolist() == [1 + i % 5 for i in range(55)]
    sampler = ds.bucket_batch_sampler(max_tokens=12, seed=0, window=16)
    loader = ResumableDataLoader(
        ds, batch_sampler=sampler, collate_fn=PadCollate(length_field="tokens")
    )
    seen = []
    for batch in loader:
        assert batch["tokens"].numel() <= 12
        assert batch["lengths"].tolist() == [1 + int(i) % 5 for i in batch["id"]]
        seen += batch_ids(batch)
    assert sorted(seen) == list(range(55))
    lengths_of_ints = ShardedDataset(shards, ParquetReader(length_column="id")).lengths()
    assert lengths_of_ints.tolist() == list(range(55))


def test_lengths_of_a_subclass_adding_tokens_are_refused(shards: list[Path]) -> None:
    """The length column's figures were given to a subclass adding a prompt to it."""

    class Prompted(ShardedDataset):
        def __getitem__(self, index: int) -> dict[str, Any]:
            row = super().__getitem__(index)
            return {**row, "tokens": [1, 1, *row["tokens"].tolist()]}

    with pytest.raises(ValueError, match=r"sample \d+ has \d+ tokens, where its source counts"):
        Prompted(shards, ParquetReader(length_column="tokens")).lengths()
    assert Prompted(shards, ParquetReader(length_column="tokens")).lengths(
        lambda row: len(row["tokens"])
    ).tolist() == [3 + i % 5 for i in range(55)]


def test_bad_arguments_are_named(shards: list[Path], tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="columns must be a list of column names"):
        ParquetReader(columns="id")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="columns must be a non-empty list"):
        ParquetReader(columns=[])
    with pytest.raises(ValueError, match="columns lists a name twice"):
        ParquetReader(columns=["id", "id"])
    with pytest.raises(ValueError, match="cache_row_groups"):
        ParquetReader(cache_row_groups=0)
    with pytest.raises(TypeError, match="length_column must be a column name"):
        ParquetReader(length_column=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="has no length_column"):
        dataset(shards).lengths()
    with pytest.raises(ShardError, match="has no length_column 'nope'"):
        dataset(shards, length_column="nope").lengths()
    with pytest.raises(TypeError, match="length_column 'name' is string"):
        dataset(shards, length_column="name").lengths()
    with pytest.raises(TypeError, match=r"ParquetReader\.write: data must be"):
        ParquetReader().write(tmp_path / "x.parquet", 3)
    bad = tmp_path / "bad" / "x.parquet"
    bad.parent.mkdir()
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(ShardError, match="is not a readable Parquet file"):
        ShardedDataset([bad], ParquetReader())
    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"x": pa.array([1, None], pa.int64())}), nulls)
    with pytest.raises(ValueError, match=r"column 'x' has 1 null value"):
        ShardedDataset([nulls], ParquetReader()).get_batch([0, 1])


def test_missing_pyarrow_names_the_extra(
    shards: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install '\.\[parquet\]'"):
        ParquetReader().count(shards[0])
    with pytest.raises(ImportError):  # a MissingDependencyError is an ImportError too
        _arrow.import_pyarrow()


def test_fixed_size_lists_are_one_tensor(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    values = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], pa.list_(pa.float64(), 2))
    pq.write_table(pa.table({"v": values}), path)
    batch = ShardedDataset([path], ParquetReader()).get_batch([2, 0])
    assert batch["v"].tolist() == [[5.0, 6.0], [1.0, 2.0]]


def test_parquet_at_an_s3_url(tmp_path: Path) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from tests.support.s3 import LocalS3

    with LocalS3(log=tmp_path / "moto.log") as s3:
        url = f"s3://{s3.bucket}/parquet"
        reader = ParquetReader(row_group_size=ROW_GROUP)
        urls = write_shards(url, tables(), reader, storage_options=s3.options)
        assert urls[0] == f"{url}/shard-00000.parquet"
        cache = RemoteCache(cache_dir=tmp_path / "cache", storage_options=s3.options)
        ds = ShardedDataset(url, ParquetReader(columns=["id", "tokens"]), remote=cache)
        assert ds.sizes == SIZES
        sampler = ds.batch_sampler(5, seed=2, window=4)
        loader = ResumableDataLoader(
            ds, batch_sampler=sampler, num_workers=2, collate_fn=PadCollate(length_field="tokens")
        )
        seen = [i for b in loader for i in batch_ids(b)]
        assert sorted(seen) == list(range(55))
        assert ds.describe()["remote"]["fetched"] >= 1


def test_a_column_typed_differently_across_files_gives_one_batch_structure(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"y": pa.array([0, 1, 2], pa.int32())}), a)
    pq.write_table(pa.table({"y": pa.array([3, 4, 5], pa.int64())}), b)
    ds = ShardedDataset([a, b], ParquetReader())
    spanning = ds.get_batch([0, 4])["y"]
    assert isinstance(spanning, torch.Tensor) and spanning.tolist() == [0, 4]
    assert spanning.dtype == torch.int64  # promoted, whichever files a batch spans


@pytest.mark.parametrize(
    ("first", "second", "dtype"),
    [("uint16", "uint16", torch.uint16), ("uint32", "uint32", torch.uint32),
     ("uint64", "uint64", torch.uint64), ("uint16", "uint32", torch.int64)],
)  # fmt: skip
def test_unsigned_columns_in_a_batch_across_files(
    tmp_path: Path, first: str, second: str, dtype: torch.dtype
) -> None:
    # torch has no index_put for these dtypes: a batch spanning two files raised.
    top = {"uint16": 2**16 - 1, "uint32": 2**32 - 1, "uint64": 2**64 - 1}[second]
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"u": pa.array([0, 1, 2], getattr(pa, first)())}), a)
    pq.write_table(pa.table({"u": pa.array([3, 4, top], getattr(pa, second)())}), b)
    got = ShardedDataset([a, b], ParquetReader()).get_batch([5, 0, 4])["u"]
    assert got.dtype == dtype and got.numpy().tolist() == [top, 0, 4]


def test_mixed_sources_that_type_a_column_apart_are_refused(tmp_path: Path) -> None:
    from loaderkit import MixedDataset

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir(), (tmp_path / "c").mkdir()
    big = [2**24 + 1 + i for i in range(4)]  # float32 rounds them
    pq.write_table(pa.table({"x": pa.array(big, pa.int64())}), tmp_path / "a" / "a.parquet")
    pq.write_table(pa.table({"x": pa.array([0.5] * 4, pa.float32())}), tmp_path / "b" / "b.parquet")
    pq.write_table(pa.table({"x": pa.array([7] * 4, pa.int32())}), tmp_path / "c" / "c.parquet")
    a, b, c = (ShardedDataset(tmp_path / n, ParquetReader()) for n in "abc")
    with pytest.raises(ShardError, match=r"field 'x' is torch.float32 in source 'b'.*'a'"):
        MixedDataset({"a": a, "b": b})
    mix = MixedDataset({"a": a, "c": c})  # int32 fits in int64: collate promotes exactly
    loader = ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(8, seed=0))
    assert sorted(next(iter(loader))["x"].tolist()) == [7] * 4 + big
    with pytest.raises(ShardError, match=r"which a batch of both cannot hold exactly"):
        MixedDataset({"c": c, "b": b})  # float64 holds both, but collate makes float32
    (tmp_path / "s").mkdir(), (tmp_path / "t").mkdir()
    pq.write_table(pa.table({"x": pa.array(["u", "v"])}), tmp_path / "s" / "s.parquet")
    words = pa.array(["w", "z"]).dictionary_encode()  # a pandas category: still strings
    pq.write_table(pa.table({"x": words}), tmp_path / "t" / "t.parquet")
    texts = MixedDataset([ShardedDataset(tmp_path / n, ParquetReader()) for n in "st"])
    assert sorted(texts[i]["x"] for i in range(4)) == ["u", "v", "w", "z"]
    with pytest.raises(ShardError, match=r"field 'x' is string in source 's' but torch.int64"):
        MixedDataset([a, ShardedDataset(tmp_path / "s", ParquetReader())])  # ids beside words
    (tmp_path / "l").mkdir()  # hunter 337: said "torch.int64 ... but torch.int64"
    pq.write_table(
        pa.table({"x": pa.array([[1], [2]], pa.list_(pa.int64()))}), tmp_path / "l" / "l.parquet"
    )
    lists = ShardedDataset(tmp_path / "l", ParquetReader())
    with pytest.raises(
        ShardError, match=r"'x' is lists of torch.int64 in source 'l' but torch.int64"
    ):
        MixedDataset({"a": a, "l": lists})


def _footer_says(path: Path, rows: int) -> None:
    """Rewrite the footer's total row count of the 10-row file ``path`` (row groups kept)."""
    data = bytearray(path.read_bytes())
    size = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - size
    # FileMetaData field 3 (num_rows, i64): compact header 0x16, then zigzag varint 20 (10 rows).
    at = data.index(bytes([0x16, 20]), start)
    data[at + 1] = 2 * rows
    path.write_bytes(bytes(data))
    meta = pq.ParquetFile(path).metadata
    assert meta.num_rows == rows
    assert sum(meta.row_group(i).num_rows for i in range(meta.num_row_groups)) == 10


@pytest.mark.parametrize("footer", [8, 12])
def test_a_footer_whose_row_count_is_not_its_row_groups_is_refused(
    tmp_path: Path, footer: int
) -> None:
    # Saying 8, the last 2 rows were left out without a word; saying 12, rows 10-11 failed
    # only when an epoch reached them.
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"v": list(range(10))}), path, row_group_size=4)
    _footer_says(path, footer)
    with pytest.raises(
        ShardError, match=rf"says it holds {footer} rows, but its row groups hold 10"
    ):
        ShardedDataset([path], ParquetReader())
    with pytest.raises(ShardError, match="the file is damaged"):
        ParquetReader().count(path)


def test_rows_with_other_keys_are_written_not_dropped(tmp_path: Path) -> None:
    # pyarrow's from_pylist takes row 0's keys: row 1's "label" was written nowhere.
    rows = [{"id": 0}, {"id": 1, "label": 7, "text": "b"}]
    (path,) = write_shards(tmp_path, [rows], ParquetReader(), progress=False)
    want = [{"id": 0, "label": None, "text": None}, {"id": 1, "label": 7, "text": "b"}]
    assert pq.read_table(path).to_pylist() == want
    ds = ShardedDataset(tmp_path, ParquetReader())
    assert ds[1]["label"].item() == 7 and ds[1]["text"] == "b"
    with pytest.raises(ShardError, match=r"column 'label' has 1 null value\(s\)"):
        ds[0]  # a missing number is refused by name, never read as some value
    # A later row lacking a key row 0 has (the two went the same way with from_pylist).
    fewer = [{"id": 0, "label": 1}, {"id": 1}]
    path = ParquetReader().write(tmp_path / "f.parquet", fewer)
    assert pq.read_table(path).to_pylist() == [{"id": 0, "label": 1}, {"id": 1, "label": None}]
    reordered = [{"id": 0, "label": 1}, {"label": 2, "id": 1}]  # columns in first-seen order
    path = ParquetReader().write(tmp_path / "r.parquet", reordered)
    assert pq.read_table(path).to_pylist() == [{"id": 0, "label": 1}, {"id": 1, "label": 2}]
    assert pq.read_table(path).column_names == ["id", "label"]
    with pytest.raises(TypeError, match=r"row 1 of 'x.parquet' is a list, not a dict"):
        ParquetReader().write(tmp_path / "x.parquet", [{"id": 0}, [1]])


def test_a_null_in_a_column_not_read_as_tensors_reads_as_none(tmp_path: Path) -> None:
    # Hunter 350: a list<string> or list<list<int>> row left out was written, then every batch
    # holding it was refused (only numbers and lists of numbers become tensors).
    rows: list[dict[str, Any]] = [{"tags": ["a"], "nested": [[1]], "y": i} for i in range(6)]
    rows[3] = {"y": 3}
    write_shards(tmp_path, [rows], ParquetReader(), progress=False)
    loader = ResumableDataLoader(
        ShardedDataset(tmp_path, ParquetReader()), batch_size=2, collate_fn=list
    )
    got = {int(s["y"]): (s["tags"], s["nested"]) for batch in loader for s in batch}
    assert got == {i: (None, None) if i == 3 else (["a"], [[1]]) for i in range(6)}


@pytest.mark.parametrize("wrap", ["subset", "concat"])
def test_a_mixed_source_split_by_torch_is_checked_as_the_source(tmp_path: Path, wrap: str) -> None:
    # Through a Subset (a train split) the check was skipped: ids 2**24 + 1.. came as float32.
    from torch.utils.data import ConcatDataset, Subset

    from loaderkit import MixedDataset

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    big = [2**24 + 1 + i for i in range(4)]
    pq.write_table(pa.table({"x": pa.array(big, pa.int64())}), tmp_path / "a" / "a.parquet")
    pq.write_table(pa.table({"x": pa.array([0.5] * 4, pa.float32())}), tmp_path / "b" / "b.parquet")
    a, b = (ShardedDataset(tmp_path / n, ParquetReader()) for n in "ab")
    part = Subset(a, range(3)) if wrap == "subset" else ConcatDataset([a])
    with pytest.raises(ShardError, match=r"field 'x' is torch.float32 in source 'b' but"):
        MixedDataset({"a": part, "b": b})


@pytest.mark.parametrize("columns", [None, ["input_ids", "id"]])
def test_an_empty_shard_write_shards_wrote_is_read_with_the_others(
    tmp_path: Path, columns: list[str] | None
) -> None:
    # write_shards writes [] as a file with no columns: its missing length_column refused a
    # token budget, and columns= refused the whole folder (hunter 181).
    rows = [{"input_ids": [7] * (1 + i % 5), "id": i} for i in range(10)]
    write_shards(tmp_path, [rows[:6], [], rows[6:]], ParquetReader(), progress=False)
    ds = ShardedDataset(tmp_path, ParquetReader(columns=columns, length_column="input_ids"))
    assert ds.sizes == (6, 0, 4)
    assert ds.lengths().tolist() == [len(r["input_ids"]) for r in rows]
    batches = list(ResumableDataLoader(ds, batch_sampler=ds.bucket_batch_sampler(max_tokens=16)))
    assert sorted(int(i) for b in batches for i in b["id"]) == list(range(10))


@pytest.mark.filterwarnings("ignore:ShardedDataset.on_error='skip'.:RuntimeWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("built", ["alone", "before-eval", "by-hand", "fixed-after"])
def test_a_skipped_row_takes_a_substitute_no_longer_than_it(
    tmp_path: Path, num_workers: int, built: str
) -> None:
    # Row 0 (1 token) does not read (a null in an int column): its place went to row 1 (60
    # tokens), 480 tokens under max_tokens=64. A flag the last bucket_batch_sampler() set on
    # the dataset left it out instead: undone by a later eval sampler, never set by a
    # BucketBatchSampler built by hand, and short batches for a fixed-size loader after one.
    ids = [[0], [1] * 60] + [[i] for i in range(2, 9)]
    y = pa.array([None, *range(1, 9)], pa.int64())
    pq.write_table(pa.table({"input_ids": ids, "y": y}), tmp_path / "a.parquet")
    ds = ShardedDataset(tmp_path, ParquetReader(length_column="input_ids"), on_error="skip")
    order = {"seed": 0, "shuffle": False, "world_size": 1, "rank": 0}
    if built == "by-hand":
        sampler: Any = BucketBatchSampler(ds.lengths(), max_tokens=64, **order)
    else:
        sampler = ds.bucket_batch_sampler(max_tokens=64, **order)
    if built == "before-eval":
        ds.bucket_batch_sampler(batch_size=4, **order)
    if built == "fixed-after":
        sampler = ds.batch_sampler(4, seed=0, shuffle=False, world_size=1, rank=0)
    pad = PadCollate(length_field="input_ids")
    loader = ResumableDataLoader(ds, batch_sampler=sampler, collate_fn=pad, num_workers=num_workers)
    batches = list(loader)
    if built == "fixed-after":
        assert [len(b["y"]) for b in batches] == [4, 4, 1]
    else:
        assert max(b["input_ids"].numel() for b in batches) <= 64
    # Row 2, the next row no longer than row 0, took its place.
    assert sorted(int(y) for b in batches for y in b["y"]) == [1, 2, 2, 3, 4, 5, 6, 7, 8]


@pytest.mark.filterwarnings("ignore:ShardedDataset.on_error='skip'.:RuntimeWarning")
@pytest.mark.parametrize("lists", [[[1], [2, 2], [3, 3, 3], [4]], [[1, 1], [2, 2], [3, 3], [4, 4]]])
def test_a_batch_with_a_skipped_row_comes_by_column(tmp_path: Path, lists: list[Any]) -> None:
    # It was default-collated from row dicts: uneven lists raised CollateError, even ones
    # came as one 2-D tensor where every other batch holds a list of 1-D tensors.
    y = pa.array([0, None, 2, 3], pa.int64())
    pq.write_table(
        pa.table({"ids": pa.array(lists, pa.list_(pa.int64())), "y": y}), tmp_path / "a.parquet"
    )
    ds = ShardedDataset(tmp_path, ParquetReader(), on_error="skip")
    first, second = ResumableDataLoader(ds, batch_size=2)
    assert first["y"].tolist() == [0, 2] and second["y"].tolist() == [2, 3]
    assert [t.tolist() for t in first["ids"]] == [lists[0], lists[2]]
    assert isinstance(first["ids"], list) and isinstance(second["ids"], list)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([["a"]], pa.array([["b"]], pa.list_(pa.field("item", pa.string(), nullable=False)))),
        (pa.array(["a"]).dictionary_encode(), ["b"]),
        (["a"], [None]),
        ([[1, 2]], pa.array([[]], pa.list_(pa.null()))),
        ([["a"]], pa.array([[]], pa.list_(pa.null()))),
    ],
    ids=["not-null-items", "dictionary", "nulls", "empty-int-lists", "empty-str-lists"],
)
def test_files_whose_columns_read_alike_are_read_together(tmp_path: Path, a: Any, b: Any) -> None:
    # They were refused by their type's text: item nullability, a dictionary, all nulls.
    for name, values in (("a", a), ("b", b)):
        pq.write_table(pa.table({"c": values}), tmp_path / f"{name}.parquet")
    expected = [
        row["c"] for f in ("a", "b") for row in pq.read_table(tmp_path / f"{f}.parquet").to_pylist()
    ]
    ds = ShardedDataset(tmp_path, ParquetReader())
    got = [ds[i]["c"] for i in range(len(ds))]
    assert [x.tolist() if isinstance(x, torch.Tensor) else x for x in got] == expected
    batch = ds.get_batch([0, 1])["c"]
    assert len(batch) == 2 and isinstance(batch, list)


def test_write_shards_casts_to_the_readers_schema(tmp_path: Path) -> None:
    # Each shard's types were inferred from its own rows: 'score' int64 in one, double in
    # the other, and the folder write_shards wrote was refused by ShardedDataset.
    shards = [[{"ids": [1, 2], "score": 1}], [{"ids": [3], "score": 0.5}]]
    with pytest.raises(ShardError, match=r"'score'.*ParquetReader\(schema=\.\.\.\)"):
        ShardedDataset(write_shards(tmp_path / "a", shards, ParquetReader()), ParquetReader())
    for shard in shards:
        shard[0]["note"] = None  # nulls in a column the schema types (no row has a note)
    typed = ParquetReader(schema={"score": "float64", "note": pa.string()})
    ds = ShardedDataset(write_shards(tmp_path / "b", shards, typed), ParquetReader())
    batch = ds.get_batch([0, 1])
    assert batch["score"].tolist() == [1.0, 0.5] and batch["note"] == [None, None]
    with pytest.raises(TypeError, match=r"schema must be a pyarrow\.Schema"):
        ParquetReader(schema=3)


def test_a_schema_cast_or_column_that_fails_is_named(tmp_path: Path) -> None:
    # A cast raised a bare ArrowInvalid.
    rows = [{"score": 1.0}, {"score": 1.5}]
    cast = r"cannot cast column 'score' of 'a\.parquet' to int64 \(.*truncated.*\); pass a schema="
    with pytest.raises(ValueError, match=cast):
        ParquetReader(schema={"score": "int64"}).write(tmp_path / "a.parquet", rows)
    # A string column a file's rows lack is nulls (review 232: refusing it refused a shard
    # without an optional label); a number column is refused (review 233: its nulls never
    # read back), as a misspelt name is.
    ParquetReader(schema={"label": "string"}).write(tmp_path / "b.parquet", rows)
    assert pq.read_table(tmp_path / "b.parquet").column("label").to_pylist() == [None, None]
    typo = r"names double column 'scroe', which no row of 'c\.parquet' has"
    with pytest.raises(ValueError, match=typo):
        ParquetReader(schema={"scroe": "float64"}).write(tmp_path / "c.parquet", rows)
    pa = pytest.importorskip("pyarrow")
    with pytest.raises(ValueError, match=r"names fixed_size_list.* column 'emb'"):
        ParquetReader(schema={"emb": pa.list_(pa.float32(), 4)}).write(tmp_path / "d.parquet", rows)


@pytest.mark.parametrize(
    ("schema", "value"),
    [("float16", 2049), ("float16", 70000.0), ("float32", 1e40), ("bool", 2)],
)
def test_a_schema_type_that_would_change_a_value_is_refused(
    tmp_path: Path, schema: str, value: object
) -> None:
    # Hunter 328: Arrow's checked cast wrote 2049 as 2048, 70000 and 1e40 as inf, 2 as True.
    rows = [{"x": 1}, {"x": value}]
    held = rf"cannot hold value {re.escape(repr(value))} of column 'x' in 'a\.parquet' as \w+ "
    with pytest.raises(ValueError, match=held + r"\(it would change\)"):
        ParquetReader(schema={"x": schema}).write(tmp_path / "a.parquet", rows)
    listed = ParquetReader(schema={"x": pa.list_(pa.type_for_alias(schema))})
    with pytest.raises(ValueError, match="it would change"):
        listed.write(tmp_path / "b.parquet", [{"x": [1, value]}])
    # Rounding a float to a narrower float is what the type means: written.
    ParquetReader(schema={"x": "float32"}).write(tmp_path / "c.parquet", [{"x": 0.1}])


def test_a_skipped_row_shorter_than_every_other_takes_its_shards_shortest(tmp_path: Path) -> None:
    # Review 232: no readable row was as short as the skipped one, so the next readable row
    # of any length (12 tokens) took its place: 48 padded tokens under max_tokens=20.
    pa = pytest.importorskip("pyarrow")
    ids = [[0], [1] * 12] + [[i] * 4 for i in range(2, 10)]
    y = pa.array([None, *range(1, 10)], pa.int64())  # row 0 does not read: null in an int column
    pq.write_table(pa.table({"input_ids": ids, "y": y}), tmp_path / "a.parquet")
    ds = ShardedDataset(tmp_path, ParquetReader(length_column="input_ids"), on_error="skip")
    sampler = ds.bucket_batch_sampler(max_tokens=20, seed=0, shuffle=False, world_size=1, rank=0)
    collate = PadCollate(length_field="input_ids")
    with pytest.warns(RuntimeWarning, match="skipped 1 sample"):
        loader = ResumableDataLoader(ds, batch_sampler=sampler, collate_fn=collate)
        assert max(b["input_ids"].numel() for b in loader) <= 20


def test_every_batch_keeps_the_first_files_column_order(tmp_path: Path) -> None:
    # Hunter 264: keys followed each file's own column order, so a batch unpacked by
    # position (x, y = batch.values()) swapped them from one file to the next.
    pq.write_table(pa.table({"x": [1.0, 2.0], "y": [0, 1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"y": [2, 3], "x": [3.0, 4.0]}), tmp_path / "b.parquet")
    ds = ShardedDataset(tmp_path, ParquetReader())
    assert [list(ds[i]) for i in range(4)] == [["x", "y"]] * 4
    batch = ds.get_batch([3, 2])
    assert list(batch) == ["x", "y"] and batch["x"].tolist() == [4.0, 3.0]


def test_a_dataframes_named_index_is_written_as_a_column(tmp_path: Path) -> None:
    # Hunter 264: preserve_index=False dropped it (pandas' own to_parquet keeps it).
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"doc_id": [101, 205], "label": [0, 1]}).set_index("doc_id")
    write_shards(tmp_path, [frame, frame[frame["label"] > 0]], ParquetReader(), progress=False)
    ds = ShardedDataset(tmp_path, ParquetReader())
    assert [(int(ds[i]["doc_id"]), int(ds[i]["label"])) for i in range(3)] == [
        (101, 0), (205, 1), (205, 1)
    ]  # fmt: skip
    unnamed = pd.DataFrame({"label": [0, 1, 2]})
    write_shards(tmp_path / "u", [unnamed[unnamed["label"] > 0]], ParquetReader(), progress=False)
    assert list(ShardedDataset(tmp_path / "u", ParquetReader())[0]) == ["label"]  # filtered


def test_a_failed_batch_read_names_the_sample_that_fails(tmp_path: Path) -> None:
    # Hunter 264: the batch's first sample was named, not the one holding the null.
    pq.write_table(pa.table({"label": [0, 1, None, 3]}), tmp_path / "a.parquet")
    ds = ShardedDataset(tmp_path, ParquetReader())
    with pytest.raises(ShardError, match=r"reading sample 2 of shard .*a\.parquet.*null"):
        ds.get_batch([0, 1, 2, 3])


def test_a_dotted_column_name_is_read_as_that_column_not_a_struct_field(tmp_path: Path) -> None:
    # Hunter 328: pyarrow's columns=["a.b"] also selects field b of a struct column "a", so
    # rows gained a column not asked for, and lengths were taken from the struct.
    table = pa.table(
        {"a": pa.array([{"b": [7] * 9}] * 4), "a.b": pa.array([[1] * (i + 1) for i in range(4)])}
    )
    pq.write_table(table, tmp_path / "x.parquet")
    ds = ShardedDataset(tmp_path, ParquetReader(columns=["a.b"], length_column="a.b"))
    assert {k: v.tolist() for k, v in ds[2].items()} == {"a.b": [1, 1, 1]}
    assert ds.lengths().tolist() == [1, 2, 3, 4]


def test_rows_of_no_one_type_or_a_doubled_column_are_named(tmp_path: Path) -> None:
    # Hunter 328: pyarrow's bare ArrowTypeError / OverflowError named no column or shard, and
    # a file with a column twice was a KeyError saying the column did not exist.
    mixed = r"column 'label' of 'a\.parquet' holds values of no one Arrow type .*schema="
    with pytest.raises(TypeError, match=mixed):
        ParquetReader().write(tmp_path / "a.parquet", [{"label": 1}, {"label": "one"}])
    with pytest.raises(TypeError, match=r"column 'h' of 'b\.parquet' holds values of no one"):
        ParquetReader().write(tmp_path / "b.parquet", [{"h": 2**63 + 5}])
    with pytest.raises(TypeError, match=r"column 't' of 'e\.parquet' .*str beside bytes"):
        ParquetReader().write(tmp_path / "e.parquet", [{"t": "a"}, {"t": b"b"}])  # "a" -> b"a"
    ParquetReader(schema={"t": "binary"}).write(tmp_path / "f.parquet", [{"t": "a"}, {"t": b"b"}])
    for nested in ([{"t": ["a"]}, {"t": [b"b"]}], [{"t": {"s": "a"}}, {"t": {"s": b"b"}}]):
        with pytest.raises(
            TypeError, match=r"column 't' .*str beside bytes.*schema=\{'t': 'string'"
        ):
            ParquetReader().write(tmp_path / "g.parquet", nested)  # review 335: [b"a"], {"s": b"a"}
    pd = pytest.importorskip("pandas")  # review 339: a Series' dtype was lost (float64, int64)
    typed = {"x": pd.Series([0.5, 1.5], dtype="float32"), "n": pd.Series([1, None], dtype="Int8")}
    ParquetReader().write(tmp_path / "i.parquet", typed)
    assert [f.type for f in pq.read_schema(tmp_path / "i.parquet")] == [pa.float32(), pa.int8()]
    for given in (["a", b"b"], ("a", b"b"), np.array(["a", b"b"], dtype=object)):  # review 338
        with pytest.raises(TypeError, match=r"column 't' of 'h\.parquet' .*str beside bytes"):
            ParquetReader().write(tmp_path / "h.parquet", {"t": given})  # a dict of columns
    typed = ParquetReader(schema={"h": "uint64"})  # beyond int64, named: written exactly
    typed.write(tmp_path / "c.parquet", [{"h": 2**63 + 5}, {"h": 1}])
    assert pq.read_table(tmp_path / "c.parquet").column("h").to_pylist() == [2**63 + 5, 1]
    doubled = pa.Table.from_arrays([pa.array([1, 2]), pa.array(["a", "b"])], names=["x", "x"])
    (tmp_path / "d").mkdir()
    pq.write_table(doubled, tmp_path / "d" / "d.parquet")
    with pytest.raises(ShardError, match=r"d\.parquet' has column\(s\) \['x'\] twice"):
        ShardedDataset(tmp_path / "d", ParquetReader())
