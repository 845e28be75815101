"""Lists of shard URLs: each object read once, their count index named by the whole list.

Shards live on fsspec's ``memory://`` filesystem.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from loaderkit import (
    RemoteCache,
    ShardedDataset,
    StreamingShardedDataset,
    TokenReader,
    write_shards,
)

fsspec = pytest.importorskip("fsspec")

READER = TokenReader(seq_len=4, dtype=np.uint16)


@pytest.fixture
def base() -> Iterator[str]:
    url = f"memory://lists-{uuid.uuid4().hex[:8]}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def cache(tmp_path: Path) -> RemoteCache:
    return RemoteCache(cache_dir=tmp_path / "cache", prefetch=0)


@pytest.mark.parametrize("kind", [ShardedDataset, StreamingShardedDataset])
@pytest.mark.parametrize("spelling", ["{}/shard-00000.npy/", "{}//shard-00000.npy"])
def test_one_object_listed_in_two_spellings_is_refused(
    base: str, tmp_path: Path, kind: type, spelling: str
) -> None:
    write_shards(base, [np.arange(8, dtype=np.uint16), np.arange(100, 108, dtype=np.uint16)],
                 READER, progress=False)  # fmt: skip
    urls = [f"{base}/shard-00000.npy", spelling.format(base), f"{base}/shard-00001.npy"]
    with pytest.raises(ValueError, match=r"shard-00000\.npy/?' are one object \(listed twice\)"):
        kind(urls, READER, remote=cache(tmp_path))
