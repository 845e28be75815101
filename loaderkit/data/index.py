"""The shard index: how many samples each shard holds, counted once and checked on every use.

A small JSON file lists, for each shard, its path (relative to the index),
byte size, modification time (ns) and sample count, plus the reader settings
the counts were made under and a checksum of the file list. Opening a
:class:`~loaderkit.data.sharded.ShardedDataset` stats every shard and compares:
a shard whose size or mtime changed since it was counted is an error naming
the file, because the plan's order and every saved position were computed
from the indexed counts.

By default the index lives next to the first shard, as
``.loaderkit-index-<key>.json`` where the key hashes the reader settings and
the shard names: other readers (another ``seq_len``) or another list of shards
get their own index; the same ones always find theirs. An index that
``write_shards`` wrote says so (``"written_by"``): its folder holds exactly
the shards it lists.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaderkit._atomic import atomic_write
from loaderkit.data._codec import (
    decode_into,
    default_cache_root,
    is_compressed,
    local_decode_dir,
)
from loaderkit.data.readers import ShardReader, _missing
from loaderkit.errors import MissingShardError, ShardChangedError, ShardError

# The index helpers serve the sharded and streaming datasets and the writer
# (loaderkit.data.writer, where write_shards lives).
__all__: list[str] = []

INDEX_VERSION = 2  # 2: a row may carry a 5th column, its extras (compression, hash)
_READABLE_VERSIONS = (1, 2)
INDEX_PREFIX = ".loaderkit-index-"
WORK_DIR = ".loaderkit-write"  # write_shards' markers: present while a write is unfinished
WRITER = "write_shards"  # an index's "written_by": its folder is the shards it lists, no more


@dataclass(frozen=True)
class IndexEntry:
    """One shard as indexed: where, which bytes, and how many samples."""

    path: Path
    size: int
    mtime_ns: int
    samples: int
    extras: dict[str, Any] | None = None  # compression, raw_size, hash

    @property
    def compression(self) -> str | None:
        """``"zstd"`` for a compressed shard, else None."""
        return None if self.extras is None else self.extras.get("compression")

    @property
    def digest(self) -> str | None:
        """The shard file's content hash, ``<algo>:<hex>``, or None."""
        return None if self.extras is None else self.extras.get("hash")

    def changed(self) -> str | None:
        """Why the file no longer matches this entry, or None."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return "missing"
        if st.st_size != self.size:
            return f"its size is {st.st_size} bytes, {self.size} when indexed"
        if st.st_mtime_ns != self.mtime_ns:
            return f"it was modified (mtime {st.st_mtime_ns} ns, {self.mtime_ns} when indexed)"
        return None


def _key(paths: Sequence[Path], spec: dict[str, Any]) -> str:
    blob = json.dumps({"spec": spec, "names": [p.name for p in paths]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def default_index_path(paths: Sequence[Path], reader: ShardReader) -> Path:
    """Where the index of these shards under this reader lives unless one is given."""
    return paths[0].parent / f"{INDEX_PREFIX}{_key(paths, reader.spec())}.json"


def _checksum(rows: list[list[Any]]) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def _doc(rows: list[list[Any]], reader: ShardReader, written_by: str | None) -> dict[str, Any]:
    """An index document (older loaderkit versions ignore ``written_by``)."""
    doc: dict[str, Any] = {
        "version": INDEX_VERSION if any(len(r) > 4 for r in rows) else 1,
        "reader": reader.spec(),
        "shards": rows,
        "checksum": _checksum(rows),
    }
    if written_by is not None:
        doc["written_by"] = written_by
    return doc


def _rel(path: Path, base: Path) -> str:
    try:
        return os.path.relpath(path.resolve(), base.resolve())
    except ValueError:  # another drive on Windows
        return str(path.resolve())


def _row(path: Path, base: Path, e: IndexEntry) -> list[Any]:
    row: list[Any] = [_rel(path, base), e.size, e.mtime_ns, e.samples]
    return [*row, e.extras] if e.extras else row


def count_local(path: Path, reader: ShardReader) -> tuple[int, dict[str, Any] | None]:
    """A local shard's sample count, and its index extras (a compressed one is decoded into
    the cache and counted there)."""
    if not is_compressed(path.name):
        return reader.count(path), None
    decoded = decode_into(path, local_decode_dir(path, default_cache_root()))
    return reader.count(decoded), {"compression": "zstd", "raw_size": decoded.stat().st_size}


def build_index(
    paths: Sequence[Path],
    reader: ShardReader,
    index: Path,
    *,
    exclusive: bool = False,
    known: dict[Path, tuple[int, dict[str, Any] | None]] | None = None,
    written_by: str | None = None,
) -> list[IndexEntry]:
    """Count every shard and write the index atomically (ranks may build it at once).

    With ``exclusive``, an index another process or thread wrote in the meantime
    wins: it is read (and checked) instead, so concurrent builders agree.
    ``known``: counts and extras already known (``write_shards``), by path.
    ``written_by``: :data:`WRITER` for the index ``write_shards`` writes.
    """
    entries = []
    for path in paths:
        try:
            before = path.stat()
        except FileNotFoundError:
            raise _missing(path) from None
        if known is not None and path in known:
            samples, extras = known[path]
        else:
            samples, extras = count_local(path, reader)
        if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
            raise TypeError(
                f"{type(reader).__name__}.count({str(path)!r}) returned {samples!r}; it must "
                "return the shard's number of samples as an int >= 0."
            )
        entries.append(IndexEntry(path, before.st_size, before.st_mtime_ns, samples, extras))
    base = index.parent
    rows = [_row(e.path, base, e) for e in entries]
    doc = _doc(rows, reader, written_by)
    try:
        written = atomic_write(
            index, lambda f: f.write(json.dumps(doc, indent=1).encode()), exclusive=exclusive
        )
    except OSError as exc:
        raise ShardError(
            f"cannot write the shard index {str(index)!r} ({exc}); pass index= a writable "
            "path, e.g. ShardedDataset(..., index='/tmp/my-index.json').",
            path=index,
        ) from exc
    if not written:  # another builder finished first: use its index
        return _read_index(index, paths, reader)
    return entries


def _extra_error(index: Path, extra: list[str]) -> ShardError:
    """The error for an index that lists shards ``extra`` besides those given."""
    gone = [p for p in extra if not os.path.exists(p)]
    if gone:
        return MissingShardError(
            f"shard index {str(index)!r} lists shards that do not exist: {gone}; restore "
            "them, or delete the index if they were removed on purpose.",
            path=gone[0],
        )
    return ShardError(
        f"shard index {str(index)!r} also lists {extra[:3]} (missing from the shards "
        "given); pass every shard it was built for, or delete it to count this list.",
        path=index,
    )


def _read_index(index: Path, paths: Sequence[Path], reader: ShardReader) -> list[IndexEntry]:
    try:
        doc = json.loads(index.read_text())
        rows = doc["shards"]
        ok = doc["version"] in _READABLE_VERSIONS and doc["checksum"] == _checksum(rows)
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(
            f"shard index {str(index)!r} is unreadable ({type(exc).__name__}: {exc}); delete "
            "it so the shards are counted again.",
            path=index,
        ) from exc
    if not ok:
        raise ShardError(
            f"shard index {str(index)!r} fails its checksum or is from another loaderkit "
            "version; delete it so the shards are counted again.",
            path=index,
        )
    if doc["reader"] != reader.spec():
        raise ShardError(
            f"shard index {str(index)!r} was counted with reader settings {doc['reader']}, "
            f"this reader has {reader.spec()}; pass another index= path, or delete it.",
            path=index,
        )
    base = index.parent
    by_name = {(base / r[0]).resolve(): r for r in rows}
    wanted = [p.resolve() for p in paths]
    for path, resolved in zip(paths, wanted, strict=True):
        if resolved not in by_name:
            raise ShardError(
                f"shard {str(path)!r} is not in the shard index {str(index)!r}; pass the "
                "shards it was built for, or delete it so the new list is counted.",
                path=path,
            )
    if len(set(wanted)) != len(rows):
        raise _extra_error(index, sorted(str(p) for p in set(by_name) - set(wanted)))
    entries = [
        IndexEntry(
            p,
            int(by_name[r][1]),
            int(by_name[r][2]),
            int(by_name[r][3]),
            by_name[r][4] if len(by_name[r]) > 4 else None,
        )
        for p, r in zip(paths, wanted, strict=True)
    ]
    for entry in entries:
        why = entry.changed()
        if why == "missing":
            raise _missing(entry.path)
        if why is not None:
            raise ShardChangedError(
                f"shard {str(entry.path)!r} no longer matches the shard index "
                f"{str(index)!r}: {why}. The sample counts, and with them the order and any "
                "saved position, would be wrong; delete the index so the shards are "
                "counted again (and restart the run: a saved position does not carry over).",
                path=entry.path,
            )
    return entries


# ------------------------------------------------------------- remote folders
# A remote folder's index has the same name and layout, with an object's
# version (ETag, else its modification time, as the listing gives it) where a
# local index has an mtime: rows are [name, size, version, samples] (and extras, as locally).


def remote_index_name(names: Sequence[str], reader: ShardReader) -> str:
    """The index file name of shards ``names`` under ``reader`` (as for a local folder)."""
    return f"{INDEX_PREFIX}{_key([Path(n) for n in names], reader.spec())}.json"


def remote_index_doc(
    rows: list[list[Any]], reader: ShardReader, written_by: str | None = None
) -> bytes:
    """The index document of ``rows`` (``[name, size, version, samples(, extras)]`` each)."""
    doc = {"remote": True, **_doc(rows, reader, written_by)}
    return json.dumps(doc, indent=1).encode()


def _other_names_error(
    where: str, names: list[str], indexed: list[str], folder: bool
) -> ShardError:
    """The error for a remote index of other shards than the ``names`` listed."""
    missing = sorted(set(names) - set(indexed))[:3]
    extra = sorted(set(indexed) - set(names))
    if folder and extra:
        return MissingShardError(
            f"the shard folder lacks {len(extra)} shard(s) that its index {where!r} lists: "
            f"{extra}; restore them (or re-run write_shards), or pass another index=.",
            path=where,
        )
    return ShardError(
        f"shard index {where!r} does not list the same shards (not in it: {missing}; only "
        f"in it: {extra[:3]}); pass the shards it was built for, or delete it so this list "
        "is counted.",
        path=where,
    )


def read_remote_index(
    data: bytes,
    where: str,
    reader: ShardReader,
    listed: Sequence[tuple[str, str, int, str]],
    *,
    folder: bool = False,
) -> tuple[list[int], list[dict[str, Any] | None]]:
    """The sample counts and extras of the shards ``listed`` (``(url, name, size, version)``
    each, as listed now) from the index document ``data`` found at ``where``, checked against
    the listing: an object that changed since it was counted is an error naming its URL.
    ``folder``: ``listed`` is a whole folder, so a shard only the index lists is missing."""
    try:
        doc = json.loads(data)
        rows = doc["shards"]
        ok = (
            doc["version"] in _READABLE_VERSIONS
            and doc.get("remote") is True
            and doc["checksum"] == _checksum(rows)
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise ShardError(
            f"shard index {where!r} is unreadable ({type(exc).__name__}: {exc}); delete it so "
            "the shards are counted again.",
            path=where,
        ) from exc
    if not ok:
        raise ShardError(
            f"shard index {where!r} fails its checksum or is not a remote folder's index of "
            "this loaderkit version; delete it so the shards are counted again.",
            path=where,
        )
    if doc["reader"] != reader.spec():
        raise ShardError(
            f"shard index {where!r} was counted with reader settings {doc['reader']}, this "
            f"reader has {reader.spec()}; pass another index=, or delete it.",
            path=where,
        )
    by_name = {str(r[0]): r for r in rows}
    names = [name for _, name, _, _ in listed]
    if sorted(by_name) != sorted(names):
        raise _other_names_error(where, names, list(by_name), folder)
    samples: list[int] = []
    extras: list[dict[str, Any] | None] = []
    for url, name, size, version in listed:
        row = by_name[name]
        _, isize, iversion, count = row[:4]
        extras.append(row[4] if len(row) > 4 else None)
        if int(isize) != size or str(iversion) != version:
            raise ShardChangedError(
                f"shard {url!r} changed after it was indexed (now {size} bytes, version "
                f"{version!r}; indexed: {isize} bytes, {iversion!r}): the sample counts, the "
                f"order and every saved position would be wrong; delete the index {where!r} "
                "and restart the run.",
                path=url,
            )
        samples.append(int(count))
    return samples, extras


# ------------------------------------------------------- a folder as a whole
# The index write_shards wrote is the truth for its folder: a listing that lacks
# shards an index of the folder lists is an incomplete corpus, never a smaller one.


def is_index_name(name: str) -> bool:
    """Whether a file of this name is a shard index."""
    return name.startswith(INDEX_PREFIX) and name.endswith(".json")


def index_names(data: bytes) -> list[str] | None:
    """The names of the shards an index document lists in its own folder (None: unreadable)."""
    parsed = _folder_listing(data)
    return None if parsed is None else parsed[0]


def _folder_listing(data: bytes) -> tuple[list[str], bool] | None:
    """:func:`index_names`, and whether ``write_shards`` wrote the index (None: unreadable)."""
    try:
        doc = json.loads(data)
        rows = doc["shards"]
        names = [str(r[0]) for r in rows if "/" not in str(r[0]) and os.sep not in str(r[0])]
        return names, doc.get("written_by") == WRITER
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def unfinished_write_error(folder: str) -> ShardError:
    """The error for a folder whose ``write_shards`` stopped part-way (its markers are there)."""
    return ShardError(
        f"shard folder {folder!r} holds an unfinished write_shards ({WORK_DIR}/ is there: it "
        "stopped part-way, so shards may be missing); re-run the same write_shards call, which "
        "resumes and finishes it.",
        path=folder,
    )


def check_complete(
    folder: str,
    listed: Sequence[str],
    indexes: Sequence[tuple[str, bytes]],
    accept: Callable[[str], bool],
    kept: Sequence[tuple[str, bytes]] = (),
) -> None:
    """Raise :class:`MissingShardError` naming every shard that an index of ``folder`` lists
    (among the names ``accept`` takes: this reader's) and its listing ``listed`` lacks; and,
    when ``write_shards`` wrote an index of it, :class:`ShardError` naming every listed shard
    that none of those indexes lists (a stray file, not part of the corpus).

    ``indexes``: ``(where, document)`` of each index file in the folder; ``kept``: those kept
    for it elsewhere (a read-only folder's, in the cache), used unless ``write_shards`` wrote
    one in it (then that one is the truth: a cached index may predate a rewrite).
    """
    parsed = [(where, *(_folder_listing(data) or ([], False))) for where, data in indexes]
    if not any(by_writer for _, _, by_writer in parsed):
        parsed += [(where, *(_folder_listing(data) or ([], False))) for where, data in kept]
    have = set(listed)
    gone: set[str] = set()
    where: list[str] = []
    written: set[str] = set()
    writers: list[str] = []
    for name, names, by_writer in parsed:
        lost = {n for n in names if accept(n) and n not in have}
        if lost:
            gone |= lost
            where.append(name)
        if by_writer:
            written.update(names)
            writers.append(name)
    if gone:
        missing = sorted(gone)
        raise MissingShardError(
            f"shard folder {folder!r} lacks {len(missing)} shard(s) that its index "
            f"{', '.join(map(repr, where))} lists: {missing}; restore them (or re-run "
            "write_shards), or delete the index if they were removed on purpose.",
            path=f"{folder.rstrip('/')}/{missing[0]}",
        )
    stray = sorted(have - written) if writers else []
    if stray:
        raise ShardError(
            f"shard folder {folder!r} holds {len(stray)} shard file(s) that its write_shards "
            f"index {', '.join(map(repr, writers))} does not list: {stray}; remove them, or "
            "re-run write_shards with every shard the folder should hold.",
            path=f"{folder.rstrip('/')}/{stray[0]}",
        )


def load_or_build_index(
    paths: Sequence[Path], reader: ShardReader, index: Path | None
) -> tuple[list[IndexEntry], Path]:
    """The checked index of ``paths``: read from ``index`` (default path if None), else built."""
    index = default_index_path(paths, reader) if index is None else index
    if index.exists():
        return _read_index(index, paths, reader), index
    for path in paths:
        if not path.exists():
            raise _missing(path)
    return build_index(paths, reader, index, exclusive=True), index


def __getattr__(name: str) -> Any:
    # write_shards lived here before loaderkit.data.writer; keep the old import path working.
    if name == "write_shards":
        from loaderkit.data.writer import write_shards

        return write_shards
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
