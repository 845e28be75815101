"""Shards at http(s):// URLs, served from a local folder by a threaded server (no network).

fsspec's HTTP filesystem lists a folder from its HTML index page and sizes each
file with a HEAD request. One server honours ``Range:`` (range reads fetch
blocks), one ignores it like Python's stock ``http.server`` (range reads fall
back to whole files: a 200 answer to a ranged GET is never taken for the range).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import (
    MissingShardError,
    RemoteCache,
    ResumableDataLoader,
    ShardedDataset,
    ShardError,
    TokenReader,
    write_shards,
)
from tests.support.http_server import LocalHTTP

pytest.importorskip("aiohttp")

SEQ = 4
SIZES = (12, 7, 16, 9)
READER = TokenReader(seq_len=SEQ, targets=True, dtype=np.uint16)


def arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, 60_000, size=n * SEQ + 1, dtype=np.uint16) for n in SIZES]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("www")
    write_shards(root / "corpus", arrays(), READER)
    for index in (root / "corpus").glob(".loaderkit-index-*"):
        index.unlink()  # a local folder's index: the shards are counted over HTTP instead
    return root


@pytest.fixture(params=[True, False], ids=["ranges", "no-ranges"])
def http(served: Path, request: pytest.FixtureRequest) -> Any:
    with LocalHTTP(served, ranges=request.param, etags=True) as server:
        yield server


def epochs(ds: ShardedDataset, num_workers: int = 0) -> list[torch.Tensor]:
    sampler = ds.batch_sampler(4, seed=1, window=4, mix_shards=2)
    loader = ResumableDataLoader(ds, batch_sampler=sampler, num_workers=num_workers)
    return list(loader) + list(loader)


@pytest.mark.parametrize("range_reads", [False, True])
def test_http_shards_give_the_batches_of_local_files(
    http: LocalHTTP, served: Path, tmp_path: Path, range_reads: bool
) -> None:
    ds = ShardedDataset(
        f"{http.url}/corpus/",
        READER,
        remote=RemoteCache(cache_dir=tmp_path / "c", range_reads=range_reads, block_bytes=32),
    )
    assert ds.sizes == SIZES  # from the folder's index, found over HTTP
    local = ShardedDataset(write_shards(tmp_path / "local", arrays(), READER), READER)
    got, want = epochs(ds, num_workers=2), epochs(local)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    info = ds.describe()["remote"]
    ranged_gets = [r for r in http.requests if r[0] == "GET" and r[2] is not None]
    if range_reads and http.server.ranges:
        assert info["fetched"] == 0 and info["blocks_fetched"] > 0, info
        assert ranged_gets
    elif range_reads:  # the server ignores Range: every shard is fetched whole
        assert info["fetched"] == len(SIZES) and info["blocks_fetched"] == 0, info
    else:  # whole files (fsspec may still ask for a file's bytes with a Range header)
        assert info["fetched"] == len(SIZES) and info["blocks_fetched"] == 0, info


def test_shards_versioned_by_whole_seconds_are_fetched_whole(served: Path, tmp_path: Path) -> None:
    # Hunter 359: blocks fetched apart held two versions of a shard rewritten at its size in
    # the second its Last-Modified names (888 samples of one, 3208 of the other).
    with LocalHTTP(served) as http:  # Last-Modified alone, as Python's http.server
        ds = ShardedDataset(
            f"{http.url}/corpus/",
            READER,
            remote=RemoteCache(cache_dir=tmp_path / "c", range_reads=True, block_bytes=32),
        )
        epochs(ds)
    info = ds.describe()["remote"]
    assert info["fetched"] == len(SIZES) and info["blocks_fetched"] == 0, info


def test_a_missing_http_shard_names_its_url(http: LocalHTTP, tmp_path: Path) -> None:
    url = f"{http.url}/corpus/shard-00009.npy"
    with pytest.raises(MissingShardError, match=f"shard {url!r} does not exist"):
        ShardedDataset(
            [f"{http.url}/corpus/shard-00000.npy", url],
            READER,
            remote=RemoteCache(cache_dir=tmp_path / "c"),
        )


def test_a_404_on_download_names_the_url(http: LocalHTTP, served: Path, tmp_path: Path) -> None:
    ds = ShardedDataset(f"{http.url}/corpus/", READER, remote=RemoteCache(cache_dir=tmp_path / "c"))
    shutil.rmtree(tmp_path / "c" / "objects")  # counting fetched the shards: a cold cache
    gone = served / "corpus" / "shard-00003.npy"
    data = gone.read_bytes()
    gone.unlink()
    try:
        with pytest.raises(MissingShardError, match=r"shard-00003\.npy'.*does not exist"):
            ds[len(ds) - 1]
    finally:
        gone.write_bytes(data)


def test_a_list_in_a_folder_the_server_will_not_list_says_so(
    http: LocalHTTP, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.support import http_server

    def refuse(handler: Any, path: str) -> None:
        handler.send_error(403, "Directory listing forbidden")  # nginx's, a CDN's default

    monkeypatch.setattr(http_server._Handler, "list_directory", refuse)
    urls = [f"{http.url}/corpus/shard-00000.npy"]
    with pytest.raises(ShardError, match=r"its folder's listing, which failed.*403.*local disk"):
        ShardedDataset(urls, READER, remote=RemoteCache(cache_dir=tmp_path / "c"))


def test_a_missing_http_folder_names_its_url(http: LocalHTTP, tmp_path: Path) -> None:
    url = f"{http.url}/nothing-here/"
    with pytest.raises(MissingShardError, match="nothing-here"):
        ShardedDataset(url, READER, remote=RemoteCache(cache_dir=tmp_path / "c"))


def test_a_shard_bigger_than_a_block_downloads_from_a_server_without_ranges(
    tmp_path: Path,
) -> None:
    # Hunter 312: fsspec read past its first block with a ranged GET, which such a server
    # answers whole; fsspec refused it, so every shard over ~8 MiB failed (as a network error).
    www = tmp_path / "www"
    tokens = np.arange(6 << 20, dtype=np.uint16)  # 12 MiB
    (www / "c").mkdir(parents=True)
    READER.write(www / "c" / "a.npy", tokens)
    with LocalHTTP(www, ranges=False) as http:
        cache = RemoteCache(cache_dir=tmp_path / "c", retries=0)
        ds = ShardedDataset(f"{http.url}/c/", READER, remote=cache)
        last = len(ds) - 1
        assert ds[last].tolist() == tokens[last * SEQ : (last + 1) * SEQ + 1].tolist()


def test_a_server_that_gives_no_sizes_is_refused_at_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hunter 312: a dynamic server's chunked answers (no Content-Length) were listed as 0
    # bytes, and each download failed its size check, retried and told as a network error.
    from fsspec.implementations.http import HTTPFileSystem

    looked_up, unsized = HTTPFileSystem._info, [".npy", ".md"]

    async def chunked(self: Any, url: str, **kwargs: Any) -> dict[str, Any]:
        info = await looked_up(self, url, **kwargs)
        return {**info, "size": None} if url.endswith(tuple(unsized)) else info

    monkeypatch.setattr(HTTPFileSystem, "_info", chunked)
    write_shards(tmp_path / "www" / "c", arrays(), READER)
    for index in (tmp_path / "www" / "c").glob(".loaderkit-index-*"):
        index.unlink()  # written for a local folder
    (tmp_path / "www" / "c" / "README.md").write_text("not read")
    cache = RemoteCache(cache_dir=tmp_path / "k")
    no_size = r"gives no size \(Content-Length\) for .*shard-0"
    with LocalHTTP(tmp_path / "www") as http:
        with pytest.raises(ShardError, match=no_size):
            ShardedDataset(f"{http.url}/c/", READER, remote=cache)
        unsized.remove(".npy")  # a file that is not read may have none (review 315)
        listed = ShardedDataset(f"{http.url}/c/", READER, remote=cache)
        assert listed.sizes == ShardedDataset(tmp_path / "www" / "c", READER).sizes


def test_a_same_size_rewrite_within_its_last_modified_second_is_counted_again(
    tmp_path: Path,
) -> None:
    # Hunter 312: loaderkit's own index in the cache was reused across listings for a
    # Last-Modified version (whole seconds), so the new dataset counted 3 records where the
    # rewrite held 4, then refused to read the shard.
    from loaderkit import JsonlReader

    folder = tmp_path / "www" / "c"
    folder.mkdir(parents=True)
    a = folder / "a.jsonl"
    a.write_bytes(b'{"v":1}\n{"v":2}\n{"v":3333333333}\n')
    (folder / "b.jsonl").write_bytes(b'{"v":5}\n')
    stat = a.stat()
    with LocalHTTP(tmp_path / "www") as http:
        cache = RemoteCache(cache_dir=tmp_path / "cache", prefetch=0)
        assert ShardedDataset(f"{http.url}/c/", JsonlReader(), remote=cache).sizes == (3, 1)
        a.write_bytes(b'{"v":6}\n{"v":7}\n{"v":8}\n{"v":99}\n')  # the same 33 bytes
        os.utime(a, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # cp -p, rsync -t
        again = ShardedDataset(f"{http.url}/c/", JsonlReader(), remote=cache)
        assert [again[i]["v"] for i in range(len(again))] == [6, 7, 8, 99, 5]


def test_a_stream_pins_headers_a_whole_second_version_cannot_tell_apart(
    tmp_path: Path,
) -> None:
    # Review 315: a "<u2" header rewritten as "<i2" within its Last-Modified second (cp -p)
    # kept its listing, so a resume, or the next pass after an eviction, read other tokens.
    from loaderkit import ShardChangedError, StateMismatchError, StreamingShardedDataset

    folder = tmp_path / "www" / "c"
    folder.mkdir(parents=True)
    for k in range(3):
        tokens = np.arange(40_000 + 100 * k, 40_008 + 100 * k, dtype=np.uint16)
        (folder / f"s{k}.bin").write_bytes(tokens.tobytes())
        (folder / f"s{k}.bin.lkdtype").write_text("<u2")
    reader = TokenReader(seq_len=4, out_dtype=None)
    with LocalHTTP(tmp_path / "www") as http:

        def make(name: str) -> ResumableDataLoader:
            # A 40-byte cache holds one shard: each pass fetches them again.
            cache = RemoteCache(cache_dir=tmp_path / name, max_bytes=40, prefetch=0)
            ds = StreamingShardedDataset(f"{http.url}/c/", reader, shuffle_shards=False,
                                         mix_shards=1, remote=cache)  # fmt: skip
            return ResumableDataLoader(ds, batch_size=2)

        dl = make("a")
        assert [b[:, 0].tolist() for b in dl] == [[40_000, 40_004], [40_100, 40_104],
                                                  [40_200, 40_204]]  # fmt: skip
        resumed = make("b")
        next(iter(resumed))
        state = resumed.state_dict()
        for k in range(3):
            header = folder / f"s{k}.bin.lkdtype"
            stat = header.stat()
            header.write_text("<i2")
            os.utime(header, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        with pytest.raises(StateMismatchError, match=r"'dtype_headers_crc32'.*restore them"):
            make("c").load_state_dict(state)
        with pytest.raises(ShardChangedError, match=r"s0\.bin' now reads as <i2 tokens"):
            list(dl)


def test_a_same_size_rewrite_without_an_etag_is_counted_and_read_anew(
    tmp_path: Path,
) -> None:
    # Python's http.server sends Last-Modified and no ETag. Whole seconds tell no two writes
    # apart (the test above), so a new dataset counts such shards again, as shards without
    # a version; it was refused here while the same rewrite within one second was misread.
    www = tmp_path / "www"
    write_shards(www / "corpus", arrays(), READER)
    for index in (www / "corpus").glob(".loaderkit-index-*"):
        index.unlink()
    cache = RemoteCache(cache_dir=tmp_path / "c")
    with LocalHTTP(www, ranges=False) as http:
        url = f"{http.url}/corpus/"
        assert (
            ShardedDataset(url, READER, remote=cache)[0].tolist() == arrays()[0][: SEQ + 1].tolist()
        )
        shard = www / "corpus" / "shard-00000.npy"
        READER.write(shard, arrays()[0][::-1].copy())  # same size, other tokens
        stat = shard.stat()
        os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**10))  # a later second
        again = ShardedDataset(url, READER, remote=cache)
        assert again[0].tolist() == arrays()[0][::-1][: SEQ + 1].tolist()


def test_shards_swapped_within_their_last_modified_second_are_not_read_from_the_cache(
    tmp_path: Path,
) -> None:
    # Measured before: two same-size shards with one Last-Modified second (write_shards writes
    # a corpus within one), renamed over each other between runs, were read from the cache as
    # they were: shard 0 gave shard 1's old tokens. That header names a second only.
    www = tmp_path / "www"
    first, second = (www / "c" / f"shard-{i:05d}.npy" for i in (0, 1))
    first.parent.mkdir(parents=True)
    for path, base in ((first, 0), (second, 100)):
        READER.write(path, np.arange(base, base + 2 * SEQ + 1))
    stat = first.stat()
    os.utime(second, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    cache = tmp_path / "cache"

    def firsts(url: str) -> list[int]:
        ds = ShardedDataset(url, READER, remote=RemoteCache(cache_dir=cache))
        return [int(ds[i][0]) for i in range(len(ds))]

    with LocalHTTP(www) as http:
        assert firsts(f"{http.url}/c/") == [0, 4, 100, 104]
        first.rename(www / "c" / "tmp")
        second.rename(first)
        (www / "c" / "tmp").rename(second)
        assert firsts(f"{http.url}/c/") == [100, 104, 0, 4]


def test_a_stream_reads_a_compressed_shards_own_header_not_a_neighbours(tmp_path: Path) -> None:
    # Review 396: c.bin.zst took the header of c.bin-x.bin (its name starts alike and sorts
    # first), read as int32 and refused its own uint16 header.
    zstandard = pytest.importorskip("zstandard")
    from loaderkit import StreamingShardedDataset

    folder = tmp_path / "c"
    folder.mkdir()
    plain = np.arange(8, dtype=np.uint16) + 200
    (folder / "c.bin.zst").write_bytes(zstandard.ZstdCompressor().compress(plain.tobytes()))
    (folder / "c.bin.lkdtype").write_text("<u2")
    (np.arange(8, dtype=np.int32) + 90_000).tofile(folder / "c.bin-x.bin")
    (folder / "c.bin-x.bin.lkdtype").write_text("<i4")
    with LocalHTTP(tmp_path) as http:
        ds = StreamingShardedDataset(
            f"{http.url}/c/",
            TokenReader(seq_len=4),
            shuffle_shards=False,
            remote=RemoteCache(cache_dir=tmp_path / "cache"),
        )
        got = sorted(int(v) for b in ResumableDataLoader(ds, batch_size=2, seed=0) for v in b[:, 0])
    assert got == [200, 204, 90_000, 90_004]
