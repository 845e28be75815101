"""Writing shards in parallel processes, resumable after a crash, to a folder or a URL."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import functools
import glob
import hashlib
import itertools
import json
import multiprocessing
import os
import pickle
import re
import shutil
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

from loaderkit._atomic import atomic_write
from loaderkit._checks import check_bool, check_index_path, check_int
from loaderkit.data._code import class_digest, code_digest, pickle_digest
from loaderkit.data._codec import (
    ZSTD_SUFFIX,
    check_compression,
    check_hash,
    compress_file,
    file_digest,
    unlink,
)
from loaderkit.data._fs import Storage, is_url, join_url, refuse_file_url, url_name
from loaderkit.data._open import read_docs
from loaderkit.data.index import (
    WORK_DIR,
    WRITER,
    build_index,
    checked_count,
    default_index_path,
    index_doc,
    index_names,
    is_index_name,
    remote_index_name,
)
from loaderkit.data.readers import OWN_SUFFIXES, pinned_dtype
from loaderkit.errors import MissingShardError, ShardError

_AGAIN = "re-run the same write_shards call (it keeps the shards it finished)"

__all__ = ["write_shards"]

MARKER_VERSION = 1
Done = tuple[str, int, Any]  # a written shard's (name, samples, extras)


def _write_one(
    reader: Any, target: Path, data: Any, compression: str | None, level: int, algo: str | None
) -> tuple[Path, int, dict[str, Any] | None]:
    path = Path(reader.write(target, data))
    samples = reader.count(path)  # also writes any sidecar the reader needs
    extras: dict[str, Any] = pinned_dtype(path)
    if compression is not None:
        packed = path.with_name(path.name + ZSTD_SUFFIX)
        compress_file(path, packed, level)
        extras.update(compression=compression, raw_size=path.stat().st_size)
        for side in sorted(path.parent.glob(f"{glob.escape(path.name)}*")):  # a prefix's "["
            if side.name != path.name and side.name.endswith(OWN_SUFFIXES):
                side.replace(packed.with_name(packed.name + side.name[len(path.name) :]))
        path.unlink()
        path = packed
    if algo is not None:
        extras["hash"] = file_digest(path, algo)
    return path, checked_count(reader, path, samples), extras or None


@dataclass(frozen=True)
class _Job:
    """Everything a writer process needs (pickled once per writer)."""

    reader: Any
    fn: Callable[[Any], Any] | None
    prefix: str
    ext: str
    codec: tuple[str | None, int, str | None]
    key: str
    root: str  # a local folder or a URL
    storage: Storage | None
    caller: int = dataclasses.field(default_factory=os.getpid)  # the write_shards process

    def name(self, i: int) -> str:
        return f"{self.prefix}-{i:05d}{self.ext}"

    def marker(self, i: int) -> str:
        return f"{WORK_DIR}/{self.name(i)}.json"

    def started(self) -> str:
        """At a URL, the marker put before the first upload (a local write has its staging)."""
        return f"{WORK_DIR}/{self.prefix}-started{self.ext}.json"

    def marker_doc(self, i: int, fp: str | None, **fields: Any) -> bytes:
        doc = {"version": MARKER_VERSION, "shard": i, "key": self.key, "input": fp, **fields}
        return json.dumps(doc, sort_keys=True).encode()

    def prior(self, doc: Any, fp: str | None, sizes: Callable[[str], int | None]) -> Done | None:
        """The marker ``doc``'s shard if it matches this call and the file ``sizes`` now."""
        stale = doc["version"] != MARKER_VERSION or doc["key"] != self.key
        if stale or fp is None or doc["input"] != fp:  # None: an input that does not pickle
            return None
        for name, size in [(doc["name"], doc["size"]), *doc["sidecars"].items()]:
            if sizes(name) != size:
                return None
        return str(doc["name"]), int(doc["samples"]), doc["extras"]


def _run_shard(job: _Job, i: int, item: Any, fp: str | None) -> tuple[int, str, int, Any]:
    data = job.fn(item) if job.fn is not None else item
    root, storage = Path(job.root), job.storage
    if storage is None:
        stage = Path(tempfile.mkdtemp(prefix=f"{i:05d}-", dir=root / WORK_DIR / "staging"))
    else:
        stage = Path(tempfile.mkdtemp(prefix=".loaderkit-upload-"))
    try:
        path, samples, extras = _write_one(job.reader, stage / job.name(i), data, *job.codec)
        st = path.stat()  # a rename keeps size and mtime
        sides = sorted(p for p in stage.iterdir() if p != path)
        sizes = {p.name: p.stat().st_size for p in sides}
        _exit_if_orphaned(job.caller)  # a killed call's writers must not rename into a rerun's
        if storage is not None:  # a marker without versions: a failed upload left the folder
            storage.write_bytes(join_url(job.root, job.marker(i)), job.marker_doc(i, fp))
        for src in [*sides, path]:  # sidecars first: a shard in place has them
            if storage is None:
                os.replace(src, root / src.name)
            else:
                storage.upload(src, join_url(job.root, src.name))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    info = dict(name=path.name, size=st.st_size, samples=samples, extras=extras, sidecars=sizes)
    if storage is None:
        doc = job.marker_doc(i, fp, mtime_ns=st.st_mtime_ns, **info)
        atomic_write(root / job.marker(i), lambda f: f.write(doc))
    else:
        # Each object's version as stored: one replaced at the same size is written again.
        versions: dict[str, str] = {}
        for name in [*sizes, path.name]:
            url = join_url(job.root, name)  # looked up with retries, as it was uploaded
            look = functools.partial(storage.identity, url)
            versions[name] = storage.call("looking up", url, look)[1]
        doc = job.marker_doc(i, fp, versions=versions, **info)
        storage.write_bytes(join_url(job.root, job.marker(i)), doc)
    return i, path.name, samples, extras


def _exit_if_orphaned(caller: int) -> None:
    """End this writer process if the ``write_shards`` call it serves is gone (killed)."""
    if os.getpid() == caller:
        return
    try:
        os.kill(caller, 0)
    except ProcessLookupError:
        os._exit(1)
    except PermissionError:  # alive, as another user
        pass


def _settings_key(reader: Any, fn: Any, prefix: str, ext: str, codec: Any) -> str | None:
    """A digest of the call's settings; None when the reader cannot be digested."""
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    fn_name = None if fn is None else f"{getattr(fn, '__module__', '')}.{name}"
    settings = {"reader": reader.spec(), "fn": fn_name, "fn_code": code_digest(fn)}
    # What the reader writes may hang on settings its spec() (the count's) leaves out: on its
    # instance, its class, a helper method, write's own code (even in an installed class).
    settings |= {"reader_class": class_digest(type(reader)), "reader_bound": pickle_digest(reader)}
    settings["write_code"] = code_digest(reader.write)
    if settings["reader_class"] is None or settings["reader_bound"] is None:
        return None
    if fn is not None:  # a partial's arguments, a callable's state (None: not picklable)
        settings["fn_bound"] = pickle_digest(fn)
        if settings["fn_bound"] is None and not isinstance(fn, types.FunctionType):
            return None  # state unseen (it holds a lambda, a lock): resume nothing
    settings |= {"prefix": prefix, "ext": ext, "codec": codec}
    blob = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _done_local(job: _Job, i: int, fp: str | None) -> Done | None:
    """``(name, samples, extras)`` of shard ``i`` if a previous run completed it, else None."""
    root = Path(job.root)
    try:
        doc = json.loads((root / job.marker(i)).read_text())
        prior = job.prior(doc, fp, lambda name: (root / name).stat().st_size)
        if prior is not None and (root / doc["name"]).stat().st_mtime_ns != doc["mtime_ns"]:
            return None
        return prior
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _RemoteDone:
    """Which shards at a URL a previous run completed (one listing, a GET per marker)."""

    def __init__(self, job: _Job) -> None:
        assert job.storage is not None
        self.job, self.storage = job, job.storage
        listed = _listing(job.storage, job.root)
        self.sizes = {e["name"]: e["size"] for e in listed}
        self.versions = {e["name"]: e["version"] for e in listed}
        self.markers = {e["name"] for e in _listing(job.storage, join_url(job.root, WORK_DIR))}

    def __call__(self, i: int, fp: str | None) -> Done | None:
        job = self.job
        if f"{job.name(i)}.json" not in self.markers:
            return None
        try:
            doc = json.loads(self.storage.read_bytes(join_url(job.root, job.marker(i))))
            versions = doc["versions"]
            if {name: self.versions.get(name) for name in versions} != versions:
                return None
            return job.prior(doc, fp, self.sizes.get)
        except (ShardError, ValueError, KeyError, TypeError):
            return None


def _listing(storage: Storage, url: str) -> list[dict[str, Any]]:
    """The files in folder ``url``; none where it does not exist. A listing that fails is an
    error: taken as empty, it would drop another write's markers (or this one's)."""
    try:
        return storage.entries(url)[0]
    except MissingShardError:
        return []


class _Progress:
    """tqdm's bar where installed, else a stderr line."""

    def __init__(self, enabled: bool, total: int | None) -> None:
        self.done = self.skipped = 0
        self.total, self.enabled, self.last = total, enabled, 0.0
        self.bar: Any = None
        if enabled:
            with contextlib.suppress(ImportError):
                from tqdm.auto import tqdm

                self.bar = tqdm(total=total, desc="write_shards", unit="shard", dynamic_ncols=True)

    def update(self, skipped: bool) -> None:
        self.done += 1
        self.skipped += skipped
        if self.bar is not None:
            self.bar.update(1)
            if self.skipped:
                self.bar.set_postfix(skipped=self.skipped, refresh=False)
        elif self.enabled and (time.monotonic() - self.last > 0.5 or self.done == self.total):
            self.last = time.monotonic()
            of = f"/{self.total}" if self.total is not None else ""
            sys.stderr.write(
                f"\rwrite_shards: {self.done}{of} shards ({self.skipped} already done)"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.done:
            sys.stderr.write("\n")


def _context(mp_context: Any) -> Any:
    methods = multiprocessing.get_all_start_methods()
    if mp_context is None:
        # Never fork by default: a forked writer inherits the caller's locks and module state.
        if "forkserver" not in methods:
            return multiprocessing.get_context("spawn")
        ctx = multiprocessing.get_context("forkserver")
        # The loader workers' preload (one server for both); "__main__" for a script's fn.
        ctx.set_forkserver_preload(["__main__", "torch", "loaderkit"])
        return ctx
    if isinstance(mp_context, str):
        if mp_context not in methods:
            raise ValueError(
                f"write_shards: mp_context={mp_context!r} is not a start method here; pass "
                f"one of {methods}, or None for the default."
            )
        return multiprocessing.get_context(mp_context)
    if not hasattr(mp_context, "Process"):
        raise TypeError(
            f"write_shards: mp_context must be a start method name or a multiprocessing "
            f"context, got {mp_context!r}; pass e.g. 'spawn' or None for the default."
        )
    return mp_context


_JOB: _Job | None = None


def _start_writer(job: _Job) -> None:
    global _JOB
    _JOB = job


def _run_pooled(i: int, blob: bytes, fp: str | None) -> tuple[int, str, int, Any]:
    assert _JOB is not None
    return _run_shard(_JOB, i, pickle.loads(blob), fp)


@contextlib.contextmanager
def _writers(job: _Job, num_workers: int, mp_context: Any) -> Iterator[Any]:
    """The writer processes of one call (None for ``num_workers=0``)."""
    if num_workers == 0:
        yield None
        return
    ctx = _context(mp_context)
    if mp_context is None or ctx.get_start_method() != "fork":
        for name, obj in (("fn", job.fn), ("reader", job.reader)):
            try:
                ForkingPickler.dumps(obj)
            except Exception as exc:
                raise TypeError(
                    f"write_shards: {name}={obj!r} cannot be pickled for the writer processes "
                    f"({type(exc).__name__}: {exc}); define it at module level, or pass "
                    "mp_context='fork'."
                ) from exc
    pool = cf.ProcessPoolExecutor(
        num_workers, mp_context=ctx, initializer=_start_writer, initargs=(job,)
    )
    try:
        try:
            pool.submit(int).result()  # starts them (under fork, all of them)
        except BrokenProcessPool as exc:
            raise ShardError(
                f"write_shards: the {ctx.get_start_method()!r} writer processes could not "
                f"start ({exc}; their error is on stderr); call write_shards under `if "
                "__name__ == '__main__':` in a script, make fn and the reader importable by "
                "module and name, or pass num_workers=0.",
                path=job.root,
            ) from exc
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _noted(job: _Job, i: int) -> Iterator[None]:
    """An exception raised in the block gets a note naming shard ``i``."""
    try:
        yield
    except Exception as exc:
        exc.add_note(f"write_shards: raised while writing shard {i} ({job.name(i)})")
        raise


def _write_all(
    job: _Job,
    items: Iterable[Any],
    done: Callable[[int, str | None], Done | None] | None,
    pool: Any,
    num_workers: int,
    progress: _Progress,
) -> dict[int, Done]:
    """Write every shard not already ``done``; ``{i: (name, samples, extras)}`` for all."""
    results: dict[int, Done] = {}

    def todo() -> Iterator[tuple[int, Any, str | None]]:
        for i, item in enumerate(items):
            # Sets in their own order: another hash seed's order only rewrites.
            fp = pickle_digest(item, sorted_sets=False) if done is not None else None
            prior = done(i, fp) if done is not None else None
            if prior is None:
                yield i, item, fp
            else:
                results[i] = prior
                progress.update(skipped=True)

    def finished(i: int, name: str, samples: int, extras: Any) -> None:
        results[i] = (name, samples, extras)
        progress.update(skipped=False)

    if pool is None:
        for i, item, fp in todo():
            with _noted(job, i):
                finished(*_run_shard(job, i, item, fp))
    else:
        _pool_write(job, todo(), pool, num_workers, finished)
    return results


def _pool_write(
    job: _Job,
    todo: Iterator[tuple[int, Any, str | None]],
    pool: cf.ProcessPoolExecutor,
    num_workers: int,
    finished: Callable[..., None],
) -> None:
    """Write ``todo`` in ``pool``, two items per process in flight, pickled here (a pickling
    error in the pool's feeder thread would hang its shutdown)."""
    pending: dict[cf.Future[tuple[int, str, int, Any]], int] = {}
    try:
        while True:
            for i, item, fp in itertools.islice(todo, 2 * num_workers - len(pending)):
                with _noted(job, i):
                    blob = bytes(ForkingPickler.dumps(item))
                pending[pool.submit(_run_pooled, i, blob, fp)] = i
            if not pending:  # todo is exhausted
                break
            ready, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for fut in sorted(ready, key=pending.__getitem__):
                i = pending.pop(fut)
                if isinstance(broken := fut.exception(), BrokenProcessPool):
                    raise ShardError(
                        f"write_shards: a writer process died while shards "
                        f"{sorted([i, *pending.values()])} were being written ({broken}); "
                        "re-run the same call: the shards already written are kept and skipped.",
                        path=job.root,
                    ) from broken
                with _noted(job, i):  # the worker's traceback is the error's __cause__
                    finished(*fut.result())
    finally:
        for fut in pending:
            fut.cancel()


def write_shards(
    directory: str | os.PathLike[str],
    shards: Iterable[Any],
    reader: Any,
    *,
    suffix: str | None = None,
    prefix: str = "shard",
    index: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    compression: str | None = None,
    level: int | None = None,
    hash: str | None = None,
    fn: Callable[[Any], Any] | None = None,
    num_workers: int = 0,
    mp_context: Any = None,
    progress: bool = True,
    resume: bool = True,
) -> list[Any]:
    """Write one file per item of ``shards`` with ``reader.write``, atomically, and index them.

    Returns the shard paths (URLs for a URL), in order; an error in ``fn`` or the reader
    propagates with a note naming the shard.

    Args:
        directory: A folder (created if needed) or a folder URL; files named like this
            write's shards that it did not produce are removed.
        shards: One item per shard (the reader's data, or ``fn``'s inputs), read lazily.
        reader: A :class:`ShardReader` with a ``write(path, data)`` method.
        suffix: File suffix (default: the reader's first).
        prefix: Files are named ``{prefix}-00000{suffix}``, ...
        index: Also write the index here (a path or URL), besides the folder's own.
        storage_options: The fsspec filesystem's options for a URL.
        compression: ``"zstd"`` (``loaderkit[zstd]``) or None.
        level: The zstd level (default 3; -7 to 22).
        hash: ``"sha256"``, ``"blake2b"``, ``"xxh64"``, ``"xxh3_64"`` or ``"xxh3_128"``.
        fn: ``fn(item)`` makes a shard's data in the writer; must pickle unless forked.
        num_workers: Writer processes (0: the caller).
        mp_context: A start method or context (default: forkserver, else spawn).
        progress: Show a progress bar on stderr.
        resume: Skip the shards an interrupted call with the same settings, ``fn`` code
            and input pickles finished (``docs/guide/shards.md``); ``False`` writes all.

    Example:
        >>> import tempfile
        >>> from loaderkit import JsonlReader, ShardedDataset
        >>> data = [[{"a": 1}], [{"a": 2}, {"a": 3}]]
        >>> paths = write_shards(tempfile.mkdtemp(), data, JsonlReader(), progress=False)
        >>> [p.name for p in paths], ShardedDataset(paths, JsonlReader()).sizes
        (['shard-00000.jsonl', 'shard-00001.jsonl'], (1, 2))
    """
    progress, resume = _check_args(reader, fn, num_workers, mp_context, progress, resume)
    check_index_path(index, owner="write_shards")
    ext = _check_names(prefix, suffix if suffix is not None else reader.suffixes[0])
    comp, lvl = check_compression(compression, level, "write_shards")
    codec = (comp, lvl, check_hash(hash, "write_shards"))
    _check_folder(directory, num_workers)
    work = None if is_url(directory) else Path(directory) / WORK_DIR
    before = _files_now(work.parent) if work is not None and not work.exists() else None
    job, done = _make_job(directory, storage_options, reader, fn, prefix, ext, codec, resume)
    started, results = False, None
    own_mark = job.storage is not None and _mark_started(job)
    try:
        _refuse_index_over_a_shard(job, index)
        with _writers(job, num_workers, mp_context) as pool:
            bar = _Progress(progress, len(shards) if hasattr(shards, "__len__") else None)  # type: ignore[arg-type]
            started = True
            try:
                results = _write_all(job, shards, done, pool, num_workers, bar)
            finally:
                bar.close()
        if not results:
            raise ValueError("write_shards: shards is empty; pass at least one shard's data.")
    except BaseException:
        _undo_start(job, work, before, own_mark, started)
        raise
    written = [results[i] for i in sorted(results)]
    return (_index_local if job.storage is None else _index_remote)(job, written, index)


def _undo_start(
    job: _Job,
    work: Path | None,
    before: dict[str, tuple[int, int, int]] | None,
    own_mark: bool,
    started: bool,
) -> None:
    """After a failed write: one that put no file in place leaves no work folder or start
    marker (they would refuse a complete corpus there); one stopped after a rename or once an
    upload began leaves them. ``before``: a fresh local folder's files."""
    unchanged = work is not None and (not started or _files_now(work.parent) == before)
    if work is not None and before is not None and unchanged:
        shutil.rmtree(work, ignore_errors=True)
    if own_mark:
        _unmark_started(job)


def _mark_started(job: _Job) -> bool:
    """Put the start marker in a URL folder before anything is uploaded, so a reader listing
    it meanwhile refuses an unfinished write; False where an earlier write of the same shards
    left it (unfinished: it stays)."""
    storage = job.storage
    assert storage is not None
    names = {e["name"] for e in _listing(storage, join_url(job.root, WORK_DIR))}
    storage.write_bytes(join_url(job.root, job.started()), b"{}")
    return url_name(job.started()) not in names


def _unmark_started(job: _Job) -> None:
    """After a failed write into a URL folder: its start marker goes if no shard's upload
    began (each first puts its marker), and the work folder with it if nothing else is there."""
    storage = job.storage
    assert storage is not None
    mark, work = join_url(job.root, job.started()), join_url(job.root, WORK_DIR)
    with contextlib.suppress(ShardError):  # unlisted, a shard's marker may be there: it stays
        if set(_own_markers(job, [e["name"] for e in _listing(storage, work)])) - {url_name(mark)}:
            return
        storage.call("removing", mark, lambda: storage.fs.rm(mark))
        if not _listing(storage, work):  # another write's markers stay
            # Gone with its last object on object stores.
            storage.call("removing", work, lambda: storage.fs.rm(work, recursive=True))


def _files_now(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Each file in ``folder`` by name: inode, size, mtime (a rename into it changes them)."""
    out = {}
    with contextlib.suppress(OSError), os.scandir(folder) as entries:  # no folder yet
        for e in entries:
            if e.is_file(follow_symlinks=False):
                st = e.stat(follow_symlinks=False)
                out[e.name] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return out


def _make_job(
    directory: Any,
    storage_options: Any,
    reader: Any,
    fn: Any,
    prefix: str,
    ext: str,
    codec: Any,
    resume: bool,
) -> tuple[_Job, Callable[[int, str | None], Done | None] | None]:
    key = _settings_key(reader, fn, prefix, ext, codec)
    if key is None:  # settings unseen: no done shard can be told to match them
        key, resume = os.urandom(8).hex(), False
    if is_url(directory):
        url = str(directory).rstrip("/")
        storage = Storage(url, storage_options, again=_AGAIN)
        job = _Job(reader, fn, prefix, ext, codec, key, url, storage)
        return job, _RemoteDone(job) if resume else None
    root = _local_root(directory, storage_options)
    job = _Job(reader, fn, prefix, ext, codec, key, root, None)
    return job, functools.partial(_done_local, job) if resume else None


def _check_args(
    reader: Any, fn: Any, num_workers: Any, mp_context: Any, progress: Any, resume: Any
) -> tuple[bool, bool]:
    if not callable(getattr(reader, "write", None)):
        name = type(reader).__name__
        raise TypeError(
            f"write_shards: reader {name} has no write(path, data) method; pass a reader "
            "that writes, e.g. JsonlReader()."
        )
    if fn is not None and not callable(fn):
        raise TypeError(
            f"write_shards: fn must be a callable, got {fn!r}; pass a module-level function "
            "that makes one shard's data from one item, or leave fn out."
        )
    fix = "pass 0 to write in the caller"
    workers = check_int("num_workers", num_workers, 0, owner="write_shards", fix=fix)
    progress = check_bool("progress", progress, owner="write_shards")
    resume = check_bool("resume", resume, owner="write_shards")
    if workers > 0:
        _context(mp_context)  # checked before anything is written
    elif mp_context is not None:
        raise ValueError(
            f"write_shards: mp_context={mp_context!r} needs num_workers >= 1; pass "
            "num_workers=, or leave mp_context out."
        )
    return progress, resume


def _check_folder(directory: Any, num_workers: int) -> None:
    refuse_file_url("write_shards", "directory", directory)
    if num_workers and str(directory).lower().startswith("memory://"):
        raise ValueError(
            f"write_shards: num_workers={num_workers} with a memory:// folder: each writer "
            "process has its own memory filesystem, unseen here; pass num_workers=0."
        )


def _check_names(prefix: Any, suffix: Any) -> str:
    """``suffix`` if it and ``prefix`` name visible files in the folder itself."""
    for name, value in [("prefix", prefix), ("suffix", suffix)]:
        if not isinstance(value, str):
            raise TypeError(
                f"write_shards: {name} must be a str, got {value!r} ({type(value).__name__}); "
                f"pass e.g. {name}={'train' if name == 'prefix' else '.npy'!r}."
            )
    if not prefix or prefix.startswith(".") or "/" in prefix:
        raise ValueError(
            f"write_shards: prefix must be a non-empty file name start without '/' or a "
            f"leading '.', got {prefix!r}; pass e.g. prefix='train'."
        )
    if not suffix.startswith(".") or "/" in suffix:
        raise ValueError(
            f"write_shards: suffix must be a str starting with '.' and without '/', got "
            f"{suffix!r}; pass e.g. suffix='.npy', or leave it out (the reader's first)."
        )
    if suffix.endswith((ZSTD_SUFFIX, *OWN_SUFFIXES)):  # read as compressed, or as a sidecar
        raise ValueError(
            f"write_shards: suffix={suffix!r} names a compressed file or a loaderkit sidecar; "
            "pass the plain suffix (with compression='zstd' to compress)."
        )
    return suffix


def _shard_name(job: _Job) -> re.Pattern[str]:
    """This write's shard file names, ``{prefix}-00000{ext}`` (``.zst`` appended or not)."""
    return re.compile(rf"{re.escape(job.prefix)}-\d{{5,}}{re.escape(job.ext)}(\.zst)?")


def _refuse_index_over_a_shard(job: _Job, index: Any) -> None:
    """Refuse an ``index=`` in the shard folder named like a shard or its sidecar."""
    if index is None:
        return
    refuse_file_url("write_shards", "index", index)
    text = str(index)
    if is_url(text):
        same, name = text.rsplit("/", 1)[0].rstrip("/") == job.root, url_name(text)
    else:
        path = Path(index)
        same, name = path.resolve().parent == Path(job.root).resolve(), path.name
    shard = _shard_name(job).match(name)
    if same and shard and (shard.end() == len(name) or name.endswith(OWN_SUFFIXES)):
        raise ValueError(
            f"write_shards: index={text!r} is named like this write's shards (or their "
            "sidecars) in their folder, so it would overwrite one; give the index another "
            "name, e.g. 'index.json'."
        )


def _local_root(directory: Any, storage_options: Any) -> str:
    """The local folder to write into, with a fresh staging folder."""
    if storage_options is not None:
        raise ValueError(
            f"write_shards: storage_options is for a URL, but directory={str(directory)!r} is "
            "a local path; leave storage_options out, or pass a URL."
        )
    root = Path(directory)
    if root.exists() and not root.is_dir():
        raise ValueError(
            f"write_shards: directory={str(root)!r} is a file, not a directory; pass the "
            "path of a directory (it is created if needed)."
        )
    shutil.rmtree(root / WORK_DIR / "staging", ignore_errors=True)
    (root / WORK_DIR / "staging").mkdir(parents=True, exist_ok=True)
    return str(root)


def _stale(job: _Job, names: list[str], indexes: dict[str, bytes], written: set[str]) -> list[str]:
    """The shards, sidecars and ``indexes`` (by name) among ``names`` an earlier write left."""
    shard = _shard_name(job)

    def stale(name: str) -> bool:  # a user's file beside them (shard-00000.npy.bak) stays
        if name in written:
            return False
        if shard.fullmatch(name):
            return True
        match = shard.match(name)
        side = match is not None and name[match.end()] == "." and name.endswith(OWN_SUFFIXES)
        return side and not any(name.startswith(w + ".") for w in written)

    files = [n for n in names if stale(n)]
    for name, doc in indexes.items():
        if any(shard.fullmatch(n) for n in (index_names(doc) or ([], False))[0]):
            files.append(name)
    return files


def _index_local(job: _Job, written: list[Done], index: Any) -> list[Path]:
    root = Path(job.root)
    names = [p.name for p in root.iterdir()]
    docs = {Path(p).name: doc for p, doc in read_docs(root / n for n in names if is_index_name(n))}
    unlink(root / stale for stale in _stale(job, names, docs, {name for name, _, _ in written}))
    known = {root / name: (samples, extras) for name, samples, extras in written}
    paths = list(known)
    own = default_index_path(paths, job.reader)
    for target in [own] if index is None or Path(index) == own else [Path(index), own]:
        build_index(paths, job.reader, target, known=known, written_by=WRITER)
    work = root / WORK_DIR
    shutil.rmtree(work / "staging", ignore_errors=True)
    unlink(work / name for name in _own_markers(job, [p.name for p in work.glob("*")]))
    with contextlib.suppress(OSError):  # another write's markers stay: it is unfinished
        work.rmdir()
    return paths


def _own_markers(job: _Job, names: list[str]) -> list[str]:
    """This write's markers among ``names``, and their temporary files a killed write left
    (``.{marker}.{tag}.tmp``); another prefix's or suffix's are not ours."""
    start = re.escape(job.started().rsplit("/", 1)[1][: -len(".json")])
    own = re.compile(rf"(\.)?({_shard_name(job).pattern}|{start})\.json(?(1)\.[^/]+\.tmp)")
    return [n for n in names if own.fullmatch(n)]


def _index_remote(job: _Job, written: list[Done], index: Any) -> list[str]:
    storage = job.storage
    assert storage is not None
    listed = {entry["name"]: entry for entry in storage.entries(job.root)[0]}
    unlisted = [join_url(job.root, name) for name, _, _ in written if name not in listed]
    if unlisted:
        raise ShardError(
            f"write_shards: {unlisted[:3]} (of {len(unlisted)}) went up but the folder's "
            "listing lacks them; re-run the same write_shards call once the store lists them."
        )
    docs = {n: storage.read_bytes(join_url(job.root, n)) for n in listed if is_index_name(n)}
    for stale in _stale(job, list(listed), docs, {name for name, _, _ in written}):
        url = join_url(job.root, stale)
        storage.call("removing", url, functools.partial(storage.fs.rm, url))
    rows = [
        [name, listed[name]["size"], listed[name]["version"], int(n)] + ([extras] if extras else [])
        for name, n, extras in written
    ]
    doc = index_doc(rows, job.reader, WRITER, remote=True)
    own = join_url(job.root, remote_index_name([r[0] for r in rows], job.reader))
    if index is not None and is_url(str(index)) and str(index) != own:
        storage.write_bytes(str(index), doc)
    elif index is not None and not is_url(str(index)):
        atomic_write(Path(index), lambda f: f.write(doc))
    storage.write_bytes(own, doc)
    work = join_url(job.root, WORK_DIR)
    markers = [e["name"] for e in _listing(storage, work)]
    ours = _own_markers(job, markers)
    if len(ours) < len(markers):  # another write's markers stay: it is unfinished
        for url in [join_url(work, name) for name in ours]:
            storage.call("removing", url, functools.partial(storage.fs.rm, url))
    elif markers:
        storage.call("removing", work, lambda: storage.fs.rm(work, recursive=True))
    return [join_url(job.root, r[0]) for r in rows]
