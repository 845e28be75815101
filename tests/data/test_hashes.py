"""Per-shard content hashes: stored in the index by write_shards, checked on first use.

Local shards are checked the first time a machine opens them (a verified
marker in the cache spares later processes the hashing); shards at URLs after
their download, before they enter the cache, and a cached copy on a process's
first read of it: a corrupted copy is removed, fetched again once and counted.
Corruption here is bit rot: a flipped byte with the file's size and mtime kept
(a changed mtime is refused by the index check before any hash is computed).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import (
    MissingDependencyError,
    RemoteCache,
    ResumableDataLoader,
    ShardedDataset,
    ShardError,
    StreamingShardedDataset,
    TokenReader,
    write_shards,
)
from loaderkit.data import _codec

SEQ = 4
SIZES = (12, 7, 16, 9, 6)
READER = TokenReader(seq_len=SEQ, dtype=np.uint16)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("LOADERKIT_CACHE_DIR", str(root))
    return root


def id_shards(sizes: tuple[int, ...] = SIZES) -> list[np.ndarray]:
    out, first = [], 0
    for n in sizes:
        out.append(np.repeat(np.arange(first, first + n), SEQ).astype(np.uint16))
        first += n
    return out


def flip_byte(path: Path, at: int | None = None) -> None:
    """Bit rot: one byte flipped, the size and mtime kept."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def count_hashing(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    real = _codec.file_digest

    def counted(path: Path, algo: str) -> str:
        calls.append(path)
        return real(path, algo)

    monkeypatch.setattr(_codec, "file_digest", counted)
    return calls


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("algo", ["sha256", "blake2b", "xxh3_64", "xxh3_128", "xxh64"])
def test_the_index_stores_each_shards_digest_and_reads_check_it(
    tmp_path: Path, algo: str, compression: str | None
) -> None:
    if algo.startswith("xxh"):
        pytest.importorskip("xxhash")
    if compression:
        pytest.importorskip("zstandard")
    paths = write_shards(tmp_path / "d", id_shards(), READER, hash=algo, compression=compression)
    ds = ShardedDataset(tmp_path / "d", READER)
    assert ds.entries is not None
    for path, entry in zip(paths, ds.entries, strict=True):
        assert entry.digest == _codec.file_digest(path, algo)
        assert entry.digest is not None and entry.digest.startswith(f"{algo}:")
    assert [int(ds[i][0]) for i in range(len(ds))] == list(range(50))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_flipped_byte_is_a_shard_error_naming_the_file_and_both_digests(
    tmp_path: Path, compression: str | None
) -> None:
    if compression:
        pytest.importorskip("zstandard")
    paths = write_shards(
        tmp_path / "d", id_shards(), READER, hash="sha256", compression=compression
    )
    expected = ShardedDataset(paths, READER).entries[2].digest  # type: ignore[index]
    flip_byte(paths[2])
    actual = _codec.file_digest(paths[2], "sha256")
    ds = ShardedDataset(paths, READER)
    assert ds[0].tolist() == [0] * SEQ  # the other shards read
    name = paths[2].name.replace(".", r"\.")
    with pytest.raises(ShardError, match=rf"{name}' fails its content hash") as info:
        ds[SIZES[0] + SIZES[1]]
    message = str(info.value)
    assert f"the index says {expected}" in message and f"hashes to {actual}" in message
    assert "restore the file, or rewrite the shards with write_shards" in message
    assert info.value.path == paths[2]


def test_a_shard_is_hashed_once_per_machine_not_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = write_shards(tmp_path / "d", id_shards(), READER, hash="sha256")
    calls = count_hashing(monkeypatch)
    ds = ShardedDataset(paths, READER)
    assert [int(ds[i][0]) for i in range(len(ds))] == list(range(50))
    assert sorted(calls) == sorted(paths)  # each shard once, on its first open
    calls.clear()
    again = ShardedDataset(paths, READER)  # a new process's copy: the marker says verified
    assert [int(again[i][0]) for i in range(len(again))] == list(range(50))
    assert calls == []
    # The marker vouches for the size, mtime, inode and ctime it saw: a byte flipped through
    # the filesystem since (mtime put back, ctime moved) is hashed again and refused.
    flip_byte(paths[0], at=-1)
    with pytest.raises(ShardError, match="fails its content hash"):
        ShardedDataset(paths, READER)[0]
    assert calls == [paths[0]]


def test_a_shard_replaced_by_a_copy_keeping_size_and_mtime_is_hashed_again(
    tmp_path: Path,
) -> None:
    paths = write_shards(tmp_path / "d", id_shards(), READER, hash="sha256")
    assert [int(ShardedDataset(paths, READER)[i][0]) for i in range(3)] == [0, 1, 2]  # marked
    st = paths[0].stat()
    other = tmp_path / "other.npy"
    np.save(other, (np.arange(SIZES[0] * SEQ) + 500).astype(np.uint16))  # another version
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, paths[0])  # as `cp -p` or `rsync -a` leave it: size and mtime kept
    assert paths[0].stat().st_size == st.st_size
    with pytest.raises(ShardError, match="fails its content hash"):
        ShardedDataset(paths, READER)[0]


def test_workers_verify_and_read_hashed_compressed_shards(tmp_path: Path) -> None:
    pytest.importorskip("zstandard")
    write_shards(tmp_path / "d", id_shards(), READER, hash="xxh3_64", compression="zstd")
    ds = ShardedDataset(tmp_path / "d", READER)
    loader = ResumableDataLoader(ds, batch_sampler=ds.batch_sampler(4, seed=1), num_workers=2)
    assert sorted(int(x) for b in loader for x in b[:, 0]) == list(range(50))
    stream = StreamingShardedDataset(tmp_path / "d", READER)
    got = [int(x) for b in ResumableDataLoader(stream, batch_size=4) for x in b[:, 0]]
    assert sorted(got) == list(range(50))


def test_without_xxhash_the_extra_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xxhash", None)
    with pytest.raises(MissingDependencyError, match=r"hash='xxh3_64' needs xxhash.*zstd"):
        write_shards(tmp_path, id_shards(), READER, hash="xxh3_64")
    write_shards(tmp_path, id_shards(), READER, hash="sha256")  # hashlib's need nothing


# ------------------------------------------------------------------ remote
@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from tests.support.s3 import LocalS3

    server = LocalS3(log=tmp_path_factory.mktemp("moto") / "moto.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def folder(s3: Any, request: pytest.FixtureRequest) -> str:
    pytest.importorskip("zstandard")
    url = f"s3://{s3.bucket}/{request.node.name.replace('[', '-').rstrip(']')}"
    write_shards(
        url, id_shards(), READER, storage_options=s3.options, compression="zstd", hash="sha256"
    )
    return url


def cache(s3: Any, tmp_path: Path, **kwargs: Any) -> RemoteCache:
    return RemoteCache(cache_dir=tmp_path / "rc", storage_options=s3.options, **kwargs)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_compressed_hashed_shards_from_s3_read_as_local_ones(
    s3: Any, folder: str, tmp_path: Path, num_workers: int
) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.options)
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(folder))
    assert names[1:] == [f"shard-{i:05d}.npy.zst" for i in range(len(SIZES))]
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path))
    assert ds.sizes == SIZES and ds.describe()["remote"]["fetched"] == 0  # from the index
    loader = ResumableDataLoader(
        ds, batch_sampler=ds.batch_sampler(4, seed=2, mix_shards=2), num_workers=num_workers
    )
    local = ShardedDataset(write_shards(tmp_path / "p", id_shards(), READER), READER)
    ref = ResumableDataLoader(local, batch_sampler=local.batch_sampler(4, seed=2, mix_shards=2))
    assert [b.tolist() for b in loader] == [b.tolist() for b in ref]
    info = ds.describe()["remote"]
    assert info["corrupt"] == 0 and info["fetched"] == len(SIZES)
    objects = sorted(p.name for p in (tmp_path / "rc" / "objects").glob("*/[!.]*"))
    assert objects == sorted(
        f"shard-{i:05d}.npy{z}" for i in range(len(SIZES)) for z in ("", ".zst")
    )
    stream = StreamingShardedDataset(folder, READER, remote=cache(s3, tmp_path / "s"))
    got = [int(x) for b in ResumableDataLoader(stream, batch_size=4) for x in b[:, 0]]
    assert sorted(got) == list(range(50))


def test_a_corrupted_cached_copy_is_removed_fetched_again_and_counted(
    s3: Any, folder: str, tmp_path: Path
) -> None:
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path, prefetch=0))
    assert ds[0].tolist() == [0] * SEQ
    (cached,) = (tmp_path / "rc" / "objects").glob("*/shard-00000.npy.zst")
    for keep_mtime in (False, True):
        flip_byte(cached)
        if keep_mtime:  # bit rot the marker would vouch for: without the marker, hashed
            (marker,) = cached.parent.glob(".*.lkverified")
            marker.unlink()
        else:  # a write into the cache (a new mtime): the marker no longer vouches
            os.utime(cached, ns=(cached.stat().st_atime_ns, cached.stat().st_mtime_ns + 10**9))
        fresh = ShardedDataset(folder, READER, remote=cache(s3, tmp_path, prefetch=0))
        assert [int(fresh[i][0]) for i in range(SIZES[0])] == list(range(SIZES[0]))
        info = fresh.describe()["remote"]
        assert info["corrupt"] == 1 and info["fetched"] == 1, info
    assert _codec.file_digest(cached, "sha256") == fresh._remote.extras[0]["hash"]  # type: ignore[union-attr,index]


def test_a_download_that_fails_its_hash_is_fetched_again_then_names_url_and_digests(
    s3: Any, folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path, prefetch=0))
    remote = ds._remote
    assert remote is not None
    real_open = remote.storage.fs.open
    bad = {"left": 1}

    class Flipped:
        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> Flipped:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def read(self, n: int) -> bytes:
            data = bytearray(self.f.read(n))
            if data:
                data[0] ^= 0xFF  # corrupted in transfer, same length
            return bytes(data)

    def flaky_open(url: str, mode: str = "rb", **kw: Any) -> Any:
        f = real_open(url, mode, **kw)
        if url.endswith(".zst") and bad["left"] > 0:
            bad["left"] -= 1
            return Flipped(f)
        return f

    monkeypatch.setattr(remote.storage.fs, "open", flaky_open)
    assert ds[0].tolist() == [0] * SEQ  # the second download is good
    assert ds.describe()["remote"]["corrupt"] == 1
    assert not list((tmp_path / "rc" / "objects").glob("*/.*.tmp"))

    bad["left"] = 10**6  # every download corrupted: the second failure raises
    with pytest.raises(ShardError, match=r"shard-00001\.npy\.zst' fails its content hash") as info:
        ds[SIZES[0]]
    message = str(info.value)
    assert "the index says sha256:" in message and "hashes to sha256:" in message
    assert "fetched twice" in message
    assert not list((tmp_path / "rc" / "objects").glob("*/shard-00001.npy*"))  # kept out
