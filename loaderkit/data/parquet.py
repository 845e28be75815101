"""Parquet files as shards: one file a shard, one row a sample, a row group the unit of reading."""

from __future__ import annotations

import contextlib
import copy
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loaderkit._checks import check_int
from loaderkit.data._arrow import (
    Columns,
    column_kind,
    import_pyarrow,
    length_values,
    merge_file_kinds,
    refuses_nulls,
    table_columns,
)
from loaderkit.data.readers import OpenShard, _missing
from loaderkit.errors import ShardChangedError, ShardError

__all__ = ["ParquetReader"]


class ParquetReader:
    """Parquet files as shards of rows.

    Args:
        columns: The columns to read (default: all). Every file must have them.
        length_column: The column of each row's token count: a list column's lengths, or
            an integer column's values as given (they must count every padded field).
        cache_row_groups: Decoded row groups each process keeps per open file.
        row_group_size: Rows per row group when :meth:`write` writes a file.
        schema: Column types :meth:`write` casts to (a ``pyarrow.Schema`` or a dict of
            column -> pyarrow type or its name, e.g. ``{"score": "float64"}``; a row or a
            file without a string column holds nulls there, a file without a number or list
            column is refused):
            else each file's types are inferred from its own rows, e.g. ``int64`` for a
            float column whose values in that file are all whole numbers.

    Samples are dicts ``{column: value}``; a batch is a dict of column -> tensor, or a list of
    1-D tensors for ``list<number>`` (pad them with ``PadCollate()``).

    Example:
        >>> import tempfile
        >>> from loaderkit import ShardedDataset, write_shards
        >>> reader = ParquetReader(row_group_size=2)
        >>> rows = [{"ids": [1, 2, 3], "y": 0}, {"ids": [4], "y": 1}, {"ids": [5, 6], "y": 0}]
        >>> paths = write_shards(tempfile.mkdtemp(), [rows[:2], rows[2:]], reader)
        >>> ds = ShardedDataset(paths, reader)
        >>> ds.sizes, ds[2]["ids"].tolist()
        ((2, 1), [5, 6])
        >>> batch = ds.get_batch([2, 0])
        >>> batch["y"], [t.tolist() for t in batch["ids"]]
        (tensor([0, 0]), [[5, 6], [1, 2, 3]])
    """

    suffixes: tuple[str, ...] = (".parquet", ".pq")

    def __init__(
        self,
        columns: list[str] | tuple[str, ...] | None = None,
        *,
        length_column: str | None = None,
        cache_row_groups: int = 4,
        row_group_size: int | None = None,
        schema: Any = None,
    ) -> None:
        if columns is not None:
            if isinstance(columns, str) or not isinstance(columns, list | tuple):
                raise TypeError(
                    f"ParquetReader: columns must be a list of column names or None, got "
                    f"{columns!r}; pass e.g. columns=['input_ids', 'label']."
                )
            if not columns or not all(isinstance(c, str) for c in columns):
                raise ValueError(
                    f"ParquetReader: columns must be a non-empty list of names, got {columns!r}; "
                    "pass e.g. columns=['input_ids'], or None for all."
                )
            if len(set(columns)) != len(columns):
                raise ValueError(f"ParquetReader: columns lists a name twice: {columns!r}.")
        if length_column is not None and not isinstance(length_column, str):
            got = f"got {length_column!r}"
            raise TypeError(f"ParquetReader: length_column must be a column name or None, {got}.")
        fix = "pass decoded row groups to keep per file, e.g. 4"
        check_int("cache_row_groups", cache_row_groups, 1, owner="ParquetReader", fix=fix)
        if row_group_size is not None:
            fix = "pass rows per row group, e.g. 8192, or None"
            check_int("row_group_size", row_group_size, 1, owner="ParquetReader", fix=fix)
        self.columns = None if columns is None else list(columns)
        self.length_column = length_column
        self.cache_row_groups = cache_row_groups
        self.row_group_size = row_group_size
        if schema is not None:
            pa = import_pyarrow()
            try:
                schema = schema if isinstance(schema, pa.Schema) else pa.schema(schema)
            except (TypeError, ValueError, KeyError) as exc:
                raise TypeError(
                    f"ParquetReader: schema must be a pyarrow.Schema or a dict of column -> "
                    f"pyarrow type, got {schema!r}; pass e.g. schema={{'score': 'float64'}}."
                ) from exc
        self.schema = schema
        # Column -> (batch kind, [(Arrow type, its first file)]), and the first file's names.
        self._kinds: dict[str, tuple[tuple[Any, ...], list[tuple[str, str]]]] = {}
        self._names: tuple[list[str], str] | None = None
        self._prepared = False

    def __repr__(self) -> str:
        return f"ParquetReader(columns={self.columns!r}, length_column={self.length_column!r})"

    def spec(self) -> dict[str, Any]:
        return {"kind": "parquet"}  # schema only shapes writes: any ParquetReader reads them

    def _file(self, source: Any, name: str | None = None) -> Any:
        """``source`` (a path, or a file object holding the footer) as a ``ParquetFile``."""
        pa = import_pyarrow()
        name = str(source) if name is None else name
        if isinstance(source, Path) and not source.exists():
            raise _missing(source)
        try:
            return pa.parquet.ParquetFile(source)
        except (OSError, ValueError, pa.ArrowException) as exc:
            msg = f"shard {name!r} is not a readable Parquet file ({exc}); rewrite it (and "
            msg += "delete the shard index)."
            raise ShardError(msg, path=name) from exc

    def prepare(self, files: Sequence[tuple[str, Any]]) -> ParquetReader:
        """A copy of this reader for exactly ``files``: every file's footer read, column
        types checked across them and the merged dtypes decided (datasets call it once).

        Args:
            files: ``(name, source)`` per file: its name in messages, and its local path
                or a file object holding at least its footer.

        Raises:
            ShardError: a file is unreadable, lacks a column, has other column names
                (``columns=None``), or types a column in a way no common dtype holds.
        """
        prepared = copy.copy(self)
        prepared._kinds, prepared._names, prepared._prepared = {}, None, False
        for name, source in files:
            file = prepared._file(source, name)
            prepared._agree(name, file.schema_arrow, _num_rows(file.metadata, name))
        prepared._prepared = True
        return prepared

    def _agree(self, where: str, schema: Any, rows: int) -> list[str]:
        """The columns to read from the file ``where``, checked against the files before."""
        names = schema.names
        wanted = list(self.columns if self.columns is not None else names)
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # pyarrow cannot tell them apart
            raise ShardError(
                f"shard {where!r} has column(s) {twice} twice; write it with unique column names.",
                path=where,
            )
        if not rows:  # adds no values of any type (write_shards writes [] with no columns)
            return wanted
        missing = [c for c in wanted if c not in names]
        if missing:
            raise ShardError(
                f"shard {where!r} has no column(s) {missing} (it has {names}); pass columns "
                "that every file has.",
                path=where,
            )
        if self.columns is None:
            if self._names is None:
                self._names = (list(names), where)
            if sorted(self._names[0]) != sorted(names):
                raise ShardError(
                    f"ParquetReader: {where!r} has columns {sorted(names)} but "
                    f"{self._names[1]!r} has {sorted(self._names[0])}, so batches would differ in "
                    "their columns; pass columns= that every file has, or write every file "
                    "with the same columns.",
                    path=where,
                )
            wanted = list(self._names[0])  # the first file's order: every batch's keys alike
        for name in wanted:
            self._merge(where, name, schema.field(name).type)
        return wanted

    def _merge(self, where: str, name: str, t: Any) -> None:
        """Merge column ``name`` (Arrow type ``t`` in ``where``) into the files' kind so far."""
        kind = column_kind(import_pyarrow(), t)
        seen = self._kinds.get(name)
        if seen is None:
            self._kinds[name] = (kind, [(str(t), where)])
            return
        merged = merge_file_kinds(seen[0], kind)
        if merged is None:
            why = "no type holds the values of both exactly"
            if "fixed" in (kind[0], seen[0][0]) and {kind[0], seen[0][0]} <= {"fixed", "tensors"}:
                why = "loaderkit does not merge fixed-size lists with lists of another size"
            raise ShardError(
                f"ParquetReader: column {name!r} is {t} in {where!r} but {_merged_text(seen)}, "
                f"and {why}; write every file with one type "
                f"for {name!r} (write_shards: ParquetReader(schema=...)), or leave it out "
                "with columns=[...].",
                path=where,
            )
        if merged != seen[0] and self._prepared:
            raise ShardError(
                f"ParquetReader: column {name!r} is {t} in {where!r}, which {seen[0][1]}, "
                "decided from the files when the dataset was built, does not hold: the "
                "file changed since; build the dataset again (and delete the shard index).",
                path=where,
            )
        sources = seen[1]
        if all(text != str(t) for text, _ in sources):
            sources = [*sources, (str(t), where)]
        self._kinds[name] = (merged, sources)

    def dtypes(self, columns: list[str]) -> dict[str, Any]:
        """The merged torch dtype of each numeric column of ``columns``."""
        return {
            name: kind[1]
            for name, (kind, _) in self._kinds.items()
            if name in columns and kind[0] != "python"
        }

    def kinds(self) -> dict[str, tuple[Any, ...]]:
        """What each column becomes in a batch, as :meth:`prepare` settled it."""
        return {name: kind for name, (kind, _) in self._kinds.items()}

    def count(self, path: Path) -> int:
        """Rows in the file, from its footer (no data page is read)."""
        return _num_rows(self._file(Path(path)).metadata, str(path))

    def open(self, path: Path) -> OpenShard:
        """Read the footer and check the columns."""
        path = Path(path)
        identity = _file_identity(path)  # before opening: a file replaced meanwhile is refused
        return _ParquetShard(path, self, self._file(path), identity)

    def _column(self, pa: Any, key: Any, values: Sequence[Any], path: Path) -> Any:
        """Column ``key`` of Python ``values``, typed as ``schema=`` says where it names it."""
        named = self.schema is not None and key in self.schema.names
        try:
            column = pa.array(values)  # inferred, then cast (checked) to schema=
            if not named and _str_as_bytes(pa, column.type, values):
                raise pa.ArrowTypeError("str beside bytes, read back as bytes")
            return column
        except (pa.ArrowException, OverflowError) as exc:
            t = self.schema.field(key).type if named else None
            if isinstance(exc, OverflowError) and t is not None and pa.types.is_integer(t):
                with contextlib.suppress(pa.ArrowException, OverflowError):
                    return pa.array(values, type=t)  # beyond int64: exact, or it raises
            array = next((v for v in values if hasattr(v, "tolist") and not np.isscalar(v)), None)
            if array is not None:  # a tensor or ndarray, which Arrow's inference does not take
                raise TypeError(
                    f"ParquetReader.write: column {key!r} of {path.name!r} holds "
                    f"{type(array).__name__} values; convert them to Python values "
                    "(value.tolist())."
                ) from exc
            example = {key: "uint64" if isinstance(exc, OverflowError) else "string"}
            raise TypeError(
                f"ParquetReader.write: column {key!r} of {path.name!r} holds values of no one "
                f"Arrow type ({type(exc).__name__}: {exc}); give its rows one type, or name "
                f"its type in schema=, e.g. schema={example!r}."
            ) from exc

    def _given(self, pa: Any, key: Any, values: Any, path: Path) -> Any:
        """A dict of columns' column: an Arrow array or one with a dtype (numpy, pandas) as it
        is, else Python values (a list, tuple, object array) as :meth:`_column`."""
        dtype = getattr(values, "dtype", None)  # numpy's, pandas' (nulls, categories) as given
        typed = dtype is not None and dtype != np.dtype(object)
        if typed or isinstance(values, pa.Array | pa.ChunkedArray):
            return values
        return self._column(pa, key, list(values), path)

    def write(self, path: Path, data: Any) -> Path:
        """Write ``data`` (a Table, dict of columns, DataFrame or row dicts) as Parquet."""
        pa = import_pyarrow()
        path = Path(path)
        if isinstance(data, pa.Table):
            table = data
        elif isinstance(data, dict):  # Python values as rows' columns are; typed arrays as they are
            table = pa.table({k: self._given(pa, k, v, path) for k, v in data.items()})
        elif isinstance(data, list | tuple):
            # Columns from every row's keys (from_pylist takes row 0's and drops the others);
            # a row without a key holds a null there.
            odd = next((i for i, row in enumerate(data) if not isinstance(row, dict)), None)
            if odd is not None:
                raise TypeError(
                    f"ParquetReader.write: row {odd} of {path.name!r} is a "
                    f"{type(data[odd]).__name__}, not a dict; pass a list of row dicts."
                )
            keys = list(dict.fromkeys(key for row in data for key in row))
            table = pa.table({k: self._column(pa, k, [r.get(k) for r in data], path) for k in keys})
        elif hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas
            # A named index is data (set_index("doc_id")); an unnamed one (filtered rows) not.
            named = any(name is not None for name in data.index.names)
            table = pa.Table.from_pandas(data, preserve_index=named)
        else:
            raise TypeError(
                f"ParquetReader.write: data must be a pyarrow.Table, a dict of columns, a "
                f"pandas DataFrame or a list of row dicts, got {type(data).__name__}."
            )
        for field in self.schema or ():
            if field.name not in table.column_names:
                t = field.type
                # A sparse column this file's rows lack is nulls, as a row without it is; a
                # column read as tensors cannot read a null back (nor can a misspelt name).
                if refuses_nulls(pa, t):
                    raise ValueError(
                        f"ParquetReader(schema=...) names {t} column {field.name!r}, which no "
                        f"row of {path.name!r} has (it has {table.column_names}); fix the name, "
                        "or give every row a value."
                    )
                table = table.append_column(field, pa.nulls(len(table), t))
                continue
            i = table.column_names.index(field.name)
            try:
                cast = table.column(i).cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(
                    f"ParquetReader(schema=...) cannot cast column {field.name!r} of "
                    f"{path.name!r} to {field.type} ({exc}); pass a schema= type that holds "
                    "its values, e.g. float64."
                ) from exc
            changed = _changed_value(pa, table.column(i), cast)
            if changed is not None:
                raise ValueError(
                    f"ParquetReader(schema=...) cannot hold value {changed!r} of column "
                    f"{field.name!r} in {path.name!r} as {field.type} (it would change); pass "
                    "a schema= type that holds its values, e.g. float64."
                )
            table = table.set_column(i, field.name, cast)
        pa.parquet.write_table(table, path, row_group_size=self.row_group_size)
        return path


def _str_as_bytes(pa: Any, t: Any, values: Sequence[Any]) -> bool:
    """Whether a ``str`` among Python ``values`` lands in a binary field of their inferred
    type ``t`` (Arrow's choice for str beside bytes), at any depth of lists and structs."""
    if "binary" not in str(t):
        return False
    if pa.types.is_binary(t):
        return any(isinstance(v, str) for v in values)
    if pa.types.is_list(t):
        return _str_as_bytes(pa, t.value_type, [x for v in values if v is not None for x in v])
    if pa.types.is_struct(t):
        rows = [v for v in values if isinstance(v, dict)]
        return any(_str_as_bytes(pa, f.type, [r.get(f.name) for r in rows]) for f in t)
    return False


def _changed_value(pa: Any, before: Any, after: Any) -> Any:
    """The first value Arrow's checked cast changed anyway (an int a float16 cannot hold, a
    finite float cast to inf, a number other than 0 or 1 cast to bool), else None."""
    import pyarrow.compute as pc

    while (
        pa.types.is_list(before.type)
        or pa.types.is_large_list(before.type)
        or (pa.types.is_fixed_size_list(before.type))
    ):
        before, after = pc.list_flatten(before), pc.list_flatten(after)
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean)
    if not any(t(before.type) for t in numeric) or not any(t(after.type) for t in numeric[1:]):
        return None
    valid = pc.is_valid(before)
    was = before.filter(valid).to_numpy(zero_copy_only=False)
    now = after.filter(valid).to_numpy(zero_copy_only=False).astype(np.float64)
    if pa.types.is_boolean(after.type):
        bad = (was != 0) & (was != 1)
    elif pa.types.is_floating(before.type):
        bad = np.isfinite(was) & ~np.isfinite(now)
    else:
        bad = was != now
    where = np.flatnonzero(bad)
    return was[where[0]].item() if where.size else None


def _merged_text(seen: tuple[tuple[Any, ...], list[tuple[str, str]]]) -> str:
    kind, sources = seen
    if len(sources) == 1:
        return f"{sources[0][0]} in {sources[0][1]!r}"
    dtype = str(kind[1]).removeprefix("torch.")
    text = {"tensors": f"list<{dtype}>", "fixed": f"fixed_size_list<{dtype}>"}.get(kind[0], dtype)
    parts = ", ".join(f"{t} in {where!r}" for t, where in sources)
    return f"{text} in the files before it (merged from {parts})"


def _num_rows(meta: Any, where: str) -> int:
    """The file's rows as its row groups hold them, refused unless its footer's total agrees."""
    groups = sum(meta.row_group(i).num_rows for i in range(meta.num_row_groups))
    if groups != meta.num_rows:
        raise ShardError(
            f"Parquet shard {where!r} says it holds {meta.num_rows} rows, but its row groups "
            f"hold {groups}: the file is damaged; rewrite it (and delete the shard index).",
            path=where,
        )
    return int(groups)


def _file_identity(path: Path) -> tuple[int, int, int] | None:
    """The file's inode, size and mtime (None if it is missing)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class _ParquetShard:
    """One Parquet file opened in one process, with a cache of decoded row groups."""

    def __init__(
        self, path: Path, reader: ParquetReader, file: Any, identity: tuple[int, int, int] | None
    ) -> None:
        self.path = path
        self.reader = reader
        self._file_obj = file
        self._identity = identity
        self._pid = os.getpid()
        meta = file.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self.ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
        self.starts = self.ends - np.asarray(sizes, dtype=np.int64)
        self.num_rows = _num_rows(meta, str(path))
        self.names = file.schema_arrow.names
        self.columns = reader._agree(str(path), file.schema_arrow, self.num_rows)
        self._dtypes = reader.dtypes(self.columns)
        self._cache: OrderedDict[int, Any] = OrderedDict()
        self.decoded = 0  # row groups decoded

    def __len__(self) -> int:
        return self.num_rows

    def _where(self) -> str:
        return f"Parquet shard {str(self.path)!r}"

    def _handle(self) -> Any:
        """The open file, refused if rewritten in place (or, in a forked worker that reopens it
        by path, replaced): its rows would mix with those read before."""
        now = _file_identity(self.path)
        forked = os.getpid() != self._pid
        same_inode = now is not None and self._identity is not None and now[0] == self._identity[0]
        if now != self._identity and (forked or same_inode):
            raise ShardChangedError(
                f"{self._where()} was replaced or rewritten after it was opened, so its rows "
                "would mix two files; restart the run (and delete the shard index if its "
                "content changed).",
                path=self.path,
            )
        if forked:  # open its own file, own cache
            self._file_obj = self.reader._file(self.path)
            self._cache = OrderedDict()
            self._pid = os.getpid()
        return self._file_obj

    def _row_group(self, group: int) -> Any:
        cached = self._cache.get(group) if os.getpid() == self._pid else None
        if cached is not None:
            self._cache.move_to_end(group)
            return cached
        table = self._handle().read_row_group(group, columns=self.columns, use_threads=False)
        if self.columns is not None:  # "a.b" also names field b of a struct column "a"
            table = table.select(self.columns)
        self.decoded += 1
        self._cache[group] = table
        while len(self._cache) > self.reader.cache_row_groups:
            self._cache.popitem(last=False)
        return table

    def read_batch(self, indices: Any) -> Columns:
        """Rows ``indices`` (in the file), by column: each row group read once, one take."""
        pa = import_pyarrow()
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.num_rows):
            raise IndexError(f"{self._where()}: rows {idx[:8]} out of range for {self.num_rows}.")
        group_of = np.searchsorted(self.ends, idx, side="right")
        groups = sorted(set(group_of.tolist()))
        # The row groups end to end (no copy); each row's position in that concatenation.
        tables = [self._row_group(g) for g in groups]
        base = np.zeros(int(group_of.max()) + 1, dtype=np.int64)
        offset = 0
        for g, t in zip(groups, tables, strict=True):
            base[g] = offset - int(self.starts[g])
            offset += t.num_rows
        local = idx + base[group_of]
        taken = pa.concat_tables(tables).take(pa.array(local, type=pa.int64()))
        columns = table_columns(taken, self._where(), self._dtypes)
        return Columns(columns, len(idx), self._where())

    def read(self, index: int) -> dict[str, Any]:
        return self.read_batch(np.asarray([index]))[0]

    def lengths(self) -> np.ndarray:
        """Each row's token count from ``length_column`` (that column read alone)."""
        pa = import_pyarrow()
        name = self.reader.length_column
        if name is None:
            raise TypeError(
                f"{self._where()}: ParquetReader has no length_column, so a row's token count "
                "is unknown; pass ParquetReader(length_column='input_ids')."
            )
        if not self.num_rows:
            return np.empty(0, dtype=np.int64)
        if name not in self.names:
            msg = f"{self._where()} has no length_column {name!r} (it has {self.names}); pass "
            msg += "the column whose list lengths are the token counts."
            raise ShardError(msg, path=self.path)
        col = self._handle().read(columns=[name], use_threads=False).column(name)
        return length_values(pa, col, self._where(), name)
