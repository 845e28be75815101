"""Shards: hidden and own files are never shards, raw dtypes are recorded, files that change
under a live mapping are detected, and concurrent index builders agree.

Measured before: a macOS ``._shard.bin`` AppleDouble file next to the shards
turned 147 samples into 403; a reader with suffix ``.json`` picked up
loaderkit's own ``.loaderkit-index-*.json`` on the second listing (10 samples
became 11); a ``.bin`` read with the wrong dtype gave garbage tokens; a shard
truncated while mapped read as zeros or killed the process with SIGBUS (in a
worker: "DataLoader worker exited unexpectedly"); two threads building one
index collided on a temp file named by the pid alone (ShardError).
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import (
    JsonlReader,
    ResumableDataLoader,
    ShardChangedError,
    ShardedDataset,
    ShardError,
    ShardReadError,
    StreamingShardedDataset,
    TokenReader,
    WorkerError,
    write_shards,
)
from loaderkit._atomic import atomic_write, temp_path
from loaderkit.data._open import never_a_shard
from tests.reliability._cases import ids

SEQ = 4


def token_folder(root: Path, sizes: list[int], suffix: str = ".bin") -> list[Path]:
    """Shards whose tokens are all the global sample id (``SEQ`` tokens per sample)."""
    arrays, first = [], 0
    for n in sizes:
        arrays.append(np.repeat(np.arange(first, first + n), SEQ))
        first += n
    return write_shards(root, arrays, TokenReader(seq_len=SEQ, dtype=np.uint16), suffix=suffix)


def test_appledouble_files_are_not_listed(tmp_path: Path) -> None:
    token_folder(tmp_path, [50, 60, 37])  # 147 samples
    # What macOS writes next to every file it copied to a non-HFS volume: 4 KB of metadata
    # (read as tokens, 4096 bytes / 2 / 4 = 512 more "samples" of garbage).
    for name in ("shard-00000.bin", "shard-00001.bin"):
        (tmp_path / f"._{name}").write_bytes(os.urandom(4096))
    (tmp_path / ".hidden.bin").write_bytes(os.urandom(64))
    reader = TokenReader(seq_len=SEQ, dtype=np.uint16)
    ds = ShardedDataset(tmp_path, reader)
    assert [p.name for p in ds.shards] == [f"shard-0000{i}.bin" for i in range(3)]
    assert len(ds) == 147
    loader = ResumableDataLoader(ds, batch_sampler=ds.batch_sampler(8, seed=0))
    assert sorted({int(s[0]) for batch in loader for s in batch}) == list(range(147))


class JsonDocs:
    """A user's reader of ``.json`` files (one JSON list of samples per file)."""

    suffixes = (".json",)

    def spec(self) -> dict[str, Any]:
        return {"kind": "json-docs"}

    def count(self, path: Path) -> int:
        return len(json.loads(Path(path).read_text()))

    def open(self, path: Path) -> Any:
        class Docs(list):  # type: ignore[type-arg]
            def read(self, i: int) -> Any:
                return self[i]

        return Docs(json.loads(Path(path).read_text()))


def test_own_index_is_not_listed_by_a_json_reader(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(list(range(6))))
    (tmp_path / "b.json").write_text(json.dumps(list(range(6, 10))))
    first = ShardedDataset(tmp_path, JsonDocs())
    assert any(p.name.startswith(".loaderkit-index-") for p in tmp_path.iterdir())
    second = ShardedDataset(tmp_path, JsonDocs())  # was 11 samples: the index was a shard
    assert len(first) == len(second) == 10
    assert [p.name for p in second.shards] == ["a.json", "b.json"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_shard_compressed_in_a_form_no_reader_opens_is_refused(
    tmp_path: Path, stream: bool
) -> None:
    """A folder of a.jsonl and b.jsonl.gz listed only a.jsonl: half the corpus, no word."""
    from loaderkit import JsonlReader, StreamingShardedDataset

    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(b'{"x": 2}\n'))
    make = StreamingShardedDataset if stream else ShardedDataset
    with pytest.raises(ValueError, match=r"'b\.jsonl\.gz', compressed in a form no reader"):
        make(tmp_path, JsonlReader())
    (tmp_path / "b.jsonl.gz").rename(tmp_path / "b.jsonl.gz.bak")  # not a shard's name
    assert len(ShardedDataset(tmp_path, JsonlReader())) == 1


def test_two_lists_with_one_first_shard_and_same_names_keep_their_own_index(
    tmp_path: Path,
) -> None:
    # The default index (beside the first shard) was named by file names only: the second
    # list was refused as "not in the shard index" of the first.
    reader = TokenReader(seq_len=4)
    for folder, n in (("a", 8), ("b", 16), ("c", 32)):
        (tmp_path / folder).mkdir()
        np.save(tmp_path / folder / ("x.npy" if folder == "a" else "y.npy"), np.arange(n))
    first = [tmp_path / "a" / "x.npy", tmp_path / "b" / "y.npy"]
    assert len(ShardedDataset(first, reader)) == 6
    assert len(ShardedDataset([first[0], tmp_path / "c" / "y.npy"], reader)) == 10
    assert len(ShardedDataset(first, reader)) == 6


@pytest.mark.parametrize("stream", [False, True])
def test_shards_in_a_subfolder_are_refused(tmp_path: Path, stream: bool) -> None:
    """A Hive-style folder (a.jsonl, lang=de/b.jsonl) listed only a.jsonl: no word."""
    from loaderkit import JsonlReader, StreamingShardedDataset

    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    (tmp_path / "lang=de" / "deep").mkdir(parents=True)
    (tmp_path / "lang=de" / "deep" / "b.jsonl").write_text('{"x": 2}\n')
    make = StreamingShardedDataset if stream else ShardedDataset
    with pytest.raises(ValueError, match=r"the shard 'lang=de/deep/b\.jsonl' in a subfolder"):
        make(tmp_path, JsonlReader())
    (tmp_path / "lang=de" / "deep" / "b.jsonl").rename(tmp_path / "lang=de" / "deep" / "b.txt")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "c.jsonl").write_text('{"x": 3}\n')
    assert len(ShardedDataset(tmp_path, JsonlReader())) == 1  # other files, hidden folders


@pytest.mark.parametrize("listing", ["folder", "list", "stream"])
def test_a_shard_beside_its_zstd_form_is_refused(
    tmp_path: Path, listing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`zstd a.jsonl` keeps a.jsonl: both were listed and a's samples read twice."""
    import zstandard

    from loaderkit import JsonlReader, StreamingShardedDataset

    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    (tmp_path / "b.jsonl").write_text('{"x": 2}\n')
    raw = (tmp_path / "a.jsonl").read_bytes()
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    shards: Any = tmp_path
    if listing == "list":
        shards = [tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "a.jsonl.zst"]
    make = StreamingShardedDataset if listing == "stream" else ShardedDataset
    with pytest.raises(ValueError, match=r"a\.jsonl\.zst' are one file \(plain and zstd"):
        make(shards, JsonlReader())
    if listing == "list":  # the same file spelled otherwise
        (tmp_path / "sub").mkdir()
        monkeypatch.chdir(tmp_path)
        with pytest.raises(ValueError, match=r"jsonl' and '[^']*sub/\.\./a\.jsonl\.zst' are one"):
            make(["a.jsonl", "b.jsonl", "sub/../a.jsonl.zst"], JsonlReader())
    (tmp_path / "a.jsonl").unlink()
    shards = tmp_path if listing != "list" else shards[1:]
    assert len(make(shards, JsonlReader()).shards) == 2


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("._shard.bin", "AppleDouble"),
        (".loaderkit-index-ab12.json", "shard index"),
        (".DS_Store", "hidden"),
        (".shard.bin.123-456-abcdef.tmp", "hidden"),
        ("shard.jsonl.lkoffsets", "sidecar"),
        ("shard.jsonl.eos2.lkoffsets", "sidecar"),
        ("shard.bin.lkdtype", "sidecar"),
        ("shard.bin", None),
    ],
)
def test_never_a_shard(name: str, why: str | None) -> None:
    got = never_a_shard(name)
    assert (got is None) if why is None else (got is not None and why in got)


def test_raw_shards_record_their_dtype_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    tokens = np.arange(40_000, 40_064)  # needs 16 bits
    path = TokenReader(seq_len=8, dtype=np.uint16).write(tmp_path / "a.bin", tokens)
    assert (tmp_path / "a.bin.lkdtype").read_text() == "<u2"
    # No dtype given: the header says it (before: an error, or garbage with a guess).
    assert TokenReader(seq_len=8).open(path).read(1).tolist() == list(range(40_008, 40_016))
    with pytest.raises(ShardError, match=r"a.bin' holds uint16 tokens.*dtype=uint32"):
        TokenReader(seq_len=8, dtype=np.uint32).open(path)
    # A header-less .bin (e.g. from nanoGPT's prepare.py) still needs the dtype stated.
    np.arange(64, dtype=np.uint16).tofile(tmp_path / "b.bin")
    with pytest.raises(ValueError, match=r"b.bin' has no header.*pass dtype="):
        TokenReader(seq_len=8).open(tmp_path / "b.bin")
    assert TokenReader(seq_len=8, dtype=np.uint16).open(tmp_path / "b.bin").read(0).tolist() == [
        *range(8)
    ]


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_dtype_header_rewritten_after_indexing_is_refused(
    tmp_path: Path, compression: str | None
) -> None:
    # Measured before: "<u2" rewritten as "<i2" (same size, the .bin untouched) read token
    # 40000 as -25536 with dtype=None, through the index that counted it as uint16.
    if compression:
        pytest.importorskip("zstandard")
    tokens = [np.arange(40_000, 40_016, dtype=np.uint16)]
    (path,) = write_shards(tmp_path / "d", tokens, TokenReader(seq_len=4, dtype=np.uint16),
                           suffix=".bin", compression=compression)  # fmt: skip
    reader = TokenReader(seq_len=4, out_dtype=None)
    assert ShardedDataset(tmp_path / "d", reader)[0].tolist() == [40_000, 40_001, 40_002, 40_003]
    path.with_name(path.name + ".lkdtype").write_text("<i2")
    ds = ShardedDataset(tmp_path / "d", reader)
    with pytest.raises(ShardChangedError, match=r"reads as <i2 tokens, listed as <u2.*lkdtype"):
        ds[0]
    stream = StreamingShardedDataset(tmp_path / "d", reader)  # review 305: streams read it
    with pytest.raises(ShardChangedError, match=r"reads as <i2 tokens, listed as <u2"):
        list(ResumableDataLoader(stream, batch_size=2))
    # Another reader indexed after the rewrite: write_shards' pin still wins (review 308).
    later = ShardedDataset(tmp_path / "d", TokenReader(seq_len=2, out_dtype=None))
    with pytest.raises(ShardChangedError, match=r"reads as <i2 tokens, listed as <u2"):
        later[0]
    # The header gone and another dtype= given (hunter 299): write_shards' pin holds for it.
    path.with_name(path.name + ".lkdtype").unlink()
    other = ShardedDataset(tmp_path / "d", TokenReader(seq_len=4, dtype=np.uint8))
    with pytest.raises(ShardChangedError, match=r"reads as \|u1 tokens, listed as <u2"):
        other[0]


# ------------------------------------------------------- files changed under a live map
def open_npy(tmp_path: Path, n: int = 4096) -> tuple[Path, Any]:
    path = tmp_path / "t.npy"
    np.save(path, np.arange(n, dtype=np.int64))
    handle = TokenReader(seq_len=64).open(path)
    assert handle.read(0).tolist() == list(range(64))
    return path, handle


def test_a_shard_truncated_inside_its_last_page_is_an_error_not_zeros(tmp_path: Path) -> None:
    path, handle = open_npy(tmp_path)
    os.truncate(path, path.stat().st_size - 100)  # the map still covers the old size
    with pytest.raises(ShardError, match=r"t.npy' changed while it was memory-mapped"):
        handle.read(len(handle) - 1)  # was: its last 12 tokens read as 0


def test_a_shard_truncated_far_is_an_error_not_sigbus(tmp_path: Path) -> None:
    path, handle = open_npy(tmp_path)
    os.truncate(path, 256)
    with pytest.raises(ShardError, match=r"it is 256 bytes now, 32896 when it was mapped"):
        handle.read_batch(np.arange(len(handle)))  # was: SIGBUS, the process died


def test_jsonl_and_document_shards_are_guarded_too(tmp_path: Path) -> None:
    (path,) = write_shards(tmp_path / "j", [[{"i": i} for i in range(500)]], JsonlReader())
    handle = JsonlReader().open(path)
    os.truncate(path, 100)
    with pytest.raises(ShardError, match=r"shard-00000\.jsonl' changed while"):
        handle.read(400)
    reader = TokenReader(eos=0, dtype=np.uint16)
    (doc,) = write_shards(tmp_path / "d", [np.tile([5, 6, 0], 3000)], reader)
    reader.count(doc)
    docs = reader.open(doc)
    os.truncate(doc.with_name(doc.name + ".eos0.lkoffsets"), 64)  # the sidecar, this time
    with pytest.raises(ShardError, match=r"eos0.lkoffsets' changed while"):
        docs.read(2000)


@pytest.mark.parametrize("how", ["append", "truncate"])
def test_a_shard_changed_under_its_map_is_raised_under_skip_too(tmp_path: Path, how: str) -> None:
    # 0ad19c7: a plain ShardError, so on_error="skip" replaced samples 8..19 by sample 20.
    reader = TokenReader(seq_len=1, dtype=np.uint16)
    data = [np.arange(0, 20), np.arange(20, 40)]
    paths = write_shards(tmp_path, data, reader, suffix=".bin", progress=False)
    ds = ShardedDataset(tmp_path, reader, on_error="skip")
    it = iter(ResumableDataLoader(ds, batch_sampler=ds.batch_sampler(4, seed=0, shuffle=False)))
    assert [int(x) for _ in range(2) for x in next(it)[:, 0]] == list(range(8))
    with open(paths[0], "ab" if how == "append" else "r+b") as f:
        f.write(b"\0" * 8) if how == "append" else f.truncate(30)
    with pytest.raises(ShardChangedError, match=r"shard-00000.bin' changed while it was memory"):
        next(it)
    assert ds.skipped == 0


def test_a_truncated_shard_in_a_worker_is_a_shard_error_naming_it(tmp_path: Path) -> None:
    paths = token_folder(tmp_path, [400, 400], suffix=".npy")
    ds = ShardedDataset(paths, TokenReader(seq_len=SEQ))
    loader = ResumableDataLoader(
        ds, batch_sampler=ds.batch_sampler(8, seed=0, shuffle=False), num_workers=1
    )
    it = iter(loader)
    next(it)  # the worker (forked after this process opened nothing) maps shard 0 now
    os.truncate(paths[0], 256)
    with pytest.raises(
        ShardReadError, match=r"shard-00000.npy' changed while it was memory-mapped"
    ) as info:
        list(it)  # was: "DataLoader worker (pid N) is killed by signal: Bus error"
    # Both a ShardError (the file) and a WorkerError (the batch's sample indices).
    assert isinstance(info.value, ShardError) and isinstance(info.value, WorkerError)
    # The first batch the worker read after the truncation (it prefetches up to 2 ahead).
    assert info.value.index in [list(range(8 * b, 8 * b + 8)) for b in (1, 2, 3)]
    # Its own fix only: the loader's "fix the dataset's batch read" contradicted it.
    assert "fix the dataset" not in str(info.value)


def test_a_shard_changed_after_indexing_is_refused_before_it_is_mapped(tmp_path: Path) -> None:
    paths = token_folder(tmp_path, [10, 10])
    reader = TokenReader(seq_len=SEQ, dtype=np.uint16)
    ds = ShardedDataset(paths, reader)
    reader.write(paths[1], np.zeros(40, dtype=np.uint16))  # same size, new mtime
    os.utime(paths[1], ns=(1, 1))
    with pytest.raises(ShardError, match=r"shard-00001.bin' changed after it was indexed"):
        ds[15]
    # Hunter 383: after a rewrite by write_shards the index on disk is the new one; the
    # message only said to delete it (the good index), not to build the dataset again.
    with pytest.raises(ShardError, match=r"since this dataset was built, build it .* again; else"):
        ds[15]


# ------------------------------------------------------------------ temp files
def test_temp_names_are_unique_hidden_and_never_shards(tmp_path: Path) -> None:
    target = tmp_path / "index.json"
    names = {temp_path(target).name for _ in range(1000)}
    assert len(names) == 1000
    assert all(n.startswith(".index.json.") and never_a_shard(n) for n in names)


def test_atomic_write_exclusive_keeps_the_first(tmp_path: Path) -> None:
    target = tmp_path / "x"
    assert atomic_write(target, lambda f: f.write(b"first"), exclusive=True)
    assert not atomic_write(target, lambda f: f.write(b"second"), exclusive=True)
    assert target.read_bytes() == b"first"
    assert atomic_write(target, lambda f: f.write(b"third"))
    assert target.read_bytes() == b"third"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]  # no temp file left


def build(root: str, out: Any) -> None:
    try:
        out.put(ShardedDataset(root, JsonlReader()).sizes)
    except Exception as exc:  # reported to the parent
        out.put(f"{type(exc).__name__}: {exc}")


def test_threads_building_one_index_agree(tmp_path: Path) -> None:
    write_shards(tmp_path, [[{"i": j} for j in range(n)] for n in (3, 5, 8)], JsonlReader())
    for p in tmp_path.iterdir():
        if p.name.startswith(".loaderkit-index-") or p.name.endswith(".lkoffsets"):
            p.unlink()  # every builder counts afresh, at once
    results: list[Any] = []
    start = threading.Barrier(8)

    def go() -> None:
        start.wait()
        try:
            results.append(ShardedDataset(tmp_path, JsonlReader()).sizes)
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [(3, 5, 8)] * 8
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_processes_building_one_index_agree(tmp_path: Path) -> None:
    write_shards(tmp_path, [[{"i": j} for j in range(n)] for n in (4, 6)], JsonlReader())
    for p in tmp_path.iterdir():
        if p.name.startswith(".loaderkit-index-") or p.name.endswith(".lkoffsets"):
            p.unlink()
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=build, args=(str(tmp_path), out)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert got == [(4, 6)] * 4
    index = [p for p in tmp_path.iterdir() if p.name.startswith(".loaderkit-index-")]
    assert len(index) == 1


def test_ids_helper_sanity() -> None:
    assert ids([np.array([1, 2]), np.array([[3], [4]])]) == [1, 2, 3, 4]


def test_a_truncated_shard_is_named_in_a_batch_across_shards(tmp_path: Path) -> None:
    # Mixed plans batch across shards through a row-copy path: it must check the
    # mapping as the one-shard read does (it returned zero rows instead).
    import os

    import numpy as np

    from loaderkit import ShardedDataset, ShardError, TokenReader, write_shards

    reader = TokenReader(seq_len=4, dtype=np.uint16)
    docs = [np.arange(1, 4097, dtype=np.uint16) + i * 5000 for i in range(3)]
    ds = ShardedDataset(write_shards(tmp_path, docs, reader), reader)
    assert ds.get_batch([0, 1024, 2048]).shape == (3, 4)
    victim = ds.shards[1]
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) - 8)
    with pytest.raises(ShardError, match=r"shard-00001.* changed while it was memory-mapped"):
        ds.get_batch([0, 2047, 2047])


def test_cached_lengths_are_not_shared_by_datasets_of_equal_counts(tmp_path: Path) -> None:
    from loaderkit import JsonlReader, ShardedDataset, write_shards

    def lengths(name: str, width: int) -> list[int]:
        docs = [[{"t": [0] * width}] * 2, [{"t": [0] * width}]]
        ds = ShardedDataset(write_shards(tmp_path / name, docs, JsonlReader()), JsonlReader())
        return ds.lengths(lambda s: len(s["t"]), cache=tmp_path / "len.npy").tolist()

    assert lengths("a", 3) == [3, 3, 3]
    with pytest.warns(UserWarning, match="recomputing the lengths"):
        assert lengths("b", 6) == [6, 6, 6]
