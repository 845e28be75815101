"""TensorDataset, ArrayDataset: ``get_batch`` equals per-item indexing; bad inputs are named."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from loaderkit import ArrayDataset, TensorDataset

INDEX_FORMS = {
    "list": lambda idx: list(idx),
    "numpy": lambda idx: np.asarray(idx, dtype=np.int64),
    "numpy-int32": lambda idx: np.asarray(idx, dtype=np.int32),
    "tensor": lambda idx: torch.as_tensor(idx),
}
INDICES = [7, 0, 3, 3, 9]


def per_item(ds: TensorDataset | ArrayDataset, indices: list[int]) -> tuple[torch.Tensor, ...]:
    return tuple(default_collate([ds[i] for i in indices]))


def assert_same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        assert torch.equal(g, w)


@pytest.mark.parametrize("form", INDEX_FORMS)
def test_tensor_dataset_get_batch_equals_per_item(form: str) -> None:
    x = torch.randn(10, 3, 2, generator=torch.Generator().manual_seed(0))
    y = torch.arange(10)
    ds = TensorDataset(x, y)
    assert len(ds) == 10
    assert_same(ds[4], (x[4], y[4]))
    got = ds.get_batch(INDEX_FORMS[form](INDICES))
    assert_same(got, per_item(ds, INDICES))
    assert_same(got, (x[INDICES], y[INDICES]))


@pytest.mark.parametrize("form", INDEX_FORMS)
def test_array_dataset_get_batch_equals_per_item(form: str) -> None:
    x = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    y = np.arange(10, dtype=np.int64)
    ds = ArrayDataset(x, y)
    assert len(ds) == 10
    got = ds.get_batch(INDEX_FORMS[form](INDICES))
    assert_same(got, per_item(ds, INDICES))
    assert_same(got, (torch.from_numpy(x[INDICES]), torch.from_numpy(y[INDICES])))


def test_array_dataset_reads_a_read_only_memmap(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    data = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(50, 8))
    data[:] = np.arange(400, dtype=np.float32).reshape(50, 8)
    data.flush()
    del data
    raw = np.memmap(tmp_path / "y.bin", dtype=np.int16, mode="w+", shape=(50,))
    raw[:] = np.arange(50, dtype=np.int16)[::-1]
    raw.flush()
    del raw
    x = np.load(path, mmap_mode="r")
    y = np.memmap(tmp_path / "y.bin", dtype=np.int16, mode="r", shape=(50,))
    ds = ArrayDataset(x, y)
    idx = [49, 0, 17, 17]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's "non-writable array" warning
        batch = ds.get_batch(np.asarray(idx))
        items = per_item(ds, idx)
        row, _ = ds[3]
    assert_same(batch, items)
    assert torch.equal(batch[0], torch.arange(400, dtype=torch.float32).view(50, 8)[idx])
    assert batch[1].tolist() == [0, 49, 32, 32]
    assert batch[1].dtype == torch.int16
    # Samples are copies: an in-place transform must not write into the (read-only) file.
    assert not np.shares_memory(row.numpy(), x)
    assert row.numpy().flags.writeable


def test_per_item_samples_do_not_alias_the_arrays() -> None:
    x = np.zeros((4, 2), dtype=np.float32)
    ds = ArrayDataset(x)
    (row,) = ds[1]
    row.add_(1)
    assert x.sum() == 0
    (batch,) = ds.get_batch([0, 1])
    batch.add_(1)
    assert x.sum() == 0
    t = torch.zeros(4, 2)  # hunter 336: a TensorDataset row was a view, rewritten by an in-place
    (row,) = TensorDataset(t)[1]  # step with num_workers=0 (a worker's copy was not)
    row.add_(1)
    assert t.sum() == 0


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda: TensorDataset(torch.zeros(3), torch.zeros(4)),
            ValueError,
            r"TensorDataset: all inputs must have the same first dimension, got sizes \[3, 4\]",
        ),
        (
            lambda: ArrayDataset(np.zeros(3), np.zeros((5, 2))),
            ValueError,
            r"ArrayDataset: all inputs must have the same first dimension, got sizes \[3, 5\]",
        ),
        (lambda: TensorDataset(), ValueError, r"TensorDataset: pass at least one tensor"),
        (lambda: ArrayDataset(), ValueError, r"ArrayDataset: pass at least one array"),
        (
            lambda: TensorDataset(torch.zeros(3), np.zeros(3)),
            TypeError,
            r"argument 1 must be a torch.Tensor, got ndarray; use ArrayDataset",
        ),
        (
            lambda: ArrayDataset(torch.zeros(3)),
            TypeError,
            r"argument 0 must be a numpy array, got Tensor; use TensorDataset",
        ),
        (lambda: ArrayDataset([1, 2, 3]), TypeError, r"argument 0 must be a numpy array"),
        (lambda: TensorDataset(torch.tensor(1.0)), ValueError, r"argument 0 is a 0-d tensor"),
        (lambda: ArrayDataset(np.array(1.0)), ValueError, r"argument 0 is a 0-d array"),
        (
            lambda: ArrayDataset(np.arange(3), np.array(["a", "b", "c"])),
            TypeError,
            r"argument 1 has dtype <U1, which torch cannot hold",
        ),
        (  # a big-endian memmap: torch's own error named no argument and no fix (hunter 301)
            lambda: ArrayDataset(np.arange(8, dtype=">f4").reshape(4, 2)),
            TypeError,
            r"argument 0 has byte order '>', not the machine's; pass a.astype",
        ),
    ],
)
def test_bad_inputs_are_named(make: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()  # type: ignore[operator]
