"""Silent edges of table sources: Parquet column types across files, HF feature decoding.

On 84cc6ec, a Parquet column typed int64 in one file and string in another
gave batches whose column was a tensor in one batch and a list in the next;
int64 next to float64 was merged into float64, so 2**53 + 1 came back as
2**53; files with other columns gave batches with other keys; and HFDataset
returned an ``Image`` column as undecoded ``{'bytes', 'path'}`` dicts where
``datasets`` gives PIL images.
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Subset, random_split

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from loaderkit import (  # noqa: E402
    HFDataset,
    ParquetReader,
    RemoteCache,
    ResumableDataLoader,
    ShardedDataset,
    ShardError,
    StreamingShardedDataset,
    write_shards,
)


def _files(tmp_path: Path, *columns: Any) -> list[Path]:
    tmp_path.mkdir(exist_ok=True)
    paths = []
    for i, col in enumerate(columns):
        path = tmp_path / f"part{i}.parquet"
        pq.write_table(pa.table({"id": pa.array(range(3 * i, 3 * i + 3)), "y": col}), path)
        paths.append(path)
    return paths


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_int_column_that_is_a_string_in_another_file_is_refused(
    tmp_path: Path, num_workers: int
) -> None:
    paths = _files(tmp_path, pa.array([1, 2, 3]), pa.array(["a", "b", "c"]))
    with pytest.raises(
        ShardError,
        match=r"column 'y' is string in '.*part1\.parquet' but int64 in '.*part0\.parquet', and "
        r"no type holds the values of both exactly; write every file with one type for 'y'",
    ):
        ds = ShardedDataset(paths, ParquetReader())
        loader = ResumableDataLoader(
            ds, batch_sampler=ds.batch_sampler(2, seed=0), num_workers=num_workers
        )
        for _ in loader:
            pass


def test_int64_next_to_float64_is_refused_not_rounded(tmp_path: Path) -> None:
    big = 2**53 + 1
    paths = _files(tmp_path, pa.array([big, 1, 2], pa.int64()), pa.array([0.5, 1.5, 2.5]))
    with pytest.raises(ShardError, match=r"column 'y' is double in .*part1.* but int64 in"):
        ShardedDataset(paths, ParquetReader())
    assert ShardedDataset(paths[:1], ParquetReader()).get_batch([0])["y"].tolist() == [big]


def test_types_that_one_dtype_holds_exactly_are_promoted(tmp_path: Path) -> None:
    paths = _files(
        tmp_path,
        pa.array([2**31 - 1, 1, 2], pa.int32()),
        pa.array([0.5, 1.5, 2.5], pa.float64()),
    )
    ds = ShardedDataset(paths, ParquetReader())
    y = ds.get_batch([0, 3])["y"]
    assert y.dtype == torch.float64 and y.tolist() == [2**31 - 1, 0.5]
    # A batch inside the int32 file has the merged dtype too.
    assert ds.get_batch([0, 1])["y"].dtype == torch.float64


def test_files_with_other_columns_are_refused_when_all_columns_are_read(tmp_path: Path) -> None:
    # On 84cc6ec a batch from part0 had columns {id, y}, one from part1 {id, z}.
    a, b = tmp_path / "part0.parquet", tmp_path / "part1.parquet"
    pq.write_table(pa.table({"id": [0, 1], "y": [1, 2]}), a)
    pq.write_table(pa.table({"id": [2, 3], "z": [1, 2]}), b)
    with pytest.raises(
        ShardError,
        match=r"part1\.parquet' has columns \['id', 'z'\] but '.*part0\.parquet' has \['id', "
        r"'y'\], so batches would differ in their columns; pass columns= that every file has",
    ):
        ShardedDataset([a, b], ParquetReader())
    assert ShardedDataset([a, b], ParquetReader(["id"])).get_batch([0, 2])["id"].tolist() == [0, 2]
    with pytest.raises(ShardError, match=r"part1\.parquet' has no column\(s\) \['y'\]"):
        ShardedDataset([a, b], ParquetReader(["y"]))


# ---------------------------------------------- every file checked before any batch
# Four files of four rows, column ``y`` typed a, b, a, b. With batches of 4, no shuffling
# and one shard at a time, worker 0 reads files 0 and 2 and worker 1 files 1 and 3: before
# the dataset decided the types from all its files, each worker saw one type only.
KINDS = ["sharded", "streaming", "sharded-url", "streaming-url"]


def _alternating(tmp_path: Path, even: Any, odd: Any) -> list[Path]:
    """The four files, ``y`` typed ``even``/``odd`` in turn; ``y`` is ``id`` (``s<id>`` as a
    string)."""
    paths = []
    for i in range(4):
        ids = list(range(4 * i, 4 * i + 4))
        kind = even if i % 2 == 0 else odd
        y = pa.array([f"s{v}" for v in ids] if kind == pa.string() else ids, kind)
        path = tmp_path / f"part{i}.parquet"
        pq.write_table(pa.table({"id": pa.array(ids), "y": y}), path)
        paths.append(path)
    return paths


def _loader(kind: str, paths: list[Path], tmp_path: Path) -> ResumableDataLoader:
    shards: Any = paths
    remote = None
    if kind.endswith("-url"):
        fsspec = pytest.importorskip("fsspec")
        shards = f"memory://silent-tables-{uuid.uuid4().hex[:8]}"
        for path in paths:
            fsspec.filesystem("memory").pipe_file(f"{shards}/{path.name}", path.read_bytes())
        remote = RemoteCache(cache_dir=tmp_path / "cache")
    if kind.startswith("streaming"):
        stream = StreamingShardedDataset(
            shards, ParquetReader(), shuffle_shards=False, mix_shards=1, remote=remote
        )
        return ResumableDataLoader(stream, batch_size=4, num_workers=2)
    ds = ShardedDataset(shards, ParquetReader(), remote=remote)
    return ResumableDataLoader(
        ds, batch_sampler=ds.batch_sampler(4, shuffle=False, mix_shards=1), num_workers=2
    )


@pytest.mark.parametrize("kind", KINDS)
def test_int_and_string_files_read_by_different_workers_are_refused_before_any_batch(
    tmp_path: Path, kind: str
) -> None:
    # On 84cc6ec, and with the per-process check, batches alternated tensor / list.
    paths = _alternating(tmp_path, pa.int64(), pa.string())
    batches: list[Any] = []
    with pytest.raises(
        ShardError,
        match=r"column 'y' is string in '.*part1\.parquet' but int64 in '.*part0\.parquet', and "
        r"no type holds the values of both exactly",
    ):
        batches.extend(_loader(kind, paths, tmp_path))
    assert batches == []


@pytest.mark.parametrize("kind", KINDS)
def test_the_merged_dtype_is_the_same_in_every_batch_with_two_workers(
    tmp_path: Path, kind: str
) -> None:
    # On 84cc6ec the batches of the int32 files were int32, those of the int64 files int64.
    paths = _alternating(tmp_path, pa.int32(), pa.int64())
    batches = list(_loader(kind, paths, tmp_path))
    assert len(batches) == 4
    assert [b["y"].dtype for b in batches] == [torch.int64] * 4
    assert sorted(int(v) for b in batches for v in b["y"]) == list(range(16))
    assert all(torch.equal(b["id"], b["y"]) for b in batches)


@pytest.mark.parametrize("where", ["local", "url"])
def test_compressed_files_are_checked_too(tmp_path: Path, where: str) -> None:
    # A .parquet.zst has no footer to range-read: its decoded copy's footer is read.
    tables = [pa.table({"y": pa.array([1, 2])}), pa.table({"y": pa.array(["a", "b"])})]
    reader = ParquetReader()
    folder: Any = tmp_path / "zst"
    remote = None
    if where == "url":
        pytest.importorskip("fsspec")
        folder = f"memory://silent-tables-{uuid.uuid4().hex[:8]}"
        remote = RemoteCache(cache_dir=tmp_path / "cache")
    write_shards(folder, tables, reader, compression="zstd", progress=False)
    with pytest.raises(
        ShardError,
        match=r"column 'y' is string in '.*shard-00001\.parquet\.zst' but int64 in "
        r"'.*shard-00000\.parquet\.zst'",
    ):
        ShardedDataset(folder, reader, remote=remote)


def test_one_reader_serves_datasets_of_other_types(tmp_path: Path) -> None:
    # Each dataset decides its types from its own files, not from what the shared reader
    # (or this process) saw before.
    ints = _files(tmp_path / "ints", pa.array([1, 2, 3]))
    strings = _files(tmp_path / "strings", pa.array(["a", "b", "c"]))
    reader = ParquetReader()
    a, b = ShardedDataset(ints, reader), ShardedDataset(strings, reader)
    assert a.get_batch([0, 2])["y"].tolist() == [1, 3]
    assert b.get_batch([0, 2])["y"] == ["a", "c"]
    assert a[1]["y"].dtype == torch.int64


def test_a_file_widened_after_the_dataset_was_built_is_refused(tmp_path: Path) -> None:
    # The stream checks each local shard against its listing (size, mtime) before reading.
    paths = _alternating(tmp_path, pa.int32(), pa.int32())
    stream = StreamingShardedDataset(paths, ParquetReader(), shuffle_shards=False, mix_shards=1)
    pq.write_table(pa.table({"id": pa.array(range(4, 8)), "y": pa.array([0.5] * 4)}), paths[1])
    with pytest.raises(
        ShardError, match=r"shard .*part1\.parquet.* changed after the dataset listed it"
    ):
        list(ResumableDataLoader(stream, batch_size=4))


def test_hf_image_column_is_decoded_as_the_features_say() -> None:
    datasets = pytest.importorskip("datasets")
    pil = pytest.importorskip("PIL.Image")
    images = []
    for value in (10, 200):
        buf = io.BytesIO()
        pil.new("L", (3, 2), color=value).save(buf, format="PNG")
        images.append({"bytes": buf.getvalue(), "path": None})
    features = datasets.Features({"img": datasets.Image(), "y": datasets.Value("int64")})
    hf = datasets.Dataset.from_dict({"img": images, "y": [0, 1]}, features=features)
    ds = HFDataset(hf)
    row = ds[1]
    assert isinstance(row["img"], pil.Image), type(row["img"])
    assert row["img"].size == (3, 2) and row["img"].getpixel((0, 0)) == 200
    assert list(row["img"].getdata()) == list(hf[1]["img"].getdata())  # as datasets gives it
    batch = ds.get_batch([1, 0])
    assert [im.getpixel((0, 0)) for im in batch["img"]] == [200, 10]
    assert batch["y"].tolist() == [1, 0]
    loader = ResumableDataLoader(ds, batch_size=2, collate_fn=lambda rows: rows)
    assert all(isinstance(r["img"], pil.Image) for batch in loader for r in batch)
    # Image(decode=False) is the user's choice of the raw dicts.
    raw = HFDataset(hf.cast_column("img", datasets.Image(decode=False)))
    assert set(raw[0]["img"]) == {"bytes", "path"}


def test_a_refused_type_names_its_file_and_the_merged_type_of_the_files_before(
    tmp_path: Path,
) -> None:
    # float32 and int32 merge into float64; int64 conflicts with that merge, not with int32
    # (which int64 holds): on the merge of i22 the message blamed int64 against int32.
    paths = _files(tmp_path, pa.array([1, 2, 3], pa.float32()), pa.array([1, 2, 3], pa.int32()))
    paths += _files(tmp_path / "more", pa.array([1, 2, 3], pa.int64()))
    with pytest.raises(
        ShardError,
        match=r"column 'y' is int64 in '.*more/part0\.parquet' but float64 in the files before "
        r"it \(merged from float in '.*/part0\.parquet', int32 in '.*/part1\.parquet'\), and no "
        r"type holds the values of both exactly; write every file with one type for 'y'",
    ):
        ShardedDataset(paths, ParquetReader())


def test_a_subset_of_an_hf_dataset_subclass_reads_through_its_getitem() -> None:
    datasets = pytest.importorskip("datasets")

    class Masked(HFDataset):
        def __getitem__(self, index: int) -> dict[str, Any]:
            return {**super().__getitem__(index), "y": -1}

    ds = Masked(datasets.Dataset.from_dict({"y": list(range(8))}))
    for wrapped in (Subset(ds, [1, 5, 6]), random_split(ds, [0.5, 0.5])[0]):
        batches = list(ResumableDataLoader(wrapped, batch_size=2, seed=0))
        assert [int(y) for b in batches for y in b["y"]] == [-1] * len(wrapped)
    assert [row["y"] for row in ds.__getitems__([3, 0])] == [-1, -1]


def test_fixed_size_and_variable_lists_across_files_are_refused_with_that_reason(
    tmp_path: Path,
) -> None:
    # Hunter 289: the refusal said "no type holds the values of both exactly", untrue here.
    pq.write_table(pa.table({"v": pa.array([[1, 2]], pa.list_(pa.int64(), 2))}), tmp_path / "a.pq")
    pq.write_table(pa.table({"v": pa.array([[1, 2, 3]], pa.list_(pa.int64()))}), tmp_path / "b.pq")
    with pytest.raises(ShardError, match=r"does not merge fixed-size lists with lists of another"):
        ds = ShardedDataset([tmp_path / "a.pq", tmp_path / "b.pq"], ParquetReader())
        [ds[i] for i in range(len(ds))]
