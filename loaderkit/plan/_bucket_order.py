"""Lengths into batches: the array work of :class:`~loaderkit.plan.bucket.BucketPlan` (private):
checking lengths, sorting windows by length, cutting them into batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def as_lengths(lengths: object, owner: str = "BucketBatchSampler") -> np.ndarray:
    """``lengths`` as a 1-D int64 array of non-negative token counts, or a clear error."""
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.detach().cpu().numpy()
    if isinstance(lengths, (str, bytes)) or not (
        isinstance(lengths, (Sequence, np.ndarray)) or hasattr(lengths, "__array__")
    ):
        raise TypeError(
            f"{owner}: lengths must be a sequence or array of ints (one token count "
            f"per dataset index), got {type(lengths).__name__}; compute them with "
            "loaderkit.compute_lengths(dataset, length_fn)."
        )
    array = np.asarray(lengths)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(
            f"{owner}: lengths must be 1-D and non-empty, got shape {array.shape}; "
            "pass one length per dataset index."
        )
    if array.dtype.kind not in "iu":
        raise TypeError(
            f"{owner}: lengths must hold ints, got dtype {array.dtype} (e.g. "
            f"{array[0]!r} at index 0); pass token counts as ints, e.g. "
            "np.asarray(lengths, dtype=np.int64)."
        )
    array = array.astype(np.int64)
    negative = np.flatnonzero(array < 0)
    if negative.size:
        i = int(negative[0])
        raise ValueError(
            f"{owner}: lengths must be >= 0, got lengths[{i}] = {array[i]}; "
            "pass each sample's token count."
        )
    return array


def int_lengths(parts: list[Any], owner: str) -> np.ndarray:
    """Parts' lengths (lists, arrays, tensors) as one int64 array, each checked as
    :func:`as_lengths` does (an empty part, whatever its dtype, adds nothing)."""
    checked = [as_lengths(p, owner) if _size(p) else np.empty(0, np.int64) for p in parts]
    return np.concatenate(checked) if checked else np.empty(0, np.int64)


def _size(values: Any) -> int:
    return int(values.numel() if isinstance(values, torch.Tensor) else np.asarray(values).size)


def sort_windows(lengths: np.ndarray, window: int) -> np.ndarray:
    """Positions that sort each ``window``-long run of ``lengths`` longest first, stably."""
    n = lengths.size
    window = min(window, n)  # a window larger than the data is the whole data
    rows = -(-n // window)
    top = int(lengths.max()) + 1
    # Longest first as an ascending key; the sentinel pads the last window and sorts last.
    # uint16 keys take numpy's radix sort: O(n) for the common case of lengths < 65535.
    dtype = np.uint16 if top < 2**16 else np.int64
    keys = np.full(rows * window, top, dtype=dtype)
    keys[:n] = top - 1 - lengths
    within = np.argsort(keys.reshape(rows, window), axis=1, kind="stable")
    positions = (within + (np.arange(rows) * window)[:, None]).ravel()
    return positions[positions < n] if rows * window != n else positions


def greedy_starts(
    rows_from: Callable[[np.ndarray], np.ndarray], order: np.ndarray, window: int
) -> np.ndarray:
    """Batch starts in ``order`` (``rows_from(first sample)`` rows each), cut within windows."""
    n = order.size
    pos = np.arange(0, n, window)
    end = np.minimum(pos + window, n)
    found = []
    while pos.size:
        found.append(pos)
        pos = pos + rows_from(order[pos])
        alive = pos < end
        pos, end = pos[alive], end[alive]
    return np.sort(np.concatenate(found))
