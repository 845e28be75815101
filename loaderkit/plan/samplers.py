"""Resumable, distributed-aware batch samplers over a plan, and which user samplers resume."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterator, Sequence, Sized
from dataclasses import dataclass
from typing import Any, Unpack

from torch.utils.data import DistributedSampler, Sampler, SequentialSampler

from loaderkit._callers import epoch_begun, host_of
from loaderkit._checks import check_int
from loaderkit.env import detect
from loaderkit.errors import LoaderkitError
from loaderkit.plan._agree import Rounds, agree_across_ranks
from loaderkit.plan._cursor import PlanCursor
from loaderkit.plan._sampler_plan import check_reproducible
from loaderkit.plan.bucket import BucketOptions, BucketPlan
from loaderkit.plan.mix import MixBucketPlan
from loaderkit.plan.sample import Plan
from loaderkit.plan.shard import DEFAULT_MIX, DEFAULT_WINDOW
from loaderkit.plan.shard_bucket import ShardBucketPlan

__all__ = ["BucketBatchSampler", "PlanBatchSampler", "check_resumable_sampler"]


class PlanBatchSampler(Sampler[list[int]]):
    """Yield this rank's batches of a plan; resumable with ``state_dict``.

    Its state counts the batches it handed out: under a ``DataLoader`` with workers, which
    draw ahead, exact resume needs :class:`~loaderkit.ResumableDataLoader` (one given a host
    by :func:`~loaderkit.attach_host` refuses such a state part-way through an epoch).

    Args:
        plan: The sample plan, e.g. ``SamplePlan(num_samples=..., batch_size=...)``.
        rank: This process's rank (default: from ``torch.distributed``, else 0).
        world_size: Number of ranks (default: from ``torch.distributed``, else 1).

    Attributes:
        shard_names_crc32: The shard files the indices name, set by the dataset methods
            whose plan has no such field (``bucket_batch_sampler()``, ``MixedDataset``'s
            samplers); a saved position over other files is refused.

    Example:
        >>> from loaderkit import SamplePlan
        >>> s = PlanBatchSampler(SamplePlan(num_samples=5, batch_size=2), rank=0, world_size=1)
        >>> list(s)
        [[0, 1], [2, 3], [4]]
        >>> s.state_dict()["position"]
        5
    """

    def __init__(self, plan: Plan, *, rank: int | None = None, world_size: int | None = None):
        if not all(hasattr(plan, a) for a in ("schedule", "fingerprint", "num_steps")):
            raise TypeError(
                f"plan must be a loaderkit Plan, got {type(plan).__name__}; pass a SamplePlan, "
                "a ShardPlan (ShardedDataset.plan()) or a BucketPlan."
            )
        self.plan = plan
        # numpy ints taken as plain ones, as torch's samplers take them
        owner, fix = type(self).__name__, "pass the process's rank and the number of ranks, or None"
        self.rank, self.world_size = (
            None
            if value is None
            else check_int(name, value, low, owner=owner, fix=fix, numpy_ok=True)
            for name, value, low in (("rank", rank, 0), ("world_size", world_size, 1))
        )
        self.shard_names_crc32: int | None = None
        self.shard_counts_crc32: int | None = None  # where the plan holds no shard sizes
        self._cursor = PlanCursor()
        self._lent: tuple[PlanCursor, weakref.ref[Sized]] | None = None  # lend_batch_sampler
        self._len_watch = _LenWatch()
        self._rounds = Rounds()
        self.prefetched_by = 0  # the workers of a DataLoader iterating it (attach_host)

    @property
    def _now(self) -> PlanCursor:
        return self._cursor if self._lent is None else self._lent[0]

    @property
    def epoch(self) -> int:
        """The epoch of the current (or last) iteration (the loader's, once lent to one)."""
        return self._now.epoch

    @property
    def position(self) -> int:
        """Global position in that epoch's plan after the batches drawn so far."""
        return self._now.position

    @property
    def steps_done(self) -> int:
        """Batches this rank drew in that epoch."""
        return self._now.steps_done

    def _fingerprint(self) -> dict[str, Any]:
        fields = self.plan.fingerprint()
        if self.shard_names_crc32 is not None:
            fields.setdefault("shard_names_crc32", self.shard_names_crc32)
        if self.shard_counts_crc32 is not None and "shard_sizes_crc32" not in fields:
            fields.setdefault("shard_counts_crc32", self.shard_counts_crc32)
        return fields

    def _topology(self) -> tuple[int, int]:
        env = detect(rank=self.rank, world_size=self.world_size, loader=self)
        return env.rank, env.world_size

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration yield ``epoch`` (from its start, unless resuming it)."""
        owner, fix = f"{type(self).__name__}.set_epoch", "pass the epoch about to start"
        self._cursor.set_epoch(check_int("epoch", epoch, 0, owner=owner, fix=fix, numpy_ok=True))

    def __iter__(self) -> Iterator[list[int]]:
        self._not_lent("__iter__", "iterate the loader")
        cursor = self._cursor
        rank, world_size = self._topology()
        # Lightning sets no batch sampler's epoch: a rebuilt one is told it here.
        cursor.host_names(epoch_begun(host_of(self), self), self.plan, restarts=True)
        epoch, start, steps_done = cursor.upcoming(self.plan)
        fields = {**self._fingerprint(), "world_size": world_size}
        fields |= {"epoch": epoch, "position": start, "steps_done": steps_done}
        owner = type(self).__name__
        agree_across_ranks(
            owner, fields, rank=rank, world_size=world_size, epoch=epoch, rounds=self._rounds
        )
        epoch, start, _ = cursor.begin(self.plan)
        sched = self.plan.schedule(epoch, start=start, rank=rank, world_size=world_size)
        driven = host_of(self).drives(self)
        self._len_watch.check("PlanBatchSampler", epoch, sched.num_steps, driven=driven)
        for step in range(sched.num_steps):
            batch = sched.indices(step).tolist()
            cursor.consumed(sched.position_after(step))
            yield batch

    def __len__(self) -> int:
        if self._lent is not None:
            loader = self._lent[1]()
            if loader is None:
                raise ReferenceError(
                    f"{type(self).__name__}.__len__: the ResumableDataLoader this sampler was "
                    "lent to no longer exists; take len() of a loader that holds it."
                )
            return len(loader)
        host_epoch = epoch_begun(host_of(self), self)
        epoch, start, _ = self._cursor.upcoming(self.plan, host_epoch, restarts=True)
        _, world_size = self._topology()
        length = self.plan.num_steps(epoch, start=start, world_size=world_size)
        if start == 0:  # a resumed epoch's rest is no whole epoch's length
            self._len_watch.answered(length)
        return length

    def __getstate__(self) -> dict[str, Any]:
        # A copy (pickled, or deep-copied with a module that holds it) is lent to no loader.
        return {**self.__dict__, "_lent": None}

    def _not_lent(self, method: str, fix: str | None = None) -> None:
        if self._lent is not None:  # see lend_batch_sampler
            fix = fix or f"call the loader's {method}"
            raise TypeError(
                f"{type(self).__name__}.{method}: this sampler is a ResumableDataLoader's "
                f"batch_sampler, and the loader keeps the position; {fix}."
            )

    def state_dict(self) -> dict[str, Any]:
        """Position of the batches drawn so far (rank-symmetric)."""
        self._not_lent("state_dict")
        if self.prefetched_by and self._now.drawn_into():
            raise ValueError(
                f"{type(self).__name__}.state_dict: a DataLoader with num_workers="
                f"{self.prefetched_by} draws batches ahead of those trained on, so a resume "
                "would skip them; use loaderkit.ResumableDataLoader, num_workers=0, or save "
                "after set_epoch() of the next epoch."
            )
        _, world_size = self._topology()
        return self._cursor.state(
            self.plan, self._fingerprint(), world_size=world_size, num_workers=0
        )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume at a saved position; the next iteration yields the rest of its epoch."""
        self._not_lent("load_state_dict")
        self._cursor.load(
            state_dict, self.plan, owner=type(self).__name__, fingerprint=self._fingerprint()
        )


def check_lendable(sampler: PlanBatchSampler) -> None:
    """Refuse a ``batch_sampler`` that already moved: the loader would drop its position."""
    cursor = sampler._cursor
    if (
        cursor.started
        or cursor.loaded(sampler.plan) is not None
        or cursor.upcoming(sampler.plan)[0]
    ):
        raise ValueError(
            f"ResumableDataLoader: batch_sampler={type(sampler).__name__} was iterated, loaded "
            "a state or set to an epoch, which the loader would drop; pass a new sampler, "
            "then call loader.load_state_dict(state) or loader.set_epoch(epoch)."
        )


def lend_batch_sampler(sampler: PlanBatchSampler, cursor: PlanCursor, loader: Sized) -> None:
    """Hand ``sampler`` (checked) to ``loader`` at ``cursor``: it shows the loader's position and
    length, and refuses its own iteration and state."""
    sampler._lent = (cursor, weakref.ref(loader))  # weak: no cycle through the loader


def check_resumable_sampler(sampler: object, *, parameter: str) -> None:
    """Refuse (TypeError) a sampler whose order is no function of ``(seed, epoch)``, or a
    ``batch_sampler`` that is no loaderkit ``PlanBatchSampler`` with its own ``__iter__``."""
    if isinstance(sampler, PlanBatchSampler):
        for name in ("__iter__", "__len__"):  # never called: see message
            if getattr(type(sampler), name) is not getattr(PlanBatchSampler, name):
                raise TypeError(
                    f"{parameter}={type(sampler).__name__} overrides {name}, which the loader "
                    "does not call (it hands out the plan's batches); filter samples in the "
                    "dataset or collate_fn instead."
                )
        return
    if parameter == "batch_sampler":
        raise TypeError(
            f"batch_sampler={type(sampler).__name__} cannot be resumed exactly (only a loaderkit "
            "plan's position is known); pass a PlanBatchSampler or BucketBatchSampler, or "
            "sampler=... with batch_size=... instead."
        )
    if isinstance(sampler, (SequentialSampler, DistributedSampler)):
        return
    check_reproducible(sampler, owner="check_resumable_sampler", parameter=parameter)


@dataclass(slots=True, eq=False)
class _LenWatch:
    """Refuses, under Lightning's loop, an epoch longer or shorter than the first ``len()``."""

    first: int | None = None
    managed: bool = False

    def answered(self, length: int) -> None:
        """``len()`` answered ``length`` batches (for a whole epoch)."""
        if self.first is None:
            self.first = length

    def check(self, owner: str, epoch: int, batches: int, *, driven: bool) -> None:
        """``epoch`` starts and will yield ``batches``; ``driven``: a host's loop iterates it."""
        if self.managed or self.first is None or batches == self.first or not driven:
            return
        if batches < self.first:
            raise LoaderkitError(
                f"{owner}: epoch {epoch} yields {batches} batches, fewer than the {self.first} "
                "len() first answered, so Lightning would end it without its validation; add "
                "loaderkit.ElasticResume() to the Trainer's callbacks."
            )
        raise LoaderkitError(
            f"{owner}: epoch {epoch} yields {batches} batches, more than the {self.first} len() "
            f"first answered, so Lightning would stop it after {self.first}, skipping the rest; "
            "add loaderkit.ElasticResume() to the Trainer's callbacks."
        )


class BucketBatchSampler(PlanBatchSampler):
    """Batches of similar lengths, fixed-size or under a token budget; distributed, resumable.

    Each epoch's batches are its :class:`BucketPlan`'s, a function of ``(seed, epoch)``;
    every rank yields as many. Under Lightning, :class:`~loaderkit.ElasticResume`
    re-reads a batch count that varies per epoch.

    Args:
        lengths: Token count of each dataset index, e.g. from :func:`~loaderkit.compute_lengths`.
        shard_sizes: Samples per shard of a :class:`~loaderkit.ShardedDataset`: the
            order follows the shards (:class:`~loaderkit.ShardBucketPlan`).
        mix_shards: With ``shard_sizes``: shards read at once.
        shard_window: With ``shard_sizes``: samples of a shard shuffled together.
        source_sizes: Samples per source of a :class:`~loaderkit.MixedDataset`
            (:class:`~loaderkit.MixBucketPlan`).
        per_epoch: With ``source_sizes``: draws per epoch from each source.
        source_names: With ``source_sizes``: the sources' names, checked on resume.
        rank: This process's rank (default: ``torch.distributed``, else 0).
        world_size: Number of ranks (default: ``torch.distributed``, else 1).
        **options: The :class:`~loaderkit.plan.bucket.BucketOptions` below.

    Keyword Args:
        batch_size (int | None): Rows per batch; with ``max_tokens``, an upper bound on the rows.
        max_tokens (int | None): Token budget per batch: rows x padded length (the longest
            sample rounded up to ``pad_to_multiple_of``).
        pad_to_multiple_of (int | None): The rounding your collate pads to; counted in the
            budget.
        seed (int): Seed of both shuffles (and of the loader's per-sample seeding).
        shuffle (bool): Shuffle indices and batch order per ``(seed, epoch)``; else windows
            of the index order, sorted, batches in order.
        window (int | None): Samples per length-sorted window: larger pads less, smaller
            mixes more (default: 256 batches' worth).
        drop_last (bool): Drop the batches that do not fill a global step instead of
            repeating; in fixed-size mode also the one short batch.
        oversize (str): A sample longer than ``max_length``: ``"error"`` raises; ``"skip"``
            leaves it out (``num_skipped``); ``"truncate"`` batches it alone
            (``num_truncated``; cut it in the dataset).

    Raises:
        ValueError: a bad argument, or a sample too long with ``oversize="error"``.
        TypeError: an argument of the wrong type.

    Example:
        >>> s = BucketBatchSampler([5, 1, 4, 2, 8, 3], max_tokens=8, shuffle=False)
        >>> list(s)
        [[4], [0], [2, 5], [3, 1]]
        >>> len(s), s.plan.epoch_length(0)
        (4, 4)
    """

    plan: BucketPlan

    def __init__(
        self,
        lengths: Any,
        *,
        shard_sizes: Sequence[int] | None = None,
        mix_shards: int = DEFAULT_MIX,
        shard_window: int = DEFAULT_WINDOW,
        source_sizes: Sequence[int] | None = None,
        per_epoch: Sequence[int] | None = None,
        source_names: Sequence[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        **options: Unpack[BucketOptions],
    ) -> None:
        if (
            (source_sizes is None) != (per_epoch is None)
            or (source_sizes is not None and shard_sizes is not None)
            or (source_names is not None and source_sizes is None)
        ):
            raise ValueError(
                "BucketBatchSampler: source_sizes and per_epoch go together (with source_names) "
                f"and exclude shard_sizes, got source_sizes={source_sizes!r}, per_epoch="
                f"{per_epoch!r}, shard_sizes={shard_sizes!r}; pass a mix's sizes and allotments, "
                "shards or neither."
            )
        plan: BucketPlan
        if shard_sizes is not None:
            plan = ShardBucketPlan(
                lengths,
                shard_sizes=shard_sizes,
                mix_shards=mix_shards,
                shard_window=shard_window,
                **options,
            )
        else:
            for name, given, default in (
                ("mix_shards", mix_shards, DEFAULT_MIX),
                ("shard_window", shard_window, DEFAULT_WINDOW),
            ):
                if given != default:
                    raise ValueError(
                        f"BucketBatchSampler: {name}={given!r} applies to shards only; pass "
                        "shard_sizes= (as ShardedDataset.bucket_batch_sampler() does) or drop "
                        f"{name}."
                    )
            if source_sizes is None or per_epoch is None:  # neither (see the check above)
                plan = BucketPlan(lengths, **options)
            else:
                plan = MixBucketPlan(
                    lengths,
                    source_sizes=source_sizes,
                    per_epoch=per_epoch,
                    source_names=source_names,
                    **options,
                )
        super().__init__(plan, rank=rank, world_size=world_size)
        if rank is not None or world_size is not None:  # validates now, not at the first batch
            detect(rank=self.rank, world_size=self.world_size)
        _warn_oversize(plan)

    @property
    def num_skipped(self) -> int:
        """Samples left out of every epoch (``oversize="skip"``)."""
        return self.plan.num_skipped

    @property
    def num_truncated(self) -> int:
        """Samples batched alone, to be cut to ``max_length`` (``oversize="truncate"``)."""
        return self.plan.num_truncated

    @property
    def max_length(self) -> int | None:
        """The longest sample one batch holds under ``max_tokens`` (``None``: fixed-size)."""
        return self.plan.max_length


def _warn_oversize(plan: BucketPlan) -> None:
    """Warn of the samples longer than ``max_length`` a BucketBatchSampler skips or cuts."""
    if plan.oversize_indices.size:
        what = "skipped" if plan.oversize == "skip" else "batched alone, to be truncated to"
        warnings.warn(
            f"BucketBatchSampler: {plan.oversize_indices.size} of {plan.num_samples} samples "
            f"are longer than max_length={plan.max_length} tokens (max_tokens="
            f"{plan.max_tokens}) and are {what}"
            + (f" {plan.max_length} tokens" if plan.oversize == "truncate" else "")
            + f" (oversize={plan.oversize!r}); the first is sample "
            f"{int(plan.oversize_indices[0])} with {plan.lengths[plan.oversize_indices[0]]}.",
            UserWarning,
            stacklevel=3,  # the caller of BucketBatchSampler()
        )
