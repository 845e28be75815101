"""Sharded datasets: many files, one plan, every sample exactly once across ranks and workers."""

from __future__ import annotations

import bisect
import operator
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict, Unpack

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from loaderkit._checks import (
    check_choice,
    check_index_path,
    check_int,
    check_suffixes,
    getitem_overridden,
    reads_overridden,
)
from loaderkit.collate import STACK_FIX, promoting_collate
from loaderkit.data._arrow import Columns
from loaderkit.data._code import settings_digest
from loaderkit.data._fs import is_url, source_name
from loaderkit.data._open import (
    OpenShards,
    loaderkit_reads,
    names_crc32,
    prepare_reader,
    resolve_shards,
    shard_name,
)
from loaderkit.data._shard_reads import RowSource, Sources, batch_read, own_rows, shard_lengths
from loaderkit.data._written import load_or_build_index
from loaderkit.data.index import IndexEntry, checked_count
from loaderkit.data.lengths import check_own_lengths, compute_lengths
from loaderkit.data.readers import OpenShard, ShardReader, out_of_files, sizes_now
from loaderkit.data.remote import RemoteCache, remote_source, shard_paths
from loaderkit.errors import (
    CollateError,
    MissingDependencyError,
    ReaderSettingError,
    ShardChangedError,
    ShardError,
)
from loaderkit.plan._bucket_order import int_lengths
from loaderkit.plan.bucket import BucketOptions
from loaderkit.plan.samplers import BucketBatchSampler, PlanBatchSampler
from loaderkit.plan.shard import DEFAULT_MIX, DEFAULT_WINDOW, ShardPlan

__all__ = ["ShardedDataset"]

_SKIP_SLOTS = 257  # skip counters: the main process and 256 workers, one writer each
_INT64 = np.dtype(np.int64)
_SKIPPED = object()  # a sample left out under on_error="skip" (None may be a sample)
_OWN_LENGTHS = "Pass length_fn= (a sample's token count), or override lengths()."


class OrderArgs(TypedDict, total=False):
    """A dataset's ``plan()`` keyword arguments, passed on by its ``batch_sampler``."""

    seed: int
    shuffle: bool
    drop_last: bool


class _PlanArgs(OrderArgs, total=False):
    window: int
    mix_shards: int


class ShardedDataset(Dataset[Any]):
    """A map-style dataset over shards of known sizes, with its own :class:`ShardPlan`.

    Global index ``i`` is sample ``i - offset[s]`` of shard ``s`` (shards as given, or a
    directory's by name, ``write_shards``' numbered by value); :meth:`batch_sampler` orders
    and splits them across ranks and workers.

    Args:
        shards: A directory (its files with the reader's suffixes), a list of paths, a list of
            objects the reader's ``count``/``open`` accept (counted here, no index), a folder
            URL, or a list of shard URLs (anything fsspec resolves).
        reader: The format, e.g. :class:`TokenReader`, or any :class:`ShardReader`.
        index: The shard index file (default: next to the first shard), written when absent,
            checked against every shard's size and mtime when present.
        on_error: ``"raise"``, or ``"skip"``: a sample that fails to read is counted in
            :attr:`skipped`, warned about, and replaced in its batch by the next readable
            sample no longer than it (by the shards' own lengths, which :meth:`lengths`
            gives a token budget; any length where none is), so batches keep their size
            and a budget holds (a changed shard, by its size, mtime or content hash, or a
            wrong reader setting raises all the same).
        max_open_shards: Shards each process keeps open (``None``: all).
        remote: For shards at URLs: a :class:`RemoteCache` (default ``RemoteCache()``).

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> from loaderkit import ResumableDataLoader, TokenReader, write_shards
        >>> reader = TokenReader(seq_len=4)
        >>> paths = write_shards(tempfile.mkdtemp(), [np.arange(8), np.arange(8, 20)], reader)
        >>> ds = ShardedDataset(paths, reader)
        >>> len(ds), ds.sizes, ds[2].tolist()
        (5, (2, 3), [8, 9, 10, 11])
        >>> loader = ResumableDataLoader(ds, batch_sampler=ds.batch_sampler(2, seed=0, window=2))
        >>> sorted(int(b[0]) // 4 for batch in loader for b in batch)
        [0, 1, 2, 3, 4]
    """

    def __init__(
        self,
        shards: str | os.PathLike[str] | Iterable[Any],
        reader: ShardReader,
        *,
        index: str | os.PathLike[str] | None = None,
        on_error: Literal["raise", "skip"] = "raise",
        max_open_shards: int | None = 128,
        remote: RemoteCache | None = None,
    ) -> None:
        if isinstance(reader, type):
            raise TypeError(
                f"ShardedDataset: reader is the class {reader.__name__}, not a reader; pass an "
                f"instance, e.g. reader={reader.__name__}(...)."
            )
        if not all(callable(getattr(reader, a, None)) for a in ("spec", "count", "open")):
            raise TypeError(
                f"ShardedDataset: reader must have spec(), count() and open(), got "
                f"{type(reader).__name__}; pass a ShardReader such as TokenReader."
            )
        if isinstance(shards, bytes | bytearray) or not isinstance(
            shards, str | os.PathLike | Iterable
        ):
            raise TypeError(
                f"ShardedDataset: shards must be a str path, URL or a list of them, got "
                f"{shards!r}; pass e.g. shards='data/shards' (bytes: os.fsdecode(path))."
            )
        check_choice("on_error", on_error, ("raise", "skip"), owner="ShardedDataset")
        if max_open_shards is not None:
            check_int("max_open_shards", max_open_shards, 1, owner="ShardedDataset")
        check_index_path(index, owner="ShardedDataset")
        preset = set(vars(self))  # a subclass's settings key its cached lengths
        self.reader = reader
        suffixes = check_suffixes("reader.suffixes", reader.suffixes, owner="ShardedDataset")
        self._remote = remote_source(shards, suffixes, remote, "ShardedDataset")
        if self._remote is not None:
            self._remote.ranged_ok = True
        self.shards: list[Any] = (
            resolve_shards(shards, reader, files=loaderkit_reads(reader, "open"))
            if self._remote is None
            else list(self._remote.shards)
        )
        self._source_name = self._mix_name(shards)  # how a mix of datasets names this one
        self.entries: list[IndexEntry] | None = None
        self.index_path: Path | None = None
        self.sizes: tuple[int, ...] = tuple(self._count(index))
        counts = np.asarray(self.sizes, dtype=np.int64)
        self._ends = np.cumsum(counts)
        self._starts = self._ends - counts
        self._end_list: list[int] = self._ends.tolist()
        self._start_list: list[int] = self._starts.tolist()
        self.on_error, self.max_open_shards = on_error, max_open_shards
        self._skips = torch.zeros(_SKIP_SLOTS, dtype=torch.int64)
        if on_error == "skip":
            self._skips.share_memory_()  # workers count into it; the main process reads it
        self._sources = Sources()
        self._files = OpenShards(
            self.shards,
            reader,
            self.sizes,
            self.entries,
            self.index_path,
            max_open=max_open_shards,
            remember_failures=on_error == "skip",
            fetch=None if self._remote is None else self._remote.local,
            ranged=None if self._remote is None else self._remote.open_ranged,
            pinned=[(x or {}).get("dtype") for x in self._extras()],
        )
        self._base_fields = (frozenset(vars(self)) - preset) | {"_base_fields"}
        # Decided once for all files (ParquetReader: merged dtypes), not per worker.
        self.reader = self._files.reader = prepare_reader(
            reader,
            self.shards,
            self._files.local_file if self._remote is None else self._remote.footer_source,
        )

    def _extras(self) -> list[dict[str, Any] | None]:
        """Each shard's index extras (compression, hash, pinned dtype), if it has an index."""
        if self._remote is not None:
            return list(self._remote.extras)
        return [e.extras for e in self.entries or ()]

    def _mix_name(self, shards: Any) -> str | None:
        if isinstance(shards, str | os.PathLike):
            return source_name(str(shards) if is_url(shards) else os.path.abspath(shards))
        if self._remote is not None or isinstance(self.shards[0], Path):
            files = self.shards if self._remote is None else [s.url for s in self._remote.shards]
            return source_name([str(f) for f in files])
        return None

    def _count(self, index: Any) -> list[int]:
        """Each shard's sample count: from the index (built if absent), or counted."""
        if self._remote is not None:
            return list(self._remote.count(self.reader, index))
        if isinstance(self.shards[0], Path):
            self.entries, self.index_path = load_or_build_index(
                self.shards, self.reader, None if index is None else Path(index)
            )
            return [e.samples for e in self.entries]
        if index is not None:
            raise ValueError("ShardedDataset: index= needs shard paths, got objects.")
        return [checked_count(self.reader, s, self.reader.count(s)) for s in self.shards]

    @property
    def names_crc32(self) -> int | None:
        """crc32 of the shard paths below their common folder (None: objects), for resumes."""
        paths = shard_paths(self.shards)
        return None if paths is None else names_crc32(paths)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __repr__(self) -> str:
        return f"ShardedDataset({len(self.shards)} shards, {len(self)} samples, {self.reader!r})"

    @property
    def opens(self) -> int:
        """Shards this process opened so far."""
        return self._files.opens

    def describe(self) -> dict[str, Any]:
        """Shards, samples and ``remote``: the cache's counts for shards at URLs, else None."""
        remote = None if self._remote is None else self._remote.stats()
        return {"shards": len(self.shards), "samples": len(self), "remote": remote}

    @property
    def skipped(self) -> int:
        """Samples skipped under ``on_error="skip"`` so far, by this process and its workers."""
        return int(self._skips.sum())

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard, sample in shard)`` of global ``index``."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"ShardedDataset: index {index} out of range for {n} samples.")
        index %= n
        shard = int(np.searchsorted(self._ends, index, side="right"))
        return shard, index - int(self._starts[shard])

    def _handle(self, shard: int) -> OpenShard:
        handle = self._files.get(shard)
        if self._files.opens != self._sources.opens:  # one may have been closed for it
            self._prune()
        return handle

    def __getitem__(self, index: int) -> Any:
        """Sample ``index``; under ``on_error="skip"`` one that fails to read is replaced as in
        a batch (a subclass's ``__getitem__`` reading through this one, ``batch_size=None``)."""
        shard, local = self.locate(operator.index(index))  # a float is no index
        if self.on_error == "skip":
            parts, where = self._gather([index])
            return self._samples(parts, where, [index])[0][0]
        try:
            return self._handle(shard).read(local)
        except (ShardError, MissingDependencyError, ReaderSettingError):
            raise
        except Exception as exc:
            raise self._read_error(shard, local, exc) from exc

    def _read_error(self, shard: int, local: int, exc: Exception) -> ShardError:
        return ShardError(
            f"reading sample {local} of shard {shard_name(self.shards[shard])} failed with "
            f"{type(exc).__name__}: {exc}; rewrite the shard (and delete the shard index), "
            "or pass on_error='skip'.",
            path=self.shards[shard],
        )

    def _skip(self, shard: int, count: int, exc: Exception) -> None:
        if isinstance(exc, ReaderSettingError | ShardChangedError) or out_of_files(exc.__cause__):
            raise exc  # no bad sample: a setting is wrong, the corpus changed, or out of files
        info = get_worker_info()
        slot = 0 if info is None else 1 + info.id % (_SKIP_SLOTS - 1)
        self._skips[slot] += count
        if shard not in self._files.warned:
            self._files.warned.add(shard)
            name = shard_name(self.shards[shard])
            warnings.warn(
                f"ShardedDataset(on_error='skip'): skipped {count} sample(s) of shard {name} "
                f"({type(exc).__name__}: {exc}), each replaced by the next readable sample "
                "no longer than it; further skips here are only counted (ShardedDataset.skipped).",
                RuntimeWarning,
                stacklevel=2,
            )

    def _read_group(self, shard: int, local: np.ndarray) -> Any:
        """Samples ``local`` of one shard: rows (array/tensor) or a list with ``_SKIPPED`` holes."""
        try:
            handle = self._handle(shard)
        except Exception as exc:
            if self.on_error == "raise":
                raise
            self._skip(shard, len(local), exc)
            return [_SKIPPED] * len(local)
        try:
            read_batch = batch_read(handle)
            if read_batch is not None:
                return read_batch(local)
            return [handle.read(i) for i in local.tolist()]
        except Exception as exc:
            if self.on_error == "raise":
                bad, one = self._first_failing(handle, local)
                if bad is None or one is None:  # not a sample's: the batch read itself failed
                    raise ShardError(
                        f"reading {len(local)} samples of shard {shard_name(self.shards[shard])} "
                        f"in one batch failed with {type(exc).__name__}: {exc}, though each "
                        "reads alone; lower batch_size (or free memory).",
                        path=self.shards[shard],
                    ) from exc
                if isinstance(one, ShardError | MissingDependencyError | ReaderSettingError):
                    raise one from None  # as __getitem__ raises it
                raise self._read_error(shard, bad, one) from one
        # Under "skip", a batched read failed: read one by one to leave out only the bad samples.
        out: list[Any] = []
        for i in local.tolist():
            try:
                out.append(handle.read(i))
            except Exception as exc:
                self._skip(shard, 1, exc)
                out.append(_SKIPPED)
        return out

    @staticmethod
    def _first_failing(handle: Any, local: np.ndarray) -> tuple[int | None, Exception | None]:
        """The first of ``local`` that fails to read alone, and its error (a batched read
        names none); ``(None, None)`` where each reads."""
        for i in local.tolist():
            try:
                handle.read(i)
            except Exception as one:
                return i, one
        return None, None

    def _gather(
        self, indices: Any, *, rows: bool = False
    ) -> tuple[list[Any], list[np.ndarray | None]]:
        """Per-shard reads of ``indices`` and their batch positions (None: all, in order)."""
        idx = indices
        if type(idx) is not np.ndarray or idx.dtype is not _INT64 or idx.ndim != 1:
            idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        # Fast path (a batch inside one shard): a short Python list beats numpy here.
        values = idx.tolist()
        if not values:
            return [], []
        if self._remote is not None:
            self._ahead(values[0])
        lo, hi = min(values), max(values)
        ends = self._end_list
        shard = bisect.bisect_right(ends, lo)
        if lo >= 0 and shard < len(ends) and hi < ends[shard]:
            local = idx - self._start_list[shard]
            got = self._rows_in(shard, local) if rows else None
            return [self._read_group(shard, local) if got is None else got], [None]
        if rows and lo >= 0 and hi < ends[-1]:
            across = self._rows_across(values)
            if across is not None:
                return [across], [None]
        n = len(self)
        if int(idx.min()) < -n or int(idx.max()) >= n:
            raise IndexError(
                f"ShardedDataset: indices out of range for {n} samples: {idx[:8]}; pass indices "
                f"in [-{n}, {n})."
            )
        idx = idx % n
        shard_of = np.searchsorted(self._ends, idx, side="right")
        local = idx - self._starts[shard_of]
        parts: list[Any] = []
        where: list[np.ndarray | None] = []
        for shard in sorted(set(shard_of.tolist())):  # a batch spans few shards: a short loop
            w = np.flatnonzero(shard_of == shard)
            parts.append(self._read_group(shard, local[w]))
            where.append(w)
        return parts, where

    def _ahead(self, first: int) -> None:
        """Shards at URLs: prefetch the next batches' shards, close those no longer read."""
        assert self._remote is not None
        keep = self._remote.note_batch(first, self._ends)
        if keep is not None:
            needed = set(keep)
            for shard in [s for s in self._files.open if s not in needed]:
                self._files.close(shard)
            self._prune()

    def _rows_in(self, shard: int, local: np.ndarray) -> np.ndarray | None:
        """Rows ``local`` of shard ``shard`` from its ``rows``, between two checks of its files'
        sizes; None where it has none or anything fails."""
        try:
            src = self._source(shard)
            rows, kind = src.rows, src.kind
            if rows is None or kind is None or sizes_now(src.sizers) != src.expected:
                return None
            got = rows.take(local, axis=0) if src.take else rows[local]
            if sizes_now(src.sizers) != src.expected:
                return None
        except Exception:
            return None
        return got if got.dtype == kind[1] else got.astype(kind[1])

    def _rows_across(self, values: list[int]) -> np.ndarray | None:
        """The batch at ``values`` (in range) as one array copied from the shards' ``rows``;
        None when a shard has none or anything fails."""
        ends, starts = self._end_list, self._start_list
        used: dict[int, np.ndarray] = {}
        picks: list[tuple[np.ndarray, int]] = []
        sizers: list[Callable[[], int]] = []
        expected: list[int] = []
        kind = None
        try:
            for g in values:
                shard = bisect.bisect_right(ends, g)
                rows = used.get(shard)
                if rows is None:
                    src = self._source(shard)
                    if src.rows is None or (kind is not None and src.kind is not kind):
                        return None
                    kind = src.kind
                    rows = used[shard] = src.rows
                    sizers += src.sizers
                    expected += src.expected
                picks.append((rows, g - starts[shard]))
            assert kind is not None
            # Sizes checked before the copy (a truncated map raises SIGBUS) and after it (zeros);
            # a change sends the batch to the per-shard path, which names the file.
            if sizes_now(sizers) != expected:
                return None
            out = np.empty((len(picks), *kind[0]), dtype=kind[1])
            for k, (rows, i) in enumerate(picks):
                out[k] = rows[i]
            if sizes_now(sizers) != expected:
                return None
        except Exception:
            # The per-shard path then raises or skips as on_error says.
            return None
        return out

    def _source(self, shard: int) -> RowSource:
        """Shard ``shard``'s row source, worked out once per opened handle."""
        handle = self._handle(shard)
        src = self._sources.get(shard)
        if src is not None and src.handle is handle:
            return src
        rows = own_rows(handle)
        kind = None
        if (
            not isinstance(rows, np.ndarray)
            or not hasattr(handle, "dtype")
            or getattr(handle, "narrowing", False)
        ):
            rows = None
        else:
            key = (rows.shape[1:], np.dtype(handle.dtype))
            kind = self._sources.kinds.setdefault(key, key)  # one object per kind: `is` compares
        # The guard's own sizes: an fstat on the map's descriptor (the file mapped).
        guard = None if rows is None else getattr(handle, "guard", None)
        sizers, expected = ([], []) if guard is None else (guard.sizers, guard.expected)
        take = rows is not None and rows.flags.c_contiguous
        src = RowSource(handle, rows, kind, list(sizers), list(expected), take)
        self._sources[shard] = src
        return src

    def _prune(self) -> None:
        """Forget the row sources of shards closed since (their maps go)."""
        live, sources = self._files.open, self._sources
        for shard in [s for s, src in sources.items() if live.get(s) is not src.handle]:
            del sources[shard]
        for shard in [s for s, (h, _) in sources.lengths.items() if live.get(s) is not h]:
            del sources.lengths[shard]
        sources.opens = self._files.opens

    def _samples(
        self, parts: list[Any], where: list[np.ndarray | None], indices: Any
    ) -> tuple[list[Any], list[int] | None]:
        """The batch's samples in order, each skipped one replaced (see :meth:`_substitute`),
        and the global indices they came from where one was skipped (else None)."""
        flat = np.asarray(indices, dtype=np.int64).reshape(-1) % max(len(self), 1)
        out: list[Any] = [_SKIPPED] * len(flat)
        for part, w in zip(parts, where, strict=True):
            rows = torch.from_numpy(part) if isinstance(part, np.ndarray) else part
            positions = range(len(flat)) if w is None else w.tolist()
            for pos, sample in zip(positions, rows, strict=True):
                out[pos] = sample
        holes = [pos for pos, sample in enumerate(out) if sample is _SKIPPED]
        if not holes:
            return out, None
        taken = flat.tolist()
        for pos in holes:
            taken[pos], out[pos] = self._substitute(taken[pos])
        return out, taken

    def _substitute(self, index: int) -> tuple[int, Any]:
        """A readable sample in a skipped ``index``'s place, and its index.

        Where its shard knows its samples' lengths: the first after it in that shard
        (wrapping) no longer than it, else that shard's shortest readable one, so a token
        budget planned on :meth:`lengths` holds (unless every readable sample of the shard is
        longer). Otherwise the next readable sample (global order, wrapping); :meth:`lengths`
        then reads through this same choice. Any sampler keeps its batch size.
        """
        shard, local = self.locate(index)
        lengths = self._known_lengths(shard)
        found = None if lengths is None else self._shortest_beside(shard, local, lengths)
        found = found or self._next_readable(index)
        if found is None:
            raise ShardError(
                f"sample {index} was skipped and no readable sample is left to take its place; "
                "restore the shards the warnings name."
            )
        return found

    def _shortest_beside(
        self, shard: int, local: int, lengths: np.ndarray
    ) -> tuple[int, Any] | None:
        """In ``shard``: the first readable sample after ``local`` (wrapping) no longer than
        it, else the shortest readable one; None if none reads."""
        count = len(lengths)
        order = (local + 1 + np.arange(count - 1)) % count  # the others, after it first
        longer = lengths[order] > lengths[local]
        # Those no longer than it in order, then the rest by length (stable: in order).
        order = np.concatenate(
            [order[~longer], order[longer][np.argsort(lengths[order][longer], kind="stable")]]
        )
        start, handle = int(self._ends[shard]) - count, self._handle(shard)
        for i in order.tolist():
            try:
                return start + i, handle.read(i)
            except Exception:
                continue  # counted (and warned) when its own turn comes
        return None

    def _next_readable(self, index: int) -> tuple[int, Any] | None:
        """The first sample after ``index`` (wrapping) that reads; None if none."""
        n, step = len(self), 1
        while step < n:
            g = (index + step) % n
            shard, local = self.locate(g)
            if shard in self._files.broken:
                step += int(self._ends[shard]) - g  # a shard that failed to open: past it
                continue
            try:
                return g, self._handle(shard).read(local)
            except Exception:
                step += 1  # counted (and warned) when its own turn comes
        return None

    def _known_lengths(self, shard: int) -> np.ndarray | None:
        """Shard ``shard``'s samples' lengths from its open handle's ``lengths()`` (once per
        handle); None where it has none or it fails."""
        try:
            handle = self._handle(shard)
        except Exception:
            return None
        known = self._sources.lengths.get(shard)
        if known is None or known[0] is not handle:
            try:
                got = np.asarray(handle.lengths(), dtype=np.int64)  # type: ignore[attr-defined]
            except Exception:
                got = None
            known = self._sources.lengths[shard] = (handle, got)
        return known[1]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, in order (through a subclass's own ``__getitem__``)."""
        if getitem_overridden(self, "__getitems__"):
            return [self[int(i)] for i in indices]
        parts, where = self._gather(indices)
        return self._samples(parts, where, indices)[0]

    def get_batch(self, indices: Any) -> Any:
        """The batch at ``indices``: stacked rows, a dict of columns, or default-collated."""
        parts, where = self._gather(indices, rows=True)
        if len(parts) == 1 and where[0] is None and isinstance(parts[0], np.ndarray):
            return torch.from_numpy(parts[0])
        if parts and all(isinstance(p, Columns) for p in parts):
            return Columns.scatter(parts, where)
        if parts and all(isinstance(p, np.ndarray) for p in parts):
            head = parts[0]
            same = all(p.dtype == head.dtype and p.shape[1:] == head.shape[1:] for p in parts)
            if same:
                rows = np.empty((sum(len(p) for p in parts), *head.shape[1:]), dtype=head.dtype)
                for part, w in zip(parts, where, strict=True):
                    rows[w] = part  # scattered straight to its batch positions
                return torch.from_numpy(rows)
        samples, taken = self._samples(parts, where, indices)
        if taken is not None and isinstance(samples[0], dict):
            # Read the batch's rows again, by column where they are, as a batch without skips.
            parts, where = self._gather(taken, rows=True)
            if all(isinstance(p, Columns) for p in parts):
                return Columns.scatter(parts, where)
        try:
            return promoting_collate(samples)
        except (RuntimeError, TypeError) as exc:
            raise CollateError(
                f"ShardedDataset: the samples of a batch cannot be stacked ({exc}); {STACK_FIX}.",
            ) from exc

    def plan(
        self,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        window: int = DEFAULT_WINDOW,
        mix_shards: int = DEFAULT_MIX,
        drop_last: bool = False,
    ) -> ShardPlan:
        """This dataset's :class:`ShardPlan` (the arguments are ShardPlan's)."""
        plan = ShardPlan(
            shard_sizes=self.sizes,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=check_int("seed", seed, 0, owner="ShardedDataset.plan", numpy_ok=True),
            window=window,
            mix_shards=mix_shards,
            drop_last=drop_last,
            shard_names_crc32=self.names_crc32,
        )
        return plan if self._remote is None else self._remote.observe(plan)

    def batch_sampler(
        self,
        batch_size: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        **plan: Unpack[_PlanArgs],
    ) -> PlanBatchSampler:
        """A batch sampler over :meth:`plan` (``plan``: its keyword arguments); ``rank`` and
        ``world_size`` default to ``torch.distributed``'s when the loader starts."""
        return PlanBatchSampler(self.plan(batch_size, **plan), rank=rank, world_size=world_size)

    def lengths(
        self,
        length_fn: Callable[[Any], int] | None = None,
        *,
        cache: str | os.PathLike[str] | None = None,
        progress: bool = False,
    ) -> np.ndarray:
        """Each sample's token count, in global index order (for token budgets).

        From the open shards' ``lengths()`` where they have one, else through
        :func:`~loaderkit.compute_lengths` (``length_fn``, ``cache``, ``progress``: its own).
        A subclass overriding ``__getitem__`` has its longest and shortest samples checked.

        Raises:
            TypeError: samples whose ``len()`` is no token count, without ``length_fn``.
            ValueError: a subclass's samples are longer than its shards say; pass
                ``length_fn`` or override ``lengths()``.
        """
        if length_fn is None:
            parts = []
            for shard in range(len(self.shards)):
                per_sample = shard_lengths(self._handle(shard))
                if per_sample is None:
                    break
                parts.append(per_sample())
            else:
                found = int_lengths(parts, "ShardedDataset.lengths")
                if reads_overridden(self, "lengths"):
                    field = getattr(self.reader, "length_column", None)
                    check_own_lengths(self, found, field, _OWN_LENGTHS)
                return found
        if cache is None:
            return compute_lengths(self, length_fn, progress=progress)
        # The cache key names the shards' content, so equal counts never share lengths.
        if self._remote is not None:
            remote, shards = self._remote, self._remote.shards
            known = [remote._digest(i) or s.version for i, s in enumerate(shards)]
            content = ";".join(f"{s.url}:{s.size}:{s.sidecars}" for s in shards) + f";{known}"
            if any(remote.versionless(i) for i in range(len(shards))):
                content += f";{remote.listing}"  # known within this listing only
        elif self.entries is not None:
            content = ";".join(f"{e.path}:{e.size}:{e.mtime_ns}" for e in self.entries)
        else:
            content = ";".join(shard_name(shard) for shard in self.shards)
        # The reader's and a subclass's code and settings shape the samples: they key it too.
        shaped = [settings_digest(self.reader), settings_digest(self, self._base_fields)]
        if None in shaped:
            warnings.warn(
                f"{type(self).__name__}.lengths: a setting of it or its reader does not "
                f"pickle, so it cannot key the cache; computing without {str(cache)!r}.",
                UserWarning,
                stacklevel=2,
            )
            return compute_lengths(self, length_fn, progress=progress)
        key = f"{len(self.shards)}|{len(self)}|{shaped}|{content}"
        return compute_lengths(self, length_fn, cache=cache, key=key, progress=progress)

    def bucket_batch_sampler(
        self,
        *,
        lengths: Any = None,
        shard_window: int = DEFAULT_WINDOW,
        mix_shards: int = DEFAULT_MIX,
        rank: int | None = None,
        world_size: int | None = None,
        **options: Unpack[BucketOptions],
    ) -> BucketBatchSampler:
        """Length-bucketed batches over these shards, fixed-size or under a token budget.

        A :class:`~loaderkit.BucketBatchSampler` over a :class:`~loaderkit.ShardBucketPlan`;
        ``lengths`` default to :meth:`lengths`, the other arguments are the sampler's.

        Example:
            >>> import tempfile
            >>> from loaderkit import PadCollate, ResumableDataLoader, TokenReader, write_shards
            >>> reader = TokenReader(eos=0)  # one sample per document, ending in token 0
            >>> docs = [[5, 5, 0, 6, 0, 7, 7, 7, 0], [8, 0, 9, 9, 0]]
            >>> ds = ShardedDataset(write_shards(tempfile.mkdtemp(), docs, reader), reader)
            >>> ds.lengths().tolist()
            [3, 2, 4, 2, 3]
            >>> sampler = ds.bucket_batch_sampler(max_tokens=6, mix_shards=2, seed=0)
            >>> loader = ResumableDataLoader(ds, batch_sampler=sampler, collate_fn=PadCollate())
            >>> sorted(len(b.lengths) for b in loader), sampler.plan.batch_mix(0).mean
            ([1, 2, 2], 1.6666666666666667)
        """
        sampler = BucketBatchSampler(
            self.lengths() if lengths is None else lengths,
            shard_sizes=self.sizes,
            mix_shards=mix_shards,
            shard_window=shard_window,
            rank=rank,
            world_size=world_size,
            **options,
        )
        sampler.shard_names_crc32 = self.names_crc32
        if self._remote is not None:
            sampler.plan = self._remote.observe(sampler.plan)
        return sampler
