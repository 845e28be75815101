"""Token budgets over shards: length-bucketed batches that mix shards and read them locally.

:class:`ShardBucketPlan` is a :class:`~loaderkit.plan.bucket.BucketPlan` over
:class:`~loaderkit.ShardPlan`'s order, its batches shuffled *within* their window so
each shard is still read front to back.

Example:
    >>> lengths = [3, 9, 4, 8, 2, 7, 5, 6]  # shard 0: samples 0-3, shard 1: samples 4-7
    >>> plan = ShardBucketPlan(
    ...     lengths, shard_sizes=(4, 4), max_tokens=18, mix_shards=2, window=4, seed=1
    ... )
    >>> plan.shards.order(0).tolist()  # the shard plan's order: the two lanes in turn
    [2, 7, 3, 5, 1, 6, 0, 4]
    >>> [b.tolist() for b in plan.batches(0)]  # windows of 4 sorted, cut, shuffled inside
    [[3, 5], [7, 2], [0, 4], [1, 6]]
    >>> plan.batch_mix(0)  # every batch from both shards
    BatchMix(mean=2.0, single=0.0, batches=4)
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from typing import Any, Unpack

import numpy as np

from loaderkit.plan.bucket import BucketOptions, BucketPlan, _int
from loaderkit.plan.shard import DEFAULT_MIX, DEFAULT_WINDOW, BatchMix, ShardPlan, batch_mix

__all__ = ["ShardBucketPlan"]


class ShardBucketPlan(BucketPlan):
    """Length-bucketed batches over shards; :class:`BucketPlan` otherwise.

    Args:
        lengths: Token count per global index (the shards laid end to end, as
            :class:`~loaderkit.ShardedDataset` numbers them).
        shard_sizes: Samples per shard; they must add up to ``len(lengths)``.
        mix_shards: Lanes read at once (see :class:`~loaderkit.ShardPlan`).
        shard_window: Samples of a shard shuffled together before sorting.
        **options: The :class:`~loaderkit.plan.bucket.BucketOptions`.
    """

    def __init__(
        self,
        lengths: object,
        *,
        shard_sizes: Sequence[int],
        mix_shards: int = DEFAULT_MIX,
        shard_window: int = DEFAULT_WINDOW,
        **options: Unpack[BucketOptions],
    ) -> None:
        super().__init__(lengths, **options)
        fix = f"pass samples of a shard shuffled together, e.g. {DEFAULT_WINDOW}"
        _int("shard_window", shard_window, 1, fix)
        # batch_size=1: only the order is used; the batches are cut here.
        self.shards = ShardPlan(
            shard_sizes=tuple(shard_sizes),
            batch_size=1,
            shuffle=self.shuffle,
            seed=self.seed,
            window=int(shard_window),
            mix_shards=mix_shards,
        )
        self._check_total(self.shards.num_samples, "shard_sizes", "ShardedDataset.lengths()")
        self._ends = np.cumsum(np.asarray(self.shards.shard_sizes, dtype=np.int64))

    @property
    def mix_shards(self) -> int:
        """Lanes read at once."""
        return self.shards.mix_shards

    def _unsorted(self, epoch: int) -> np.ndarray:
        return self._eligible_only(self.shards.order(epoch).numpy())

    def _sequence(self, epoch: int, starts: np.ndarray) -> np.ndarray:
        keys = super()._sequence(epoch, starts)  # unshuffled: arange, already in window order
        # Batches never cross a window: the window a batch starts in is its window.
        return np.lexsort((keys, starts // self.window)) if self.shuffle else keys

    def batch_mix(self, epoch: int, *, world_size: int = 1) -> BatchMix:
        """How many shards the batches of ``epoch`` draw from, over all ranks' batches as dealt
        (a padded last step's repeats included, a dropped remainder left out)."""
        _int("world_size", world_size, 1, "pass an int >= 1")
        ep = self._epoch(epoch)
        ids = ep.sequence
        if ids.size:
            if self.drop_last:
                ids = ids[: ids.size // world_size * world_size]
            else:
                ids = np.concatenate((ids, ids[np.arange(-ids.size % world_size) % ids.size]))
        first, rows = ep.bounds[ids], ep.bounds[ids + 1] - ep.bounds[ids]
        bounds = np.concatenate(([0], np.cumsum(rows)))
        # Batch j's samples are order[first[j] : first[j] + rows[j]], laid end to end.
        samples = ep.order[np.repeat(first - bounds[:-1], rows) + np.arange(bounds[-1])]
        return batch_mix(np.searchsorted(self._ends, samples, side="right"), bounds)

    def fingerprint(self) -> dict[str, Any]:
        """:class:`BucketPlan`'s settings, the shards by count and checksum, and the mixing."""
        shards = self.shards.fingerprint()
        return {
            **super().fingerprint(),
            "kind": "shard-bucket",
            "num_shards": shards["num_shards"],
            "shard_sizes_crc32": shards["shard_sizes_crc32"],
            "mix_shards": self.mix_shards,
            "shard_window": self.shards.window,
            "order_check": _shard_bucket_check() if self.shuffle else 0,
        }


@functools.cache
def _shard_bucket_check() -> int:
    """Checksum of a small plan's batches: one ordered differently is refused on resume."""
    lengths = np.arange(40) * 7 % 23 + 1
    plan = ShardBucketPlan(
        lengths, shard_sizes=(9, 0, 17, 14), max_tokens=40, mix_shards=3, shard_window=4,
        window=12, seed=20240917,
    )  # fmt: skip
    return zlib.crc32(np.concatenate([b.numpy() for b in plan.batches(3)]).tobytes())
