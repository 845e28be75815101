"""A static file server on localhost for https://-style shard tests (no network).

Python's ``http.server`` ignores ``Range:`` headers (it always answers 200 with
the whole file). :class:`LocalHTTP` serves a folder from a thread with a
handler that honours single ``bytes=a-b`` ranges (206 + ``Content-Range``), or
ignores them like the stock server (``ranges=False``), so both behaviours of a
real web server can be tested. Every request is logged (method, path, range)
so tests can count what was fetched.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import threading
from pathlib import Path
from typing import Any

__all__ = ["LocalHTTP"]

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class _Handler(http.server.SimpleHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: requests are recorded in server.requests instead

    def send_head(self) -> Any:
        self.server.requests.append((self.command, self.path, self.headers.get("Range")))
        path = Path(self.translate_path(self.path))
        self._served = path if path.is_file() else None
        spec = self.headers.get("Range")
        if not self.server.ranges or spec is None or not path.is_file():
            return super().send_head()
        match = _RANGE.match(spec.strip())
        size = path.stat().st_size
        if match is None:
            self.send_error(416)
            return None
        first, last = match.groups()
        if first == "":  # a suffix: the last N bytes
            start, end = max(size - int(last), 0), size - 1
        else:
            start, end = int(first), (int(last) if last else size - 1)
        end = min(end, size - 1)
        if start >= size or start > end:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.end_headers()
            return None
        f = open(path, "rb")  # noqa: SIM115 - copyfile reads it, then it is closed
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        return _Limited(f, end - start + 1)

    def end_headers(self) -> None:
        served = getattr(self, "_served", None)
        if self.server.etags and served is not None:
            stat = served.stat()  # a strong ETag, as object stores give: versions ranged reads
            self.send_header("ETag", f'"v{stat.st_mtime_ns}-{stat.st_size}"')
        super().end_headers()


class _Limited:
    """A file object that reads at most ``left`` bytes (what copyfile sends)."""

    def __init__(self, f: Any, left: int) -> None:
        self.f, self.left = f, left

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data: bytes = self.f.read(n)
        self.left -= len(data)
        return data

    def close(self) -> None:
        self.f.close()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    ranges: bool
    etags: bool
    requests: list[tuple[str, str, str | None]]


class LocalHTTP:
    """Serve ``root`` on ``http://127.0.0.1:<free port>`` from a background thread; with
    ``etags``, every file answer has a strong ETag (as object stores give), else only the
    ``Last-Modified`` of Python's ``http.server`` (whole seconds).

    Example::

        with LocalHTTP(folder) as http:
            url = http.url + "/shards/"
    """

    def __init__(
        self, root: str | os.PathLike[str], *, ranges: bool = True, etags: bool = False
    ) -> None:
        root = str(root)

        def handler(*args: Any, **kwargs: Any) -> _Handler:
            return _Handler(*args, directory=root, **kwargs)

        self.server = _Server(("127.0.0.1", 0), handler)
        self.server.ranges, self.server.etags = ranges, etags
        self.server.requests = []
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def requests(self) -> list[tuple[str, str, str | None]]:
        """``(method, path, Range header)`` of every request so far."""
        return self.server.requests

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> LocalHTTP:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
