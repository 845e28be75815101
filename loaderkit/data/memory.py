"""In-memory map-style datasets that fetch a whole batch in one indexing call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["ArrayDataset", "TensorDataset"]


def _index_tensor(indices: Any) -> torch.Tensor:
    # The loader passes writable int64 arrays: wrapping one is cheaper than a copy.
    flat = type(indices) is np.ndarray and indices.dtype == np.int64 and indices.ndim == 1
    if flat and indices.flags.writeable:
        return torch.from_numpy(indices)
    return torch.as_tensor(indices, dtype=torch.long)


def _check_rows(owner: str, i: int, value: Any, kind: type[Any], names: tuple[str, ...]) -> None:
    """Refuse argument ``i`` unless it is a ``kind`` with a first dimension."""
    what, other, noun, reshape = names
    if not isinstance(value, kind):
        raise TypeError(
            f"{owner}: argument {i} must be {what}, got {type(value).__name__}; use {other}."
        )
    if value.ndim == 0:
        raise ValueError(
            f"{owner}: argument {i} is a 0-d {noun}; rows need a first dimension, e.g. pass "
            f"{reshape}."
        )


def _common_length(kind: str, lengths: Sequence[int]) -> int:
    if not lengths:
        raise ValueError(f"{kind}: pass at least one {kind.removesuffix('Dataset').lower()}.")
    if len(set(lengths)) != 1:
        raise ValueError(
            f"{kind}: all inputs must have the same first dimension, got sizes "
            f"{list(lengths)}; slice them to a common length."
        )
    return lengths[0]


class TensorDataset(Dataset[tuple[torch.Tensor, ...]]):
    """Rows of one or more tensors that share their first dimension.

    Args:
        *tensors: Tensors with equal ``size(0)``.

    Example:
        >>> ds = TensorDataset(torch.arange(6).view(3, 2), torch.tensor([0, 1, 0]))
        >>> ds[1]
        (tensor([2, 3]), tensor(1))
        >>> ds.get_batch(torch.tensor([2, 0]))
        (tensor([[4, 5],
                [0, 1]]), tensor([0, 0]))
    """

    def __init__(self, *tensors: torch.Tensor) -> None:
        for i, t in enumerate(tensors):
            names = ("a torch.Tensor", "ArrayDataset for numpy arrays", "tensor", "t.reshape(1)")
            _check_rows("TensorDataset", i, t, torch.Tensor, names)
            if type(t).__getitem__ is not torch.Tensor.__getitem__:  # get_batch would skip it
                raise TypeError(
                    f"TensorDataset: argument {i} is a {type(t).__name__} with its own "
                    "__getitem__; pass torch.utils.data.TensorDataset, which indexes each row."
                )
        self.size = _common_length("TensorDataset", [t.size(0) for t in tensors])
        self.tensors = tensors

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        # A copy, as get_batch and workers make: an in-place step must not write into the data.
        return tuple(t[index].clone() for t in self.tensors)

    def get_batch(self, indices: Any) -> tuple[torch.Tensor, ...]:
        """The rows at ``indices`` (a 1-D int sequence, array or tensor), already batched."""
        idx = _index_tensor(indices)
        return tuple([t.index_select(0, idx) for t in self.tensors])


class ArrayDataset(Dataset[tuple[torch.Tensor, ...]]):
    """Rows of one or more numpy arrays (an ``np.memmap`` larger than RAM too), as tensors.

    Args:
        *arrays: Arrays with equal ``shape[0]``.

    Example:
        >>> ds = ArrayDataset(np.arange(6).reshape(3, 2))
        >>> ds.get_batch(np.array([2, 0]))
        (tensor([[4, 5],
                [0, 1]]),)
    """

    def __init__(self, *arrays: np.ndarray) -> None:
        for i, a in enumerate(arrays):
            names = ("a numpy array", "TensorDataset for tensors", "array", "a.reshape(1)")
            _check_rows("ArrayDataset", i, a, np.ndarray, names)
            if not a.dtype.isnative:  # torch.from_numpy refuses it at the first batch
                raise TypeError(
                    f"ArrayDataset: argument {i} has byte order {a.dtype.byteorder!r}, not the "
                    "machine's; pass a.astype(a.dtype.newbyteorder('=')) (a copy)."
                )
            try:  # fail here, not at the first batch
                torch.from_numpy(np.empty(0, dtype=a.dtype))
            except TypeError as exc:
                raise TypeError(
                    f"ArrayDataset: argument {i} has dtype {a.dtype}, which torch cannot hold "
                    f"({exc}); convert it to a numeric dtype first."
                ) from exc
            if not isinstance(a, np.memmap | np.recarray) and type(a) is not np.ndarray:
                raise TypeError(  # its rows index otherwise: get_batch would differ
                    f"ArrayDataset: argument {i} is a {type(a).__name__}, whose rows do not "
                    "index as an ndarray's; pass np.asarray(a) (a masked array: a.filled(v))."
                )
        self.size = _common_length("ArrayDataset", [a.shape[0] for a in arrays])
        self.arrays = arrays

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        # A copy, as get_batch makes: an in-place transform must not write into the data.
        return tuple(torch.from_numpy(np.array(a[index])) for a in self.arrays)

    def get_batch(self, indices: Any) -> tuple[torch.Tensor, ...]:
        """The rows at ``indices``, read in one call per array, as tensors."""
        idx = np.asarray(indices, dtype=np.int64)
        return tuple(torch.from_numpy(np.ascontiguousarray(a[idx])) for a in self.arrays)
