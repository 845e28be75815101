"""Shards at s3:// URLs, against a real S3-compatible server (moto's, on localhost).

The server runs in its own process for this module (``tests/support/s3.py``);
shards are written with ``write_shards`` straight to the bucket. Each test
gets its own folder and cache directory.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import (
    MissingDependencyError,
    MissingShardError,
    RemoteCache,
    ResumableDataLoader,
    ShardChangedError,
    ShardedDataset,
    ShardError,
    StreamingShardedDataset,
    TokenReader,
    write_shards,
)
from loaderkit.data import _fs
from tests.support.s3 import LocalS3

pytest.importorskip("s3fs")
pytest.importorskip("moto")

SEQ = 4
SIZES = (12, 7, 16, 9, 12, 8)  # 64 samples, uneven shards
READER = TokenReader(seq_len=SEQ, dtype=np.uint16)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Any:
    server = LocalS3(log=tmp_path_factory.mktemp("moto") / "moto.log")
    server.start()
    yield server
    server.stop()


def shard_arrays(sizes: tuple[int, ...] = SIZES) -> list[np.ndarray]:
    """Every token of global sample ``i`` is ``i``."""
    arrays, first = [], 0
    for n in sizes:
        arrays.append(np.repeat(np.arange(first, first + n), SEQ).astype(np.uint16))
        first += n
    return arrays


@pytest.fixture
def folder(s3: LocalS3, request: pytest.FixtureRequest) -> str:
    url = f"s3://{s3.bucket}/{request.node.name.replace('[', '-').rstrip(']')}"
    write_shards(url, shard_arrays(), READER, storage_options=s3.options)
    return url


def cache(s3: LocalS3, tmp_path: Path, **kwargs: Any) -> RemoteCache:
    return RemoteCache(cache_dir=tmp_path / "cache", storage_options=s3.options, **kwargs)


def cached_names(root: Path) -> list[str]:
    # Complete shards only: a downloader removes its hidden reservation file just after
    # the shard appears (and a reader may already have read it).
    return sorted(p.name for p in (root / "cache" / "objects").glob("*/[!.]*"))


def ids(batches: list[torch.Tensor]) -> list[list[int]]:
    return [b[:, 0].tolist() for b in batches]


def loader(ds: ShardedDataset, num_workers: int, **plan: Any) -> ResumableDataLoader:
    sampler = ds.batch_sampler(4, seed=3, window=4, **plan)
    return ResumableDataLoader(ds, batch_sampler=sampler, num_workers=num_workers)


# ----------------------------------------------------------------- writing
def test_write_shards_uploads_shards_and_index_and_the_dataset_counts_nothing(
    s3: LocalS3, folder: str, tmp_path: Path
) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.options)
    names = sorted(p.rsplit("/", 1)[1] for p in fs.ls(folder))
    assert names[0].startswith(".loaderkit-index-") and names[0].endswith(".json")
    assert names[1:] == [f"shard-{i:05d}.npy" for i in range(len(SIZES))]
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path))
    assert ds.sizes == SIZES
    assert ds.describe()["remote"]["fetched"] == 0  # the sizes came from the index
    assert repr(ds.shards[0]) == repr(f"{folder}/shard-00000.npy")  # messages name the URL


def test_hidden_and_own_files_in_a_remote_folder_are_never_shards(
    s3: LocalS3, folder: str, tmp_path: Path
) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.options)
    fs.pipe_file(f"{folder}/._shard-00000.npy", b"AppleDouble")
    fs.pipe_file(f"{folder}/.partial.npy", b"junk")
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path))
    assert [s.name for s in ds.shards] == [f"shard-{i:05d}.npy" for i in range(len(SIZES))]


def test_a_remote_shard_compressed_in_a_form_no_reader_opens_is_refused(
    s3: LocalS3, folder: str, tmp_path: Path
) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.options)
    fs.pipe_file(f"{folder}/shard-00009.npy.gz", b"gzip")
    with pytest.raises(ValueError, match=r"'shard-00009\.npy\.gz', compressed in a form no"):
        ShardedDataset(folder, READER, remote=cache(s3, tmp_path))


def test_a_remote_shard_in_a_subfolder_is_refused(s3: LocalS3, folder: str, tmp_path: Path) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.options)
    fs.pipe_file(f"{folder}/lang=de/shard-00000.npy", fs.cat_file(f"{folder}/shard-00000.npy"))
    with pytest.raises(ValueError, match=r"lang=de/shard-00000\.npy' in a subfolder"):
        ShardedDataset(folder, READER, remote=cache(s3, tmp_path))


@pytest.mark.parametrize("listing", ["folder", "list"])
def test_a_remote_shard_beside_its_zstd_form_is_refused(
    s3: LocalS3, folder: str, tmp_path: Path, listing: str
) -> None:
    import s3fs
    import zstandard

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.options)
    raw = fs.cat_file(f"{folder}/shard-00001.npy")
    fs.pipe_file(f"{folder}/shard-00001.npy.zst", zstandard.ZstdCompressor().compress(raw))
    fs.rm(fs.glob(f"{folder}/.loaderkit-index-*"))  # an index refuses the unlisted .zst first
    urls = [f"{folder}/shard-0000{i}.npy" for i in range(len(SIZES))]
    shards = folder if listing == "folder" else [*urls, f"{folder}/shard-00001.npy.zst"]
    with pytest.raises(ValueError, match=r"shard-00001\.npy' and .*shard-00001\.npy\.zst' are"):
        ShardedDataset(shards, READER, remote=cache(s3, tmp_path))


def test_a_remote_raw_shard_compressed_elsewhere_keeps_its_dtype_header(
    s3: LocalS3, tmp_path: Path
) -> None:
    """a.bin.zst uploaded beside a.bin.lkdtype: the header was not fetched, and uint32
    tokens were read as uint16 with no error."""
    import s3fs
    import zstandard

    tokens = np.arange(70_000, 70_000 + 16, dtype=np.uint32)
    (path,) = write_shards(tmp_path / "d", [tokens], TokenReader(seq_len=SEQ), suffix=".bin")
    url = f"s3://{s3.bucket}/raw-compressed-elsewhere"
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.options)
    fs.pipe_file(f"{url}/{path.name}.zst", zstandard.ZstdCompressor().compress(path.read_bytes()))
    fs.put_file(str(path) + ".lkdtype", f"{url}/{path.name}.lkdtype")
    with pytest.raises(ShardError, match=r"holds uint32 tokens \(says its \.lkdtype header\)"):
        ShardedDataset(url, READER, remote=cache(s3, tmp_path))[0]
    ds = ShardedDataset(url, TokenReader(seq_len=SEQ), remote=cache(s3, tmp_path / "2"))
    assert torch.cat([ds[i] for i in range(len(ds))]).tolist() == tokens.tolist()
    # A header changed later is fetched anew, not served from the cache.
    fs.pipe_file(f"{url}/{path.name}.lkdtype", b"<u2")
    fs.rm(fs.glob(f"{url}/.loaderkit-index-*"))
    ds = ShardedDataset(url, TokenReader(seq_len=SEQ), remote=cache(s3, tmp_path / "2"))
    assert len(ds) == 2 * len(tokens) // SEQ


# ------------------------------------------------------------ reading, resume
@pytest.mark.parametrize("num_workers", [0, 2])
def test_training_from_s3_resumes_exactly(
    s3: LocalS3, folder: str, tmp_path: Path, num_workers: int
) -> None:
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path))
    full_loader = loader(ds, num_workers, mix_shards=2)
    full = []
    for _ in range(2):
        full += ids(list(full_loader))
    # The same batches as from local copies of the shards.
    local = ShardedDataset(write_shards(tmp_path / "local", shard_arrays(), READER), READER)
    ref_loader = loader(local, 0, mix_shards=2)
    assert full == ids(list(ref_loader)) + ids(list(ref_loader))
    for epoch in range(2):
        seen = Counter(i for b in full[epoch * 16 : (epoch + 1) * 16] for i in b)
        assert sorted(seen) == list(range(64)) and set(seen.values()) == {1}

    # Stop after 5 batches, resume with a fresh dataset, loader and (cold) cache.
    first = loader(ds, num_workers, mix_shards=2)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    again = ShardedDataset(folder, READER, remote=cache(s3, tmp_path / "resumed"))
    resumed = loader(again, num_workers, mix_shards=2)
    resumed.load_state_dict(state)
    tail = ids(list(resumed)) + ids(list(resumed))
    assert ids(head) + tail == full
    info = again.describe()["remote"]
    assert info["unplanned"] == 0, info  # every batch was predicted from the plan
    assert info["retries"] == 0 and info["over_budget"] == 0


def test_a_resumed_run_fetches_only_what_the_rest_of_the_epoch_reads(
    s3: LocalS3, folder: str, tmp_path: Path
) -> None:
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path / "a"))
    first = loader(ds, 0, mix_shards=1)
    it = iter(first)
    for _ in range(11):  # 11 of 16 batches
        next(it)
    state = first.state_dict()
    del it
    again = ShardedDataset(folder, READER, remote=cache(s3, tmp_path / "b"))
    resumed = loader(again, 0, mix_shards=1)
    resumed.load_state_dict(state)
    rest = [i for b in ids(list(resumed)) for i in b]
    assert len(rest) == 5 * 4
    wanted = sorted({f"shard-{again.locate(i)[0]:05d}.npy" for i in rest})
    assert len(wanted) < len(SIZES)  # the test means something: some shards are not read
    assert cached_names(tmp_path / "b") == wanted


def test_each_worker_fetches_only_the_shards_of_its_own_batches(
    s3: LocalS3, folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Workers are forked, so they inherit this wrapper: it logs who downloaded what.
    log = tmp_path / "downloads.jsonl"
    real = _fs.Storage.download

    def logged(self: _fs.Storage, url: str, target: Path, size: int, **kw: Any) -> None:
        info = torch.utils.data.get_worker_info()
        with open(log, "a") as f:
            f.write(json.dumps({"worker": None if info is None else info.id, "url": url}) + "\n")
        real(self, url, target, size, **kw)

    monkeypatch.setattr(_fs.Storage, "download", logged)
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path))
    plan_loader = loader(ds, 2, mix_shards=1)
    if sys.platform != "linux":
        pytest.skip("needs fork-started workers")
    batches = ids(list(plan_loader))
    sched = ds.plan(4, seed=3, window=4, mix_shards=1).schedule(0, start=0, rank=0, world_size=1)
    assert batches == [sched.indices(s).tolist() for s in range(sched.num_steps)]
    own = {
        w: {ds.locate(i)[0] for b in batches[w::2] for i in b}  # torch deals batches in turn
        for w in (0, 1)
    }
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["worker"] for r in records} <= {0, 1}
    for r in records:
        shard = int(r["url"].rsplit("-", 1)[1].split(".")[0])
        assert shard in own[r["worker"]], (r, own)
    # Each shard downloaded once for the machine: the workers share the cache.
    assert sorted(Counter(r["url"] for r in records).values()) == [1] * len(SIZES)


def test_persistent_workers_predict_an_epoch_that_opens_like_the_last(
    s3: LocalS3, tmp_path: Path
) -> None:
    # With these sizes and seed, epochs 0 and 1 of rank 0 both open with sample 61: a
    # worker that matched epoch 1's first batch against epoch 0's read the rest of
    # epoch 1 unplanned (on-demand fetches, counted).
    sizes = (12, 7, 16, 9, 12, 8)
    url = f"s3://{s3.bucket}/same-opening"
    write_shards(url, shard_arrays(sizes), READER, storage_options=s3.options)
    ds = ShardedDataset(url, READER, remote=cache(s3, tmp_path, prefetch=2))
    sampler = ds.batch_sampler(4, seed=7, window=8, mix_shards=2)
    plan = sampler.plan
    opening = [plan.schedule(e, start=0, rank=0, world_size=2).indices(0)[0].item() for e in (0, 1)]
    assert opening[0] == opening[1]  # the case under test
    dl = ResumableDataLoader(
        ds, batch_sampler=sampler, num_workers=2, persistent_workers=True, rank=0, world_size=2
    )
    for _ in range(2):
        list(dl)
    info = ds.describe()["remote"]
    assert info["unplanned"] == 0, info


def test_the_cache_stays_within_its_budget_by_evicting_what_the_plan_is_done_with(
    s3: LocalS3, folder: str, tmp_path: Path
) -> None:
    shard_bytes = max(s.size for s in ShardedDataset(folder, READER, remote=cache(
        s3, tmp_path / "probe")).shards)  # fmt: skip
    budget = 3 * shard_bytes
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path, max_bytes=budget, prefetch=1))
    got = []
    one = loader(ds, 0, mix_shards=1)
    for _ in range(2):
        got += ids(list(one))
        used = sum(p.stat().st_size for p in (tmp_path / "cache" / "objects").glob("*/*"))
        assert used <= budget
    assert sorted(i for b in got for i in b) == sorted(list(range(64)) * 2)
    info = ds.describe()["remote"]
    assert info["evicted"] > 0 and info["over_budget"] == 0, info


def test_a_budget_too_small_for_the_shards_in_use_warns_and_still_reads(
    s3: LocalS3, folder: str, tmp_path: Path
) -> None:
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path, max_bytes=1, prefetch=0))
    with pytest.warns(RuntimeWarning, match=r"max_bytes=1.*raise RemoteCache\(max_bytes"):
        got = [i for b in ids(list(loader(ds, 0, mix_shards=2))) for i in b]
    assert sorted(got) == list(range(64))
    assert ds.describe()["remote"]["over_budget"] > 0


# --------------------------------------------------------------------- streams
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stream_from_s3_resumes_exactly(
    s3: LocalS3, folder: str, tmp_path: Path, num_workers: int
) -> None:
    def make(root: Path) -> ResumableDataLoader:
        ds = StreamingShardedDataset(folder, READER, mix_shards=2, remote=cache(s3, root))
        return ResumableDataLoader(ds, batch_size=4, seed=5, num_workers=num_workers)

    full = ids(list(make(tmp_path / "full")))
    assert sorted(i for b in full for i in b) == list(range(64))
    first = make(tmp_path / "first")
    it = iter(first)
    head = ids([next(it) for _ in range(4)])
    state = first.state_dict()
    del it
    resumed = make(tmp_path / "resumed")
    resumed.load_state_dict(state)
    assert head + ids(list(resumed)) == full


# ------------------------------------------------------------------- failures
def test_a_partial_download_never_enters_the_cache_and_is_retried(
    s3: LocalS3, folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path, prefetch=0, backoff_s=0.01))
    real_open = ds._remote.storage.fs.open  # type: ignore[union-attr]
    cut = {"left": 2}

    class Truncated:
        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> Truncated:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def read(self, n: int) -> bytes:
            data = self.f.read(n)
            return data[: len(data) // 2]  # the connection "drops" half-way, unnoticed

    def flaky_open(url: str, mode: str = "rb", **kw: Any) -> Any:
        f = real_open(url, mode, **kw)
        if cut["left"] > 0:
            cut["left"] -= 1
            return Truncated(f)
        return f

    monkeypatch.setattr(ds._remote.storage.fs, "open", flaky_open)  # type: ignore[union-attr]
    assert ds[0].tolist() == [0] * SEQ
    info = ds.describe()["remote"]
    assert info["retries"] == 2 and info["fetched"] == 1
    objects = tmp_path / "cache" / "objects"
    assert [p.name for p in objects.glob("*/*")] == ["shard-00000.npy"]
    assert not list(objects.glob("*/.*"))  # no temporary file left behind


def test_a_missing_object_names_its_url(s3: LocalS3, folder: str, tmp_path: Path) -> None:
    import s3fs

    ds = ShardedDataset(folder, READER, remote=cache(s3, tmp_path))
    s3fs.S3FileSystem(skip_instance_cache=True, **s3.options).rm(f"{folder}/shard-00002.npy")
    with pytest.raises(MissingShardError, match=r"shard-00002\.npy.*does not exist"):
        ds[SIZES[0] + SIZES[1]]
    with pytest.raises(MissingShardError, match=r"does not exist"):
        ShardedDataset([f"{folder}/shard-00002.npy"], READER, remote=cache(s3, tmp_path))


def test_a_file_url_given_as_the_folder_is_named(s3: LocalS3, folder: str, tmp_path: Path) -> None:
    # It was listed as a folder holding itself: ".../shard-00000.npy/shard-00000.npy" was
    # fetched, FileExistsError retried for 15 s, then "check the endpoint and the network".
    from loaderkit import StreamingShardedDataset

    url = f"{folder}/shard-00000.npy"
    for make in (ShardedDataset, StreamingShardedDataset):
        with pytest.raises(
            ValueError, match=r"is a file, not a folder .*: shards=\['s3://.*/shard-00000\.npy'\]\."
        ):
            make(url, READER, remote=cache(s3, tmp_path))
    assert ShardedDataset([url], READER, remote=cache(s3, tmp_path)).sizes == SIZES[:1]


def test_an_object_changed_after_indexing_is_refused_by_url(
    s3: LocalS3, folder: str, tmp_path: Path
) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.options)
    with fs.open(f"{folder}/shard-00001.npy", "wb") as f:
        np.save(f, np.zeros(4 * SEQ, dtype=np.uint16))
    with pytest.raises(ShardError, match=r"shard-00001\.npy' changed after it was indexed"):
        ShardedDataset(folder, READER, remote=cache(s3, tmp_path))


def test_a_network_error_is_retried_with_backoff_then_names_the_url(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{_closed_port()}"
    options = {
        "endpoint_url": closed,
        "key": "k",
        "secret": "s",
        "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}},
    }
    remote = RemoteCache(cache_dir=tmp_path, storage_options=options, retries=2, backoff_s=0.01)
    with pytest.raises(ShardError, match=r"listing 's3://b/c' failed 3 time\(s\).*network"):
        ShardedDataset("s3://b/c", READER, remote=remote)


def _closed_port() -> int:
    from tests.support.s3 import free_port

    return free_port()


def test_missing_fsspec_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)
    with pytest.raises(MissingDependencyError, match=r"pip install '\.\[remote\]'"):
        ShardedDataset("s3://bucket/data", READER, remote=RemoteCache(cache_dir=tmp_path))


def test_a_protocol_without_its_package_names_it(tmp_path: Path) -> None:
    if _installed("gcsfs"):
        pytest.skip("gcsfs is installed")
    with pytest.raises(MissingDependencyError, match=r"gs:// URLs need gcsfs.*\.\[remote\]"):
        ShardedDataset("gs://bucket/data", READER, remote=RemoteCache(cache_dir=tmp_path))


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"max_bytes": 0}, ValueError, r"max_bytes.*pass a byte count"),
        ({"prefetch": -1}, ValueError, r"prefetch.*pass shards to fetch ahead"),
        ({"retries": 1.5}, TypeError, r"retries.*pass a retry count"),
        ({"backoff_s": -1}, ValueError, r"backoff_s must be .* >= 0, got -1; pass e.g. 0.5"),
        ({"backoff_s": True}, ValueError, r"backoff_s must be a finite .*got True"),
        ({"backoff_s": float("inf")}, ValueError, r"backoff_s must be a finite .*got inf"),
        ({"timeout_s": float("inf")}, ValueError, r"timeout_s must be a finite .*got inf"),
        ({"timeout_s": 0}, ValueError, r"timeout_s must be .* > 0, got 0; pass e.g. 120"),
        ({"cache_dir": 123}, TypeError, r"cache_dir must be a path, got 123"),
        ({"cache_dir": ""}, ValueError, r"cache_dir=.. would put the cache in the working"),
        ({"storage_options": "x"}, TypeError, r"storage_options must be a dict"),
    ],
)
def test_remote_cache_arguments_are_checked(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        RemoteCache(**kwargs)


def test_a_cache_size_variable_that_is_no_byte_count_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Not ASCII digits: a superscript two (no int()) and a full-width four (int() 4).
    for bad in ("abc", "0", "\u00b2", "\uff14"):
        monkeypatch.setenv("LOADERKIT_CACHE_BYTES", bad)
        with pytest.raises(ValueError, match=rf"LOADERKIT_CACHE_BYTES must be .*, got '{bad}'"):
            RemoteCache()
    monkeypatch.setenv("LOADERKIT_CACHE_BYTES", "4096")
    assert RemoteCache().max_bytes == 4096


def test_remote_options_for_local_shards_are_refused(tmp_path: Path) -> None:
    paths = write_shards(tmp_path / "d", shard_arrays(), READER)
    with pytest.raises(ValueError, match=r"remote= is for shards at URLs.*leave remote out"):
        ShardedDataset(paths, READER, remote=RemoteCache(cache_dir=tmp_path))
    with pytest.raises(TypeError, match=r"mixes URLs and other items"):
        ShardedDataset([str(paths[0]), "s3://b/x.npy"], READER)
    with pytest.raises(ValueError, match=r"storage_options is for a URL"):
        write_shards(tmp_path / "e", shard_arrays(), READER, storage_options={})


def test_the_cache_directory_defaults_to_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LOADERKIT_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("LOADERKIT_CACHE_BYTES", "12345")
    remote = RemoteCache()
    assert remote.directory == tmp_path / "c" and remote.max_bytes == 12345
    assert os.environ["LOADERKIT_CACHE_DIR"] == str(remote.directory)


@pytest.mark.parametrize(
    ("entry", "version"),
    [
        (
            {"size": 1, "Last-Modified": "Mon, 01 Jan 2024 00:00:00 GMT"},
            "Mon, 01 Jan 2024 00:00:00 GMT",
        ),
        ({"size": 1, "blob_id": "9f86d08", "last_commit": None, "xet_hash": None}, "9f86d08"),
        ({"size": 1, "generation": 17}, "17"),
        ({"size": 1, "ETag": '"abc"', "Last-Modified": "Mon"}, "abc"),
    ],
    ids=["http", "hf", "gcs-generation", "etag-first"],
)
def test_each_store_names_an_object_version(entry: dict[str, Any], version: str) -> None:
    # Without one, a same-size rewrite would be served from the cache.
    assert _fs.version_of(entry) == version


def test_an_index_that_recorded_no_version_is_read_by_sizes() -> None:
    # Written before loaderkit read a version from this store (hf://, http:// without ETag).
    from loaderkit.data.index import index_doc, read_remote_index

    reader = TokenReader(seq_len=4)
    doc = index_doc([["shard-00000.npy", 160, "", 9]], reader, remote=True)
    listed = [("hf://d/shard-00000.npy", "shard-00000.npy", 160, "9f86d08")]
    counts, _ = read_remote_index(doc, "hf://d/.loaderkit-index-x.json", reader, listed)
    assert counts == [9]
    with pytest.raises(ShardChangedError, match="changed after it was indexed"):
        read_remote_index(doc, "hf://d/i.json", reader, [(*listed[0][:2], 168, "9f86d08")])


def test_the_prefetch_keeps_a_few_epoch_predictions_not_every_epochs(tmp_path: Path) -> None:
    # Hunter 394: every epoch's whole prediction (a list as long as its steps) was kept, so
    # a reading process grew by an epoch's plan per epoch.
    reader = TokenReader(seq_len=1, dtype=np.uint16)
    url = f"memory://kept-{os.getpid()}-{id(tmp_path)}"
    write_shards(url, [np.full(40, s, dtype=np.uint16) for s in range(6)], reader, progress=False)
    cache = RemoteCache(cache_dir=tmp_path / "c", prefetch=2)
    dataset = ShardedDataset(url, reader, remote=cache)
    loader = ResumableDataLoader(dataset, batch_sampler=dataset.batch_sampler(4, seed=0))
    assert dataset._remote is not None
    for _ in range(7):
        got = sorted(torch.cat([batch.flatten() for batch in loader]).tolist())
        assert got == np.repeat(np.arange(6), 40).tolist()
    assert 1 <= len(dataset._remote._follow.predictions) <= 4


@pytest.mark.parametrize("mix_shards", [1, 3])
def test_the_prefetch_prediction_counts_each_shards_reads_and_steps(mix_shards: int) -> None:
    # The counts are made per chunk of steps (a per-step count over every shard cost
    # O(steps x shards)); they must equal a count step by step.
    from loaderkit.data._remote_plan import _CHUNK, indices, predict, shard_of
    from loaderkit.plan.shard import ShardPlan

    sizes = [int(n) for n in np.random.default_rng(mix_shards).integers(1, 40, 23)]
    plan = ShardPlan(shard_sizes=tuple(sizes), batch_size=1, seed=5, mix_shards=mix_shards)
    ends = np.cumsum(sizes)
    got = predict(plan, (1, 0, 0, 1), ends)
    assert len(got.firsts) > _CHUNK  # more than one chunk
    reads, first, last = np.zeros(23, int), {}, {}
    for j in got.steps:
        of = shard_of(ends, indices(got.sched, j))
        reads += np.bincount(of, minlength=23)
        for shard in of.tolist():
            first.setdefault(shard, j)
            last[shard] = j
    assert got.reads.tolist() == reads.tolist()
    assert {s: int(got.first_step[s]) for s in first} == first
    assert {s: int(got.last_step[s]) for s in last} == last
