"""A Hugging Face ``datasets.Dataset`` (or its Arrow files) as a batch-fetched dataset."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from loaderkit._checks import getitem_overridden, reads_overridden
from loaderkit.data._arrow import Columns, column_kind, import_pyarrow, length_values, table_columns
from loaderkit.data._fs import source_name
from loaderkit.data.lengths import check_own_lengths
from loaderkit.errors import require

__all__ = ["HFDataset"]


def _datasets() -> Any:
    return require("datasets", "HFDataset needs the Hugging Face library", "hf")


def _to_decode(features: Any, columns: list[str]) -> list[str]:
    from datasets.features.features import require_decoding

    return [c for c in columns if c in features and require_decoding(features[c])]


def _from_files(data: Any) -> Any:
    hf = _datasets()
    paths = [os.fspath(data)] if isinstance(data, str | os.PathLike) else list(data)
    for path in paths:
        if not isinstance(path, str | os.PathLike) or not os.fspath(path).endswith(".arrow"):
            raise ValueError(
                f"HFDataset: data must be .arrow file paths, got {path!r}; pass the "
                "data-*.arrow files of Dataset.save_to_disk, or a datasets.Dataset."
            )
        if not os.path.isfile(path):
            raise FileNotFoundError(f"HFDataset: Arrow file {path!r} does not exist.")
    parts = [hf.Dataset.from_file(os.fspath(p)) for p in paths]
    return parts[0] if len(parts) == 1 else hf.concatenate_datasets(parts)


def _pick_columns(data: Any, names: list[str], columns: Sequence[str] | None) -> list[str]:
    """The columns to read: ``columns``, else the dataset format's, else all; checked."""
    fmt = getattr(data, "format", None) or {}
    if fmt.get("type") == "custom":
        raise ValueError(
            "HFDataset: the dataset has a transform (set_transform / with_transform), which "
            "batched Arrow reads would skip; apply it in collate_fn, or call reset_format()."
        )
    if columns is None and fmt.get("columns"):
        # with_format(columns=...), in the order datasets gives a row.
        chosen = set(fmt["columns"])
        columns = [c for c in names if c in chosen]
        if fmt.get("output_all_columns"):
            columns += [c for c in names if c not in chosen]
    if columns is None:
        return names
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"HFDataset: columns must be a list of column names, got {columns!r}.")
    missing = [c for c in columns if c not in names]
    if missing or not columns:
        raise ValueError(
            f"HFDataset: columns {missing or columns!r} not in the dataset's columns {names}; "
            "pass names it has."
        )
    return list(columns)


def _torch_dtypes(data: Any, arrow: Any, columns: list[str]) -> dict[str, torch.dtype]:
    """The dtypes datasets' torch format gives numeric columns: int64, float32 (bool kept), or
    its ``dtype=``."""
    fmt = getattr(data, "format", None) or {}
    if fmt.get("type") != "torch":
        return {}
    options = dict(fmt.get("format_kwargs") or {})
    dtype = options.pop("dtype", None)
    if options:
        raise ValueError(
            f"HFDataset: the torch format's options {sorted(options)} are not applied (only "
            "dtype is); move or change batches in the loader or model, and drop them here."
        )
    pa, schema = import_pyarrow("hf"), arrow[:0].schema
    out = {}
    for name in set(columns) & set(fmt.get("columns") or columns):
        kind = column_kind(pa, schema.field(name).type)
        if kind[0] == "python":
            continue
        own = kind[1]
        wide = torch.float32 if own.is_floating_point else torch.int64
        out[name] = dtype or (own if own == torch.bool else wide)
    return out


class HFDataset(Dataset[dict[str, Any]]):
    """A ``datasets.Dataset`` or ``.arrow`` file(s), rows as dicts, fetched a batch at a time.

    Args:
        data: A ``datasets.Dataset``, an ``.arrow`` file's path, or a list of them (concatenated).
        columns: The columns to return, in order (default: the format's columns, else all).
        length_column: The column of each row's token count (a list or integer column).

    Numeric columns keep their Arrow dtype, or take the one ``with_format("torch")`` gives.

    Example:
        >>> import datasets
        >>> from loaderkit import PadCollate, ResumableDataLoader
        >>> hf = datasets.Dataset.from_dict({"ids": [[1, 2], [3], [4, 5, 6]], "y": [0, 1, 0]})
        >>> ds = HFDataset(hf, length_column="ids")
        >>> ds[2]["ids"].tolist(), ds.lengths().tolist()
        ([4, 5, 6], [2, 1, 3])
        >>> batch = ds.get_batch([2, 1])
        >>> batch["y"], [t.tolist() for t in batch["ids"]]
        (tensor([0, 1]), [[4, 5, 6], [3]])
        >>> loader = ResumableDataLoader(ds, batch_size=3, collate_fn=PadCollate())
        >>> next(iter(loader))["ids"].shape
        torch.Size([3, 3])
    """

    def __init__(
        self, data: Any, columns: Sequence[str] | None = None, *, length_column: str | None = None
    ) -> None:
        if isinstance(data, str | os.PathLike) or (
            isinstance(data, list | tuple) and data and isinstance(data[0], str | os.PathLike)
        ):
            data = _from_files(data)
        elif not (
            callable(getattr(data, "with_format", None))
            and callable(getattr(data, "__getitems__", None))
            and hasattr(data, "column_names")
        ):
            fix = (
                f"pass one split, e.g. data[{next(iter(data))!r}]"
                if isinstance(data, Mapping) and data
                else "load an IterableDataset (streaming=True) without streaming, or use "
                "loaderkit's streaming datasets"
            )
            raise TypeError(
                f"HFDataset: data must be a datasets.Dataset or .arrow file path(s), got "
                f"{type(data).__name__}; {fix}."
            )
        import_pyarrow("hf")
        names = list(data.column_names)
        self.columns = _pick_columns(data, names, columns)
        if length_column is not None and length_column not in names:
            raise ValueError(
                f"HFDataset: length_column={length_column!r} is not a column (the dataset has "
                f"{names}); pass the token-ids column, e.g. length_column='input_ids'."
            )
        self.dataset = data
        self.length_column = length_column
        files = [f["filename"] for f in getattr(data, "cache_files", None) or []]
        self._source_name = source_name(files) if files else None
        self._arrow = data.with_format("arrow", columns=self.columns)
        self._dtypes = _torch_dtypes(data, self._arrow, self.columns)
        # The Arrow read skips datasets' feature decoding (images, audio); a copy per access.
        self._features: Any = getattr(data, "features", None)
        self._decoded = [] if self._features is None else _to_decode(self._features, self.columns)

    def __len__(self) -> int:
        return len(self.dataset)

    def __repr__(self) -> str:
        return f"HFDataset({len(self)} rows, columns={self.columns})"

    def _columns(self, indices: Any) -> Columns:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (int(idx.min()) < -n or int(idx.max()) >= n):
            raise IndexError(f"HFDataset: indices {idx[:8]} out of range for {n} rows.")
        table = self._arrow[(idx % max(n, 1)).tolist()]
        data = table_columns(table, "HFDataset", self._dtypes)
        if list(data) != self.columns:
            data = {name: data[name] for name in self.columns}
        for name in self._decoded:
            data[name] = self._features.decode_column(data[name], name)
        return Columns(data, len(idx), "HFDataset")

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self._columns([int(index)])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The rows at ``indices`` as dicts, fetched in one call."""
        if getitem_overridden(self, "__getitems__"):
            return [self[int(i)] for i in indices]
        return list(self._columns(indices))

    def get_batch(self, indices: Any) -> dict[str, Any]:
        """The batch at ``indices``: column -> tensor, or list of 1-D tensors (lists)."""
        return self._columns(indices).as_batch()

    def kinds(self) -> dict[str, tuple[Any, ...]]:
        """What each column becomes in a batch (as :meth:`ParquetReader.kinds` says it)."""
        pa, schema = import_pyarrow("hf"), self._arrow[:0].schema
        kinds = {}
        for name in self.columns:
            kind = column_kind(pa, schema.field(name).type)
            if kind[0] != "python" and name in self._dtypes:
                kind = (kind[0], self._dtypes[name], *kind[2:])
            kinds[name] = kind
        return kinds

    def lengths(self) -> np.ndarray:
        """Each row's token count from ``length_column``; a subclass's longest and shortest
        rows are measured against it (``ValueError`` where they are longer)."""
        pa = import_pyarrow("hf")
        name = self.length_column
        if name is None:
            raise TypeError(
                "HFDataset: no length_column, so a row's token count is unknown; pass "
                "HFDataset(..., length_column='input_ids')."
            )
        col = self.dataset.with_format("arrow", columns=[name])[:].column(0)
        found = length_values(pa, col, "HFDataset", name)
        if reads_overridden(self, "lengths"):
            fix = "Pass loaderkit.compute_lengths(dataset, length_fn), or override lengths()."
            check_own_lengths(self, found, name, fix)
        return found
