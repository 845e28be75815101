"""Which shards a dataset has, and the shards one process holds open (private)."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from loaderkit.data._codec import (
    ZSTD_SUFFIX,
    decode_into,
    decoded_name,
    default_cache_root,
    is_compressed,
    local_decode_dir,
    verify_local,
    with_compressed,
)
from loaderkit.data._fs import refuse_file_url
from loaderkit.data._written import check_complete
from loaderkit.data.index import (
    INDEX_PREFIX,
    WORK_DIR,
    IndexEntry,
    is_index_name,
    local_markers,
    unfinished_write_error,
)
from loaderkit.data.readers import (
    OWN_SUFFIXES,
    OpenShard,
    ShardReader,
    _opened,
    check_pinned,
    out_of_files,
)
from loaderkit.errors import (
    MissingDependencyError,
    MissingShardError,
    ReaderSettingError,
    ShardChangedError,
    ShardError,
)

_WRITTEN = re.compile(r"(.+)-([0-9]{5,})(\..+)?")  # write_shards' {prefix}-{number}{suffix}
# Compressions no reader opens (zstd is decoded): a shard so compressed is no shard name.
_OTHER_COMPRESSIONS = (".gz", ".bz2", ".xz", ".lz4", ".zip", ".br", ".zstd", ".7z")


def shard_name(shard: Any) -> str:
    """How messages name a shard: its path, or the repr of a shard object."""
    return repr(str(shard)) if isinstance(shard, Path) else repr(shard)


def names_crc32(paths: Sequence[str], parts: Sequence[int] = ()) -> int:
    """crc32 of the paths below their common folder, in order (a copied folder keeps it).

    Paths that share no folder (a local folder and a URL) are taken per part (``parts``: the
    path count of each, in order) below the part's own folder, named by the shortest end of
    that folder that tells the parts apart: moving one of them keeps it too.
    """
    split = [p.split("/") for p in paths]
    common = _common(split)
    if common or len(parts) < 2:
        return zlib.crc32("\n".join("/".join(p[common:]) for p in split).encode())
    groups = [split[sum(parts[:i]) : sum(parts[: i + 1])] for i in range(len(parts))]
    folders = [tuple(g[0][: _common(g)]) if g else () for g in groups]
    k = next(k for k in itertools.count(1) if len({f[-k:] for f in folders}) == len(set(folders)))
    lines = [
        "/".join([*f[-k:], *p[len(f) :]]) for f, g in zip(folders, groups, strict=True) for p in g
    ]
    return zlib.crc32("\n".join(lines).encode())


def _common(split: list[list[str]]) -> int:
    """How many folders all of these split paths share."""
    common = 0
    for level in zip(*(p[:-1] for p in split), strict=False):
        if len(set(level)) > 1:
            break
        common += 1
    return common


def never_a_shard(name: str) -> str | None:
    """Why a file of this name is never a shard (hidden, or loaderkit's own), or None."""
    if name.startswith("._"):
        return "a macOS AppleDouble metadata file"
    if name.startswith(INDEX_PREFIX):
        return "loaderkit's shard index"
    if name.startswith("."):
        return "a hidden file"
    if name.endswith(OWN_SUFFIXES):
        return "a loaderkit sidecar file"
    return None


def is_shard_name(name: str, suffixes: tuple[str, ...]) -> bool:
    """Whether a listed file ``name`` is a shard of a reader with these ``suffixes``."""
    return name.endswith(with_compressed(suffixes)) and never_a_shard(name) is None


def sorted_shards(names: Iterable[str]) -> list[str]:
    """A folder's shard names in order: by name, or by number where ``write_shards`` named all."""
    names = list(names)
    written = [_WRITTEN.fullmatch(name) for name in names]
    if not all(written):
        return sorted(names)
    keys = [
        (m[1], int(m[2]), m[3] or "", name) for m, name in zip(written, names, strict=True) if m
    ]
    return [key[-1] for key in sorted(keys)]


def refuse_unread_compressed(owner: str, folder: str, names: Iterable[str], suffixes: Any) -> None:
    """Refuse a folder holding a shard no reader opens as named (compressed otherwise, or
    its suffix in another case): a listing would leave it out without a word."""
    read = tuple(suffixes)
    unread = [n for n in names if not is_shard_name(n, read) and not never_a_shard(n)]
    compressed = tuple((s + c).lower() for s in read for c in _OTHER_COMPRESSIONS)
    odd = sorted(n for n in unread if n.lower().endswith(compressed))
    if odd:
        raise ValueError(
            f"{owner}: {folder!r} holds {odd[0]!r}, compressed in a form no reader opens, so "
            f"its samples would be left out; decompress it, recompress it with zstd "
            f"({ZSTD_SUFFIX}), or move it out of the folder."
        )
    cased = sorted(
        n for n in unread if n.lower().endswith(tuple(map(str.lower, with_compressed(read))))
    )
    if cased:
        raise ValueError(
            f"{owner}: {folder!r} holds {cased[0]!r}, whose suffix differs from the reader's "
            f"{list(read)} only in case, so its samples would be left out; rename it, or move "
            "it out of the folder."
        )


def refuse_nested_shards(owner: str, folder: str, nested: Iterable[str], suffixes: Any) -> None:
    """Refuse a folder with shards in a subfolder (``nested``: the files under them), which
    its listing (not recursive) would leave out without a word."""
    read = tuple(suffixes)  # any case, any compression: each is left out as well
    like = tuple((s + c).lower() for s in read for c in ("", ZSTD_SUFFIX, *_OTHER_COMPRESSIONS))
    for rel in nested:
        name = rel.rsplit("/", 1)[-1]
        if name.lower().endswith(like) and never_a_shard(name) is None:
            raise ValueError(
                f"{owner}: {folder!r} holds the shard {rel!r} in a subfolder, which reading "
                "the folder leaves out; pass the list of shard paths (or URLs) to read, or "
                "move the subfolder out."
            )


def nested_files(root: Path) -> Iterator[str]:
    """The files under ``root``'s subfolders (hidden ones left out), relative to it; a linked
    subfolder once, and never one holding ``root`` or the folder it is in (``..``, ``/``)."""
    top = Path(os.path.realpath(root))
    seen = {top}
    for folder, subfolders, files in os.walk(root, followlinks=True):
        here = Path(os.path.realpath(folder))
        real = {d: Path(os.path.realpath(os.path.join(folder, d))) for d in subfolders}
        subfolders[:] = sorted(
            d
            for d in subfolders
            if not d.startswith(".")
            and real[d] not in seen
            and not top.is_relative_to(real[d])
            and not here.is_relative_to(real[d])
        )
        seen.update(real[d] for d in subfolders)
        rel = Path(folder).relative_to(root).as_posix()
        if rel != ".":
            yield from (f"{rel}/{name}" for name in files)


@contextlib.contextmanager
def named_by_url(copy: Path, url: str) -> Iterator[None]:
    """Let a :class:`ShardError` about the cached ``copy`` of the object at ``url`` (or its
    decoded form) name ``url``, the object the user can fix; one about a sidecar beside it
    keeps the cached file's name, which the advice to delete it is about."""
    own = (copy, copy.with_name(decoded_name(copy.name)))
    try:
        yield
    except ShardError as exc:
        local = exc.path
        if isinstance(local, str | os.PathLike) and Path(local) in own:
            exc.args = (str(exc).replace(str(local), url), *exc.args[1:])
            exc.path = url
        raise


def refuse_one_shard_twice(owner: str, names: Iterable[str]) -> None:
    """Refuse a shard URL listed with its zstd form (``x`` and ``x.zst``): read twice."""
    seen: dict[str, str] = {}
    for name in names:
        first = seen.setdefault(decoded_name(name), name)
        if first != name:
            raise ValueError(
                f"{owner}: shards {first!r} and {name!r} are one shard, plain and "
                "zstd-compressed; its samples would be read twice. Keep one of the two."
            )


def refuse_own_file(owner: str, shard: str, name: str, listing: str) -> None:
    """Refuse a listed file ``shard`` named ``name`` that is loaderkit's own."""
    why = never_a_shard(name)
    if why is not None and why != "a hidden file":
        raise ValueError(
            f"{owner}: shards lists {shard!r}, {why}, not a shard; leave it out of the list "
            f"(a {listing} listing skips it)."
        )


def read_docs(paths: Iterable[Path]) -> list[tuple[str, bytes]]:
    """``(path, content)`` of each of ``paths`` that can be read."""
    out = []
    for p in paths:
        with contextlib.suppress(OSError):
            out.append((str(p), p.read_bytes()))
    return out


def _refuse_links_to_one_file(owner: str, paths: list[Path]) -> None:
    """Refuse a path listed twice, a link to another listed file, or a file beside its zstd
    form; links sharing a target outside the list (a Hugging Face snapshot's) are fine."""
    parents: dict[Path, Path] = {}  # one resolve() per folder, not per file

    def real(path: Path) -> Path:
        if path.parent not in parents:
            parents[path.parent] = path.parent.resolve()
        return parents[path.parent] / decoded_name(path.name)

    def target(path: Path) -> Path:
        resolved = path.resolve()
        return resolved.with_name(decoded_name(resolved.name))

    seen: dict[Path, Path] = {}
    twice = [(seen.setdefault(real(path), path), path) for path in paths]
    links = [(seen.get(target(path), path), path) for path in paths if path.is_symlink()]
    for first, path in twice + links:
        if first is not path:
            how = "a link to it" if path.is_symlink() or first.is_symlink() else "listed twice"
            if is_compressed(first.name) != is_compressed(path.name):
                how = "plain and zstd-compressed"
            raise ValueError(
                f"{owner}: shards {str(first)!r} and {str(path)!r} are one file ({how}); its "
                "samples would be read twice. List or keep each file once."
            )


def loaderkit_reads(reader: Any, method: str) -> bool:
    """Whether ``reader``'s ``method`` (``open``, ``iter_from``) is loaderkit's own code,
    which opens files; a user's may open folders."""
    fn = getattr(type(reader), method, None)
    return str(getattr(fn, "__module__", "")).startswith("loaderkit.")


def resolve_shards(
    shards: Any, reader: ShardReader, owner: str = "ShardedDataset", files: bool = False
) -> list[Any]:
    """The shard list of ``ShardedDataset(shards, ...)``: a directory's shard files, or the
    listed paths or objects, checked (a listed folder is a shard where its name is one and
    the reader may open folders, ``files`` False: Arrow's ``save_to_disk`` writes them)."""
    if isinstance(shards, str | os.PathLike):
        refuse_file_url(owner, "shards", shards)
        root = Path(shards).absolute()  # read where it was built, whatever the cwd is later
        if not root.is_dir():
            raise ValueError(
                f"{owner}: shards={str(root)!r} is not a directory; pass a directory "
                "of shards or a list of shard paths."
            )
        if (root / WORK_DIR).exists():
            raise unfinished_write_error(str(root), local_markers(root))
        entries = list(root.iterdir())
        refuse_unread_compressed(owner, str(root), (p.name for p in entries), reader.suffixes)
        refuse_nested_shards(owner, str(root), nested_files(root), reader.suffixes)
        accept = partial(is_shard_name, suffixes=tuple(reader.suffixes))
        by_name = {p.name: p for p in entries if accept(p.name)}
        found = [by_name[name] for name in sorted_shards(by_name)]
        if not found:
            raise ValueError(
                f"{owner}: no file ending in {list(reader.suffixes)} (or with .zst appended) in "
                f"{str(root)!r}; pass the directory that holds the shards, or a reader with "
                "their suffix."
            )
        indexes = read_docs(p for p in entries if is_index_name(p.name))
        check_complete(str(root), [p.name for p in found], indexes, accept)
        _refuse_links_to_one_file(owner, found)
        return found
    items = list(shards)
    if not items:
        raise ValueError(f"{owner}: shards is empty; pass at least one shard.")
    if all(isinstance(s, str | os.PathLike) for s in items):
        for item in items:
            refuse_file_url(owner, "shards", item)
        paths = [Path(s).absolute() for s in items]
        for i, path in enumerate(paths):
            refuse_own_file(owner, str(path), path.name, "directory")
            if path.is_dir() and (files or not is_shard_name(path.name, tuple(reader.suffixes))):
                raise ValueError(
                    f"{owner}: shards[{i}]={str(path)!r} is a directory; a list holds shard "
                    "files: list them, pass the folder itself, or read several folders with "
                    "MixedDataset."
                )
        _refuse_links_to_one_file(owner, paths)
        return paths
    if any(isinstance(s, str | os.PathLike) for s in items):
        raise TypeError(
            f"{owner}: shards must be all paths or all objects, not a mix; pass a list of "
            "paths (or a directory), or a list of the objects the reader opens."
        )
    return items


def prepare_reader(reader: Any, shards: Sequence[Any], source: Callable[[int], Any]) -> Any:
    """``reader.prepare([(str(shard), source(i)), ...])``, or ``reader`` without ``prepare``."""
    prepare = getattr(reader, "prepare", None)
    if not callable(prepare):
        return reader
    return prepare([(str(shard), source(i)) for i, shard in enumerate(shards)])


_forks = [0]  # a forked child counts one more: the handles it inherited are checked again
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


def process_generation() -> int:
    """Changes in a forked child, so a check done once per process is done again there."""
    return _forks[0]


class OpenShards:
    """The shards this process holds open, at most ``max_open``, each checked against
    ``sizes``, ``entries`` and the ``pinned`` token dtypes as it opens; at URLs, ``fetch(i)``
    gives the local file and ``ranged(i)`` the shard opened for range reads (or None)."""

    def __init__(
        self,
        shards: Sequence[Any],
        reader: ShardReader,
        sizes: Sequence[int],
        entries: Sequence[IndexEntry] | None,
        index_path: Path | None,
        *,
        max_open: int | None,
        remember_failures: bool,
        fetch: Callable[[int], Path] | None = None,
        ranged: Callable[[int], OpenShard | None] | None = None,
        pinned: Sequence[str | None] = (),
    ) -> None:
        self.shards, self.reader, self.sizes, self.pinned = shards, reader, sizes, pinned
        self.fetch, self.ranged = fetch, ranged
        self.entries, self.index_path = entries, index_path
        self.max_open, self.remember_failures = max_open, remember_failures
        self.cache_root = default_cache_root()  # decoded copies, verified markers
        self._reset()

    def _reset(self) -> None:
        self.open: OrderedDict[int, OpenShard] = OrderedDict()
        self.broken: dict[int, Exception] = {}
        self.warned: set[int] = set()
        self.opens = 0

    def __getstate__(self) -> dict[str, Any]:
        drop = ("open", "broken", "warned", "opens")  # per process
        return {k: v for k, v in self.__dict__.items() if k not in drop}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def get(self, shard: int) -> OpenShard:
        """Shard ``shard``, opened now unless already open in this process."""
        handle = self.open.get(shard)
        if handle is not None:
            self.open.move_to_end(shard)
            return handle
        if shard in self.broken:
            raise self.broken[shard]
        if self.max_open is not None and len(self.open) >= self.max_open:
            self.close(next(iter(self.open)))  # the least recently used
        try:
            handle = self._open_checked(shard)
        except Exception as exc:
            if self.remember_failures:
                self.broken[shard] = exc
            raise
        self.open[shard] = handle
        return handle

    def recheck(self) -> None:
        """Reopen (and so check, raising its error) each open shard changed since it opened: a
        map reads a file rewritten in place at its size until it is reopened."""
        if self.entries is None:
            return
        changed = [i for i in list(self.open) if self._stale(self.entries[i])]
        for shard in changed:  # all closed first: a caller going on past the error reopens each
            self.close(shard)
        for shard in changed:
            self.get(shard)

    def _stale(self, entry: IndexEntry) -> bool:
        """Whether ``entry``'s file changed: its size or mtime, or (hashed) its bytes, as a
        ``cp -p`` over it keeps the first two."""
        if entry.changed() is not None:
            return True
        try:
            if entry.digest is not None:
                verify_local(entry.path, entry.digest, self.cache_root)  # a stat if unchanged
        except ShardError:
            return True
        return False

    def _open_checked(self, shard: int) -> OpenShard:
        entry = None if self.entries is None else self.entries[shard]
        index = "it was counted in" if self.index_path is None else repr(str(self.index_path))
        if entry is not None:
            why = entry.changed()
            if why == "missing":
                raise MissingShardError(
                    f"shard file {str(entry.path)!r} disappeared after it was indexed; restore it.",
                    path=entry.path,
                )
            if why is not None:
                raise ShardChangedError(
                    f"shard {str(entry.path)!r} changed after it was indexed ({why}). If "
                    "write_shards rewrote the folder since this dataset was built, build it (or "
                    f"the DataModule) again; else the index {index} and every saved position "
                    "are stale: delete the index and restart.",
                    path=entry.path,
                )
        name = shard_name(self.shards[shard])
        try:
            if self.fetch is None:
                handle = self._open_local(shard, entry)
            else:  # at a URL: opened for range reads, else its fetched copy
                ranged = None if self.ranged is None else self.ranged(shard)
                handle = ranged if ranged is not None else self._open_copy(shard)
        except (ShardError, MissingDependencyError, ReaderSettingError):
            raise
        except Exception as exc:
            if out_of_files(exc):  # no bad shard: on_error="skip" raises it too
                raise _opened(self.shards[shard], exc) from exc
            raise ShardError(
                f"opening shard {name} failed with {type(exc).__name__}: {exc}; check that it "
                "is a complete shard of this reader's format (rewrite it, and delete the shard "
                "index), or pass on_error='skip' to leave its samples out.",
                path=self.shards[shard],
            ) from exc
        self.opens += 1
        if len(handle) != self.sizes[shard]:
            # Never skipped: no sample is bad, the count is stale (an older loaderkit's
            # JsonlReader counted blank lines), so every position after it is off.
            raise ShardChangedError(
                f"shard {name} has {len(handle)} samples, the index says {self.sizes[shard]}: "
                f"it changed after it was counted, or an older loaderkit counted it; delete "
                f"the index {index} and restart.",
                path=self.shards[shard],
            )
        check_pinned(handle, self.pinned[shard] if self.pinned else None, name, self.shards[shard])
        return handle

    def _open_local(self, shard: int, entry: IndexEntry | None) -> OpenShard:
        """Open a local shard: a compressed one from its decoded copy, a hashed one checked."""
        path = self.shards[shard]
        if not isinstance(path, Path):
            return self.reader.open(path)
        if is_compressed(path.name):
            return self._open_or_count(self.local_file(shard))
        if entry is not None and entry.digest is not None:
            verify_local(path, entry.digest, self.cache_root)
        return self._open_or_count(path)

    def local_file(self, shard: int) -> Any:
        """The file the reader opens for local shard ``shard`` (a compressed one's decoded copy)."""
        path = self.shards[shard]
        if not (isinstance(path, Path) and is_compressed(path.name)):
            return path
        digest = None if self.entries is None else self.entries[shard].digest
        root = self.cache_root
        check = None if digest is None else partial(verify_local, expected=digest, cache_root=root)
        return decode_into(path, local_decode_dir(path, root, digest), check=check)

    def _open_copy(self, shard: int) -> OpenShard:
        """Open the fetched copy of shard ``shard`` (at a URL); its errors name the URL."""
        assert self.fetch is not None
        local = self.fetch(shard)
        with named_by_url(local, str(self.shards[shard])):
            return self._open_or_count(local)

    def _open_or_count(self, local: Path) -> OpenShard:
        try:
            return self.reader.open(local)
        except (MissingShardError, ShardChangedError) as exc:
            if exc.path == local:
                raise
            # A sidecar missing or not stamped with this file's mtime: counting writes it (the
            # shard itself is the listed or indexed one; a count that differs is refused after).
            self.reader.count(local)
            return self.reader.open(local)

    def close(self, shard: int) -> None:
        """Close shard ``shard`` if it is open here."""
        handle = self.open.pop(shard, None)
        close = getattr(handle, "close", None)
        if callable(close):
            close()
