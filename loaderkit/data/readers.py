"""Shard readers: how one file becomes a sequence of samples.

A reader is a small stateless object for one format: it counts a shard's
samples once, opens it in each process (a memory map: no file position, safe
across ``fork``) and writes shards for :func:`~loaderkit.write_shards`. Offsets
sidecars: docs/design.md, sharded and streaming datasets.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided

from loaderkit._atomic import atomic_write
from loaderkit._checks import check_bool, check_int
from loaderkit.errors import MissingShardError, ShardError

__all__ = [
    "OpenShard",
    "ShardReader",
    "TokenReader",
]

# Elements scanned per step when counting, so counting a shard stays in bounded memory.
_CHUNK = 1 << 26
# Files loaderkit writes next to shards: never listed as shards themselves.
OFFSETS_SUFFIX = ".lkoffsets"
DTYPE_SUFFIX = ".lkdtype"
OWN_SUFFIXES = (OFFSETS_SUFFIX, DTYPE_SUFFIX)


@runtime_checkable
class OpenShard(Protocol):
    """One shard opened for reading in one process (example: :class:`ShardReader`).

    ``read_batch(indices)`` is optional: a reader that can read many samples in
    one call (one fancy-indexing read of a memory map) returns either a list of
    samples or an array / tensor whose first dimension is the samples, which
    :class:`~loaderkit.data.sharded.ShardedDataset` then passes on without
    splitting. ``close()`` is optional too. A shard of fixed-shape samples may
    also have ``rows``, an array whose row ``i`` is sample ``i`` as stored (a
    view of the map: it is only read), and ``dtype``, the numpy dtype
    ``read_batch`` returns: a batch that spans shards (as a mixing plan's do)
    is then built by copying each row straight into it, instead of one gather
    and scatter per shard. ``lengths()``, each sample's token count without
    reading the samples, serves :meth:`~loaderkit.ShardedDataset.lengths`
    (token budgets).
    """

    def __len__(self) -> int:
        """Number of samples in the shard."""
        ...

    def read(self, index: int) -> Any:
        """Sample ``index`` (``0 <= index < len(self)``) of the shard."""
        ...


@runtime_checkable
class ShardReader(Protocol):
    """What :class:`~loaderkit.data.sharded.ShardedDataset` needs to know about a format.

    Attributes:
        suffixes: File suffixes of this format, used to list a directory of
            shards and to name the shards :func:`~loaderkit.write_shards`
            writes (the first one).

    A reader must be picklable (workers receive a copy) and its methods pure:
    ``spec()`` lists every setting that changes how many samples a shard has,
    and is stored in the shard index, so an index counted under other settings
    is never used.

    Optional: ``prepare(files) -> reader``, called once when a dataset is
    built with ``(name, source)`` for each of its shards (``source``: a local
    path, or for a shard at a URL a file object holding its Parquet footer),
    returns the reader the dataset and its workers read with: what must hold
    across all files (:meth:`~loaderkit.ParquetReader.prepare`: column types)
    is decided there, never by one process from the files it opened.

    Example:
        A reader of text files, one sample per line (``open`` returns a list
        with a ``read`` method: all :class:`OpenShard` asks for):

        >>> import tempfile
        >>> from loaderkit import ShardedDataset
        >>> class Lines(list):
        ...     def read(self, i):
        ...         return self[i]
        >>> class LinesReader:
        ...     suffixes = (".txt",)
        ...     def spec(self):
        ...         return {"kind": "txt-lines"}
        ...     def count(self, path):
        ...         return len(path.read_text().splitlines())
        ...     def open(self, path):
        ...         return Lines(path.read_text().splitlines())
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "a.txt").write_text("x\\ny\\n"), (d / "b.txt").write_text("z\\n")
        >>> ds = ShardedDataset(d, LinesReader())
        >>> ds.sizes, ds[2], ds.__getitems__([2, 0])
        ((2, 1), 'z', ['z', 'x'])
    """

    @property
    def suffixes(self) -> tuple[str, ...]:
        """File suffixes of the format (a class attribute is fine)."""
        ...

    def spec(self) -> dict[str, Any]:
        """JSON-able settings that change a shard's sample count."""
        ...

    def count(self, shard: Any) -> int:
        """The number of samples in ``shard`` (a ``Path``, or the object given as a shard).

        Called once per shard when the index is built; may scan the shard and
        write a sidecar next to it.
        """
        ...

    def open(self, shard: Any) -> OpenShard:
        """Open ``shard`` for reading in this process (called at most once per process,
        within the ``max_open_shards`` bound)."""
        ...


# ----------------------------------------------------------------- helpers
def _missing(path: Path, what: str = "shard") -> MissingShardError:
    return MissingShardError(
        f"{what} file {str(path)!r} does not exist; restore it, or rebuild the shard list "
        "and delete the shard index so it is counted again.",
        path=path,
    )


def _offsets_path(path: Path, tag: str) -> Path:
    return path.with_name(f"{path.name}{tag}{OFFSETS_SUFFIX}")


def _write_offsets(path: Path, tag: str, offsets: np.ndarray) -> None:
    target = _offsets_path(path, tag)
    try:
        # Atomic, under a unique temporary name: DDP ranks (or threads) may count the
        # same shard at once, and they write the same content.
        atomic_write(target, lambda f: np.save(f, offsets.astype(np.int64, copy=False)))
    except OSError as exc:
        raise ShardError(
            f"cannot write the offsets sidecar {str(target)!r} of shard {str(path)!r} ({exc}); "
            "its directory must be writable when the shard is first counted (index the data "
            "once where it is writable, e.g. with write_shards, then copy it with mtimes kept).",
            path=target,
        ) from exc


def _read_offsets(path: Path, tag: str, length: int) -> np.ndarray:
    side = _offsets_path(path, tag)
    try:
        offsets: np.ndarray = _map_npy(side)
    except FileNotFoundError:
        raise _missing(side, "offsets sidecar") from None
    except (ValueError, OSError) as exc:
        raise ShardError(
            f"offsets sidecar {str(side)!r} is unreadable ({exc}); delete it and the shard "
            "index so the shard is counted again.",
            path=side,
        ) from exc
    if offsets.ndim != 1 or len(offsets) < 1 or int(offsets[-1]) != length:
        raise ShardError(
            f"offsets sidecar {str(side)!r} does not match shard {str(path)!r} (it ends at "
            f"{int(offsets[-1]) if offsets.ndim == 1 and len(offsets) else '?'}, the shard "
            f"has length {length}): the shard changed after it was counted; delete the "
            "sidecar and the shard index so it is counted again.",
            path=path,
        )
    return offsets


def _map_npy(path: Path) -> np.ndarray:
    """``np.load(path, mmap_mode="r")``, refusing a file that changes while it is mapped."""
    before = path.stat()
    arr: np.ndarray = np.load(path, mmap_mode="r")
    _check_mapped_size(path, arr, before.st_size)
    return arr


def _map_raw(path: Path, dtype: np.dtype) -> np.ndarray:
    before = path.stat()
    arr: np.ndarray = np.memmap(path, dtype=dtype, mode="r")
    _check_mapped_size(path, arr, before.st_size)
    return arr


def _check_mapped_size(path: Path, arr: np.ndarray, size: int) -> None:
    now = MappedFiles.size_of(path, arr)
    if now != size:
        raise _changed(path, now, size)


def _changed(path: Path, now: int, size: int) -> ShardError:
    return ShardError(
        f"file {str(path)!r} changed while it was memory-mapped: it is {now} bytes now, "
        f"{size} when it was mapped; restore the file (or rewrite the shards and delete "
        "their index), then restart the run.",
        path=path,
    )


class MappedFiles:
    """The memory maps an open shard reads, checked before and after every read.

    A file truncated under a live mapping reads as zeros, or kills the process
    with SIGBUS: each read checks every mapped file's size (``fstat``) before
    and after copying, and refuses a changed file with a :class:`ShardError`
    naming it. A truncation inside the copy itself is a SIGBUS, reported in a
    DataLoader worker as a :class:`~loaderkit.errors.WorkerError`.
    """

    __slots__ = ("files",)

    def __init__(self, *arrays: tuple[Path, np.ndarray]) -> None:
        self.files: list[tuple[Path, Callable[[], int], int]] = []
        for path, arr in arrays:
            size = self._sizer(path, arr)
            self.files.append((path, size, size()))

    @staticmethod
    def _sizer(path: Path, arr: np.ndarray) -> Callable[[], int]:
        """A function giving the current size of the file behind ``arr``: the map's own
        ``size()`` (an fstat of its descriptor), else a stat of ``path``."""
        base: Any = arr
        while base is not None and not hasattr(base, "_mmap"):
            base = getattr(base, "base", None)
        mm = getattr(base, "_mmap", None)
        if mm is not None:
            return cast("Callable[[], int]", mm.size)
        return lambda: path.stat().st_size

    @classmethod
    def size_of(cls, path: Path, arr: np.ndarray) -> int:
        """The current size of the file behind ``arr`` (-1: it is gone)."""
        try:
            return cls._sizer(path, arr)()
        except (OSError, ValueError):
            return -1

    def check(self) -> None:
        """Raise :class:`ShardError` if a mapped file's size changed since it was mapped."""
        for path, size, expected in self.files:
            try:
                now = size()
            except (OSError, ValueError):  # a closed map, or a file gone
                now = -1
            if now != expected:
                raise _changed(path, now, expected)


def _read_dtype(path: Path) -> np.dtype | None:
    """The dtype recorded in a raw shard's sidecar header, or None without one."""
    side = path.with_name(path.name + DTYPE_SUFFIX)
    try:
        text = side.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        dtype = np.dtype(text)
    except TypeError as exc:
        raise ShardError(
            f"dtype header {str(side)!r} holds {text!r}, not a numpy dtype ({exc}); delete it "
            "and pass dtype= to TokenReader.",
            path=side,
        ) from exc
    return dtype


def _out_numpy_dtype(out_dtype: torch.dtype | None, stored: np.dtype) -> np.dtype:
    if out_dtype is None:
        return stored
    return torch.empty(0, dtype=out_dtype).numpy().dtype


# ------------------------------------------------------------------ tokens
class TokenReader:
    """Flat token shards (``.npy``, or raw ``.bin`` of a dtype) as fixed-length or document samples.

    One long 1-D array of token ids per file (nanoGPT / litgpt layout), memory-mapped
    once per process; a batch of fixed-length samples is one gather out of the map,
    fast enough for ``num_workers=0`` (``benchmarks/shards``).

    Args:
        seq_len: Cut each shard into consecutive samples of ``seq_len`` tokens
            (the trailing ``len % seq_len`` tokens of a shard are not used).
        targets: With ``seq_len``: add the next token to each sample, so a
            sample has ``seq_len + 1`` tokens, ``x, y = s[:-1], s[1:]``, and
            consecutive samples share one token.
        eos: Instead of ``seq_len``: one sample per document, a document being
            the tokens up to and including each ``eos`` token (a final
            document without one is kept). Samples differ in length: give the
            loader a padding ``collate_fn`` such as :class:`~loaderkit.PadCollate`.
        dtype: Token dtype. Required for ``.bin`` files (they have no header);
            for ``.npy`` files, checked against the header when given.
        out_dtype: dtype of the returned tensors (``torch.int64``, what
            embeddings take); ``None`` keeps the stored dtype (half the bytes
            for ``uint16`` tokens; convert on the device).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> reader = TokenReader(seq_len=4, targets=True, dtype=np.uint16)
        >>> _ = reader.write(Path(d) / "a.bin", np.arange(10))
        >>> reader.count(Path(d) / "a.bin")
        2
        >>> reader.open(Path(d) / "a.bin").read(1)
        tensor([4, 5, 6, 7, 8])
    """

    suffixes: tuple[str, ...] = (".npy", ".bin")

    def __init__(
        self,
        seq_len: int | None = None,
        *,
        targets: bool = False,
        eos: int | None = None,
        dtype: Any = None,
        out_dtype: torch.dtype | None = torch.int64,
    ) -> None:
        if (seq_len is None) == (eos is None):
            raise ValueError(
                "TokenReader: pass exactly one of seq_len (fixed-length samples) and eos "
                f"(one sample per document), got seq_len={seq_len!r}, eos={eos!r}."
            )
        if seq_len is not None:
            check_int(
                "seq_len",
                seq_len,
                1,
                owner="TokenReader",
                fix="pass the tokens per sample, e.g. 1024",
            )
        if eos is not None:
            check_int("eos", eos, 0, owner="TokenReader", fix="pass the end-of-document token id")
        check_bool("targets", targets, owner="TokenReader")
        if targets and seq_len is None:
            raise ValueError(
                "TokenReader: targets=True needs seq_len (fixed-length samples); pass seq_len=, "
                "or targets=False with eos=."
            )
        self.seq_len = seq_len
        self.targets = bool(targets)
        self.eos = eos
        try:
            self.dtype = None if dtype is None else np.dtype(dtype)
        except TypeError as exc:
            raise TypeError(
                f"TokenReader: dtype={dtype!r} is not a numpy dtype ({exc}); pass e.g. "
                "dtype=np.uint16."
            ) from exc
        if self.dtype is not None and self.dtype.kind not in "iu":
            raise ValueError(
                f"TokenReader: dtype must be an integer dtype, got {self.dtype}; pass the token "
                "dtype, e.g. dtype=np.uint16 (or np.int32 for vocabularies over 65535)."
            )
        if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
            raise TypeError(
                f"TokenReader: out_dtype must be a torch.dtype or None, got {out_dtype!r}; pass "
                "e.g. torch.int64 (what embeddings take), or None to keep the stored dtype."
            )
        self.out_dtype = out_dtype

    def __repr__(self) -> str:
        what = f"seq_len={self.seq_len}" if self.eos is None else f"eos={self.eos}"
        return f"TokenReader({what}, targets={self.targets}, dtype={self.dtype})"

    def spec(self) -> dict[str, Any]:
        """The settings a shard's sample count depends on."""
        return {
            "kind": "tokens",
            "seq_len": self.seq_len,
            "targets": self.targets,
            "eos": self.eos,
            "dtype": None if self.dtype is None else self.dtype.str,
        }

    def tokens(self, path: Path) -> np.ndarray:
        """The shard's tokens, memory-mapped (read-only), checked for shape and dtype."""
        path = Path(path)
        if not path.exists():
            raise _missing(path)
        if path.suffix == ".npy":
            try:
                arr: np.ndarray = _map_npy(path)
            except ShardError:
                raise
            except (ValueError, OSError, EOFError) as exc:
                raise ShardError(
                    f"shard {str(path)!r} is not a readable .npy token array ({exc}): the file "
                    "is corrupt or truncated; rewrite it (and delete the shard index).",
                    path=path,
                ) from exc
            if arr.ndim != 1 or arr.dtype.kind not in "iu":
                raise ShardError(
                    f"shard {str(path)!r} holds a {arr.dtype} array of shape {arr.shape}; token "
                    "shards are 1-D integer arrays: flatten it (arr.reshape(-1)).",
                    path=path,
                )
            if self.dtype is not None and arr.dtype != self.dtype:
                raise ShardError(
                    f"shard {str(path)!r} has dtype {arr.dtype}, the reader expects "
                    f"{self.dtype}; pass dtype={arr.dtype.name!r} or rewrite the shard.",
                    path=path,
                )
            return arr
        header = _read_dtype(path)
        if self.dtype is not None and header is not None and header != self.dtype:
            raise ShardError(
                f"shard {str(path)!r} holds {header} tokens (its header "
                f"{path.name + DTYPE_SUFFIX!r} says so), the reader was given dtype={self.dtype}; "
                f"reading it as {self.dtype} would give garbage tokens. Pass "
                f"dtype=np.{header.name} (or leave dtype=None to follow the header).",
                path=path,
            )
        dtype = self.dtype if self.dtype is not None else header
        if dtype is None:
            raise ValueError(
                f"TokenReader: raw shard {str(path)!r} has no header (no "
                f"{path.name + DTYPE_SUFFIX!r} next to it), so its token dtype is unknown and "
                "a guess would read garbage tokens; pass dtype=, e.g. TokenReader(seq_len=..., "
                "dtype=np.uint16), or write the shards with TokenReader.write, which records it."
            )
        size = path.stat().st_size
        if size % dtype.itemsize:
            raise ShardError(
                f"shard {str(path)!r} is {size} bytes, not a multiple of the {dtype} "
                f"item size {dtype.itemsize}: it is truncated or not of this dtype; pass the "
                "dtype it was written with, or rewrite it.",
                path=path,
            )
        if size == 0:
            return np.empty(0, dtype=dtype)
        return _map_raw(path, dtype)

    def _doc_offsets(self, tokens: np.ndarray) -> np.ndarray:
        ends = [
            np.flatnonzero(tokens[lo : lo + _CHUNK] == self.eos) + (lo + 1)
            for lo in range(0, len(tokens), _CHUNK)
        ]
        cuts = np.concatenate([np.zeros(1, np.int64), *ends]).astype(np.int64)
        if cuts[-1] != len(tokens):
            cuts = np.append(cuts, len(tokens))
        return cuts

    def count(self, path: Path) -> int:
        """Samples in the shard; for documents, also writes the offsets sidecar."""
        path = Path(path)
        tokens = self.tokens(path)
        if self.eos is not None:
            offsets = self._doc_offsets(tokens)
            _write_offsets(path, f".eos{self.eos}", offsets)
            return len(offsets) - 1
        assert self.seq_len is not None
        return max(len(tokens) - self.targets, 0) // self.seq_len

    def open(self, path: Path) -> OpenShard:
        """Memory-map the shard."""
        path = Path(path)
        tokens = self.tokens(path)
        out = _out_numpy_dtype(self.out_dtype, tokens.dtype)
        if self.eos is not None:
            offsets = _read_offsets(path, f".eos{self.eos}", len(tokens))
            guard = MappedFiles((path, tokens), (_offsets_path(path, f".eos{self.eos}"), offsets))
            return _Documents(path, tokens, offsets, out, guard)
        assert self.seq_len is not None
        return _FixedTokens(tokens, self.seq_len, self.targets, out, MappedFiles((path, tokens)))

    def write(self, path: Path, data: Any) -> Path:
        """Write 1-D token ids to ``path`` (``.npy``, else raw bytes of ``dtype``)."""
        path = Path(path)
        arr = np.asarray(data)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError(
                f"TokenReader.write: a token shard is a 1-D integer array, got dtype "
                f"{arr.dtype} and shape {arr.shape} for {str(path)!r}; pass integer token ids, "
                "flattened (arr.reshape(-1))."
            )
        if self.dtype is not None:
            dtype = self.dtype
        else:  # an empty list arrives as float64: store it as the default integer type
            dtype = arr.dtype if arr.dtype.kind in "iu" else np.dtype(np.int64)
        if arr.size and (arr.min() < np.iinfo(dtype).min or arr.max() > np.iinfo(dtype).max):
            raise ValueError(
                f"TokenReader.write: token ids in [{arr.min()}, {arr.max()}] do not fit "
                f"{dtype}; pass a wider dtype."
            )
        arr = arr.astype(dtype, copy=False)
        if path.suffix == ".npy":
            with open(path, "wb") as f:
                np.save(f, arr)
        else:
            arr.tofile(path)
            # Raw bytes carry no dtype: record it, so a reader with another one is refused.
            header = path.with_name(path.name + DTYPE_SUFFIX)
            atomic_write(header, lambda f: f.write(dtype.str.encode()))
        return path


class _FixedTokens:
    """Fixed-length samples: a strided, read-only view of the memory-mapped tokens."""

    def __init__(
        self, tokens: np.ndarray, seq_len: int, targets: bool, out: np.dtype, guard: MappedFiles
    ) -> None:
        span = seq_len + targets
        count = max(len(tokens) - targets, 0) // seq_len
        item = tokens.dtype.itemsize
        self.tokens = tokens  # keeps the map alive
        self.rows = as_strided(
            tokens, shape=(count, span), strides=(seq_len * item, item), writeable=False
        )
        self.out = out
        self.dtype = out  # what read_batch returns; rows holds the samples as stored
        self.guard = guard
        self.disjoint = self.rows.flags.c_contiguous

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        """Each sample's tokens: all the same."""
        return np.full(len(self.rows), self.rows.shape[1], dtype=np.int64)

    def read(self, index: int) -> torch.Tensor:
        self.guard.check()
        row = np.array(self.rows[index], dtype=self.out)
        self.guard.check()
        return torch.from_numpy(row)

    def read_batch(self, indices: np.ndarray) -> np.ndarray:
        # One gather out of the map: the bytes are read here. take() copies a non-contiguous
        # array whole first: with targets the rows overlap, so index them instead.
        self.guard.check()
        rows = self.rows.take(indices, axis=0) if self.disjoint else self.rows[indices]
        self.guard.check()
        return rows if rows.dtype == self.out else rows.astype(self.out)


class _Documents:
    """Variable-length samples at the offsets of the sidecar."""

    def __init__(
        self,
        path: Path,
        tokens: np.ndarray,
        offsets: np.ndarray,
        out: np.dtype,
        guard: MappedFiles,
    ) -> None:
        self.path = path
        self.tokens = tokens
        self.offsets = offsets
        self.out = out
        self.guard = guard

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _copy(self, index: int) -> torch.Tensor:
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        return torch.from_numpy(np.array(self.tokens[lo:hi], dtype=self.out))

    def read(self, index: int) -> torch.Tensor:
        self.guard.check()
        doc = self._copy(index)
        self.guard.check()
        return doc

    def read_batch(self, indices: np.ndarray) -> list[torch.Tensor]:
        self.guard.check()
        docs = [self._copy(int(i)) for i in indices]
        self.guard.check()
        return docs

    def lengths(self) -> np.ndarray:
        """Each document's tokens, from the offsets (no token is read)."""
        return np.diff(np.asarray(self.offsets, dtype=np.int64))


# ------------------------------------------------------------------- jsonl
