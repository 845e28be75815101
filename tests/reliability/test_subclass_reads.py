"""A subclass's reads are never bypassed by a faster path (hunter 279)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import (
    ArrayDataset,
    ResumableDataLoader,
    SequenceDataModule,
    ShardedDataset,
    TensorDataset,
    TokenReader,
    write_shards,
)


def _shards(tmp_path: Path) -> list[Any]:
    data = [np.repeat(np.arange(0, 3), 2).astype(np.uint16), np.repeat(np.arange(3, 6), 2)]
    return write_shards(
        tmp_path, [d.astype(np.uint16) for d in data], TokenReader(2), progress=False
    )


class _Jitter:
    """An augmentation mixin in front of loaderkit's class."""

    def __getitem__(self, i: int) -> Any:
        return super().__getitem__(i) + torch.rand(())  # type: ignore[misc]


class _Jittered(_Jitter, ShardedDataset):
    pass


def test_an_augmenting_mixin_beside_sharded_dataset_is_read_per_sample(tmp_path: Path) -> None:
    # Refused: "__getitems__ draws from a global RNG while reading a batch".
    data = _Jittered(_shards(tmp_path), TokenReader(2))
    first = next(iter(ResumableDataLoader(data, batch_size=3, seed=0))).tolist()
    again = next(iter(ResumableDataLoader(data, batch_size=3, seed=0, num_workers=2))).tolist()
    assert first == again
    assert [int(x[0]) for x in first] == [0, 1, 2]


def test_array_and_tensor_subclasses_that_index_otherwise_are_refused() -> None:
    # get_batch gave other values than __getitem__: a matrix's rows, a masked value.
    with pytest.raises(TypeError, match=r"ArrayDataset: argument 0 is a matrix.*np.asarray"):
        ArrayDataset(np.asmatrix(np.arange(6).reshape(3, 2)))
    with pytest.raises(TypeError, match=r"argument 0 is a MaskedArray.*a.filled"):
        ArrayDataset(np.ma.masked_array(np.arange(3.0), mask=[0, 1, 0]))

    class Scaled(torch.Tensor):
        def __getitem__(self, index: Any) -> Any:
            return super().__getitem__(index) * 10

    with pytest.raises(TypeError, match=r"argument 0 is a Scaled with its own __getitem__"):
        TensorDataset(torch.arange(3.0).as_subclass(Scaled))


class _Framed(list):  # type: ignore[type-arg]
    """Token lists framed by a start and an end token as they are read."""

    def __getitem__(self, i: Any) -> Any:
        return [0, *super().__getitem__(i), 0]


def test_sequence_lengths_are_measured_through_a_list_subclass() -> None:
    # Measured by list iteration (without the frame): batches of 20 tokens for max_tokens=16.
    samples = _Framed([list(range(6))] * 4 + [list(range(4))] * 4)
    dm = SequenceDataModule(samples, max_tokens=16, batch_size=8, shuffle=False)
    dm.setup("fit")
    for batch in dm.train_dataloader():
        ids = batch["input_ids"] if isinstance(batch, dict) else batch[0]
        assert ids.numel() <= 16


class _Logged(ShardedDataset):
    def __getitems__(self, indices: list[int]) -> list[Any]:  # a pass-through (logging)
        return super().__getitems__(indices)


class _Scaled(_Logged):
    def __getitem__(self, i: int) -> Any:
        return super().__getitem__(i) * 10


def test_a_getitem_below_a_pass_through_getitems_is_kept(tmp_path: Path) -> None:
    # Review 282: the nearer of __getitems__ and __getitem__ decides, as before.
    data = _Scaled(_shards(tmp_path), TokenReader(2))
    assert [s.tolist() for s in data.__getitems__([1])] == [data[1].tolist()] == [[10, 10]]
    got = next(iter(ResumableDataLoader(data, batch_size=2, num_workers=0)))
    assert got.tolist() == [[0, 0], [10, 10]]


def test_a_plain_recarray_is_an_array() -> None:
    rows = ArrayDataset(np.arange(6.0).reshape(3, 2).view(np.recarray))
    assert rows.get_batch([1])[0].tolist() == [[2.0, 3.0]] == [rows[1][0].tolist()]


class _Reversed(list):  # type: ignore[type-arg]
    """Iterates backwards; indexes as a list."""

    def __iter__(self) -> Any:
        return reversed(list(super().__iter__()))


def test_sequence_lengths_follow_indices_not_a_list_subclass_iter() -> None:
    # Review 283: measured by iter(samples), each index got another sample's length.
    samples = _Reversed([[1]] * 3 + [list(range(9))] * 3)
    dm = SequenceDataModule(samples, max_tokens=9, batch_size=8, shuffle=False)
    dm.setup("fit")
    for batch in dm.train_dataloader():
        ids = batch["input_ids"] if isinstance(batch, dict) else batch[0]
        assert ids.numel() <= 9
