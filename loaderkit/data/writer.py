"""Writing shards: in parallel processes, resumable after a crash, to a folder or a URL.

:func:`write_shards` writes one file per item of ``shards`` (or per
``fn(item)``), counts it, compresses and hashes it as asked, and writes the
shard index last, so an index in a folder always means its shards are there;
the index says ``write_shards`` wrote it, so a shard file it does not list is
refused as a stray (:func:`loaderkit.data.index.check_complete`).

Each shard is written under a hidden staging folder of the target
(``<directory>/.loaderkit-write/staging/``, the same filesystem) and moved
into place sidecars first, shard last; then a small *done marker*
(``.loaderkit-write/<name>.json``) records what was written: the settings key
(reader spec, names, codec, ``fn``), a fingerprint of the input when ``fn`` is
given, and the file's size, mtime, sample count and extras. A re-run of the
same call skips every shard whose marker matches its settings and whose file
still has the recorded size and mtime; anything else is written again. A shard
cut short by ``kill -9`` never has a marker, so it never counts. At a URL the
same holds with uploads (one PUT per object, atomic on object stores): the
sidecars, the shard, then the marker object. Once the index is written the
markers are deleted (the index now vouches for the shards): a second call
after a complete one writes everything again.

Files do not depend on ``num_workers``: shard ``i`` is always named
``{prefix}-{i:05d}{suffix}`` and written by the same code; only who writes it
changes.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import functools
import hashlib
import json
import multiprocessing
import os
import pickle
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loaderkit._atomic import atomic_write
from loaderkit._checks import check_bool, check_int
from loaderkit.data._codec import (
    ZSTD_SUFFIX,
    check_compression,
    check_hash,
    compress_file,
    file_digest,
)
from loaderkit.data._fs import Storage, is_url, join_url
from loaderkit.data.index import (
    WORK_DIR,
    WRITER,
    build_index,
    default_index_path,
    index_names,
    is_index_name,
    remote_index_doc,
    remote_index_name,
)
from loaderkit.data.readers import OWN_SUFFIXES
from loaderkit.errors import ShardError

__all__ = ["write_shards"]

MARKER_VERSION = 1


# ------------------------------------------------------------------ one shard
def _write_one(
    reader: Any, target: Path, data: Any, compression: str | None, level: int, algo: str | None
) -> tuple[Path, int, dict[str, Any] | None]:
    """Write one shard (compressed and hashed as asked): its final path, samples, extras."""
    path = Path(reader.write(target, data))
    samples = reader.count(path)  # also writes any sidecar the reader needs
    extras: dict[str, Any] = {}
    if compression is not None:
        packed = path.with_name(path.name + ZSTD_SUFFIX)
        compress_file(path, packed, level)
        extras.update(compression=compression, raw_size=path.stat().st_size)
        # Sidecars follow the compressed file's name, so listings attach them to it.
        for side in sorted(path.parent.glob(f"{path.name}*")):
            if side.name != path.name and side.name.endswith(OWN_SUFFIXES):
                side.replace(packed.with_name(packed.name + side.name[len(path.name) :]))
        path.unlink()
        path = packed
    if algo is not None:
        extras["hash"] = file_digest(path, algo)
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 0:
        raise TypeError(
            f"{type(reader).__name__}.count({str(path)!r}) returned {samples!r}; it must "
            "return the shard's number of samples as an int >= 0."
        )
    return path, samples, extras or None


@dataclass(frozen=True)
class _Job:
    """Everything a process needs to write shards (pickled once per task; small)."""

    reader: Any
    fn: Callable[[Any], Any] | None
    prefix: str
    ext: str
    codec: tuple[str | None, int, str | None]
    key: str
    root: str  # a local folder or a URL
    storage: Storage | None

    def name(self, i: int) -> str:
        return f"{self.prefix}-{i:05d}{self.ext}"

    def marker_doc(self, i: int, fp: str | None, **fields: Any) -> bytes:
        doc = {"version": MARKER_VERSION, "shard": i, "key": self.key, "input": fp, **fields}
        return json.dumps(doc, sort_keys=True).encode()


def _run_shard(job: _Job, i: int, item: Any, fp: str | None) -> tuple[int, str, int, Any]:
    """Write shard ``i`` from ``item`` (or ``fn(item)``): ``(i, name, samples, extras)``."""
    data = job.fn(item) if job.fn is not None else item
    if job.storage is None:
        return _run_local(job, i, data, fp)
    return _run_remote(job, i, data, fp)


def _run_local(job: _Job, i: int, data: Any, fp: str | None) -> tuple[int, str, int, Any]:
    root = Path(job.root)
    stage = Path(tempfile.mkdtemp(prefix=f"{i:05d}-", dir=root / WORK_DIR / "staging"))
    try:
        path, samples, extras = _write_one(job.reader, stage / job.name(i), data, *job.codec)
        # Sidecars first, the shard last: a shard in place has its sidecars.
        sides = sorted(p for p in stage.iterdir() if p != path)
        for side in sides:
            os.replace(side, root / side.name)
        final = root / path.name
        os.replace(path, final)
        st = final.stat()
        doc = job.marker_doc(
            i,
            fp,
            name=final.name,
            size=st.st_size,
            mtime_ns=st.st_mtime_ns,
            samples=samples,
            extras=extras,
            sidecars={s.name: (root / s.name).stat().st_size for s in sides},
        )
        atomic_write(root / WORK_DIR / f"{job.name(i)}.json", lambda f: f.write(doc))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return i, final.name, samples, extras


def _run_remote(job: _Job, i: int, data: Any, fp: str | None) -> tuple[int, str, int, Any]:
    assert job.storage is not None
    storage = job.storage
    with tempfile.TemporaryDirectory(prefix=".loaderkit-upload-") as staging:
        local, samples, extras = _write_one(
            job.reader, Path(staging) / job.name(i), data, *job.codec
        )
        sides = {p.name: p.stat().st_size for p in Path(staging).iterdir() if p != local}
        for side in sorted(sides):
            storage.upload(Path(staging) / side, join_url(job.root, side))
        size = local.stat().st_size
        storage.upload(local, join_url(job.root, local.name))
    doc = job.marker_doc(
        i,
        fp,
        name=local.name,
        size=size,
        samples=samples,
        extras=extras,
        sidecars=sides,
    )
    storage.write_bytes(join_url(job.root, f"{WORK_DIR}/{job.name(i)}.json"), doc)
    return i, local.name, samples, extras


# ------------------------------------------------------------------ resuming
def _settings_key(
    reader: Any, fn: Any, prefix: str, ext: str, codec: tuple[str | None, int, str | None]
) -> str:
    fn_name = None if fn is None else f"{getattr(fn, '__module__', '')}.{_qualname(fn)}"
    blob = json.dumps(
        {
            "reader": reader.spec(),
            "fn": fn_name,
            "fn_code": _code_digest(fn),
            "prefix": prefix,
            "ext": ext,
            "codec": codec,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _code_digest(fn: Any) -> str | None:
    """A digest of ``fn``'s code (bytecode and constants, through a partial's function):
    a bug fixed in ``fn`` after an interrupted run rewrites every shard, not only the rest."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    if code is None:  # a callable object: its __call__ method's code
        code = getattr(vars(type(fn)).get("__call__"), "__code__", None)
    if code is None:
        return None
    return hashlib.sha256(code.co_code + repr(code.co_consts).encode()).hexdigest()[:16]


def _qualname(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", type(fn).__qualname__))


def _fingerprint(item: Any) -> str | None:
    """A digest of an input to ``fn`` (inputs are small: paths, ids, ranges); None if it
    does not pickle (then a re-run trusts the settings alone)."""
    try:
        blob = pickle.dumps(item, protocol=4)
    except Exception:
        return None
    return hashlib.sha256(blob).hexdigest()[:32]


def _done_local(job: _Job, i: int, fp: str | None) -> tuple[str, int, Any] | None:
    """``(name, samples, extras)`` of shard ``i`` if a previous run completed it, else None."""
    root = Path(job.root)
    try:
        doc = json.loads((root / WORK_DIR / f"{job.name(i)}.json").read_text())
        if doc["version"] != MARKER_VERSION or doc["key"] != job.key or doc["input"] != fp:
            return None
        st = (root / doc["name"]).stat()
        if st.st_size != doc["size"] or st.st_mtime_ns != doc["mtime_ns"]:
            return None
        for side, size in doc["sidecars"].items():
            if (root / side).stat().st_size != size:
                return None
        return str(doc["name"]), int(doc["samples"]), doc["extras"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _RemoteDone:
    """Which shards at a URL a previous run completed: one listing, one GET per marker."""

    def __init__(self, job: _Job) -> None:
        assert job.storage is not None
        self.job = job
        self.sizes = {e["name"]: e["size"] for e in _listing(job.storage, job.root)}
        work = join_url(job.root, WORK_DIR)
        self.markers = {e["name"] for e in _listing(job.storage, work)}

    def __call__(self, i: int, fp: str | None) -> tuple[str, int, Any] | None:
        job = self.job
        assert job.storage is not None
        marker = f"{job.name(i)}.json"
        if marker not in self.markers:
            return None
        try:
            doc = json.loads(job.storage.read_bytes(join_url(job.root, f"{WORK_DIR}/{marker}")))
            if doc["version"] != MARKER_VERSION or doc["key"] != job.key or doc["input"] != fp:
                return None
            for name, size in [(doc["name"], doc["size"]), *doc["sidecars"].items()]:
                if self.sizes.get(name) != size:
                    return None
            return str(doc["name"]), int(doc["samples"]), doc["extras"]
        except (ShardError, ValueError, KeyError, TypeError):
            return None


def _listing(storage: Storage, url: str) -> list[dict[str, Any]]:
    try:
        return storage.listing(url)
    except ShardError:  # MissingShardError: no such folder yet
        return []


# ------------------------------------------------------------------ progress
class _Progress:
    """tqdm's bar when tqdm is installed (it comes with lightning), else a stderr line."""

    def __init__(self, enabled: bool, total: int | None) -> None:
        self.done = self.skipped = 0
        self.total = total
        self.bar: Any = None
        self.enabled = enabled
        self.last = 0.0
        if not enabled:
            return
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return
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


# ------------------------------------------------------------------ the pool
def _context(mp_context: Any) -> Any:
    """How writer processes start (see :func:`write_shards`, ``mp_context``)."""
    if mp_context is None:
        methods = multiprocessing.get_all_start_methods()
        if "forkserver" not in methods:
            return multiprocessing.get_context("spawn")
        ctx = multiprocessing.get_context("forkserver")
        # The same preload as the loader's workers: one server for both. "__main__" lets
        # the writers unpickle an fn defined in the script.
        ctx.set_forkserver_preload(["__main__", "torch", "loaderkit"])
        return ctx
    if isinstance(mp_context, str):
        if mp_context not in multiprocessing.get_all_start_methods():
            raise ValueError(
                f"write_shards: mp_context={mp_context!r} is not a start method here; pass "
                f"one of {multiprocessing.get_all_start_methods()}, or None for the default."
            )
        return multiprocessing.get_context(mp_context)
    if not hasattr(mp_context, "Process"):
        raise TypeError(
            f"write_shards: mp_context must be a start method name or a multiprocessing "
            f"context, got {mp_context!r}; pass e.g. 'spawn' or None for the default."
        )
    return mp_context


def _note(exc: BaseException, i: int, name: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(f"write_shards: raised while writing shard {i} ({name})")


def _write_all(
    job: _Job,
    items: Iterable[Any],
    done: Callable[[int, str | None], tuple[str, int, Any] | None] | None,
    num_workers: int,
    mp_context: Any,
    progress: _Progress,
) -> dict[int, tuple[str, int, Any]]:
    """Write every shard not already done; ``{i: (name, samples, extras)}`` for all."""
    results: dict[int, tuple[str, int, Any]] = {}

    def todo() -> Iterator[tuple[int, Any, str | None]]:
        for i, item in enumerate(items):
            fp = _fingerprint(item) if job.fn is not None else None
            prior = done(i, fp) if done is not None else None
            if prior is not None:
                results[i] = prior
                progress.update(skipped=True)
            else:
                yield i, item, fp

    if num_workers == 0:
        for i, item, fp in todo():
            try:
                _, name, samples, extras = _run_shard(job, i, item, fp)
            except Exception as exc:
                _note(exc, i, job.name(i))
                raise
            results[i] = (name, samples, extras)
            progress.update(skipped=False)
        return results

    # At most 2 shards per process in flight: the items (maybe large arrays) are read
    # from ``shards`` only as fast as they are written.
    window = 2 * num_workers
    pool = cf.ProcessPoolExecutor(num_workers, mp_context=_context(mp_context))
    pending: dict[cf.Future[tuple[int, str, int, Any]], int] = {}
    try:
        source = todo()
        exhausted = False
        while pending or not exhausted:
            while not exhausted and len(pending) < window:
                nxt = next(source, None)
                if nxt is None:
                    exhausted = True
                    break
                i, item, fp = nxt
                pending[pool.submit(_run_shard, job, i, item, fp)] = i
            if not pending:
                break
            finished, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            for fut in sorted(finished, key=pending.__getitem__):
                i = pending.pop(fut)
                try:
                    _, name, samples, extras = fut.result()
                except BrokenProcessPool as exc:
                    lost = sorted([i, *pending.values()])
                    raise ShardError(
                        f"write_shards: a writer process died while shards {lost} were being "
                        f"written ({exc}); out of memory? Re-run the same call: the shards "
                        "already written are kept and skipped.",
                        path=job.root,
                    ) from exc
                except Exception as exc:
                    # The worker's traceback is the __cause__ (concurrent.futures keeps it).
                    _note(exc, i, job.name(i))
                    raise
                results[i] = (name, samples, extras)
                progress.update(skipped=False)
    finally:
        for fut in pending:
            fut.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
    return results


# ------------------------------------------------------------------ the API
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
    """Write one file per item of ``shards`` with ``reader.write`` and index them.

    Shards are written in ``num_workers`` processes (or in the caller), each
    atomically, and a re-run of the same call after an interruption (even
    ``kill -9``) writes only the shards that were not finished; the index is
    written last. The files and the index are the same for any ``num_workers``.

    Args:
        directory: Created if needed; or a folder URL (``s3://bucket/corpus``,
            anything fsspec resolves; needs ``loaderkit[remote]``): each shard is
            written locally, uploaded with its sidecars and deleted, and the
            index is uploaded last. Files named like this write's shards that it
            did not produce (an earlier write of more shards, or in another
            compression) are removed, so the folder read as a whole holds only
            this write's shards.
        shards: One item per shard: token arrays for :class:`TokenReader`,
            iterables of JSON-able samples for :class:`JsonlReader`; with ``fn``,
            the inputs ``fn`` turns into that data. Read lazily, in order.
        reader: A :class:`ShardReader` with a ``write(path, data)`` method.
        suffix: File suffix (default: the reader's first, e.g. ``.npy``).
        prefix: Files are named ``{prefix}-00000{suffix}``, ...
        index: Also write the index here (a path, or a URL for a remote folder),
            besides the folder's own, which is always written: the folder read
            without ``index=`` is checked the same way.
        storage_options: The fsspec filesystem's options for a URL (e.g.
            ``{"endpoint_url": ...}``).
        compression: ``"zstd"``: each shard is compressed whole and named with
            ``.zst`` appended (``shard-00000.bin.zst``); the index records it, so
            every reader reads it with no flag (it is decoded once per machine
            into the local cache, then memory-mapped: :mod:`loaderkit.data._codec`).
            Needs ``loaderkit[zstd]``. Default None: plain files.
        level: The zstd level (default 3; -7 to 22, higher is smaller and slower
            to write; reading speed barely changes).
        hash: ``"sha256"``, ``"blake2b"``, ``"xxh64"``, ``"xxh3_64"`` or
            ``"xxh3_128"`` (the xxh ones need ``loaderkit[zstd]``): each shard
            file's digest is stored in the index and checked the first time a
            machine reads the file (a shard at a URL: after its download, before
            it enters the cache); a mismatch is a :class:`ShardError`.
        fn: Called as ``fn(item)`` for each item of ``shards``, in the writing
            process, to make that shard's data (as litdata's ``optimize(fn,
            inputs)``): pass small inputs (file names, ranges, seeds) and let the
            workers build the large arrays, instead of pickling each array to a
            worker. Must pickle by reference (a module-level function) unless
            ``mp_context="fork"``. A re-run skips a shard only if its input
            pickles to the same bytes as before.
        num_workers: Writer processes (0: write in the caller, one shard at a
            time). Items go to the processes pickled, at most ``2 * num_workers``
            in flight, so a generator of shards is read only as fast as they are
            written.
        mp_context: How the writer processes start: ``None`` (default) for
            ``"forkserver"`` where the platform has it, else ``"spawn"``: a
            writer never inherits the caller's threads (torch's, an fsspec event
            loop) or the locks they hold, as ``fork`` would; the cost is a
            one-off start, and ``reader`` and ``fn`` must pickle (define them at
            module level, and guard the script with ``if __name__ ==
            "__main__":``). ``"fork"`` (POSIX) accepts closures; also a
            multiprocessing context.
        progress: Show a progress bar on stderr (tqdm's; it comes with lightning;
            else a plain line).
        resume: Skip the shards a previous call with the same settings finished
            (their done markers in ``<directory>/.loaderkit-write/`` match, and the
            file has the recorded size and mtime). ``False`` writes every shard.
            Without ``fn``, the data itself is not compared: pass the same
            ``shards`` when re-running, or ``resume=False``.

    Returns:
        The shard paths (URLs for a URL), in order: pass them (or ``directory``) to
        :class:`ShardedDataset`.

    Raises:
        ShardError: A writer process died (the message names the shards in
            flight); what a reader or ``fn`` raises propagates as it is, with
            a note naming the shard (and, from a worker, its traceback as the
            ``__cause__``).

    Example:
        >>> import tempfile
        >>> from loaderkit import JsonlReader, ShardedDataset
        >>> data = [[{"a": 1}], [{"a": 2}, {"a": 3}]]
        >>> paths = write_shards(tempfile.mkdtemp(), data, JsonlReader(), progress=False)
        >>> [p.name for p in paths], ShardedDataset(paths, JsonlReader()).sizes
        (['shard-00000.jsonl', 'shard-00001.jsonl'], (1, 2))
    """
    write = getattr(reader, "write", None)
    if not callable(write):
        raise TypeError(
            f"write_shards: reader {type(reader).__name__} has no write(path, data) method."
        )
    if fn is not None and not callable(fn):
        raise TypeError(
            f"write_shards: fn must be a callable that makes one shard's data from one item "
            f"of shards, got {fn!r}; pass a module-level function, or leave fn out."
        )
    num_workers = check_int(
        "num_workers", num_workers, 0, owner="write_shards", fix="pass 0 to write in the caller"
    )
    progress = check_bool("progress", progress, owner="write_shards")
    resume = check_bool("resume", resume, owner="write_shards")
    if num_workers > 0:
        _context(mp_context)  # a bad mp_context is named before anything is written
    elif mp_context is not None:
        raise ValueError(
            f"write_shards: mp_context={mp_context!r} needs num_workers >= 1 (with 0 the "
            "shards are written in the caller); pass num_workers=, or leave mp_context out."
        )
    ext = suffix if suffix is not None else reader.suffixes[0]
    comp, lvl = check_compression(compression, level, "write_shards")
    codec = (comp, lvl, check_hash(hash, "write_shards"))
    key = _settings_key(reader, fn, prefix, ext, codec)
    total = len(shards) if hasattr(shards, "__len__") else None  # type: ignore[arg-type]
    if is_url(directory):
        url = str(directory).rstrip("/")
        storage = Storage(url, storage_options)
        job = _Job(reader, fn, prefix, ext, codec, key, url, storage)
        remote_done = _RemoteDone(job) if resume else None
        bar = _Progress(progress, total)
        try:
            results = _write_all(job, shards, remote_done, num_workers, mp_context, bar)
        finally:
            bar.close()
        return _index_remote(job, results, index)
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
    # One writer per folder: a killed run's staging files are garbage now.
    shutil.rmtree(root / WORK_DIR / "staging", ignore_errors=True)
    (root / WORK_DIR / "staging").mkdir(parents=True, exist_ok=True)
    job = _Job(reader, fn, prefix, ext, codec, key, str(root), None)
    local_done = (lambda i, fp: _done_local(job, i, fp)) if resume else None
    bar = _Progress(progress, total)
    try:
        results = _write_all(job, shards, local_done, num_workers, mp_context, bar)
    finally:
        bar.close()
    if not results:
        raise ValueError("write_shards: shards is empty; pass at least one shard's data.")
    written = [results[i][0] for i in results]
    names = [p.name for p in root.iterdir()]
    indexes = {n: _read_or_none(root / n) for n in names if is_index_name(n)}
    for stale in _stale(job, names, written) + _stale_indexes(job, indexes, written):
        # An earlier write of more shards: listing the folder would read them too, and its
        # index would say this write's folder lacks them.
        with contextlib.suppress(FileNotFoundError):
            (root / stale).unlink()
    known = {root / results[i][0]: (results[i][1], results[i][2]) for i in sorted(results)}
    paths = list(known)
    own = default_index_path(paths, reader)
    # The folder's own index in any case: read without index=, the folder is checked too.
    for target in [own] if index is None or Path(index) == own else [Path(index), own]:
        build_index(paths, reader, target, known=known, written_by=WRITER)
    # The index now says the shards are complete; the markers only served a resume.
    shutil.rmtree(root / WORK_DIR, ignore_errors=True)
    return paths


def _named_like(job: _Job) -> re.Pattern[str]:
    """Names of this write's shards (any number, any compression) and their sidecars."""
    return re.compile(rf"{re.escape(job.prefix)}-\d{{5,}}{re.escape(job.ext)}(\..*)?")


def _stale(job: _Job, names: list[str], written: list[str]) -> list[str]:
    """The shard files (and sidecars) of this prefix among ``names`` that this write did not
    produce: left by an earlier write of more shards, or in another compression."""
    pattern = _named_like(job)
    ours = set(written)

    def produced(name: str) -> bool:
        if name in ours:
            return True
        return name.endswith(OWN_SUFFIXES) and any(name.startswith(w + ".") for w in ours)

    return [n for n in names if pattern.fullmatch(n) and not produced(n)]


def _stale_indexes(job: _Job, indexes: dict[str, bytes | None], written: list[str]) -> list[str]:
    """The index files among ``indexes`` (name: document) that list shards of this prefix that
    this write did not produce (an earlier write's index)."""
    pattern = _named_like(job)
    ours = set(written)
    return [
        name
        for name, doc in indexes.items()
        if doc is not None
        and any(pattern.fullmatch(n) and n not in ours for n in index_names(doc) or ())
    ]


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def _index_remote(
    job: _Job, results: dict[int, tuple[str, int, Any]], index: str | os.PathLike[str] | None
) -> list[str]:
    """Upload the index of the shards written at a URL (last: it implies they are there)."""
    assert job.storage is not None
    if not results:
        raise ValueError("write_shards: shards is empty; pass at least one shard's data.")
    listed = {entry["name"]: entry for entry in job.storage.listing(job.root)}
    storage = job.storage
    written = [results[i][0] for i in results]
    indexes: dict[str, bytes | None] = {
        n: storage.read_bytes(join_url(job.root, n)) for n in listed if is_index_name(n)
    }
    for stale in _stale(job, list(listed), written) + _stale_indexes(job, indexes, written):
        url = join_url(job.root, stale)
        storage.call("removing", url, functools.partial(storage.fs.rm, url))
    rows: list[list[Any]] = []
    for i in sorted(results):
        name, samples, extras = results[i]
        entry = listed[name]
        rows.append([name, entry["size"], entry["version"], int(samples)])
        if extras:
            rows[-1].append(extras)
    doc = remote_index_doc(rows, job.reader, WRITER)
    own = join_url(job.root, remote_index_name([r[0] for r in rows], job.reader))
    if index is not None and is_url(str(index)) and str(index) != own:
        job.storage.write_bytes(str(index), doc)
    elif index is not None and not is_url(str(index)):
        atomic_write(Path(index), lambda f: f.write(doc))
    job.storage.write_bytes(own, doc)  # in any case: the folder read without index= is checked
    work = join_url(job.root, WORK_DIR)
    if _listing(storage, work):  # the index says the shards are complete: markers are done
        storage.call("removing", work, lambda: storage.fs.rm(work, recursive=True))
    return [join_url(job.root, r[0]) for r in rows]
