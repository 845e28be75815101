"""Shard folders, objects and zstd shards: a clear error or the data that was written, never
a smaller or mixed corpus.

Measured on 84cc6ec (issue 22): a shard deleted from a folder (local, ``s3://``,
``memory://``) left an epoch of 800 of 1000 samples and a second index written
for the rest; with workers a missing shard was a ``ShardReadError`` that
``except MissingShardError`` missed; a folder whose ``write_shards`` was killed
after 8 of 24 shards was read as 8 shards; an object rewritten (same size)
after the dataset listed it was served under the old cache key, and range reads
mixed two versions in one epoch; a truncated ``.zst`` decoded to a smaller
shard; a killed decode left its partial file in the cache for good, and a
damaged decoded copy was never decoded again; an S3 endpoint that accepts and
never answers hung a read for 300 s and more with ``retries=1``.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Subset, random_split

from loaderkit import (
    JsonlReader,
    MissingShardError,
    RemoteCache,
    ResumableDataLoader,
    ShardChangedError,
    ShardedDataset,
    ShardError,
    ShardReadError,
    StateMismatchError,
    StreamingShardedDataset,
    TokenReader,
    write_shards,
)
from loaderkit.data import _codec
from loaderkit.data._fs import Storage
from tests.support.s3 import LocalS3, serve

SEQ = 4
READER = TokenReader(seq_len=SEQ, dtype=np.uint16)
SIZES = (10, 12, 9, 11)  # 42 samples


def id_shards(sizes: tuple[int, ...] = SIZES, plus: int = 0) -> list[np.ndarray]:
    """Every token of global sample ``i`` is ``i + plus``."""
    out, first = [], 0
    for n in sizes:
        out.append(np.repeat(np.arange(first, first + n) + plus, SEQ).astype(np.uint16))
        first += n
    return out


def epoch(ds: Any, num_workers: int = 0, **plan: Any) -> list[int]:
    sampler = ds.batch_sampler(4, seed=1, window=4, **plan)
    loader = ResumableDataLoader(ds, batch_sampler=sampler, num_workers=num_workers)
    return [int(i) for b in loader for i in b[:, 0]]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalS3]:
    yield from serve(tmp_path_factory.mktemp("moto"))


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Decoded copies go into this test's own cache directory (workers inherit it)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("LOADERKIT_CACHE_DIR", str(root))
    return root


class Place:
    """A shard folder at one kind of location: its URL, storage options and filesystem."""

    def __init__(self, kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
        self.kind, self.tmp_path = kind, tmp_path
        self.options: dict[str, Any] | None = None
        if kind == "local":
            self.url: Any = tmp_path / "corpus"
            return
        import fsspec

        if kind == "memory":
            self.url = f"memory://silent-{uuid.uuid4().hex[:8]}"
            self.fs = fsspec.filesystem("memory")
        else:
            s3: LocalS3 = request.getfixturevalue("s3")
            self.url = f"s3://{s3.bucket}/silent-{uuid.uuid4().hex[:8]}"
            self.options = s3.options
            self.fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3.options)

    def names(self) -> list[str]:
        if self.kind == "local":
            return sorted(p.name for p in Path(self.url).iterdir())
        self.fs.invalidate_cache()
        return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(self.url, detail=False))

    def remove(self, name: str) -> None:
        if self.kind == "local":
            (Path(self.url) / name).unlink()
        else:
            self.fs.rm(f"{self.url}/{name}")

    def put(self, name: str, arr: np.ndarray) -> None:
        if self.kind == "local":
            np.save(Path(self.url) / name, arr)
            return
        with self.fs.open(f"{self.url}/{name}", "wb") as f:
            np.save(f, arr)

    def remote(self) -> RemoteCache | None:
        if self.kind == "local":
            return None
        return RemoteCache(cache_dir=self.tmp_path / "rcache", storage_options=self.options)


def refused(place: Place, error: type[Exception], match: str, short: str) -> None:
    """Both dataset kinds refuse the folder (``short``: the stream's match), writing nothing."""
    before = place.names()
    with pytest.raises(error, match=match):
        ShardedDataset(place.url, READER, remote=place.remote())
    with pytest.raises(error, match=short):
        StreamingShardedDataset(place.url, READER, remote=place.remote())
    assert place.names() == before  # no index for another corpus


# ------------------------------------------------------- 1. a shard missing from a folder
@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_shards_missing_from_a_folder_are_all_named_and_nothing_is_written(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    place = Place(kind, tmp_path, request)
    write_shards(place.url, id_shards(), READER, storage_options=place.options, progress=False)
    place.remove("shard-00001.npy")
    place.remove("shard-00003.npy")
    refused(
        place,
        MissingShardError,
        r"lacks 2 shard\(s\) that its index .*\.loaderkit-index-.*\.json' lists: "
        r"\['shard-00001\.npy', 'shard-00003\.npy'\]; restore them",
        r"lists: \['shard-00001\.npy', 'shard-00003",
    )


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_a_folder_past_shard_99999_is_read_in_the_order_written(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # write_shards names the 100,001st shard shard-100000: by name it sorted before shard-10001.
    place = Place(kind, tmp_path, request)
    if kind == "local":
        Path(place.url).mkdir()
    for i in (9999, 10000, 10001, 99999, 100000):
        place.put(f"shard-{i:05d}.npy", np.full(SEQ, i, dtype=np.int64))
    if kind == "local":  # names write_shards does not give keep the name order (a saved run's)
        short = tmp_path / "short"
        short.mkdir()
        for i in (2, 10, 10000):
            np.save(short / f"part-{i}.npy", np.full(SEQ, i, dtype=np.int64))
        ds = ShardedDataset(short, TokenReader(seq_len=SEQ))
        assert [int(ds[i][0]) for i in range(3)] == [10, 10000, 2]
    reader, want = TokenReader(seq_len=SEQ), [9999, 10000, 10001, 99999, 100000]
    ds = ShardedDataset(place.url, reader, remote=place.remote())
    assert [int(ds[i][0]) for i in range(len(ds))] == want
    stream = StreamingShardedDataset(
        place.url, reader, remote=place.remote(), shuffle_shards=False, mix_shards=1
    )
    assert [int(b[0, 0]) for b in ResumableDataLoader(stream, batch_size=1)] == want


def test_a_folder_written_again_with_fewer_shards_reads_as_the_new_write(tmp_path: Path) -> None:
    # The earlier write's index lists shards the new write removed: it goes with them.
    write_shards(tmp_path, id_shards((5, 5, 5, 5, 5, 5)), READER, progress=False)
    write_shards(tmp_path, id_shards(), READER, progress=False)
    assert ShardedDataset(tmp_path, READER).sizes == SIZES
    assert len(list(tmp_path.glob(".loaderkit-index-*.json"))) == 1


def test_an_index_given_for_a_folder_that_lacks_its_shards_names_them(tmp_path: Path) -> None:
    index = tmp_path / "my-index.json"
    write_shards(tmp_path / "d", id_shards(), READER, index=index, progress=False)
    (tmp_path / "d" / "shard-00002.npy").unlink()
    paths = sorted((tmp_path / "d").glob("*.npy"))
    with pytest.raises(MissingShardError, match=r"lists shards that do not exist: .*shard-00002"):
        ShardedDataset(paths, READER, index=index)


def test_a_remote_folder_that_lacks_the_shards_of_an_index_given_names_them(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    place = Place("memory", tmp_path, request)
    index = tmp_path / "index.json"  # kept outside the folder
    write_shards(place.url, id_shards(), READER, index=index, progress=False)
    place.remove("shard-00000.npy")
    with pytest.raises(MissingShardError, match=r"its index .*loaderkit-index-.*lists: \["):
        ShardedDataset(place.url, READER, index=index, remote=place.remote())
    # Without the folder's own index (written by an older loaderkit), the index given names them.
    [own] = [n for n in place.names() if n.startswith(".loaderkit-index-")]
    place.remove(own)
    with pytest.raises(
        MissingShardError, match=r"lacks 1 shard\(s\) that its index .*index\.json' lists: \["
    ):
        ShardedDataset(place.url, READER, index=index, remote=place.remote())


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_shard_lost_after_indexing_is_a_missing_shard_error_with_or_without_workers(
    kind: str, num_workers: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    place = Place(kind, tmp_path, request)
    write_shards(place.url, id_shards(), READER, storage_options=place.options, progress=False)
    ds = ShardedDataset(place.url, READER, remote=place.remote())
    place.remove("shard-00002.npy")
    with pytest.raises(
        MissingShardError, match=r"shard-00002\.npy'.*(disappeared|not exist)"
    ) as info:
        epoch(ds, num_workers)
    assert isinstance(info.value, ShardReadError)  # and still names the batch's indices


@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_a_shard_file_that_the_write_shards_index_does_not_list_is_refused(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # A stray copy (an in-progress `cp` of another corpus' shard) grew the corpus and
    # wrote a second index; removing it again made the folder unreadable.
    place = Place(kind, tmp_path, request)
    write_shards(place.url, id_shards(), READER, storage_options=place.options, progress=False)
    place.put("shard-00004.npy", np.full(SEQ * 500, 99, np.uint16))
    place.put("extra.npy", np.full(SEQ * 5, 98, np.uint16))
    refused(
        place,
        ShardError,
        r"holds 2 shard file\(s\) that its write_shards index .*\.loaderkit-index-.*\.json'"
        r" does not list: \['extra\.npy', 'shard-00004\.npy'\]; remove them, or re-run",
        r"does not list: \['extra\.npy', 'shard-00004",
    )
    place.remove("shard-00004.npy")
    place.remove("extra.npy")
    assert ShardedDataset(place.url, READER, remote=place.remote()).sizes == SIZES


def test_a_folder_of_two_write_shards_corpora_is_refused(tmp_path: Path) -> None:
    # Each write_shards index is the truth for its folder: their union is no corpus.
    a = write_shards(tmp_path, id_shards(), READER, prefix="a", progress=False)
    write_shards(tmp_path, id_shards((3, 4)), READER, prefix="b", progress=False)
    with pytest.raises(ShardError, match=r"holds 2 write_shards corpora \(indexes "):
        ShardedDataset(tmp_path, READER)
    assert ShardedDataset(a, READER).sizes == SIZES


@pytest.mark.parametrize("where", ["local, index inside", "local, index outside", "memory"])
def test_a_folder_written_with_an_index_elsewhere_is_checked_without_it(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # write_shards(..., index=) used to leave the folder without an index of its own:
    # a lost shard then read as a smaller corpus, and a new index was written.
    place = Place(where.split(",")[0], tmp_path, request)
    inside = where.endswith("inside")
    index = Path(place.url) / "corpus-index.json" if inside else tmp_path / "corpus-index.json"
    write_shards(place.url, id_shards(), READER, index=index, progress=False)
    place.remove("shard-00001.npy")
    refused(
        place,
        MissingShardError,
        r"lacks 1 shard\(s\) that its index .*\.loaderkit-index-.*\.json' lists: "
        r"\['shard-00001\.npy'\]",
        r"lists: \['shard-00001\.npy'\]",
    )


def test_a_read_only_remote_folder_that_loses_an_object_is_refused(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its index is kept in the cache; its name hashed the listing, so a listing that lacked
    # an object never found it and the folder read as a smaller corpus.
    place = Place("memory", tmp_path, request)
    for i, arr in enumerate(id_shards()):  # uploaded by another tool: no index
        place.put(f"shard-{i:05d}.npy", arr)

    def refuse(self: Storage, url: str, data: bytes) -> None:
        raise ShardError(f"writing {url!r}: permission denied", path=url)

    monkeypatch.setattr(Storage, "write_bytes", refuse)
    assert ShardedDataset(place.url, READER, remote=place.remote()).sizes == SIZES
    assert len(list((tmp_path / "rcache" / "indexes").iterdir())) == 1
    place.remove("shard-00002.npy")
    refused(
        place,
        MissingShardError,
        r"lacks 1 shard\(s\) that its index .*rcache/indexes/.*\.json' lists: "
        r"\['shard-00002\.npy'\]; restore them",
        r"lists: \['shard-00002\.npy'\]",
    )
    assert len(list((tmp_path / "rcache" / "indexes").iterdir())) == 1


# ------------------------------------------------------- 2. an unfinished write_shards
def _write_then_die(folder: str, at: int) -> None:
    def shards() -> Iterator[np.ndarray]:
        for i, arr in enumerate(id_shards((50,) * 24)):
            if i == at:
                os.kill(os.getpid(), signal.SIGKILL)  # kill -9 after `at` shards
            yield arr

    write_shards(folder, shards(), READER, progress=False)


def test_a_folder_whose_write_was_killed_is_refused_until_the_write_is_rerun(
    tmp_path: Path,
) -> None:
    if sys.platform != "linux":
        pytest.skip("needs fork")
    folder = tmp_path / "corpus"
    child = multiprocessing.get_context("fork").Process(target=_write_then_die, args=(folder, 8))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL
    assert len(list(folder.glob("shard-*.npy"))) == 8
    with pytest.raises(
        ShardError,
        match=r"unfinished write_shards of shards 'shard-\*\.npy' .*re-run the same write_shards",
    ):
        ShardedDataset(folder, READER)
    with pytest.raises(ShardError, match=r"unfinished write_shards"):
        StreamingShardedDataset(folder, READER)
    write_shards(folder, id_shards((50,) * 24), READER, progress=False)  # resumes
    assert len(ShardedDataset(folder, READER)) == 1200


def test_a_remote_folder_whose_write_stopped_is_refused(
    s3: LocalS3, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    place = Place("s3", tmp_path, request)

    def shards() -> Iterator[np.ndarray]:
        for i, arr in enumerate(id_shards((50,) * 6)):
            if i == 3:
                raise KeyboardInterrupt  # stopped by the user after 3 shards
            yield arr

    with pytest.raises(KeyboardInterrupt):
        write_shards(place.url, shards(), READER, storage_options=place.options, progress=False)
    with pytest.raises(ShardError, match=r"silent-.*unfinished write_shards of shards 'shard-\*"):
        ShardedDataset(place.url, READER, remote=place.remote())
    write_shards(place.url, id_shards((50,) * 6), READER, storage_options=s3.options)
    assert len(ShardedDataset(place.url, READER, remote=place.remote())) == 300


# ----------------------------------------- 3. an object rewritten after it was listed
def _rewrite(fs: Any, url: str, plus: int) -> None:
    """Rewrite the folder's shards with the same sizes and other tokens."""
    for i, arr in enumerate(id_shards(plus=plus)):
        with fs.open(f"{url}/shard-{i:05d}.npy", "wb") as f:
            np.save(f, arr)


def test_an_object_rewritten_before_the_first_read_is_refused_with_workers(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    place = Place("s3", tmp_path, request)
    write_shards(place.url, id_shards(), READER, storage_options=place.options, progress=False)
    ds = ShardedDataset(place.url, READER, remote=place.remote())
    sizes = [s.size for s in ds.shards]
    _rewrite(place.fs, place.url, plus=1000)
    place.fs.invalidate_cache()
    assert [place.fs.size(s.url) for s in ds.shards] == sizes  # same sizes, new contents
    with pytest.raises(ShardChangedError, match=r"shard-0000\d\.npy' changed after the dataset"):
        epoch(ds, num_workers=2)


def test_range_reads_never_mix_two_versions_of_an_object_in_one_epoch(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    place = Place("s3", tmp_path, request)
    write_shards(place.url, id_shards(), READER, storage_options=place.options, progress=False)
    remote = RemoteCache(
        cache_dir=tmp_path / "rcache",
        storage_options=place.options,
        range_reads=True,
        block_bytes=16,  # two samples a block: most batches fetch blocks
        prefetch=0,
    )
    ds = ShardedDataset(place.url, READER, remote=remote)
    loader = ResumableDataLoader(ds, batch_sampler=ds.batch_sampler(4, seed=1, window=4))
    it = iter(loader)
    seen = [int(i) for _ in range(3) for i in next(it)[:, 0]]
    _rewrite(place.fs, place.url, plus=1000)
    with pytest.raises(ShardChangedError, match=r"changed after the dataset listed it"):
        for batch in it:
            seen += [int(i) for i in batch[:, 0]]
    assert max(seen) < 1000  # every sample read is of the listed version
    assert ds.describe()["remote"]["blocks_fetched"] > 0


# ---------------------------------------- an offsets sidecar older than its shard
DOCS, REORDERED = [1, 1, 0, 2, 2, 2, 0, 3, 0], [2, 2, 2, 0, 1, 1, 0, 3, 0]  # same length
CUT = [[2, 2, 2, 0], [1, 1, 0], [3, 0]]  # REORDERED's documents (the old sidecar cut 3, 4, 2)
EOS = TokenReader(eos=0)


def _documents(ds: Any) -> list[list[int]]:
    if isinstance(ds, StreamingShardedDataset):
        return [b[0].tolist() for b in ResumableDataLoader(ds, batch_size=1, seed=0)]
    return [ds[i].tolist() for i in range(len(ds))]


def _counted_earlier(shard: Path) -> None:
    """Its sidecar a second older (file times may be coarser than the test's writes)."""
    for side in shard.parent.glob(f"{shard.name}*.lkoffsets"):
        stat = side.stat()
        os.utime(side, ns=(stat.st_atime_ns, stat.st_mtime_ns - 10**9))


def test_a_local_stream_recounts_a_shard_rewritten_after_its_sidecar(tmp_path: Path) -> None:
    # Same token count, other documents: only the sidecar's last entry was checked.
    write_shards(tmp_path / "c", [DOCS], EOS, progress=False)
    shard = tmp_path / "c" / "shard-00000.npy"
    np.save(shard, np.array(REORDERED))
    _counted_earlier(shard)
    for read in (StreamingShardedDataset, ShardedDataset):  # the written index names the old one
        with pytest.raises(ShardChangedError, match=r"no longer matches the write_shards index"):
            read(tmp_path / "c", EOS)
    for index in (tmp_path / "c").glob(".loaderkit-index-*"):
        index.unlink()  # as the error says
    stream = StreamingShardedDataset(tmp_path / "c", EOS, shuffle_shards=False, mix_shards=1)
    assert _documents(stream) == CUT


def _synced(shard: Path, content: list[int], mtime_ns: int) -> None:
    """``shard`` replaced by ``content`` written elsewhere at ``mtime_ns`` (cp -p, rsync -a)."""
    np.save(shard, np.array(content))
    os.utime(shard, ns=(mtime_ns, mtime_ns))


@pytest.mark.parametrize("indexed", [True, False])
def test_a_shard_synced_with_an_older_mtime_is_recounted(tmp_path: Path, indexed: bool) -> None:
    # The sidecar was newer than the synced shard, which passed "no older than its shard":
    # the stream cut REORDERED at DOCS's documents ([2, 2, 2], [0, 1, 1, 0], [3, 0]).
    folder = tmp_path / "c"
    if indexed:
        write_shards(folder, [DOCS], EOS, progress=False)
        shard = folder / "shard-00000.npy"
    else:  # a plain folder a stream counted once
        folder.mkdir()
        shard = folder / "a.npy"
        np.save(shard, np.array(DOCS))
        stream = StreamingShardedDataset(folder, EOS, shuffle_shards=False, mix_shards=1)
        assert _documents(stream) == [[1, 1, 0], [2, 2, 2, 0], [3, 0]]
    _synced(shard, REORDERED, shard.stat().st_mtime_ns - 60 * 10**9)
    for index in folder.glob(".loaderkit-index-*"):
        index.unlink()  # as the ShardChangedError says
    stream = StreamingShardedDataset(folder, EOS, shuffle_shards=False, mix_shards=1)
    assert _documents(stream) == CUT
    assert _documents(ShardedDataset(folder, EOS)) == CUT


def test_a_folder_copied_with_its_mtimes_is_not_recounted(tmp_path: Path) -> None:
    import shutil

    write_shards(tmp_path / "c", [DOCS], EOS, progress=False)
    shutil.copytree(tmp_path / "c", tmp_path / "copy")  # copy2: mtimes kept, as cp -p
    (side,) = (tmp_path / "copy").glob("*.lkoffsets")
    before = side.stat().st_ino  # a recount renames a new sidecar into place
    stream = StreamingShardedDataset(tmp_path / "copy", EOS, shuffle_shards=False, mix_shards=1)
    for ds in (stream, ShardedDataset(tmp_path / "copy", EOS)):
        assert _documents(ds) == [[1, 1, 0], [2, 2, 2, 0], [3, 0]]
    assert side.stat().st_ino == before


def test_a_shard_rewritten_at_its_size_and_mtime_is_refused_where_a_document_is_cut_wrong(
    tmp_path: Path,
) -> None:
    # Hunter 332: its sidecar and index held (same size, same mtime), and the documents were
    # cut at the old places: [[2, 2, 2], [0, 1, 1, 0], [3, 0]], an eos inside a sample.
    write_shards(tmp_path, [DOCS], EOS, progress=False)
    shard = tmp_path / "shard-00000.npy"
    _synced(shard, REORDERED, shard.stat().st_mtime_ns)
    stream = StreamingShardedDataset(tmp_path, EOS, shuffle_shards=False, mix_shards=1)
    for ds in (ShardedDataset(tmp_path, EOS), stream):
        with pytest.raises(ShardChangedError, match=r"document 0 does not end with eos=0"):
            _documents(ds)


@pytest.mark.parametrize("sidecar", ["unstamped", "of another version"])
def test_a_sidecar_not_stamped_for_its_shard_in_a_read_only_folder_is_counted_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sidecar: str
) -> None:
    # An older loaderkit's sidecar (newer than its shard) in a read-only folder was refused
    # (its recount could not be written); trusting it there let a shard synced with an
    # older mtime be cut at the old documents. Counted in memory there, the sidecar kept.
    shard = tmp_path / "a.npy"
    np.save(shard, np.array(DOCS))
    EOS.count(shard)  # its sidecar, stamped
    (side,) = tmp_path.glob("*.lkoffsets")
    expected = [[1, 1, 0], [2, 2, 2, 0], [3, 0]]
    if sidecar == "unstamped":
        stat = side.stat()
        os.utime(side, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # as it was written
    else:
        _synced(shard, REORDERED, shard.stat().st_mtime_ns - 60 * 10**9)
        expected = CUT
    inode = side.stat().st_ino
    monkeypatch.setattr("loaderkit.data.readers.os.access", lambda path, mode: False)
    with pytest.warns(RuntimeWarning, match=r"its folder is read-only, so the shard is counted"):
        handle = EOS.open(shard)
        assert [handle.read(i).tolist() for i in range(len(handle))] == expected
    stream = StreamingShardedDataset([shard], EOS, shuffle_shards=False, mix_shards=1)
    with pytest.warns(RuntimeWarning, match=r"counted on every open"):
        assert _documents(stream) == expected
    assert side.stat().st_ino == inode
    monkeypatch.undo()  # writable: counted again, stamped
    assert _documents(ShardedDataset(tmp_path, EOS)) == expected
    assert side.stat().st_mtime_ns == shard.stat().st_mtime_ns


def test_a_stale_remote_sidecar_is_recounted_on_every_machine(tmp_path: Path) -> None:
    import fsspec

    url = f"memory://stale-{uuid.uuid4().hex[:8]}"
    write_shards(url, [DOCS], EOS, progress=False)
    fs = fsspec.filesystem("memory")
    with fs.open(f"{url}/shard-00000.npy", "wb") as f:  # re-uploaded, the sidecar not
        np.save(f, np.array(REORDERED))
    for index in fs.ls(url, detail=False):
        if ".loaderkit-index-" in index:
            fs.rm(index)  # as the ShardChangedError says
    for machine in ("first", "second"):  # the first counts and writes the index
        ds = ShardedDataset(url, EOS, remote=RemoteCache(cache_dir=tmp_path / machine))
        assert _documents(ds) == CUT, machine


def test_a_recompressed_zst_shard_is_recounted_in_a_new_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "c"
    write_shards(folder, [DOCS], EOS, compression="zstd", progress=False)
    plain = tmp_path / "new.npy"
    np.save(plain, np.array(REORDERED))
    _codec.compress_file(plain, folder / "shard-00000.npy.zst", 3)  # as `zstd -f` would
    for index in folder.glob(".loaderkit-index-*"):
        index.unlink()
    for cache in ("first", "second"):
        monkeypatch.setenv("LOADERKIT_CACHE_DIR", str(tmp_path / cache))
        assert _documents(ShardedDataset(folder, EOS)) == CUT, cache


# -------------------------------------------------------------------- 4. zstd shards
@pytest.mark.parametrize("kind", ["bin", "jsonl"])
def test_a_truncated_zst_shard_counted_without_an_index_raises(tmp_path: Path, kind: str) -> None:
    pytest.importorskip("zstandard")
    if kind == "bin":
        reader: Any = READER
        data: list[Any] = [np.arange(4 * 3000) % 500, np.arange(4 * 2000) % 300]
    else:
        reader = JsonlReader()
        data = [[{"a": i} for i in range(3000)], [{"b": i} for i in range(2000)]]
    suffix = ".bin" if kind == "bin" else None
    paths = write_shards(tmp_path, data, reader, suffix=suffix, compression="zstd")
    for index in tmp_path.glob(".loaderkit-index-*.json"):
        index.unlink()  # counted anew
    raw = paths[1].read_bytes()
    paths[1].write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ShardError, match=r"shard-00001\..*zst' is not a readable zstd .*truncated"):
        ShardedDataset(tmp_path, reader)


def _decode_and_hang(src: Path, folder: Path, flag: Path) -> None:
    """Decode ``src``, stopping for good once part of the output is written (to be killed)."""
    real_open = open

    class Slow:
        def __init__(self, f: Any) -> None:
            self.f, self.written = f, 0

        def __enter__(self) -> Slow:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def write(self, data: bytes) -> int:
            self.f.write(data)
            self.f.flush()
            self.written += len(data)
            flag.touch()
            time.sleep(3600)
            return len(data)

    def slow_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(path, mode, *args, **kwargs)
        return Slow(f) if "w" in mode and str(path).endswith(".tmp") else f

    _codec.open = slow_open  # type: ignore[attr-defined]  # this child process only
    _codec.decode_into(src, folder)


def test_a_killed_decode_leaves_nothing_that_is_read_or_kept(tmp_path: Path) -> None:
    pytest.importorskip("zstandard")
    if sys.platform != "linux":
        pytest.skip("needs fork")
    sizes = (3000, 2000)
    paths = write_shards(tmp_path / "d", id_shards(sizes), READER, compression="zstd")
    folder, flag = tmp_path / "decoded", tmp_path / "writing"
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_decode_and_hang, args=(paths[0], folder, flag))
    child.start()
    try:
        while not flag.exists():
            assert child.exitcode is None, "the decode ended before it was killed"
            time.sleep(0.01)
    finally:
        os.kill(child.pid, signal.SIGKILL)  # kill -9 in the middle of the decode
        child.join()
    assert [p.stat().st_size > 0 for p in folder.glob(".*.tmp")] == [True]  # the partial file
    decoded = _codec.decode_into(paths[0], folder)
    assert np.array_equal(np.load(decoded), id_shards(sizes)[0])
    assert not list(folder.glob(".*.tmp"))  # what the killed decode left is gone


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_a_damaged_decoded_copy_is_decoded_again(
    tmp_path: Path, cache_dir: Path, damage: str
) -> None:
    pytest.importorskip("zstandard")
    write_shards(tmp_path / "d", id_shards(), READER, compression="zstd", progress=False)
    expect = sorted(epoch(ShardedDataset(tmp_path / "d", READER)))
    assert expect == list(range(sum(SIZES)))
    for copy in (cache_dir / "decoded").glob("*/shard-*.npy"):
        raw = copy.read_bytes()
        if damage == "truncated":
            copy.write_bytes(raw[: len(raw) // 2])
        else:  # same size, other bytes
            copy.write_bytes(raw[:128] + bytes(len(raw) - 128))
    assert sorted(epoch(ShardedDataset(tmp_path / "d", READER))) == expect


# ------------------------------------------------- 12. an endpoint that never answers
class Silent:
    """A TCP server on localhost that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    server = Silent()
    yield server
    server.close()


def test_an_endpoint_that_never_answers_fails_at_loaderkits_deadline(
    silent: Silent, tmp_path: Path
) -> None:
    pytest.importorskip("s3fs")
    options = {"endpoint_url": silent.endpoint, "key": "k", "secret": "s"}
    remote = RemoteCache(
        cache_dir=tmp_path, storage_options=options, retries=1, backoff_s=0, timeout_s=1
    )
    with pytest.raises(
        ShardError,
        match=r"listing 's3://b/c' got no answer within timeout_s=1 s \(1 attempt\(s\)\); "
        r"check the endpoint.*RemoteCache\(timeout_s=",
    ):
        ShardedDataset("s3://b/c", READER, remote=remote)
    storage = Storage("s3://b/c", options, retries=0, backoff_s=0, timeout_s=1)
    with pytest.raises(ShardError, match=r"downloading 's3://b/c/x\.npy' got no answer within"):
        storage.download("s3://b/c/x.npy", tmp_path / "x.npy", 100, version="v")
    with pytest.raises(ShardError, match=r"range of 's3://b/c/x\.npy' got no answer within"):
        storage.read_ranges("s3://b/c/x.npy", [(0, 8)], 100, "v")
    assert not (tmp_path / "x.npy").exists()


@pytest.mark.parametrize("bad", [0, -1, "5", True])
def test_the_deadline_is_checked(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"timeout_s must be a finite number of seconds > 0"):
        RemoteCache(timeout_s=bad)


# ---------------------------------------- a subclass's __getitem__ through a wrapper
class Masked(ShardedDataset):
    """Masks every sample's first token: an override the batched reads must not bypass."""

    def __getitem__(self, index: int) -> Any:
        sample = super().__getitem__(index).clone()
        sample[0] = -1
        return sample


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("wrap", ["subset", "random_split"])
def test_a_subset_of_a_shard_subclass_reads_through_its_getitem(
    tmp_path: Path, wrap: str, num_workers: int
) -> None:
    # On the merge of i21/i22, torch's Subset called ShardedDataset.__getitems__, which read
    # the shards directly: no sample was masked (0.0 against 1.0 without the wrapper).
    reader = TokenReader(seq_len=SEQ)
    ds = Masked(write_shards(tmp_path, id_shards(), reader), reader)
    wrapped: Any = (
        Subset(ds, list(range(3, 19)))
        if wrap == "subset"
        else random_split(ds, [0.75, 0.25], generator=torch.Generator().manual_seed(0))[0]
    )
    loader = ResumableDataLoader(wrapped, batch_size=4, seed=0, num_workers=num_workers)
    firsts = torch.cat([batch[:, 0] for batch in loader])
    assert len(firsts) == len(wrapped) and bool((firsts == -1).all())
    assert [int(s[0]) for s in ds.__getitems__([0, 20])] == [-1, -1]


class OwnBatch(Masked):
    """Overrides the batched read too: that read is its own and is kept."""

    def __getitems__(self, indices: Any) -> list[Any]:
        return [s + 1000 for s in super().__getitems__(indices)]


def test_a_subclass_that_overrides_getitems_too_keeps_its_batched_read(tmp_path: Path) -> None:
    reader = TokenReader(seq_len=SEQ)
    ds = OwnBatch(write_shards(tmp_path, id_shards(), reader), reader)
    # Its own __getitems__ reads the shards through ShardedDataset's: unmasked, plus 1000.
    assert [s.tolist() for s in ds.__getitems__([1])] == [[1001] * SEQ]


def test_a_stream_cursor_into_an_object_replaced_since_is_refused(tmp_path: Path) -> None:
    """Measured before: a stream saved one batch into shard 0, then shard 0 re-uploaded
    shorter (a new version), resumed at the old offset in the new object without an error."""
    url = f"memory://stream-{uuid.uuid4().hex[:8]}"
    write_shards(url, [np.arange(40), np.arange(1000, 1040)], TokenReader(seq_len=4))

    def stream() -> ResumableDataLoader:
        ds = StreamingShardedDataset(
            url, TokenReader(seq_len=4), mix_shards=1, shuffle_shards=False,
            remote=RemoteCache(cache_dir=tmp_path / "cache"),
        )  # fmt: skip
        return ResumableDataLoader(ds, batch_size=3, seed=0)

    first = stream()
    next(iter(first))
    state = first.state_dict()
    stream().load_state_dict(state)  # the same versions: resumed
    write_shards(url, [np.arange(500, 520), np.arange(1000, 1040)], TokenReader(seq_len=4))
    with pytest.raises(StateMismatchError, match=r"field 'shard_bytes_crc32' differs"):
        stream().load_state_dict(state)


def _rewrite_in_place(path: Path, plus: int) -> None:
    """Same size, other tokens, a later mtime: what ``np.save`` over the same path does."""
    stat = path.stat()
    tokens = np.fromfile(path, np.uint16) + plus
    with path.open("r+b") as f:  # the same inode: a map over it sees the new bytes
        f.write(tokens.tobytes())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True)])
def test_a_shard_rewritten_in_place_between_epochs_is_refused_where_it_stays_open(
    tmp_path: Path, num_workers: int, persistent: bool
) -> None:
    # Hunter 289: a shard kept open (num_workers=0, persistent workers) read the rewrite as
    # the next epoch, with no error; fresh workers reopened it and refused it.
    paths = [tmp_path / f"s{i}.bin" for i in range(len(SIZES))]
    for path, tokens in zip(paths, id_shards(), strict=True):
        tokens.tofile(path)
    ds = ShardedDataset(paths, READER)
    loader = ResumableDataLoader(
        ds, batch_size=6, num_workers=num_workers, persistent_workers=persistent
    )
    assert sorted(int(i) for b in loader for i in b[:, 0]) == list(range(sum(SIZES)))
    _rewrite_in_place(paths[1], plus=1000)
    with pytest.raises(ShardError, match=r"s1\.bin"):
        list(loader)
    with pytest.raises(ShardError, match=r"s1\.bin"):  # a new loader over the same dataset
        list(ResumableDataLoader(ds, batch_size=6))


@pytest.mark.parametrize("wrap", ["stack", "stack-dict", "concat", "subset"])
def test_a_shard_rewritten_between_epochs_is_refused_through_torchs_wrappers(
    tmp_path: Path, wrap: str
) -> None:
    # Hunter 299: behind torch's StackDataset the epoch-start recheck never ran, and the
    # rewrite was read as epoch 1.
    from torch.utils.data import ConcatDataset, StackDataset, Subset

    paths = [tmp_path / f"s{i}.bin" for i in range(len(SIZES))]
    for path, tokens in zip(paths, id_shards(), strict=True):
        tokens.tofile(path)
    ds = ShardedDataset(paths, READER)
    wrapped = {
        "stack": lambda: StackDataset(ds, ds),
        "stack-dict": lambda: StackDataset(a=ds),
        "concat": lambda: ConcatDataset([ds]),
        "subset": lambda: Subset(ds, range(len(ds))),
    }[wrap]()
    # No per-sample seeding: StackDataset's __getitems__ would be watched for global RNG
    # draws, which another test's leftover server thread may make meanwhile.
    loader = ResumableDataLoader(wrapped, batch_size=6, per_sample_seeding=False)
    assert len(list(loader)) == 7
    _rewrite_in_place(paths[1], plus=1000)
    with pytest.raises(ShardError, match=r"s1\.bin"):
        list(loader)


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True)])
def test_a_hashed_shard_copied_over_with_its_mtime_kept_is_refused_at_the_next_epoch(
    tmp_path: Path, num_workers: int, persistent: bool
) -> None:
    # Hunter 299: `cp -p` over an open hashed shard (same size and mtime) was read as epoch
    # 1 (the recheck compared size and mtime only); a new dataset refused it by its hash.
    (path,) = write_shards(tmp_path / "d", [np.arange(8)], TokenReader(seq_len=2), hash="sha256")
    ds = ShardedDataset(tmp_path / "d", TokenReader(seq_len=2), on_error="skip")
    loader = ResumableDataLoader(
        ds, batch_size=2, num_workers=num_workers, persistent_workers=persistent
    )
    assert sorted(int(i) for b in loader for i in b[:, 0]) == [0, 2, 4, 6]
    stat = path.stat()
    with path.open("r+b") as f:  # other bytes at the same size, mtime put back
        f.seek(-16, 2)
        f.write(np.arange(100, 102, dtype=np.int64).tobytes())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ShardChangedError, match=r"fails its content hash"):  # skip raises it
        list(loader)


def test_a_changed_shard_of_another_dataset_does_not_stop_this_loader(tmp_path: Path) -> None:
    # Review: a check of every shard the process held open refused unrelated loaders.
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
        for i, tokens in enumerate(id_shards()):
            tokens.tofile(folder / f"s{i}.bin")
    first = ShardedDataset(sorted(folders[0].iterdir()), READER)
    assert len([b for b in ResumableDataLoader(first, batch_size=6)]) == 7  # its shards open
    _rewrite_in_place(folders[0] / "s1.bin", plus=1000)
    other = ShardedDataset(sorted(folders[1].iterdir()), READER)
    got = [int(i) for b in ResumableDataLoader(other, batch_size=6) for i in b[:, 0]]
    assert sorted(got) == list(range(sum(SIZES)))
