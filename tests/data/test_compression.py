"""zstd-compressed shards: written by write_shards, read by every reader with no flag.

A compressed shard is decoded once per machine into the cache and then read
as a plain one, so the samples, the plan, resume and streams are those of the
plain shards (each test compares against them).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import (
    IterableReader,
    JsonlReader,
    MissingDependencyError,
    ResumableDataLoader,
    ShardChangedError,
    ShardedDataset,
    ShardError,
    StreamingShardedDataset,
    TokenReader,
    write_shards,
)

pytest.importorskip("zstandard")

SEQ = 4
SIZES = (12, 7, 16, 9, 6)  # 50 samples


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Decoded copies go into this test's own cache directory (workers inherit it)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("LOADERKIT_CACHE_DIR", str(root))
    return root


def id_shards(sizes: tuple[int, ...] = SIZES) -> list[np.ndarray]:
    """Every token of global sample ``i`` is ``i``."""
    out, first = [], 0
    for n in sizes:
        out.append(np.repeat(np.arange(first, first + n), SEQ).astype(np.uint16))
        first += n
    return out


def docs(rng: np.random.Generator) -> list[np.ndarray]:
    return [np.concatenate([rng.integers(1, 9, n), [0]]) for n in rng.integers(1, 20, 30)]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return bool(a == b)


KINDS: dict[str, tuple[Any, str, Any]] = {
    # name: (reader, suffix, shard data)
    "tokens-npy": (TokenReader(seq_len=SEQ), ".npy", lambda rng: id_shards()),
    "tokens-bin": (TokenReader(seq_len=SEQ, targets=True), ".bin", lambda rng: id_shards()),
    "documents": (
        TokenReader(eos=0, dtype=np.uint16),
        ".npy",
        lambda rng: [np.concatenate(docs(rng)) for _ in range(4)],
    ),
    "jsonl": (
        JsonlReader(),
        ".jsonl",
        lambda rng: [[{"i": i, "t": "x" * (i % 7)} for i in range(j, j + 40)] for j in (0, 40)],
    ),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_reader_reads_compressed_shards_as_the_plain_ones(tmp_path: Path, kind: str) -> None:
    reader, suffix, make = KINDS[kind]
    data = make(np.random.default_rng(0))
    plain = ShardedDataset(write_shards(tmp_path / "plain", data, reader, suffix=suffix), reader)
    paths = write_shards(tmp_path / "zst", data, reader, suffix=suffix, compression="zstd", level=5)
    assert [p.name for p in paths] == [f"shard-{i:05d}{suffix}.zst" for i in range(len(data))]
    # A directory listing finds them (no flag), the index says they are compressed.
    packed = ShardedDataset(tmp_path / "zst", reader)
    assert packed.sizes == plain.sizes
    assert packed.entries is not None and {e.compression for e in packed.entries} == {"zstd"}
    for i in range(len(plain)):
        assert same(packed[i], plain[i]), (kind, i)
    batch = list(range(len(plain)))[::-3]
    got, want = packed.__getitems__(batch), plain.__getitems__(batch)
    assert all(same(a, b) for a, b in zip(got, want, strict=True))
    assert len(got) == len(want)
    # Decoded once, into the cache: a second dataset decodes nothing.
    again = ShardedDataset(tmp_path / "zst", reader)
    assert same(again[len(again) - 1], plain[len(plain) - 1])


@pytest.mark.parametrize("prefix", ["shard", "shard[v2]"])
def test_compressed_shards_are_smaller_and_sidecars_follow_their_name(
    tmp_path: Path, prefix: str
) -> None:
    # A "[" in the prefix globbed as a character class: the sidecars were lost (hunter 280).
    reader = TokenReader(eos=0, dtype=np.uint16)
    data = [np.tile(np.arange(50), 200)]
    (path,) = write_shards(
        tmp_path / "d", data, reader, suffix=".bin", compression="zstd", prefix=prefix
    )
    names = sorted(p.name for p in path.parent.iterdir() if not p.name.startswith("."))
    stem = f"{prefix}-00000.bin.zst"
    assert names == [stem, f"{stem}.eos0.lkoffsets", f"{stem}.lkdtype"]
    assert path.stat().st_size * 20 < data[0].size * 2
    index = json.loads(next(path.parent.glob(".loaderkit-index-*")).read_text())
    assert index["version"] == 2
    extras = {"compression": "zstd", "raw_size": data[0].size * 2, "dtype": "<u2"}
    assert index["shards"][0][4] == extras


def test_shards_compressed_elsewhere_are_counted_and_read(tmp_path: Path) -> None:
    import zstandard

    reader = TokenReader(seq_len=SEQ)
    plain = write_shards(tmp_path / "plain", id_shards(), reader)
    out = tmp_path / "zst"
    out.mkdir()
    for p in plain:  # what `zstd shard-00000.npy` writes: no index, no sidecars
        (out / (p.name + ".zst")).write_bytes(zstandard.ZstdCompressor().compress(p.read_bytes()))
    ds = ShardedDataset(out, reader)
    assert ds.sizes == SIZES
    assert [int(ds[i][0]) for i in range(len(ds))] == list(range(50))


def test_a_raw_shard_compressed_elsewhere_keeps_its_dtype_header(tmp_path: Path) -> None:
    """`zstd a.bin && rm a.bin` leaves a.bin.lkdtype: unread, uint32 tokens were read as
    uint16 with no error."""
    import zstandard

    tokens = np.arange(70_000, 70_000 + 32, dtype=np.uint32)
    paths = write_shards(tmp_path / "d", [tokens], TokenReader(seq_len=SEQ), suffix=".bin")
    for p in paths:
        p.with_name(p.name + ".zst").write_bytes(
            zstandard.ZstdCompressor().compress(p.read_bytes())
        )
        p.unlink()
    for index in paths[0].parent.glob(".loaderkit-index-*"):  # it lists the plain names
        index.unlink()
    assert sorted(p.name for p in paths[0].parent.iterdir())[0] == "shard-00000.bin.lkdtype"
    with pytest.raises(ShardError, match=r"holds uint32 tokens \(says its \.lkdtype header\)"):
        ShardedDataset(paths[0].parent, TokenReader(seq_len=SEQ, dtype=np.uint16))[0]
    ds = ShardedDataset(paths[0].parent, TokenReader(seq_len=SEQ))
    assert torch.cat([ds[i] for i in range(len(ds))]).tolist() == tokens.tolist()
    # A header fixed later reaches the decoded copy (it was keyed by the .zst alone).
    header = paths[0].with_name(paths[0].name + ".lkdtype")
    header.write_text("<u2")
    for index in paths[0].parent.glob(".loaderkit-index-*"):
        index.unlink()
    assert len(ShardedDataset(paths[0].parent, TokenReader(seq_len=SEQ))) == 16
    header.write_text("<u4")
    os.utime(header, ns=(1, header.stat().st_mtime_ns + 10**9))
    for index in paths[0].parent.glob(".loaderkit-index-*"):
        index.unlink()
    assert len(ShardedDataset(paths[0].parent, TokenReader(seq_len=SEQ))) == 8


@pytest.mark.parametrize(("nw_before", "nw_after"), [(0, 0), (2, 2), (0, 2)])
def test_resume_oracle_over_compressed_shards(
    tmp_path: Path, nw_before: int, nw_after: int
) -> None:
    """First k batches + the run resumed at k == the uninterrupted run, k in epoch 0 and 1,
    and the same batches as from the plain shards."""
    reader = TokenReader(seq_len=SEQ)
    ds = ShardedDataset(
        write_shards(tmp_path / "d", id_shards(), reader, compression="zstd", hash="sha256"),
        reader,
    )
    plain = ShardedDataset(write_shards(tmp_path / "p", id_shards(), reader), reader)

    def loader(dataset: ShardedDataset, workers: int) -> ResumableDataLoader:
        sampler = dataset.batch_sampler(4, seed=3, window=6, mix_shards=2)
        return ResumableDataLoader(dataset, batch_sampler=sampler, num_workers=workers)

    def ids(batch: torch.Tensor) -> list[int]:
        return batch[:, 0].tolist()

    full_run = loader(ds, nw_before)
    full = [ids(b) for _ in range(2) for b in full_run]
    ref = loader(plain, 0)
    assert full == [ids(b) for _ in range(2) for b in ref]
    for epoch_ids in (full[:13], full[13:]):
        assert sorted(i for b in epoch_ids for i in b) == list(range(50))
    for k in (5, 13 + 7):
        run, before = loader(ds, nw_before), []
        for _ in range(2):
            for batch in run:
                before.append(ids(batch))
                if len(before) == k:
                    break
            if len(before) == k:
                break
        state = run.state_dict()
        resumed = loader(ds, nw_after)
        resumed.load_state_dict(state)
        after = [ids(b) for _ in range(2 - state["epoch"]) for b in resumed]
        assert before + after == full, f"resume at {k} is not exact"


def read_tokens(path: Path) -> Iterator[int]:
    """An IterableReader function: it is handed the decoded copy of a compressed shard."""
    assert not path.name.endswith(".zst")
    yield from (int(t) for t in np.load(path)[::SEQ])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stream_over_compressed_shards_reads_every_sample_and_resumes(
    tmp_path: Path, num_workers: int
) -> None:
    reader = TokenReader(seq_len=SEQ)
    write_shards(tmp_path / "z", id_shards(), reader, compression="zstd")
    write_shards(tmp_path / "p", id_shards(), reader)

    def make(folder: Path, rd: Any) -> ResumableDataLoader:
        ds = StreamingShardedDataset(folder, rd, mix_shards=2)
        return ResumableDataLoader(ds, batch_size=4, seed=5, num_workers=num_workers)

    def flat(batches: list[Any]) -> list[list[int]]:
        return [[int(x) for x in (b[:, 0] if b.ndim == 2 else b)] for b in batches]

    full = flat(list(make(tmp_path / "z", reader)))
    assert full == flat(list(make(tmp_path / "p", reader)))
    assert sorted(i for b in full for i in b) == list(range(50))
    first = make(tmp_path / "z", reader)
    it = iter(first)
    head = flat([next(it) for _ in range(4)])
    state = first.state_dict()
    del it
    resumed = make(tmp_path / "z", reader)
    resumed.load_state_dict(state)
    assert head + flat(list(resumed)) == full
    # A front-to-back reader function gets the decoded file too.
    fn_reader = IterableReader(read_tokens, suffixes=(".npy",))
    assert flat(list(make(tmp_path / "z", fn_reader))) == full


def test_a_shard_rewritten_with_its_size_and_mtime_kept_is_decoded_again(
    tmp_path: Path,
) -> None:
    # A copy that preserves times (cp -p, rsync -t) or a coarse-mtime filesystem: the
    # old decoded copy must not be served for the new contents.
    reader = TokenReader(seq_len=4)
    old = [np.arange(16, dtype=np.uint16) + 100 * k for k in range(2)]
    new = [np.arange(16, dtype=np.uint16)[::-1].copy() + 100 * k for k in range(2)]
    paths = write_shards(tmp_path / "s", old, reader, compression="zstd", progress=False)
    assert ShardedDataset(paths, reader)[0].tolist() == [0, 1, 2, 3]
    stats = [os.stat(p) for p in paths]
    again = write_shards(
        tmp_path / "s", new, reader, compression="zstd", progress=False, resume=False
    )
    for path, st in zip(again, stats, strict=True):
        assert os.stat(path).st_size == st.st_size
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    for index in (tmp_path / "s").glob(".loaderkit-index-*"):
        index.unlink()
    assert ShardedDataset(again, reader)[0].tolist() == [15, 14, 13, 12]


def test_a_corrupt_zstd_stream_names_the_file(tmp_path: Path) -> None:
    reader = TokenReader(seq_len=SEQ)
    paths = write_shards(tmp_path / "d", id_shards(), reader, compression="zstd")
    st = paths[1].stat()
    data = bytearray(paths[1].read_bytes())
    data[len(data) // 2] ^= 0xFF  # bit rot: same size and mtime, no hash in the index
    paths[1].write_bytes(bytes(data))
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ShardError, match=r"shard-00001\.npy\.zst' is not a readable zstd stream"):
        ShardedDataset(paths, reader)[SIZES[0]]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.npy.zst").write_bytes(b"not zstd at all")
    with pytest.raises(ShardError, match=r"x\.npy\.zst' is not a readable zstd stream"):
        ShardedDataset(bad, reader)  # counted when indexed: the decode names it


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"compression": "gzip"}, r"compression must be None or one of \['zstd'\], got 'gzip'"),
        ({"compression": "zstd", "level": 99}, r"level must be an int in \[-7, 22\].*got 99"),
        ({"compression": "zstd", "level": 2.5}, r"level must be an int.*got 2\.5"),
        ({"level": 3}, r"level=3 is the zstd level, but compression is None"),
        ({"hash": "md5"}, r"hash must be None or one of \['sha256'.*got 'md5'"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        write_shards(tmp_path, id_shards(), TokenReader(seq_len=SEQ), **kwargs)
    assert not list(tmp_path.iterdir())  # checked before anything is written


def test_without_zstandard_the_extra_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = TokenReader(seq_len=SEQ)
    paths = write_shards(tmp_path / "d", id_shards(), reader, compression="zstd")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard -> ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install '\.\[zstd\]'"):
        write_shards(tmp_path / "e", id_shards(), reader, compression="zstd")
    assert not (tmp_path / "e").exists()  # refused before the folder (it left a work folder)
    ds = ShardedDataset(paths, reader)  # the index is there: nothing to decode yet
    with pytest.raises(MissingDependencyError, match=r"zstandard.*\.\[zstd\]"):
        ds[0]
    with pytest.raises(MissingDependencyError, match=r"\.\[zstd\]"):
        list(ResumableDataLoader(StreamingShardedDataset(tmp_path / "d", reader), batch_size=4))


def test_an_index_counting_blank_lines_is_refused_never_skipped(tmp_path: Path) -> None:
    # An older loaderkit's JsonlReader counted a blank line as a sample: the count's
    # mismatch was a plain ShardError, which on_error="skip" took for a bad shard.
    import zstandard

    from loaderkit.data.index import checksum

    text = b'{"i": 0}\n\n{"i": 1}\n{"i": 2}\n'
    tmp_path /= "d"  # the decode cache is in the test's own folder
    tmp_path.mkdir()
    (tmp_path / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(text))
    assert ShardedDataset(tmp_path, JsonlReader()).sizes == (3,)
    index = next(tmp_path.glob(".loaderkit-index-*"))
    doc = json.loads(index.read_text())
    doc["shards"][0][3] = 4  # as the older count wrote it
    doc["checksum"] = checksum(doc["shards"])
    index.write_text(json.dumps(doc))
    for on_error in ("raise", "skip"):
        ds = ShardedDataset(tmp_path, JsonlReader(), on_error=on_error)  # type: ignore[arg-type]
        with pytest.raises(ShardChangedError, match=r"an older loaderkit counted it; delete"):
            ds.__getitems__([0, 1, 2, 3])
