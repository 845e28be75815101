"""Range reads of remote shards: the same batches as whole-file downloads, fewer bytes.

Shards live on fsspec's ``memory://`` filesystem (a generic protocol: nothing
but fsspec's own interface) or on a local HTTP server honouring ``Range:``
(``tests/support/http_server.py``). Blocks are tiny (a few samples each) so a shard
has many of them.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import (
    ParquetReader,
    RemoteCache,
    ResumableDataLoader,
    ShardedDataset,
    ShardError,
    TokenReader,
    write_shards,
)

pytest.importorskip("fsspec")

SEQ = 4
SIZES = (12, 7, 16, 9, 12, 8)  # 64 samples, uneven shards
READER = TokenReader(seq_len=SEQ, dtype=np.uint16)
TARGETS = TokenReader(seq_len=SEQ, targets=True, dtype=np.uint16)


def shard_arrays(sizes: tuple[int, ...] = SIZES) -> list[np.ndarray]:
    """Random tokens: a byte out of place changes a batch."""
    rng = np.random.default_rng(7)
    return [rng.integers(0, 60_000, size=n * SEQ + 1, dtype=np.uint16) for n in sizes]


@pytest.fixture
def folder() -> Any:
    url = f"memory://ranges-{uuid.uuid4().hex[:8]}"
    yield url
    import fsspec

    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def batches_of(
    ds: ShardedDataset, num_workers: int, epochs: int = 2, **plan: Any
) -> list[torch.Tensor]:
    sampler = ds.batch_sampler(4, seed=3, window=4, **plan)
    loader = ResumableDataLoader(ds, batch_sampler=sampler, num_workers=num_workers)
    out: list[torch.Tensor] = []
    for _ in range(epochs):
        out += list(loader)
    return out


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        for x, y in zip(a, b, strict=True)
    )


def cache(tmp_path: Path, name: str, **kwargs: Any) -> RemoteCache:
    return RemoteCache(cache_dir=tmp_path / name, **kwargs)


def test_a_remote_raw_shard_that_is_a_npy_file_is_refused_with_range_reads(
    folder: str, tmp_path: Path
) -> None:
    # Measured before (review 151): range reads took its .npy header for tokens, sample 0
    # [20115, 19797, 22864, 1]; the whole-file path refused it.
    import io

    import fsspec

    buf = io.BytesIO()
    np.save(buf, np.arange(1000, 1400, dtype=np.uint16))
    fsspec.filesystem("memory").pipe(f"{folder}/a.bin", buf.getvalue())
    with pytest.raises(ShardError, match=r"raw token shard .*a\.bin' is a \.npy array"):
        ShardedDataset(folder, READER, remote=cache(tmp_path, "r", range_reads=True))


# ------------------------------------------------------------------ exactness
@pytest.mark.parametrize("suffix", [".npy", ".bin"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mix_shards", [1, 3])
def test_range_reads_give_the_batches_of_whole_files_over_epochs_and_a_resume(
    folder: str, tmp_path: Path, suffix: str, num_workers: int, mix_shards: int
) -> None:
    write_shards(folder, shard_arrays(), TARGETS, suffix=suffix)
    whole = ShardedDataset(folder, TARGETS, remote=cache(tmp_path, "whole"))
    ranged = ShardedDataset(
        folder, TARGETS, remote=cache(tmp_path, "ranged", range_reads=True, block_bytes=24)
    )
    local = ShardedDataset(write_shards(tmp_path / "local", shard_arrays(), TARGETS), TARGETS)
    reference = batches_of(local, 0, mix_shards=mix_shards)
    assert same(batches_of(whole, num_workers, mix_shards=mix_shards), reference)
    assert same(batches_of(ranged, num_workers, mix_shards=mix_shards), reference)
    info = ranged.describe()["remote"]
    assert info["fetched"] == 0 and info["blocks_fetched"] > 0, info  # no shard fetched whole
    assert info["unplanned"] == 0 and info["over_budget"] == 0, info

    # The resume oracle: 5 batches, then a fresh dataset and cold cache resumes.
    sampler = ranged.batch_sampler(4, seed=3, window=4, mix_shards=mix_shards)
    first = ResumableDataLoader(ranged, batch_sampler=sampler, num_workers=num_workers)
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    again = ShardedDataset(
        folder, TARGETS, remote=cache(tmp_path, "resumed", range_reads=True, block_bytes=24)
    )
    sampler = again.batch_sampler(4, seed=3, window=4, mix_shards=mix_shards)
    resumed = ResumableDataLoader(again, batch_sampler=sampler, num_workers=num_workers)
    resumed.load_state_dict(state)
    tail = list(resumed) + list(resumed)
    assert same(head + tail, reference)


def test_range_reads_keep_out_dtype_and_single_reads(folder: str, tmp_path: Path) -> None:
    reader = TokenReader(seq_len=SEQ, dtype=np.uint16, out_dtype=None)
    write_shards(folder, shard_arrays(), reader)
    ranged = ShardedDataset(folder, reader, remote=cache(tmp_path, "r", range_reads=True))
    local = ShardedDataset(write_shards(tmp_path / "local", shard_arrays(), reader), reader)
    for i in (0, 11, 12, 40, 63):
        a, b = ranged[i], local[i]
        assert a.dtype == b.dtype == torch.uint16 and torch.equal(a, b)
    got, want = ranged.__getitems__([63, 0, 12]), local.__getitems__([63, 0, 12])
    assert len(got) == len(want) == 3
    pairs = zip(got, want, strict=True)
    assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b)) for a, b in pairs)


# ------------------------------------------------------------ fewer bytes
def resumed_half(folder: str, root: Path, **kwargs: Any) -> tuple[list[torch.Tensor], dict]:
    ds = ShardedDataset(folder, READER, remote=cache(root, "a", **kwargs))
    sampler = ds.batch_sampler(4, seed=3, window=4, mix_shards=1)
    first = ResumableDataLoader(ds, batch_sampler=sampler, num_workers=0)
    it = iter(first)
    for _ in range(len(first) // 2 + 1):  # past the middle of a shard
        next(it)
    state = first.state_dict()
    del it
    again = ShardedDataset(folder, READER, remote=cache(root, "b", **kwargs))
    sampler = again.batch_sampler(4, seed=3, window=4, mix_shards=1)
    resumed = ResumableDataLoader(again, batch_sampler=sampler, num_workers=0)
    resumed.load_state_dict(state)
    return list(resumed), again.describe()["remote"]


def test_auto_range_reads_a_resumed_epoch_fetches_fewer_bytes(folder: str, tmp_path: Path) -> None:
    big = tuple(n * 8 for n in SIZES)  # blocks of 64 bytes: 8 samples each
    write_shards(folder, [np.arange(n * SEQ, dtype=np.uint16) for n in big], READER)
    whole_batches, whole = resumed_half(folder, tmp_path / "whole")
    auto_batches, auto = resumed_half(folder, tmp_path / "auto", range_reads="auto", block_bytes=64)
    assert same(auto_batches, whole_batches)
    whole_bytes = whole["fetched_bytes"] + whole["range_bytes"]
    auto_bytes = auto["fetched_bytes"] + auto["range_bytes"]
    assert auto["range_bytes"] > 0 and auto_bytes < whole_bytes, (auto, whole)
    # Shards the rest of the epoch reads whole are still fetched whole.
    assert auto["fetched"] >= 1, auto


def test_auto_range_reads_a_shard_larger_than_the_budget_within_it(
    folder: str, tmp_path: Path
) -> None:
    sizes = (200, 150)  # shards of 1,728 and 1,328 bytes; the cache holds 1,000
    write_shards(folder, shard_arrays(sizes), READER)
    local = ShardedDataset(write_shards(tmp_path / "local", shard_arrays(sizes), READER), READER)
    ds = ShardedDataset(
        folder,
        READER,
        remote=cache(tmp_path, "c", range_reads="auto", max_bytes=1000, block_bytes=64, prefetch=2),
    )
    assert same(batches_of(ds, 0), batches_of(local, 0))
    info = ds.describe()["remote"]
    assert info["fetched"] == 0 and info["over_budget"] == 0, info
    assert info["evicted"] > 0 and info["cached_bytes"] <= 1000, info


def test_hashed_and_compressed_shards_are_fetched_whole(folder: str, tmp_path: Path) -> None:
    pytest.importorskip("zstandard")
    write_shards(folder, shard_arrays(), READER, hash="sha256")
    ds = ShardedDataset(folder, READER, remote=cache(tmp_path, "h", range_reads=True))
    batches_of(ds, 0, epochs=1)
    info = ds.describe()["remote"]
    assert info["fetched"] == len(SIZES) and info["blocks_fetched"] == 0, info

    zst = folder + "-zst"
    write_shards(zst, shard_arrays(), READER, compression="zstd")
    ds = ShardedDataset(zst, READER, remote=cache(tmp_path, "z", range_reads=True))
    batches_of(ds, 0, epochs=1)
    info = ds.describe()["remote"]
    assert info["fetched"] == len(SIZES) and info["blocks_fetched"] == 0, info


def test_document_shards_are_fetched_whole(folder: str, tmp_path: Path) -> None:
    reader = TokenReader(eos=0, dtype=np.uint16)
    write_shards(folder, [np.array([1, 2, 0, 3, 0], dtype=np.uint16)] * 2, reader)
    ds = ShardedDataset(folder, reader, remote=cache(tmp_path, "d", range_reads=True))
    assert ds[3].tolist() == [3, 0]
    assert ds.describe()["remote"]["blocks_fetched"] == 0


# ------------------------------------------------------------------ parquet
def test_parquet_rows_are_counted_from_footers_without_downloads(
    folder: str, tmp_path: Path
) -> None:
    pytest.importorskip("pyarrow")
    import fsspec

    reader = ParquetReader(row_group_size=5)
    tables = [{"x": list(range(i * 100, i * 100 + n)), "s": ["a" * 50] * n} for i, n in
              enumerate((30, 12, 21))]  # fmt: skip
    local = write_shards(tmp_path / "pq", tables, reader)
    fs = fsspec.filesystem("memory")
    for path in local:  # upload the files alone: no index, so the dataset counts them
        fs.pipe_file(f"{folder}/{path.name}", path.read_bytes())
    ds = ShardedDataset(folder, reader, remote=cache(tmp_path, "p"))
    assert ds.sizes == (30, 12, 21)
    info = ds.describe()["remote"]
    # Each footer read twice: to count its rows, and for its schema (every file's column
    # types checked when the dataset is built).
    assert info["fetched"] == 0 and info["footers"] == 6, info
    assert ds[31]["x"] == 101  # reading still fetches the file
    # With the index written, building the dataset reads each footer once, for its schema.
    again = ShardedDataset(folder, reader, remote=cache(tmp_path, "p2")).describe()["remote"]
    assert again["fetched"] == 0 and again["footers"] == 3, again
    assert again["range_bytes"] <= again["shard_bytes"]


# ------------------------------------------------------------------ the API
def test_remote_cache_range_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"range_reads must be True, False or 'auto', got 'yes'"):
        RemoteCache(range_reads="yes")
    with pytest.raises(ValueError, match=r"range_reads must be .* got 1"):
        RemoteCache(range_reads=1)  # type: ignore[arg-type]
    with pytest.raises((ValueError, TypeError), match="block_bytes"):
        RemoteCache(block_bytes=0)
    assert RemoteCache(range_reads="auto", block_bytes=1 << 20).range_reads == "auto"


def test_a_dtype_header_changed_after_listing_is_refused(folder: str, tmp_path: Path) -> None:
    # The whole-file path downloads the .lkdtype by its listed version; range reads took
    # whatever it said then (here int16 for uint16 tokens: the same counts, other values).
    import fsspec

    from loaderkit import ShardChangedError

    write_shards(folder, shard_arrays(), READER, suffix=".bin")
    reader = TokenReader(seq_len=SEQ, out_dtype=None)  # the dtype from the header
    ds = ShardedDataset(folder, reader, remote=cache(tmp_path, "r", range_reads=True))
    fs = fsspec.filesystem("memory")
    header = next(p for p in fs.ls(folder, detail=False) if p.endswith("00000.bin.lkdtype"))
    fs.pipe_file(header, b"<i2")
    with pytest.raises(ShardChangedError, match=r"00000\.bin\.lkdtype' changed after the dataset"):
        ds[0]


@pytest.mark.parametrize("range_reads", [True, False])
def test_a_dtype_header_changed_before_listing_is_refused_by_the_index(
    folder: str, tmp_path: Path, range_reads: bool
) -> None:
    # Measured before: a new dataset listed the rewritten header and read through the index
    # that counted the shard as uint16: token 40000 as -25536.
    import fsspec

    from loaderkit import ShardChangedError

    write_shards(folder, [np.arange(40_000, 40_016, dtype=np.uint16)], READER, suffix=".bin")
    reader = TokenReader(seq_len=SEQ, out_dtype=None)
    remote = cache(tmp_path, "r", range_reads=range_reads)
    assert ShardedDataset(folder, reader, remote=remote)[0].tolist() == [*range(40_000, 40_004)]
    fs = fsspec.filesystem("memory")
    header = next(p for p in fs.ls(folder, detail=False) if p.endswith(".bin.lkdtype"))
    fs.pipe_file(header, b"<i2")
    ds = ShardedDataset(folder, reader, remote=cache(tmp_path, "r2", range_reads=range_reads))
    with pytest.raises(ShardChangedError, match=r"reads as <i2 tokens, listed as <u2"):
        ds[0]


def test_a_dtype_header_rewritten_before_a_stream_resumes_is_refused(
    folder: str, tmp_path: Path
) -> None:
    # Measured before: the resumed stream listed the new "<i2" header and went on at the
    # cursor's offsets in other tokens (40004 read as -25532).
    import fsspec

    from loaderkit import StateMismatchError, StreamingShardedDataset

    fs = fsspec.filesystem("memory")
    for k in range(2):
        tokens = np.arange(40_000 + 100 * k, 40_016 + 100 * k, dtype=np.uint16)
        fs.pipe_file(f"{folder}/s{k}.bin", tokens.tobytes())
        fs.pipe_file(f"{folder}/s{k}.bin.lkdtype", b"<u2")
    reader = TokenReader(seq_len=SEQ, out_dtype=None)

    def make(name: str) -> ResumableDataLoader:
        remote = cache(tmp_path, name)
        ds = StreamingShardedDataset(folder, reader, shuffle_shards=False, remote=remote)
        return ResumableDataLoader(ds, batch_size=2)

    dl = make("a")
    assert next(iter(dl))[:, 0].tolist() == [40_000, 40_100]
    state = dl.state_dict()
    make("b").load_state_dict(state)  # the same headers: resumed
    for k in range(2):
        fs.pipe_file(f"{folder}/s{k}.bin.lkdtype", b"<i2")
    with pytest.raises(StateMismatchError, match=r"field 'dtype_headers_crc32' differs"):
        make("c").load_state_dict(state)


def test_a_stream_at_a_url_keeps_the_dtype_write_shards_pinned(folder: str, tmp_path: Path) -> None:
    # Review 316: a new stream over the folder read the rewritten "<i2" header (a new
    # version, so nothing told it apart) where ShardedDataset refused it by the index's pin.
    import fsspec

    from loaderkit import ShardChangedError, StreamingShardedDataset

    write_shards(folder, [np.arange(40_000, 40_016, dtype=np.uint16)], READER, suffix=".bin")
    fs = fsspec.filesystem("memory")
    header = next(p for p in fs.ls(folder, detail=False) if p.endswith(".bin.lkdtype"))
    fs.pipe_file(header, b"<i2")
    reader = TokenReader(seq_len=SEQ, out_dtype=None)
    ds = StreamingShardedDataset(folder, reader, remote=cache(tmp_path, "s"))
    with pytest.raises(ShardChangedError, match=r"reads as <i2 tokens, listed as <u2"):
        list(ResumableDataLoader(ds, batch_size=2))


def test_remote_shards_count_alike_after_pickling(folder: str, tmp_path: Path) -> None:
    # A copy sent to another process had lost the folder's index files (AttributeError).
    import pickle

    from loaderkit.data.remote import remote_source

    write_shards(folder, shard_arrays(), READER)
    shards = remote_source(folder, (".npy",), cache(tmp_path, "r"), "test")
    assert shards is not None
    copy = pickle.loads(pickle.dumps(shards))
    assert copy.count(READER, None) == shards.count(READER, None) == list(SIZES)


def test_a_transient_error_checking_a_dtype_header_is_retried(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check ran outside the retried call: one reset dropped the shard under "skip".
    from fsspec.implementations.memory import MemoryFileSystem

    write_shards(folder, shard_arrays(), READER, suffix=".bin")
    info, failed = MemoryFileSystem.info, []

    def flaky(self: Any, path: str, **kwargs: Any) -> Any:
        if str(path).endswith("00000.bin.lkdtype") and not failed:
            failed.append(path)
            raise ConnectionResetError("transient reset")
        return info(self, path, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "info", flaky)
    remote = cache(tmp_path, "r", range_reads=True, backoff_s=0)
    ds = ShardedDataset(folder, TokenReader(seq_len=SEQ, out_dtype=None), remote=remote,
                        on_error="skip")  # fmt: skip
    rows = {tuple(r.tolist()) for batch in ResumableDataLoader(ds, batch_size=4) for r in batch}
    assert failed and len(rows) == len(ds) == sum(SIZES)
