"""Padding collate: variable-length samples in, one padded batch with lengths and a mask out."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import decimal
import functools
import itertools
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, NoReturn, TypeAlias

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import (
    collate,
    collate_float_fn,
    collate_int_fn,
    collate_numpy_array_fn,
    collate_numpy_scalar_fn,
    collate_str_fn,
    collate_tensor_fn,
    default_collate_fn_map,
)

from loaderkit._checks import check_bool, check_int
from loaderkit.errors import CollateError

__all__ = ["PadCollate", "PaddedBatch"]

PadScalar: TypeAlias = bool | int | float

_KINDS = {bool: "b", int: "i", float: "f"}  # numpy dtype kind of each Python number type
_NUMBERS = (bool, int, float, np.number, np.bool_)
_BARE = object()  # column key of bare samples; lives only inside one call, never pickled
_NUMPY_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16}
    | {torch.float32, torch.float64, torch.complex64, torch.complex128}
    | {torch.uint16, torch.uint32, torch.uint64}  # which index_put_ does not implement
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
            "pass a pad_value that fits, or cast the field in the dataset"
        )


def _lead(col: list[Any]) -> Any:
    """The first item of the first non-empty list in ``col`` (None: there is none)."""
    return next((v[0] for v in col if isinstance(v, list) and v), None)


def _kind(t: type) -> type:
    """The Python number type of a numpy scalar type: ``list(tokens) + [eos]`` holds both."""
    if t in _KINDS or not issubclass(t, np.generic):
        return t
    if issubclass(t, np.bool_):
        return bool
    return int if issubclass(t, np.integer) else float if issubclass(t, np.floating) else t


def _same_kind(dtype: np.dtype, kind: type) -> bool:
    """Whether numpy ``dtype`` holds Python numbers of ``kind`` (unsigned ints are ints)."""
    want = _KINDS.get(kind)
    return dtype.kind == want or (want == "i" and dtype.kind == "u")


def _is_flat_list(col: list[Any]) -> bool:
    lead = type(_lead(col))
    if lead in {*_KINDS, type(None)}:
        return isinstance(col[0], list)
    # Numpy scalars too (``list(tokens) + [eos]``), unless beside arrays (converted each).
    return _kind(lead) in _KINDS and all(isinstance(v, list) for v in col)


def _one_type(where: str, col: list[Any]) -> None:
    """Raise TypeError naming the first sample whose value is of another type than sample 0's."""
    for i, v in enumerate(col):
        if type(v) is not type(col[0]):
            raise TypeError(
                f"{where}: sample {i} is a {type(v).__name__} but sample 0 is a "
                f"{type(col[0]).__name__}; return one type for this field from every sample"
            )


def _diagnose(where: str, col: list[Any], dim: int, cause: Exception | None = None) -> NoReturn:
    _one_type(where, col)
    first, ref = col[0], None  # ref: (index, dtype) of the first sample with a dtype
    for i, v in enumerate(col):
        if isinstance(v, list):
            if not v:
                continue
            if None in v:
                _not_flat(where, col)
            dtype = np.asarray(v).dtype
            if not _same_kind(dtype, _kind(type(v[0]))):
                raise CollateError(
                    f"{where}: sample {i} mixes {type(v[0]).__name__} items with others "
                    f"({dtype}); make every item of this field one kind (floats as 1.0), or "
                    "return an array"
                )
        else:
            dtype, shape, shape0 = v.dtype, tuple(v.shape), tuple(first.shape)
            if len(shape) != len(shape0) or shape[:dim] + shape[dim + 1 :] != (
                shape0[:dim] + shape0[dim + 1 :]
            ):
                fix = "fix the other dims"
                if len(shape) == len(shape0):  # (choices, T) where T differs: pad dim -1
                    other = [
                        d for d, (a, b) in enumerate(zip(shape, shape0, strict=True)) if a != b
                    ]
                    if len(other) == 1:
                        fix = f"pass PadCollate(pad_dim={other[0] - len(shape)}) to pad that dim"
                raise CollateError(
                    f"{where}: sample {i} has shape {shape} but sample 0 has {shape0}; only "
                    f"dim {dim} (pad_dim) may differ, so {fix}"
                )
        if ref is None:
            ref = (i, dtype)
        elif dtype != ref[1]:
            raise CollateError(
                f"{where}: sample {i} has dtype {dtype} but sample {ref[0]} has {ref[1]}; "
                "cast every sample of this field to one dtype"
            )
    raise CollateError(
        f"{where}: samples could not be concatenated ({cause}); return one type and dtype, "
        "shapes differing only along pad_dim"
    ) from cause


def _not_flat(where: str, col: list[list[Any]]) -> NoReturn:
    for i, v in enumerate(col):
        for j, item in enumerate(v):
            if item is None:  # a tokenizer's word_ids: None marks a special token
                raise CollateError(
                    f"{where}: sample {i} holds None at item {j}; map None to a number "
                    "(e.g. -100) in the dataset, or drop the field"
                )
            if _kind(type(item)) not in _KINDS:
                raise CollateError(
                    f"{where}: sample {i} holds a {type(item).__name__} at item {j} "
                    f"({item!r:.40}), not a number; return a tensor or array for a nested "
                    "sample, or flatten it in the dataset"
                )
    raise CollateError(f"{where}: samples are not flat number lists")  # pragma: no cover


def _concat_lists(where: str, col: list[list[Any]], pad: PadScalar) -> Tensor:
    """Flat lists of numbers, concatenated by one numpy call (Python numbers as int64 or the
    default float; with numpy scalars, numpy's dtype); lists that are all empty take their
    type from ``pad`` (int64 unless it is a float or bool)."""
    _one_type(where, col)  # a tensor or array beside lists: named, not "truth value ambiguous"
    kinds = {_kind(type(v[0])) for v in col if v}
    kinds = kinds or {type(pad) if type(pad) in (float, bool) else int}
    if not kinds <= _KINDS.keys():
        _not_flat(where, col)
    # np.array infers one dtype over all items: a float among ints shows, unchecked per item.
    try:
        flat = np.array(list(itertools.chain.from_iterable(col)))
    except (ValueError, TypeError):  # ragged nested lists deeper in a sample
        _not_flat(where, col)
    if flat.ndim != 1:
        _not_flat(where, col)
    items = itertools.chain.from_iterable(col)  # lazily: a float list stops at its first
    if flat.dtype.kind in "ufO" and flat.size and all(type(x) is int for x in items):
        big = max(itertools.chain.from_iterable(col), key=abs)  # past int64 (hashes): wraps
        raise CollateError(
            f"{where}: holds {big}, past int64; return it as an array of dtype uint64, or as "
            "a string"
        )
    if len(kinds) > 1 or (flat.size and not _same_kind(flat.dtype, next(iter(kinds)))):
        _diagnose(where, col, 0)
    scalars = [x.dtype for v in col if v for x in (v[0], v[-1]) if isinstance(x, np.generic)]
    if scalars:  # their own dtype (list(int32s) stays int32), where it holds every item
        common = np.result_type(*scalars)
        held = flat.astype(common)
        return torch.from_numpy(held if np.array_equal(held, flat) else flat)
    if kinds == {float}:
        return torch.from_numpy(flat).to(torch.get_default_dtype())
    return torch.from_numpy(flat.astype(bool if kinds == {bool} else np.int64, copy=False))


def _widened(col: list[Any]) -> list[Any] | None:
    """``col`` in one dtype that holds each of theirs exactly (int32 beside int64, as sources
    of a mix type a column), else None: only ints, or only floats, of one library."""
    kinds = {(type(v), v.dtype.kind if isinstance(v, np.ndarray) else v.dtype.is_floating_point)
             for v in col if isinstance(v, np.ndarray | Tensor)}  # fmt: skip
    if len(kinds) != 1 or len(col) != sum(isinstance(v, np.ndarray | Tensor) for v in col):
        return None
    if isinstance(col[0], np.ndarray):
        common = np.result_type(*(v.dtype for v in col))
        return [v.astype(common) for v in col] if common.kind == col[0].dtype.kind else None
    if any(v.dtype in (torch.bool, torch.uint64) or v.is_complex() for v in col):
        return None
    try:
        wide = functools.reduce(torch.promote_types, (v.dtype for v in col))
    except (RuntimeError, TypeError):  # uint16 and others torch does not promote
        return None
    return [v.to(wide) for v in col]


def _concat(where: str, col: list[Any], dim: int) -> Tensor:
    """Tensors or arrays concatenated along ``dim``, which ends up first."""
    try:
        same = len({v.dtype for v in col}) == 1  # a tensor among arrays also makes two
    except AttributeError:
        same = False
    if not same:
        col = _widened(col) or _diagnose(where, col, dim)
    try:
        if isinstance(col[0], np.ndarray):
            return torch.from_numpy(np.concatenate(col, axis=dim)).movedim(dim, 0)
        return torch.cat([v.movedim(dim, 0) for v in col] if dim else col)
    except (TypeError, ValueError, RuntimeError) as err:
        _diagnose(where, col, dim, err)


def _scatter(flat: Tensor, lengths: list[int], size: int, value: PadScalar, left: bool) -> Any:
    """``flat`` (the samples concatenated along dim 0) placed in a ``(B, size, ...)`` batch."""
    lens = np.asarray(lengths, dtype=np.int64)
    # The (B, size) mask, True on real items: row r of the view is ramp[r : r + size].
    ramp = np.zeros(2 * size, dtype=bool)
    ramp[size:] = left
    ramp[:size] = not left
    rows = np.ndarray((size + 1, size), bool, ramp, 0, (1, 1))  # strides (1, 1)
    mask = rows[lens if left else size - lens]
    shape = (len(lengths), size, *flat.shape[1:])
    if flat.device.type == "cpu" and flat.dtype in _NUMPY_DTYPES and not flat.requires_grad:
        src = flat.numpy()  # numpy's mask assignment beats index_put_ on CPU
        zero = value == 0 and math.copysign(1, value) > 0
        out_np = np.zeros(shape, src.dtype) if zero else np.full(shape, value, src.dtype)
        out_np[mask] = src
        return torch.from_numpy(out_np), torch.from_numpy(lens), torch.from_numpy(mask)
    mask_t = torch.from_numpy(mask).to(flat.device)
    out = flat.new_full(shape, value)
    out[mask_t] = flat
    return out, torch.from_numpy(lens), mask_t


class PaddedBatch(NamedTuple):
    """The batch :class:`PadCollate` returns for every sample kind except dicts.

    Attributes:
        values: The padded tensor, or one object of the sample's type holding the fields.
        lengths: ``int64`` ``(B,)`` lengths of the length field (``None``: ``lengths_key=None``).
        mask: ``bool`` ``(B, T)``, True on real items (``None``: ``mask_key=None``).
        sort_indices: Row ``i`` is input sample ``sort_indices[i]`` (``sort_by_length``).
    """

    values: Any
    lengths: Tensor | None
    mask: Tensor | None
    sort_indices: Tensor | None


def _where(key: Hashable) -> str:
    if key is _BARE:
        return "samples"
    return f"field {key}" if isinstance(key, int) else f"key {key!r}"


def _check_scalar(name: str, value: object) -> None:
    if not isinstance(value, (bool, int, float)):
        raise TypeError(
            f"PadCollate: {name} must be a bool, int or float, got {value!r}; pass e.g. 0 or -100."
        )


def _check_pads(pad_value: object, default_pad_value: object) -> None:
    if isinstance(pad_value, Mapping):
        for key, value in pad_value.items():
            _check_scalar(f"pad_value[{key!r}]", value)
        _check_scalar("default_pad_value", default_pad_value)
        return
    _check_scalar("pad_value", pad_value)
    if default_pad_value != 0:
        raise ValueError(
            f"PadCollate: default_pad_value={default_pad_value!r} only applies with a mapping "
            f"pad_value, but pad_value={pad_value!r}; pass one scalar pad_value"
        )


def _check_lengths(multiple: int | None, max_length: int | None, truncate: object) -> None:
    for name, value in (("pad_to_multiple_of", multiple), ("max_length", max_length)):
        if value is not None:
            check_int(name, value, 1, owner="PadCollate", fix="pass e.g. 8, or None for no limit")
    if max_length and multiple and max_length % multiple:
        raise ValueError(
            f"max_length={max_length} is not a multiple of pad_to_multiple_of={multiple}; "
            "round max_length up or drop one of them"
        )
    check_bool("truncate", truncate, owner="PadCollate")
    if truncate and max_length is None:
        raise ValueError("truncate=True needs max_length; pass e.g. max_length=512")


def _check_out_keys(out_keys: dict[str, str | None]) -> None:
    for name, key in out_keys.items():
        if key is not None and not isinstance(key, str):
            raise TypeError(
                f"PadCollate: {name} must be a str or None, got {key!r}; pass a key name "
                f"such as {name.removesuffix('_key')!r}, or None to leave it out"
            )
    names = [k for k in out_keys.values() if k is not None]
    if len(set(names)) != len(names):
        raise ValueError(
            f"PadCollate: lengths_key, mask_key and sort_indices_key must differ, got "
            f"{out_keys}; give each its own name (or None)"
        )


def _keys(sample: Any, index: int) -> tuple[type, tuple[Hashable, ...]]:
    if isinstance(sample, Mapping):
        return Mapping, tuple(sample.keys())
    if dataclasses.is_dataclass(sample) and not isinstance(sample, type):
        fields = dataclasses.fields(sample)  # init=False ones too, where set
        return type(sample), tuple(f.name for f in fields if hasattr(sample, f.name))
    if isinstance(sample, tuple):
        return type(sample), tuple(getattr(sample, "_fields", range(len(sample))))
    raise TypeError(
        f"PadCollate: sample {index} is a {type(sample).__name__}; samples must be tensors, "
        "arrays, lists of numbers, or dicts / tuples / dataclasses of those"
    )


def _nested_tensors(where: str, col: list[Any]) -> list[Tensor]:
    """Nested lists (or lists of numpy scalars) as tensors; empty ones of the others' dtype."""
    out = [
        _nested_tensor(where, i, v) if isinstance(v, list) else torch.as_tensor(v)
        for i, v in enumerate(col)
    ]
    like = next((t for t, v in zip(out, col, strict=True) if not _empty(v)), None)
    return [
        t if like is None or not _empty(v) else t.to(like.dtype)
        for t, v in zip(out, col, strict=True)
    ]


def _empty(value: Any) -> bool:
    return isinstance(value, list) and not value


def _nested_tensor(where: str, index: int, value: list[Any]) -> Tensor:
    try:
        return torch.tensor(value)  # its dtypes: the default for Python floats
    except (ValueError, TypeError, RuntimeError) as exc:
        rows = [len(r) if isinstance(r, (list, tuple)) else type(r).__name__ for r in value[:8]]
        raise CollateError(
            f"PadCollate: {where}: sample {index} is a ragged nested list (row lengths "
            f"{rows}{'...' if len(value) > 8 else ''}), not rectangular. Pad its rows in the "
            "dataset, or flatten it."
        ) from exc


_RECORDS = (str, bytes, tuple, Mapping)  # a list of these is kept one list per sample
_NESTED_FIX = (
    "return a tensor or array, or make it a top-level field (number lists padded, others kept "
    "per sample)"
)
_FIELD_FIX = "make its items one kind (numbers are padded, strings kept per sample)"
_OPAQUE = (datetime.date, datetime.time, datetime.timedelta, decimal.Decimal)  # kept as a list


def _number_tuple(value: Any) -> bool:
    """A plain tuple of numbers (not a namedtuple, whose fields torch collates by name)."""
    return type(value) is tuple and all(isinstance(x, _NUMBERS) for x in value)


def _viewable(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, array.dtype.newbyteorder("=")).reshape(array.shape)


def _unviewable(array: np.ndarray) -> bool:
    """Whether torch cannot view ``array`` (negative strides, another byte order)."""
    return not array.dtype.isnative or any(step < 0 for step in array.strides)


_NO_LEAF = object()


def _leaf(value: Any) -> Any:
    """The first item at any depth of nested lists that is not a list (``_NO_LEAF``: none)."""
    if not isinstance(value, list):
        return value
    return next((leaf for leaf in map(_leaf, value) if leaf is not _NO_LEAF), _NO_LEAF)


def _record(value: Any) -> bool:
    """A string, bytes, tuple or dict, or a list of them (word lists): kept per sample."""
    if isinstance(value, list):
        return all(_record(x) for x in value)
    return isinstance(value, _RECORDS)


def _collate_rest(key: Hashable, col: list[Any]) -> Any:
    """``default_collate`` of a field that is not padded; nested ones checked and named."""
    if all(isinstance(v, list) and _record(v) for v in col):
        return [list(v) for v in col]  # strings, records: one list per sample, not transposed
    if all(isinstance(v, _OPAQUE) for v in col):  # a Parquet date or decimal column
        return list(col)
    where = _where(key)
    _check_tree(col, f"[{key!r}]", _NESTED_FIX)
    _refuse_by_position(col, f"[{key!r}]", _FIELD_FIX)
    none = next((i for i, v in enumerate(col) if v is None), None)
    if none is not None:  # an unlabelled row: default_collate says neither key nor sample
        raise CollateError(
            f"{where}: sample {none} is None; give every sample a value, or drop the field"
        )
    try:
        return _collate(col)
    except TypeError as err:  # a number beside a list, a dataclass or set, nested
        kinds = ", ".join(sorted({type(v).__name__ for v in col}))
        what = "default_collate cannot collate its values"
        if "," in kinds:
            what = "its values are of other kinds in different samples"
        raise CollateError(
            f"{where}: {what} ({kinds}: {err}); return tensors, arrays or numbers of one kind "
            "from every sample, or collate it in your own collate_fn"
        ) from err
    except (ValueError, OverflowError) as err:  # an int past int64 (a hash)
        raise CollateError(
            f"{where}: its values cannot be made a tensor ({err}); return each as a 0-d "
            "tensor or array of a dtype that holds it (torch.uint64), or as a string"
        ) from err
    except RuntimeError as err:  # sizes that differ inside a nested value
        raise CollateError(
            f"{where}: its values differ in size between samples ({err}), and only top-level "
            "tensors, arrays and number lists are padded; return one of those as a top-level "
            "field, or collate it in your own collate_fn"
        ) from err


def _stack_promoted(batch: list[Tensor], *, collate_fn_map: Any = None) -> Tensor:
    """torch's tensor collate after promoting the tensors to one dtype, as ``torch.stack``
    does in the main process (in a worker torch stacks into the first one's: int16 -300
    beside uint8 became 212)."""
    odd = next((i for i, t in enumerate(batch) if not isinstance(t, Tensor)), None)
    if odd is not None:  # torch.stack's error, not the worker path's AttributeError on numel
        kind = type(batch[odd])
        name = kind.__qualname__  # as torch.stack names it: numpy.ndarray, float
        if kind.__module__ != "builtins":
            name = f"{kind.__module__}.{name}"
        raise TypeError(f"expected Tensor as element {odd} in argument 0, but got {name}")
    if len({t.dtype for t in batch}) > 1:
        dtype = functools.reduce(torch.promote_types, [t.dtype for t in batch])
        batch = [t.to(dtype) for t in batch]
    return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


_REAL = (bool, int, float, np.bool_, np.integer, np.floating)
_FLOATS = (float, np.floating)


def _numbers(batch: list[Any], *, collate_fn_map: Any = None) -> Tensor:
    """Real numbers of more than one type (3 beside 0.1, np.float32 beside a Python float):
    float64 where one is a float, whichever comes first (torch typed the batch by its first:
    3 beside 0.1 became float32, 16777217 rounded); anything else as torch makes it."""
    types = set(map(type, batch))
    mixed = len(types) > 1 and all(issubclass(t, _REAL) for t in types)
    if mixed and any(issubclass(t, _FLOATS) for t in types):
        return torch.tensor([float(x) for x in batch], dtype=torch.float64)
    return default_collate(batch)


def _arrays(batch: list[np.ndarray], *, collate_fn_map: Any = None) -> Any:
    """numpy arrays, copied first where torch cannot view them (reversed, big-endian)."""
    if any(isinstance(a, np.ndarray) and _unviewable(a) for a in batch):
        batch = [_viewable(a) if isinstance(a, np.ndarray) else a for a in batch]
    return collate_numpy_array_fn(batch, collate_fn_map=collate_fn_map)


# torch's documented extension point (`collate(batch, collate_fn_map=...)`): its walk of
# containers, arrays and numbers, with loaderkit's handler (right) where torch's own (left)
# is still registered: a user's, registered before or after this import, stays theirs.
# Keyed by identity: a user's handler may not hash (a dataclass) or may compare equal.
_SWAPS: dict[int, Any] = {
    id(collate_numpy_array_fn): _arrays,
    **dict.fromkeys(map(id, [collate_int_fn, collate_float_fn, collate_numpy_scalar_fn]), _numbers),
}
# In torch's own DataLoader workers too, where promote_in_worker() has not run.
_WORKER_SWAPS = {**_SWAPS, id(collate_tensor_fn): _stack_promoted}


def _fn_map() -> dict[Any, Any]:
    swaps = _SWAPS if get_worker_info() is None else _WORKER_SWAPS
    return {key: swaps.get(id(fn), fn) for key, fn in default_collate_fn_map.items()}


def promote_in_worker() -> None:
    """In a worker, torch's tensor handler stacks into storage typed like the first tensor
    (int16 -300 beside uint8 became 212): register the promoting one there (torch's extension
    point), so any collate calling ``default_collate`` gives what the main process's does.
    A user's own tensor handler stays."""
    if default_collate_fn_map.get(Tensor) is collate_tensor_fn:
        default_collate_fn_map[Tensor] = _stack_promoted


_TORCH_FNS: dict[Any, Any] = {  # torch's own handlers, each under its key
    Tensor: collate_tensor_fn,
    np.ndarray: collate_numpy_array_fn,
    next(k for k in default_collate_fn_map if isinstance(k, tuple)): collate_numpy_scalar_fn,
    float: collate_float_fn,
    int: collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}


_READ = (Tensor, np.ndarray, np.generic, int, float, str, bytes)  # what a batched read holds


def torch_collates() -> bool:
    """Whether a batched read (one gather, a dataset's ``get_batch``) gives what the collate
    would: torch's own handlers for its types, and no user's handler that could meet what it
    reads (a Tensor subclass, ``dict``, ``tuple``, ``object``); one for a class of the
    user's own that no batched read holds leaves it on."""
    live: dict[Any, Any] = default_collate_fn_map
    if not all(live.get(k) is fn for k, fn in _TORCH_FNS.items()):
        return False
    extra = [t for k in live if k not in _TORCH_FNS for t in (k if isinstance(k, tuple) else [k])]
    return not any(
        not isinstance(t, type)
        or issubclass(t, _READ)
        or any(issubclass(c, t) for c in (dict, list, tuple))
        for t in extra
    )


STACK_FIX = (
    "pass collate_fn=loaderkit.PadCollate() for samples of different lengths, or read one "
    "dtype (a reader's out_dtype=) for samples of different dtypes"
)


def _sequence(value: Any) -> bool:
    """A sequence ``default_collate`` walks (not a string); lists and tuples checked first,
    as ``isinstance`` on the ABC costs a microsecond."""
    return isinstance(value, (list, tuple)) or (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes))
    )


def _positional(value: Any) -> bool:
    """A sequence ``default_collate`` collates position by position (a tuple is fields)."""
    return _sequence(value) and not isinstance(value, tuple)


_ARRAYS = (Tensor, np.ndarray)


def _holds_array(value: Any) -> bool:
    """Whether ``value`` is, or holds, an array of at least one dim (a 0-d one is a number)."""
    if isinstance(value, _ARRAYS):
        return value.ndim > 0
    if isinstance(value, Mapping):
        return any(_holds_array(v) for v in value.values())
    return isinstance(value, (list, tuple)) and any(_holds_array(v) for v in value)


DEFAULT_FIX = (
    "return a tensor or array, or pass collate_fn=loaderkit.PadCollate() with it as a field "
    "of the sample (number lists padded, others kept per sample)"
)


def _refuse_by_position(col: list[Any], path: str, fix: str = DEFAULT_FIX) -> None:
    """Refuse a list in ``col`` that holds no array (numbers, strings, records, 0-d arrays):
    ``default_collate`` would pair up its items across samples by position. One that holds
    arrays (views of a sample, ``[image, label]``) is batched per position, as torch does."""
    if not _positional(col[0]) and not all(_sequence(v) for v in col):
        return  # torch collates by sample 0's kind, and refuses the others' itself
    for i, value in enumerate(col):
        if isinstance(value, tuple):
            continue  # fields, walked by _check_tree
        kind = type(value).__name__
        if not _positional(value):
            what = f"a {kind} where sample 0 holds a list"
        elif value and any(_holds_array(x) for x in value):
            continue
        elif not value:
            what = f"an empty {kind}"
        elif isinstance(value[0], (str, bytes)):
            what = f"a {kind} of strings"
        elif isinstance(value[0], (*_NUMBERS, *_ARRAYS)):
            what = f"a {kind} of numbers"
        else:
            what = f"a {kind} of records"
        raise CollateError(
            f"sample {i}{path} is {what}, which default_collate would collate by position "
            f"across samples; {fix}"
        )


def _check_tree(col: list[Any], path: str = "", fix: str = DEFAULT_FIX) -> None:
    """Refuse what ``default_collate`` gets silently wrong inside samples: dicts whose keys
    differ (it keeps sample 0's) and lists that hold no array (:func:`_refuse_by_position`).
    ``path`` names ``col``; ``fix`` ends the list's error."""
    first = col[0]
    if isinstance(first, Mapping):
        for i, value in enumerate(col):
            if not isinstance(value, Mapping) or value.keys() != first.keys():
                have = sorted(map(str, value)) if isinstance(value, Mapping) else "no dict"
                raise CollateError(
                    f"sample {i}{path} has keys {have}, sample 0 {sorted(map(str, first))}; "
                    "give every sample the same keys"
                )
    for key in _fields(col):
        if isinstance(first[key], Mapping) or _sequence(first[key]):
            child = [v[key] for v in col]
            _check_tree(child, f"{path}[{key!r}]", fix)
            _refuse_by_position(child, f"{path}[{key!r}]", fix)


def promoting_collate(samples: list[Any]) -> Any:
    """``default_collate``, the same for any ``num_workers`` (a worker promotes dtypes as the
    main process's ``torch.stack`` does) and for any order of the samples (numbers are
    float64 where floats sit beside ints), after :func:`_check_tree`. A sample that is a list
    is its fields, as torch reads it."""
    if samples:
        _check_tree(samples)
    try:
        return _collate(samples)
    except (RuntimeError, TypeError) as err:  # torch names no field: the first that fails alone
        path = _failing(samples)
        if path and err.args and isinstance(err.args[0], str):
            err.args = (f"in field {path}: {err.args[0]}", *err.args[1:])
        raise


def _fields(col: list[Any]) -> Iterable[Any]:
    """The keys of the values' fields: a dict's keys, a sequence's positions; none: a leaf."""
    first = col[0]
    if isinstance(first, Mapping):
        return first
    if _sequence(first) and all(_sequence(v) and len(v) == len(first) for v in col):
        return range(len(first))
    return ()


def _failing(samples: list[Any]) -> str:
    """The path of the first field whose values cannot be collated on their own ('': none)."""
    for key in _fields(samples):
        child = [v[key] for v in samples]
        try:
            _collate(child)
        except (RuntimeError, TypeError):
            return f"[{key!r}]{_failing(child)}"
    return ""


def _collate(samples: list[Any]) -> Any:
    return collate(samples, collate_fn_map=_fn_map())


def _split(samples: list[Any]) -> dict[Hashable, list[Any]]:
    """The batch's columns by field, every sample checked to have the same fields."""
    if isinstance(samples[0], (Tensor, np.ndarray, list)):
        return {_BARE: samples}
    if _number_tuple(samples[0]):  # torch reads it as fields: (1, 2, 3) is three of them
        raise CollateError(
            f"PadCollate: sample 0 is a tuple of numbers {samples[0]!r:.40}: fields to torch, "
            "maybe token ids; return token ids as a list or tensor, or collate fields of "
            "numbers without PadCollate (the default collate)"
        )
    kind, keys = _keys(samples[0], 0)
    for i, sample in enumerate(samples):
        kind_i, keys_i = _keys(sample, i)
        if kind_i is not kind:
            raise TypeError(
                f"PadCollate: sample {i} is a {type(sample).__name__} but sample 0 is a "
                f"{type(samples[0]).__name__}; return one sample type from the dataset"
            )
        if keys_i != keys and (kind is not Mapping or set(keys_i) != set(keys)):
            missing = [k for k in keys if k not in keys_i]
            extra = [k for k in keys_i if k not in keys]
            raise CollateError(
                f"PadCollate: sample {i} lacks keys {missing} and has extra keys {extra} "
                "compared with sample 0; return the same keys from every sample"
            )
    if kind is Mapping:
        return {k: [s[k] for s in samples] for k in keys}
    if issubclass(kind, tuple):
        return {k: [s[j] for s in samples] for j, k in enumerate(keys)}
    return {k: [getattr(s, str(k)) for s in samples] for k in keys}


class PadCollate:
    """Collate variable-length samples into a padded batch with lengths and a mask.

    A field is padded when its shapes differ, it holds lists of numbers, or ``pad_keys``,
    ``pad_value`` or ``length_field`` names it; others go to ``default_collate``. Lists of
    numbers become tensors as ``torch.tensor`` makes them (floats in the default dtype); a
    batch whose lists of a field are all empty is int64, or float/bool where that field's
    pad value is one; return arrays to choose the dtype. Nested
    values (a dict or list inside a field) are not padded: sizes that differ, or a list of
    numbers or strings, inside one raise; a field of string lists stays one list per sample.

    Args:
        pad_value: The pad value of every field, or one per key (the others get
            ``default_pad_value``; a bool field pads with False unless a bool or its own
            value is given); checked against each field's dtype.
        default_pad_value: Pad value of keys a mapping ``pad_value`` leaves out.
        pad_dim: The dim to pad (negative counts from the end); other dims must match.
        padding_side: ``"right"`` (pad after the items) or ``"left"``.
        pad_to_multiple_of: Round the padded length up to a multiple of this.
        max_length: Pad to exactly this length; longer samples raise unless ``truncate``.
            With either, name a field of dict or tuple samples in ``pad_keys``: it and the
            fields as long in every sample are padded in every batch (one where no field
            varies and none is named raises).
        truncate: Cut samples longer than ``max_length``.
        pad_to_max_length: With ``max_length``, pad every batch to it; ``False`` pads to the
            batch's longest sample, cut at ``max_length`` (under a token budget).
        truncation_side: Keep the first (``"right"``) or the last (``"left"``) items.
        pad_keys: Keys to pad even when their shapes are all equal.
        length_field: The key whose lengths and mask are returned (default: the first
            tensor / array / list field that ``pad_dim`` fits; refused in a batch where
            another such field differs in length from it: name one then).
        lengths_key: Output key of the lengths in a dict batch (``None``: omitted).
        mask_key: Output key of the mask in a dict batch (``None``: omitted).
        sort_by_length: Sort the batch longest first (stable) and return the permutation.
        sort_indices_key: Output key of the permutation in a dict batch (``None``: omitted).

    Returns a dict (dict samples, with the lengths, mask and permutation added) or a
    :class:`PaddedBatch`; raises :class:`~loaderkit.errors.CollateError` for samples that
    cannot be padded together, ``TypeError`` for unsupported sample types.

    Example:
        >>> collate = PadCollate(pad_value={"labels": -100})
        >>> batch = collate([
        ...     {"input_ids": [5, 6, 7], "labels": [1, 2, 3], "id": 0},
        ...     {"input_ids": [8], "labels": [4], "id": 1},
        ... ])
        >>> batch["input_ids"]
        tensor([[5, 6, 7],
                [8, 0, 0]])
        >>> batch["labels"][1].tolist(), batch["lengths"].tolist(), batch["id"].tolist()
        ([4, -100, -100], [3, 1], [0, 1])
        >>> batch["attention_mask"][1].tolist()
        [True, False, False]
        >>> PadCollate(padding_side="left")([torch.ones(2), torch.ones(1)]).values
        tensor([[1., 1.],
                [0., 1.]])
    """

    length_arg = "length_field"  # what the ambiguous-length error tells to pass

    def __init__(
        self,
        pad_value: PadScalar | Mapping[Hashable, PadScalar] = 0,
        *,
        default_pad_value: PadScalar = 0,
        pad_dim: int = 0,
        padding_side: str = "right",
        pad_to_multiple_of: int | None = None,
        max_length: int | None = None,
        truncate: bool = False,
        pad_to_max_length: bool = True,
        truncation_side: str = "right",
        pad_keys: Iterable[Hashable] = (),
        length_field: Hashable | None = None,
        lengths_key: str | None = "lengths",
        mask_key: str | None = "attention_mask",
        sort_by_length: bool = False,
        sort_indices_key: str | None = "sort_indices",
    ) -> None:
        _check_pads(pad_value, default_pad_value)
        check_int("pad_dim", pad_dim, None, owner="PadCollate", fix="pass e.g. 0 or -1")
        for name, side in (("padding_side", padding_side), ("truncation_side", truncation_side)):
            if side not in ("right", "left"):
                raise ValueError(
                    f"PadCollate: {name} must be 'right' or 'left', got {side!r}; pass one of these"
                )
        _check_lengths(pad_to_multiple_of, max_length, truncate)
        check_bool("sort_by_length", sort_by_length, owner="PadCollate")
        check_bool("pad_to_max_length", pad_to_max_length, owner="PadCollate")
        if isinstance(pad_keys, (str, bytes)) or not isinstance(pad_keys, Iterable):
            raise TypeError(f"pad_keys must be a list of keys, got {pad_keys!r}; pass e.g. ['ids']")
        _check_out_keys(
            {"lengths_key": lengths_key, "mask_key": mask_key, "sort_indices_key": sort_indices_key}
        )
        if not isinstance(length_field, Hashable):
            raise TypeError(
                f"PadCollate: length_field must be one key, got {length_field!r}; pass e.g. "
                "length_field='input_ids'."
            )
        self.pad_values: dict[Hashable, PadScalar] = {}
        self.default_pad_value: PadScalar = default_pad_value
        if isinstance(pad_value, Mapping):
            self.pad_values.update(pad_value)
        else:
            self.default_pad_value = pad_value
        self.pad_dim, self.padding_side = pad_dim, padding_side
        self.pad_to_multiple_of, self.max_length = pad_to_multiple_of, max_length
        self.truncate, self.truncation_side = truncate, truncation_side
        self.pad_to_max_length = pad_to_max_length
        self.pad_keys, self.length_field = tuple(pad_keys), length_field
        self.lengths_key, self.mask_key = lengths_key, mask_key
        self.sort_by_length, self.sort_indices_key = sort_by_length, sort_indices_key

    def __repr__(self) -> str:
        shown = (f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({', '.join(shown)})"

    def _dim(self, where: str, first: Any) -> int:
        ndim = 1 if isinstance(first, list) else first.ndim
        dim = self.pad_dim + ndim if self.pad_dim < 0 else self.pad_dim
        if not 0 <= dim < ndim:
            fix = f"pass a pad_dim in {-ndim}..{ndim - 1}" if ndim else "return 1-d values"
            raise CollateError(
                f"{where}: pad_dim={self.pad_dim} is out of range for sample 0 with {ndim} "
                f"dims; {fix}"
            )
        return dim

    def _sizes(self, where: str, col: list[Any]) -> tuple[int, list[int]]:
        dim = self._dim(where, col[0])
        try:
            if isinstance(col[0], list):
                return dim, [len(v) for v in col]
            return dim, [v.shape[dim] for v in col]  # faster than len() on tensors
        except (AttributeError, IndexError, TypeError) as err:
            _diagnose(where, col, dim, err)

    def _pad(self, key: Hashable, col: list[Any]) -> tuple[Tensor, Tensor, Tensor]:
        where = _where(key)
        dim, lengths = self._sizes(where, col)
        limit = self.max_length
        if limit is not None and max(lengths) > limit:
            i = next(i for i, n in enumerate(lengths) if n > limit)
            if not self.truncate:
                raise CollateError(
                    f"{where}: sample {i} has length {lengths[i]} along dim {dim}, above "
                    f"max_length={limit}; pass truncate=True or raise max_length"
                )
            cut = (slice(None),) * dim
            keep = [
                slice(max(n - limit, 0), n) if self.truncation_side == "left" else slice(limit)
                for n in lengths
            ]
            col = [v[k] if not dim else v[(*cut, k)] for v, k in zip(col, keep, strict=True)]
            lengths = [min(n, limit) for n in lengths]
        value = self.pad_values.get(key, self.default_pad_value)
        if key in (self.mask_key, "attention_mask") and key not in self.pad_values:
            value = 0  # the samples' own mask (a tokenizer's attention_mask): pads are absent
        if isinstance(col[0], list):
            flat = _concat_lists(where, col, value)
        else:
            flat = _concat(where, col, dim)
        size = limit if limit and self.pad_to_max_length else max(lengths)
        if self.pad_to_multiple_of:
            size = -(-size // self.pad_to_multiple_of) * self.pad_to_multiple_of
        if flat.dtype == torch.bool and key not in self.pad_values and type(value) is not bool:
            value = False  # a mask's pad is "absent", whatever the token pad id
        _check_pad_value(where, value, flat.dtype)
        out, lens, mask = _scatter(flat, lengths, size, value, self.padding_side == "left")
        return (out.movedim(1, dim + 1).contiguous() if dim else out), lens, mask

    def __call__(self, batch: Sequence[Any]) -> Any:
        """Collate ``batch``, a list of samples."""
        samples = list(batch)
        if not samples:
            raise CollateError(
                "PadCollate: got an empty batch (0 samples); check the sampler and batch_size, "
                "or filter empty batches out before collating"
            )
        columns = _split(samples)
        named = [*self.pad_keys, *self.pad_values]
        named += [] if self.length_field is None else [self.length_field]
        for k in named:
            if k not in columns:
                have = "bare samples" if _BARE in columns else f"keys {list(columns)}"
                raise CollateError(
                    f"PadCollate: {k!r} is named in pad_keys, pad_value or length_field but "
                    f"sample 0 has {have}; fix the name or drop it"
                )
        padded, length_key = self._classify(columns, named)
        if self.max_length is not None or self.pad_to_multiple_of is not None:
            padded = self._aligned(columns, padded, length_key)
        order = None
        if self.sort_by_length and length_key is not None:
            sizes = self._sizes(_where(length_key), columns[length_key])[1]
            sizes = [min(n, self.max_length or n) for n in sizes]
            # sorted() stays stable with reverse=True: ties keep their input order.
            order = sorted(range(len(samples)), key=sizes.__getitem__, reverse=True)
            columns = {k: [col[i] for i in order] for k, col in columns.items()}
        out: dict[Hashable, Any] = {}
        lengths = mask = None
        try:
            for k, col in columns.items():
                if k in padded:
                    out[k], lens, m = self._pad(k, col)
                    lengths, mask = (lens, m) if k == length_key else (lengths, mask)
                else:
                    out[k] = _collate_rest(k, col)
        except (CollateError, TypeError):
            if order is not None:  # its "sample i" would count the sorted rows: the batch's own
                unsorted = copy.copy(self)
                unsorted.sort_by_length = False
                unsorted(samples)
            raise
        if length_key is not None and lengths is None:  # nothing padded: every item is real
            sizes = self._sizes(_where(length_key), columns[length_key])[1]
            lengths, mask = torch.tensor(sizes), torch.ones(len(sizes), sizes[0], dtype=torch.bool)
        lengths = None if self.lengths_key is None else lengths
        mask = None if self.mask_key is None else mask
        sort_indices = None if order is None else torch.tensor(order)
        return self._pack(samples[0], out, (lengths, mask, sort_indices))

    def _classify(
        self, columns: dict[Hashable, list[Any]], named: list[Hashable]
    ) -> tuple[list[Hashable], Hashable | None]:
        """The keys to pad, and the key whose lengths and mask are returned."""
        seqs: list[Hashable] = []  # fields that have a length
        for k, col in columns.items():
            nested = isinstance(col[0], list) and not _is_flat_list(col)
            # Lists of lists, of numpy scalars or of number tuples (spans): each a tensor.
            lead = _lead(col) if nested else None
            leaf = _leaf(col) if nested else None  # words, (token, tag) pairs: per sample
            text = _record(leaf) and not _number_tuple(leaf)
            if (isinstance(lead, list | np.generic) and not text) or _number_tuple(lead):
                columns[k] = col = _nested_tensors(_where(k), col)
            elif all(_number_tuple(v) for v in col):  # token ids as a tuple: as a list
                columns[k] = col = [list(v) for v in col]
            if isinstance(col[0], (Tensor, np.ndarray)) or _is_flat_list(col):
                seqs.append(k)
            elif any(isinstance(v, (Tensor, np.ndarray)) for v in col):
                _one_type(_where(k), col)  # a scalar beside a tensor: default_collate promotes
            elif k in named or k is _BARE:
                fix = (
                    "drop it from pad_keys" if k in named else "return a tuple (or dict) of fields"
                )
                raise TypeError(
                    f"{_where(k)}: sample 0 holds a {type(col[0]).__name__}, which cannot be "
                    f"padded; return a tensor, array or list of numbers, or {fix}"
                )
        padded = [k for k in seqs if k is _BARE or k in named or self._varies(k, columns[k])]
        if self.length_field is not None:
            return padded, self.length_field
        ndims = {k: 1 if isinstance(columns[k][0], list) else columns[k][0].ndim for k in seqs}
        fits = [k for k in seqs if -ndims[k] <= self.pad_dim < ndims[k]]
        if not fits:
            return padded, None
        # The first field that could be padded, whichever varies in this batch (src one batch,
        # tgt the next); another of other lengths makes the choice the user's.
        key, sizes = fits[0], self._sizes(_where(fits[0]), columns[fits[0]])[1]
        for other in fits[1:]:
            if self._sizes(_where(other), columns[other])[1] != sizes:
                raise CollateError(
                    f"PadCollate: {_where(key)} and {_where(other)} differ in length in this "
                    f"batch, so which one lengths and the mask measure is unclear; pass "
                    f"{self.length_arg}= one of {key!r}, {other!r}."
                )
        return padded, key

    def _aligned(
        self, columns: dict[Hashable, list[Any]], padded: list[Hashable], length_key: Hashable
    ) -> list[Hashable]:
        """With a length limit, ``padded`` plus the fields aligned with ``length_key`` (as many
        dims, as long in every sample) even if none varies; refused if none is padded or named."""
        if length_key is None or _BARE in columns:
            return padded
        if not padded:
            raise CollateError(
                f"PadCollate: no field's length varies in this batch, so which to pad to "
                f"max_length={self.max_length} / pad_to_multiple_of={self.pad_to_multiple_of} "
                "is unknown (other batches are padded); name the fields in pad_keys=[...]"
            )
        first = columns[length_key][0]
        ndim = 1 if isinstance(first, list) else first.ndim
        sizes = self._sizes(_where(length_key), columns[length_key])[1]
        for k, col in columns.items():  # labels beside input_ids, a vector as long too; no image
            like = isinstance(col[0], (Tensor, np.ndarray)) and col[0].ndim == ndim
            if k not in padded and like and self._sizes(_where(k), col)[1] == sizes:
                padded.append(k)
        return padded

    def _varies(self, key: Hashable, col: list[Any]) -> bool:
        if isinstance(col[0], list):
            return True  # default_collate would transpose lists, so they are always padded
        # Another dtype (default_collate would silently promote), or a value with none.
        if len({getattr(v, "dtype", None) for v in col}) > 1:
            col[:] = _widened(col) or _diagnose(
                _where(key), col, self.pad_dim % max(col[0].ndim, 1)
            )
        return len({v.shape for v in col}) > 1

    def _pack(self, first: Any, out: dict[Hashable, Any], extra: tuple[Any, ...]) -> Any:
        if isinstance(first, Mapping):
            names = (self.lengths_key, self.mask_key, self.sort_indices_key)
            for name, value in zip(names, extra, strict=True):
                if name is None or value is None:
                    continue
                if name == self.mask_key and name in out:
                    continue  # the samples' own mask, padded with 0: kept as they typed it
                if name in out:
                    raise CollateError(
                        f"PadCollate: the samples already have a key {name!r}, the name of an "
                        "output entry; pass PadCollate another lengths_key / mask_key / "
                        "sort_indices_key, or leave that field out (a reader's columns=)."
                    )
                out[name] = value
            return out
        cls: Any = type(first)
        if _BARE in out:
            values = out[_BARE]
        elif dataclasses.is_dataclass(first):
            # Not cls(**out): __post_init__ would run again on the batch; not a copy of
            # `first`: its other attributes are one sample's.
            values = object.__new__(cls)
            for k, v in out.items():
                object.__setattr__(values, str(k), v)
        elif hasattr(first, "_fields"):  # namedtuple
            values = cls(*out.values())
        else:
            values = tuple(out.values())
        return PaddedBatch(values, *extra)
