"""Helpers shared by the reliability tests: small datasets, shard folders, state editing.

Module-level classes and functions so DataLoader workers (fork or spawn) can
unpickle them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from loaderkit import JsonlReader, ResumableDataLoader, TokenReader, write_shards


class Faulty(Dataset[int]):
    """Sample ``i`` is ``i``, except sample ``at``, which fails the way ``how`` says."""

    def __init__(self, how: str, at: int, size: int = 40) -> None:
        self.how, self.at, self.size = how, at, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        if index == self.at:
            if self.how == "segfault":
                ctypes.string_at(0)  # reads address 0: SIGSEGV
            elif self.how == "exit":
                os._exit(3)
            elif self.how == "exit0":
                os._exit(0)
            elif self.how == "sigkill":  # what the kernel's OOM killer sends
                os.kill(os.getpid(), signal.SIGKILL)
            elif self.how == "hang":
                time.sleep(120)
            elif self.how == "raise":
                raise KeyError(f"no sample {index}")
        return index


class NoLen:
    """Indexable, but without ``__len__``."""

    def __getitem__(self, index: int) -> int:
        return index


def loader_of(dataset: Any, **kwargs: Any) -> ResumableDataLoader:
    kwargs.setdefault("batch_size", 4)
    kwargs.setdefault("seed", 0)
    return ResumableDataLoader(dataset, **kwargs)


def token_shards(root: Path, sizes: tuple[int, ...] = (40, 24), suffix: str = ".npy") -> Path:
    """Token shards under ``root`` (token ``t`` of shard ``s`` is ``100 * s + t``), indexed."""
    root.mkdir(parents=True, exist_ok=True)
    arrays = [np.arange(n, dtype=np.int64) + 100 * s for s, n in enumerate(sizes)]
    write_shards(root, arrays, TokenReader(seq_len=4, dtype=np.uint16), suffix=suffix)
    return root


def jsonl_shards(root: Path, sizes: tuple[int, ...] = (3, 4)) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    data = [[{"i": 10 * s + j} for j in range(n)] for s, n in enumerate(sizes)]
    write_shards(root, data, JsonlReader())
    return root


def read_range(shard: tuple[int, int]) -> Any:
    """An IterableReader function: shard ``(start, n)`` yields ``start .. start + n - 1``."""
    start, n = shard
    yield from range(start, start + n)


def count_lines(path: Path) -> Any:
    """An IterableReader function over text files: one sample per line."""
    with open(path) as f:
        for line in f:
            yield int(line)


def ids(batches: Any) -> list[int]:
    out: list[int] = []
    for batch in batches:
        out += [int(i) for i in torch.as_tensor(batch).reshape(-1)]
    return out


class Stream(torch.utils.data.IterableDataset[int]):
    """A plain torch iterable dataset (no position a loader could resume)."""

    def __iter__(self) -> Any:
        return iter(range(4))
