"""Arrow tables into tensors, a batch at a time (private): numbers a tensor, ``list<number>``
a list of 1-D tensors, ``fixed_size_list`` a 2-D tensor, anything else a list."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from loaderkit.errors import require

_SIGNED = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def import_pyarrow(extra: str = "parquet") -> Any:
    """``pyarrow`` with its ``compute`` and ``parquet`` modules."""
    for module in ("pyarrow.compute", "pyarrow.parquet", "pyarrow"):
        pyarrow = require(module, "reading Parquet or Arrow data needs", extra)
    return pyarrow


def _numeric(pa: Any, t: Any) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def _digits(dtype: torch.dtype) -> int:
    """Binary digits a dtype holds exactly: an int's magnitude bits, a float's mantissa."""
    if dtype == torch.bool:
        return 1
    if dtype.is_floating_point:
        return round(-math.log2(torch.finfo(dtype).eps)) + 1
    info = torch.iinfo(dtype)
    return info.bits - (1 if info.min < 0 else 0)


def promoted(a: torch.dtype, b: torch.dtype) -> torch.dtype | None:
    """The dtype collate stacks ``a`` and ``b`` in (None: torch promotes no unsigned type
    wider than uint8 with another)."""
    try:
        return torch.promote_types(a, b)
    except RuntimeError:
        return None


def exact_dtype(a: torch.dtype, b: torch.dtype) -> torch.dtype | None:
    """The dtype torch promotes ``a`` and ``b`` to (or ``float64``) if it holds both exactly.

    Example:
        >>> exact_dtype(torch.int32, torch.int64), exact_dtype(torch.int32, torch.float32)
        (torch.int64, torch.float64)
        >>> exact_dtype(torch.int64, torch.float64) is None
        True
    """
    if a == b:
        return a
    common = promoted(a, b)
    need = max(_digits(a), _digits(b))
    if not (a.is_floating_point or b.is_floating_point):
        if common is not None:
            return common  # integer promotion keeps every value
        return next((t for t in (torch.int32, torch.int64) if _digits(t) >= need), None)
    for target in (common, torch.float64):
        if target is not None and target.is_floating_point and _digits(target) >= need:
            return target
    return None


def _torch_dtype(t: Any) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=t.to_pandas_dtype())).dtype


def column_kind(pa: Any, t: Any) -> tuple[Any, ...]:
    """What a column of Arrow type ``t`` becomes: ``("tensor"|"tensors"|"fixed"|"python", ...)``."""
    if _numeric(pa, t):
        return ("tensor", _torch_dtype(t))
    if pa.types.is_fixed_size_list(t) and _numeric(pa, t.value_type):
        return ("fixed", _torch_dtype(t.value_type), t.list_size)
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _numeric(pa, t.value_type):
        return ("tensors", _torch_dtype(t.value_type))
    return ("python", str(_plain(pa, t)))


def _plain(pa: Any, t: Any) -> Any:
    """``t`` as its values read: no nullability, item names, dictionaries or large offsets."""
    if pa.types.is_dictionary(t):
        return _plain(pa, t.value_type)
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return pa.string() if pa.types.is_large_string(t) else pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_plain(pa, t.value_type))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_plain(pa, t.value_type), t.list_size)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(pa, f.type)) for f in t])
    return t


def merge_kinds(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The kind both columns fit in exactly (:func:`exact_dtype`), or None."""
    if a == b:
        return a
    if a[0] != b[0] or a[0] == "python" or a[2:] != b[2:]:
        return None
    dtype = exact_dtype(a[1], b[1])
    return None if dtype is None else (a[0], dtype, *a[2:])


_NULL, _EMPTY_LISTS = ("python", "null"), ("python", "list<item: null>")


def merge_file_kinds(a: tuple[Any, ...], b: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """:func:`merge_kinds`, where a column of nulls only fits any Python kind (its values
    are None) and one of empty lists (``list<null>``) any list kind."""
    for null, other in ((a, b), (b, a)):
        if null == _NULL and other[0] == "python":
            return other
        lists = other[0] == "tensors" or str(other[1]).startswith("list<")
        if null == _EMPTY_LISTS and lists:
            return other
    return merge_kinds(a, b)


def refuses_nulls(pa: Any, t: Any) -> bool:
    """Whether a column of type ``t`` is read as tensors (numbers, lists of numbers), which
    hold no null; other columns read a null as None."""
    lists = pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
    return _numeric(pa, t) or (lists and _numeric(pa, t.value_type))


def _to_tensor(values: Any, dtype: torch.dtype | None) -> torch.Tensor:
    # A writable copy: torch warns on (and must not write into) Arrow's read-only buffers.
    out = torch.from_numpy(np.array(values.to_numpy(zero_copy_only=False)))
    return out if dtype is None else out.to(dtype)


def _column(pa: Any, name: str, col: Any, where: str, dtype: torch.dtype | None) -> Any:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    t = col.type
    if dtype is not None and pa.types.is_list(t) and pa.types.is_null(t.value_type):
        # Empty lists where other files hold numbers (see merge_file_kinds): read as those.
        item = pa.from_numpy_dtype(torch.empty(0, dtype=dtype).numpy().dtype)
        col = col.cast(pa.list_(item))
        t = col.type
    numeric = _numeric(pa, t)
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
    fixed = pa.types.is_fixed_size_list(t)
    if refuses_nulls(pa, t) and col.null_count:
        raise ValueError(
            f"{where}: column {name!r} has {col.null_count} null value(s) in this batch; fill "
            "them in the data (e.g. pyarrow.compute.fill_null), or leave the column out."
        )
    if numeric:
        return _to_tensor(col, dtype)
    if (is_list or fixed) and _numeric(pa, t.value_type):
        values = col.flatten()  # honours the array's offset and slicing
        if values.null_count:
            raise ValueError(
                f"{where}: column {name!r} has null items inside its lists; fill them in the "
                "data, or leave the column out with columns=[...]."
            )
        flat = _to_tensor(values, dtype)
        if fixed:
            return flat.view(len(col), t.list_size)
        offsets = np.asarray(col.offsets, dtype=np.int64)
        return list(torch.split(flat, np.diff(offsets).tolist()))
    return col.to_pylist()


def table_columns(
    table: Any, where: str, dtypes: dict[str, torch.dtype] | None = None
) -> dict[str, Any]:
    """The columns of a ``pyarrow.Table`` as tensors or lists (``dtypes``: by column)."""
    pa = import_pyarrow()
    dtypes = dtypes or {}
    return {
        name: _column(pa, name, table.column(i), where, dtypes.get(name))
        for i, name in enumerate(table.column_names)
    }


def _exact_or_none(a: torch.dtype | None, b: torch.dtype) -> torch.dtype | None:
    return None if a is None else exact_dtype(a, b)


class Columns(Sequence[dict[str, Any]]):
    """``rows`` rows held by column (``data``: name -> tensor or list): a sequence of row
    dicts, or the batch itself; ``source`` names them in messages."""

    __slots__ = ("data", "rows", "source")

    def __init__(self, data: dict[str, Any], rows: int, source: str = "") -> None:
        self.data, self.rows, self.source = data, rows, source

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.rows))]
        return {name: col[index] for name, col in self.data.items()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self[i] for i in range(self.rows))

    def as_batch(self) -> dict[str, Any]:
        return dict(self.data)

    @staticmethod
    def scatter(parts: Sequence[Columns], where: Sequence[np.ndarray | None]) -> dict[str, Any]:
        """One batch from ``parts``, part ``k``'s rows at positions ``where[k]`` (None: all)."""
        if len(parts) == 1 and where[0] is None:
            return parts[0].as_batch()
        total = sum(p.rows for p in parts)
        out: dict[str, Any] = {}
        for name in parts[0].data:
            cols = [p.data[name] for p in parts]
            if all(isinstance(c, torch.Tensor) for c in cols):
                if len({c.shape[1:] for c in cols}) != 1:
                    raise ValueError(
                        f"column {name!r} has rows of shape "
                        f"{sorted({tuple(c.shape[1:]) for c in cols})} in different files; "
                        "the files' schemas must agree (rewrite them with one schema)."
                    )
                # One dtype whichever files a batch spans.
                dtype = functools.reduce(_exact_or_none, [c.dtype for c in cols])
                if dtype is None:
                    raise ValueError(
                        f"column {name!r} has dtypes {[str(c.dtype) for c in cols]} in "
                        f"{[p.source for p in parts]}, and no dtype holds all their values "
                        "exactly; write every file with one type for the column."
                    )
                merged = torch.empty((total, *cols[0].shape[1:]), dtype=dtype)
                bits = _SIGNED.get(dtype, dtype)  # torch cannot index_put these: their bits
                for col, w in zip(cols, where, strict=True):
                    merged.view(bits)[torch.from_numpy(np.asarray(w))] = col.to(dtype).view(bits)
                out[name] = merged
            else:
                items: list[Any] = [None] * total
                for col, w in zip(cols, where, strict=True):
                    for pos, item in zip(np.asarray(w).tolist(), col, strict=True):
                        items[pos] = item
                out[name] = items
        return out


def length_values(pa: Any, col: Any, where: str, name: str) -> np.ndarray:
    """Each row's token count: a list column's lengths, or an integer column's values."""
    t = col.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        col = pa.compute.list_value_length(col)
    elif not pa.types.is_integer(t):
        raise TypeError(
            f"{where}: length_column {name!r} is {t}; it must be a list column (token ids) or "
            "an integer column (lengths)."
        )
    if col.null_count:
        raise ValueError(
            f"{where}: length_column {name!r} has {col.null_count} null value(s); fill or "
            "filter them."
        )
    return np.asarray(col.to_numpy(zero_copy_only=False)).astype(np.int64, copy=False)
