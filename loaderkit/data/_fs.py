"""Object storage through fsspec: listing, atomic downloads, uploads, retries (private)."""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from loaderkit._atomic import temp_path
from loaderkit.errors import (
    MissingDependencyError,
    MissingShardError,
    ShardChangedError,
    ShardError,
    require,
)

REMOTE_EXTRA = ".[remote]"  # from the loaderkit clone: not on PyPI
# The package behind each protocol fsspec itself does not implement.
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs"}
_PACKAGES |= {"abfs": "adlfs", "hf": "huggingface_hub"}
_CHUNK = 8 << 20  # bytes copied per read while downloading
DEFAULT_TIMEOUT_S = 120.0
# First found wins; new keys go last, so versions cached under the earlier ones stay valid.
_VERSION_KEYS = (
    *("ETag", "etag", "md5", "sha", "LastModified", "last_modified"),
    *("mtime", "updated", "created", "VersionId", "version_id", "generation"),
    *("Content-MD5", "blob_id", "Last-Modified"),  # HTTP headers; huggingface_hub's git blob
)
_MAX_BACKOFF_S = 30.0
# Errors that say the request itself is wrong: retrying cannot help.
_PERMANENT: tuple[type[Exception], ...] = (ImportError, TypeError, NotImplementedError)
_PERMANENT += (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError)
_PERMANENT += (NotADirectoryError,)

T = TypeVar("T")


def is_url(value: Any) -> bool:
    """Whether ``value`` names a shard folder or file by URL (``s3://...``, ``https://...``)."""
    return isinstance(value, str) and "://" in value and not value.startswith("file://")


def refuse_file_url(owner: str, name: str, value: Any) -> None:
    """Refuse a local path that names another place than meant: a ``file://`` URL, one
    starting ``~`` or a URL that pathlib collapsed (``Path("s3://b") / "x"``)."""
    text = os.fspath(value) if isinstance(value, str | os.PathLike) else ""
    if text.startswith("file://"):
        why, fix = "is a file:// URL", f"pass the local path {text[len('file://') :]!r}"
    elif text != os.path.expanduser(text) and not os.path.exists(text):  # "~/x", not "./~x"
        why, fix = "starts with '~', not expanded", f"pass os.path.expanduser({text!r})"
        fix += f", or './{text}' for the folder '~' here" if os.path.isdir("~") else ""
    elif isinstance(value, os.PathLike) and re.match(r"[A-Za-z][\w+.-]+:/[^/]", text):
        why, fix = "is a URL that pathlib collapsed ('://' became ':/')", "pass the URL as a str"
    else:
        return
    raise ValueError(f"{owner}: {name}={text!r} {why}; {fix}.")


def join_url(root: str, name: str) -> str:
    """``root/name`` with exactly one slash between them."""
    return f"{root.rstrip('/')}/{name}"


def url_name(url: str) -> str:
    """The last part of a URL's path (its object's file name)."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def source_name(data: str | Sequence[str]) -> str:
    """A dataset's name in a mix: its folder's name, else its files' (with a checksum)."""
    if isinstance(data, str):
        return url_name(data)
    names = ["/".join(str(f).rstrip("/").rsplit("/", 2)[-2:]) for f in data]
    if len(names) == 1:
        return names[0]
    crc = zlib.crc32("\n".join(names).encode())
    return f"{names[0]} .. {names[-1]} ({len(names)} files, crc {crc:08x})"


class Storage:
    """One remote location (its fsspec filesystem) and the retries and deadline of each call."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retries: int = 5,
        backoff_s: float = 0.5,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        again: str = "",
    ) -> None:
        self.protocol = url.split("://", 1)[0].lower()
        self.again = again  # the fix once retries gave up (default: RemoteCache's knob)
        self.storage_options = dict(storage_options or {})
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.on_retry: Callable[[], None] | None = None  # the remote cache counts retries
        self._fs: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fs"], state["_pid"] = None, -1
        return state

    @property
    def fs(self) -> Any:
        """This process's fsspec filesystem (made on first use, again after a fork)."""
        if self._fs is None or self._pid != os.getpid():
            fsspec = require("fsspec", "reading or writing shards at a URL needs", "remote")
            try:
                # A cached instance may be the parent process's, with its event loop.
                self._fs = fsspec.filesystem(
                    self.protocol, skip_instance_cache=True, **self.storage_options
                )
            except ImportError as exc:
                package = _PACKAGES.get(self.protocol, "the package fsspec names")
                raise MissingDependencyError(
                    f"{self.protocol}:// URLs need {package}, which is not installed ({exc}); "
                    f"install it: pip install '{REMOTE_EXTRA}' in the loaderkit clone, or "
                    f"pip install {package}."
                ) from exc
            except ValueError as exc:
                fix = "an s3://, gs://, https://, hf:// ... URL that fsspec knows, or a local path"
                if "::" in self.protocol:  # filecache::s3://...: loaderkit caches itself
                    fix = "the URL after the last '::' (loaderkit caches what it reads)"
                raise ValueError(
                    f"no filesystem for {self.protocol}:// URLs ({exc}); pass {fix}."
                ) from exc
            self._pid = os.getpid()
        return self._fs

    def key(self, url: str) -> str | None:
        """``url``'s object on this store whatever its spelling (``s3a://``, ``memory:///``);
        None for a URL on another store."""
        import fsspec.core

        protocol, rest = url.split("://", 1)
        protocol = protocol.lower()
        if protocol != self.protocol:
            try:
                if fsspec.get_filesystem_class(protocol) is not type(self.fs):
                    return None
            except (ValueError, ImportError):  # unknown, or its package is missing: another
                return None
        else:
            self.fs  # noqa: B018 - names a missing package for this store's own protocol
        return str(fsspec.core.strip_protocol(f"{protocol}://{rest}")).lstrip("/")

    def bounded(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """``fn()`` in a helper thread (a stuck client cannot be interrupted), given up after
        ``timeout`` (default ``timeout_s``) seconds with a :class:`TimeoutError`."""
        out: list[Any] = []
        done = threading.Event()

        def run() -> None:
            try:
                out.append((True, fn()))
            except BaseException as exc:  # handed to the caller
                out.append((False, exc))
            finally:
                done.set()

        threading.Thread(target=run, name="loaderkit-remote-call", daemon=True).start()
        if not done.wait(self.timeout_s if timeout is None else max(timeout, 0.0)):
            raise _NoAnswer(f"no answer within timeout_s={self.timeout_s} s")
        ok, value = out[0]
        if not ok:
            raise value
        return value

    def call(
        self,
        what: str,
        url: str,
        fn: Callable[[], T],
        *,
        bounded: bool = True,
        expect: tuple[int, str] | None = None,
    ) -> T:
        """``fn()``, retried with backoff on transient errors (``bounded``: within one
        ``timeout_s``; not once the object is no longer ``expect``); errors name ``url``."""
        _ = self.fs  # an unknown protocol is refused at once, not retried as the network
        start, attempt = time.monotonic(), 0
        while True:
            try:
                if not bounded:
                    return fn()
                return self.bounded(fn, self.timeout_s - (time.monotonic() - start))
            except (MissingDependencyError, ShardError, RangesUnsupported):
                raise
            except Exception as exc:
                final = _permanent(what, url, exc)
                if final is None and expect is not None and not isinstance(exc, _NoAnswer):
                    final = self._changed(url, expect)
                if final is not None:
                    raise final from exc
                wait = min(self.backoff_s * 2**attempt, _MAX_BACKOFF_S)
                # A read that got no answer spent its deadline (a download's reads each have one).
                late = isinstance(exc, _NoAnswer) or (
                    bounded and time.monotonic() - start + wait >= self.timeout_s
                )
                if attempt >= self.retries or late:
                    raise self._gave_up(what, url, attempt, exc) from exc
                time.sleep(wait)
                attempt += 1
                if self.on_retry is not None:
                    self.on_retry()

    def _gave_up(self, what: str, url: str, attempt: int, exc: Exception) -> ShardError:
        if isinstance(exc, _NoAnswer):
            how = f"got no answer within timeout_s={self.timeout_s} s ({attempt + 1} attempt(s))"
        else:
            how = f"failed {attempt + 1} time(s), the last with {type(exc).__name__}: {exc}"
        knob = "timeout_s" if isinstance(exc, _NoAnswer) else "retries"
        again = self.again or f"raise RemoteCache({knob}=...)"
        return ShardError(
            f"{what} {url!r} {how}; check the endpoint and the network (storage_options=), or "
            f"{again}.",
            path=url,
        )

    def identity(self, url: str) -> tuple[int, str]:
        """The object's ``(size, version)`` now, as the store gives it (not from a cache)."""
        self.fs.invalidate_cache(url)
        info = self.fs.info(url)
        return int(info.get("size") or 0), version_of(info)

    def check_same(self, url: str, expect: tuple[int, str]) -> None:
        """Raise :class:`ShardChangedError` unless the object is still ``expect``."""
        now = self.identity(url)
        if now != expect:
            raise _changed_error(url, expect, now)

    def _changed(self, url: str, expect: tuple[int, str]) -> ShardChangedError | None:
        """The error for an object no longer ``expect``; None if it is, or cannot be looked up."""
        try:
            now = self.bounded(lambda: self.identity(url))
        except Exception:
            return None
        return None if now == expect else _changed_error(url, expect, now)

    def entries(self, url: str) -> tuple[list[dict[str, Any]], set[str]]:
        """The files directly under folder ``url`` (``{"name", "size", "version"}``), subfolders."""

        def ls() -> list[dict[str, Any]]:
            self.fs.invalidate_cache()  # a listing must see what is there now
            return list(self.fs.ls(url, detail=True))

        out, folders = [], set()
        for entry in self.call("listing", url, ls):
            if entry.get("type", "file") != "file":
                folders.add(url_name(str(entry["name"])))
                continue
            if entry.get("size") is None:
                # An https:// folder page lists names only: ask each file (a HEAD).
                name = str(entry["name"])
                info: dict[str, Any] = self.call("looking up", name, partial(self.fs.info, name))
                entry = {**entry, **info}
            size = entry.get("size")  # None: a dynamic server's chunked answer
            name, size = url_name(str(entry["name"])), None if size is None else int(size)
            out.append({"name": name, "size": size, "version": version_of(entry)})
        return out, folders

    def files_under(self, url: str) -> list[str]:
        """The paths of every file below folder ``url``, at any depth."""
        return [str(f) for f in self.call("listing", url, lambda: self.fs.find(url))]

    def is_dir(self, url: str) -> bool:
        """Whether ``url`` is a folder (a prefix with objects under it)."""
        return bool(self.call("looking up", url, lambda: self.fs.isdir(url)))

    def exists(self, url: str) -> bool:
        """Whether an object exists at ``url``."""
        return bool(self.call("looking up", url, lambda: self.fs.exists(url)))

    def read_bytes(self, url: str, expect: tuple[int, str] | None = None) -> bytes:
        """The whole object at ``url``, checked to be still ``expect`` (size, version)."""

        def cat() -> bytes:
            data = bytes(self.fs.cat_file(url))
            if expect is not None:
                if len(data) != expect[0]:
                    raise OSError(f"the read ended after {len(data)} of {expect[0]} bytes")
                self.check_same(url, expect)
            return data

        return self.call("reading", url, cat, expect=expect)

    def read_ranges(
        self, url: str, spans: list[tuple[int, int]], size: int, version: str | None = None
    ) -> list[bytes]:
        """The bytes of each ``[start, end)`` span of ``url``; :class:`RangesUnsupported`."""
        expect = None if version is None else (size, version)

        def cat() -> list[bytes]:
            starts, ends = [a for a, _ in spans], [b for _, b in spans]
            got = self.fs.cat_ranges([url] * len(spans), starts, ends, on_error="raise")
            for (start, end), data in zip(spans, got, strict=True):
                if isinstance(data, BaseException):
                    raise data
                if len(data) != end - start:
                    if len(data) == size and end - start != size:
                        raise RangesUnsupported(url)
                    raise OSError(
                        f"a range read of bytes [{start}, {end}) returned {len(data)} bytes"
                    )
            if expect is not None:
                self.check_same(url, expect)
            return [bytes(d) for d in got]

        return self.call("reading a range of", url, cat, expect=expect)

    def write_bytes(self, url: str, data: bytes) -> None:
        """Write ``data`` as the object ``url`` (one PUT: atomic on object stores)."""
        self.call("writing", url, lambda: self.fs.pipe_file(url, data))

    def upload(self, local: Path, url: str) -> None:
        """Copy the local file ``local`` to ``url`` (no deadline: shards may be large)."""
        self.call("uploading to", url, lambda: self.fs.put_file(str(local), url), bounded=False)

    def download(
        self,
        url: str,
        target: Path,
        size: int,
        check: Callable[[Path], None] | None = None,
        version: str | None = None,
    ) -> None:
        """Copy ``url`` to ``target`` (complete or not at all), checked; retried."""
        expect = None if version is None else (size, version)

        def get() -> None:
            tmp = temp_path(target)
            # One streamed GET over http(s): fsspec's blocks are ranged GETs, which a server
            # that ignores Range (python's http.server) answers whole, and fsspec refuses.
            stream = {"block_size": 0} if self.protocol in ("http", "https") else {}
            src = self.bounded(lambda: self.fs.open(url, "rb", **stream))
            try:
                with open(tmp, "wb") as dst:
                    while chunk := self.bounded(partial(src.read, _CHUNK)):
                        dst.write(chunk)
                got = tmp.stat().st_size
                if got != size:
                    raise OSError(f"the download ended after {got} of {size} bytes")
                if expect is not None:
                    self.bounded(lambda: self.check_same(url, expect))
                if check is not None:
                    check(tmp)
                os.replace(tmp, target)
            finally:
                with contextlib.suppress(Exception):
                    src.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

        self.call("downloading", url, get, bounded=False, expect=expect)


def _permanent(what: str, url: str, exc: Exception) -> ShardError | None:
    """The error for a failure that retrying cannot help, or None for a transient one."""
    if isinstance(exc, FileNotFoundError) and what in ("writing", "uploading to"):
        return ShardError(
            f"{what} {url!r}: its folder or bucket does not exist ({exc}); create it (on a "
            "local or sftp filesystem, storage_options={'auto_mkdir': True} does).",
            path=url,
        )
    if isinstance(exc, FileNotFoundError):
        return MissingShardError(
            f"{what} {url!r}: the object does not exist ({exc}); check the URL, or "
            "upload it (write_shards(url, ...) writes shards and their index).",
            path=url,
        )
    if isinstance(exc, PermissionError):
        return ShardError(
            f"{what} {url!r}: permission denied ({exc}); check the credentials "
            "(storage_options=, or the provider's environment variables).",
            path=url,
        )
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        return ShardError(
            f"{what} {url!r}: the disk it is written to is full or read-only ({exc}); free "
            "space there (a download's: RemoteCache(cache_dir=), or max_bytes= below its room).",
            path=url,
        )
    if isinstance(exc, _PERMANENT):
        return ShardError(
            f"{what} {url!r} failed with {type(exc).__name__}: {exc}; check the URL "
            "and storage_options.",
            path=url,
        )
    status = getattr(exc, "status", None)
    # 4xx but timeouts and rate limits, and 501: the request itself is wrong.
    if isinstance(status, int) and (
        (400 <= status < 500 and status not in (408, 425, 429)) or status == 501
    ):
        return ShardError(
            f"{what} {url!r} was refused with HTTP status {status} ({exc}); check the URL, "
            "and that the server allows this request.",
            path=url,
        )
    return None


def _changed_error(url: str, expect: tuple[int, str], now: tuple[int, str]) -> ShardChangedError:
    return ShardChangedError(
        f"shard {url!r} changed after the dataset listed it (now {now[0]} bytes, version "
        f"{now[1]!r}; listed: {expect[0]} bytes, version {expect[1]!r}); make the dataset "
        "again to read the current version.",
        path=url,
    )


class _NoAnswer(TimeoutError):
    """A remote call did not return within its deadline (transient: retried)."""


class RangesUnsupported(Exception):
    """The server answered a range request with the whole object (it ignores ``Range:``)."""


def version_of(entry: dict[str, Any]) -> str:
    """What identifies one version of an object in a listing: its ETag, else its mtime."""
    for key in _VERSION_KEYS:
        value = entry.get(key)
        if isinstance(value, datetime.datetime):
            # A listing and a lookup may spell one time as a timestamp and as a datetime.
            value = value.timestamp()
        if value not in (None, ""):
            return str(value).strip('"')
    return ""
