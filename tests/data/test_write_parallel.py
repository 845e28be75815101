"""write_shards in writer processes: the same files for any num_workers, resumable after kill -9.

Writers start by fork where it is safe, else forkserver; ``fn`` must pickle either
way unless ``mp_context="fork"`` is passed, so the ``fn`` of these tests live at
module level: forkserver writers import them from this module by name.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import JsonlReader, ShardedDataset, TokenReader, write_shards
from loaderkit.data.writer import WORK_DIR
from loaderkit.errors import ShardError

READER = TokenReader(seq_len=4, dtype=np.uint16)
ROOT = Path(__file__).resolve().parents[2]


def make(n: int) -> np.ndarray:
    """Shard ``n``: a few samples whose tokens encode ``n`` (different sizes per shard)."""
    return np.repeat(np.arange(n * 100, n * 100 + 5 + n % 3), 4).astype(np.uint16)


def make_logged(spec: tuple[int, str, float]) -> np.ndarray:
    """``make(n)``, noting the call in ``log`` (one line, O_APPEND) after ``delay`` seconds."""
    n, log, delay = spec
    time.sleep(delay)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{n}\n".encode())
    finally:
        os.close(fd)
    if n < 0:
        raise ValueError(f"boom in shard input {n}")
    return make(n)


def explode(n: int) -> np.ndarray:
    if n == 3:
        raise ValueError("boom: input 3 is bad")
    return make(n)


def snapshot(root: Path) -> tuple[dict[str, bytes], list[list[Any]]]:
    """Every file's bytes (the index aside) and the index rows without their mtimes."""
    files = {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}
    (index,) = [n for n in files if n.startswith(".loaderkit-index-")]
    rows = json.loads(files.pop(index))["shards"]
    return files, [[r[0], r[1], r[3], *r[4:]] for r in rows]


@pytest.mark.parametrize(
    ("compression", "hash"), [(None, None), ("zstd", "sha256"), (None, "xxh3_64"), ("zstd", None)]
)
def test_the_same_files_and_index_for_0_and_2_workers(
    tmp_path: Path, compression: str | None, hash: str | None
) -> None:
    if compression or (hash or "").startswith("xxh"):
        pytest.importorskip("zstandard")
        pytest.importorskip("xxhash")
    kw: dict[str, Any] = {"compression": compression, "hash": hash, "progress": False}
    a = write_shards(tmp_path / "a", [make(n) for n in range(7)], READER, **kw)
    b = write_shards(tmp_path / "b", range(7), READER, fn=make, num_workers=2, **kw)
    c = write_shards(tmp_path / "c", (make(n) for n in range(7)), READER, num_workers=2, **kw)
    assert [p.name for p in a] == [p.name for p in b] == [p.name for p in c]
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b") == snapshot(tmp_path / "c")
    assert not (tmp_path / "b" / WORK_DIR).exists()  # markers gone once the index is written
    ds = ShardedDataset(tmp_path / "b", READER)
    assert ds.sizes == tuple(5 + n % 3 for n in range(7))
    assert int(ds[0][0]) == 0 and int(ds[len(ds) - 1][0]) == 600 + 5 + 6 % 3 - 1


def run_child(folder: str, log: str, shards: int) -> None:
    """The writing subprocess of the kill -9 test."""
    inputs = [(n, log, 0.4) for n in range(shards)]
    write_shards(folder, inputs, READER, fn=make_logged, num_workers=2, progress=False)


def test_kill_9_mid_run_then_resume_writes_only_the_missing_shards(tmp_path: Path) -> None:
    shards = 10
    ref = tmp_path / "ref"
    write_shards(ref, range(shards), READER, fn=make, progress=False)
    folder, log = tmp_path / "out", tmp_path / "calls.log"
    code = (
        "from tests.data.test_write_parallel import run_child; "
        f"run_child({str(folder)!r}, {str(log)!r}, {shards})"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=env, start_new_session=True
    )
    markers = folder / WORK_DIR
    deadline = time.monotonic() + 120
    try:
        while len(list(markers.glob("*.json"))) < 3:
            assert child.poll() is None, "the writer finished before it was killed"
            assert time.monotonic() < deadline, "no shard was written in 120 s"
            time.sleep(0.02)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the writer and its processes, mid-shard
        child.wait()
    done = {p.name.removesuffix(".json") for p in markers.glob("*.json")}
    assert 3 <= len(done) < shards
    assert not any(p.name.startswith(".loaderkit-index-") for p in folder.iterdir())
    before = {name: (folder / name).stat().st_mtime_ns for name in done}
    log.write_text("")
    run_child(str(folder), str(log), shards)  # the same call again, in this process
    rewritten = sorted(int(x) for x in log.read_text().split())
    assert len(rewritten) == shards - len(done)
    assert {f"shard-{n:05d}.npy" for n in rewritten}.isdisjoint(done)
    assert all((folder / name).stat().st_mtime_ns == ns for name, ns in before.items())
    assert snapshot(folder) == snapshot(ref)
    assert not list(folder.glob(".*.tmp")) and not (folder / WORK_DIR).exists()


def test_a_worker_error_names_the_shard_and_keeps_its_traceback(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="boom: input 3 is bad") as info:
        write_shards(tmp_path, range(6), READER, fn=explode, num_workers=2, progress=False)
    assert any("shard 3 (shard-00003.npy)" in n for n in getattr(info.value, "__notes__", []))
    assert "in explode" in str(info.value.__cause__)  # the worker's own traceback
    assert not any(p.name.startswith(".loaderkit-index-") for p in tmp_path.iterdir())
    # Another fn: another settings key, every shard is written again.
    write_shards(tmp_path, range(6), READER, fn=make, num_workers=2, progress=False)
    assert ShardedDataset(tmp_path, READER).sizes == tuple(5 + n % 3 for n in range(6))


def test_an_error_in_the_caller_names_the_shard(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="boom: input 3 is bad") as info:
        write_shards(tmp_path, range(6), READER, fn=explode, progress=False)
    assert any("shard 3 (shard-00003.npy)" in n for n in getattr(info.value, "__notes__", []))


def test_resume_in_the_caller_skips_the_finished_shards(tmp_path: Path) -> None:
    log = str(tmp_path / "calls.log")
    bad = [(n if n != 4 else -1, log, 0.0) for n in range(7)]
    with pytest.raises(ValueError, match="boom in shard input -1"):
        write_shards(tmp_path / "d", bad, READER, fn=make_logged, progress=False)
    Path(log).write_text("")
    good = [(n, log, 0.0) for n in range(7)]
    write_shards(tmp_path / "d", good, READER, fn=make_logged, progress=False)
    assert [int(x) for x in Path(log).read_text().split()] == [4, 5, 6]
    write_shards(tmp_path / "ref", range(7), READER, fn=make, progress=False)
    assert snapshot(tmp_path / "d") == snapshot(tmp_path / "ref")
    # resume=False writes every shard again.
    Path(log).write_text("")
    write_shards(tmp_path / "e", bad[:4], READER, fn=make_logged, progress=False)
    write_shards(tmp_path / "e", good[:4], READER, fn=make_logged, progress=False, resume=False)
    assert len(Path(log).read_text().split()) == 8


@pytest.mark.parametrize(("num_workers", "kind"), [(0, "numpy"), (2, "numpy"), (0, "torch")])
def test_resume_without_fn_compares_the_data(tmp_path: Path, num_workers: int, kind: str) -> None:
    """Without fn, a re-run with other data kept what an interrupted run had written: a
    corpus of both. The same data again is skipped (a tensor's own pickle names its address)."""

    def items(plus: int, stop: int | None = None) -> Any:
        for n in range(4):
            if n == stop:
                raise ValueError("boom: interrupted")
            data = make(n) + plus
            yield torch.from_numpy(data.astype(np.int64)) if kind == "torch" else data

    folder = tmp_path / "out"
    first = [folder / f"shard-0000{n}.npy" for n in (0, 1)]
    for stop in (2, 3):  # the same data again: the shards written are kept
        with pytest.raises(ValueError, match="interrupted"):
            write_shards(folder, items(0, stop), READER, progress=False, num_workers=num_workers)
        if stop == 2:
            mtimes = [p.stat().st_mtime_ns for p in first]
    assert [p.stat().st_mtime_ns for p in first] == mtimes
    paths = write_shards(folder, items(7), READER, progress=False, num_workers=num_workers)
    ds = ShardedDataset(paths, READER)
    assert [int(ds[i][0]) for i in (0, 5, 11)] == [7, 107, 207]  # other data: written again


def test_a_changed_setting_or_shard_file_is_written_again(tmp_path: Path) -> None:
    log = str(tmp_path / "calls.log")
    inputs = [(n if n != 2 else -1, log, 0.0) for n in range(4)]
    with pytest.raises(ValueError, match="boom"):
        write_shards(tmp_path, inputs, READER, fn=make_logged, progress=False)
    Path(log).write_text("")
    # shard 1 changed on disk since its marker: it does not count as done.
    (tmp_path / "shard-00001.npy").write_bytes(b"garbage")
    good = [(n, log, 0.0) for n in range(4)]
    write_shards(tmp_path, good, READER, fn=make_logged, progress=False)
    assert sorted(int(x) for x in Path(log).read_text().split()) == [1, 2, 3]
    with pytest.raises(ValueError, match="boom"):
        write_shards(tmp_path / "z", inputs, READER, fn=make_logged, progress=False)
    Path(log).write_text("")
    write_shards(tmp_path / "z", good, READER, fn=make_logged, progress=False, prefix="other")
    assert len(Path(log).read_text().split()) == 4  # another prefix: other files


class Scaled(JsonlReader):
    """Writes each value times ``scale``, a setting its spec() (the count's) leaves out."""

    def __init__(self, scale: int) -> None:
        self.scale = scale

    def write(self, path: Path, samples: Any) -> Path:
        return super().write(path, [v * self.scale for v in samples])


def killed_after_two() -> Any:
    yield from ([1, 2], [3, 4])
    raise RuntimeError("killed")


def test_a_resume_with_other_reader_settings_rewrites_every_shard(tmp_path: Path) -> None:
    # The two shards written with scale=10 were kept: [10, 20, 30, 40, 5000, 6000].
    items = [[1, 2], [3, 4], [5, 6]]
    for folder in (tmp_path / "same", tmp_path / "other"):
        with pytest.raises(RuntimeError, match="killed"):
            write_shards(folder, killed_after_two(), Scaled(10), progress=False)
    first = (tmp_path / "same" / "shard-00000.jsonl").stat().st_mtime_ns
    write_shards(tmp_path / "same", items, Scaled(10), progress=False)
    assert (tmp_path / "same" / "shard-00000.jsonl").stat().st_mtime_ns == first  # skipped
    write_shards(tmp_path / "other", items, Scaled(1000), progress=False)
    ds = ShardedDataset(tmp_path / "other", JsonlReader())
    assert [ds[i] for i in range(len(ds))] == [1000, 2000, 3000, 4000, 5000, 6000]


def test_fewer_shards_than_an_earlier_write_leave_no_stale_shard(tmp_path: Path) -> None:
    # A folder read as a whole must hold only this write's shards: an earlier write of
    # more shards (or an interrupted one) left files the listing would pick up.
    folder = tmp_path / "out"
    write_shards(folder, range(4), READER, fn=make, progress=False, compression="zstd")
    paths = write_shards(folder, range(2), READER, fn=make, progress=False, resume=False)
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == sorted(
        p.name for p in paths
    )
    ds = ShardedDataset(folder, READER)
    assert ds.sizes == (5, 6)


def test_a_users_files_beside_the_shards_are_never_deleted(tmp_path: Path) -> None:
    """Only shards of this prefix and loaderkit's own sidecars are stale, not a user's
    ``.bak``, ``.md5`` or ``.json`` named after a shard."""
    folder = tmp_path / "out"
    first = write_shards(folder, range(4), READER, fn=make, progress=False)
    mine = [first[0].name + ".bak", first[1].name + ".md5", "shard-00007.npy.json"]
    for name in mine:
        (folder / name).write_text("the user's")
    paths = write_shards(folder, range(2), READER, fn=make, progress=False, resume=False)
    for name in mine:
        assert (folder / name).read_text() == "the user's"
    assert not (folder / first[3].name).exists()  # the earlier write's shard is stale
    assert [p.name for p in paths] == [p.name for p in first[:2]]


def test_to_s3_fewer_shards_than_before_leave_no_stale_object(s3: Any) -> None:
    url = f"s3://{s3.bucket}/shrink"
    write_shards(url, range(4), READER, fn=make, storage_options=s3.options, progress=False)
    write_shards(url, range(2), READER, fn=make, storage_options=s3.options, progress=False)
    shards = [n for n in remote_names(s3, url) if n.startswith("shard-")]
    assert sorted(shards) == ["shard-00000.npy", "shard-00001.npy"]


def make_v2(n: int) -> np.ndarray:
    return make(n) + 1


def test_a_changed_fn_rewrites_every_shard_on_resume(tmp_path: Path) -> None:
    folder = tmp_path / "out"
    with pytest.raises(ValueError, match="boom"):
        write_shards(folder, range(5), READER, fn=explode, progress=False)
    # The same qualified name, other code: nothing written by the old code is kept.
    make_v2.__qualname__ = explode.__qualname__
    make_v2.__module__ = explode.__module__
    paths = write_shards(folder, range(5), READER, fn=make_v2, progress=False)
    ds = ShardedDataset(paths, READER)
    assert [int(ds[i][0]) for i in (0, 5)] == [1, 101]


def tokenize(n: int) -> np.ndarray:  # the helper an unchanged fn calls; its fix is a new fn
    if n == 2:
        raise ValueError("boom: the helper's bug")
    return make(n) + 7


def fixed_tokenize(n: int) -> np.ndarray:
    return make(n)


def via_helper(n: int) -> np.ndarray:
    return tokenize(n)


def test_a_fixed_helper_of_fn_rewrites_every_shard_on_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "out"
    with pytest.raises(ValueError, match="helper's bug"):
        write_shards(folder, range(4), READER, fn=via_helper, progress=False)
    monkeypatch.setitem(globals(), "tokenize", fixed_tokenize)
    ds = ShardedDataset(
        write_shards(folder, range(4), READER, fn=via_helper, progress=False), READER
    )
    assert [int(ds[i][0]) for i in (0, 5)] == [0, 100]


LANGS = {lang: 1 for lang in {"en", "de", "fr", "es", "it"}}  # ordered by the hash seed


def squares(n: int) -> np.ndarray:
    special = {"<s>", "</s>", "<pad>"}  # a set literal: a frozenset constant
    return np.array([i * i * sum(LANGS.values()) // 5 for i in range(n) if str(i) not in special])


def test_an_fn_with_a_comprehension_has_one_digest_in_every_process() -> None:
    # A nested code object's repr holds its address: digested as code, a resume keeps shards.
    code = (
        "from loaderkit.data.writer import _settings_key; "
        "from tests.data.test_write_parallel import READER, squares; "
        "print(_settings_key(READER, squares, 'shard', '.npy', None))"
    )
    root = Path(__file__).resolve().parents[2]
    run = functools.partial(subprocess.run, [sys.executable, "-c", code], cwd=root, text=True)
    env = [{**os.environ, "PYTHONHASHSEED": str(seed)} for seed in (1, 2)]  # set order
    digests = {run(capture_output=True, check=True, env=e).stdout for e in env}
    assert len(digests) == 1 and len(digests.pop().strip()) == 16


def make_plus(n: int, plus: int) -> np.ndarray:
    if n == 2 and plus == 1:
        raise ValueError("boom: the first run stops at shard 2")
    return make(n) + plus


class MakePlus:
    def __init__(self, plus: int) -> None:
        self.plus = plus

    def __call__(self, n: int) -> np.ndarray:
        return make_plus(n, self.plus)


@pytest.mark.parametrize("fn", [lambda p: functools.partial(make_plus, plus=p), MakePlus])
def test_an_fn_with_other_arguments_rewrites_every_shard_on_resume(tmp_path: Path, fn: Any) -> None:
    """Same code, other bound arguments (a partial's, an instance's state): other data."""
    folder = tmp_path / "out"
    with pytest.raises(ValueError, match="boom"):
        write_shards(folder, range(3), READER, fn=fn(1), progress=False)
    assert len(list(folder.glob(f"{WORK_DIR}/**/*.npy"))) + len(list(folder.glob("*.npy"))) >= 2
    paths = write_shards(folder, range(3), READER, fn=fn(2), progress=False)
    ds = ShardedDataset(paths, READER)
    assert [int(ds[i][0]) for i in (0, 5)] == [2, 102]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_workers": -1}, ValueError, "num_workers"),
        ({"num_workers": "2"}, TypeError, "num_workers"),
        ({"num_workers": 2, "mp_context": "nope"}, ValueError, "mp_context='nope'"),
        ({"num_workers": 2, "mp_context": 3}, TypeError, "mp_context must be"),
        ({"mp_context": "spawn"}, ValueError, "mp_context='spawn' needs num_workers >= 1"),
        ({"fn": 3}, TypeError, "fn must be a callable"),
        ({"progress": "yes"}, TypeError, "progress must be a bool"),
        ({"resume": 1}, TypeError, "resume must be a bool"),
    ],
)
def test_bad_arguments_are_named(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        write_shards(tmp_path, [make(0)], READER, **kwargs)
    assert not any(p.name.startswith("shard-") for p in tmp_path.iterdir())


def test_progress_bar_or_line_on_stderr_and_none_with_progress_false(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_shards(tmp_path / "a", [make(0), make(1)], READER, progress=False)
    assert capsys.readouterr().err == ""
    write_shards(tmp_path / "b", [make(0), make(1)], READER)
    assert "2/2" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # no tqdm: a plain line
    write_shards(tmp_path / "c", [make(0), make(1)], READER)
    assert "write_shards: 2/2 shards (0 already done)" in capsys.readouterr().err


# ------------------------------------------------------------------ to a URL
@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from tests.support.s3 import LocalS3

    server = LocalS3(log=tmp_path_factory.mktemp("moto") / "moto.log")
    server.start()
    yield server
    server.stop()


def remote_names(s3: Any, url: str) -> dict[str, int]:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3.options)
    return {p["name"].rsplit("/", 1)[1]: p["size"] for p in fs.ls(url, detail=True)}


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_to_s3_with_workers_and_resume(s3: Any, tmp_path: Path, compression: str | None) -> None:
    from loaderkit import RemoteCache

    if compression:
        pytest.importorskip("zstandard")
    kw: dict[str, Any] = {
        "storage_options": s3.options,
        "progress": False,
        "compression": compression,
        "hash": "sha256",
    }
    base = f"s3://{s3.bucket}/write-{compression}"
    seq = write_shards(f"{base}/seq", range(6), READER, fn=make, **kw)
    log = str(tmp_path / "calls.log")
    bad = [(n if n != 3 else -1, log, 0.0) for n in range(6)]
    with pytest.raises(ValueError, match="boom in shard input -1"):
        write_shards(f"{base}/par", bad, READER, fn=make_logged, **kw)
    assert any(n == WORK_DIR for n in remote_names(s3, f"{base}/par"))
    Path(log).write_text("")
    good = [(n, log, 0.0) for n in range(6)]
    par = write_shards(f"{base}/par", good, READER, fn=make_logged, num_workers=2, **kw)
    assert sorted(int(x) for x in Path(log).read_text().split()) == [3, 4, 5]
    assert [u.rsplit("/", 1)[1] for u in seq] == [u.rsplit("/", 1)[1] for u in par]
    a, b = remote_names(s3, f"{base}/seq"), remote_names(s3, f"{base}/par")
    assert a == b and WORK_DIR not in b  # same objects, same sizes; markers removed
    cache = RemoteCache(cache_dir=tmp_path / "cache", storage_options=s3.options)
    ds = ShardedDataset(f"{base}/par", READER, remote=cache)
    assert ds.sizes == tuple(5 + n % 3 for n in range(6))
    assert ds.describe()["remote"]["fetched"] == 0  # counted from the index
    assert int(ds[len(ds) - 1][0]) == 500 + 5 + 5 % 3 - 1


def test_a_resume_at_a_url_writes_again_a_shard_replaced_at_the_same_size(tmp_path: Path) -> None:
    import fsspec

    url, log = f"memory://resume-replaced-{os.getpid()}/c", str(tmp_path / "calls.log")
    with pytest.raises(ValueError, match="boom in shard input -1"):
        write_shards(
            url,
            [(n if n != 3 else -1, log, 0.0) for n in range(5)],
            READER,
            fn=make_logged,
            progress=False,
        )
    fs = fsspec.filesystem("memory")
    (first,) = [p for p in fs.ls(url, detail=False) if p.endswith("-00000.npy")]
    size = fs.size(first)
    fs.pipe(first, fs.cat(first)[:-8] + b"\x07" * 8)  # another shard 0, the same size
    assert fs.size(first) == size
    Path(log).write_text("")
    write_shards(url, [(n, log, 0.0) for n in range(5)], READER, fn=make_logged, progress=False)
    assert sorted(int(x) for x in Path(log).read_text().split()) == [0, 3, 4]  # 1, 2 kept
    assert ShardedDataset(url, READER)[4].tolist() == make(0)[16:20].tolist()
    fs.rm(url.split("/c")[0].removeprefix("memory://"), recursive=True)


def test_a_transient_error_looking_up_an_uploaded_shard_is_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loaderkit.data._fs import Storage

    real, failed = Storage.identity, []

    def flaky(self: Storage, url: str) -> tuple[int, str]:
        if not failed:
            failed.append(url)
            raise ConnectionError("503 SlowDown")
        return real(self, url)

    monkeypatch.setattr(Storage, "identity", flaky)
    url = f"memory://lookup-retried-{os.getpid()}/c"
    write_shards(url, range(2), READER, fn=make, progress=False)
    assert failed and ShardedDataset(url, READER).sizes == (5, 6)


def test_a_url_folder_being_written_is_unfinished_from_its_first_upload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Hunter 312: the first shard was uploaded before any marker, so a reader listing the
    # folder then (another job, a rank started early) read a 1-shard corpus without error.
    from loaderkit.data._fs import Storage

    url = f"memory://write-window-{os.getpid()}/c"
    real, seen = Storage.upload, []

    def upload(self: Storage, local: Path, target: str) -> None:
        real(self, local, target)
        try:
            seen.append(ShardedDataset(url, READER).sizes)
        except ShardError as exc:
            seen.append(str(exc))

    monkeypatch.setattr(Storage, "upload", upload)
    write_shards(url, range(3), READER, fn=make, progress=False)
    assert len(seen) == 3 and all("unfinished write_shards" in str(s) for s in seen)
    assert ShardedDataset(url, READER).sizes == (5, 6, 7)  # the marker went at the end
    # A write that fails before its first upload leaves the complete corpus as it was.
    monkeypatch.setattr(Storage, "upload", real)
    with pytest.raises(ZeroDivisionError):
        write_shards(url, [0], READER, fn=lambda n: 1 / 0, progress=False, resume=False)
    assert ShardedDataset(url, READER).sizes == (5, 6, 7)
    # One that fails while another write (another prefix) has started keeps that one's marker.
    import fsspec

    other = f"{url}/{WORK_DIR}/part-started.npy.json"

    def start_another(n: int) -> None:
        fsspec.filesystem("memory").pipe_file(other, b"{}")
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        write_shards(url, [0], READER, fn=start_another, progress=False, resume=False)
    assert fsspec.filesystem("memory").ls(f"{url}/{WORK_DIR}", detail=False) == [
        other.removeprefix("memory:/")
    ]
    with pytest.raises(ShardError, match="unfinished write_shards"):
        ShardedDataset(url, READER)
    # One that fails with nothing uploaded beside that other write removes its own marker
    # too (review 315: kept, it left the folder refused after both were done).
    with pytest.raises(ZeroDivisionError):
        write_shards(url, [0], READER, fn=lambda n: 1 / 0, progress=False, resume=False)
    fsspec.filesystem("memory").rm(other)
    assert ShardedDataset(url, READER).sizes == (5, 6, 7)


def test_a_work_folder_listing_that_fails_is_not_taken_for_an_empty_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Taken as empty, a failed cleanup's listing removed the work folder with another write's
    # marker in it, and a finished write's returned with its markers left (refused later).
    import fsspec

    from loaderkit.data import _fs

    url = f"memory://write-listing-{os.getpid()}/c"
    write_shards(url, range(3), READER, fn=make, progress=False)
    other = f"{url}/{WORK_DIR}/part-started.npy.json"
    fsspec.filesystem("memory").pipe_file(other, b"{}")  # another write, unfinished
    real_entries, calls = _fs.Storage.entries, []

    def entries(self: _fs.Storage, folder: str) -> Any:
        if folder.endswith(WORK_DIR):
            calls.append(folder)
            if len(calls) > fail_after:
                raise ShardError("gave up listing after retries")
        return real_entries(self, folder)

    monkeypatch.setattr(_fs.Storage, "entries", entries)
    fail_after = 2  # this write's start, then the cleanup's first look
    with pytest.raises(ZeroDivisionError):
        write_shards(url, [0], READER, fn=lambda n: 1 / 0, progress=False, resume=False)
    assert len(calls) == 3
    assert fsspec.filesystem("memory").exists(other)
    with pytest.raises(ShardError, match="unfinished write_shards"):
        ShardedDataset(url, READER)
    fsspec.filesystem("memory").rm(other)
    calls.clear()
    fail_after = 2  # this write's start and its resume look, then the end's
    with pytest.raises(ShardError, match="gave up listing"):
        write_shards(url, range(3), READER, fn=make, progress=False)
    with pytest.raises(ShardError, match="unfinished write_shards"):
        ShardedDataset(url, READER)
    monkeypatch.setattr(_fs.Storage, "entries", real_entries)
    write_shards(url, range(3), READER, fn=make, progress=False)
    assert ShardedDataset(url, READER).sizes == (5, 6, 7)


def test_a_store_that_keeps_failing_names_the_fix_write_shards_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Review 327: it said to raise RemoteCache(retries=...), which write_shards does not take.
    from fsspec.implementations.memory import MemoryFileSystem

    from loaderkit.data import _fs

    real_ls = MemoryFileSystem.ls

    def ls(self: Any, path: str, detail: bool = True, **kwargs: Any) -> Any:
        if WORK_DIR in path:
            raise ConnectionResetError("connection reset by peer")
        return real_ls(self, path, detail=detail, **kwargs)

    monkeypatch.setattr(_fs.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(MemoryFileSystem, "ls", ls)
    again = r"failed 6 time\(s\).*re-run the same write_shards call \(it keeps the shards it"
    with pytest.raises(ShardError, match=again):
        write_shards(f"memory://write-again-{os.getpid()}", range(2), READER, fn=make)


def test_a_failed_rewrite_on_a_store_without_versions_keeps_its_start_marker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Review 316: a store that lists no versions (ftp://) hid a same-size rewrite of shard 0
    # that failed before its marker, so the failed write took its start marker away and the
    # old index vouched for the new bytes.
    from loaderkit.data import _fs

    url = f"memory://write-versionless-{os.getpid()}/c"
    monkeypatch.setattr(_fs, "version_of", lambda entry: "")
    write_shards(url, range(3), READER, fn=make, progress=False)
    real = _fs.Storage.upload

    def upload_then_fail(self: _fs.Storage, local: Path, target: str) -> None:
        real(self, local, target)
        raise ZeroDivisionError  # the connection drops after shard 0 went up

    monkeypatch.setattr(_fs.Storage, "upload", upload_then_fail)
    plus_one = functools.partial(make_plus, plus=2)  # the same sizes as make
    with pytest.raises(ZeroDivisionError):
        write_shards(url, range(3), READER, fn=plus_one, progress=False, resume=False)
    with pytest.raises(ShardError, match="unfinished write_shards"):
        ShardedDataset(url, READER)
    # Review 326: a listing failing in the cleanup too must not count as no markers.
    monkeypatch.setattr(_fs.Storage, "upload", real)
    write_shards(url, range(3), READER, fn=make, progress=False)  # done: no start marker
    monkeypatch.setattr(_fs.Storage, "upload", upload_then_fail)
    real_entries = _fs.Storage.entries

    def entries(self: _fs.Storage, folder: str) -> Any:
        if folder.endswith(WORK_DIR) and calls.append(folder) is None and len(calls) > 1:
            raise ShardError("gave up listing after retries")
        return real_entries(self, folder)

    calls: list[str] = []
    monkeypatch.setattr(_fs.Storage, "entries", entries)
    with pytest.raises(ZeroDivisionError):
        write_shards(url, range(3), READER, fn=plus_one, progress=False, resume=False)
    monkeypatch.setattr(_fs.Storage, "entries", real_entries)
    assert len(calls) > 1  # the cleanup's listing failed
    with pytest.raises(ShardError, match="unfinished write_shards"):
        ShardedDataset(url, READER)
    # Run again, it finishes; one failing before any upload leaves the corpus readable.
    monkeypatch.setattr(_fs.Storage, "upload", real)
    write_shards(url, range(3), READER, fn=make, progress=False)
    with pytest.raises(ZeroDivisionError):
        write_shards(url, [0], READER, fn=lambda n: 1 / 0, progress=False, resume=False)
    assert ShardedDataset(url, READER).sizes == (5, 6, 7)


def test_a_memory_folder_with_writer_processes_or_a_lagging_listing_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Hunter 318: each writer process uploaded into its own memory://, and indexing the
    # folder here failed with a bare KeyError: 'shard-00000.npy'.
    url = f"memory://write-lagging-{os.getpid()}/c"
    for spelt in (url, url.replace("memory", "Memory", 1)):  # review 327: any case
        with pytest.raises(ValueError, match=r"num_workers=2 with a memory:// folder.*workers=0"):
            write_shards(spelt, range(2), READER, fn=make, num_workers=2, progress=False)
    from loaderkit.data._fs import Storage

    real = Storage.entries

    def lagging(self: Storage, folder: str) -> Any:
        files, folders = real(self, folder)
        return [e for e in files if e["name"] != "shard-00001.npy"], folders

    monkeypatch.setattr(Storage, "entries", lagging)
    with pytest.raises(ShardError, match=r"shard-00001.npy'\] \(of 1\) went up but.*re-run"):
        write_shards(url, range(2), READER, fn=make, progress=False)


# ------------------------------------------------------------------ start method and pool
def new_children(before: set[Any]) -> set[Any]:
    """The child processes started since ``before`` that still run."""
    return set(multiprocessing.active_children()) - before


def test_the_default_writers_start_by_forkserver_whatever_runs_in_the_caller() -> None:
    from loaderkit.data.writer import _context

    # Forked writers would inherit the caller's module state and locks (torch's thread
    # pools, which threading cannot see): the bytes written could depend on them.
    assert _context(None).get_start_method() == "forkserver"
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert _context(None).get_start_method() == "forkserver"
    finally:
        stop.set()
        other.join()


SCALE = 1  # set by the caller of the next test; fresh writers import it as 1


def make_scaled(n: int) -> np.ndarray:
    return make(n) * SCALE


def test_the_bytes_written_do_not_depend_on_the_callers_module_state(tmp_path: Path) -> None:
    global SCALE
    kw: dict[str, Any] = {"fn": make_scaled, "num_workers": 2, "progress": False}
    want = snapshot(write_shards(tmp_path / "a", range(4), READER, **kw)[0].parent)
    SCALE = 7
    try:
        got = snapshot(write_shards(tmp_path / "b", range(4), READER, **kw)[0].parent)
    finally:
        SCALE = 1
    assert got == want


def test_fork_and_forkserver_writers_write_the_same_bytes(tmp_path: Path) -> None:
    before = set(multiprocessing.active_children())
    kw: dict[str, Any] = {"fn": make, "progress": False}
    write_shards(tmp_path / "a", range(5), READER, **kw)
    write_shards(tmp_path / "b", range(5), READER, num_workers=2, mp_context="fork", **kw)
    write_shards(tmp_path / "c", range(5), READER, num_workers=2, mp_context="forkserver", **kw)
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b") == snapshot(tmp_path / "c")
    assert not new_children(before)  # the writers are gone with the call


def test_an_fn_that_does_not_pickle_is_named_unless_fork_is_asked_for(tmp_path: Path) -> None:
    offset = 7
    before = set(multiprocessing.active_children())

    def local(n: int) -> np.ndarray:
        return make(n) + offset

    with pytest.raises(TypeError, match=r"fn=.*local.* cannot be pickled.*mp_context='fork'"):
        write_shards(tmp_path / "a", range(3), READER, fn=local, num_workers=2, progress=False)
    assert not any(p.name.startswith("shard-") for p in (tmp_path / "a").iterdir())
    # Asked for, fork hands the writers fn without pickling it.
    kw: dict[str, Any] = {"num_workers": 2, "mp_context": "fork", "progress": False}
    paths = write_shards(tmp_path / "b", range(3), READER, fn=local, **kw)
    assert int(ShardedDataset(paths, READER)[0][0]) == offset
    assert not new_children(before)


def test_an_item_that_does_not_pickle_names_its_shard_and_stops_the_writers(
    tmp_path: Path,
) -> None:
    before = set(multiprocessing.active_children())
    items: list[Any] = [make(0), make(1), threading.Lock()]
    with pytest.raises(TypeError, match="pickle") as info:
        write_shards(tmp_path, items, READER, num_workers=2, progress=False)
    assert any("shard 2 (shard-00002.npy)" in n for n in getattr(info.value, "__notes__", []))
    assert not new_children(before)
    paths = write_shards(tmp_path, items[:2], READER, num_workers=2, progress=False)
    assert ShardedDataset(paths, READER).sizes == (5, 6)


def test_no_writer_outlives_a_call_that_raised(tmp_path: Path) -> None:
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="boom: input 3 is bad"):
        write_shards(tmp_path, range(8), READER, fn=explode, num_workers=2, progress=False)
    assert not new_children(before)
    paths = write_shards(tmp_path, range(8), READER, fn=make, num_workers=2, progress=False)
    assert len(paths) == 8 and not new_children(before)


def test_writers_that_cannot_start_are_named(tmp_path: Path) -> None:
    # fn pickles here by reference, but its module cannot be imported in a new process.
    ghost = types.ModuleType("loaderkit_test_ghost")
    fn = types.FunctionType(make.__code__, make.__globals__, "make")
    fn.__module__ = ghost.__name__
    ghost.make = fn  # type: ignore[attr-defined]
    sys.modules[ghost.__name__] = ghost
    before = set(multiprocessing.active_children())
    try:
        with pytest.raises(ShardError, match="'forkserver' writer processes could not start"):
            kw: dict[str, Any] = {"num_workers": 2, "mp_context": "forkserver", "progress": False}
            write_shards(tmp_path, range(3), READER, fn=fn, **kw)
    finally:
        del sys.modules[ghost.__name__]
    assert not new_children(before)


def test_a_writer_whose_call_was_killed_exits_before_renaming() -> None:
    # Hunter 280: a killed call's forkserver writers renamed their shards into a rerun's folder.
    import subprocess
    import sys

    from loaderkit.data.writer import _exit_if_orphaned

    _exit_if_orphaned(os.getpid())  # the call itself: goes on
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    code = (
        "import sys; from loaderkit.data.writer import _exit_if_orphaned as f; f(int(sys.argv[1]))"
    )
    ended = subprocess.run([sys.executable, "-c", code, str(gone.pid)], check=False)
    assert ended.returncode == 1
