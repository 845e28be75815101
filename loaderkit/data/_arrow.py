"""Arrow tables into tensors, a batch at a time (private to loaderkit.data).

Shared by :class:`~loaderkit.ParquetReader` and :class:`~loaderkit.HFDataset`,
so a batch has the same structure whichever of them read it: per column,

- numbers (integers, floats, booleans) -> one tensor, first dim the rows;
- ``list<number>`` (variable-length token ids) -> a list of 1-D tensors, views
  of one buffer (one conversion per column, no per-row Python); pad them with
  :class:`~loaderkit.PadCollate`;
- ``fixed_size_list<number>`` -> one ``(rows, size)`` tensor;
- anything else (strings, structs) -> a Python list.

pyarrow is imported only when a table is converted, so ``import loaderkit``
stays cheap; a missing pyarrow is a
:class:`~loaderkit.errors.MissingDependencyError` naming the extra.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from loaderkit.errors import MissingDependencyError

__all__ = ["Columns", "import_pyarrow", "table_columns"]


def import_pyarrow(extra: str = "parquet") -> Any:
    """``pyarrow`` (and its ``compute`` and ``parquet`` modules), or a
    :class:`MissingDependencyError` naming ``loaderkit[extra]``."""
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ImportError as exc:
        raise MissingDependencyError(
            f"reading Parquet or Arrow data needs pyarrow, which is not installed; install "
            f"the extra: pip install 'loaderkit[{extra}]'."
        ) from exc
    return pyarrow


def _numeric(pa: Any, t: Any) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


def _to_tensor(values: Any) -> torch.Tensor:
    # A writable copy: torch warns on (and must not write into) Arrow's read-only buffers.
    return torch.from_numpy(np.array(values.to_numpy(zero_copy_only=False)))


def _column(pa: Any, name: str, col: Any, where: str) -> Any:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    t = col.type
    numeric = _numeric(pa, t)
    is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
    fixed = pa.types.is_fixed_size_list(t)
    if (numeric or is_list or fixed) and col.null_count:
        raise ValueError(
            f"{where}: column {name!r} has {col.null_count} null value(s) in this batch; a "
            "tensor cannot hold them: fill them in the data (e.g. pyarrow.compute.fill_null), "
            "or leave the column out with columns=[...]."
        )
    if numeric:
        return _to_tensor(col)
    if (is_list or fixed) and _numeric(pa, t.value_type):
        values = col.flatten()  # honours the array's offset and slicing
        if values.null_count:
            raise ValueError(
                f"{where}: column {name!r} has null items inside its lists; fill them in the "
                "data, or leave the column out with columns=[...]."
            )
        flat = _to_tensor(values)
        if fixed:
            return flat.view(len(col), t.list_size)
        offsets = np.asarray(col.offsets, dtype=np.int64)
        return list(torch.split(flat, np.diff(offsets).tolist()))
    return col.to_pylist()


def table_columns(table: Any, where: str) -> dict[str, Any]:
    """The columns of a ``pyarrow.Table`` converted as the module docstring says."""
    pa = import_pyarrow()
    return {
        name: _column(pa, name, table.column(i), where) for i, name in enumerate(table.column_names)
    }


class Columns(Sequence[dict[str, Any]]):
    """A batch of rows held by column: a sequence of row dicts for a ``collate_fn``, or,
    unsplit, the collated batch itself (:meth:`as_batch`, :meth:`scatter`).

    Args:
        data: Column name -> a tensor (first dim the rows) or a list (one item per row).
        rows: The number of rows.
    """

    __slots__ = ("data", "rows")

    def __init__(self, data: dict[str, Any], rows: int) -> None:
        self.data = data
        self.rows = rows

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.rows))]
        return {name: col[index] for name, col in self.data.items()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self.rows):
            yield {name: col[i] for name, col in self.data.items()}

    def as_batch(self) -> dict[str, Any]:
        """The rows as one batch: column name -> tensor or list."""
        return dict(self.data)

    @staticmethod
    def scatter(parts: Sequence[Columns], where: Sequence[np.ndarray | None]) -> dict[str, Any]:
        """One batch from the column batches ``parts``, part ``k``'s rows going to the batch
        positions ``where[k]`` (``None``: the whole batch, in order)."""
        if len(parts) == 1 and where[0] is None:
            return parts[0].as_batch()
        total = sum(p.rows for p in parts)
        names = list(parts[0].data)
        out: dict[str, Any] = {}
        for name in names:
            cols = [p.data[name] for p in parts]
            if all(isinstance(c, torch.Tensor) for c in cols):
                if len({c.shape[1:] for c in cols}) != 1:
                    raise ValueError(
                        f"column {name!r} has rows of shape "
                        f"{sorted({tuple(c.shape[1:]) for c in cols})} in different files; "
                        "the files' schemas must agree (rewrite them with one schema)."
                    )
                # int32 in one file, int64 in another: one tensor of the promoted dtype,
                # the same batch structure whichever files a batch spans.
                dtype = functools.reduce(torch.promote_types, [c.dtype for c in cols])
                merged = torch.empty((total, *cols[0].shape[1:]), dtype=dtype)
                for col, w in zip(cols, where, strict=True):
                    merged[torch.from_numpy(np.asarray(w))] = col.to(dtype)
                out[name] = merged
            else:
                items: list[Any] = [None] * total
                for col, w in zip(cols, where, strict=True):
                    for pos, item in zip(np.asarray(w).tolist(), col, strict=True):
                        items[pos] = item
                out[name] = items
        return out
