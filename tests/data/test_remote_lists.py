"""Lists of shard URLs: each object read once, their count index named by the whole list.

Shards live on fsspec's ``memory://`` filesystem.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from loaderkit import (
    MissingDependencyError,
    MissingShardError,
    ShardedDataset,
    ShardError,
    StreamingShardedDataset,
    TokenReader,
    write_shards,
)
from loaderkit.data.index import checksum, remote_index_name
from tests.support.memory_fs import cache, memory_folder

fsspec = pytest.importorskip("fsspec")

READER = TokenReader(seq_len=4, dtype=np.uint16)


@pytest.fixture
def base() -> Iterator[str]:
    yield from memory_folder("lists")


@pytest.mark.parametrize("kind", [ShardedDataset, StreamingShardedDataset])
@pytest.mark.parametrize(
    "spelling", ["{}/shard-00000.npy/", "{}//shard-00000.npy", "memory:///{bare}/shard-00000.npy"]
)
def test_one_object_listed_in_two_spellings_is_refused(
    base: str, tmp_path: Path, kind: type, spelling: str
) -> None:
    write_shards(base, [np.arange(8, dtype=np.uint16), np.arange(100, 108, dtype=np.uint16)],
                 READER, progress=False)  # fmt: skip
    other = spelling.format(base, bare=base.split("://", 1)[1])
    urls = [f"{base}/shard-00000.npy", other, f"{base}/shard-00001.npy"]
    with pytest.raises(ValueError, match=r"shard-00000\.npy/?' are one object \(listed twice\)"):
        kind(urls, READER, remote=cache(tmp_path))


def test_a_list_or_index_on_another_store_is_refused(base: str, tmp_path: Path) -> None:
    write_shards(base, [np.arange(8, dtype=np.uint16)], READER, progress=False)
    urls = [f"{base}/shard-00000.npy", f"local://{tmp_path}/shard-00000.npy"]
    with pytest.raises(ValueError, match=r"shards='local://.*' is on another store than"):
        ShardedDataset(urls, READER, remote=cache(tmp_path))
    index = f"local://{tmp_path}/index.json"  # was written into memory:// under that key
    with pytest.raises(ValueError, match=r"index='local://.*' is on another store than"):
        ShardedDataset(base, READER, remote=cache(tmp_path), index=index)


def test_a_list_on_a_store_without_its_package_names_the_package(tmp_path: Path) -> None:
    # Review 297: it said the shard was "on another store than" itself.
    import importlib.util

    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed")
    with pytest.raises(MissingDependencyError, match=r"gs:// URLs need gcsfs"):
        ShardedDataset(["gs://bucket/corpus/shard-00000.npy"], READER, remote=cache(tmp_path))


def test_a_hashed_folder_copied_elsewhere_reads_and_a_rewrite_there_is_refused(
    base: str, tmp_path: Path
) -> None:
    # A copy gets new versions (ETags): it was refused as "changed after it was indexed",
    # whose fix (delete the index) dropped the hashes (hunter 296).
    fs = fsspec.filesystem("memory")
    shards = [np.arange(8, dtype=np.uint16), np.arange(100, 112, dtype=np.uint16)]
    write_shards(f"{base}/a", shards, READER, progress=False, hash="sha256")
    for path in fs.ls(f"{base}/a", detail=False):
        fs.pipe_file(f"{base}/b/{path.rsplit('/', 1)[1]}", fs.cat_file(path))
    copy = ShardedDataset(f"{base}/b", READER, remote=cache(tmp_path / "1"))
    want = [list(range(k, k + 4)) for k in (0, 4, 100, 104, 108)]
    assert sorted(copy[i].tolist() for i in range(len(copy))) == want
    first = f"{base}/b/shard-00000.npy"
    fs.pipe_file(first, _same_size_other(fs.cat_file(first)))  # same size, other bytes
    rewritten = ShardedDataset(f"{base}/b", READER, remote=cache(tmp_path / "2"))
    with pytest.raises(ShardError, match=r"shard-00000\.npy.* fails its content hash"):
        rewritten[0]


def test_runs_sharing_a_cache_on_a_versionless_store_keep_their_own_hashed_copies(
    base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No version (an HTTP server without ETag or Last-Modified): a rewrite's copy went to the
    # same cache path, and the first run, its hash checked once, read the new bytes against
    # its old index (review 298).
    from loaderkit.data import _fs

    monkeypatch.setattr(_fs, "version_of", lambda entry: "")
    shards = [np.arange(8, dtype=np.uint16), np.arange(100, 108, dtype=np.uint16)]
    write_shards(base, shards, READER, progress=False, hash="sha256")
    first = ShardedDataset(base, READER, remote=cache(tmp_path), max_open_shards=1)
    before = [first[i].tolist() for i in range(len(first))]
    shards[0] = shards[0] + 50  # same size, new hash
    write_shards(base, shards, READER, progress=False, hash="sha256", resume=False)
    second = ShardedDataset(base, READER, remote=cache(tmp_path), max_open_shards=1)
    assert second[0].tolist() == [50, 51, 52, 53]
    assert [first[i].tolist() for i in range(len(first))] == before


def _same_size_other(data: bytes) -> bytes:
    """``data`` with its last byte changed (a token, not the header)."""
    return data[:-1] + bytes([data[-1] ^ 0x01])


def test_an_upload_into_a_missing_folder_names_the_fix(tmp_path: Path) -> None:
    url = f"local://{tmp_path}/not-made/corpus"
    with pytest.raises(ShardError, match=r"folder or bucket does not exist.*auto_mkdir"):
        write_shards(url, [np.arange(8, dtype=np.uint16)], READER, progress=False)


def two_folders(base: str) -> None:
    """``en/`` (shards of 2 and 3 samples) and ``de/`` (1 and 5), written by write_shards."""
    for lang, tokens in (("en", (8, 12)), ("de", (4, 20))):
        shards = [np.arange(n, dtype=np.uint16) for n in tokens]
        write_shards(f"{base}/{lang}", shards, READER, progress=False)


def npy(tokens: int) -> bytes:
    out = io.BytesIO()
    np.save(out, np.arange(tokens, dtype=np.uint16))
    return out.getvalue()


def test_a_list_across_folders_never_takes_a_folders_write_shards_index(
    base: str, tmp_path: Path
) -> None:
    two_folders(base)  # en/'s index is named by the same file names as this list
    urls = [f"{base}/en/shard-00000.npy", f"{base}/de/shard-00001.npy"]
    assert ShardedDataset(urls, READER, remote=cache(tmp_path)).sizes == (2, 5)


def test_lists_of_same_named_files_in_other_folders_are_counted_apart(
    base: str, tmp_path: Path
) -> None:
    two_folders(base)
    de = [f"{base}/en/shard-00000.npy", f"{base}/de/shard-00000.npy"]
    en = [f"{base}/en/shard-00000.npy", f"{base}/en/shard-00001.npy"]
    for urls, sizes in [(de, (2, 1)), (en, (2, 3)), (de, (2, 1))]:
        ds = ShardedDataset(urls, READER, remote=cache(tmp_path))
        assert (ds.sizes, len(ds)) == (sizes, sum(sizes))


def test_reading_a_list_across_folders_leaves_its_first_folder_readable(
    base: str, tmp_path: Path
) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{base}/en/part.npy", npy(8))
    fs.pipe_file(f"{base}/de/data.npy", npy(4))
    urls = [f"{base}/en/part.npy", f"{base}/de/data.npy"]
    assert ShardedDataset(urls, READER, remote=cache(tmp_path)).sizes == (2, 1)
    assert ShardedDataset(f"{base}/en", READER, remote=cache(tmp_path)).sizes == (2,)


def test_a_list_index_named_by_bare_names_before_is_not_read(base: str, tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{base}/en/part.npy", npy(8))
    fs.pipe_file(f"{base}/de/data.npy", npy(4))
    urls = [f"{base}/en/part.npy", f"{base}/de/data.npy"]
    ShardedDataset(urls, READER, remote=cache(tmp_path))
    (new,) = fs.glob(f"{base}/en/.loaderkit-index-*")
    doc = json.loads(fs.cat_file(new))
    fs.rm(new)
    # loaderkit <= 0.2.0 named such an index, and its rows, by the bare file names.
    rows = [[url.rsplit("/", 1)[-1], size, version, 7] for url, size, version, _ in doc["shards"]]
    old = remote_index_name([r[0] for r in rows], READER)
    fs.pipe_file(
        f"{base}/en/{old}", json.dumps(doc | {"shards": rows, "checksum": checksum(rows)}).encode()
    )
    assert ShardedDataset(urls, READER, remote=cache(tmp_path)).sizes == (2, 1)
    # Reading its first folder alone refuses it (data.npy is not there): that said "restore
    # them, or delete the index" without a word of where the index came from.
    old_list = r"delete the index \(it may be an older loaderkit's index of a list of shards in"
    with pytest.raises(MissingShardError, match=r"lists: \['data\.npy'\]; restore .*" + old_list):
        ShardedDataset(f"{base}/en", READER, remote=cache(tmp_path))
