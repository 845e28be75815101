"""The plan of sharded data (:class:`loaderkit.ShardPlan`): shuffled shard order, shards read
``mix_shards`` at a time; dealt to ranks as :class:`~loaderkit.plan.sample.SamplePlan` deals.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from loaderkit._checks import check_bool, check_int
from loaderkit._tags import SeedTag
from loaderkit.plan._permutation import GroupedPermutation, KeyedPermutation, permute_many
from loaderkit.plan.sample import (
    CHUNK,
    OrderedPlan,
    PositionMap,
    _Identity,
)
from loaderkit.seeding import GOLDEN, derive_seed, mix64_array

__all__ = ["BatchMix", "ShardPlan", "batch_mix"]

DEFAULT_WINDOW = 8192
_MAX_WINDOWS = 1 << 16  # more windows: each position keyed on its own (no per-window arrays)
DEFAULT_MIX = 8  # shards read at once (benchmarks/RESULTS.md)


class BatchMix(NamedTuple):
    """How many shards the batches of an epoch draw from: distinct shards per batch
    (``mean``), the fraction of single-shard batches (``single``), batches counted."""

    mean: float
    single: float
    batches: int


def batch_mix(shard_of: np.ndarray, bounds: np.ndarray) -> BatchMix:
    """:class:`BatchMix` of batches ``shard_of[bounds[b] : bounds[b + 1]]`` (shard ids per sample).

    Example:
        >>> batch_mix(np.array([0, 0, 1, 2, 2, 2]), np.array([0, 3, 6]))
        BatchMix(mean=1.5, single=0.5, batches=2)
    """
    return _mix_of(*_mix_counts(shard_of, bounds))


def _mix_of(distinct: int, single: int, batches: int) -> BatchMix:
    if batches == 0:
        return BatchMix(0.0, 0.0, 0)
    return BatchMix(distinct / batches, single / batches, batches)


def _mix_counts(shard_of: np.ndarray, bounds: np.ndarray) -> tuple[int, int, int]:
    """Distinct shards summed over the non-empty batches, the single-shard ones, and their count."""
    count = bounds.size - 1
    if count <= 0:
        return 0, 0, 0
    lengths = np.diff(bounds)
    batch = np.repeat(np.arange(count, dtype=np.int64), lengths)
    width = int(shard_of.max(initial=0)) + 1
    # Each (batch, shard) pair once: the distinct shards of each batch, counted.
    pairs = np.unique(batch * width + shard_of[bounds[0] : bounds[-1]])
    per_batch = np.bincount(pairs // width, minlength=count)[lengths > 0]
    return int(per_batch.sum()), int((per_batch == 1).sum()), int(per_batch.size)


@dataclass(frozen=True, kw_only=True)
class ShardPlan(OrderedPlan):
    """The sample plan of sharded data: shards shuffled, read ``mix_shards`` at a time.

    An epoch (``shuffle=True``): the shards in a keyed order, laid end to end; cut into
    ``K = mix_shards`` *lanes* (a lane boundary may cut a shard into two *pieces*); each
    piece's ``window``-sample windows shuffled by keyed permutations; the lanes
    interleaved (position ``p`` takes the next sample of lane ``p % K``).

    Args:
        shard_sizes: Samples per shard (zeros allowed; at least one sample in all).
        batch_size: Samples per batch on each rank.
        shuffle: Shuffle shards and windows per ``(seed, epoch)``; else shard after shard.
        seed: Non-negative seed of the order.
        window: Samples of a shard shuffled together (1: samples in file order).
        mix_shards: Lanes read at once (``K`` above); 1 reads one shard at a time.
        drop_last: Drop the tail that does not fill a global step instead of
            repeating the order's first samples.
        shard_names_crc32: crc32 of the shards' names in order (``ShardedDataset.plan()``
            passes it): a saved position loads only where they match. None: unchecked.

    Example:
        >>> plan = ShardPlan(shard_sizes=(3, 0, 2, 3), batch_size=2, seed=0, window=4, mix_shards=2)
        >>> plan.order(0).tolist()
        [0, 6, 2, 7, 1, 4, 5, 3]
        >>> s = plan.schedule(0, start=0, rank=0, world_size=2)
        >>> s.num_steps, plan.num_steps(0, start=0, world_size=2), s.indices(0).tolist()
        (2, 2, [0, 6])
        >>> plan.shuffle_blocks(0)  # shard order of epoch 0, as (shard, first, last + 1)
        [(0, 0, 3), (3, 5, 8), (2, 3, 5), (1, 3, 3)]
        >>> plan.lanes(0)  # each lane's pieces in read order, (shard, first, last + 1)
        [[(0, 0, 3), (3, 5, 6)], [(3, 6, 8), (2, 3, 5)]]
        >>> plan.batch_mix(0)  # every batch of 2 from 2 shards (mix_shards=1: 1.5, half single)
        BatchMix(mean=2.0, single=0.0, batches=4)
    """

    shard_sizes: tuple[int, ...]
    batch_size: int
    shuffle: bool = True
    seed: int = 0
    window: int = DEFAULT_WINDOW
    mix_shards: int = DEFAULT_MIX
    drop_last: bool = False
    shard_names_crc32: int | None = None
    _cache: dict[int, PositionMap] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        sizes = tuple(self.shard_sizes)
        for i, n in enumerate(sizes):
            if not isinstance(n, int | np.integer) or isinstance(n, bool) or n < 0:
                raise ValueError(
                    f"ShardPlan: shard_sizes[{i}] must be an int >= 0, got {n!r}; pass each "
                    "shard's sample count (a ShardedDataset's .sizes)."
                )
        sizes = tuple(int(n) for n in sizes)
        object.__setattr__(self, "shard_sizes", sizes)
        if sum(sizes) == 0:
            raise ValueError(
                f"ShardPlan: the {len(sizes)} shard(s) hold no sample; pass non-empty shards "
                "(a TokenReader's seq_len no longer than a shard's tokens)."
            )
        check_int("window", self.window, 1, owner="ShardPlan")
        fix = (
            f"pass the shards a batch draws from, e.g. {DEFAULT_MIX}, or 1 to read one "
            "shard at a time"
        )
        check_int("mix_shards", self.mix_shards, 1, owner="ShardPlan", fix=fix, numpy_ok=True)
        object.__setattr__(self, "mix_shards", int(self.mix_shards))
        self._check_dealing()  # as a SamplePlan of the shards' samples
        check_bool("drop_last", self.drop_last, owner="ShardPlan")
        check_bool("shuffle", self.shuffle, owner="ShardPlan")

    @functools.cached_property
    def num_samples(self) -> int:
        """Samples in all shards."""
        return sum(self.shard_sizes)

    def shard_order(self, epoch: int) -> np.ndarray:
        """The order the shards are laid out in ``epoch`` (a keyed permutation of the shards)."""
        check_int("epoch", epoch, 0)
        n = len(self.shard_sizes)
        if not self.shuffle:
            return np.arange(n)
        key = derive_seed(self.seed, SeedTag.SHARDS, epoch)
        return KeyedPermutation(n, key).at(np.arange(n, dtype=np.int64))

    def shuffle_blocks(self, epoch: int) -> list[tuple[int, int, int]]:
        """``(shard, first, end)`` global index ranges in the epoch's shard order."""
        ends = np.cumsum(self.shard_sizes)
        return [
            (int(s), int(ends[s] - self.shard_sizes[s]), int(ends[s]))
            for s in self.shard_order(epoch)
        ]

    def _lane_starts(self) -> np.ndarray:
        """Where each of the ``K`` lanes starts in the laid-out sequence, and its end."""
        k = self.mix_shards if self.shuffle else 1
        base, extra = divmod(self.num_samples, k)
        lanes = np.arange(k + 1, dtype=np.int64)
        return lanes * base + np.minimum(lanes, extra)

    def lanes(self, epoch: int) -> list[list[tuple[int, int, int]]]:
        """Each lane's pieces in the order it reads them: ``(shard, first, end)`` global
        index ranges (empty shards left out; ``shuffle=False``: one lane)."""
        cuts = self._lane_starts()
        lanes: list[list[tuple[int, int, int]]] = [[] for _ in range(cuts.size - 1)]
        pos = 0
        for shard, first, end in self.shuffle_blocks(epoch):
            lo = pos
            while lo < pos + end - first:
                lane = int(np.searchsorted(cuts, lo, side="right")) - 1
                hi = min(pos + end - first, int(cuts[lane + 1]))
                lanes[lane].append((shard, first + lo - pos, first + hi - pos))
                lo = hi
            pos += end - first
        return lanes

    def order_map(self, epoch: int) -> PositionMap:
        """The epoch's order as a map from positions to global indices, never materialized."""
        check_int("epoch", epoch, 0)
        if not self.shuffle:
            return _Identity()
        cached = self._cache.get(epoch)
        if cached is None:
            cached = _ShardOrder(
                np.asarray(self.shard_sizes, dtype=np.int64),
                self.shard_order(epoch),
                self._lane_starts(),
                self.window,
                derive_seed(self.seed, SeedTag.WINDOW, epoch),
            )
            self._cache.clear()  # one epoch at a time: loaders go forward
            self._cache[epoch] = cached
        return cached

    def batch_mix(self, epoch: int, *, world_size: int = 1) -> BatchMix:
        """How many shards the batches of ``epoch`` draw from, over all ranks' batches."""
        check_int("world_size", world_size, 1)
        mapping = self.order_map(epoch)
        ends = np.cumsum(np.asarray(self.shard_sizes, dtype=np.int64))
        scheds = [
            self.schedule(epoch, start=0, rank=r, world_size=world_size) for r in range(world_size)
        ]
        b = self.batch_size
        full = scheds[0]._full * world_size * b  # whole steps: a prefix of the order, in rows
        totals = np.zeros(3, dtype=np.int64)
        span = max(1, CHUNK // b) * b
        for lo in range(0, full, span):
            hi = min(lo + span, full)
            shard_of = np.searchsorted(ends, mapping.at(np.arange(lo, hi)), side="right")
            totals += _mix_counts(shard_of, np.arange(0, hi - lo + 1, b, dtype=np.int64))
        tails = [s.indices_numpy(s.num_steps - 1) for s in scheds if s.num_steps > s._full]
        if tails:
            bounds = np.concatenate(([0], np.cumsum([len(t) for t in tails], dtype=np.int64)))
            shard_of = np.searchsorted(ends, np.concatenate(tails), side="right")
            totals += _mix_counts(shard_of, bounds)
        return _mix_of(*(int(t) for t in totals))

    def fingerprint(self) -> dict[str, Any]:
        """The settings a saved position is only meaningful for."""
        sizes = np.asarray(self.shard_sizes, dtype=np.int64)
        names = self.shard_names_crc32
        return {
            "kind": "shards",
            "num_samples": self.num_samples,
            "num_shards": len(self.shard_sizes),
            "shard_sizes_crc32": zlib.crc32(sizes.tobytes()),
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "window": self.window,
            "mix_shards": self.mix_shards,
            "drop_last": self.drop_last,
            "order_check": _shard_order_check() if self.shuffle else 0,
        } | ({} if names is None else {"shard_names_crc32": names})


class _ShardOrder:
    """A shuffled epoch of a :class:`ShardPlan` as a :class:`PositionMap`: lane and offset by
    arithmetic, a binary search for the piece, its window's keyed permutation."""

    __slots__ = (
        "_cuts",
        "_first",
        "_k",
        "_key",
        "_lanes",
        "_n",
        "_window",
        "_window_first",
        "_windows",
    )

    def __init__(
        self, sizes: np.ndarray, shards: np.ndarray, lanes: np.ndarray, window: int, key: int
    ) -> None:
        laid = sizes[shards]
        laid_ends = np.cumsum(laid)
        # Global index of laid-out position q in laid shard j: q + first[j].
        first = (np.cumsum(sizes) - sizes)[shards] - (laid_ends - laid)
        self._lanes = lanes
        self._n = int(lanes[-1])
        self._k = lanes.size - 1
        # Pieces: the runs between shard boundaries and lane starts; no window crosses one.
        cuts = np.sort(np.concatenate(([0], laid_ends, lanes)))
        self._cuts = cuts[np.r_[True, cuts[1:] != cuts[:-1]]]  # not np.union1d: slower (RESULTS.md)
        self._first = first[np.searchsorted(laid_ends, self._cuts[:-1], side="right")]
        self._window = window
        self._key = np.uint64(key)
        self._windows: GroupedPermutation | None = None
        if window > 1:
            # Each piece's windows numbered in order; few enough, one permutation object for all.
            counts = -(-np.diff(self._cuts) // window)
            self._window_first = np.cumsum(counts) - counts
            if int(counts.sum()) <= _MAX_WINDOWS:
                piece = np.repeat(np.arange(counts.size), counts)
                starts = (
                    self._cuts[piece] + (np.arange(piece.size) - self._window_first[piece]) * window
                )
                sizes = np.minimum(starts + window, self._cuts[piece + 1]) - starts
                self._windows = GroupedPermutation(sizes, self._window_keys(starts))

    def at(self, positions: np.ndarray) -> np.ndarray:
        p = np.asarray(positions).astype(np.int64)
        k, base = self._k, self._n // self._k
        q = p  # one lane (mix_shards=1): laid out in order
        if k > 1:
            offset, lane = np.divmod(p, k)
            tail = np.flatnonzero(offset >= base)  # the last, partial round: the first n % k lanes
            lane.flat[tail] = p.flat[tail] - base * k
            offset.flat[tail] = base
            q = self._lanes[lane] + offset
        piece = np.searchsorted(self._cuts, q, side="right") - 1
        if self._window > 1:
            number, inside = np.divmod(q - self._cuts[piece], self._window)
            start = q - inside
            if self._windows is not None:
                q = start + self._windows.at(self._window_first[piece] + number, inside)
            else:
                size = np.minimum(start + self._window, self._cuts[piece + 1]) - start
                q = start + permute_many(size, self._window_keys(start), inside)
        return q + self._first[piece]

    def _window_keys(self, starts: np.ndarray) -> np.ndarray:
        # Distinct window starts give distinct keys (GOLDEN is odd: a bijection mod 2**64).
        return mix64_array(self._key + (starts.astype(np.uint64) + np.uint64(1)) * _GOLDEN)


_GOLDEN = np.uint64(GOLDEN)


@functools.cache
def _shard_order_check() -> int:
    """Checksum of a small shard order: a loaderkit that orders shards differently is refused
    on resume."""
    plan = ShardPlan(
        shard_sizes=(5, 0, 9, 1, 17, 3), batch_size=1, seed=20240917, window=4, mix_shards=3
    )
    return zlib.crc32(plan.order(3).numpy().tobytes())
