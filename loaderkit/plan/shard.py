"""The plan of sharded data: shuffled shard order, shards read ``mix_shards`` at a time.

Public as :class:`loaderkit.ShardPlan`; this module holds only the order. The
rank split, the tail policy and the positions are :class:`~loaderkit.plan.sample.SamplePlan`'s,
reused through its schedule, so the two plans deal batches identically.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from loaderkit._checks import check_bool, check_int
from loaderkit._tags import SeedTag
from loaderkit.plan.sample import SamplePlan, _FixedSchedule
from loaderkit.seeding import derive_seed

__all__ = ["BatchMix", "ShardPlan", "batch_mix"]

DEFAULT_WINDOW = 8192
DEFAULT_MIX = 8  # shards read at once; measured in benchmarks/shards (RESULTS.md)


class BatchMix(NamedTuple):
    """How many shards the batches of an epoch draw from.

    Attributes:
        mean: Distinct shards per batch, averaged over the batches.
        single: Fraction of the batches whose samples all come from one shard.
        batches: Batches counted (all ranks').
    """

    mean: float
    single: float
    batches: int


def batch_mix(shard_of: np.ndarray, bounds: np.ndarray) -> BatchMix:
    """:class:`BatchMix` of batches ``shard_of[bounds[b] : bounds[b + 1]]`` (shard ids per sample).

    Example:
        >>> batch_mix(np.array([0, 0, 1, 2, 2, 2]), np.array([0, 3, 6]))
        BatchMix(mean=1.5, single=0.5, batches=2)
    """
    count = bounds.size - 1
    if count <= 0:
        return BatchMix(0.0, 0.0, 0)
    lengths = np.diff(bounds)
    batch = np.repeat(np.arange(count, dtype=np.int64), lengths)
    width = int(shard_of.max(initial=0)) + 1
    # Each (batch, shard) pair once: the distinct shards of each batch, counted.
    pairs = np.unique(batch * width + shard_of[bounds[0] : bounds[-1]])
    per_batch = np.bincount(pairs // width, minlength=count)
    filled = lengths > 0
    if not filled.any():
        return BatchMix(0.0, 0.0, 0)
    per_batch = per_batch[filled]
    return BatchMix(float(per_batch.mean()), float((per_batch == 1).mean()), int(filled.sum()))


@dataclass(frozen=True, kw_only=True)
class ShardPlan:
    """The sample plan of sharded data: shards shuffled, read ``mix_shards`` at a time.

    Global index ``i`` is sample ``i - offset[s]`` of shard ``s``, the shards
    laid end to end in their given order (what :class:`ShardedDataset` does).
    An epoch's order (``shuffle=True``):

    1. the shards are put in a random order per ``(seed, epoch)`` and their
       samples laid end to end (``N`` samples);
    2. that sequence is cut into ``K = mix_shards`` *lanes* of ``N // K``
       samples (the first ``N % K`` lanes one more), consecutive in it, so a
       lane runs through its shards one after another; a lane boundary may
       cut a shard into two *pieces* (at most ``K - 1`` cuts per epoch);
    3. each piece is cut into consecutive windows of ``window`` samples (the
       last one shorter) and each window is shuffled on its own;
    4. the lanes are interleaved: position ``p`` of the order takes the next
       sample of lane ``p % K``.

    So ``K`` consecutive positions come from ``K`` different lanes, and a
    batch of ``b <= K`` samples from ``b`` different shards whenever no shard
    holds ``N // K`` samples or more (in general at least
    ``ceil(min(b, K) / c)`` shards, where ``c = 1 + (s - 1 + ceil(b / K)) // (N // K)``
    for the largest shard size ``s``), while each lane, and so each process,
    still reads every shard front to back, window by window. ``mix_shards=1``
    is one lane: shard after shard, a batch inside one shard (the most local
    reads, the most correlated batches). ``shuffle=False`` is the identity
    order, shard after shard, whatever ``mix_shards`` says.

    Args:
        shard_sizes: Samples per shard (zeros allowed; at least one sample in all).
        batch_size: Samples per batch on each rank.
        shuffle: Shuffle shards and windows per ``(seed, epoch)``; else the
            identity order, shard after shard.
        seed: Non-negative seed of the order.
        window: Samples of a shard shuffled together (1: shard order only,
            samples in file order). Bigger mixes more and reads less locally.
        mix_shards: Lanes read at once (``K`` above): the shards a batch draws
            from. 1 reads one shard at a time (the windowed order of loaderkit 0.1).
        drop_last: Drop the tail that does not fill a global step instead of
            padding it by repeating the first samples of the order.

    Example:
        >>> plan = ShardPlan(shard_sizes=(3, 0, 2, 3), batch_size=2, seed=0, window=4, mix_shards=2)
        >>> plan.order(0).tolist()
        [0, 4, 1, 6, 2, 5, 3, 7]
        >>> s = plan.schedule(0, start=0, rank=0, world_size=2)
        >>> s.num_steps, plan.num_steps(0, start=0, world_size=2), s.indices(0).tolist()
        (2, 2, [0, 4])
        >>> plan.shuffle_blocks(0)  # shard order of epoch 0, as (shard, first, last + 1)
        [(1, 3, 3), (0, 0, 3), (2, 3, 5), (3, 5, 8)]
        >>> plan.lanes(0)  # each lane's pieces in read order, (shard, first, last + 1)
        [[(0, 0, 3), (2, 3, 4)], [(2, 4, 5), (3, 5, 8)]]
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
    _split: SamplePlan = field(init=False, repr=False, compare=False)
    _cache: dict[int, torch.Tensor] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        sizes = tuple(self.shard_sizes)
        for i, n in enumerate(sizes):
            if not isinstance(n, int | np.integer) or isinstance(n, bool) or n < 0:
                raise ValueError(f"ShardPlan: shard_sizes[{i}] must be an int >= 0, got {n!r}.")
        sizes = tuple(int(n) for n in sizes)
        object.__setattr__(self, "shard_sizes", sizes)
        if sum(sizes) == 0:
            raise ValueError(
                f"ShardPlan: the {len(sizes)} shard(s) hold no sample; pass non-empty shards."
            )
        check_int("window", self.window, 1)
        check_int(
            "mix_shards",
            self.mix_shards,
            1,
            owner="ShardPlan",
            fix=f"pass the shards a batch draws from, e.g. {DEFAULT_MIX}, or 1 to read one "
            "shard at a time",
            numpy_ok=True,
        )
        object.__setattr__(self, "mix_shards", int(self.mix_shards))
        # The rank split and the tail policy are SamplePlan's; only the order differs.
        split = SamplePlan(
            num_samples=sum(sizes),
            batch_size=self.batch_size,
            seed=self.seed,
            drop_last=self.drop_last,
        )
        check_bool("shuffle", self.shuffle, owner="ShardPlan")
        object.__setattr__(self, "_split", split)

    @property
    def num_samples(self) -> int:
        """Samples in all shards."""
        return self._split.num_samples

    def epoch_length(self, epoch: int) -> int:
        """Position reached when an epoch is complete: ``num_samples``."""
        return self.num_samples

    def shard_order(self, epoch: int) -> np.ndarray:
        """The order the shards are laid out in ``epoch``."""
        check_int("epoch", epoch, 0)
        n = len(self.shard_sizes)
        if not self.shuffle:
            return np.arange(n)
        gen = torch.Generator().manual_seed(derive_seed(self.seed, SeedTag.SHARDS, epoch))
        return torch.randperm(n, generator=gen).numpy()

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

    def order(self, epoch: int) -> torch.Tensor:
        """The epoch's order of global sample indices (int64; cached, do not modify).

        Cost: one ``randperm`` of the shards, then one per window (about
        ``num_samples / window + num_shards + mix_shards`` small calls) and two
        gathers: 0.1-0.5 s for 10M samples with the default window on one
        core, once per epoch (and once on resume).
        """
        cached = self._cache.get(epoch)
        if cached is not None:
            return cached
        n = self.num_samples
        shards = self.shard_order(epoch)
        if not self.shuffle:
            order = torch.arange(n)
        else:
            sizes = np.asarray(self.shard_sizes, dtype=np.int64)
            starts = np.cumsum(sizes) - sizes
            laid = sizes[shards]
            # Sequence k of the laid-out shards: starts[shard] + (k - where that shard begins).
            seq = np.repeat(starts[shards] - (np.cumsum(laid) - laid), laid) + np.arange(n)
            lanes = self._lane_starts()
            if self.window > 1:
                # Pieces: the runs between shard boundaries and lane starts (with one lane,
                # the shards themselves, so mix_shards=1 is the windowed order exactly).
                cuts = np.union1d(np.cumsum(laid), lanes)
                pieces = np.diff(cuts[cuts > 0], prepend=0)
                gen = torch.Generator().manual_seed(derive_seed(self.seed, SeedTag.WINDOW, epoch))
                w, pos = self.window, 0
                for size in pieces.tolist():  # windows never cross a piece boundary
                    for lo in range(pos, pos + size, w):
                        hi = min(lo + w, pos + size)
                        # numpy gathers: torch's indexing spins up threads per call (~7 ms
                        # each for 8192 entries on a busy 2-core machine, 0.05 ms here).
                        perm = torch.randperm(hi - lo, generator=gen).numpy()
                        seq[lo:hi] = seq[lo:hi][perm]
                    pos += size
            k = lanes.size - 1
            if k > 1:
                seq = seq[_interleave(n, k, lanes)]
            order = torch.from_numpy(seq)
        self._cache.clear()
        self._cache[epoch] = order
        return order

    def schedule(self, epoch: int, *, start: int, rank: int, world_size: int) -> _FixedSchedule:
        """The batches ``rank`` of ``world_size`` yields in ``epoch`` from position ``start``."""
        self._split._check_position(start, world_size)
        check_int("rank", rank, 0)
        if rank >= world_size:
            raise ValueError(f"rank must be < world_size={world_size}, got {rank}.")
        return _FixedSchedule(self._split, self.order(epoch), epoch, start, rank, world_size)

    def num_steps(self, epoch: int, *, start: int, world_size: int) -> int:
        """Batches per rank from ``start`` to the end of an epoch (equal on every rank)."""
        return self._split.num_steps(epoch, start=start, world_size=world_size)

    def batch_mix(self, epoch: int, *, world_size: int = 1) -> BatchMix:
        """How many shards the batches of ``epoch`` draw from, over all ranks' batches."""
        check_int("world_size", world_size, 1)
        order = self.order(epoch).numpy()
        ends = np.cumsum(np.asarray(self.shard_sizes, dtype=np.int64))
        scheds = [
            self.schedule(epoch, start=0, rank=r, world_size=world_size) for r in range(world_size)
        ]
        full = scheds[0]._full * world_size * self.batch_size  # whole steps: the order, in rows
        tails = [s.indices_numpy(s.num_steps - 1) for s in scheds if s.num_steps > s._full]
        samples = np.concatenate([order[:full], *tails])
        sizes = [self.batch_size] * (full // self.batch_size) + [len(t) for t in tails]
        bounds = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
        return batch_mix(np.searchsorted(ends, samples, side="right"), bounds)

    def fingerprint(self) -> dict[str, Any]:
        """The settings a saved position is only meaningful for."""
        sizes = np.asarray(self.shard_sizes, dtype=np.int64)
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
        }


def _interleave(n: int, k: int, lanes: np.ndarray) -> np.ndarray:
    """Laid-out position read at each position of the order: lane ``p % k``, its next sample."""
    base = n // k
    p = np.arange(n, dtype=np.int64)
    lane, offset = p % k, p // k
    # The last, partial round: the lanes holding one more sample (the first n % k).
    tail = p >= base * k
    lane[tail] = p[tail] - base * k
    offset[tail] = base
    return lanes[lane] + offset


@functools.cache
def _shard_order_check() -> int:
    """Checksum of a small shard order: a torch (or a loaderkit) that orders shards differently
    is an error on resume, not a silently different order."""
    plan = ShardPlan(
        shard_sizes=(5, 0, 9, 1, 17, 3), batch_size=1, seed=20240917, window=4, mix_shards=3
    )
    return zlib.crc32(plan.order(3).numpy().tobytes())
