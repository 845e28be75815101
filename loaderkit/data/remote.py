"""Shards at URLs: a local cache with a byte budget, filled ahead of the plan (docs/design.md,
shards in object storage)."""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import hashlib
import math
import os
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from loaderkit._atomic import atomic_write
from loaderkit._checks import check_int
from loaderkit.data._arrow import import_pyarrow
from loaderkit.data._codec import (
    DigestMismatch,
    decode_into,
    decoded_intact,
    decoded_name,
    default_cache_root,
    digest_error,
    file_digest,
    is_compressed,
    unlink,
    verify,
)
from loaderkit.data._fs import (
    DEFAULT_TIMEOUT_S,
    RangesUnsupported,
    Storage,
    is_url,
    join_url,
    url_name,
)
from loaderkit.data._open import (
    is_shard_name,
    named_by_url,
    read_docs,
    refuse_nested_shards,
    refuse_one_shard_twice,
    refuse_own_file,
    refuse_unread_compressed,
    sorted_shards,
)
from loaderkit.data._ranges import (
    HEAD_BYTES,
    Layout,
    RangedTokens,
    npy_header_bytes,
    npy_layout,
    parquet_footer,
)
from loaderkit.data._remote_cache import (
    Blocks,
    Busy,
    DiskCache,
    Entry,
    NoRoom,
    RemoteShard,
    flock,
)
from loaderkit.data._remote_plan import (
    Board,
    Follower,
    Prediction,
    WatchedPlan,
    indices,
    shard_of,
    shard_start,
)
from loaderkit.data._written import check_complete, written_extras
from loaderkit.data.index import (
    WORK_DIR,
    checked_count,
    index_doc,
    index_names,
    is_index_name,
    read_remote_index,
    remote_index_name,
    unfinished_write_error,
)
from loaderkit.data.readers import (
    DTYPE_SUFFIX,
    FOREIGN_MAGICS,
    OFFSETS_SUFFIX,
    OWN_SUFFIXES,
    OpenShard,
    ShardReader,
    TokenReader,
    pinned_dtype,
)
from loaderkit.errors import MissingShardError, ShardError

__all__ = ["RemoteCache"]

DEFAULT_CACHE_BYTES = 32 << 30
_MAX_UNPLANNED_LEASES = 16
_BlockJob = tuple[int, tuple[int, ...]]  # (shard, blocks of it)
_WHOLE_SECONDS = re.compile(r"\d+(\.0)?")  # also an integer ETag or generation: fetched again
# nginx's default ETag: its mtime in whole seconds and its size, in hex (an S3 multipart
# ETag's 32-digit MD5 is longer).
_MTIME_ETAG = re.compile(r'(W/)?"?[0-9a-f]{1,12}-[0-9a-f]{1,16}"?')


def _check_seconds(name: str, value: object, example: float, *, zero_ok: bool) -> None:
    """Refuse a ``RemoteCache`` duration that is not a finite number of seconds."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):  # type: ignore[operator]
        bound = ">= 0" if zero_ok else "> 0"
        raise ValueError(
            f"RemoteCache: {name} must be a finite number of seconds {bound}, got {value!r}; "
            f"pass e.g. {example}."
        )


@dataclass(frozen=True, kw_only=True)
class RemoteCache:
    """Where and how shards at URLs are cached on local disk.

    Args:
        cache_dir: The cache directory, shared by all processes of a machine (``~``
            expanded; default: ``$LOADERKIT_CACHE_DIR``, else ``~/.cache/loaderkit/shards``).
        max_bytes: Bytes of shards the cache may hold (default: ``$LOADERKIT_CACHE_BYTES``,
            else 32 GiB); at least what the processes of a machine read at once.
        storage_options: fsspec filesystem options (s3fs: ``{"endpoint_url": ..., "key": ...,
            "secret": ...}``); default: the provider's environment variables.
        prefetch: Shards each reading process fetches ahead (0: fetch only when read).
        retries: Retries of a transient error (network, timeout, 5xx).
        backoff_s: Wait before the first retry; doubled for each next one.
        timeout_s: Deadline of one remote read with its retries (a listing, a lookup, a
            batch of range reads, an 8 MiB piece of a download); past it a
            :class:`ShardError` names the URL.
        range_reads: Read plain (neither compressed nor hashed) ``.npy``/``.bin`` shards of
            ``TokenReader(seq_len=...)`` by byte ranges, only the blocks each process reads:
            ``True`` for all; ``"auto"`` for those over ``max_bytes / (prefetch + 1)`` or
            read at most half per epoch; ``False`` (default): whole files.
        block_bytes: Size of the blocks a range-read shard is fetched and cached in.

    Example:
        >>> cache = RemoteCache(cache_dir="/tmp/shard-cache", max_bytes=1 << 30, prefetch=2)
        >>> cache.directory.name, cache.max_bytes
        ('shard-cache', 1073741824)
    """

    cache_dir: str | os.PathLike[str] | None = None
    max_bytes: int | None = None
    storage_options: dict[str, Any] | None = field(default=None, hash=False)
    prefetch: int = 4
    retries: int = 5
    backoff_s: float = 0.5
    timeout_s: float = DEFAULT_TIMEOUT_S
    range_reads: bool | str = False
    block_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        owner = "RemoteCache"
        ints = partial(check_int, owner=owner)
        if self.max_bytes is None:
            env = os.environ.get("LOADERKIT_CACHE_BYTES", "")
            if env and (not (env.isascii() and env.isdigit()) or int(env) < 1):
                raise ValueError(
                    f"{owner}: LOADERKIT_CACHE_BYTES must be a byte count >= 1, got {env!r}; set "
                    "it to e.g. 68719476736, or pass max_bytes=."
                )
            object.__setattr__(self, "max_bytes", int(env) if env else DEFAULT_CACHE_BYTES)
        ints("max_bytes", self.max_bytes, 1, fix="pass a byte count, e.g. 1 << 36")
        ints("prefetch", self.prefetch, 0, fix="pass shards to fetch ahead: 4")
        ints("retries", self.retries, 0, fix="pass a retry count, e.g. 5")
        _check_seconds("backoff_s", self.backoff_s, 0.5, zero_ok=True)
        _check_seconds("timeout_s", self.timeout_s, 120, zero_ok=False)
        if self.cache_dir is not None and not isinstance(self.cache_dir, str | os.PathLike):
            raise TypeError(
                f"{owner}: cache_dir must be a path, got {self.cache_dir!r}; pass a folder "
                "path, or None for the default."
            )
        if self.cache_dir is not None and not os.fspath(self.cache_dir):
            raise ValueError(
                f"{owner}: cache_dir='' would put the cache in the working directory; pass a "
                "folder path, or None for the default."
            )
        if not (isinstance(self.range_reads, bool) or self.range_reads == "auto"):
            raise ValueError(
                f"{owner}: range_reads must be True, False or 'auto', got "
                f"{self.range_reads!r}; pass range_reads='auto'."
            )
        ints("block_bytes", self.block_bytes, 1, fix="pass a block size: 8 << 20")
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise TypeError(
                f"{owner}: storage_options must be a dict of fsspec filesystem options, got "
                f"{type(self.storage_options).__name__}; pass e.g. {{'endpoint_url': ...}}."
            )

    @property
    def directory(self) -> Path:
        """The cache directory."""
        return default_cache_root() if self.cache_dir is None else Path(self.cache_dir).expanduser()


def shard_paths(shards: Sequence[Any]) -> list[str] | None:
    """The shards' paths in their real folders (links to files kept) or URLs; None: objects."""
    if not all(isinstance(s, Path | RemoteShard) for s in shards):
        return None
    real = lru_cache(None)(os.path.realpath)  # once per folder: shards share few
    return [
        os.path.join(real(os.path.dirname(s) or "."), s.name) if isinstance(s, Path) else str(s)
        for s in shards
    ]


def remote_source(
    shards: Any, suffixes: Sequence[str], remote: RemoteCache | None, owner: str
) -> RemoteShards | None:
    """The :class:`RemoteShards` of ``shards`` if they are URLs, else None (local shards)."""
    is_list = isinstance(shards, list | tuple)
    if is_list and shards and all(is_url(s) for s in shards):
        source: str | list[str] = [str(s) for s in shards]
    elif is_url(shards):
        source = str(shards)
    elif is_list and any(is_url(s) for s in shards):
        raise TypeError(
            f"{owner}: shards mixes URLs and other items; pass all URLs (or a folder URL), "
            "or all local paths."
        )
    elif remote is not None:
        raise ValueError(
            f"{owner}: remote= is for shards at URLs, but shards is not a URL "
            f"({str(shards)[:80]!r}); leave remote out, or pass an s3://, gs://, ... URL."
        )
    else:
        return None
    if remote is not None and not isinstance(remote, RemoteCache):
        raise TypeError(
            f"{owner}: remote must be a RemoteCache, got {type(remote).__name__}; pass e.g. "
            "remote=RemoteCache(cache_dir=..., max_bytes=...)."
        )
    return RemoteShards(source, tuple(suffixes), remote or RemoteCache(), owner)


def _folder_key(folder: str) -> str:
    return hashlib.sha256(folder.encode()).hexdigest()[:16]


def _sized(shard: RemoteShard) -> RemoteShard:
    """``shard``, refused if the server gave no size for it or a sidecar (downloads are checked
    by size); a file that is not read may have none."""
    for name, size in [(shard.name, shard.size), *((n, s) for n, s, _ in shard.sidecars)]:
        if size is None and not name.endswith(OFFSETS_SUFFIX):  # offsets: counted here
            raise ShardError(
                f"the server gives no size (Content-Length) for {join_url(shard.folder, name)!r}, "
                "which loaderkit needs to check its download; serve the files with one (any "
                "static file server does).",
                path=shard.url,
            )
    return shard


def _listed_shards(folder: str, entries: list[dict[str, Any]]) -> dict[str, RemoteShard]:
    """Each listed file of ``folder`` by name, with its sidecars attached."""
    by_name = {e["name"]: (e["size"], str(e["version"])) for e in entries}
    names = sorted(by_name)  # names starting with a stem sit together, from the stem on
    out = {}
    for name, (size, version) in by_name.items():
        own = set()
        for stem in {name, decoded_name(name)}:  # a.bin.lkdtype is a.bin.zst's too (decode_into)
            i = bisect.bisect_left(names, stem)
            while i < len(names) and names[i].startswith(stem):
                own.add(names[i])
                i += 1
        sides = tuple(
            (o, *by_name[o]) for o in sorted(own) if o != name and o.endswith(OWN_SUFFIXES)
        )
        out[name] = RemoteShard(join_url(folder, name), name, size, version, sides)
    return out


def _keys_copy(version: str) -> bool:
    """Whether a copy keyed by ``version`` holds across listings: not a time in whole seconds
    (``Last-Modified``, an SFTP ``mtime``), which two versions may share."""
    seconds = version.endswith(" GMT") or _WHOLE_SECONDS.fullmatch(version)
    return bool(version) and not (seconds or _MTIME_ETAG.fullmatch(version))


def _local_footer(path: Path) -> bytes | None:
    """The local Parquet file's footer, as :func:`parquet_footer` gives it, or None."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(size - 8, 0))
        tail = f.read()
        if size < 12 or tail[-4:] != b"PAR1":
            return None
        f.seek(max(size - int.from_bytes(tail[:4], "little") - 8, 0))
        tail = f.read()
    with contextlib.suppress(ValueError):  # a footer too long: the reader names the file
        return parquet_footer(tail, size)
    return None


def _prefetch_loop(
    ref: weakref.ref[RemoteShards],
    wake: threading.Condition,
    queue: list[int | _BlockJob],
    stop: threading.Event,
) -> None:
    """A prefetch thread: fetch the queued jobs of ``ref``'s dataset until it is dropped."""
    while True:
        with wake:
            while not queue:
                if stop.is_set():
                    return
                wake.wait()
            job = queue.pop(0)
        owner = ref()
        if owner is None:
            return
        owner._fetch_ahead(job)
        del owner  # held only while fetching


def _stop_prefetch(wake: threading.Condition, stop: threading.Event, pid: int) -> None:
    """End the prefetch thread of a dropped dataset (a forked child's copy has none)."""
    if os.getpid() != pid:
        return  # the lock may have been held by a thread that the fork did not copy
    stop.set()
    with wake:
        wake.notify_all()


def _downloaded(side: str, shard: str) -> bool:
    """Whether sidecar ``side`` of ``shard`` stays as downloaded in the cache."""
    return not side.endswith(OFFSETS_SUFFIX) and (
        side.startswith(shard) or decoded_name(shard) == shard
    )


class RemoteShards:
    """The shards of one dataset at URLs, their cache, and this process's prefetcher."""

    def __init__(
        self, source: str | list[str], suffixes: tuple[str, ...], cache: RemoteCache, owner: str
    ) -> None:
        assert cache.max_bytes is not None
        self.cache, self.owner = cache, owner
        self.root_dir = cache.directory
        self.disk = DiskCache(self.root_dir, cache.max_bytes, owner)
        first = source if isinstance(source, str) else source[0]
        retry = {k: getattr(cache, k) for k in ("retries", "backoff_s", "timeout_s")}
        self.storage = Storage(first, cache.storage_options, **retry)
        self.board = Board()
        # Keys a copy of an object listed without a version: reused within this listing only.
        self.listing = os.urandom(8).hex()
        self._reset()
        self.index_docs: dict[str, bytes] | None = None  # a folder's index files, as listed
        self._indexes_beside: list[str] = []  # those of listed shards' folders
        self.shards = self._list(source, suffixes)
        refuse_one_shard_twice(owner, (s.url for s in self.shards))
        # Per shard, from the index: compression, raw_size, hash (None: plain, unhashed).
        self.extras: list[dict[str, Any] | None] = [None] * len(self.shards)
        docs = self.index_docs
        if docs is None:
            docs = {url: self.storage.read_bytes(url) for url in self._indexes_beside}
        # The index write_shards wrote holds for its shards whatever the reader (its hashes too).
        self.written = written_extras(docs, [(s.url, s.size, s.version) for s in self.shards])
        self.folder = self.shards[0].folder
        self.reader: ShardReader | None = None  # set by count()
        self.ranged_ok = False  # set by a ShardedDataset: it opens shards with open_ranged

    def _reset(self) -> None:
        """This process's state: none of it is sent to workers (see ``__getstate__``)."""
        self.disk.reset()
        self.storage.on_retry = partial(self.disk.count, "retries")
        self._pid = os.getpid()
        self._wake = threading.Condition()
        self._unplanned: OrderedDict[int, None] = OrderedDict()
        self._queue: list[int | _BlockJob] = []
        self._thread: threading.Thread | None = None
        self._follow = Follower(self.board)
        self._planned = False  # whether the shards read now come from want()
        self._entries: dict[tuple[int, int | None], Entry] = {}  # _paths
        self._window: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self._verified: set[int] = set()  # cached shards this process checked the hash of
        self._layouts: dict[int, Layout | None] = {}  # None: read from the whole file
        self._no_ranges = False  # the server ignores Range: every shard is fetched whole
        self._blocks = Blocks(self.disk, self.storage, self.cache.block_bytes)
        self._ends_hint = np.zeros(1, dtype=np.int64)  # sample ends per shard (note_batch)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}  # per process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _here(self) -> None:
        """Start afresh in a forked child (its parent's locks and thread are not its own)."""
        if self._pid != os.getpid():
            self._reset()

    def _list(self, source: str | list[str], suffixes: tuple[str, ...]) -> list[RemoteShard]:
        owner = self.owner
        if isinstance(source, str):
            return self._list_folder(source.rstrip("/"), suffixes)
        folders: dict[str, dict[str, RemoteShard]] = {}  # by the store's own key
        out = []
        seen: dict[str, str] = {}  # the listed spelling of each object (url/x/, s3a://: s3://)
        for url in source:
            name = url_name(url)
            refuse_own_file(owner, url, name, "folder")
            folder = url.rstrip("/").rsplit("/", 1)[0]
            where = self._store_key("shards", url, source[0]).rstrip("/").rsplit("/", 1)[0]
            if where not in folders:
                entries, subfolders = self._entries_of(folder, url)
                if WORK_DIR in subfolders:  # a URL list of the folder, as the folder
                    raise unfinished_write_error(folder, self._markers(folder))
                folders[where] = _listed_shards(folder, entries)
                names = (e["name"] for e in entries)
                self._indexes_beside += [join_url(folder, n) for n in names if is_index_name(n)]
            if name not in folders[where]:
                raise MissingShardError(
                    f"{owner}: shard {url!r} does not exist (not listed in {folder!r}); check "
                    "the URL, or upload it.",
                    path=url,
                )
            shard = _sized(folders[where][name])
            if shard.url in seen:
                raise ValueError(
                    f"{owner}: shards {seen[shard.url]!r} and {url!r} are one object (listed "
                    "twice); its samples would be read twice. List each shard once."
                )
            seen[shard.url] = url
            out.append(shard)
        return out

    def _store_key(self, name: str, url: str, first: str) -> str:
        """``url``'s object on the store of ``first`` (the dataset's first shard), whatever its
        spelling; a URL on another store is refused (one fsspec filesystem reads them all)."""
        key = self.storage.key(url)
        if key is None:
            raise ValueError(
                f"{self.owner}: {name}={url!r} is on another store than the shard {first!r}; "
                "keep a dataset's shards and index on one store (mix stores with MixedDataset)."
            )
        return key

    def _entries_of(self, folder: str, url: str) -> tuple[list[dict[str, Any]], set[str]]:
        """The listing of shard ``url``'s folder: its sizes, versions and index are read there."""
        try:
            return self.storage.entries(folder)
        except MissingShardError:
            raise
        except ShardError as exc:  # refused: a server that lists no folder
            raise ShardError(
                f"{self.owner}: shard {url!r} is read with its folder's listing, which failed "
                f"({exc}); serve the folder's listing, or copy the shards to local disk.",
                path=folder,
            ) from exc

    def _markers(self, folder: str) -> list[str]:
        """The file names in ``folder``'s ``WORK_DIR`` (none where it cannot be listed)."""
        with contextlib.suppress(ShardError):
            return [e["name"] for e in self.storage.entries(join_url(folder, WORK_DIR))[0]]
        return []

    def _list_folder(self, folder: str, suffixes: tuple[str, ...]) -> list[RemoteShard]:
        """The shards of a folder URL, checked complete against its indexes."""
        entries, folders = self.storage.entries(folder)
        if not entries and not folders and not self.storage.is_dir(folder):
            raise MissingShardError(
                f"{self.owner}: shards={folder!r} is no folder of shards (nothing is listed "
                "under it); pass the folder URL that holds them, or a list of shard URLs.",
                path=folder,
            )
        one_file = len(entries) == 1 and not folders and entries[0]["name"] == url_name(folder)
        if one_file and not self.storage.is_dir(folder):  # a file lists as itself
            raise ValueError(
                f"{self.owner}: shards={folder!r} is a file, not a folder (a URL given as "
                "shards=, to a DataModule too, names a folder); pass single files in a list: "
                f"shards=[{folder!r}]."
            )
        if WORK_DIR in folders:
            raise unfinished_write_error(folder, self._markers(folder))
        listed = _listed_shards(folder, entries)
        refuse_unread_compressed(self.owner, folder, listed, suffixes)
        for sub in sorted(f for f in folders if not f.startswith(".")):
            nested = self.storage.files_under(join_url(folder, sub))
            refuse_nested_shards(self.owner, folder, nested, suffixes)
        accept = partial(is_shard_name, suffixes=suffixes)
        found = [_sized(listed[name]) for name in sorted_shards(n for n in listed if accept(n))]
        if not found:
            raise ValueError(
                f"{self.owner}: no file ending in {list(suffixes)} in {folder!r} (hidden and "
                "loaderkit's own files are never shards); pass the folder that holds the "
                "shards, or a reader with their suffix."
            )
        indexes = [join_url(folder, e["name"]) for e in entries if is_index_name(e["name"])]
        self.index_docs = {url: self.storage.read_bytes(url) for url in indexes}
        # A read-only folder's indexes are kept in the cache: they vouch for it too.
        kept = read_docs(sorted(self.root_dir.glob(f"indexes/{_folder_key(folder)}-*.json")))
        check_complete(folder, [s.name for s in found], list(self.index_docs.items()), accept, kept)
        return found

    def count(self, reader: ShardReader, index: str | os.PathLike[str] | None) -> list[int]:
        """Each shard's sample count, from the checked index; else counted and indexed."""
        self.reader = reader
        # Rows name the first shard's folder's shards bare (as write_shards' index there) and
        # others by URL: a list across folders never takes a folder's index, nor one of its
        # folders' names for its own.
        keys = [s.name if s.folder == self.folder else s.url for s in self.shards]
        name = remote_index_name(keys, reader)
        default = join_url(self.folder, name)
        local = self.root_dir / "indexes" / f"{_folder_key(self.folder)}-{name.lstrip('.')}"
        found = self._find_index(index, default, local)
        # loaderkit's own counts of a shard without a version that tells writes apart (none,
        # or a time in whole seconds) vouch for its size alone (a same-size rewrite may hold
        # other samples): counted again; write_shards' are the truth.
        versionless = not all(_keys_copy(s.version) for s in self.shards)
        if found is not None and versionless and not (index_names(found[0]) or ((), 0))[1]:
            found = None
        if found is not None:
            listed = [(s.url, k, s.size, s.version) for s, k in zip(self.shards, keys, strict=True)]
            counts, self.extras = read_remote_index(
                found[0], found[1], reader, listed, folder=self.index_docs is not None
            )
            return counts
        rows: list[list[Any]] = []
        for i, shard in enumerate(self.shards):
            samples, pinned = self._count_one(i, reader)
            extras: dict[str, Any] = dict(pinned)
            row: list[Any] = [keys[i], shard.size, shard.version, samples]
            if is_compressed(shard.name):
                raw = self._paths(i)[0].with_name(decoded_name(shard.name))
                extras = {"compression": "zstd", "raw_size": raw.stat().st_size, **extras}
            self.extras[i] = extras or None
            row.extend([extras] * bool(extras))
            self.disk.release([self._paths(i)[1].name])  # only now: its copy was read
            rows.append(row)
        doc = index_doc(rows, reader, remote=True)
        target = str(index) if index is not None else default
        try:
            if is_url(target):
                self.storage.write_bytes(target, doc)
            else:
                atomic_write(Path(target), lambda f: f.write(doc))
        except (ShardError, OSError):
            if index is not None:
                raise
            local.parent.mkdir(parents=True, exist_ok=True)  # a read-only folder
            atomic_write(local, lambda f: f.write(doc))
        return [int(r[3]) for r in rows]

    def _count_one(self, i: int, reader: ShardReader) -> tuple[int, dict[str, str]]:
        """Shard ``i``'s samples (from a Parquet footer, a token header, or the whole file) and
        the token dtype its index row pins."""
        from loaderkit.data.parquet import ParquetReader, _num_rows

        footer = self._parquet_footer(i) if isinstance(reader, ParquetReader) else None
        layout = self._try_probe(i) if footer is None and self._eligible(i) else None
        pinned: dict[str, str] = {}
        if footer is not None:
            pa = import_pyarrow()
            meta = pa.parquet.read_metadata(pa.BufferReader(footer))
            samples = _num_rows(meta, self.shards[i].url)
        elif layout is not None and isinstance(reader, TokenReader) and reader.seq_len:
            samples = max(layout.tokens - reader.targets, 0) // reader.seq_len
            pinned = {"dtype": layout.dtype.str}
        else:
            local = self.local(i)  # leased until count() is done with it
            with named_by_url(local, self.shards[i].url):
                samples = reader.count(local)
            pinned = pinned_dtype(local)
        return checked_count(reader, self.shards[i].url, samples), pinned

    def _find_index(
        self, index: str | os.PathLike[str] | None, default: str, local: Path
    ) -> tuple[bytes, str] | None:
        """``(document, where)`` of ``index``, else ``default``, else ``local``; None if none."""
        if index is not None:
            where = str(index)
            if not is_url(where):
                return (Path(where).read_bytes(), where) if Path(where).exists() else None
            self._store_key("index", where, self.shards[0].url)
            return (self.storage.read_bytes(where), where) if self.storage.exists(where) else None
        if self.index_docs is not None:  # a folder: its listing named its index files
            if default in self.index_docs:
                return self.index_docs[default], default
        elif self.storage.exists(default):
            return self.storage.read_bytes(default), default
        return (local.read_bytes(), str(local)) if local.exists() else None

    def _parquet_footer(self, index: int) -> bytes | None:
        """Shard ``index``'s Parquet footer by a range read, checked to parse; None if none."""
        shard = self.shards[index]
        if is_compressed(shard.name) or shard.size < 12:
            return None
        pa = import_pyarrow()
        want = min(shard.size, 64 << 10)
        for _ in range(2):
            try:
                (tail,) = self.storage.read_ranges(
                    shard.url, [(shard.size - want, shard.size)], shard.size, shard.version
                )
            except RangesUnsupported:
                return None
            try:
                footer = parquet_footer(tail, shard.size)
                if footer is not None:
                    pa.parquet.read_metadata(pa.BufferReader(footer))
            except Exception as exc:
                raise ShardError(
                    f"shard {shard.url!r} is not a readable Parquet file ({exc}); rewrite it "
                    "(and delete the shard index).",
                    path=shard.url,
                ) from exc
            self.disk.count_ranges(len(tail), 1)
            self.disk.count("footers")
            if footer is not None:
                return footer
            want = min(shard.size, int.from_bytes(tail[-8:-4], "little") + 8)
        return None

    def footer_source(self, index: int) -> Any:
        """Shard ``index``'s Parquet footer for a reader's ``prepare`` (a ``BufferReader``), by
        a range read or from its fetched copy; else the copy's path, kept leased."""
        footer = self._parquet_footer(index)
        if footer is None:
            path = self.local(index)
            # Read now: once its lease ends, another process may evict the copy.
            footer = _local_footer(path)
            if footer is None:
                return path
            self.disk.release([self._paths(index)[1].name])
        return import_pyarrow().BufferReader(footer)

    def stats(self) -> dict[str, Any]:
        """The cache's counts over this process and its workers (names: ``STATS``)."""
        return {
            **self.disk.totals(),
            "url": self.folder,
            "cache_dir": str(self.root_dir),
            "max_bytes": self.cache.max_bytes,
            "cached_bytes": self.disk.used()[0],
            "prefetch": self.cache.prefetch,
            "range_reads": self.cache.range_reads,
            "block_bytes": self.cache.block_bytes,
            "shard_bytes": sum(s.total_bytes for s in self.shards),
        }

    def _paths(self, index: int, block: int | None = None) -> Entry:
        """The cache file, lease lock and download lock of shard ``index`` (or its ``block``)."""
        found = self._entries.get((index, block))
        if found is None:  # built once: per batch, Path joins and hashing add up
            shard = self.shards[index]
            key, name = shard.key, shard.name
            # A same-size replacement of a versionless object would be read stale from a copy
            # of an earlier listing; a shard with a hash has its copy checked instead.
            if self.versionless(index):
                key = hashlib.sha256(f"{key}\n{self.listing}".encode()).hexdigest()[:24]
            digest = self._digest(index)
            if digest:  # two index generations of one object never share a copy (review 298)
                key = hashlib.sha256(f"{key}\n{digest}".encode()).hexdigest()[:24]
            if block is not None:
                blob = f"{key}\n{self.cache.block_bytes}\n{block}".encode()
                key, name = "b" + hashlib.sha256(blob).hexdigest()[:23], "block"
            found = self._entries[(index, block)] = self.disk.entry(key, name)
        return found

    def local(self, index: int, *, ahead: bool = False) -> Path:
        """The local path of shard ``index`` (decoded if compressed, hash checked), leased and
        fetched if needed; ``ahead``: for the prefetcher (:class:`NoRoom`, :class:`Busy`)."""
        self._here()
        with named_by_url(self._paths(index)[0], self.shards[index].url):
            return self._local(index, ahead=ahead)

    def _local(self, index: int, *, ahead: bool) -> Path:
        shard = self.shards[index]
        target, lease, dl_lock = self._paths(index)
        final = target.with_name(decoded_name(target.name))
        self.disk.lease(lease)
        if not ahead and not self._planned:
            self.read_unplanned(index)
        if self._ready(target, final) and self._cached_ok(index, target):
            if not ahead:
                self.disk.count("hits")
                self.disk.touch(target)
            return final
        # One download per shard per machine; the prefetcher moves on instead of waiting.
        fd = flock(dl_lock, fcntl.LOCK_EX | (fcntl.LOCK_NB if ahead else 0))
        if fd is None:
            raise Busy
        try:
            if not ahead:
                self.disk.count("waited")
            if self._ready(target, final):  # another process or thread fetched it meanwhile
                if self._cached_ok(index, target):
                    return final
                # The copy failed its hash: removed under this lock, so no download in flight.
                self.disk.count("corrupt")
                unlink(target.parent.iterdir())
            need = shard.total_bytes + int((self.extras[index] or {}).get("raw_size", 0))
            with self.disk.reserved(shard.url, [target.parent], [need], ahead=ahead):
                unlink(target.parent.glob(".*.tmp"))  # left by a killed download
                # Counted before the copy shows: a reader finding it must find it counted.
                self._count_fetch(index, ahead, 1)
                try:
                    for name, size, version in shard.sidecars:
                        side = target.parent / name
                        # Offsets are counted here, as for a decoded copy (_codec.decode_into).
                        if not (side.exists() or name.endswith(OFFSETS_SUFFIX)):
                            url = join_url(shard.folder, name)
                            self.storage.download(url, side, size, version=version)
                    self._download_checked(index, target)
                    if final != target:
                        decode_into(target, target.parent)
                except BaseException:
                    self._count_fetch(index, ahead, -1)
                    raise
            return final
        finally:
            os.close(fd)

    def _count_fetch(self, index: int, ahead: bool, sign: int) -> None:
        self.disk.count("fetched", sign)
        self.disk.count("fetched_bytes", sign * self.shards[index].total_bytes)
        if ahead:
            self.disk.count("prefetched", sign)

    @staticmethod
    def _ready(target: Path, final: Path) -> bool:
        """Whether a cached shard can be read: its file, or its decoded copy left intact."""
        return final.exists() if final == target else decoded_intact(final)

    def versionless(self, index: int) -> bool:
        """Whether shard ``index`` (or a sidecar) has no version or hash to key a copy by."""
        shard = self.shards[index]
        keys = [self._digest(index) or _keys_copy(shard.version)]
        return not all([*keys, *(_keys_copy(v) for *_, v in shard.sidecars)])

    def header_dtypes(self) -> list[str | None]:
        """Each raw shard's token dtype as its folder's ``write_shards`` index pinned it, else
        its header as it reads now where its version cannot tell a rewrite (none, or whole
        seconds); else None (the version pins it)."""
        out: list[str | None] = []
        for shard, written in zip(self.shards, self.written, strict=True):
            # Its own header, else its plain name's (a.bin.zst reads a.bin.lkdtype); never
            # another shard's whose name starts like it (c.bin-x.bin.lkdtype).
            names = (shard.name + DTYPE_SUFFIX, decoded_name(shard.name) + DTYPE_SUFFIX)
            own = [s for name in names for s in shard.sidecars if s[0] == name]
            pinned = (written or {}).get("dtype")
            if pinned or not own or _keys_copy(own[0][2]):
                out.append(pinned)
                continue
            name, size, version = own[0]
            text = self.storage.read_bytes(join_url(shard.folder, name), (size, version))
            try:
                out.append(np.dtype(text.decode().strip()).str)
            except (TypeError, ValueError):  # the reader names a bad header when it opens one
                out.append(None)
        return out

    def _digest(self, index: int) -> str | None:
        return (self.extras[index] or {}).get("hash", (self.written[index] or {}).get("hash"))

    def _download_checked(self, index: int, target: Path) -> None:
        """Download shard ``index`` to ``target``; one that fails its hash is fetched again once."""
        shard, digest = self.shards[index], self._digest(index)
        get = partial(self.storage.download, shard.url, target, shard.size, version=shard.version)
        if digest is None:
            get()
            return

        def check(tmp: Path) -> None:
            actual = file_digest(tmp, digest.split(":", 1)[0])
            if actual != digest:
                fix = "it was fetched twice alike: restore the object, or rewrite the shards."
                raise digest_error(shard.url, digest, actual, fix)

        try:
            get(check=check)
        except DigestMismatch:
            self.disk.count("corrupt")
            get(check=check)
        with contextlib.suppress(OSError):
            verify(target, digest)  # the marker: other processes skip the hashing
        self._verified.add(index)

    def _cached_ok(self, index: int, target: Path) -> bool:
        """Whether shard ``index``'s cached copy has the listed sizes and passes its hash
        (checked once per process); one cut short (a crash, a full disk) is fetched again."""
        if index in self._verified:
            return True
        shard, digest = self.shards[index], self._digest(index)
        # Offsets are counted here; a decoded copy's plain-name sidecars are the shard's own.
        files = [(target.parent / n, size) for n, size, _ in shard.sidecars]
        files = [(target, shard.size), *(f for f in files if _downloaded(f[0].name, target.name))]
        try:
            if any(path.stat().st_size != size for path, size in files):
                return False
            if digest is not None:
                verify(target, digest, name=shard.url)
        except (FileNotFoundError, DigestMismatch):
            return False
        self._verified.add(index)
        return True

    def want(
        self, in_use: Sequence[int], upcoming: Sequence[int], blocks: Sequence[_BlockJob] = ()
    ) -> None:
        """Lease ``in_use`` and ``upcoming`` shards, release the others, prefetch the missing."""
        self._here()
        window = (tuple(in_use), tuple(upcoming))
        if window == self._window and self._planned and not blocks:
            return  # the same shards as for the last batch: nothing to do
        self._window = window
        if self.cache.range_reads is not False and self.ranged_ok:
            in_use = [i for i in in_use if self._layout(i) is None]
            upcoming = [i for i in upcoming if self._layout(i) is None]
        wanted = (*in_use, *upcoming)
        for i in wanted:  # cached ones too: no other process evicts them before they are read
            self.disk.lease(self._paths(i)[1])
        keep = {self._paths(i)[1].name for i in wanted}
        leased, blocks_held = self.disk.leased(), self._blocks.held()
        drop = [k for k in leased if k not in keep and k not in blocks_held]
        self.disk.release(drop)
        self._unplanned.clear()
        self._planned = True
        if self.cache.prefetch == 0:
            return
        with self._wake:
            self._queue[:] = [i for i in wanted if not self._paths(i)[0].exists()] + list(blocks)
            if self._queue and self._thread is None:
                # Held weakly: a dropped dataset is collected (its leases end), its thread ends.
                stop = threading.Event()
                args = (weakref.ref(self), self._wake, self._queue, stop)
                self._thread = threading.Thread(
                    target=_prefetch_loop, args=args, name="loaderkit-prefetch", daemon=True
                )
                self._thread.start()
                weakref.finalize(self, _stop_prefetch, self._wake, stop, os.getpid())
            self._wake.notify()

    def _fetch_ahead(self, job: int | _BlockJob) -> None:
        """Fetch a shard (or a range-read shard's blocks) for the next batches."""
        try:
            if isinstance(job, tuple):
                shard = self.shards[job[0]]
                self._blocks.fetch(shard, self._block_entries(*job), ahead=True)
            else:
                self.local(job, ahead=True)
        except NoRoom:
            with self._wake:  # wait for the next batch's window (a lease ends)
                self._queue.clear()
        except Exception:
            pass  # Busy: its downloader finishes it; else the read fetches it and raises

    def note_lanes(self, reading: Sequence[int], rest: Sequence[int]) -> None:
        """A stream slot reads shards ``reading`` now and ``rest`` after them, in order."""
        self.want(list(reading), list(rest)[: self.cache.prefetch])

    def read_unplanned(self, index: int) -> None:
        """A read with no prediction: keep a lease on the last few shards read this way."""
        self._window = None
        self._unplanned[index] = None
        self._unplanned.move_to_end(index)
        while len(self._unplanned) > _MAX_UNPLANNED_LEASES:
            old, _ = self._unplanned.popitem(last=False)
            self.disk.release([self._paths(old)[1].name])

    def observe(self, plan: Any) -> Any:
        """``plan``, noting on this dataset each schedule the loader starts with it."""
        return WatchedPlan(plan, self.board)

    def note_batch(self, first: int, ends: np.ndarray) -> list[int] | None:
        """Lease and prefetch the shards of the batches after the one starting at ``first``;
        the shards in use and next, or None when no prediction matches."""
        self._here()
        found = self._follow.locate(first, ends)
        if found is None:
            self._planned = False
            self.disk.count("unplanned")
            return None
        pred, step = found
        self._ends_hint = ends
        in_use, upcoming = pred.window(step, self.cache.prefetch)
        blocks = self._prefetch_blocks(pred, step) if self.cache.prefetch else []
        self.want(in_use, upcoming, blocks)
        return [*in_use, *upcoming]

    def _layout(self, index: int) -> Layout | None:
        """Shard ``index``'s layout if it is read by byte ranges (decided once), else None."""
        if index not in self._layouts:
            self._layouts[index] = self._try_probe(index) if self._rangeable(index) else None
        return self._layouts[index]

    def _try_probe(self, index: int) -> Layout | None:
        try:
            return self._probe(index)
        except RangesUnsupported:
            self._no_ranges = True
            return None

    def _eligible(self, index: int) -> bool:
        """Whether shard ``index`` is a plain, unhashed ``.npy``/``.bin`` of fixed-length tokens."""
        reader, shard = self.reader, self.shards[index]
        if self.cache.range_reads is False or not self.ranged_ok or self._no_ranges:
            return False
        if not isinstance(reader, TokenReader) or reader.seq_len is None or self._digest(index):
            return False
        if self.versionless(index):  # blocks fetched apart could hold two versions
            return False
        return shard.name.endswith((".npy", ".bin")) and shard.size > 0  # not .zst

    def _rangeable(self, index: int) -> bool:
        if not self._eligible(index):
            return False
        budget = self.disk.max_bytes // (self.cache.prefetch + 1)
        big = self.shards[index].total_bytes > budget
        if self.cache.range_reads is True or big:
            return True
        pred = self._follow.current
        if pred is None or not int(pred.reads.sum()):
            return False
        # This process reads about 1/workers of what its rank reads of a shard.
        ends = self._ends_hint
        shard_samples = int(ends[index]) - shard_start(ends, index)
        return int(pred.reads[index]) * pred.workers * 2 <= shard_samples

    def _probe(self, index: int) -> Layout | None:
        """The shard's layout: a ``.npy`` header read by a range read; a ``.bin``'s dtype."""
        reader, shard = self.reader, self.shards[index]
        assert isinstance(reader, TokenReader)
        # A probe past byte 0 finds out a server that ignores Range (it sends the whole object).
        probed = int(shard.size > 2)
        if shard.name.endswith(".npy"):
            if probed:
                self.storage.read_ranges(shard.url, [(1, 2)], shard.size)
            read = partial(self.storage.read_ranges, shard.url, size=shard.size)
            (head,) = read([(0, min(shard.size, HEAD_BYTES))], version=shard.version)
            fetched = [len(head)]
            need = npy_header_bytes(head)
            if need is not None and len(head) < need <= min(shard.size, 1 << 20):
                (head,) = read([(0, need)], version=shard.version)
                fetched.append(len(head))
            self.disk.count_ranges(sum(fetched) + probed, len(fetched) + probed)
            return npy_layout(head, shard.url, reader)
        dtype = reader.dtype
        side = [s for s in shard.sidecars if s[0] == shard.name + DTYPE_SUFFIX]
        if side:
            name, size, version = side[0]  # checked as the whole-file path downloads it
            text = self.storage.read_bytes(join_url(shard.folder, name), (size, version))
            header = np.dtype(text.decode().strip())
            if dtype is not None and header != dtype:
                return None  # the whole-file path refuses it, naming the dtypes
            dtype = header
        if dtype is None or shard.size % dtype.itemsize:
            return None  # the whole-file path raises its error
        if probed:
            self.storage.read_ranges(shard.url, [(1, 2)], shard.size)
            self.disk.count_ranges(1, 1)
        if not side:  # another format's header: the whole-file path judges the whole file
            span = [(0, min(shard.size, 8))]
            (head,) = self.storage.read_ranges(shard.url, span, shard.size, shard.version)
            self.disk.count_ranges(len(head), 1)
            if head.startswith(FOREIGN_MAGICS):
                return None
        return Layout(0, dtype, shard.size // dtype.itemsize)

    def open_ranged(self, index: int) -> OpenShard | None:
        """Shard ``index`` opened for range reads, or None (read from the whole file)."""
        self._here()
        layout = self._layout(index)
        if layout is None:
            return None
        assert isinstance(self.reader, TokenReader)
        return RangedTokens(self, index, layout, self.reader, self.shards[index].url)

    def read_spans(self, index: int, starts: np.ndarray, nbytes: int) -> np.ndarray:
        """The ``nbytes`` bytes at each of ``starts`` in shard ``index`` (uint8 rows)."""
        self._here()
        entries = self._block_entries(index, self._blocks.of(starts, nbytes))
        return self._blocks.read(self.shards[index], entries, starts, nbytes)

    def _block_entries(self, index: int, blocks: Iterable[int]) -> dict[int, Entry]:
        return {b: self._paths(index, b) for b in blocks}

    def _prefetch_blocks(self, pred: Prediction, step: int) -> list[_BlockJob]:
        """The ``(shard, blocks)`` the next ``prefetch`` batches read that the cache lacks."""
        if not any(self._layouts.values()):
            return []
        nxt = pred.steps[step + 1 : step + 1 + self.cache.prefetch]
        if not nxt:
            self._blocks.next = set()
            return []
        ends = self._ends_hint
        idx = np.concatenate([indices(pred.sched, s) for s in nxt]) % int(ends[-1])
        of = shard_of(ends, idx)
        reader = self.reader
        assert isinstance(reader, TokenReader) and reader.seq_len is not None
        jobs, keep = [], set()
        for shard in np.unique(of).tolist():
            layout = self._layouts.get(shard)
            if layout is None:
                continue
            local = idx[of == shard] - shard_start(ends, shard)
            item = layout.dtype.itemsize
            starts = layout.offset + local * (reader.seq_len * item)
            blocks = self._blocks.of(starts, (reader.seq_len + reader.targets) * item)
            keep |= {self._paths(shard, b)[1].name for b in blocks}
            todo = tuple(b for b in blocks if not self._paths(shard, b)[0].exists())
            if todo:
                jobs.append((shard, todo))
        self._blocks.next = keep
        return jobs
