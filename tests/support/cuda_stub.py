"""DevicePrefetcher's CUDA look-ahead on a CPU machine: streams and copies stubbed, so the
look-ahead logic runs and the batches stay where they are."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from loaderkit import DevicePrefetcher, transfer


class NoopStream:
    """Stands in for torch.cuda.Stream: the look-ahead logic runs, the copies are no-ops."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def __enter__(self) -> NoopStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def stub_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Stream", NoopStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: NoopStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: NoopStream())
    monkeypatch.setattr(transfer, "_record_stream", lambda batch, stream: None)
    monkeypatch.setattr(transfer, "move_to_device", lambda batch, device: batch)


def cuda_prefetcher(iterable: Any) -> DevicePrefetcher:
    """A prefetcher that takes the CUDA look-ahead path (use with :func:`stub_cuda`)."""
    prefetcher = DevicePrefetcher(iterable, "cpu")
    prefetcher.device = torch.device("cuda", 0)
    return prefetcher
