"""The bucketing plan (length-sorted batches as a pure function of ``(seed, epoch)``), and lengths.

:class:`BucketPlan` is :class:`~loaderkit.BucketBatchSampler`'s plan. An epoch: shuffle the
indices; cut them into ``window``-sample windows, each sorted longest first; cut each
window into batches (``batch_size`` rows, or as many as fit ``max_tokens`` padded);
shuffle the batch order. A global step deals ``world_size`` consecutive batches to
the ranks; the tail is dropped (``drop_last``) or filled with the epoch's first
batches. A position counts global batches, so a resume may change the world size.

Example:
    >>> plan = BucketPlan([5, 1, 4, 2, 8, 3], max_tokens=8, shuffle=False)
    >>> [b.tolist() for b in plan.batches(0)]  # lengths [8], [5], [4, 3], [2, 1]
    [[4], [0], [2, 5], [3, 1]]
    >>> s = plan.schedule(0, start=0, rank=1, world_size=2)
    >>> s.num_steps, [s.indices(i).tolist() for i in range(s.num_steps)]
    (2, [[0], [3, 1]])
    >>> plan.token_counts(0)  # (real, padded): 2 of 25 tokens are padding
    (23, 25)
"""

from __future__ import annotations

import functools
import zlib
from collections import OrderedDict
from typing import Any, Literal, NamedTuple, TypedDict, Unpack

import numpy as np
import torch

from loaderkit._checks import check_bool, check_int, check_rank
from loaderkit._tags import SeedTag
from loaderkit.plan._bucket_order import as_lengths, greedy_starts, sort_windows
from loaderkit.plan.sample import SamplePlan, _FixedSchedule, permutation_check
from loaderkit.seeding import derive_seed

__all__ = ["BucketOptions", "BucketPlan"]

Oversize = Literal["error", "skip", "truncate"]
_OVERSIZE = ("error", "skip", "truncate")
_OWNER = "BucketBatchSampler"
_WINDOW_BATCHES = 256  # default window: this many batches' worth of samples
_CACHED_EPOCHS = 2  # a loader asks for the current epoch and, for len(), the next


class BucketOptions(TypedDict, total=False):
    """:class:`~loaderkit.BucketBatchSampler`'s options (documented there), checked by
    :class:`BucketPlan`.

    Example:
        >>> options: BucketOptions = {"max_tokens": 8, "shuffle": False}
        >>> BucketPlan([5, 1, 4, 2, 8, 3], **options).max_length
        8
    """

    batch_size: int | None
    max_tokens: int | None
    pad_to_multiple_of: int | None
    window: int | None
    shuffle: bool
    seed: int
    drop_last: bool
    oversize: Oversize


_FIX = {
    "batch_size": "pass the rows per batch, e.g. 32",
    "max_tokens": "pass the padded tokens per batch, e.g. 16384",
    "pad_to_multiple_of": "pass e.g. 8, or None",
    "window": "pass the samples per sorted window, or None",
    "seed": "pass a non-negative int such as seed=0",
}


def _int(name: str, value: object, minimum: int, fix: str) -> int:
    return check_int(name, value, minimum, owner=_OWNER, fix=fix, numpy_ok=True)


def _optional(options: BucketOptions, name: str) -> int | None:
    value = options.get(name)
    return None if value is None else _int(name, value, 1, _FIX[name])


class _Epoch(NamedTuple):
    """One epoch's global batch sequence, in arrays (no Python list per batch)."""

    order: np.ndarray  # dataset indices, length-sorted within windows (int64)
    bounds: np.ndarray  # batch b is order[bounds[b] : bounds[b + 1]]
    sequence: np.ndarray  # batch ids in training order: the global sequence
    keys: np.ndarray | None  # each sample's seeding key, laid out as order (None: its index)


class BucketPlan:
    """Length-bucketed batches: ``sampler.plan`` of a :class:`~loaderkit.BucketBatchSampler`.

    Attributes:
        num_samples: Dataset size (``len(lengths)``), skipped samples included.
        seed: The seed of both shuffles.
        window: Samples per length-sorted window (resolved default).
        max_length: The longest sample a batch can hold under ``max_tokens`` (None:
            fixed-size batches).
        oversize_indices: Dataset indices longer than ``max_length`` (int64).
    """

    def __init__(self, lengths: object, **options: Unpack[BucketOptions]) -> None:
        self._lengths = as_lengths(lengths)
        self.num_samples = int(self._lengths.size)
        self._take_options(options)
        # The length each sample is batched at: its own, or max_length once truncated.
        self._batch_len = self._lengths
        self._eligible = self._eligible_samples()
        self.window = self._resolve_window(_optional(options, "window"))
        self._crc = zlib.crc32(self._lengths.tobytes())
        self._cache: OrderedDict[int, _Epoch] = OrderedDict()

    def _take_options(self, options: BucketOptions) -> None:
        """Check and keep the options but ``window`` (its default needs the lengths)."""
        unknown = sorted(set(options) - BucketOptions.__optional_keys__)
        if unknown:
            raise TypeError(
                f"{_OWNER}: unknown option(s) {unknown}; pass only "
                f"{sorted(BucketOptions.__optional_keys__)}."
            )
        batch_size, max_tokens = options.get("batch_size"), options.get("max_tokens")
        if batch_size is None and max_tokens is None:
            raise ValueError(
                f"{_OWNER}: got neither batch_size nor max_tokens; pass batch_size=<int> for "
                "fixed-size batches or max_tokens=<int> for a token budget per batch (or both)."
            )
        self.batch_size, self.max_tokens, self.pad_to_multiple_of = (
            _optional(options, name) for name in ("batch_size", "max_tokens", "pad_to_multiple_of")
        )
        self.seed = _int("seed", options.get("seed", 0), 0, _FIX["seed"])
        self.shuffle = check_bool("shuffle", options.get("shuffle", True), owner=_OWNER)
        self.drop_last = check_bool("drop_last", options.get("drop_last", False), owner=_OWNER)
        self.oversize: Oversize = options.get("oversize", "error")
        if self.oversize not in _OVERSIZE:
            raise ValueError(
                f"{_OWNER}: oversize must be 'error', 'skip' or 'truncate', got "
                f"{self.oversize!r}; pass one of these."
            )
        if self.oversize != "error" and self.max_tokens is None:
            raise ValueError(
                f"{_OWNER}: oversize={self.oversize!r} only applies with max_tokens (fixed-size "
                "batches have no token budget); drop oversize or pass max_tokens."
            )
        self.max_length: int | None = None
        if self.max_tokens is not None:
            step = self.pad_to_multiple_of or 1
            self.max_length = self.max_tokens // step * step
            if self.max_length == 0:
                raise ValueError(
                    f"{_OWNER}: max_tokens={self.max_tokens} is below pad_to_multiple_of="
                    f"{step}, so no sample fits in a batch; raise max_tokens to at least {step}."
                )

    def _eligible_samples(self) -> np.ndarray:
        """The indices every epoch batches: all but those ``oversize="skip"`` leaves out."""
        eligible = np.arange(self.num_samples)
        self.oversize_indices = np.empty(0, dtype=np.int64)
        if self.max_length is not None:
            self.oversize_indices = np.flatnonzero(self._lengths > self.max_length)
            if self.oversize_indices.size:
                eligible = self._oversize(eligible)
        if eligible.size == 0:
            raise ValueError(
                f"{_OWNER}: all {self.num_samples} samples are longer than "
                f"max_tokens={self.max_tokens} and were skipped; raise max_tokens."
            )
        return eligible

    def _oversize(self, eligible: np.ndarray) -> np.ndarray:
        assert self.max_length is not None
        if self.oversize == "error":
            first = int(self.oversize_indices[0])
            longest = int(self.oversize_indices[np.argmax(self._lengths[self.oversize_indices])])
            per_row = (
                f" (at most {self.max_length} tokens per row with pad_to_multiple_of="
                f"{self.pad_to_multiple_of})"
                if self.max_length != self.max_tokens
                else ""
            )
            raise ValueError(
                f"{_OWNER}: sample {first} has length {self._lengths[first]}, above "
                f"max_tokens={self.max_tokens}{per_row}: {self.oversize_indices.size} sample(s) "
                f"are too long; the longest is sample {longest} with {self._lengths[longest]}. "
                f"Raise max_tokens to >= {self._padded(self._lengths[longest : longest + 1])[0]}, "
                "or pass oversize='skip' or 'truncate'."
            )
        if self.oversize == "skip":
            return np.setdiff1d(eligible, self.oversize_indices, assume_unique=True)
        self._batch_len = np.minimum(self._lengths, self.max_length)
        return eligible

    def _resolve_window(self, window: int | None) -> int:
        if window is None:
            per_batch = self.batch_size
            if self.max_tokens is not None:
                mean = float(self._padded(self._batch_len[self._eligible]).mean())
                rows = max(1, int(self.max_tokens / max(mean, 1)))
                per_batch = min(self.batch_size or self.num_samples, rows)
            assert per_batch is not None
            window = _WINDOW_BATCHES * per_batch
        if self.max_tokens is None:
            assert self.batch_size is not None
            # A multiple of batch_size: only the epoch's last window ends in a short batch.
            window = -(-window // self.batch_size) * self.batch_size
        return window

    @functools.cached_property
    def _eligible_mask(self) -> np.ndarray:
        mask = np.zeros(self.num_samples, dtype=bool)
        mask[self._eligible] = True
        return mask

    def _eligible_only(self, order: np.ndarray) -> np.ndarray:
        """``order`` (dataset indices) without the samples ``oversize="skip"`` leaves out."""
        if self._eligible.size == self.num_samples:
            return order
        return order[self._eligible_mask[order]]

    def _check_total(self, total: int, what: str, fix: str) -> None:
        if total != self.num_samples:
            raise ValueError(
                f"{_OWNER}: {what} hold {total} samples in all but there are {self.num_samples} "
                f"lengths; pass one length per sample, laid end to end ({fix})."
            )

    @property
    def num_skipped(self) -> int:
        """Samples left out of every epoch by ``oversize="skip"``."""
        return int(self.oversize_indices.size) if self.oversize == "skip" else 0

    @property
    def num_truncated(self) -> int:
        """Samples batched alone at ``max_length`` by ``oversize="truncate"``."""
        return int(self.oversize_indices.size) if self.oversize == "truncate" else 0

    @property
    def lengths(self) -> np.ndarray:
        """The lengths the plan was built from (a read-only view)."""
        view = self._lengths.view()
        view.flags.writeable = False
        return view

    def epoch_length(self, epoch: int) -> int:
        """Number of global batches ``G`` of ``epoch``: the position of a complete epoch."""
        if self.max_tokens is not None:
            return int(self._epoch(epoch).sequence.size)
        assert self.batch_size is not None
        _int("epoch", epoch, 0, "pass the epoch number")
        full, short = divmod(self._samples_per_epoch(), self.batch_size)
        return full + (1 if short and not self.drop_last else 0)

    def _samples_per_epoch(self) -> int:
        return int(self._eligible.size)

    def num_steps(self, epoch: int, *, start: int, world_size: int) -> int:
        """Batches per rank from position ``start`` to the end of ``epoch``."""
        total = self._check_position(epoch, start, world_size)
        if total == 0:
            return 0
        dealing = SamplePlan(num_samples=total, batch_size=1, drop_last=self.drop_last)
        return dealing.num_steps(epoch, start=start, world_size=world_size)

    def schedule(self, epoch: int, *, start: int, rank: int, world_size: int) -> _BucketSchedule:
        """The batches ``rank`` of ``world_size`` yields in ``epoch`` from ``start``."""
        self._check_position(epoch, start, world_size)
        check_rank(rank, world_size, owner=_OWNER, fix="pass this process's rank", numpy_ok=True)
        return _BucketSchedule(self._epoch(epoch), epoch, start, rank, world_size, self.drop_last)

    def _seed_keys(self, order: np.ndarray) -> np.ndarray | None:
        """Each sample's seeding key in an epoch's ``order`` (None: its index)."""
        return None

    def fingerprint(self) -> dict[str, Any]:
        """The settings a saved position is only meaningful for (lengths by checksum)."""
        return {
            "kind": "bucket",
            "num_samples": self.num_samples,
            "lengths_crc32": self._crc,
            "batch_size": self.batch_size,
            "max_tokens": self.max_tokens,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "window": self.window,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "oversize": self.oversize,
            "order_check": permutation_check() if self.shuffle else 0,
        }

    def batches(self, epoch: int) -> list[torch.Tensor]:
        """The epoch's global sequence of batches (dataset indices), before dealing to ranks."""
        ep = self._epoch(epoch)
        return [torch.from_numpy(ep.order[ep.bounds[b] : ep.bounds[b + 1]]) for b in ep.sequence]

    def token_counts(self, epoch: int) -> tuple[int, int]:
        """``(real, padded)`` tokens over the epoch's batches, as the budget counts them."""
        ep = self._epoch(epoch)
        first, stop = ep.bounds[:-1], ep.bounds[1:]
        longest = self._padded(self._batch_len[ep.order[first]])  # windows sort longest first
        cumulative = np.concatenate(([0], np.cumsum(self._batch_len[ep.order])))
        real = int((cumulative[stop] - cumulative[first]).sum())
        return real, int(((stop - first) * longest).sum())

    def _padded(self, lengths: np.ndarray) -> np.ndarray:
        multiple = self.pad_to_multiple_of
        if not multiple:
            return lengths
        return -(-lengths // multiple) * multiple

    def _rows_from(self, first: np.ndarray) -> np.ndarray:
        """Rows of batches whose first (longest) samples are the dataset indices ``first``."""
        assert self.max_tokens is not None
        padded = np.maximum(self._padded(self._batch_len[first]), 1)  # empty samples cost 1
        rows = self.max_tokens // padded
        return rows if self.batch_size is None else np.minimum(rows, self.batch_size)

    def _check_position(self, epoch: int, start: int, world_size: int) -> int:
        _int("world_size", world_size, 1, "pass the number of ranks")
        _int("start", start, 0, "pass a position saved by state_dict()")
        total = self.epoch_length(epoch)
        if start > total:
            raise ValueError(
                f"{_OWNER}: start must be <= the {total} batches of epoch {epoch}, got {start}; "
                "pass a position inside the epoch (past its end, the epoch is complete)."
            )
        return total

    def _epoch(self, epoch: int) -> _Epoch:
        _int("epoch", epoch, 0, "pass the epoch number")
        cached = self._cache.get(epoch)
        if cached is not None:
            self._cache.move_to_end(epoch)
            return cached
        built = self._build(epoch)
        self._cache[epoch] = built
        while len(self._cache) > _CACHED_EPOCHS:
            self._cache.popitem(last=False)
        return built

    def _build(self, epoch: int) -> _Epoch:
        order = self._unsorted(epoch)
        n = order.size
        order = order[sort_windows(self._batch_len[order], self.window)]
        if self.max_tokens is None:
            assert self.batch_size is not None
            starts = np.arange(0, n, self.batch_size)
            if self.drop_last and n % self.batch_size:
                # The one short batch (end of the last window): dropped, as torch's drop_last does.
                n = int(starts[-1])
                starts = starts[:-1]
        else:
            starts = greedy_starts(self._rows_from, order, self.window)
        bounds = np.append(starts, n).astype(np.int64)
        return _Epoch(order, bounds, self._sequence(epoch, starts), self._seed_keys(order))

    def _unsorted(self, epoch: int) -> np.ndarray:
        """Step 1: the epoch's eligible indices, before the windows are sorted."""
        order = self._eligible
        if not self.shuffle:
            return order
        n = order.size
        gen = torch.Generator().manual_seed(derive_seed(self.seed, SeedTag.BUCKET_ORDER, epoch))
        perm = torch.randperm(n, generator=gen).numpy()
        # Without skipped samples, eligible is arange(n): skip a 10M-entry gather.
        return perm if n == self.num_samples else order[perm]

    def _sequence(self, epoch: int, starts: np.ndarray) -> np.ndarray:
        """Step 4: the batches (by where they start in the sorted order) in training order."""
        count = starts.size
        if not self.shuffle:
            return np.arange(count)
        gen = torch.Generator().manual_seed(derive_seed(self.seed, SeedTag.BUCKET_BATCHES, epoch))
        return torch.randperm(count, generator=gen).numpy()


class _BucketSchedule:
    """One rank's rest-of-epoch under a :class:`BucketPlan`: a schedule over the batch ids."""

    __slots__ = ("_bounds", "_dealt", "_keys", "_order", "epoch", "num_steps", "start")

    def __init__(
        self, ep: _Epoch, epoch: int, start: int, rank: int, world_size: int, drop_last: bool
    ) -> None:
        self.epoch, self.start = epoch, start
        self._order, self._bounds, self._keys = ep.order, ep.bounds, ep.keys
        total = int(ep.sequence.size)
        self._dealt: _FixedSchedule | None = None
        self.num_steps = 0
        if total:  # a plan of no batch (all dropped) deals nothing
            dealing = SamplePlan(num_samples=total, batch_size=1, drop_last=drop_last)
            ids = torch.from_numpy(ep.sequence.astype(np.int64, copy=False))
            self._dealt = _FixedSchedule(dealing, ids, epoch, start, rank, world_size)
            self.num_steps = self._dealt.num_steps

    def indices(self, step: int) -> torch.Tensor:
        return torch.from_numpy(self.indices_numpy(step))

    def indices_numpy(self, step: int) -> np.ndarray:
        """:meth:`indices` as a numpy array; do not modify it (a view of the epoch's order)."""
        if self._dealt is None:
            raise IndexError(f"step must be in [0, 0), got {step}.")
        b = self._dealt.indices_numpy(step)[0]
        return self._order[self._bounds[b] : self._bounds[b + 1]]

    def seed_keys(self, step: int) -> np.ndarray | None:
        """The per-sample seeding keys of step ``step``'s batch (None: its indices)."""
        if self._keys is None or self._dealt is None:
            return None
        b = self._dealt.indices_numpy(step)[0]
        return self._keys[self._bounds[b] : self._bounds[b + 1]]

    def position_after(self, step: int) -> int:
        assert self._dealt is not None
        return self._dealt.position_after(step)
