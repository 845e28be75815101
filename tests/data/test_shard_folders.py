"""A shard folder is the corpus its ``write_shards`` index lists: two corpora in one folder
are refused (reading them used to give their union), a corpus passed as a list is read alone.

Local folders and fsspec's ``memory://`` go through the same check (``check_complete``).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import (
    JsonlReader,
    RemoteCache,
    ResumableDataLoader,
    ShardChangedError,
    ShardedDataset,
    ShardError,
    StreamingShardedDataset,
    TokenReader,
    write_shards,
)

pytest.importorskip("fsspec")

SEQ = 4
READER = TokenReader(seq_len=SEQ, dtype=np.uint16)


def arrays(sizes: tuple[int, ...], value: int) -> list[np.ndarray]:
    return [np.full(SEQ * n, value, np.uint16) for n in sizes]


@pytest.fixture(params=["local", "memory"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """``(folder, remote)``: a local folder, or a ``memory://`` one with its cache."""
    if request.param == "local":
        yield tmp_path / "corpus", None
        return
    import fsspec

    url = f"memory://folders-{uuid.uuid4().hex[:8]}"
    yield url, RemoteCache(cache_dir=tmp_path / "rcache")
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def names(folder: Any) -> list[str]:
    if isinstance(folder, Path):
        return sorted(p.name for p in folder.iterdir())
    import fsspec

    return sorted(p.rsplit("/", 1)[-1] for p in fsspec.filesystem("memory").ls(folder, False))


SECOND = {
    "prefix": {"prefix": "b"},
    "suffix": {"suffix": ".bin"},
    "settings": {"prefix": "b", "hash": "sha256", "compression": "zstd"},
}


@pytest.mark.parametrize("how", sorted(SECOND))
def test_two_write_shards_corpora_in_one_folder_are_refused(
    how: str, place: tuple[Any, Any]
) -> None:
    # Both datasets read the union of the two corpora (and wrote an index for it).
    folder, remote = place
    if how == "settings":
        pytest.importorskip("zstandard")
    first = write_shards(folder, arrays((10, 12), 1), READER, progress=False)
    second = write_shards(folder, arrays((3, 4), 2), READER, progress=False, **SECOND[how])
    before = names(folder)
    match = (
        r"shard folder .* holds 2 write_shards corpora \(indexes '.*\.loaderkit-index-.*\.json', "
        r"'.*\.loaderkit-index-.*\.json'\), so reading it cannot tell which one you mean; write "
        r"each corpus to its own folder, or pass the list of one corpus' shards\.$"
    )
    with pytest.raises(ShardError, match=match):
        ShardedDataset(folder, READER, remote=remote)
    with pytest.raises(ShardError, match=match):
        StreamingShardedDataset(folder, READER, remote=remote)
    assert names(folder) == before  # no index of their union
    # Each corpus passed as its list of shards is read alone, counted by its own index.
    sizes = [ShardedDataset(s, READER, remote=remote).sizes for s in (first, second)]
    assert sizes == [(10, 12), (3, 4)]
    assert names(folder) == before


def test_a_stray_shard_beside_two_corpora_is_refused_as_two_corpora(tmp_path: Path) -> None:
    write_shards(tmp_path, arrays((2,), 1), READER, prefix="a", progress=False)
    write_shards(tmp_path, arrays((3,), 2), READER, prefix="b", progress=False)
    np.save(tmp_path / "c-00000.npy", np.zeros(SEQ, np.uint16))
    with pytest.raises(ShardError, match=r"holds 2 write_shards corpora \(indexes "):
        ShardedDataset(tmp_path, READER)


def test_a_corpus_the_reader_cannot_open_is_no_second_corpus(place: tuple[Any, Any]) -> None:
    # Its files are no shards of this reader: the folder holds one corpus for each reader.
    folder, remote = place
    write_shards(folder, arrays((2, 3), 1), READER, progress=False)
    write_shards(folder, [[{"a": 1}], [{"a": 2}] * 4], JsonlReader(), progress=False)
    assert ShardedDataset(folder, READER, remote=remote).sizes == (2, 3)
    assert ShardedDataset(folder, JsonlReader(), remote=remote).sizes == (1, 4)


@pytest.mark.parametrize("settings", [{}, {"hash": "sha256"}, {"compression": "zstd"}])
@pytest.mark.parametrize(("first", "second"), [((10, 12, 9), (3, 4)), ((2,), (4, 5, 6))])
def test_a_second_write_of_one_prefix_replaces_the_corpus(
    settings: dict[str, Any],
    first: tuple[int, ...],
    second: tuple[int, ...],
    place: tuple[Any, Any],
) -> None:
    # Growing too: the first write's index (listing fewer shards) was left beside the new one.
    folder, remote = place
    if settings.get("compression"):
        pytest.importorskip("zstandard")
    write_shards(folder, arrays(first, 1), READER, progress=False)
    write_shards(folder, arrays(second, 2), READER, progress=False, **settings)
    assert ShardedDataset(folder, READER, remote=remote).sizes == second


def test_a_corpus_whose_shards_were_deleted_names_its_index(tmp_path: Path) -> None:
    write_shards(tmp_path, arrays((2,), 1), READER, prefix="a", progress=False)
    write_shards(tmp_path, arrays((3,), 2), READER, prefix="b", progress=False)
    (tmp_path / "b-00000.npy").unlink()
    with pytest.raises(ShardError, match=r"lacks 1 shard\(s\) .*\['b-00000.npy'\]; restore"):
        ShardedDataset(tmp_path, READER)


def test_plain_shards_beside_a_corpus_of_another_reader_are_read(tmp_path: Path) -> None:
    # Its index lists no shard of this reader: the .npy files are a plain folder to it.
    write_shards(tmp_path, [[{"a": 1}]], JsonlReader(), progress=False)
    np.save(tmp_path / "x.npy", np.zeros(2 * SEQ, np.uint16))
    assert ShardedDataset(tmp_path, READER).sizes == (2,)


@pytest.mark.parametrize("name", ["b.NPY", "b.Npy.zst"])
def test_a_shard_whose_suffix_differs_only_in_case_is_refused(
    name: str, place: tuple[Any, Any]
) -> None:
    # The listing left b.NPY out: a folder of two shards read as one, without a word.
    folder, remote = place
    write_shards(folder, arrays((2,), 1), READER, prefix="a", progress=False)
    if isinstance(folder, Path):
        (folder / name).write_bytes(b"not read")
    else:
        import fsspec

        fsspec.filesystem("memory").pipe_file(f"{folder}/{name}", b"not read")
    match = rf"holds '{name}', whose suffix differs from the reader's \['.npy', '.bin'\] only in"
    with pytest.raises(ValueError, match=match):
        ShardedDataset(folder, READER, remote=remote)
    with pytest.raises(ValueError, match=match):
        StreamingShardedDataset(folder, READER, remote=remote)


@pytest.mark.parametrize("name", ["b.NPY.gz", "b.npy.GZ", "b.Bin.Xz"])
def test_a_shard_compressed_otherwise_in_another_case_is_refused(
    name: str, place: tuple[Any, Any]
) -> None:
    # b.npy.gz was refused, b.NPY.gz and b.npy.GZ left out: shards (2,), not (2, 3).
    folder, remote = place
    write_shards(folder, arrays((2,), 1), READER, prefix="a", progress=False)
    if isinstance(folder, Path):
        (folder / name).write_bytes(b"not read")
    else:
        import fsspec

        fsspec.filesystem("memory").pipe_file(f"{folder}/{name}", b"not read")
    match = rf"holds '{name}', compressed in a form no reader opens"
    with pytest.raises(ValueError, match=match):
        ShardedDataset(folder, READER, remote=remote)
    with pytest.raises(ValueError, match=match):
        StreamingShardedDataset(folder, READER, remote=remote)


def test_a_folder_copied_from_a_url_with_its_index_names_that_index(tmp_path: Path) -> None:
    # Its rows hold object versions, not mtimes: int('1795684370.56') failed as a bare ValueError.
    import fsspec

    url = f"memory://synced-{uuid.uuid4().hex[:8]}"
    write_shards(url, arrays((2, 3), 1), READER, progress=False)
    fs = fsspec.filesystem("memory")
    for name in fs.ls(url, detail=False):
        (tmp_path / name.rsplit("/", 1)[-1]).write_bytes(fs.cat_file(name))
    fs.rm(url, recursive=True)
    (index,) = tmp_path.glob(".loaderkit-index-*.json")
    # Said as a checksum failure (read as damage); it is an index written for a URL.
    match = r"was written for a URL, and the shards are read from a local folder\. Re-run "
    with pytest.raises(ShardError, match=match + r"write_shards .* or delete the index"):
        ShardedDataset(tmp_path, READER)
    with pytest.raises(ShardError, match=match):  # a stream read it as no index, unchecked
        StreamingShardedDataset(tmp_path, READER)
    index.unlink()
    assert ShardedDataset(tmp_path, READER).sizes == (2, 3)


def test_another_corpus_index_written_for_a_url_leaves_a_local_corpus_readable(
    tmp_path: Path,
) -> None:
    # Review 331: refusing an index written for the other place refused a corpus beside it.
    import fsspec

    from loaderkit import JsonlReader

    write_shards(tmp_path, arrays((2, 3), 1), READER)
    url = f"memory://beside-{uuid.uuid4().hex[:8]}"
    write_shards(url, [[{"x": 1}], [{"x": 2}]], JsonlReader(), prefix="other")
    fs = fsspec.filesystem("memory")
    for name in fs.ls(url, detail=False):
        (tmp_path / name.rsplit("/", 1)[-1]).write_bytes(fs.cat_file(name))
    assert ShardedDataset(tmp_path, READER).sizes == (2, 3)
    stream = StreamingShardedDataset(tmp_path, READER)
    assert sum(len(b) for b in ResumableDataLoader(stream, batch_size=1)) == 5


@pytest.mark.parametrize("hashed", [False, True])
def test_a_folder_uploaded_with_its_index_reads_by_its_hashes_or_names_that_index(
    tmp_path: Path, hashed: bool
) -> None:
    # Without hashes: said as a checksum failure whose fix, deleting the index, drops
    # write_shards' hashes. With them it was refused too, though a copy between buckets read.
    import fsspec

    shards = [np.arange(SEQ * n, dtype=np.uint16) + 1000 * n for n in (2, 3)]
    write_shards(tmp_path, shards, READER, hash="sha256" if hashed else None)
    url = f"memory://uploaded-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    for path in tmp_path.iterdir():
        fs.pipe_file(f"{url}/{path.name}", path.read_bytes())
    remote = RemoteCache(cache_dir=tmp_path / "cache")
    if not hashed:
        match = r"was written for a local folder, and the shards are read from a URL\. Re-run "
        with pytest.raises(ShardError, match=match + r"write_shards .* or delete the index"):
            ShardedDataset(url, READER, remote=remote)
        with pytest.raises(ShardError, match=match):
            StreamingShardedDataset(url, READER, remote=remote)
        return
    local, uploaded = ShardedDataset(tmp_path, READER), ShardedDataset(url, READER, remote=remote)
    assert uploaded.sizes == (2, 3)
    assert all(torch.equal(uploaded[i], local[i]) for i in range(5))
    # Each download is checked against the hash: a same-size change is refused, not read.
    name = f"{url}/{local.shards[1].name}"
    fs.pipe_file(name, fs.cat_file(name)[:-2] + b"\x00\x00")
    other = RemoteCache(cache_dir=tmp_path / "cache2")
    with pytest.raises(ShardError, match="fails its content hash"):
        ShardedDataset(url, READER, remote=other)[4]
    # A stream took that index for none of its folder: it read the changed shard unchecked.
    stream = StreamingShardedDataset(url, READER, remote=RemoteCache(cache_dir=tmp_path / "c3"))
    with pytest.raises(ShardError, match="fails its content hash"):
        list(ResumableDataLoader(stream, batch_size=1))


def test_shards_in_a_linked_subfolder_are_refused_as_in_a_real_one(tmp_path: Path) -> None:
    # The walk did not follow the link: a folder of a.npy and more/b.npy read as a.npy alone.
    (tmp_path / "data").mkdir(), (tmp_path / "other").mkdir()
    np.save(tmp_path / "data" / "a.npy", np.zeros(SEQ, np.uint16))
    np.save(tmp_path / "other" / "b.npy", np.zeros(SEQ, np.uint16))
    (tmp_path / "data" / "more").symlink_to(tmp_path / "other")
    # A link to the folder above, which holds a shard: not below data/, so not walked.
    (tmp_path / "data" / "up").symlink_to(tmp_path)
    np.save(tmp_path / "top.npy", np.zeros(SEQ, np.uint16))
    with pytest.raises(ValueError, match=r"holds the shard 'more/b.npy' in a subfolder"):
        ShardedDataset(tmp_path / "data", READER)
    (tmp_path / "other" / "b.npy").unlink()
    assert ShardedDataset(tmp_path / "data", READER).sizes == (1,)


@pytest.mark.parametrize("link", ["parent", "top", "inner"])
def test_a_link_to_a_folder_above_is_not_walked(tmp_path: Path, link: str) -> None:
    # train/parent -> .. walked the parent: val/shard-00000.npy refused as nested in train/
    # (and a link to / would walk the whole disk).
    top = tmp_path / "top"
    for name in ("train", "val"):
        write_shards(top / name, arrays((2,), 1), READER, progress=False)
    np.save(top / "loose.npy", np.zeros(SEQ, np.uint16))
    train = top / "train"
    if link == "inner":  # a linked folder outside, with a link to the folder above it
        (tmp_path / "ext" / "notes").mkdir(parents=True)
        np.save(tmp_path / "ext" / "x.npy", np.zeros(SEQ, np.uint16))
        (tmp_path / "ext" / "notes" / "up").symlink_to(tmp_path / "ext")
        (train / "notes").symlink_to(tmp_path / "ext" / "notes")
    else:
        (train / link).symlink_to(top if link == "parent" else tmp_path)
    assert ShardedDataset(train, READER).sizes == (2,)
    assert [p.name for p in StreamingShardedDataset(train, READER).shards] == ["shard-00000.npy"]


@pytest.mark.parametrize("name", ["b.NPY", "b.npy.gz", "b.Npy.ZST"])
def test_a_shard_in_a_subfolder_is_refused_in_any_case_or_compression(
    tmp_path: Path, name: str
) -> None:
    # sub/b.npy was refused, sub/b.NPY or sub/b.npy.gz left out: (1,) without a word.
    np.save(tmp_path / "a.npy", np.zeros(SEQ, np.uint16))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / name).write_bytes(b"not read")
    with pytest.raises(ValueError, match=rf"holds the shard 'sub/{name}' in a subfolder"):
        ShardedDataset(tmp_path, READER)


def _rewrite(path: Any, values: np.ndarray) -> None:
    """Write ``values`` as the ``.npy`` file at ``path`` (a local path or a ``memory://`` URL)."""
    if isinstance(path, Path):
        np.save(path, values)
        return
    import fsspec

    with fsspec.open(path, "wb") as f:
        np.save(f, values)


READS = {
    "dtype-none": lambda d, paths, remote: ShardedDataset(
        d, TokenReader(seq_len=SEQ), remote=remote
    ),
    "other-seq-len": lambda d, paths, remote: ShardedDataset(
        d, TokenReader(seq_len=2, dtype=np.uint16), remote=remote
    ),
    "reversed-list": lambda d, paths, remote: ShardedDataset(paths[::-1], READER, remote=remote),
    "one-path": lambda d, paths, remote: ShardedDataset(paths[:1], READER, remote=remote),
    "stream": lambda d, paths, remote: StreamingShardedDataset(d, READER, remote=remote),
    "stream-path": lambda d, paths, remote: StreamingShardedDataset(
        paths[:1], TokenReader(seq_len=SEQ), remote=remote
    ),
}


@pytest.mark.parametrize("how", sorted(READS))
def test_a_write_shards_index_holds_for_every_reader_and_list(
    place: tuple[Any, Any], how: str
) -> None:
    # Measured before: only a reader with the writer's exact spec, given the folder or all of
    # its paths in order, found the index: the others counted the grown shard afresh and read
    # 10 samples of 8 (a stream never looked).
    folder, remote = place
    paths = write_shards(folder, arrays((4, 4), 7), READER, hash="sha256", progress=False)
    paths = [p if remote else Path(p) for p in paths]
    _rewrite(paths[0], np.full(SEQ * 6, 7, np.uint16))
    with pytest.raises(ShardChangedError, match="write_shards"):
        READS[how](folder, paths, remote)


def test_a_write_shards_hash_is_checked_by_any_reader_and_by_streams(tmp_path: Path) -> None:
    # Measured before: a same-size rewrite keeping its mtime was read silently by a reader
    # with other settings and by a stream ([500, 501, ...]); the writer's reader refused it.
    paths = [Path(p) for p in write_shards(tmp_path, arrays((4, 4), 7), READER, hash="sha256")]
    stat = paths[0].stat()
    np.save(paths[0], np.full(SEQ * 4, 500, np.uint16))
    os.utime(paths[0], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ShardError, match="fails its content hash"):
        ShardedDataset(tmp_path, TokenReader(seq_len=SEQ))[0]
    with pytest.raises(ShardError, match="fails its content hash"):
        list(StreamingShardedDataset(paths, READER).read_from(0, 0))


def test_a_write_shards_index_holds_through_a_link_and_refuses_damage(tmp_path: Path) -> None:
    # Review 158: a shard listed by a link from another folder was read grown, and a damaged
    # write_shards index was passed over by every reader but the writer's own.
    paths = _written(tmp_path / "corpus")
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "s.npy"
    link.symlink_to(paths[0])
    np.save(paths[0], np.full(SEQ * 6, 7, np.uint16))
    with pytest.raises(ShardChangedError, match="write_shards index"):
        ShardedDataset([link], TokenReader(seq_len=SEQ))
    other = _written(tmp_path / "damaged")
    (index,) = (tmp_path / "damaged").glob(".loaderkit-index-*")
    doc = json.loads(index.read_text())
    doc["shards"][0][1] += 8  # a size edited: the checksum no longer holds
    index.write_text(json.dumps(doc))
    with pytest.raises(ShardError, match="fails its checksum"):
        StreamingShardedDataset(other, TokenReader(seq_len=SEQ))
    # Note 15: a write_shards index that is not JSON at all was passed over.
    index.write_text(index.read_text()[:40])
    for read in (StreamingShardedDataset, ShardedDataset):
        with pytest.raises(ShardError, match="is unreadable; delete it"):
            read(other, TokenReader(seq_len=SEQ))


def _written(folder: Path) -> list[Path]:
    return [Path(p) for p in write_shards(folder, arrays((4, 4), 7), READER, progress=False)]


@pytest.mark.parametrize("call", ["no shards", "fn that does not pickle"])
def test_a_write_refused_before_its_first_shard_leaves_the_corpus_readable(
    tmp_path: Path, call: str
) -> None:
    # Was a ShardError "holds an unfinished write_shards" over a complete corpus, and
    # re-running the same call failed again (hunter 181).
    write_shards(tmp_path, arrays((2, 3), 7), READER, progress=False)
    if call == "no shards":
        with pytest.raises(ValueError, match="shards is empty"):
            write_shards(tmp_path, [], READER, progress=False)
    else:
        with pytest.raises(TypeError, match="cannot be pickled"):
            write_shards(tmp_path, [1], READER, fn=lambda i: i, num_workers=2, progress=False)
    assert ShardedDataset(tmp_path, READER).sizes == (2, 3)
    stream = StreamingShardedDataset(tmp_path, READER)
    assert sum(len(b) for b in ResumableDataLoader(stream, batch_size=2, seed=0)) == 5


def test_a_path_list_of_an_unfinished_first_write_is_refused(place: tuple[Any, Any]) -> None:
    # The folder was refused, its paths, a glob, links to them or a URL list read 2 of the
    # 4 shards with no error (hunter 181, review 186).
    folder, remote = place

    def stopped_after_two() -> Iterator[np.ndarray]:
        yield from arrays((1, 1), 3)
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        write_shards(folder, stopped_after_two(), READER, progress=False)
    shards = [n for n in names(folder) if n.endswith(".npy")]
    assert len(shards) == 2
    if remote is None:
        links = folder.parent / "links"
        links.mkdir()
        for name in shards:
            (links / name).symlink_to(folder / name)
        lists = [[folder / n for n in shards], [links / n for n in shards], links]
    else:
        lists = [[f"{folder}/{n}" for n in shards]]
    for listed in lists:
        for make in (ShardedDataset, StreamingShardedDataset):
            with pytest.raises(ShardError, match="unfinished write_shards"):
                make(listed, READER, remote=remote)


def test_a_write_of_another_prefix_leaves_an_unfinished_write_unfinished(
    place: tuple[Any, Any],
) -> None:
    # 0ad19c7: a completed write of prefix "b" removed prefix "a"'s markers with the whole work
    # folder, so "a"'s 2 shards of 4 read as a complete corpus (hunter 243).
    folder, remote = place

    def stopped_after_two() -> Iterator[np.ndarray]:
        yield from arrays((1, 1), 3)
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        write_shards(folder, stopped_after_two(), READER, prefix="a", progress=False)
    write_shards(folder, arrays((2,), 5), READER, prefix="b", progress=False)
    first = [n for n in names(folder) if n.startswith("a-") and n.endswith(".npy")]
    listed = [folder / n for n in first] if remote is None else [f"{folder}/{n}" for n in first]
    for make in (ShardedDataset, StreamingShardedDataset):
        with pytest.raises(ShardError, match="unfinished write_shards"):
            make(listed, READER, remote=remote)
    # Finishing "a" (resumed) leaves the folder with both corpora and no work folder.
    write_shards(folder, arrays((1, 1, 1, 1), 3), READER, prefix="a", progress=False)
    assert ".loaderkit-write" not in names(folder)
    assert ShardedDataset(listed, READER, remote=remote).sizes == (1, 1)


def _fails(item: Any) -> Any:
    raise RuntimeError("boom")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_write_whose_fn_fails_before_any_shard_keeps_the_corpus_readable(
    tmp_path: Path, num_workers: int
) -> None:
    # Hunter 299: fn raising on the first item left a work folder, so the complete corpus
    # already there was refused as an unfinished write (and the rerun failed alike).
    write_shards(tmp_path, arrays((1, 1, 1), 3), READER, progress=False)
    with pytest.raises(RuntimeError, match="boom"):
        write_shards(tmp_path, [1, 2], READER, fn=_fails, num_workers=num_workers, progress=False)
    assert ".loaderkit-write" not in names(tmp_path)
    assert ShardedDataset(tmp_path, READER).sizes == (1, 1, 1)


def test_a_write_failing_after_a_shard_was_renamed_stays_unfinished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Review 305: a disk full while shard 0's marker was written (after its rename) removed
    # the work folder, and the one shard of three read as a complete corpus.
    import errno

    from loaderkit.data import writer

    real = writer.atomic_write

    def full(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith(".json"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(writer, "atomic_write", full)
    with pytest.raises(OSError, match="No space"):
        write_shards(tmp_path, arrays((1, 1, 1), 3), READER, progress=False)
    monkeypatch.setattr(writer, "atomic_write", real)
    with pytest.raises(ShardError, match="unfinished write_shards"):
        ShardedDataset(tmp_path, READER)


def test_a_marker_left_half_written_by_a_killed_write_goes_with_its_rerun(tmp_path: Path) -> None:
    # Review 246: a SIGKILL while a marker was written left `.{marker}.{tag}.tmp`; the rerun
    # completed but kept the work folder, so the folder read as unfinished for good.
    def stopped_after_two() -> Iterator[np.ndarray]:
        yield from arrays((1, 1), 3)
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        write_shards(tmp_path, stopped_after_two(), READER, progress=False)
    work = tmp_path / ".loaderkit-write"
    (work / ".shard-00002.npy.json.4242-1-abcdef.tmp").write_bytes(b'{"vers')
    write_shards(tmp_path, arrays((1, 1, 1), 3), READER, progress=False)
    assert not work.exists()
    assert ShardedDataset(tmp_path, READER).sizes == (1, 1, 1)


def test_paths_that_name_another_place_are_refused(tmp_path: Path) -> None:
    # Hunter 390: "~/corpus" was written to a folder "~" in the cwd; Path("memory://b") / "x"
    # (memory:/b/x) was "not a directory"; a list of folders raised numpy's IsADirectoryError;
    # an unknown or chained protocol (filecache::memory://) was retried for 15 s as the network.
    with pytest.raises(ValueError, match=r"directory='~/corpus' starts with '~'.*expanduser"):
        write_shards("~/corpus", arrays((2,), 1), READER, progress=False)
    collapsed = Path("memory://bucket") / "train"
    with pytest.raises(ValueError, match=r"'memory:/bucket/train' is a URL that pathlib collapsed"):
        ShardedDataset(collapsed, READER)
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        write_shards(folder, arrays((2,), 1), READER, progress=False)
    for owner in (ShardedDataset, StreamingShardedDataset):
        with pytest.raises(ValueError, match=r"shards\[0\]=.* is a directory.*MixedDataset"):
            owner([a, b], READER)
    # Review 396: a relative folder named "~scratch" ("~" not a home) reads as it is.
    write_shards(tmp_path / "~scratch", arrays((2,), 1), READER, progress=False)
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert len(ShardedDataset("~scratch", READER)) == 2
    finally:
        os.chdir(cwd)
    for url in ("filecache::memory://corpus", "s4://bucket/corpus"):
        with pytest.raises(ValueError, match=r"no filesystem for .*:// URLs.*; pass") as caught:
            ShardedDataset(url, READER)
        assert "time(s)" not in str(caught.value)  # refused at once, not retried


def test_a_copy_without_its_times_names_cp_a_and_resumes_without_its_index(
    tmp_path: Path,
) -> None:
    # Hunter 390: a plain folder copied by cp -r was told to "restart the run".
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    np.save(src / "part0.npy", np.arange(4 * SEQ, dtype=np.uint16))
    ShardedDataset(src, READER)  # writes the folder's index
    dst.mkdir()
    for path in src.iterdir():
        (dst / path.name).write_bytes(path.read_bytes())  # times not kept
    os.utime(dst / "part0.npy", ns=(1, 1))
    with pytest.raises(ShardChangedError, match=r"cp -a keeps them\), delete the index"):
        ShardedDataset(dst, READER)
    for index in dst.glob(".loaderkit-index-*"):
        index.unlink()
    assert len(ShardedDataset(dst, READER)) == 4


class _Files(list):  # type: ignore[type-arg]
    def read(self, i: int) -> str:
        return str(self[i])


class _FolderReader:
    """A user format whose shards are folders (as Arrow's save_to_disk writes them)."""

    suffixes = (".shard",)

    def spec(self) -> dict[str, Any]:
        return {"kind": "folder-of-files"}

    def count(self, path: Path) -> int:
        return len(list(Path(path).iterdir()))

    def open(self, path: Path) -> _Files:
        return _Files(sorted(p.read_text() for p in Path(path).iterdir()))


def test_a_list_of_folders_that_are_a_readers_shards_is_read(tmp_path: Path) -> None:
    # Review 396: the refusal of shard folders in a list refused shards that are folders.
    parts = [tmp_path / f"part{i}.shard" for i in range(2)]
    for i, part in enumerate(parts):
        part.mkdir()
        for j in range(3):  # files named as the reader's shards too (review 397)
            (part / f"{j}.shard").write_text(f"s{i}-{j}")
    dataset = ShardedDataset(parts, _FolderReader())
    assert sorted(dataset[i] for i in range(len(dataset))) == [
        f"s{i}-{j}" for i in range(2) for j in range(3)
    ]


def _int32(batch: list[Any], *, collate_fn_map: Any = None) -> Any:
    return torch.stack(batch).to(torch.int32)


def test_a_users_tensor_handler_collates_a_sharded_datasets_batches(tmp_path: Path) -> None:
    # Review 397: a ShardedDataset's batches were read whole (get_batch), past the handler
    # a user registered in torch's default_collate_fn_map.
    from torch.utils.data._utils.collate import default_collate_fn_map

    write_shards(tmp_path / "c", arrays((2, 2), 1), READER, progress=False)
    saved = dict(default_collate_fn_map)
    default_collate_fn_map[torch.Tensor] = _int32
    try:
        batch = next(
            iter(ResumableDataLoader(ShardedDataset(tmp_path / "c", READER), batch_size=2))
        )
    finally:
        default_collate_fn_map.clear()
        default_collate_fn_map.update(saved)
    assert batch.dtype == torch.int32


def _joined(batch: list[str], *, collate_fn_map: Any = None) -> str:
    return "|".join(batch)


def _marked(batch: list[Any], *, collate_fn_map: Any = None) -> str:
    return "dict handler"


def test_a_users_str_handler_collates_a_parquet_datasets_batches(tmp_path: Path) -> None:
    # Review 398: a Parquet dataset's batches were read whole (get_batch), past a handler the
    # user registered for str; and a folder named like a shard in a list crashed the reader.
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from torch.utils.data._utils.collate import default_collate_fn_map

    from loaderkit import ParquetReader

    pq.write_table(pa.table({"t": [f"w{i}" for i in range(4)]}), tmp_path / "a.parquet")
    dataset = ShardedDataset([tmp_path / "a.parquet"], ParquetReader())
    saved = dict(default_collate_fn_map)
    default_collate_fn_map[str] = _joined
    try:
        batch = next(iter(ResumableDataLoader(dataset, batch_size=4)))
    finally:
        default_collate_fn_map.clear()
        default_collate_fn_map.update(saved)
    assert batch["t"] == "w0|w1|w2|w3"
    # Review 399: a handler for the user's own class keeps the batched read (and its form).
    default_collate_fn_map[_Files] = _joined
    try:
        loader = ResumableDataLoader(dataset, batch_size=4)
        assert next(iter(loader))["t"] == ["w0", "w1", "w2", "w3"]
        assert loader._engine.fetch.mode == "get_batch"
    finally:
        del default_collate_fn_map[_Files]
    (tmp_path / "x.parquet").mkdir()  # a Spark-style folder: loaderkit's readers open files
    with pytest.raises(ValueError, match=r"shards\[1\]=.*x\.parquet' is a directory.*itself"):
        ShardedDataset([tmp_path / "a.parquet", tmp_path / "x.parquet"], ParquetReader())
    # Review 400: one for dict (torch tries it before its own) reaches the samples.
    default_collate_fn_map[dict] = _marked
    try:
        assert next(iter(ResumableDataLoader(dataset, batch_size=4))) == "dict handler"
    finally:
        del default_collate_fn_map[dict]


class _MyJsonl(JsonlReader):
    """A user's subclass that keeps loaderkit's reading code (which opens files)."""


def _read_folder(path: Any) -> Any:
    return sorted(p.read_text() for p in Path(path).iterdir())


def test_folders_named_like_shards_go_to_readers_that_open_folders(tmp_path: Path) -> None:
    # Review 402: streams and subclasses of loaderkit's readers crashed in the reader
    # ("corrupt or truncated; rewrite it"); a stream of a user's folder shards reads them.
    from loaderkit import IterableReader

    (tmp_path / "a.jsonl").write_text('{"x": 1}\n')
    (tmp_path / "x.jsonl").mkdir()
    (tmp_path / "x.jsonl" / "part.jsonl").write_text('{"x": 2}\n')
    listed = [tmp_path / "a.jsonl", tmp_path / "x.jsonl"]
    for make in (ShardedDataset, StreamingShardedDataset):
        for reader in (JsonlReader(), _MyJsonl()):
            with pytest.raises(ValueError, match=r"shards\[1\]=.*x\.jsonl' is a directory"):
                make(listed, reader)
    folders = [tmp_path / f"{i}.shard" for i in range(2)]
    for i, folder in enumerate(folders):
        folder.mkdir()
        (folder / "s.txt").write_text(f"s{i}")
    stream = StreamingShardedDataset(folders, IterableReader(_read_folder, suffixes=(".shard",)))
    assert sorted(s for b in ResumableDataLoader(stream, batch_size=1) for s in b) == ["s0", "s1"]
