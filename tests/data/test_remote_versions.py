"""Cached copies of objects are read only in the version the dataset listed, even where the
store gives no version (no ETag, modification time or version id) to key them by.

Shards live on fsspec's ``memory://`` filesystem; a store without versions is stood in for
by a listing that reads none. Two datasets on one cache directory stand in for two runs
(or two processes).
"""

from __future__ import annotations

import errno
import os
import pickle
import re
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import JsonlReader, RemoteCache, ShardedDataset, TokenReader, write_shards
from loaderkit.data import _fs

pytest.importorskip("fsspec")

SEQ = 4
READER = TokenReader(seq_len=SEQ, dtype=np.uint16)


@pytest.fixture
def folder() -> Any:
    url = f"memory://versions-{uuid.uuid4().hex[:8]}"
    yield url
    import fsspec

    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


@pytest.fixture
def no_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_fs, "version_of", lambda entry: "")  # a store that gives none


def replace_shard(folder: str, tmp_path: Path, value: int) -> None:
    """Shard 0 rewritten in place with every token ``value``: the same size, other bytes."""
    import fsspec

    local = READER.write(tmp_path / "shard-00000.npy", np.full(3 * SEQ, value, dtype=np.uint16))
    fsspec.filesystem("memory").pipe_file(f"{folder}/shard-00000.npy", Path(local).read_bytes())


def make(folder: str, tmp_path: Path) -> ShardedDataset:
    return ShardedDataset(folder, READER, remote=RemoteCache(cache_dir=tmp_path / "c", prefetch=0))


def test_a_same_size_replacement_of_a_versionless_object_is_read_anew(
    folder: str, tmp_path: Path, no_versions: None
) -> None:
    # The cache key was URL and size alone: the second dataset read the first one's copy,
    # 1 where the store now holds 99.
    write_shards(folder, [np.full(3 * SEQ, 1, dtype=np.uint16), np.zeros(SEQ, np.uint16)], READER)
    first = make(folder, tmp_path)
    assert first[0].tolist() == [1] * SEQ
    replace_shard(folder, tmp_path, 99)
    second = make(folder, tmp_path)
    assert second[0].tolist() == [99] * SEQ
    assert second.describe()["remote"]["fetched"] == 1
    # Workers get the listing's copy: they share the copies its process fetched.
    assert first._remote is not None
    worker = pickle.loads(pickle.dumps(first._remote))
    assert worker._paths(0) == first._remote._paths(0)
    assert worker.local(0) == first._remote.local(0)
    assert first[0].tolist() == [1] * SEQ  # its own listing's copy: still 1


@pytest.mark.parametrize(
    "version",
    ["1700000000", "1700000000.0", '"6553f100-38"', 'W/"6553f100-38"'],  # nginx's ETag: hunter 359
)
def test_a_version_in_whole_seconds_keys_a_copy_within_its_listing_only(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    # Note 15: an SFTP store lists an mtime in whole seconds and no ETag; a shard rewritten
    # (same size) within that second was read from the cache as it was: 1 for 99.
    monkeypatch.setattr(_fs, "version_of", lambda entry: version)
    write_shards(folder, [np.full(3 * SEQ, 1, dtype=np.uint16), np.zeros(SEQ, np.uint16)], READER)
    assert make(folder, tmp_path)[0].tolist() == [1] * SEQ
    replace_shard(folder, tmp_path, 99)
    assert make(folder, tmp_path)[0].tolist() == [99] * SEQ


@pytest.mark.parametrize("store", ["versioned", "versionless-hashed", "s3-multipart"])
def test_a_versioned_or_hashed_object_is_reused_across_listings(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: str
) -> None:
    hashed = store == "versionless-hashed"
    if hashed:
        monkeypatch.setattr(_fs, "version_of", lambda entry: "")
    if store == "s3-multipart":  # an MD5 and a part count: not nginx's time and size
        monkeypatch.setattr(_fs, "version_of", lambda e: '"d41d8cd98f00b204e9800998ecf8427e-3"')
    arrays = [np.full(3 * SEQ, 1, dtype=np.uint16), np.zeros(SEQ, np.uint16)]
    write_shards(folder, arrays, READER, hash="sha256" if hashed else None)
    assert make(folder, tmp_path)[0].tolist() == [1] * SEQ
    again = make(folder, tmp_path)
    assert again[0].tolist() == [1] * SEQ
    info = again.describe()["remote"]
    assert info["fetched"] == 0 and info["hits"] == 1, info
    if hashed:  # rewritten with its index: the copy fails the new hash and is fetched again
        write_shards(folder, [np.full(3 * SEQ, 99, dtype=np.uint16), arrays[1]], READER,
                     hash="sha256", progress=False)  # fmt: skip
        third = make(folder, tmp_path)
        assert third[0].tolist() == [99] * SEQ
        assert third.describe()["remote"]["fetched"] == 1


def test_versionless_shards_counted_by_loaderkit_are_counted_again_in_a_new_listing(
    folder: str, tmp_path: Path, no_versions: None
) -> None:
    # The index the first dataset wrote (no write_shards index: it counted the shards)
    # vouched for sizes only: a same-size rewrite of shard 0 with 4 records in place of 3
    # was still counted 3, so its last record was never read.
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{folder}/a.jsonl", b'{"v":1}\n{"v":2}\n{"v":3333333333}\n')
    fs.pipe_file(f"{folder}/b.jsonl", b'{"v":5}\n')
    reader = JsonlReader()
    cache = RemoteCache(cache_dir=tmp_path / "c", prefetch=0)
    assert ShardedDataset(folder, reader, remote=cache).sizes == (3, 1)
    fs.pipe_file(f"{folder}/a.jsonl", b'{"v":6}\n{"v":7}\n{"v":8}\n{"v":99}\n')  # 33 bytes
    again = ShardedDataset(folder, reader, remote=cache)
    assert again.sizes == (4, 1)
    assert [again[i]["v"] for i in range(5)] == [6, 7, 8, 99, 5]


def test_lengths_of_a_versionless_object_are_measured_anew_in_each_listing(
    folder: str, tmp_path: Path, no_versions: None
) -> None:
    # The lengths cache was keyed by URL, size and version: a same-size rewrite of a
    # versionless shard kept the old lengths ([2, 2] where the store now holds [1, 1]).
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{folder}/a.jsonl", b'{"ids":[1,2]}\n{"ids":[3,4]}\n')
    cache = tmp_path / "lengths.npy"

    def lengths() -> list[int]:
        remote = RemoteCache(cache_dir=tmp_path / "c", prefetch=0)
        ds = ShardedDataset(folder, JsonlReader(), remote=remote)
        return ds.lengths(lambda s: len(s["ids"]), cache=cache).tolist()

    assert lengths() == [2, 2]
    fs.pipe_file(f"{folder}/a.jsonl", b'{"ids":[123]}\n{"ids":[456]}\n')
    assert lengths() == [1, 1]


def test_lengths_of_a_hashed_versionless_object_are_reused_across_listings(
    folder: str, tmp_path: Path, no_versions: None
) -> None:
    # Its index hash names its content, as its cache copy's key does: measured once (a
    # JSONL shard's versionless offsets sidecar still keys its lengths by listing).
    write_shards(folder, [np.arange(2 * SEQ, dtype=np.uint16)], READER, hash="sha256")
    for run in range(2):
        ds = make(folder, tmp_path)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = ds.lengths(_first_token, cache=tmp_path / "lengths.npy").tolist()
        assert found == [1, SEQ + 1]
        assert not any("recomputing" in str(w.message) for w in caught), (run, caught)


def _first_token(sample: Any) -> int:
    return int(sample[0]) + 1


@pytest.mark.parametrize("indexed", [True, False])
def test_a_cached_copy_cut_short_is_fetched_again(
    folder: str, tmp_path: Path, indexed: bool
) -> None:
    # Hunter 261: a copy truncated under its final name (a crash after the rename, a full
    # disk) was trusted: refused forever with an index, else counted short (2 of 5 samples
    # lost) and that count written to the remote folder as its index.
    import fsspec

    rows = [[{"i": j} for j in range(5)], [{"i": 9}] * 3]
    if indexed:
        write_shards(folder, rows, JsonlReader(), progress=False)
    else:
        for k, part in enumerate(rows):
            text = "".join(f'{{"i": {r["i"]}}}\n' for r in part)
            fsspec.filesystem("memory").pipe_file(f"{folder}/s{k}.jsonl", text.encode())
    cache = RemoteCache(cache_dir=tmp_path / "c", prefetch=0)
    first = ShardedDataset(folder, JsonlReader(), remote=cache)
    assert [first[i]["i"] for i in range(8)] == [0, 1, 2, 3, 4, 9, 9, 9]
    copy = max((tmp_path / "c").rglob("*.jsonl"), key=lambda p: p.stat().st_size)  # shard 0
    with open(copy, "r+b") as f:
        f.truncate(copy.stat().st_size - 16)
    again = ShardedDataset(folder, JsonlReader(), remote=cache)
    assert [again[i]["i"] for i in range(len(again))] == [0, 1, 2, 3, 4, 9, 9, 9]
    assert again.describe()["remote"]["corrupt"] == 1


def test_a_decoded_shard_listed_with_both_dtype_sidecars_is_a_cache_hit(
    folder: str, tmp_path: Path
) -> None:
    # Review 266: decoding copies a.bin.zst.lkdtype over a.bin.lkdtype, so that sidecar no
    # longer had its listed size, and every dataset fetched the shard again.
    import fsspec

    zstandard = pytest.importorskip("zstandard")
    fs = fsspec.filesystem("memory")
    raw = zstandard.ZstdCompressor().compress(np.arange(64, dtype=np.uint16).tobytes())
    fs.pipe_file(f"{folder}/a.bin.zst", raw)
    fs.pipe_file(f"{folder}/a.bin.lkdtype", b"<i4")  # the plain name's, stale
    fs.pipe_file(f"{folder}/a.bin.zst.lkdtype", b"uint16")  # the shard's own wins
    cache = RemoteCache(cache_dir=tmp_path / "c", prefetch=0)
    for run in range(2):
        ds = ShardedDataset(folder, TokenReader(seq_len=8, dtype=None), remote=cache)
        assert ds[0].tolist() == list(range(8))
        info = ds.describe()["remote"]
        assert (info["fetched"], info["hits"]) == ((1, 1) if run == 0 else (0, 1)), info


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_full_or_read_only_disk_is_named_and_not_retried(code: int) -> None:
    # Hunter 359: retried 4 times, then told to check the network and raise retries=.
    from loaderkit import ShardError

    error = _fs._permanent("downloading", "memory://c/s.npy", OSError(code, os.strerror(code)))
    assert isinstance(error, ShardError)
    assert re.search(r"'memory://c/s\.npy': the disk .* full or read-only.*max_bytes=", str(error))
    assert _fs._permanent("downloading", "memory://c/s.npy", OSError(errno.ECONNRESET, "")) is None
