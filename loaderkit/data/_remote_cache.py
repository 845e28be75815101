"""The local cache of shards at URLs (private): entries, leases, the byte budget, counts.

``objects/<key>/`` holds an entry (a shard with its sidecars, or a block), ``locks/<key>``
its lease and ``locks/<key>.dl`` its download lock (docs/design.md, shards in object storage).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from operator import methodcaller
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from loaderkit._atomic import atomic_write
from loaderkit.data._codec import unlink
from loaderkit.data._fs import Storage
from loaderkit.data._open import never_a_shard

_SLOTS = 257  # counters: the main process and 256 workers, one writer each
# Counters summed over processes (docs/design.md, shards in object storage: counts).
STATS = (
    *("fetched", "fetched_bytes", "prefetched", "hits", "waited", "retries", "evicted"),
    *("over_budget", "unplanned", "corrupt", "range_bytes", "range_requests"),
    *("blocks_fetched", "block_hits", "footers"),
)
RESERVED = ".reserved"  # in an entry's folder while it downloads: the bytes it will take
_MAX_MAPS = 64  # block files kept memory-mapped per process
Entry = tuple[Path, Path, Path]  # an entry's file, lease lock and download lock


class NoRoom(Exception):
    """The budget is full of shards that live processes still need (prefetch waits)."""


class Busy(Exception):
    """Another process or thread is downloading this shard (prefetch moves on)."""


@dataclass(frozen=True)
class RemoteShard:
    """One listed shard object: URL, name, size, version, sidecars (``(name, size, version)``)."""

    url: str
    name: str
    size: int
    version: str
    sidecars: tuple[tuple[str, int, str], ...] = ()

    def __repr__(self) -> str:
        return repr(self.url)

    def __str__(self) -> str:
        return self.url

    @property
    def key(self) -> str:
        """The cache key of this version of the object and its sidecars."""
        blob = f"{self.url}\n{self.size}\n{self.version}\n{self.sidecars}".encode()
        return hashlib.sha256(blob).hexdigest()[:24]

    @property
    def total_bytes(self) -> int:
        """The shard's bytes with its sidecars'."""
        return self.size + sum(size or 0 for _, size, _ in self.sidecars)  # None: offsets

    @property
    def folder(self) -> str:
        """The folder URL the shard is in."""
        return self.url.rsplit("/", 1)[0]


class DiskCache:
    """The cache directory ``root`` as one dataset's processes use it: leases, evictions
    within ``max_bytes`` (least recently used first), and counts (``STATS``)."""

    def __init__(self, root: Path, max_bytes: int, owner: str) -> None:
        self.root, self.max_bytes, self.owner = root, max_bytes, owner
        self.table = torch.zeros((_SLOTS, len(STATS)), dtype=torch.int64)
        self.table.share_memory_()  # workers count into it; the main process reads it
        self.reset()

    def reset(self) -> None:
        """Start with no leases (a new process: its parent's locks are not its own)."""
        old = getattr(self, "_dropped", None)
        if old is not None:
            old()  # this process's leases, if any (a forked child's are its parent's)
        self._lock = threading.Lock()
        self._leases: dict[str, int] = {}  # entry key -> fd holding a shared flock
        self._warned = False
        # A dropped dataset's leases end with it: else its copies stay unevictable.
        self._dropped = weakref.finalize(self, _close_leases, self._leases, os.getpid())

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}  # per process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.reset()

    def count(self, stat: str, value: int = 1) -> None:
        info = get_worker_info()
        slot = 0 if info is None else 1 + info.id % (_SLOTS - 1)
        self.table[slot, STATS.index(stat)] += value

    def count_ranges(self, nbytes: int, requests: int) -> None:
        self.count("range_bytes", nbytes)
        self.count("range_requests", requests)

    def totals(self) -> dict[str, Any]:
        """Each count of ``STATS``, summed over this process and its workers."""
        return dict(zip(STATS, (int(t) for t in self.table.sum(dim=0).tolist()), strict=True))

    def entry(self, key: str, name: str) -> Entry:
        """The file ``name`` of entry ``key``, its lease lock and its download lock."""
        locks = self.root / "locks"
        return self.root / "objects" / key / name, locks / key, locks / f"{key}.dl"

    def lease(self, lease: Path) -> None:
        """Hold a shared lock on an entry so no process evicts it while this one reads."""
        key = lease.name
        with self._lock:
            if key in self._leases:
                return
        fd = flock(lease, fcntl.LOCK_SH)  # waits only while an evictor deletes it
        assert fd is not None
        with self._lock:
            if self._leases.setdefault(key, fd) != fd:
                os.close(fd)  # another thread leased it meanwhile

    def leased(self) -> list[str]:
        """The keys this process holds a lease on."""
        with self._lock:
            return list(self._leases)

    def release(self, keys: Iterable[str] | None = None) -> None:
        """Drop the leases on ``keys`` (None: all)."""
        with self._lock:
            keys = list(self._leases if keys is None else keys)
            fds = [self._leases.pop(k) for k in keys if k in self._leases]
        for fd in fds:
            os.close(fd)  # closing the descriptor drops its lock

    def used(self) -> tuple[int, list[tuple[float, str, int]]]:
        """Bytes in the cache, and ``(last use, key, bytes)`` of each entry."""
        entries, total = [], 0
        try:
            dirs = list(os.scandir(self.root / "objects"))
        except FileNotFoundError:
            return 0, []
        for d in dirs:
            size = 0
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for f in os.scandir(d.path):
                    with contextlib.suppress(FileNotFoundError, ValueError):
                        if f.name == RESERVED:  # a download in flight counts in full
                            size += int(Path(f.path).read_text() or 0)
                        elif not f.name.endswith(".tmp"):
                            size += f.stat().st_size
            with contextlib.suppress(FileNotFoundError):
                entries.append((d.stat().st_mtime, d.name, size))
            total += size
        return total, entries

    @contextlib.contextmanager
    def reserved(
        self, url: str, folders: list[Path], sizes: list[int], *, ahead: bool
    ) -> Iterator[None]:
        """Reserve ``sizes`` bytes in ``folders`` (full budget: NoRoom if ``ahead``, else warns)."""
        fd = flock(self.root / "locks" / ".budget", fcntl.LOCK_EX)
        assert fd is not None
        try:
            room = self._make_room(sum(sizes))
            if not room and ahead:
                raise NoRoom
            for folder, size in zip(folders, sizes, strict=True):
                folder.mkdir(parents=True, exist_ok=True)
                (folder / RESERVED).write_text(str(size))
        finally:
            os.close(fd)
        if not room:
            self._over_budget(url)
        try:
            yield
        finally:
            unlink(folder / RESERVED for folder in folders)

    def _make_room(self, need: int) -> bool:
        """Evict unleased entries, least recently used first, until ``need`` more bytes fit."""
        used, entries = self.used()
        if used + need <= self.max_bytes:
            return True
        mine = set(self.leased())
        for _, key, size in sorted(entries):
            if key in mine:
                continue
            _, lease, dl_lock = self.entry(key, "")
            fd = flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if fd is None:
                continue  # a live process needs it
            dl_fd = flock(dl_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            try:
                if dl_fd is None:
                    continue  # a download in flight
                folder = self.root / "objects" / key
                # The shard first, so no one finds its folder complete while it goes.
                unlink(sorted(folder.glob("*"), key=lambda p: never_a_shard(p.name) is not None))
                shutil.rmtree(folder, ignore_errors=True)
                # Deleted while held, so each key does not leave two files behind for good.
                unlink([dl_lock, lease])
                self.count("evicted")
                used -= size
            finally:
                for held in (fd, dl_fd):
                    if held is not None:
                        os.close(held)
            if used + need <= self.max_bytes:
                return True
        return False

    def _over_budget(self, url: str) -> None:
        self.count("over_budget")
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.owner}: the shard cache {str(self.root)!r} is full "
                f"(max_bytes={self.max_bytes}), so {url!r} is fetched over the budget; raise "
                "RemoteCache(max_bytes=...), or lower prefetch=, mix_shards= or num_workers.",
                RuntimeWarning,
                stacklevel=5,
            )

    @staticmethod
    def touch(path: Path) -> None:
        with contextlib.suppress(OSError):
            os.utime(path.parent)  # recently used: evicted last


class Blocks:
    """One process's blocks of range-read shards in the cache: leased, fetched, mapped."""

    def __init__(self, disk: DiskCache, storage: Storage, block_bytes: int) -> None:
        self.disk, self.storage, self.size = disk, storage, block_bytes
        self._lock = threading.Lock()
        self._keys: set[str] = set()  # the blocks this process leases
        self.next: set[str] = set()  # those the next batches read (kept leased)
        self._maps: OrderedDict[str, np.ndarray] = OrderedDict()

    def of(self, starts: np.ndarray, nbytes: int) -> list[int]:
        """The blocks that the ``nbytes`` bytes at each of ``starts`` are in."""
        bb = self.size
        first, last = starts // bb, (starts + nbytes - 1) // bb
        if nbytes <= bb:
            return sorted({*first.tolist(), *last.tolist()})
        pairs = zip(first.tolist(), last.tolist(), strict=True)
        return sorted({b for f, la in pairs for b in range(f, la + 1)})

    def held(self) -> set[str]:
        """The keys of the blocks this process leases."""
        with self._lock:
            return set(self._keys)

    def read(
        self, shard: RemoteShard, entries: dict[int, Entry], starts: np.ndarray, nbytes: int
    ) -> np.ndarray:
        """The ``nbytes`` bytes at each of ``starts`` in ``shard``, as uint8 rows."""
        bb = self.size
        maps = self.fetch(shard, entries, ahead=False)
        out = np.empty((len(starts), nbytes), dtype=np.uint8)
        for k, start in enumerate(starts.tolist()):
            pos, end = start, start + nbytes
            while pos < end:
                b = pos // bb
                stop = min(end, (b + 1) * bb)
                out[k, pos - start : stop - start] = maps[b][pos - b * bb : stop - b * bb]
                pos = stop
        return out

    def fetch(
        self, shard: RemoteShard, entries: dict[int, Entry], *, ahead: bool
    ) -> dict[int, np.ndarray]:
        """Maps of the blocks of ``entries`` (none if ``ahead``), leased and fetched."""
        for _, lease, _ in entries.values():
            self.disk.lease(lease)
        keys = {lease.name for _, lease, _ in entries.values()}
        with self._lock:
            self._keys |= keys
        if not ahead:  # release the blocks neither this batch nor the next ones read
            drop = self._keys - keys - self.next
            self.disk.release(drop)
            with self._lock:
                self._keys -= drop
        missing = [b for b, (path, _, _) in entries.items() if not path.exists()]
        if not ahead:
            self.disk.count("block_hits", len(entries) - len(missing))
            for b, (path, _, _) in entries.items():
                if b not in missing:
                    self.disk.touch(path)
        if missing:
            self._download(shard, {b: entries[b] for b in missing}, ahead=ahead)
        return {} if ahead else {b: self._map(path) for b, (path, _, _) in entries.items()}

    def _download(self, shard: RemoteShard, entries: dict[int, Entry], *, ahead: bool) -> None:
        bb = self.size
        fds: list[int] = []
        try:
            todo = []
            for b, (path, _, dl_lock) in entries.items():  # in block order: no one waits
                fd = flock(dl_lock, fcntl.LOCK_EX | (fcntl.LOCK_NB if ahead else 0))
                if fd is None:
                    continue  # another process fetches it (prefetch: skip it)
                fds.append(fd)
                if not path.exists():
                    todo.append(b)
            if not todo:
                return
            sizes = {b: min(bb, shard.size - b * bb) for b in todo}
            folders = [entries[b][0].parent for b in todo]
            with self.disk.reserved(shard.url, folders, [sizes[b] for b in todo], ahead=ahead):
                runs: list[list[int]] = []
                for b in todo:  # adjacent blocks in one range
                    if runs and runs[-1][-1] == b - 1:
                        runs[-1].append(b)
                    else:
                        runs.append([b])
                spans = [(r[0] * bb, r[-1] * bb + sizes[r[-1]]) for r in runs]
                datas = self.storage.read_ranges(shard.url, spans, shard.size, shard.version)
                for run, data in zip(runs, datas, strict=True):
                    for b in run:
                        lo = (b - run[0]) * bb
                        write = methodcaller("write", data[lo : lo + sizes[b]])
                        atomic_write(entries[b][0], write)
            self.disk.count("blocks_fetched", len(todo))
            self.disk.count_ranges(sum(sizes.values()), len(spans))
        finally:
            for fd in fds:
                os.close(fd)

    def _map(self, path: Path) -> np.ndarray:
        key = str(path)
        arr = self._maps.get(key)
        if arr is not None:
            self._maps.move_to_end(key)
            return arr
        small = path.stat().st_size < 4096
        arr = np.fromfile(path, dtype=np.uint8) if small else np.memmap(path, np.uint8, mode="r")
        self._maps[key] = arr
        while len(self._maps) > _MAX_MAPS:
            self._maps.popitem(last=False)
        return arr


def flock(path: Path, flags: int) -> int | None:
    """A descriptor of ``path`` holding ``flock(flags)``; None if a non-blocking try failed.
    Retaken where an evictor deleted the file meanwhile (a lock on it guards nothing)."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, same = os.open(path, os.O_CREAT | os.O_RDWR, 0o644), False
        try:
            fcntl.flock(fd, flags)
            held, now = os.fstat(fd), os.stat(path)
            same = (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
        except BlockingIOError:
            return None
        except FileNotFoundError:
            pass  # deleted meanwhile: taken again
        finally:
            if not same:
                os.close(fd)
        if same:
            return fd


def _close_leases(leases: dict[str, int], pid: int) -> None:
    """Close the lease descriptors of a dropped :class:`DiskCache` made in process ``pid``."""
    if os.getpid() != pid:
        return
    fds = list(leases.values())
    leases.clear()
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
