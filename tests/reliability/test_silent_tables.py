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
from pathlib import Path
from typing import Any

import pytest
import torch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from loaderkit import (  # noqa: E402
    HFDataset,
    ParquetReader,
    ResumableDataLoader,
    ShardedDataset,
    ShardError,
)


def _files(tmp_path: Path, *columns: Any) -> list[Path]:
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
    ds = ShardedDataset(paths, ParquetReader())
    loader = ResumableDataLoader(
        ds, batch_sampler=ds.batch_sampler(2, seed=0), num_workers=num_workers
    )
    with pytest.raises(
        ShardError,
        match=r"column 'y' is (string|int64) in '.*part[01]\.parquet' but (int64|string) in "
        r"'.*part[01]\.parquet', and no type holds the values of both exactly; write every "
        r"file with one type for 'y'",
    ):
        for _ in loader:
            pass


def test_int64_next_to_float64_is_refused_not_rounded(tmp_path: Path) -> None:
    big = 2**53 + 1
    paths = _files(tmp_path, pa.array([big, 1, 2], pa.int64()), pa.array([0.5, 1.5, 2.5]))
    ds = ShardedDataset(paths, ParquetReader())
    assert ds.get_batch([0])["y"].tolist() == [big]
    with pytest.raises(ShardError, match=r"column 'y' is double in .*part1.* but int64 in"):
        ds.get_batch([0, 3])


def test_types_that_one_dtype_holds_exactly_are_promoted(tmp_path: Path) -> None:
    paths = _files(
        tmp_path,
        pa.array([2**31 - 1, 1, 2], pa.int32()),
        pa.array([0.5, 1.5, 2.5], pa.float64()),
    )
    y = ShardedDataset(paths, ParquetReader()).get_batch([0, 3])["y"]
    assert y.dtype == torch.float64 and y.tolist() == [2**31 - 1, 0.5]


def test_files_with_other_columns_are_refused_when_all_columns_are_read(tmp_path: Path) -> None:
    # On 84cc6ec a batch from part0 had columns {id, y}, one from part1 {id, z}.
    a, b = tmp_path / "part0.parquet", tmp_path / "part1.parquet"
    pq.write_table(pa.table({"id": [0, 1], "y": [1, 2]}), a)
    pq.write_table(pa.table({"id": [2, 3], "z": [1, 2]}), b)
    ds = ShardedDataset([a, b], ParquetReader())
    assert set(ds.get_batch([0])) == {"id", "y"}
    with pytest.raises(
        ShardError,
        match=r"part1\.parquet' has columns \['id', 'z'\] but '.*part0\.parquet' has \['id', "
        r"'y'\], so batches would differ in their columns; pass columns= that every file has",
    ):
        ds.get_batch([2])
    assert ShardedDataset([a, b], ParquetReader(["id"])).get_batch([0, 2])["id"].tolist() == [0, 2]


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
