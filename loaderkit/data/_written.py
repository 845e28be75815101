"""A folder's ``write_shards`` index is the truth for its shards, whatever reads them."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loaderkit.data.index import (
    INDEX_PREFIX,
    WORK_DIR,
    WRITER,
    IndexEntry,
    build_index,
    check_place,
    checksum,
    default_index_path,
    index_names,
    local_markers,
    path_key,
    read_index,
    remote_unchanged,
    unchanged,
    unfinished_write_error,
)
from loaderkit.data.readers import ShardReader
from loaderkit.errors import MissingShardError, ShardError

__all__: list[str] = []  # serves the sharded and streaming datasets and remote shards


def load_or_build_index(
    paths: Sequence[Path], reader: ShardReader, index: Path | None
) -> tuple[list[IndexEntry], Path]:
    """The checked index of ``paths``: read from ``index`` (default path if None), else built;
    with the hashes and dtypes of their folder's ``write_shards`` index (checked, whatever
    the reader)."""
    written = check_written(paths)
    index = default_index_path(paths, reader) if index is None else index
    if index.exists():
        entries = read_index(index, paths, reader)
    else:
        entries = build_index(paths, reader, index, exclusive=True)
    return [_with_written(e, w) for e, w in zip(entries, written, strict=True)], index


def check_written(paths: Sequence[Path]) -> list[dict[str, Any] | None]:
    """Refuse a shard that no longer matches the ``write_shards`` index of its folder (or its
    link target's), or whose folder holds an unfinished write; each shard's index extras
    there (hash, dtype; None: none)."""
    # A path list or glob of the folder too, and links to its shards.
    links = {p.resolve().parent for p in paths if p.is_symlink()}
    for folder in {p.parent for p in paths} | links:
        if (folder / WORK_DIR).exists():
            raise unfinished_write_error(str(folder), local_markers(folder))
    written = _written_entries(paths)
    digests = []
    for path in paths:
        row = written.get(path_key(path)) or written.get(path.resolve())
        if row is not None:
            where, entry = row
            fix = "re-run write_shards (copy a folder with cp -a or rsync -a), or delete the index."
            unchanged(dataclasses.replace(entry, path=path), f"write_shards index {where!r}", fix)
        digests.append(None if row is None else row[1].extras)
    return digests


def written_extras(
    docs: dict[str, bytes], listed: Sequence[tuple[str, int, str]]
) -> list[dict[str, Any] | None]:
    """Refuse a shard at a URL (``(url, size, version)``) that differs from its folder's
    ``write_shards`` index among ``docs`` (``{url: document}``); each one's index extras
    there (hash, dtype; None: not in one)."""
    rows: dict[str, tuple[str, list[Any]]] = {}
    for where, data in docs.items():
        folder = where.rsplit("/", 1)[0]
        reads = {url.rsplit("/", 1)[1] for url, _, _ in listed if url.startswith(f"{folder}/")}
        for row in _writer_rows(data, where, True, reads):
            rows[f"{folder}/{row[0]}"] = (where, row)
    out: list[dict[str, Any] | None] = []
    for url, size, version in listed:
        where, row = rows.get(url, ("", []))
        if not row:
            out.append(None)
            continue
        fix = f"re-run write_shards, or delete the index {where!r}."
        remote_unchanged(url, size, version, row, fix)
        out.append(row[4] if len(row) > 4 and isinstance(row[4], dict) else {})
    return out


_OLD_LIST = " (it may be an older loaderkit's index of a list of shards in several folders)"


def check_complete(
    folder: str,
    listed: Sequence[str],
    indexes: Sequence[tuple[str, bytes]],
    accept: Callable[[str], bool],
    kept: Sequence[tuple[str, bytes]] = (),
) -> None:
    """Refuse a folder that lacks a shard one of its ``indexes`` (``(where, document)``;
    ``kept``: kept elsewhere) lists, holds one its ``write_shards`` index does not, or two."""
    parsed = [(where, *(index_names(data) or ([], False))) for where, data in indexes]
    if not any(by_writer for _, _, by_writer in parsed):
        parsed += [(where, *(index_names(data) or ([], False))) for where, data in kept]
    have = set(listed)
    gone = {n for _, names, _ in parsed for n in names if accept(n) and n not in have}
    if gone:
        missing = sorted(gone)
        where = [(w, by_writer) for w, names, by_writer in parsed if set(names) & gone]
        # An older loaderkit wrote the index of a list of shards across folders into the
        # first folder: one write_shards did not write may be that.
        old = "" if any(b for _, b in where) else _OLD_LIST
        raise MissingShardError(
            f"shard folder {folder!r} lacks {len(missing)} shard(s) that its index "
            f"{', '.join(repr(w) for w, _ in where)} lists: {missing}; restore them, or delete "
            f"the index{old}.",
            path=f"{folder.rstrip('/')}/{missing[0]}",
        )
    # A corpus this reader cannot open (another suffix) lays no claim to the folder; two that
    # list different shards (another prefix, suffix or call) would mix in their union.
    claims = [(w, frozenset(filter(accept, names))) for w, names, by_writer in parsed if by_writer]
    writers = [w for w, corpus in claims if corpus]
    corpora = {corpus for _, corpus in claims if corpus}
    if len(corpora) > 1:
        raise ShardError(
            f"shard folder {folder!r} holds {len(corpora)} write_shards corpora (indexes "
            f"{', '.join(map(repr, sorted(writers)))}), so reading it cannot tell which one you "
            "mean; write each corpus to its own folder, or pass the list of one corpus' shards.",
            path=folder,
        )
    stray = sorted(have - {n for _, names, w in parsed if w for n in names}) if writers else []
    if stray:
        raise ShardError(
            f"shard folder {folder!r} holds {len(stray)} shard file(s) that its write_shards "
            f"index {', '.join(map(repr, writers))} does not list: {stray}; remove them, or "
            "re-run write_shards with every shard the folder should hold.",
            path=f"{folder.rstrip('/')}/{stray[0]}",
        )


def _writer_rows(data: bytes, where: str, remote: bool, reads: set[str]) -> list[list[Any]]:
    """The rows of the index ``data`` at ``where`` if ``write_shards`` wrote it (for a URL
    with ``remote``), else none; a damaged index is refused, as is one written for the other
    place that lists a shard this dataset ``reads`` (by name)."""
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):  # loaderkit writes its indexes whole: this one is damaged
        msg = f"shard index {where!r} is unreadable; delete it, or re-run write_shards."
        raise ShardError(msg, path=where)
    rows = doc.get("shards") if doc.get("written_by") == WRITER else []
    if not isinstance(rows, list) or (rows and doc.get("checksum") != checksum(rows)):
        msg = f"shard index {where!r} fails its checksum; delete it, or re-run write_shards."
        raise ShardError(msg, path=where)
    rows = [list(row) for row in rows if isinstance(row, list) and len(row) >= 4]
    if (doc.get("remote") is True) != remote:
        # Taken for none, it let a stream read changed shards unchecked; another corpus's
        # in the folder is not this dataset's to judge.
        if reads.isdisjoint(str(row[0]) for row in rows):
            return []
        check_place(doc, rows, where, remote)
    return rows


def _written_entries(paths: Sequence[Path]) -> dict[Path, tuple[str, IndexEntry]]:
    """``(index, row)`` of the ``write_shards`` indexes beside ``paths``, by :func:`path_key`."""
    found: dict[Path, tuple[str, IndexEntry]] = {}
    wanted = set(paths) | {path.resolve() for path in paths}
    for folder in {path.parent for path in wanted}:
        reads = {path.name for path in wanted if path.parent == folder}
        for where in folder.glob(f"{INDEX_PREFIX}*.json"):
            try:
                data = where.read_bytes()
            except OSError:
                continue
            for name, size, mtime, samples, *extras in _writer_rows(data, str(where), False, reads):
                with contextlib.suppress(TypeError, ValueError):
                    entry = IndexEntry(folder / name, int(size), int(mtime), samples, *extras[:1])
                    found[path_key(folder / name)] = (str(where), entry)
    return found


def _with_written(entry: IndexEntry, written: dict[str, Any] | None) -> IndexEntry:
    """``entry`` (another reader's index of the folder) with the hash and token dtype
    ``write_shards`` recorded for its shard, which win over its own."""
    pins = {k: v for k, v in (written or {}).items() if k in ("hash", "dtype")}
    if not pins or all((entry.extras or {}).get(k) == v for k, v in pins.items()):
        return entry
    # This reader's index recorded the header as it was when it counted.
    return dataclasses.replace(entry, extras={**(entry.extras or {}), **pins})
