"""The sample plan: which samples each rank gets, as a pure function of a few integers.

An epoch's *order* is a keyed permutation of ``(seed, epoch)`` evaluated only at the
positions a rank deals; a *position* counts entries consumed by all ranks together, so
it means the same under any world size. The dealing: ``docs/design.md`` ("The spine").

Example:
    >>> plan = SamplePlan(num_samples=10, batch_size=2, shuffle=False)
    >>> s = plan.schedule(epoch=0, start=0, rank=1, world_size=2)
    >>> s.num_steps, s.indices(0).tolist(), s.indices(2).tolist()
    (3, [2, 3], [9])
    >>> s.position_after(0), s.position_after(2)
    (4, 10)
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from loaderkit._checks import check_bool, check_int, check_rank
from loaderkit._tags import SeedTag
from loaderkit.plan._permutation import KeyedPermutation, permutation_digest
from loaderkit.seeding import derive_seed

__all__ = ["Plan", "PositionMap", "SamplePlan", "Schedule"]

_MAX_SAMPLES = 2**63
# Positions a lazy schedule maps at once: numpy's per-call cost amortized, arrays in cache.
CHUNK = 1 << 14
# Steps mapped first, growing 16x up to CHUNK: the first batch waits only for its own.
_GROWTH = 16


class PositionMap(Protocol):
    """An epoch's order as a function: the dataset indices at any positions."""

    def at(self, positions: np.ndarray) -> np.ndarray:
        """Dataset indices (int64, same shape) at ``positions`` (ints in ``[0, n)``)."""
        ...


class _Identity:
    """The unshuffled order: position ``p`` holds sample ``p``."""

    __slots__ = ()

    def at(self, positions: np.ndarray) -> np.ndarray:
        return np.asarray(positions).astype(np.int64)


class Dealt(Protocol):
    """What the dealing schedule needs of a plan: its size, batch size and tail policy."""

    @property
    def num_samples(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def drop_last(self) -> bool: ...


class _Ordered(Dealt, Protocol):
    @property
    def seed(self) -> int: ...

    def order_map(self, epoch: int) -> PositionMap: ...


class OrderedPlan:
    """A plan whose every epoch is an ``order_map`` of ``num_samples`` positions, dealt in
    fixed-size batches."""

    def _check_dealing(self: _Ordered) -> None:
        """Check the size, batch size and seed every such plan deals by."""
        check_int("num_samples", self.num_samples, 1, limit=_MAX_SAMPLES)
        check_int("batch_size", self.batch_size, 1)
        check_int("seed", self.seed, 0)

    def epoch_length(self: _Ordered, epoch: int) -> int:
        """Position reached when an epoch is complete: ``num_samples``, in every epoch."""
        return self.num_samples

    def schedule(
        self: _Ordered, epoch: int, *, start: int, rank: int, world_size: int
    ) -> _FixedSchedule:
        """The batches ``rank`` of ``world_size`` yields in ``epoch`` from ``start``."""
        steps_from(self, start, world_size)  # checks the position
        check_rank(rank, world_size)
        return _FixedSchedule(self, self.order_map(epoch), epoch, start, rank, world_size)

    def num_steps(self: _Ordered, epoch: int, *, start: int, world_size: int) -> int:
        """Batches per rank from ``start`` to the end of an epoch (the same every epoch)."""
        return steps_from(self, start, world_size)

    def order_at(self: _Ordered, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Indices at ``positions`` of the epoch's order (int64, same shape).

        Raises:
            TypeError: ``positions`` is not an integer array.
            ValueError: a position outside ``[0, num_samples)``.
        """
        pos = check_positions(positions, self.num_samples)
        return self.order_map(epoch).at(pos)

    def order(self: _Ordered, epoch: int) -> torch.Tensor:
        """The whole epoch's order of indices (int64), materialized: O(num_samples)."""
        return materialize(self.order_map(epoch), self.num_samples)


class Schedule(Protocol):
    """What one rank yields for the rest of one epoch, from a start position."""

    @property
    def epoch(self) -> int:
        """The epoch this schedule belongs to."""
        ...

    @property
    def start(self) -> int:
        """The position the schedule starts at."""
        ...

    @property
    def num_steps(self) -> int:
        """Number of batches this rank yields (equal on every rank)."""
        ...

    def indices(self, step: int) -> torch.Tensor:
        """Dataset indices of this rank's batch at ``step`` (int64, 1-D)."""
        ...

    def position_after(self, step: int) -> int:
        """Global position once every rank has consumed its batch ``step``."""
        ...


class Plan(Protocol):
    """A source of per-epoch schedules: the interface loaders and samplers build on."""

    @property
    def num_samples(self) -> int:
        """Dataset size: positions run from 0 to the end of an epoch's order."""
        ...

    def epoch_length(self, epoch: int) -> int:
        """Position reached when ``epoch`` is complete."""
        ...

    def schedule(self, epoch: int, *, start: int, rank: int, world_size: int) -> Schedule:
        """The batches ``rank`` yields in ``epoch`` from position ``start``."""
        ...

    def num_steps(self, epoch: int, *, start: int, world_size: int) -> int:
        """Batches per rank from position ``start`` to the end of ``epoch``."""
        ...

    def fingerprint(self) -> dict[str, Any]:
        """Settings that must match for a saved position to be meaningful."""
        ...


@dataclass(frozen=True, kw_only=True)
class SamplePlan(OrderedPlan):
    """Fixed-size batches over a shuffled (or sequential) order of ``num_samples``.

    Args:
        num_samples: Dataset size (> 0).
        batch_size: Samples per batch on each rank (> 0).
        shuffle: Permute the order per ``(seed, epoch)``; else ``0 .. num_samples - 1``.
        seed: Non-negative seed of the permutation.
        drop_last: Drop the tail that does not fill a whole global step, instead
            of padding it by wrapping to the order's start.

    Example:
        >>> SamplePlan(num_samples=5, batch_size=2, shuffle=True, seed=1).order(0).shape
        torch.Size([5])
    """

    num_samples: int
    batch_size: int
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False

    def __post_init__(self) -> None:
        self._check_dealing()
        check_bool("shuffle", self.shuffle)
        check_bool("drop_last", self.drop_last)

    def order_map(self, epoch: int) -> PositionMap:
        """The epoch's order as a map from positions to dataset indices, never materialized."""
        check_int("epoch", epoch, 0)
        if not self.shuffle:
            return _Identity()
        return KeyedPermutation(self.num_samples, derive_seed(self.seed, SeedTag.ORDER, epoch))

    def fingerprint(self) -> dict[str, Any]:
        """The settings a position is only meaningful for."""
        return {**plan_settings(self), "order_check": permutation_digest() if self.shuffle else 0}


_SETTINGS = ("num_samples", "batch_size", "shuffle", "seed", "drop_last")


def plan_settings(plan: Any) -> dict[str, Any]:
    """The settings of a plan's fingerprint that every sample plan has."""
    return {k: getattr(plan, k) for k in _SETTINGS}


def materialize(mapping: PositionMap, n: int) -> torch.Tensor:
    """Entries ``0 .. n - 1`` of an order map as one int64 tensor, :data:`CHUNK` at a time."""
    out = np.empty(n, dtype=np.int64)
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        out[lo:hi] = mapping.at(np.arange(lo, hi, dtype=np.int64))
    return torch.from_numpy(out)


def check_positions(positions: np.ndarray, n: int, size: str = "num_samples") -> np.ndarray:
    """``positions`` as an integer array inside ``[0, n)`` (``n`` named ``size``)."""
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iu":
        raise TypeError(
            f"positions must be an integer array, got dtype {pos.dtype}; pass e.g. "
            "np.arange(lo, hi)."
        )
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n):
        raise ValueError(
            f"positions must lie in [0, {size}={n}), got "
            f"[{int(pos.min())}, {int(pos.max())}]; pass positions within one epoch."
        )
    return pos


def steps_from(plan: Dealt, start: int, world_size: int) -> int:
    """Batches per rank from position ``start`` to the end of an epoch (checks its arguments)."""
    check_int("world_size", world_size, 1)
    check_int("start", start, 0)
    if start > plan.num_samples:
        raise ValueError(
            f"start must be <= num_samples={plan.num_samples}, got {start}; "
            "a position past the end of the epoch means the epoch is complete."
        )
    full, tail = divmod(plan.num_samples - start, world_size * plan.batch_size)
    return full + (1 if tail_batch(plan, tail, world_size) else 0)


def tail_batch(plan: Dealt, tail: int, world_size: int) -> int:
    """Each rank's last batch for a ``tail`` short of a global step: ``ceil(tail / world_size)``
    entries (wrapped), or 0 under ``drop_last``; a ``strided`` plan as a DistributedSampler."""
    size = -(-tail // world_size)
    if not getattr(plan, "strided", False):
        return 0 if plan.drop_last else size
    if getattr(plan, "drop_tail", False):
        size = tail // world_size
    return 0 if plan.drop_last and size < plan.batch_size else size


@functools.cache
def permutation_check() -> int:
    """A checksum of a small seeded ``torch.randperm``, in BucketPlan states (pins torch's)."""
    perm = torch.randperm(257, generator=torch.Generator().manual_seed(20240917))
    return zlib.crc32(perm.numpy().tobytes())


class _FixedSchedule:
    """One rank's rest-of-epoch under a plan: ``order`` a tensor or a :class:`PositionMap`
    (evaluated only where dealt); a ``strided`` plan dealt as a ``DistributedSampler``; ``keys``
    (laid out as ``order``) seed each sample in place of its index."""

    __slots__ = (
        "_batch",
        "_chunk",
        "_chunk_lo",
        "_full",
        "_global",
        "_keys",
        "_map",
        "_n",
        "_np_order",
        "_rank",
        "_rows",
        "_rows_next",
        "_stride",
        "_tail",
        "_tail_batch",
        "_ws",
        "epoch",
        "num_steps",
        "start",
    )

    def __init__(
        self,
        plan: Dealt,
        order: torch.Tensor | PositionMap,
        epoch: int,
        start: int,
        rank: int,
        ws: int,
        keys: torch.Tensor | PositionMap | None = None,
    ) -> None:
        self.epoch = epoch
        self.start = start
        self._keys = None if keys is None else _FixedSchedule(plan, keys, epoch, start, rank, ws)
        if isinstance(order, torch.Tensor):
            # Slicing numpy and wrapping the slice is cheaper than slicing the tensor.
            self._np_order: np.ndarray | None = order.numpy()
            self._map: PositionMap | None = None
        else:
            self._np_order, self._map = None, order
        self._n = plan.num_samples
        self._rank = rank
        self._batch = plan.batch_size
        self._global = ws * plan.batch_size
        # Whole batches per chunk: a row of the chunk is one step's batch.
        self._rows = max(1, CHUNK // plan.batch_size)
        self._rows_next = 1
        self._chunk: np.ndarray | None = None
        self._chunk_lo = 0
        self._stride = ws if getattr(plan, "strided", False) else 0
        if self._stride and self._np_order is None:
            raise TypeError("a strided plan deals a materialized order (a tensor)")
        remaining = self._n - start
        self._full, tail = divmod(remaining, self._global)
        self._tail_batch = tail_batch(plan, tail, ws)
        self._ws = ws
        self._tail: np.ndarray | None = None  # mapped when asked for: a resume maps no more
        self.num_steps = self._full + (1 if self._tail_batch else 0)

    def _at(self, positions: np.ndarray) -> np.ndarray:
        if self._np_order is not None:
            return self._np_order[positions]
        assert self._map is not None
        return self._map.at(positions)

    def _tail_indices(self, ws: int) -> np.ndarray:
        base = self.start + self._full * self._global
        if self._stride:
            positions = base + self._rank + ws * np.arange(self._tail_batch, dtype=np.int64)
        else:
            lo = base + self._rank * self._tail_batch
            positions = np.arange(lo, lo + self._tail_batch, dtype=np.int64)
        # Modulo: a tiny dataset may wrap more than once.
        return self._at(positions % self._n)

    def indices(self, step: int) -> torch.Tensor:
        return torch.from_numpy(self.indices_numpy(step))

    def num_indices(self) -> int:
        """Indices this rank yields over all its steps, counted without mapping a position."""
        return self._full * self._batch + self._tail_batch

    def indices_numpy(self, step: int) -> np.ndarray:
        """:meth:`indices` as a numpy array; do not modify it (it may be a shared view)."""
        if 0 <= step < self._full:
            if self._np_order is not None:
                if self._stride:
                    lo = self.start + step * self._global + self._rank
                    rows = self._np_order[lo : lo + self._global : self._stride]
                    return np.ascontiguousarray(rows)
                lo = self.start + step * self._global + self._rank * self._batch
                return self._np_order[lo : lo + self._batch]
            chunk = self._chunk
            if chunk is None or not self._chunk_lo <= step < self._chunk_lo + len(chunk):
                chunk = self._fill(step)
            return chunk[step - self._chunk_lo]
        if step == self._full and self._tail_batch:
            if self._tail is None:
                self._tail = self._tail_indices(self._ws)
            return self._tail
        raise IndexError(f"step must be in [0, {self.num_steps}), got {step}.")

    def _fill(self, step: int) -> np.ndarray:
        """Map the positions of steps ``step ..`` (up to a chunk) at once; rows are batches."""
        rows, self._rows_next = self._rows_next, min(self._rows_next * _GROWTH, self._rows)
        steps = np.arange(step, min(step + rows, self._full), dtype=np.int64)
        first = self.start + self._rank * self._batch
        positions = (first + steps * self._global)[:, None] + np.arange(self._batch)
        # A new array each time, never refilled in place: a caller may still hold a row.
        self._chunk = self._at(positions)
        self._chunk_lo = step
        return self._chunk

    def position_after(self, step: int) -> int:
        if step + 1 >= self.num_steps:
            return self._n  # the epoch is complete, whatever was dropped or wrapped
        return self.start + (step + 1) * self._global

    def seed_keys(self, step: int) -> np.ndarray | None:
        """The per-sample seeding keys of step ``step``'s batch (same layout as its indices;
        None: the indices)."""
        return None if self._keys is None else self._keys.indices_numpy(step)


def occurrence_keys(order: torch.Tensor, dataset_size: int) -> torch.Tensor | None:
    """Per-sample seeding keys of an order that repeats an index (the ``k``-th draw of ``i``:
    ``i + k * dataset_size``, its own randomness), else None."""
    values = order.numpy()
    if values.size == 0:
        return None
    by_index = np.argsort(values, kind="stable")
    sorted_values = values[by_index]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    if starts.size == values.size:
        return None
    run_start = np.repeat(starts, np.diff(np.r_[starts, values.size]))
    occurrence = np.empty_like(values)
    occurrence[by_index] = np.arange(values.size, dtype=np.int64) - run_start
    return torch.from_numpy(values + occurrence * np.int64(dataset_size))
