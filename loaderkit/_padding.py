"""The padding kernels behind :class:`~loaderkit.PadCollate`: one concatenation, one masked copy.

Private: these work on one column (one key's values over a batch) and know
nothing of sample structure, which :mod:`loaderkit.collate` handles.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, NoReturn, TypeAlias

import numpy as np
import torch
from torch import Tensor

from loaderkit.errors import CollateError

PadScalar: TypeAlias = bool | int | float

_KINDS = {bool: "b", int: "i", float: "f"}  # numpy dtype kind of each Python number type
_NUMPY_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16}
    | {torch.float32, torch.float64, torch.complex64, torch.complex128}
)


@functools.lru_cache(maxsize=256)  # iinfo / finfo cost microseconds, per field and batch
def _check_pad_value(where: str, value: PadScalar, dtype: torch.dtype) -> None:
    if dtype.is_complex:
        return
    if dtype == torch.bool:
        ok, rule = value in (0, 1), "0, 1, False or True"
    elif dtype.is_floating_point:
        top = torch.finfo(dtype).max
        ok, rule = not math.isfinite(value) or abs(value) <= top, f"|value| <= {top:g}, inf or nan"
    else:
        info = torch.iinfo(dtype)
        ok = float(value).is_integer() and info.min <= value <= info.max
        rule = f"an integer in {info.min}..{info.max}"
    if not ok:
        raise CollateError(
            f"{where}: pad value {value!r} is not representable in {dtype} (needs {rule}); "
            f"pass a pad_value for this key that fits, or cast the field in the dataset"
        )


def _is_flat_list(col: list[Any]) -> bool:
    """Whether a column holds lists of Python numbers, judged by sample 0's first item."""
    return isinstance(col[0], list) and {type(v[0]) for v in col[:1] if v} <= _KINDS.keys()


def _diagnose(where: str, col: list[Any], dim: int, cause: Exception | None = None) -> NoReturn:
    """Name the first sample that does not match; runs only once a fast path failed."""
    first, ref = col[0], None  # ref: (index, dtype) of the first sample with a dtype
    for i, v in enumerate(col):
        if type(v) is not type(first):
            raise TypeError(
                f"{where}: sample {i} is a {type(v).__name__} but sample 0 is a "
                f"{type(first).__name__}; return one type for this field from every sample"
            )
        if isinstance(v, list):
            if not v:
                continue
            dtype = np.asarray(v).dtype
            if dtype.kind != _KINDS.get(type(v[0])):
                raise CollateError(
                    f"{where}: sample {i} mixes {type(v[0]).__name__} items with others "
                    f"(numpy reads it as {dtype}); make every item of this field one kind"
                )
        else:
            dtype, shape, shape0 = v.dtype, tuple(v.shape), tuple(first.shape)
            if len(shape) != len(shape0) or shape[:dim] + shape[dim + 1 :] != (
                shape0[:dim] + shape0[dim + 1 :]
            ):
                raise CollateError(
                    f"{where}: sample {i} has shape {shape} but sample 0 has {shape0}; only "
                    f"dim {dim} (pad_dim) may differ between samples, so fix the other dims"
                )
        if ref is None:
            ref = (i, dtype)
        elif dtype != ref[1]:
            raise CollateError(
                f"{where}: sample {i} has dtype {dtype} but sample {ref[0]} has {ref[1]}; "
                f"cast every sample of this field to one dtype in the dataset"
            )
    raise CollateError(
        f"{where}: samples could not be concatenated: {cause}; return samples of one type "
        "and dtype whose shapes differ only along pad_dim"
    ) from cause


def _not_flat(where: str, col: list[list[Any]]) -> NoReturn:
    """Name the first sample whose list holds something other than numbers (nested lists)."""
    for i, v in enumerate(col):
        for j, item in enumerate(v):
            if type(item) not in _KINDS:
                raise CollateError(
                    f"{where}: sample {i} holds a {type(item).__name__} at item {j} "
                    f"({item!r:.40}); PadCollate pads lists of numbers (bool, int, float) "
                    "along their length: return a tensor or numpy array for a nested sample "
                    "(padded along pad_dim), or flatten it in the dataset"
                )
    raise CollateError(  # pragma: no cover - a non-number is always found above
        f"{where}: the samples are not flat lists of numbers; return tensors or flat lists"
    )


def _concat_lists(where: str, col: list[list[Any]]) -> Tensor:
    """Concatenate flat lists of Python numbers with one numpy call: no loop per token."""
    kinds = {type(v[0]) for v in col if v}
    if not kinds <= _KINDS.keys():
        _not_flat(where, col)
    # np.array infers one dtype over all items, so one float among ints shows as a float
    # dtype, without a Python-level check per item.
    try:
        flat = np.array(list(itertools.chain.from_iterable(col)))
    except (ValueError, TypeError):  # ragged nested lists deeper in a sample
        _not_flat(where, col)
    if flat.ndim != 1:
        _not_flat(where, col)
    if len(kinds) > 1 or (flat.size and flat.dtype.kind != _KINDS[next(iter(kinds))]):
        _diagnose(where, col, 0)
    if kinds == {float}:
        return torch.from_numpy(flat).to(torch.get_default_dtype())
    return torch.from_numpy(flat.astype(bool if kinds == {bool} else np.int64, copy=False))


def _concat(where: str, col: list[Any], dim: int) -> Tensor:
    """Concatenate tensors or arrays along ``dim``, which ends up first."""
    try:
        same = len({v.dtype for v in col}) == 1  # a tensor among arrays also makes two
    except AttributeError:
        same = False
    if not same:
        _diagnose(where, col, dim)
    try:
        if isinstance(col[0], np.ndarray):
            return torch.from_numpy(np.concatenate(col, axis=dim)).movedim(dim, 0)
        return torch.cat([v.movedim(dim, 0) for v in col] if dim else col)
    except (TypeError, ValueError, RuntimeError) as err:
        _diagnose(where, col, dim, err)


def _mask(lengths: np.ndarray, size: int, left: bool) -> np.ndarray:
    """``(B, size)`` mask, True on real items, gathered from a strided ramp.

    Row ``r`` of the view is the window ``ramp[r : r + size]``; a length ``l`` picks row
    ``size - l`` of the right ramp (Trues first) or row ``l`` of the left one. One memcpy per
    row: several times faster than ``arange(size) < lengths[:, None]`` for long batches.
    """
    ramp = np.zeros(2 * size, dtype=bool)
    ramp[size:] = left
    ramp[:size] = not left
    # A (size + 1, size) view with strides (1, 1): row r starts at ramp[r]. The plain
    # constructor costs half of np.lib.stride_tricks.as_strided.
    rows = np.ndarray((size + 1, size), bool, ramp, 0, (1, 1))
    return rows[lengths if left else size - lengths]


def _scatter(flat: Tensor, lengths: list[int], size: int, value: PadScalar, left: bool) -> Any:
    """Place ``flat`` (the samples concatenated along dim 0) into a ``(B, size, ...)`` batch."""
    lens = np.asarray(lengths, dtype=np.int64)
    mask = _mask(lens, size, left)
    shape = (len(lengths), size, *flat.shape[1:])
    if flat.device.type == "cpu" and flat.dtype in _NUMPY_DTYPES and not flat.requires_grad:
        # numpy's boolean-mask assignment is one tight copy loop: faster on CPU than torch's
        # index_put_ and than pad_sequence's per-sample copies (benchmarks/collate/bench.py).
        src = flat.numpy()
        # np.zeros gets pages the allocator already zeroed: cheaper than filling them.
        zero = value == 0 and math.copysign(1, value) > 0
        out_np = np.zeros(shape, src.dtype) if zero else np.full(shape, value, src.dtype)
        out_np[mask] = src
        return torch.from_numpy(out_np), torch.from_numpy(lens), torch.from_numpy(mask)
    mask_t = torch.from_numpy(mask).to(flat.device)
    out = flat.new_full(shape, value)
    out[mask_t] = flat
    return out, torch.from_numpy(lens), mask_t
