"""The bucketing plan (length-sorted batches as a pure function of ``(seed, epoch)``), and lengths.

:class:`BucketPlan` implements the :class:`~loaderkit.plan.sample.Plan` protocol for
:class:`~loaderkit.BucketBatchSampler`. An epoch's *global sequence of batches*
is computed from ``(seed, epoch)`` and the lengths alone:

1. the dataset indices are shuffled (a seeded ``torch.randperm``); samples
   dropped by ``oversize="skip"`` are not part of it;
2. the shuffled order is cut into windows of ``window`` samples, and each
   window is sorted by length, longest first (a stable sort: equal lengths
   keep their shuffled order, so ties differ between epochs too);
3. each window is cut into batches, front to back: of ``batch_size`` samples
   (fixed-size mode), or greedily as many samples as fit in ``max_tokens``
   (token-budget mode: rows x padded length, the padded length being the
   batch's longest sample rounded up to ``pad_to_multiple_of``; as a window is
   sorted longest first, a batch's first sample sets its padded length).
   Batches never cross a window;
4. the batch order is shuffled (a second seeded ``torch.randperm``), so long
   and short batches are mixed over the epoch instead of clumped by window.

A *position* is the number of batches of that global sequence consumed by all
ranks together; ``epoch_length(epoch)`` is the number of batches ``G`` (under a
token budget it changes from epoch to epoch). From a start position, each
*global step* deals ``world_size`` consecutive batches of the sequence, rank
``r`` taking the ``r``-th: so every rank steps the same number of times, while
the batches of one step may differ in rows and tokens (each within budget).
When the batches left, ``G - start``, are not a multiple of ``world_size``:

- ``drop_last=True``: the last ``(G - start) % world_size`` batches are not
  trained in that epoch; every rank takes ``(G - start) // world_size`` steps;
- ``drop_last=False``: every rank takes ``ceil((G - start) / world_size)``
  steps; in the last step, the ranks past the real batches take batches
  ``0, 1, ...`` of the same epoch's sequence again (wrapping if ``G`` is
  smaller than ``world_size``). Those samples are seen twice that epoch.

Resuming at a position under another world size re-deals only the remaining
batches, so every sample is still trained exactly once per epoch (apart from
the documented repeats and drops).

:func:`compute_lengths` computes the lengths from a dataset once, with a
progress bar, and caches them in a ``.npy`` file.

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

import zlib
from collections import OrderedDict
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

from loaderkit._checks import check_bool, check_int, check_rank
from loaderkit._tags import SeedTag
from loaderkit.plan._bucket_order import as_lengths, greedy_starts, sort_windows
from loaderkit.plan.sample import SamplePlan, _FixedSchedule, permutation_check
from loaderkit.seeding import derive_seed

__all__ = ["BucketPlan"]

Oversize = Literal["error", "skip", "truncate"]
_OVERSIZE = ("error", "skip", "truncate")
_WINDOW_BATCHES = 256  # default window: this many batches' worth of samples (see the docstring)
_CACHED_EPOCHS = 2  # a loader asks for the current epoch and, for len(), the next


class _Epoch(NamedTuple):
    """One epoch's global batch sequence, in three arrays (no Python list per batch)."""

    order: np.ndarray  # dataset indices, length-sorted within windows (int64)
    bounds: np.ndarray  # batch b is order[bounds[b] : bounds[b + 1]]
    sequence: np.ndarray  # batch ids in training order: the global sequence


class BucketPlan:
    """Length-bucketed batches, fixed-size or under a token budget (see the module docstring).

    Built by :class:`~loaderkit.BucketBatchSampler`, which documents the
    arguments; ``sampler.plan`` is this object.

    Attributes:
        num_samples: Dataset size (``len(lengths)``), skipped samples included.
        seed: The seed of both shuffles.
        window: Samples per length-sorted window (resolved default).
        max_length: The longest sample a batch can hold under ``max_tokens``
            (``max_tokens`` rounded down to ``pad_to_multiple_of``); ``None``
            for fixed-size batches.
        oversize_indices: Dataset indices longer than ``max_length`` (int64):
            skipped (``oversize="skip"``) or batched alone (``"truncate"``).
    """

    def __init__(
        self,
        lengths: object,
        *,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        window: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        oversize: Oversize = "error",
    ) -> None:
        self._lengths = as_lengths(lengths)
        self.num_samples = int(self._lengths.size)
        if batch_size is None and max_tokens is None:
            raise ValueError(
                "BucketBatchSampler: pass batch_size=<int> for fixed-size batches or "
                "max_tokens=<int> for a token budget per batch (or both: a budget with at "
                "most batch_size rows); got neither."
            )
        if batch_size is not None:
            batch_size = check_int(
                "batch_size",
                batch_size,
                1,
                owner="BucketBatchSampler",
                fix="pass the rows per batch, e.g. 32",
                numpy_ok=True,
            )
        if max_tokens is not None:
            max_tokens = check_int(
                "max_tokens",
                max_tokens,
                1,
                owner="BucketBatchSampler",
                fix="pass the padded tokens per batch, e.g. 16384",
                numpy_ok=True,
            )
        if pad_to_multiple_of is not None:
            pad_to_multiple_of = check_int(
                "pad_to_multiple_of",
                pad_to_multiple_of,
                1,
                owner="BucketBatchSampler",
                fix="pass e.g. 8, or None",
                numpy_ok=True,
            )
        self.seed = check_int(
            "seed",
            seed,
            0,
            owner="BucketBatchSampler",
            fix="pass a non-negative int such as seed=0",
            numpy_ok=True,
        )
        self.shuffle = check_bool("shuffle", shuffle, owner="BucketBatchSampler")
        self.drop_last = check_bool("drop_last", drop_last, owner="BucketBatchSampler")
        if oversize not in _OVERSIZE:
            raise ValueError(
                f"BucketBatchSampler: oversize must be 'error', 'skip' or 'truncate', got "
                f"{oversize!r}; pass one of these ('skip' drops samples longer than "
                "max_tokens, 'truncate' batches each alone)."
            )
        if oversize != "error" and max_tokens is None:
            raise ValueError(
                f"BucketBatchSampler: oversize={oversize!r} only applies with max_tokens; "
                "fixed-size batches have no token budget to exceed. Drop oversize or pass "
                "max_tokens."
            )
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.pad_to_multiple_of, self.oversize = pad_to_multiple_of, oversize
        self.max_length: int | None = None
        self.oversize_indices = np.empty(0, dtype=np.int64)
        # The length each sample is batched at: its own, or max_length once truncated.
        self._batch_len = self._lengths
        eligible = np.arange(self.num_samples)
        if max_tokens is not None:
            multiple = pad_to_multiple_of or 1
            self.max_length = max_tokens // multiple * multiple
            if self.max_length == 0:
                raise ValueError(
                    f"BucketBatchSampler: max_tokens={max_tokens} is below "
                    f"pad_to_multiple_of={pad_to_multiple_of}: no sample fits in a batch. "
                    f"Raise max_tokens to at least {multiple}."
                )
            self.oversize_indices = np.flatnonzero(self._lengths > self.max_length)
            if self.oversize_indices.size:
                eligible = self._oversize(eligible)
        if eligible.size == 0:
            raise ValueError(
                f"BucketBatchSampler: all {self.num_samples} samples are longer than "
                f"max_tokens={max_tokens} and were skipped; raise max_tokens."
            )
        self._eligible = eligible
        per_batch = batch_size
        if max_tokens is not None:
            mean = float(self._padded(self._batch_len[eligible]).mean())
            per_batch = min(batch_size or self.num_samples, max(1, int(max_tokens / max(mean, 1))))
        assert per_batch is not None
        if window is None:
            window = _WINDOW_BATCHES * per_batch
        window = check_int(
            "window",
            window,
            1,
            owner="BucketBatchSampler",
            fix="pass the samples per sorted window, or None",
            numpy_ok=True,
        )
        if max_tokens is None:
            assert batch_size is not None
            # A multiple of batch_size: only the epoch's last window ends in a short batch.
            window = -(-window // batch_size) * batch_size
        self.window = window
        self._crc = zlib.crc32(self._lengths.tobytes())
        self._cache: OrderedDict[int, _Epoch] = OrderedDict()

    def _oversize(self, eligible: np.ndarray) -> np.ndarray:
        first = int(self.oversize_indices[0])
        if self.oversize == "error":
            longest = int(self.oversize_indices[np.argmax(self._lengths[self.oversize_indices])])
            raise ValueError(
                f"BucketBatchSampler: sample {first} has length {self._lengths[first]}, above "
                f"max_tokens={self.max_tokens}"
                + (
                    f" (a batch holds at most {self.max_length} tokens per row with "
                    f"pad_to_multiple_of={self.pad_to_multiple_of})"
                    if self.max_length != self.max_tokens
                    else ""
                )
                + f": no batch can hold it ({self.oversize_indices.size} sample(s) are too "
                f"long; the longest is sample {longest} with {self._lengths[longest]}). "
                f"Raise max_tokens to >= {self._padded(self._lengths[longest : longest + 1])[0]},"
                " filter those samples out, or pass oversize='skip' (leave them out of every "
                "epoch) or oversize='truncate' (batch each alone; cut it to "
                f"{self.max_length} tokens in the dataset)."
            )
        if self.oversize == "skip":
            return np.setdiff1d(eligible, self.oversize_indices, assume_unique=True)
        assert self.max_length is not None
        self._batch_len = np.minimum(self._lengths, self.max_length)
        return eligible

    # ---------------------------------------------------------------- protocol
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
        check_int(
            "epoch",
            epoch,
            0,
            owner="BucketBatchSampler",
            fix="pass the epoch number",
            numpy_ok=True,
        )
        if self.max_tokens is None:
            assert self.batch_size is not None
            full, short = divmod(self._eligible.size, self.batch_size)
            return full + (1 if short and not self.drop_last else 0)
        return int(self._epoch(epoch).sequence.size)

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
        check_rank(
            rank,
            world_size,
            owner="BucketBatchSampler",
            fix="pass this process's rank",
            numpy_ok=True,
        )
        return _BucketSchedule(self._epoch(epoch), epoch, start, rank, world_size, self.drop_last)

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

    # ------------------------------------------------------------- inspection
    def batches(self, epoch: int) -> list[torch.Tensor]:
        """The epoch's global sequence of batches (dataset indices), before dealing to ranks."""
        ep = self._epoch(epoch)
        return [torch.from_numpy(ep.order[ep.bounds[b] : ep.bounds[b + 1]]) for b in ep.sequence]

    def token_counts(self, epoch: int) -> tuple[int, int]:
        """``(real, padded)`` tokens over the epoch's batches, padding as the budget counts it.

        Truncated samples count at ``max_length``. ``1 - real / padded`` is the
        padded-token fraction of the epoch.
        """
        ep = self._epoch(epoch)
        first, stop = ep.bounds[:-1], ep.bounds[1:]
        longest = self._padded(self._batch_len[ep.order[first]])  # windows sort longest first
        cumulative = np.concatenate(([0], np.cumsum(self._batch_len[ep.order])))
        real = int((cumulative[stop] - cumulative[first]).sum())
        return real, int(((stop - first) * longest).sum())

    # --------------------------------------------------------------- internals
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
        check_int(
            "world_size",
            world_size,
            1,
            owner="BucketBatchSampler",
            fix="pass the number of ranks",
            numpy_ok=True,
        )
        check_int(
            "start",
            start,
            0,
            owner="BucketBatchSampler",
            fix="pass a position saved by state_dict()",
            numpy_ok=True,
        )
        total = self.epoch_length(epoch)
        if start > total:
            raise ValueError(
                f"BucketBatchSampler: start must be <= the {total} batches of epoch {epoch}, got "
                f"{start}; a position past the end of the epoch means the epoch is complete."
            )
        return total

    def _epoch(self, epoch: int) -> _Epoch:
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
        check_int(
            "epoch",
            epoch,
            0,
            owner="BucketBatchSampler",
            fix="pass the epoch number",
            numpy_ok=True,
        )
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
        return _Epoch(order, bounds, self._sequence(epoch, starts))

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
    """One rank's rest-of-epoch under a :class:`BucketPlan`.

    Dealing the global batch sequence to the ranks is the sample plan's own
    dealing with one "sample" per batch: :class:`~loaderkit.plan.sample.SamplePlan`'s
    schedule over the batch ids (W consecutive ids per global step, the tail
    dropped or repeated from the start), mapped here to each batch's samples.
    """

    __slots__ = ("_bounds", "_dealt", "_order", "epoch", "num_steps", "start")

    def __init__(
        self, ep: _Epoch, epoch: int, start: int, rank: int, world_size: int, drop_last: bool
    ) -> None:
        self.epoch, self.start = epoch, start
        self._order, self._bounds = ep.order, ep.bounds
        total = int(ep.sequence.size)
        self._dealt: _FixedSchedule | None = None
        self.num_steps = 0
        if total:  # a plan of no batch (all dropped) deals nothing
            dealing = SamplePlan(num_samples=total, batch_size=1, drop_last=drop_last)
            ids = torch.from_numpy(ep.sequence.astype(np.int64, copy=False))
            self._dealt = _FixedSchedule(dealing, ids, epoch, start, rank, world_size)
            self.num_steps = self._dealt.num_steps

    def indices(self, step: int) -> torch.Tensor:
        if self._dealt is None:
            raise IndexError(f"step must be in [0, 0), got {step}.")
        b = self._dealt.indices_numpy(step)[0]
        return torch.from_numpy(self._order[self._bounds[b] : self._bounds[b + 1]])

    def position_after(self, step: int) -> int:
        assert self._dealt is not None
        return self._dealt.position_after(step)
