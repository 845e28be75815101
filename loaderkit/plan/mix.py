"""Weighted mixing: several sources, one plan, still a pure function of ``(seed, epoch, position)``.

:class:`MixPlan` draws ``per_epoch[s]`` samples from source ``s`` per epoch, each once
per *source-epoch*; :class:`MixBucketPlan` is its token-budget form. The algorithm:
``docs/design.md`` ("Weighted mixing").

Example:
    >>> plan = MixPlan(source_sizes=(4, 2), per_epoch=(2, 4), batch_size=3, seed=0)
    >>> order = plan.order(0).tolist()
    >>> len(order), sorted(i >= 4 for i in order)  # 2 draws of source 0, 4 of source 1
    (6, [False, False, True, True, True, True])
    >>> sorted(i for i in order if i >= 4)  # source 1 (indices 4, 5): two source-epochs
    [4, 4, 5, 5]
    >>> plan.source_epochs(1)  # epoch 1: source 0 finishes source-epoch 0, source 1 runs 2-3
    ((0, 0), (2, 3))
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Unpack

import numpy as np
import torch

from loaderkit._checks import check_bool, check_int, check_rank
from loaderkit._tags import SeedTag
from loaderkit.plan._permutation import KeyedPermutation, permutation_digest, permute_many
from loaderkit.plan.bucket import BucketOptions, BucketPlan
from loaderkit.plan.sample import (
    SamplePlan,
    _FixedSchedule,
    check_positions,
    materialize,
    occurrence_keys,
    steps_from,
)
from loaderkit.seeding import GOLDEN, derive_seed, mix64_array

__all__ = ["MixBucketPlan", "MixPlan", "mix_allotments"]

_MAX = 2**63
_OWNER = "MixedDataset"


def _positive_numbers(
    name: str, values: Sequence[Any], owner: str, at: list[str]
) -> list[Fraction]:
    count = len(at)
    if isinstance(values, np.ndarray | torch.Tensor) and values.ndim == 1:
        values = values.tolist()  # e.g. sizes / sizes.sum(), as WeightedRandomSampler takes
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise TypeError(
            f"{owner}: {name} must be a sequence of {count} positive numbers (one per source) "
            f"or a mapping by source name, got {type(values).__name__}; pass e.g. "
            f"{name}={[1.0] * count}."
        )
    if len(values) != count:
        raise ValueError(
            f"{owner}: {name} must hold one number per source ({count}), got {len(values)}: "
            f"{list(values)!r}; pass {count} numbers."
        )
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
            raise TypeError(
                f"{owner}: {name}[{at[i]}] must be a number, got {v!r} ({type(v).__name__}); pass "
                "a positive int or float."
            )
        if not np.isfinite(v) or v <= 0:
            raise ValueError(
                f"{owner}: {name}[{at[i]}] must be a finite number > 0, got {v!r}; pass a positive "
                "value (leave a source you do not want out of sources)."
            )
        # The decimal typed, not its binary neighbour: 0.35 * 10 is a half, rounded to even.
        exact = int(v) if isinstance(v, int | np.integer) else repr(float(v))
        out.append(Fraction(exact))
    return out


def mix_allotments(
    source_sizes: Sequence[int],
    *,
    weights: Sequence[float] | None = None,
    repeat: Sequence[float] | None = None,
    epoch_size: int | None = None,
    owner: str = _OWNER,
    labels: Sequence[str] | None = None,
) -> tuple[int, ...]:
    """Draws per epoch from each source: ``weights``' largest-remainder shares of
    ``epoch_size`` (default: the sources' total), ``round(repeat[s] * size[s])``, or
    (neither) every source once. ``labels``: how errors name each source (default: its
    position).

    Example:
        >>> mix_allotments((100, 10), weights=(0.5, 0.5))
        (55, 55)
        >>> mix_allotments((100, 10), repeat=(0.5, 3))
        (50, 30)

    Raises:
        ValueError: both ``weights`` and ``repeat``, ``epoch_size`` without
            ``weights``, a value out of range, or a source allotted no draw.
        TypeError: a value of the wrong type.
    """
    sizes = [check_int("source size", s, 1, owner=owner, numpy_ok=True) for s in source_sizes]
    if not sizes:
        raise ValueError(f"{owner}: sources is empty; pass at least one dataset.")
    if weights is not None and repeat is not None:
        raise ValueError(
            f"{owner}: pass weights= or repeat=, not both; got weights={list(weights)!r} and "
            f"repeat={list(repeat)!r}."
        )
    if epoch_size is not None and weights is None:
        raise ValueError(
            f"{owner}: epoch_size={epoch_size!r} applies to weights= only (with repeat= the "
            "epoch is the sources' passes); pass weights= or drop epoch_size."
        )
    at = [str(i) for i in range(len(sizes))] if labels is None else list(labels)
    if weights is None:
        return _by_repeat(sizes, repeat, owner, at)
    return _by_weights(sizes, weights, epoch_size, owner, at)


def _by_repeat(
    sizes: list[int], repeat: Sequence[float] | None, owner: str, at: list[str]
) -> tuple[int, ...]:
    """``round(repeat[s] * sizes[s])`` draws from each source (``None``: every source once)."""
    if repeat is None:
        return tuple(sizes)
    passes = _positive_numbers("repeat", repeat, owner, at)
    out = [round(p * n) for p, n in zip(passes, sizes, strict=True)]
    for i, a in enumerate(out):
        if a == 0:
            raise ValueError(
                f"{owner}: repeat[{at[i]}]={float(passes[i])} of a source of {sizes[i]} samples "
                f"rounds to 0 draws per epoch; pass repeat[{at[i]}] >= {1 / sizes[i]:.3g} (one "
                "draw)."
            )
    return tuple(out)


def _by_weights(
    sizes: list[int], weights: Sequence[float], epoch_size: int | None, owner: str, at: list[str]
) -> tuple[int, ...]:
    """``weights``' shares of ``epoch_size`` draws, by largest remainder (ties: earlier source)."""
    ws = _positive_numbers("weights", weights, owner, at)
    size = sum(sizes) if epoch_size is None else epoch_size
    fix = "pass the samples per epoch, e.g. epoch_size=100_000, or None"
    total = check_int("epoch_size", size, 1, owner=owner, fix=fix, numpy_ok=True, limit=_MAX)
    scale = Fraction(total) / sum(ws)
    quotas = [w * scale for w in ws]
    out = [int(q) for q in quotas]  # floor: quotas are positive
    by_remainder = sorted(range(len(ws)), key=lambda i: (-(quotas[i] - out[i]), i))
    for i in by_remainder[: total - sum(out)]:
        out[i] += 1
    for i, a in enumerate(out):
        if a == 0:
            raise ValueError(
                f"{owner}: weights[{at[i]}]={float(ws[i])} gets 0 of epoch_size={total} samples "
                f"per epoch; raise the weight or epoch_size (epoch_size="
                f"{int(-(-sum(ws) // ws[i]))} gives it a draw)."
            )
    return tuple(out)


class _MixMap:
    """One epoch's mix order as a function of positions."""

    __slots__ = (
        "_bases",
        "_drawn",
        "_ends",
        "_first",
        "_last",
        "_offsets",
        "_perm",
        "_sizes",
        "_starts",
        "_total",
    )

    def __init__(self, plan: MixPlan, epoch: int) -> None:
        length = plan.epoch_length(epoch)
        per = np.asarray(plan.per_epoch, dtype=np.int64)
        self._ends = np.cumsum(per)
        self._starts = self._ends - per
        self._sizes = np.asarray(plan.source_sizes, dtype=np.int64)
        self._offsets = np.cumsum(self._sizes) - self._sizes
        self._drawn = per * epoch  # each source's draws before this epoch (checked < 2**63)
        self._first = self._drawn // self._sizes  # each source's first source-epoch in it
        self._total = np.int64(plan.num_samples)
        self._last: tuple[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._perm: KeyedPermutation | None = None
        self._bases: np.ndarray | None = None
        if plan.shuffle:
            self._perm = KeyedPermutation(length, derive_seed(plan.seed, SeedTag.MIX_ORDER, epoch))
            bases = [derive_seed(plan.seed, SeedTag.MIX_SOURCE, s) for s in range(per.size)]
            self._bases = np.array(bases, dtype=np.uint64)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(source, source_epoch, sample in source)`` at ``positions`` (int64, flat)."""
        flat = np.asarray(positions).reshape(-1).astype(np.int64)
        tag = flat.tobytes()
        if self._last is not None and self._last[0] == tag:
            # A keyed schedule asks for a chunk's indices, then its keys.
            return self._last[1]
        q = flat if self._perm is None else self._perm.at(flat)
        source = np.searchsorted(self._ends, q, side="right")
        draw = self._drawn[source] + (q - self._starts[source])
        k, local = np.divmod(draw, self._sizes[source])
        if self._perm is not None:
            local = self._permute(source, k, local)
        self._last = (tag, (source, k, local))
        return source, k, local

    def _permute(self, source: np.ndarray, k: np.ndarray, local: np.ndarray) -> np.ndarray:
        assert self._bases is not None
        # Source-epoch k is keyed by splitmix64's (k+1)-th output from the source's base.
        keys = k.astype(np.uint64) + np.uint64(1)
        keys *= np.uint64(GOLDEN)
        keys += self._bases[source]
        return permute_many(self._sizes[source], mix64_array(keys), local)

    def at(self, positions: np.ndarray) -> np.ndarray:
        given = np.asarray(positions)
        source, _, local = self.locate(given)
        return (self._offsets[source] + local).reshape(given.shape)

    def keys_at(self, positions: np.ndarray) -> np.ndarray:
        """The per-sample seeding key of each draw at ``positions``."""
        given = np.asarray(positions)
        source, k, local = self.locate(given)
        keys = self._offsets[source] + local + (k - self._first[source]) * self._total
        return keys.reshape(given.shape)


class _MixKeys:
    """An epoch's seeding keys as a position map (what a keyed schedule deals)."""

    __slots__ = ("_map",)

    def __init__(self, mapping: _MixMap) -> None:
        self._map = mapping

    def at(self, positions: np.ndarray) -> np.ndarray:
        return self._map.keys_at(positions)


def _check_names(names: Sequence[str] | None, count: int, owner: str) -> tuple[str, ...]:
    if names is None:
        return tuple(str(i) for i in range(count))
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(
            f"{owner}: source_names must be a list of str, one per source, got {names!r}."
        )
    if len(names) != count or len(set(names)) != count:
        raise ValueError(
            f"{owner}: source_names must name each of the {count} sources once, got "
            f"{list(names)!r}; pass {count} distinct names in source order."
        )
    return tuple(names)


class MixPlan:
    """Fixed-size batches over a weighted mix of sources (:meth:`loaderkit.MixedDataset.plan`).

    Args:
        source_sizes: Samples per source (each >= 1), laid end to end.
        per_epoch: Draws per epoch from each source (each >= 1).
        batch_size: Samples per batch on each rank.
        shuffle: Interleave the sources and permute each per source-epoch; else the
            sources' blocks in order, each read front to back.
        seed: Non-negative seed.
        drop_last: As :class:`~loaderkit.SamplePlan`'s.
        source_names: The sources' names (default ``"0"``, ``"1"``, ...), checked on resume.

    Attributes:
        num_samples: The dataset's size, ``sum(source_sizes)`` (global indices).
        offsets: The first global index of each source.
    """

    def __init__(
        self,
        *,
        source_sizes: Sequence[int],
        per_epoch: Sequence[int],
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        source_names: Sequence[str] | None = None,
    ) -> None:
        owner = "MixPlan"
        self.source_sizes = tuple(
            check_int(f"source_sizes[{i}]", n, 1, owner=owner, numpy_ok=True)
            for i, n in enumerate(source_sizes)
        )
        self.per_epoch = tuple(
            check_int(f"per_epoch[{i}]", a, 1, owner=owner, numpy_ok=True)
            for i, a in enumerate(per_epoch)
        )
        if not self.source_sizes or len(self.per_epoch) != len(self.source_sizes):
            raise ValueError(
                f"{owner}: per_epoch must hold one count per source ({len(self.source_sizes)}), "
                f"got {len(self.per_epoch)}; pass one per source (at least one source)."
            )
        self.batch_size = check_int("batch_size", batch_size, 1, owner=owner)
        self.shuffle = check_bool("shuffle", shuffle, owner=owner)
        self.seed = check_int("seed", seed, 0, owner=owner, numpy_ok=True)
        self.drop_last = check_bool("drop_last", drop_last, owner=owner)
        self.source_names = _check_names(source_names, len(self.source_sizes), owner)
        self.num_samples = sum(self.source_sizes)
        length = sum(self.per_epoch)
        if self.num_samples >= _MAX or length >= _MAX:
            raise ValueError(
                f"{owner}: sources and epoch must hold < 2**63 samples, got {self.num_samples} "
                f"and {length}; pass smaller source_sizes or per_epoch."
            )
        # A draw's seeding key is below num_samples * (source-epochs an epoch spans).
        pairs = zip(self.per_epoch, self.source_sizes, strict=True)
        spans = max((a - 1) // n + 2 for a, n in pairs)
        if self.num_samples * spans >= _MAX:
            raise ValueError(
                f"{owner}: {self.num_samples} samples x {spans} (the source-epochs one epoch "
                "spans, 2 without upsampling) needs seeding keys >= 2**63; pass smaller "
                "sources, or lower the most upsampled source's weight."
            )
        self.offsets = tuple(np.cumsum((0, *self.source_sizes[:-1])).tolist())
        self._dealing = SamplePlan(
            num_samples=length, batch_size=self.batch_size, drop_last=self.drop_last
        )

    def __repr__(self) -> str:
        return (
            f"MixPlan(source_sizes={self.source_sizes}, per_epoch={self.per_epoch}, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle}, seed={self.seed}, "
            f"drop_last={self.drop_last}, source_names={list(self.source_names)})"
        )

    def epoch_length(self, epoch: int) -> int:
        """Positions per epoch: ``sum(per_epoch)``, in every epoch."""
        return self._dealing.num_samples

    def _epoch(self, epoch: int) -> int:
        epoch = check_int("epoch", epoch, 0, owner="MixPlan", numpy_ok=True)
        if (epoch + 1) * max(self.per_epoch) >= _MAX:
            raise ValueError(f"MixPlan: epoch {epoch} counts more than 2**63 draws of a source.")
        return epoch

    def order_map(self, epoch: int) -> _MixMap:
        """The epoch's order as a map from positions to global indices, never materialized."""
        return _MixMap(self, self._epoch(epoch))

    def order(self, epoch: int) -> torch.Tensor:
        """The whole epoch's order of global indices (int64), materialized."""
        return materialize(self.order_map(epoch), self.epoch_length(epoch))

    def locate(self, epoch: int, positions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(source, source_epoch, sample in source)`` at ``positions`` of ``epoch`` (flat)."""
        pos = check_positions(positions, self.epoch_length(epoch), "epoch_length")
        return self.order_map(epoch).locate(pos)

    def source_epochs(self, epoch: int) -> tuple[tuple[int, int], ...]:
        """Per source, the first and last source-epoch that ``epoch``'s draws fall in."""
        epoch = self._epoch(epoch)
        return tuple(
            (epoch * a // n, ((epoch + 1) * a - 1) // n)
            for a, n in zip(self.per_epoch, self.source_sizes, strict=True)
        )

    def schedule(self, epoch: int, *, start: int, rank: int, world_size: int) -> _FixedSchedule:
        """The batches ``rank`` of ``world_size`` yields in ``epoch`` from ``start``."""
        steps_from(self._dealing, start, world_size)
        check_rank(rank, world_size, owner="MixPlan")
        mapping = self.order_map(epoch)
        # Where no sample is drawn twice, the keys are the indices.
        once = all(first == last for first, last in self.source_epochs(epoch))
        keys = None if once else _MixKeys(mapping)
        return _FixedSchedule(self._dealing, mapping, epoch, start, rank, world_size, keys)

    def num_steps(self, epoch: int, *, start: int, world_size: int) -> int:
        """Batches per rank from ``start`` to the end of an epoch (the same every epoch)."""
        return steps_from(self._dealing, start, world_size)

    def fingerprint(self) -> dict[str, Any]:
        """The settings a saved position is only meaningful for."""
        return {
            "kind": "mix",
            "num_samples": self.num_samples,
            "source_names": list(self.source_names),
            "source_sizes": list(self.source_sizes),
            "per_epoch": list(self.per_epoch),
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "order_check": _mix_check() if self.shuffle else 0,
            # Older states, whose draws of a sample shared one key, lack it and are refused.
            "repeat_seeding": "per_draw",
        }


class MixBucketPlan(BucketPlan):
    """A :class:`~loaderkit.BucketPlan` over the epoch's :class:`MixPlan` order
    (:meth:`loaderkit.MixedDataset.bucket_batch_sampler`); each draw seeded apart.

    Args:
        lengths: Token count per global index (the sources laid end to end).
        source_sizes: Samples per source; they must add up to ``len(lengths)``.
        per_epoch: Draws per epoch from each source.
        source_names: The sources' names, as :class:`MixPlan` takes them.
        **options: The :class:`~loaderkit.plan.bucket.BucketOptions`.
    """

    def __init__(
        self,
        lengths: object,
        *,
        source_sizes: Sequence[int],
        per_epoch: Sequence[int],
        source_names: Sequence[str] | None = None,
        **options: Unpack[BucketOptions],
    ) -> None:
        super().__init__(lengths, **options)
        self.mix = MixPlan(
            source_sizes=source_sizes,
            per_epoch=per_epoch,
            batch_size=1,  # only the order is used; the batches are cut here
            shuffle=self.shuffle,
            seed=self.seed,
            source_names=source_names,
        )
        self._check_total(self.mix.num_samples, "the sources", "MixedDataset.lengths()")

    def _samples_per_epoch(self) -> int:
        return self.mix.epoch_length(0)

    def _seed_keys(self, order: np.ndarray) -> np.ndarray | None:
        """One key per draw, so a sample drawn twice is seeded apart (None: none repeats)."""
        keys = occurrence_keys(torch.from_numpy(order), self.num_samples)
        return None if keys is None else keys.numpy()

    def _unsorted(self, epoch: int) -> np.ndarray:
        order = self._eligible_only(self.mix.order(epoch).numpy())
        if order.size == 0:  # every sample drawn was skipped; batching it divided by zero
            raise ValueError(
                f"BucketBatchSampler: epoch {epoch} of the mix draws only samples longer than "
                f"max_tokens={self.max_tokens} (oversize='skip'), so it has no batch; raise "
                "max_tokens, or the weights of the sources with shorter samples."
            )
        return order

    def fingerprint(self) -> dict[str, Any]:
        """:class:`~loaderkit.BucketPlan`'s settings and the mix's."""
        mix = self.mix.fingerprint()
        return {
            **super().fingerprint(),
            "kind": "mix-bucket",
            "source_names": mix["source_names"],
            "source_sizes": mix["source_sizes"],
            "per_epoch": mix["per_epoch"],
            "mix_check": mix["order_check"],
            "repeat_seeding": mix["repeat_seeding"],
        }


@functools.cache
def _mix_check() -> int:
    """Checksum of a small mix's order: one mapped differently is refused on resume."""
    plan = MixPlan(source_sizes=(7, 1, 30), per_epoch=(20, 3, 11), batch_size=1, seed=20240917)
    digest = zlib.crc32(plan.order(3).numpy().tobytes())
    return zlib.crc32(permutation_digest().to_bytes(8, "little"), digest)
