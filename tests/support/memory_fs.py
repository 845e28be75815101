"""A fresh folder on fsspec's in-memory file system per test, and a cache beside it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

from loaderkit import RemoteCache


def memory_folder(prefix: str) -> Iterator[str]:
    """``memory://<prefix>-<random>``, removed afterwards (a fixture's body)."""
    import fsspec

    url = f"memory://{prefix}-{uuid.uuid4().hex[:8]}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def cache(tmp_path: Path) -> RemoteCache:
    """A cache under ``tmp_path`` that fetches nothing ahead."""
    return RemoteCache(cache_dir=tmp_path / "cache", prefetch=0)
