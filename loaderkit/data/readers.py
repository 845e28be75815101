"""Shard readers: how one file becomes a sequence of samples (counted once, memory-mapped
in each process, written by :func:`~loaderkit.write_shards`)."""

from __future__ import annotations

import errno
import math
import mmap
import operator
import os
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

import numpy as np
import torch
from numpy.lib.stride_tricks import as_strided

from loaderkit._atomic import atomic_write
from loaderkit._checks import check_bool, check_int
from loaderkit.errors import MissingShardError, ReaderSettingError, ShardChangedError, ShardError

__all__ = ["OpenShard", "ShardReader", "TokenReader"]

_CHUNK = 1 << 26  # elements scanned per step when counting: bounded memory
# Files loaderkit writes next to shards: never listed as shards themselves.
OFFSETS_SUFFIX = ".lkoffsets"
DTYPE_SUFFIX = ".lkdtype"
OWN_SUFFIXES = (OFFSETS_SUFFIX, DTYPE_SUFFIX)
# A raw ``.bin`` (without loaderkit's dtype header) that is a whole file of another format:
# read as tokens, its header would be the first ids of the shard.
NPY_MAGIC, LITGPT_MAGIC = FOREIGN_MAGICS = (b"\x93NUMPY", b"LITPKDS")
_LITGPT_ITEMSIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 4, 7: 8, 8: 2}  # by its dtype code


@runtime_checkable
class OpenShard(Protocol):
    """One shard opened for reading in one process (example: :class:`ShardReader`).

    Optional members: ``read_batch(indices)`` returns a list of samples, or an array /
    tensor whose first dimension is the samples; ``close()``; ``rows``, a read-only array
    whose row ``i`` is sample ``i`` as stored, with ``dtype``, the numpy dtype ``read_batch``
    returns; ``lengths()``, each sample's token count without reading it.
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

    A reader is picklable and its methods pure (draw random numbers in a dataset wrapping
    it). Optional: ``prepare(files) -> reader``, called once per dataset with ``(name,
    source)`` per shard (a path, or a file object holding a URL's Parquet footer).

    Attributes:
        suffixes: File suffixes of the format, for listing a directory; the first names
            the shards :func:`~loaderkit.write_shards` writes.

    Example:
        A reader of text files, one sample per line (``open`` returns a list with a ``read``
        method: all :class:`OpenShard` asks for):

        >>> import tempfile
        >>> from loaderkit import ShardedDataset
        >>> class Lines(list):
        ...     def read(self, i): return self[i]
        >>> class LinesReader:
        ...     suffixes = (".txt",)
        ...     def spec(self): return {"kind": "txt-lines"}
        ...     def count(self, path): return len(path.read_text().splitlines())
        ...     def open(self, path): return Lines(path.read_text().splitlines())
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
        """JSON-able settings that change a shard's sample count (stored in the index)."""
        ...

    def count(self, shard: Any, /) -> int:
        """Samples in ``shard`` (a ``Path``, or the object given), once per shard when indexing."""
        ...

    def open(self, shard: Any, /) -> OpenShard:
        """Open ``shard`` for reading in this process."""
        ...


def _missing(path: Path, what: str = "shard") -> MissingShardError:
    return MissingShardError(
        f"{what} file {str(path)!r} does not exist; restore it, or delete the shard index "
        "so the shards are counted again.",
        path=path,
    )


def _offsets_path(path: Path, tag: str) -> Path:
    return path.with_name(f"{path.name}{tag}{OFFSETS_SUFFIX}")


def count_cuts(
    path: Path, data: np.ndarray, sep: int, tag: str, *, join_blank: bool = False, bom: bytes = b""
) -> int:
    """Pieces of ``data`` ending at each ``sep`` (and a last one), offsets to sidecar ``tag``;
    ``join_blank``: a piece of JSON whitespace only (after ``bom`` at the start) joins the
    piece before it (or after)."""
    shard = path.stat()  # before the count: a write during it leaves a later mtime
    offsets = cuts(data, sep, join_blank=join_blank, bom=bom)
    target = _offsets_path(path, tag)

    def write(f: IO[bytes]) -> None:
        np.save(f, offsets.astype(np.int64, copy=False))
        f.flush()
        # Stamped with the counted shard's mtime, which copies keep (cp -p, rsync -a) and a
        # replaced shard does not: the one rule that finds a same-length rewrite either way.
        os.utime(f.name, ns=(shard.st_atime_ns, shard.st_mtime_ns))

    try:
        # Atomic: DDP ranks may count the same shard at once (same content).
        atomic_write(target, write)
    except OSError as exc:
        raise ShardError(
            f"cannot write the offsets sidecar {str(target)!r} ({exc}); count the shards once "
            "where their directory is writable (e.g. write_shards), then copy them with mtimes.",
            path=target,
        ) from exc
    return len(offsets) - 1


def cuts(data: np.ndarray, sep: int, *, join_blank: bool = False, bom: bytes = b"") -> np.ndarray:
    """The offsets :func:`count_cuts` writes, computed only."""
    ends = [
        np.flatnonzero(data[lo : lo + _CHUNK] == sep) + (lo + 1)
        for lo in range(0, len(data), _CHUNK)
    ]
    offsets = np.concatenate([np.zeros(1, np.int64), *ends]).astype(np.int64)
    if offsets[-1] != len(data):  # a last piece without its separator
        offsets = np.append(offsets, len(data))
    if join_blank and len(offsets) > 1:
        offsets = _join_blank(data, offsets, bom)
    return offsets


_JSON_SPACE = np.zeros(256, dtype=bool)
_JSON_SPACE[[9, 10, 13, 32]] = True


def _join_blank(data: np.ndarray, offsets: np.ndarray, bom: bytes) -> np.ndarray:
    """``offsets`` without the pieces of JSON whitespace only: JSON reads a value with
    whitespace around it, so each such piece joins its neighbour instead of being one."""
    filled = np.zeros(len(offsets) - 1, dtype=bool)
    for lo in range(0, len(data), _CHUNK):
        hi = min(lo + _CHUNK, len(data))
        first = int(np.searchsorted(offsets, lo, side="right")) - 1
        last = int(np.searchsorted(offsets, hi, side="left"))  # pieces first..last-1 meet it
        starts = np.maximum(offsets[first:last], lo) - lo
        filled[first:last] |= np.logical_or.reduceat(~_JSON_SPACE[data[lo:hi]], starts)
    if bom and filled[0] and data[: len(bom)].tobytes() == bom:
        head = data[len(bom) : offsets[1]]
        filled[0] = bool((~_JSON_SPACE[head]).any())
    if filled.all():
        return offsets
    starts = offsets[:-1][filled]
    if not starts.size:
        return offsets[-1:]  # no sample (the pieces end where the data ends)
    starts[0] = 0  # blank pieces before the first value join it
    return np.append(starts, offsets[-1])


def _read_offsets(
    path: Path, tag: str, length: int, counted: Callable[[], np.ndarray]
) -> np.ndarray:
    """The offsets sidecar ``tag`` of ``path`` if it is the shard's (``counted``: the offsets
    computed, where a stale one cannot be replaced)."""
    side = _offsets_path(path, tag)
    try:
        offsets: np.ndarray = _map_raw(side)
    except FileNotFoundError:
        raise _missing(side, "offsets sidecar") from None
    except ShardError:
        raise
    except (ValueError, OSError) as exc:
        raise ShardError(
            f"offsets sidecar {str(side)!r} is unreadable ({exc}); delete it and the shard "
            "index so the shard is counted again.",
            path=side,
        ) from exc
    # Either is the shard changed after it was counted (a copy loaderkit made is recounted).
    if offsets.ndim != 1 or len(offsets) < 1 or int(offsets[-1]) != length:
        end = int(offsets[-1]) if offsets.ndim == 1 and len(offsets) else "?"
        raise ShardChangedError(
            f"offsets sidecar {str(side)!r} does not match shard {str(path)!r} (ends at {end}, "
            f"the shard has length {length}); delete the sidecar and the shard index.",
            path=side,
        )
    # Not stamped with the shard's mtime (count_cuts): counted from another version of it,
    # perhaps with as many tokens and other cuts, or by a loaderkit before the stamp. Where
    # it cannot be replaced (a read-only folder an older loaderkit wrote), counted here.
    if side.stat().st_mtime_ns == path.stat().st_mtime_ns:
        return offsets
    if not os.access(side.parent, os.W_OK):
        warnings.warn(
            f"offsets sidecar {str(side)!r} is not stamped with its shard's mtime and its folder "
            "is read-only, so the shard is counted on every open; count it once where it is "
            "writable (open it there), then copy the folder with mtimes (cp -a).",
            RuntimeWarning,
            stacklevel=2,
        )
        return counted()
    raise ShardChangedError(
        f"offsets sidecar {str(side)!r} was not counted from shard {str(path)!r} as it is now "
        "(their mtimes differ); delete the sidecar and the shard index so it is counted again.",
        path=side,
    )


def out_of_files(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the process or system out of file descriptors (not a bad file)."""
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


def _opened(path: Any, exc: Exception) -> Exception:
    """``exc``, raised opening ``path``; out of descriptors, the error saying so."""
    if not out_of_files(exc):
        return exc
    return ShardError(
        f"too many open files: {str(path)!r} could not be opened; lower max_open_shards or "
        "raise `ulimit -n`.",
        path=path,
    )


def npy_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    """A ``.npy`` file's shape, Fortran order and dtype; ``f`` is left at its data."""
    read = np.lib.format.read_array_header_1_0
    if np.lib.format.read_magic(f) != (1, 0):
        read = np.lib.format.read_array_header_2_0
    return read(f)


def check_npy_tokens(shard: Any, shape: tuple[int, ...], dtype: np.dtype, want: Any) -> None:
    """Refuse a ``.npy`` token shard that is no 1-D integer array of dtype ``want`` (None: any)."""
    if len(shape) != 1 or dtype.kind not in "iu":
        raise ShardError(
            f"shard {str(shard)!r} holds a {dtype} array of shape {shape}, not 1-D integer "
            "tokens; "
            + ("flatten it (arr.reshape(-1))." if len(shape) != 1 else "save integer token ids."),
            path=shard,
        )
    if want is not None and dtype != want:
        raise ShardError(
            f"shard {str(shard)!r} has dtype {dtype}, the reader expects {want}; pass "
            f"dtype={dtype.str if dtype.byteorder == '>' else dtype.name!r} or rewrite the shard.",
            path=shard,
        )


def _map_raw(path: Path, dtype: np.dtype | None = None) -> np.ndarray:
    """A read-only :mod:`mmap` of raw ``dtype`` (None: ``.npy``); refuses a file changed since."""
    shape: tuple[int, ...] | None = None
    fortran = False
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if dtype is None:
                shape, fortran, dtype = npy_header(f)
            offset = f.tell()
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise _opened(path, exc) from exc
    if mm.size() != size:
        raise _changed(path, mm.size(), size)
    count = -1 if shape is None else math.prod(shape)
    arr = np.frombuffer(mm, dtype=dtype, count=count, offset=offset)
    return arr if shape is None else arr.reshape(shape, order="F" if fortran else "C")


def _foreign(path: Path, size: int) -> str | None:
    """What other format the file at ``path`` (``size`` bytes) is by header and size, or None."""
    with open(path, "rb") as f:
        head = f.read(24)
        if head.startswith(NPY_MAGIC):
            f.seek(0)
            try:
                shape, _, dtype = npy_header(f)
            except (ValueError, SyntaxError, EOFError):  # not a .npy header after all
                return None
            if f.tell() + math.prod(shape) * dtype.itemsize == size:
                return "a .npy array; rename it .npy"
        elif head.startswith(LITGPT_MAGIC) and len(head) == 24:
            version, code = int.from_bytes(head[7:15], "little"), head[15]
            chunk = int.from_bytes(head[16:24], "little")
            if version == 1 and 24 + chunk * _LITGPT_ITEMSIZES.get(code, -1) == size:
                return (
                    "a litgpt packed chunk (a 24-byte header before its tokens); write its "
                    "tokens alone, e.g. np.fromfile(path, np.uint8, offset=24).tofile(new_path)"
                )
    return None


def _changed(path: Path, now: int, size: int) -> ShardChangedError:
    return ShardChangedError(
        f"file {str(path)!r} changed while it was memory-mapped: it is {now} bytes now, "
        f"{size} when it was mapped; restore the file (or rewrite the shards and delete "
        "their index), then restart the run.",
        path=path,
    )


class MappedFiles:
    """The memory maps an open shard reads, their sizes checked around every read (a file
    truncated under a map reads as zeros or raises SIGBUS)."""

    __slots__ = ("expected", "paths", "sizers")

    def __init__(self, *arrays: tuple[Path, np.ndarray]) -> None:
        # Flat lists: a batch across shards compares all its files in one comprehension.
        self.paths = [path for path, _ in arrays]
        self.sizers = [self._sizer(path, arr) for path, arr in arrays]
        self.expected = [size() for size in self.sizers]

    @staticmethod
    def _sizer(path: Path, arr: np.ndarray) -> Callable[[], int]:
        """The size of the file behind ``arr``: its map's ``size()`` (an fstat), else a stat."""
        base: Any = arr
        while base is not None and not isinstance(base, memoryview):
            base = getattr(base, "base", None)  # views, as_strided's wrapper, frombuffer's buffer
        mm = base.obj if isinstance(base, memoryview) else None
        if isinstance(mm, mmap.mmap):
            return mm.size
        return lambda: path.stat().st_size

    def check(self) -> None:
        """Raise :class:`ShardError` if a mapped file's size changed since it was mapped."""
        if len(self.sizers) == 1:  # the common case (one file a shard), twice a batch: inlined
            try:
                if self.sizers[0]() == self.expected[0]:
                    return
            except (OSError, ValueError):
                pass
        now = sizes_now(self.sizers)
        if now != self.expected:
            changed = zip(self.paths, now, self.expected, strict=True)
            raise _changed(*next(c for c in changed if c[1] != c[2]))


def sizes_now(sizers: list[Callable[[], int]]) -> list[int]:
    """Each file's size now, -1 for one that is gone or whose map is closed."""
    out = []
    for size in sizers:
        try:
            out.append(size())
        except (OSError, ValueError):  # a closed map, or a file gone
            out.append(-1)
    return out


def _read_dtype(path: Path) -> np.dtype | None:
    """The dtype in a raw shard's sidecar header, or None without one."""
    side = path.with_name(path.name + DTYPE_SUFFIX)
    try:
        text = side.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _opened(side, exc) from exc
    try:
        return np.dtype(text)
    except TypeError as exc:
        raise ShardError(
            f"dtype header {str(side)!r} holds {text!r}, not a numpy dtype ({exc}); delete it "
            "and pass dtype= to TokenReader.",
            path=side,
        ) from exc


def pinned_dtype(path: Path) -> dict[str, str]:
    """``{"dtype": ...}`` from a raw shard's dtype header, ``{}`` without one: the index
    records it, so a header rewritten later is refused rather than read as other tokens."""
    header = _read_dtype(Path(path))
    return {} if header is None else {"dtype": header.str}


def check_pinned(handle: Any, pinned: str | None, name: str, path: Any) -> None:
    """Refuse an open token shard whose stored dtype is not the ``pinned`` one it was listed
    with (by an index, or by a stream)."""
    got = getattr(handle, "stored", None)
    if pinned is not None and got is not None and got.str != pinned:
        raise ShardChangedError(
            f"shard {name} now reads as {got.str} tokens, listed as {pinned}: its "
            f"{DTYPE_SUFFIX} header changed or went, or dtype= differs; restore the header or "
            f"pass dtype=np.dtype({pinned!r}).",
            path=path,
        )


def _is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python's or numpy's), not a bool."""
    return (type(value) is int) or isinstance(value, np.integer)


def out_numpy_dtype(reader: TokenReader, stored: np.dtype, shard: str) -> np.dtype:
    """The numpy dtype ``reader`` returns ``shard``'s ``stored`` tokens in; checks ``eos``."""
    if reader.eos is not None and reader.eos > np.iinfo(stored).max:
        raise ReaderSettingError(
            f"TokenReader: eos={reader.eos} is above every {stored} token of shard "
            f"{shard!r}, so no document would end; pass the eos id the shards use."
        )
    if reader.out_dtype is None:
        return stored.newbyteorder("=")  # torch takes native byte order only
    return torch.empty(0, dtype=reader.out_dtype).numpy().dtype


def narrows(stored: np.dtype, out: np.dtype) -> bool:
    """Whether ``out`` may not hold every ``stored`` token (ints wider than a float's mantissa
    too, which numpy calls safe)."""
    if not np.can_cast(stored, out, "safe"):
        return True
    return out.kind == "f" and stored.itemsize * 8 > np.finfo(out).nmant + 1


def as_out(values: np.ndarray, out: np.dtype, narrowing: bool) -> np.ndarray:
    """``values`` copied as ``out``; if ``narrowing``, a token it cannot hold is refused."""
    result = np.array(values, dtype=out)
    if not narrowing or not values.size:
        return result
    wrong = result != values
    if out.kind == "f":  # compared through a float, both sides round alike: also as stored
        wrong |= result.astype(values.dtype) != values
    if wrong.any():
        bad = values.reshape(-1)[wrong.reshape(-1)][0]
        raise ReaderSettingError(
            f"TokenReader: out_dtype {out} cannot hold token {bad} (stored as "
            f"{values.dtype}); pass out_dtype=None (the stored dtype) or a wider one."
        )
    return result


class TokenReader:
    """Flat token shards (``.npy``, or raw ``.bin`` of a dtype) as fixed-length or document samples.

    One 1-D array of token ids per file (nanoGPT's headerless layout), memory-mapped.

    Args:
        seq_len: Cut each shard into consecutive samples of ``seq_len`` tokens (the trailing
            ``len % seq_len`` tokens are not used; with ``targets``, ``(len - 1) % seq_len``:
            write shards of ``k * seq_len + 1`` tokens to use them all).
        targets: With ``seq_len``: add the next token to each sample (``seq_len + 1`` tokens).
        eos: Instead of ``seq_len``: one sample per document, up to and including each
            ``eos`` (collate them with a padding ``collate_fn``, e.g. ``PadCollate``). A
            shard's end also ends a document: one cut across two shards is two samples.
        dtype: Token dtype; required for ``.bin`` files without a ``.lkdtype`` header,
            checked against a ``.npy`` file's header when given.
        out_dtype: dtype of the returned tensors (``None``: the stored one); one that cannot
            hold every stored value is refused.

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
        owner = "TokenReader"
        if seq_len is not None:
            fix = "pass the tokens per sample, e.g. 1024"
            seq_len = check_int("seq_len", seq_len, 1, owner=owner, fix=fix, numpy_ok=True)
        if eos is not None:
            fix = "pass the end-of-document token id"
            eos = check_int("eos", eos, 0, owner=owner, fix=fix, numpy_ok=True)
        check_bool("targets", targets, owner=owner)
        if targets and seq_len is None:
            raise ValueError(
                "TokenReader: targets=True needs seq_len; pass seq_len= instead of eos=."
            )
        self.seq_len, self.targets, self.eos = seq_len, bool(targets), eos
        try:
            self.dtype = None if dtype is None else np.dtype(dtype)
        except TypeError as exc:
            raise TypeError(
                f"TokenReader: dtype={dtype!r} is not a numpy dtype ({exc}); pass e.g. "
                "dtype=np.uint16."
            ) from exc
        if self.dtype is not None and self.dtype.kind not in "iu":
            raise ValueError(
                f"TokenReader: dtype must be an integer dtype, got {self.dtype}; pass e.g. "
                "dtype=np.uint16."
            )
        if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
            raise TypeError(
                f"TokenReader: out_dtype must be a torch.dtype or None, got {out_dtype!r}; pass "
                "e.g. torch.int64."
            )
        try:  # tokens are cast in numpy
            if out_dtype is not None:
                torch.empty(0, dtype=out_dtype).numpy()
        except TypeError as exc:
            raise ValueError(
                f"TokenReader: out_dtype={out_dtype} has no numpy dtype to read tokens into; "
                "pass e.g. torch.int64, and cast in the model."
            ) from exc
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
                arr: np.ndarray = _map_raw(path)
            except ShardError:
                raise
            except (ValueError, OSError, EOFError) as exc:
                raise ShardError(
                    f"shard {str(path)!r} is not a readable .npy token array ({exc}): it is "
                    "corrupt or truncated; rewrite it (and delete the shard index).",
                    path=path,
                ) from exc
            check_npy_tokens(path, arr.shape, arr.dtype, self.dtype)
            return arr
        header = _read_dtype(path)
        if self.dtype is not None and header is not None and header != self.dtype:
            raise ShardError(
                f"shard {str(path)!r} holds {header} tokens (says its {DTYPE_SUFFIX} header), "
                f"not dtype={self.dtype}. Pass dtype=np.{header.name}, or dtype=None.",
                path=path,
            )
        dtype = self.dtype if self.dtype is not None else header
        if dtype is None:
            raise ValueError(
                f"TokenReader: raw shard {str(path)!r} has no header ({DTYPE_SUFFIX}), so its "
                "token dtype is unknown; pass dtype=, e.g. dtype=np.uint16 (TokenReader.write "
                "records it)."
            )
        size = path.stat().st_size
        what = _foreign(path, size) if header is None and size else None
        if what is not None:
            raise ShardError(f"raw token shard {str(path)!r} is {what}.", path=path)
        if size % dtype.itemsize:
            raise ShardError(
                f"shard {str(path)!r} is {size} bytes, not a multiple of the {dtype} item size "
                f"{dtype.itemsize}; pass the dtype it was written with, or rewrite it.",
                path=path,
            )
        if size == 0:
            return np.empty(0, dtype=dtype)
        return _map_raw(path, dtype)

    def count(self, path: Path) -> int:
        """Samples in the shard; for documents, also writes the offsets sidecar."""
        path = Path(path)
        tokens = self.tokens(path)
        if self.eos is not None:
            out_numpy_dtype(self, tokens.dtype, str(path))
            return count_cuts(path, tokens, self.eos, f".eos{self.eos}")
        assert self.seq_len is not None
        return max(len(tokens) - self.targets, 0) // self.seq_len

    def open(self, path: Path) -> OpenShard:
        """Memory-map the shard."""
        path = Path(path)
        tokens = self.tokens(path)
        out = out_numpy_dtype(self, tokens.dtype, str(path))
        if self.eos is not None:
            tag = f".eos{self.eos}"
            offsets = _read_offsets(path, tag, len(tokens), partial(cuts, tokens, self.eos))
            guard = MappedFiles((path, tokens), (_offsets_path(path, tag), offsets))
            return _Documents(tokens, offsets, out, guard, self.eos)
        assert self.seq_len is not None
        return _FixedTokens(tokens, self.seq_len, self.targets, out, MappedFiles((path, tokens)))

    def write(self, path: Path, data: Any) -> Path:
        """Write 1-D token ids to ``path`` (``.npy``, else raw bytes of ``dtype``)."""
        path = Path(path)
        arr = np.asarray(data)
        ints = arr.dtype.kind in "iu"
        if arr.dtype.kind in "fO" and isinstance(data, list | tuple) and all(map(_is_int, data)):
            arr, ints = np.array([int(v) for v in data], dtype=object), True  # past int64
        if arr.ndim != 1 or (arr.size and not ints):
            raise ValueError(
                f"TokenReader.write: {str(path)!r} got dtype {arr.dtype} and shape {arr.shape}, "
                "not 1-D integer token ids; "
                + (
                    "write_shards takes one array per shard: pass [arr], not arr."
                    if arr.ndim == 0
                    else "flatten them (arr.reshape(-1))."
                    if arr.ndim != 1
                    else "pass integer token ids (arr.astype(np.int64) if they are whole)."
                )
            )
        default = arr.dtype if arr.dtype.kind in "iu" else np.dtype(np.int64)  # []: float64
        dtype = self.dtype if self.dtype is not None else default
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
        self.stored = tokens.dtype  # checked against the dtype the index pinned
        self.rows = as_strided(
            tokens, shape=(count, span), strides=(seq_len * item, item), writeable=False
        )
        self.out = out
        self.narrowing = narrows(tokens.dtype, out)
        self.dtype = out  # what read_batch returns; rows holds the samples as stored
        self.guard = guard
        self.disjoint = self.rows.flags.c_contiguous

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        return np.full(len(self.rows), self.rows.shape[1], dtype=np.int64)

    def read(self, index: int) -> torch.Tensor:
        self.guard.check()
        row = as_out(self.rows[index], self.out, self.narrowing)
        self.guard.check()
        return torch.from_numpy(row)

    def read_batch(self, indices: np.ndarray) -> np.ndarray:
        # take() first copies a non-contiguous array whole: overlapping rows (targets) are indexed.
        self.guard.check()
        rows = self.rows.take(indices, axis=0) if self.disjoint else self.rows[indices]
        self.guard.check()
        return rows if rows.dtype == self.out else as_out(rows, self.out, self.narrowing)


class _Documents:
    """Variable-length samples at the offsets of the sidecar."""

    def __init__(
        self, tokens: np.ndarray, offsets: np.ndarray, out: np.dtype, guard: MappedFiles, eos: int
    ) -> None:
        self.tokens, self.stored = tokens, tokens.dtype
        self.offsets = offsets
        self.out = out
        self.narrowing = narrows(tokens.dtype, out)
        self.guard, self.eos = guard, eos
        self._token, self._end = tokens.item, len(tokens)  # the check of each document's end

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def _copy(self, index: int) -> torch.Tensor:
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        # A shard rewritten at its size and mtime keeps its sidecar: its cuts fall elsewhere.
        if self._token(hi - 1) != self.eos and hi < self._end:
            shard, side = self.guard.paths
            raise ShardChangedError(
                f"offsets sidecar {str(side)!r} does not match shard {str(shard)!r} (document "
                f"{index} does not end with eos={self.eos}); delete the sidecar and the shard "
                "index.",
                path=side,
            )
        return torch.from_numpy(as_out(self.tokens[lo:hi], self.out, self.narrowing))

    def read(self, index: int) -> torch.Tensor:
        return self.read_batch([operator.index(index)])[0]  # a float is no index

    def read_batch(self, indices: Any) -> list[torch.Tensor]:
        self.guard.check()
        docs = [self._copy(int(i)) for i in indices]
        self.guard.check()
        return docs

    def lengths(self) -> np.ndarray:
        """Each document's tokens, from the offsets (no token is read)."""
        return np.diff(np.asarray(self.offsets, dtype=np.int64))
