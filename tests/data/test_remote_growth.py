"""The shard cache stays within its bounds when datasets come and go: the copies of objects
listed without a version are keyed per listing, so each construction adds entries that
only eviction removes, with their lock files, and only once no dataset leases them.

Shards live on fsspec's ``memory://`` filesystem; a store without versions is stood in for
by a listing that reads none. Datasets on one cache directory stand in for the datasets a
process builds one after another (Lightning ``setup()`` per stage, a sweep, a notebook).
"""

from __future__ import annotations

import fcntl
import gc
import os
import pickle
import uuid
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import RemoteCache, ResumableDataLoader, ShardedDataset, TokenReader, write_shards
from loaderkit.data import _fs, _remote_cache
from loaderkit.data._remote_cache import DiskCache, flock

pytest.importorskip("fsspec")

SEQ = 4
READER = TokenReader(seq_len=SEQ, dtype=np.uint16)
SHARDS = 8
SHARD_BYTES = 128 + 3 * SEQ * 2  # a .npy header and 12 uint16 tokens
BUDGET = 10 * SHARD_BYTES  # room for one listing's copies, not two


@pytest.fixture
def folder() -> Any:
    url = f"memory://growth-{uuid.uuid4().hex[:8]}"
    write_shards(url, [np.full(3 * SEQ, i, np.uint16) for i in range(SHARDS)], READER,
                 progress=False)  # fmt: skip
    yield url
    import fsspec

    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


@pytest.fixture(autouse=True)
def no_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fs, "version_of", lambda entry: "")  # a store that gives none


def make(folder: str, cache_dir: Path, prefetch: int = 0) -> ShardedDataset:
    cache = RemoteCache(cache_dir=cache_dir, max_bytes=BUDGET, prefetch=prefetch)
    return ShardedDataset(folder, READER, remote=cache)


def read_all(ds: ShardedDataset) -> None:
    assert [int(ds[i][0]) for i in range(len(ds))] == [s for s in range(SHARDS) for _ in "abc"]


def cached_bytes(cache_dir: Path) -> int:
    return DiskCache(cache_dir, BUDGET, "test").used()[0]


def test_evicted_entries_take_their_lock_files_with_them(folder: str, tmp_path: Path) -> None:
    # Eviction removed objects/<key> but left locks/<key> and locks/<key>.dl: with new keys
    # per construction, 10 constructions of 8 shards left 161 lock files (20 for 10 entries
    # and the budget lock after the fix), on and on.
    cache_dir = tmp_path / "c"
    for _ in range(10):
        ds = make(folder, cache_dir)
        read_all(ds)
        assert ds._remote is not None
        ds._remote.disk.release()  # as a run's process ends
    entries = len(list((cache_dir / "objects").iterdir()))
    locks = sorted(p.name for p in (cache_dir / "locks").iterdir())
    assert entries <= 10 and len(locks) <= 2 * entries + 1, (entries, locks)


def test_a_dropped_dataset_leaves_its_copies_to_eviction(folder: str, tmp_path: Path) -> None:
    # Nothing ended a dropped dataset's leases: each construction pinned its 8 copies for
    # good, 6 constructions held 7,296 bytes against max_bytes=1,520.
    cache_dir = tmp_path / "c"
    for _ in range(6):
        ds = make(folder, cache_dir)
        read_all(ds)
        del ds
        gc.collect()
    assert cached_bytes(cache_dir) <= BUDGET


def test_a_dropped_dataset_ends_its_prefetch_thread(folder: str, tmp_path: Path) -> None:
    # The prefetch thread held its dataset: neither was ever collected, nor its leases ended.
    cache_dir = tmp_path / "c"
    for _ in range(4):
        ds = make(folder, cache_dir, prefetch=2)
        sampler = ds.batch_sampler(3, seed=0, window=4)
        assert sum(len(b) for b in ResumableDataLoader(ds, batch_sampler=sampler)) == 3 * SHARDS
        assert ds._remote is not None and ds._remote._thread is not None
        thread, owner = ds._remote._thread, weakref.ref(ds._remote)
        del ds, sampler
        gc.collect()
        assert owner() is None
        thread.join(60)
        assert not thread.is_alive()
    assert cached_bytes(cache_dir) <= BUDGET


def lease_held(lease: Path) -> bool:
    fd = flock(lease, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is not None:
        os.close(fd)
    return fd is None


def test_a_worker_copy_leaves_its_parents_leases(folder: str, tmp_path: Path) -> None:
    ds = make(folder, tmp_path / "c")
    read_all(ds)
    assert ds._remote is not None
    lease = ds._remote._paths(0)[1]
    assert lease_held(lease)
    copy = pickle.loads(pickle.dumps(ds._remote))  # a spawned worker's copy
    del copy
    gc.collect()
    assert lease_held(lease)
    pid = os.fork()  # a forked worker drops its copy of the dataset
    if pid == 0:
        try:
            del ds
            gc.collect()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert lease_held(lease)
    del ds
    gc.collect()
    assert not lease_held(lease)


def test_a_lease_taken_on_a_lock_file_being_evicted_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # B opens the lease lock of an unleased entry; A evicts the entry and deletes its lock
    # files before B's flock; B then held a lock on a deleted file, and C, making room,
    # created a new lock file, took it and evicted the copy B had fetched again meanwhile.
    a, b, c = (DiskCache(tmp_path, 100, name) for name in "abc")
    copy, lease, dl_lock = a.entry("k", "shard.npy")
    copy.parent.mkdir(parents=True)
    copy.write_bytes(bytes(100))
    real_flock = fcntl.flock
    evicted = []

    def flock_after_eviction(fd: int, flags: int) -> None:
        if flags == fcntl.LOCK_SH and not evicted:
            evicted.append(a._make_room(100))  # between B's open and its flock
        real_flock(fd, flags)

    monkeypatch.setattr(_remote_cache.fcntl, "flock", flock_after_eviction)
    b.lease(lease)
    monkeypatch.setattr(_remote_cache.fcntl, "flock", real_flock)
    assert evicted == [True] and not copy.exists()
    copy.parent.mkdir(parents=True)
    copy.write_bytes(bytes(100))  # B fetches it again, leased
    assert not c._make_room(100)
    assert copy.exists()
    # A download in flight keeps its entry too (its downloader may hold no lease).
    b.release()
    fd = flock(dl_lock, fcntl.LOCK_EX)
    assert fd is not None
    try:
        assert not c._make_room(100)
        assert copy.exists()
    finally:
        os.close(fd)
    assert c._make_room(100) and not copy.exists()
    assert not lease.exists() and not dl_lock.exists()
