"""The shard index: a JSON file of each shard's path, size, mtime (or version) and samples."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loaderkit._atomic import atomic_write
from loaderkit.data._codec import decoded_local, is_compressed
from loaderkit.data.readers import ShardReader, _missing, pinned_dtype
from loaderkit.errors import MissingShardError, ShardChangedError, ShardError

__all__: list[str] = []  # serves the sharded and streaming datasets and the writer

INDEX_VERSION = 2  # 2: a row may carry extras (compression, hash, dtype) as a 5th column
_READABLE_VERSIONS = (1, 2)
INDEX_PREFIX = ".loaderkit-index-"
WORK_DIR = ".loaderkit-write"  # write_shards' markers: present while a write is unfinished
WRITER = "write_shards"  # an index's "written_by"


@dataclass(frozen=True)
class IndexEntry:
    path: Path
    size: int
    mtime_ns: int
    samples: int
    extras: dict[str, Any] | None = None  # compression, raw_size, hash, dtype

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


def remote_index_name(names: Sequence[str], reader: ShardReader) -> str:
    """The index file name of shards ``names`` under ``reader``."""
    blob = json.dumps({"spec": reader.spec(), "names": list(names)}, sort_keys=True)
    return f"{INDEX_PREFIX}{hashlib.sha256(blob.encode()).hexdigest()[:16]}.json"


def default_index_path(paths: Sequence[Path], reader: ShardReader) -> Path:
    """The default index path of these shards under ``reader``: beside the first."""
    base = paths[0].parent
    names = [p.name if p.parent == base else os.path.relpath(p, base) for p in paths]
    return base / remote_index_name(names, reader)


def checksum(rows: list[list[Any]]) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def index_doc(
    rows: list[list[Any]], reader: ShardReader, written_by: str | None = None, remote: bool = False
) -> bytes:
    """The index document of ``rows`` (``[path, size, mtime or version, samples(, extras)]``)."""
    doc: dict[str, Any] = {"remote": True} if remote else {}
    doc |= {
        "version": INDEX_VERSION if any(len(r) > 4 for r in rows) else 1,
        "reader": reader.spec(),
        "shards": rows,
        "checksum": checksum(rows),
    }
    if written_by is not None:
        doc["written_by"] = written_by
    return json.dumps(doc, indent=1).encode()


def checked_count(reader: Any, shard: Any, samples: Any) -> int:
    """``samples``, what ``reader.count(shard)`` returned, if it is an int >= 0."""
    if isinstance(samples, np.integer):
        samples = int(samples)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        raise TypeError(
            f"{type(reader).__name__}.count({str(shard)!r}) returned {samples!r}; return the "
            "shard's number of samples as an int >= 0."
        )
    return samples


def _count_local(path: Path, reader: ShardReader) -> tuple[int, dict[str, Any] | None]:
    if not is_compressed(path.name):
        return reader.count(path), pinned_dtype(path) or None
    decoded = decoded_local(path)
    size = decoded.stat().st_size
    return reader.count(decoded), {"compression": "zstd", "raw_size": size, **pinned_dtype(decoded)}


def path_key(path: Path) -> Path:
    """``path`` with its folder's links resolved but not its own (two links stay two shards)."""
    return path.parent.resolve() / path.name


def _rel(path: Path, base: Path) -> str:
    try:
        return os.path.relpath(path_key(path), base.resolve())
    except ValueError:  # another drive on Windows
        return str(path_key(path))


def build_index(
    paths: Sequence[Path],
    reader: ShardReader,
    index: Path,
    *,
    exclusive: bool = False,
    known: dict[Path, tuple[int, dict[str, Any] | None]] | None = None,
    written_by: str | None = None,
) -> list[IndexEntry]:
    """Count every shard (unless ``known``) and write the index atomically (``exclusive``: an
    index another builder wrote meanwhile wins)."""
    if (gone := next((p for p in paths if not p.exists()), None)) is not None:
        raise _missing(gone)  # before any shard is counted
    entries = []
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:  # removed while the others were counted
            raise _missing(path) from None
        samples, extras = known[path] if known and path in known else _count_local(path, reader)
        samples = checked_count(reader, path, samples)
        entries.append(IndexEntry(path, st.st_size, st.st_mtime_ns, samples, extras))
    rows = [
        [_rel(e.path, index.parent), e.size, e.mtime_ns, e.samples, *([e.extras] * bool(e.extras))]
        for e in entries
    ]
    doc = index_doc(rows, reader, written_by)
    try:
        written = atomic_write(index, lambda f: f.write(doc), exclusive=exclusive)
    except OSError as exc:
        msg = f"cannot write the shard index {str(index)!r} ({exc}); pass index= a writable path."
        raise ShardError(msg, path=index) from exc
    return entries if written else read_index(index, paths, reader)


def _rows(data: bytes, where: str, reader: ShardReader, remote: bool) -> list[list[Any]]:
    """The rows of the index ``data`` at ``where``, checked: checksum, version, kind, reader."""
    try:
        doc = json.loads(data)
        rows = doc["shards"]
        ok = doc["version"] in _READABLE_VERSIONS and doc["checksum"] == checksum(rows)
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"shard index {where!r} is unreadable ({type(exc).__name__}: {exc}); delete it "
        msg += "so the shards are counted again."
        raise ShardError(msg, path=where) from exc
    if not ok:
        msg = f"shard index {where!r} fails its checksum or is of another loaderkit version; "
        msg += "delete it so the shards are counted again."
        raise ShardError(msg, path=where)
    check_place(doc, rows, where, remote)
    if doc["reader"] != reader.spec():
        raise ShardError(
            f"shard index {where!r} was counted with reader settings {doc['reader']}, this "
            f"reader has {reader.spec()}; pass another index=, or delete it.",
            path=where,
        )
    return list(rows)


def check_place(doc: dict[str, Any], rows: list[Any], where: str, remote: bool) -> None:
    """Refuse the index ``doc`` at ``where`` if written for the other place (a URL, a local
    folder), unless read at a URL with every row's content hash (checked on download)."""
    # Its rows hold object versions (for a URL) or file mtimes (for a local folder), which
    # the other place's files do not match: a copied or uploaded folder takes its index along.
    if (doc.get("remote") is True) != remote and not (remote and all(map(hashed_row, rows))):
        written, here = ("a local folder", "a URL") if remote else ("a URL", "a local folder")
        raise ShardError(
            f"shard index {where!r} was written for {written}, and the shards are read from "
            f"{here}. Re-run write_shards to the place you read from, or delete the index to "
            "count the shards there.",
            path=where,
        )


def read_index(index: Path, paths: Sequence[Path], reader: ShardReader) -> list[IndexEntry]:
    rows = _rows(index.read_bytes(), str(index), reader, remote=False)
    by_path = {path_key(index.parent / r[0]): r for r in rows}
    # An index of loaderkit <= 0.2.0 keyed a link by its target.
    wanted = [path_key(p) if path_key(p) in by_path else p.resolve() for p in paths]
    for path, resolved in zip(paths, wanted, strict=True):
        if resolved not in by_path:
            raise ShardError(
                f"shard {str(path)!r} is not in the shard index {str(index)!r}; pass the "
                "shards it was built for, or delete it.",
                path=path,
            )
    if len(set(wanted)) != len(rows):
        extra = sorted(str(p) for p in set(by_path) - set(wanted))
        gone = [p for p in extra if not os.path.exists(p)]
        if gone:
            raise MissingShardError(
                f"shard index {str(index)!r} lists shards that do not exist: {gone}; restore "
                "them, or delete the index.",
                path=gone[0],
            )
        msg = f"shard index {str(index)!r} also lists {extra[:3]}; pass them too, or delete it."
        raise ShardError(msg, path=index)
    entries = []
    for path, resolved in zip(paths, wanted, strict=True):
        _, size, mtime, samples, *extras = by_path[resolved]
        entry = IndexEntry(path, int(size), int(mtime), int(samples), *extras[:1])
        where = f"shard index {str(index)!r}"
        fix = (
            "in a copy made without its times (cp -r; cp -a keeps them), delete the index (or "
            "pass index=) and resume; if the shard itself changed, restart the run."
        )
        entries.append(unchanged(entry, where, fix))
    return entries


def unchanged(entry: IndexEntry, where: str, fix: str) -> IndexEntry:
    """``entry``, refused where its file no longer matches it (as the index ``where`` has it)."""
    why = entry.changed()
    if why == "missing":
        raise _missing(entry.path)
    if why is not None:
        raise ShardChangedError(
            f"shard {str(entry.path)!r} no longer matches the {where}: {why}; {fix}",
            path=entry.path,
        )
    return entry


def read_remote_index(
    data: bytes,
    where: str,
    reader: ShardReader,
    listed: Sequence[tuple[str, str, int, str]],
    *,
    folder: bool = False,
) -> tuple[list[int], list[dict[str, Any] | None]]:
    """The sample counts and extras of the ``listed`` shards from the index ``data``."""
    by_name = {str(r[0]): r for r in _rows(data, where, reader, remote=True)}
    names = [name for _, name, _, _ in listed]
    if sorted(by_name) != sorted(names):
        missing = sorted(set(names) - set(by_name))[:3]
        extra = sorted(set(by_name) - set(names))
        if folder and extra:
            raise MissingShardError(
                f"the shard folder lacks {len(extra)} shard(s) that its index {where!r} "
                f"lists: {extra}; restore them, or pass another index=.",
                path=where,
            )
        raise ShardError(
            f"shard index {where!r} does not list the same shards (not in it: {missing}; only "
            f"in it: {extra[:3]}); delete it.",
            path=where,
        )
    fix = f"delete the index {where!r} and restart the run."
    for url, name, size, version in listed:
        remote_unchanged(url, size, version, by_name[name], fix)
    rows = [by_name[name] for _, name, _, _ in listed]
    return [int(r[3]) for r in rows], [r[4] if len(r) > 4 else None for r in rows]


def hashed_row(row: list[Any]) -> bool:
    """Whether an index row holds its shard's content hash."""
    return len(row) > 4 and isinstance(row[4], dict) and bool(row[4].get("hash"))


def remote_unchanged(url: str, size: int, version: str, row: list[Any], fix: str) -> None:
    """Refuse the object at ``url`` where it differs from its index ``row`` (version "": size).
    A row with a content hash holds at its size under any version (a copy of the folder gets
    new ETags): the hash is checked on each download, and its rows are never range-read."""
    if int(row[1]) != size or (str(row[2]) not in ("", version) and not hashed_row(row)):
        raise ShardChangedError(
            f"shard {url!r} changed after it was indexed (now {size} bytes, version "
            f"{version!r}; indexed: {row[1]} bytes, {row[2]!r}); {fix}",
            path=url,
        )


def is_index_name(name: str) -> bool:
    return name.startswith(INDEX_PREFIX) and name.endswith(".json")


def index_names(data: bytes) -> tuple[list[str], bool] | None:
    """The shard names an index lists in its folder and whether ``write_shards`` wrote it."""
    try:
        doc = json.loads(data)
        names = [str(r[0]) for r in doc["shards"]]
        local = [n for n in names if "/" not in n and os.sep not in n]
        return local, doc.get("written_by") == WRITER
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def unfinished_write_error(folder: str, markers: Sequence[str] = ()) -> ShardError:
    """``folder``'s unfinished write, named by the shards its ``markers`` (the file names in
    its ``WORK_DIR``) are for: ``part-*.npy`` where ``part-00001.npy.json`` is there."""
    own = (re.fullmatch(r"(.+)-(?:started|\d{5,})(\.[^/]*)?\.json", m) for m in markers)
    writes = sorted({f"{m[1]}-*{m[2] or ''}" for m in own if m})
    which = f" of shards {', '.join(map(repr, writes))}" if writes else ""
    return ShardError(
        f"shard folder {folder!r} holds an unfinished write_shards{which} ({WORK_DIR}/ is "
        "there); re-run the same write_shards call to finish it.",
        path=folder,
    )


def local_markers(folder: Path) -> list[str]:
    """The file names in ``folder``'s ``WORK_DIR`` (none where it cannot be listed)."""
    try:
        return os.listdir(folder / WORK_DIR)
    except OSError:
        return []
