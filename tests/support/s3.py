"""A real S3-compatible server on localhost: moto's standalone server in a subprocess.

Not a mock of the client: s3fs and botocore talk HTTP to it exactly as to AWS
(listing, ranged GETs, multipart uploads, ETags). It runs in its own process,
so a training process under test (and its forked workers) never shares a GIL
or a lock with it, and a ``kill -9`` of the trainer leaves it serving.

Credentials are dummies and the endpoint is ``http://127.0.0.1:<port>``: no
request leaves the machine. :meth:`LocalS3.env` gives the same settings as
environment variables (botocore reads ``AWS_ENDPOINT_URL``), for scripts.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["LocalS3", "free_port", "serve"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalS3:
    """``python -m moto.server`` on a free localhost port, with one bucket.

    Example::

        with LocalS3() as s3:
            url = f"s3://{s3.bucket}/corpus"
            write_shards(url, arrays, reader, storage_options=s3.options)
    """

    def __init__(self, bucket: str = "loaderkit-test", log: Path | None = None) -> None:
        self.bucket = bucket
        self.port = 0
        self.endpoint = ""
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def options(self) -> dict[str, Any]:
        """s3fs storage options for this server."""
        return {
            "endpoint_url": self.endpoint,
            "key": "testing",
            "secret": "testing",
        }

    def env(self) -> dict[str, str]:
        """The same settings as environment variables (for a subprocess)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self, timeout: float = 120.0) -> LocalS3:
        """Start the server and create the bucket; raise if it does not answer in time."""
        for _ in range(5):  # the port may be taken between free_port() and the bind
            self.port = free_port()
            self.endpoint = f"http://127.0.0.1:{self.port}"
            out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env()},
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            if self.proc.poll() is None:
                break
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"moto server did not start on {self.endpoint}")
        import s3fs

        s3fs.S3FileSystem(skip_instance_cache=True, **self.options).mkdir(self.bucket)
        return self

    def stop(self) -> None:
        """Stop the server (its data goes with it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> LocalS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(log_dir: Path) -> Iterator[LocalS3]:
    """A started server, stopped when the generator is closed: the body of a module-scoped
    fixture (``yield from serve(tmp_path_factory.mktemp("moto"))``); skips without s3fs, moto."""
    import pytest

    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    server = LocalS3(log=log_dir / "moto.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()
