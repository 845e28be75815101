"""Errors about a shard at a URL name the URL (the object the user can fix), never its
cached copy; a cache directory given as ``~/...`` is in the home directory.

Shards live on fsspec's ``memory://`` filesystem."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from loaderkit import JsonlReader, RemoteCache, ShardedDataset, TokenReader, write_shards
from loaderkit.data import _fs
from loaderkit.errors import ShardError
from tests.support.memory_fs import cache, memory_folder

fsspec = pytest.importorskip("fsspec")
zstandard = pytest.importorskip("zstandard")

READER = TokenReader(seq_len=4, dtype=np.uint16)


@pytest.fixture
def folder() -> Iterator[str]:
    yield from memory_folder("names")


def test_a_truncated_compressed_shard_is_named_by_url(folder: str, tmp_path: Path) -> None:
    text = b"".join(b'{"x": %d}\n' % i for i in range(10))
    url = f"{folder}/a.jsonl.zst"
    fsspec.filesystem("memory").pipe_file(url, zstandard.ZstdCompressor().compress(text)[:-6])
    with pytest.raises(ShardError, match=rf"^shard '{url}' is not a readable zstd") as info:
        ShardedDataset(folder, JsonlReader(), remote=cache(tmp_path))
    assert info.value.path == url


def test_a_shard_the_reader_cannot_count_is_named_by_url(folder: str, tmp_path: Path) -> None:
    out = io.BytesIO()
    np.save(out, np.arange(40, dtype=np.uint16))
    url = f"{folder}/a.npy"
    fsspec.filesystem("memory").pipe_file(url, out.getvalue()[:-6])
    with pytest.raises(ShardError, match=rf"^shard '{url}' is not a readable \.npy") as info:
        ShardedDataset(folder, READER, remote=cache(tmp_path))
    assert info.value.path == url


def test_a_shard_the_reader_cannot_open_is_named_by_url(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_fs, "version_of", lambda entry: "")  # its index vouches by size
    write_shards(folder, [np.arange(40, dtype=np.uint16)], READER, progress=False)
    url = f"{folder}/shard-00000.npy"
    fs = fsspec.filesystem("memory")
    fs.pipe_file(url, b"junk" * (len(fs.cat_file(url)) // 4))  # same size: not seen changed
    ds = ShardedDataset(folder, READER, remote=cache(tmp_path))
    with pytest.raises(ShardError, match=rf"^shard '{url}' is not a readable \.npy") as info:
        ds[0]
    assert info.value.path == url


def test_a_corrupt_cached_sidecar_is_named_by_its_own_path(folder: str, tmp_path: Path) -> None:
    # It was named by the shard's URL: "delete it and the shard index" then meant the user's
    # remote shard, not the cache's file.
    fsspec.filesystem("memory").pipe_file(f"{folder}/a.jsonl", b'{"i": 0}\n{"i": 1}\n')
    assert ShardedDataset(folder, JsonlReader(), remote=cache(tmp_path))[1] == {"i": 1}
    (side,) = (tmp_path / "cache").rglob("*.lkoffsets")
    side.write_bytes(b"garbage, not an npy file")
    ds = ShardedDataset(folder, JsonlReader(), remote=cache(tmp_path))
    with pytest.raises(ShardError, match=rf"^offsets sidecar '{side}' is unreadable") as info:
        ds[0]
    assert info.value.path == side


def test_a_cache_directory_under_the_home_directory_is_expanded(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    write_shards(folder, [np.arange(8, dtype=np.uint16)], READER, progress=False)
    remote = RemoteCache(cache_dir="~/given", prefetch=0)
    ShardedDataset(folder, READER, remote=remote)[0]
    assert remote.directory == tmp_path / "given"
    assert list((tmp_path / "given" / "objects").glob("*/shard-00000.npy"))
    assert not (tmp_path / "~").exists()
    monkeypatch.setenv("LOADERKIT_CACHE_DIR", "~/from-env")
    assert RemoteCache().directory == tmp_path / "from-env"
