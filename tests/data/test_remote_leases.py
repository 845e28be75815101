"""Leases on the shared shard cache: a process never loses a cached copy it still needs to
another process (or dataset) that makes room under ``max_bytes``.

Shards live on fsspec's ``memory://`` filesystem; two datasets on one cache directory
stand in for two processes (a lease is an ``flock``, held per open file).
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import (
    ParquetReader,
    RemoteCache,
    ResumableDataLoader,
    ShardedDataset,
    TokenReader,
    write_shards,
)
from loaderkit.data import remote

pytest.importorskip("fsspec")

SEQ = 4
READER = TokenReader(seq_len=SEQ, dtype=np.uint16)


@pytest.fixture
def folder() -> Any:
    url = f"memory://leases-{uuid.uuid4().hex[:8]}"
    yield url
    import fsspec

    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def parquet_tables() -> list[dict[str, list[Any]]]:
    return [{"x": list(range(i * 100, i * 100 + n)), "s": ["a" * 50] * n}
            for i, n in enumerate((30, 12, 21))]  # fmt: skip


def test_compressed_parquet_footers_are_read_before_their_copies_can_be_evicted(
    folder: str, tmp_path: Path
) -> None:
    # Each .parquet.zst is fetched whole for its footer; the cache holds one at a time.
    # The footer of shard 0 was read from a path whose lease was already dropped, so
    # fetching shard 1 evicted it: MissingShardError naming a cache file.
    pytest.importorskip("pyarrow")
    pytest.importorskip("zstandard")
    reader = ParquetReader(row_group_size=5)
    write_shards(folder, parquet_tables(), reader, compression="zstd")
    cache = RemoteCache(cache_dir=tmp_path / "c", max_bytes=5000, prefetch=0)
    ds = ShardedDataset(folder, reader, remote=cache)
    assert ds.sizes == (30, 12, 21)
    assert ds.describe()["remote"]["evicted"] >= 2  # the budget really was too small for all
    with pytest.warns(RuntimeWarning, match="is full"):  # reads lease their shards: over it
        assert [ds[i]["x"] for i in (0, 31, 50)] == [0, 101, 208]


def test_a_counted_shard_is_not_evicted_before_its_decoded_size_is_read(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without an index each shard is counted from its local copy; another process making
    # room between the count and the look at the decoded copy's size crashed the build
    # with a bare FileNotFoundError naming a cache file.
    pytest.importorskip("zstandard")
    import fsspec

    local = write_shards(tmp_path / "src", [np.arange(n * SEQ, dtype=np.uint16) for n in (5, 3)],
                         READER, compression="zstd")  # fmt: skip
    for path in local:  # the shards alone: no index, so the dataset counts them
        fsspec.filesystem("memory").pipe_file(f"{folder}/{path.name}", path.read_bytes())
    cache = RemoteCache(cache_dir=tmp_path / "c", max_bytes=1 << 20, prefetch=0)
    other = remote.DiskCache(cache.directory, 1, "other process")
    real = remote.is_compressed

    def evict_between(name: str) -> bool:  # count() asks this just after counting a shard
        other._make_room(1 << 40)  # everything unleased goes
        return real(name)

    monkeypatch.setattr(remote, "is_compressed", evict_between)
    ds = ShardedDataset(folder, READER, remote=cache)
    assert ds.sizes == (5, 3)
    assert ds[5].tolist() == [0, 1, 2, 3]


def test_a_cached_shard_a_process_reads_next_is_not_evicted_by_another(
    folder: str, tmp_path: Path
) -> None:
    # Shard sizes 224, 184, 256, 200 bytes; the cache holds two of them.
    write_shards(folder, [np.full(n * SEQ, i, dtype=np.uint16) for i, n in
                          enumerate((12, 7, 16, 9))], READER)  # fmt: skip
    cache = RemoteCache(cache_dir=tmp_path / "c", max_bytes=500, prefetch=1)
    ours = ShardedDataset(folder, READER, remote=cache)._remote
    theirs = ShardedDataset(folder, READER, remote=cache)._remote
    assert ours is not None and theirs is not None
    theirs.local(0)
    theirs.local(1)
    theirs.want([], [])  # done with both: they stay cached, unleased
    ours.want([0], [1])  # reads 0 now and 1 next, both cached: nothing to fetch
    with pytest.warns(RuntimeWarning, match="is full"):  # ours holds the room it needs
        theirs.local(2)
        theirs.local(3)
    assert ours.local(1).exists()
    assert ours.disk.totals()["fetched"] == 0  # 1 was read from the cache, not fetched again


def test_a_new_sampler_over_the_same_dataset_is_predicted_anew(folder: str, tmp_path: Path) -> None:
    # Predictions were kept by (epoch, start, rank, world_size) alone: a second sampler's
    # epoch 0 found the first one's, matched no batch, and every read went unplanned
    # (nothing prefetched, up to 16 shards held leased).
    write_shards(folder, [np.full(n * SEQ, i, dtype=np.uint16) for i, n in
                          enumerate((12, 7, 16, 9))], READER)  # fmt: skip
    ds = ShardedDataset(folder, READER, remote=RemoteCache(cache_dir=tmp_path / "c"))
    for seed in (1, 2):
        sampler = ds.batch_sampler(4, seed=seed, window=4)
        assert sum(len(b) for b in ResumableDataLoader(ds, batch_sampler=sampler)) == 44
    assert ds.describe()["remote"]["unplanned"] == 0


def test_a_copy_failing_its_hash_is_removed_without_another_process_download(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two processes find one corrupted cached copy. A removes it and fetches it again; B,
    # done hashing the bad copy later, removed every file of the entry without the
    # download lock: A's download in flight too, which then failed with MissingShardError
    # ("the object does not exist").
    write_shards(folder, [np.full(n * SEQ, i, dtype=np.uint16) for i, n in
                          enumerate((5, 3))], READER, hash="sha256")  # fmt: skip
    cache = RemoteCache(cache_dir=tmp_path / "c", prefetch=0)
    assert ShardedDataset(folder, READER, remote=cache)[0].tolist() == [0] * SEQ
    (copy,) = (tmp_path / "c" / "objects").glob("*/shard-00000.npy")
    data = bytearray(copy.read_bytes())
    data[-1] ^= 0xFF
    copy.write_bytes(bytes(data))  # a new mtime: its marker no longer vouches for it
    a, b = (ShardedDataset(folder, READER, remote=cache) for _ in range(2))
    assert a._remote is not None and b._remote is not None
    in_flight, go, failed = threading.Event(), threading.Event(), []
    a_thread = threading.Thread(target=lambda: a_reads())
    b_thread = threading.main_thread()
    real_verify, real_digest, real_flock = remote.verify, remote.file_digest, remote.flock

    def a_reads() -> None:
        try:
            assert a._remote is not None
            a._remote.local(0)
        except Exception as exc:
            failed.append(exc)
        finally:
            go.set()  # B never waits for a stopped A

    def verify(*args: Any, **kwargs: Any) -> None:
        try:
            real_verify(*args, **kwargs)
        except remote.DigestMismatch:
            if threading.current_thread() is b_thread and not in_flight.is_set():
                a_thread.start()  # A starts its download now
                assert in_flight.wait(60)
            raise

    def file_digest(*args: Any) -> str:  # hashing A's download, in its temporary file
        if threading.current_thread() is not b_thread:
            in_flight.set()
            assert go.wait(60)
        return real_digest(*args)

    def flock(path: Path, flags: int) -> int | None:
        if threading.current_thread() is b_thread and path.name.endswith(".dl"):
            go.set()  # B waits for A's download: A goes on
        return real_flock(path, flags)

    monkeypatch.setattr(remote, "verify", verify)
    monkeypatch.setattr(remote, "file_digest", file_digest)
    monkeypatch.setattr(remote, "flock", flock)
    assert b[0].tolist() == [0] * SEQ
    a_thread.join(60)
    assert not a_thread.is_alive() and not failed, failed
    assert a[1].tolist() == [0] * SEQ
    total = {
        k: a.describe()["remote"][k] + b.describe()["remote"][k] for k in ("corrupt", "fetched")
    }
    assert total == {"corrupt": 1, "fetched": 1}, total


def test_a_prefetched_copy_is_counted_before_a_reader_can_find_it(
    folder: str, tmp_path: Path
) -> None:
    # The prefetch thread counted "fetched" after the copy was in place: a reader that found
    # it meanwhile saw describe() one short (a flaky count under load).
    write_shards(folder, [np.full(8 * SEQ, 1, dtype=np.uint16)], READER)
    shards = ShardedDataset(folder, READER, remote=RemoteCache(cache_dir=tmp_path, prefetch=0))
    ours = shards._remote
    assert ours is not None
    placed, resume = threading.Event(), threading.Event()
    download = ours.storage.download

    def slow_download(*args: Any, **kwargs: Any) -> Any:
        out = download(*args, **kwargs)
        placed.set()  # the copy is in place; hold the fetching thread here
        assert resume.wait(60)
        return out

    ours.storage.download = slow_download  # type: ignore[method-assign]
    thread = threading.Thread(target=ours.local, args=(0,), kwargs={"ahead": True})
    thread.start()
    assert placed.wait(60)
    ours.storage.download = download  # type: ignore[method-assign]
    ours.local(0)  # found in place: a hit
    counted = ours.disk.totals()
    resume.set()
    thread.join()
    assert (counted["fetched"], counted["prefetched"], counted["hits"]) == (1, 1, 1), counted
    assert ours.disk.totals()["fetched"] == 1
