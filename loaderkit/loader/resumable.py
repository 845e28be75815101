"""``ResumableDataLoader``: a DataLoader whose position is a point in the sample plan.

Why it is built on ``torch.utils.data.DataLoader`` and not on torchdata's
``StatefulDataLoader``: the plan (:mod:`loaderkit.plan.sample`) already decides every
batch in the main process from ``(seed, epoch, position)``, so workers hold no
state worth snapshotting; they only turn index batches into tensors.
``StatefulDataLoader``'s worker snapshots would cost a round trip per state,
replay stateless iterables from the start, and refuse a different
``num_workers`` on resume. Here the state is two integers, resume is O(1) in
the position, and ``num_workers`` or the world size may change.

Three more choices, each answering a measured failure of Lightning 2.6 with
torchdata 0.11 (``docs/design.md``):

- Consumption is counted when a batch is handed to the caller, not when a
  worker is asked for it, so prefetching never leaks into the state.
- The epoch is fixed at the first ``next()``, not at ``iter()``: Lightning
  creates the iterator before it calls ``set_epoch``.
- The state has no rank in it (every rank is at the same position), so the
  rank-0 checkpoint is right for all ranks.

The class is deliberately *not* a ``torch.utils.data.DataLoader`` subclass:
Lightning re-instantiates DataLoader subclasses to inject a
``DistributedSampler``, which would throw the plan away. It splits across
ranks itself (``rank``/``world_size``, detected from ``torch.distributed``).
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal
from zlib import crc32

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
)

from loaderkit._callers import host_of
from loaderkit._checks import check_int
from loaderkit.data.mixing import MixedDataset
from loaderkit.data.streaming import StreamingShardedDataset
from loaderkit.env import cpu_budget, detect
from loaderkit.errors import LoaderkitError, StateMismatchError
from loaderkit.loader._args import (
    check_auto_workers,
    check_sources,
    check_torch_only_args,
    check_worker_args,
    from_distributed_sampler,
    whole_order_sampler,
)
from loaderkit.loader._auto import MAX_AUTO_WORKERS, AutoWorkers, local_processes
from loaderkit.loader._fetch import (
    BatchFetcher,
    KeyedDataset,
    KeySource,
    Unbatched,
    loaderkit_batch_read,
)
from loaderkit.loader._iterable import IterableEngine, is_stateful
from loaderkit.loader._planned import EpochIterator, Run
from loaderkit.loader._stream import StreamEngine
from loaderkit.loader._views import IterableOrder, PlanBatches, hook_set_epoch, plan_order
from loaderkit.loader._workers import WorkerPool, stop_workers
from loaderkit.plan._agree import Rounds, agree_across_ranks
from loaderkit.plan._cursor import PlanCursor, field_digest
from loaderkit.plan._sampler_plan import SamplerPlan, generator_seed
from loaderkit.plan.mix import MixBucketPlan, MixPlan
from loaderkit.plan.sample import Plan, SamplePlan, Schedule
from loaderkit.plan.samplers import _LenWatch
from loaderkit.seeding import draws_nothing
from loaderkit.transfer import resolve_pin_memory, select_device

__all__ = ["ResumableDataLoader"]

# DataLoader arguments read once at construction (into the plan, the fetcher or the
# worker pool): an assignment afterwards would be silently ignored, so it is refused.
_FIXED_AFTER_INIT = frozenset(
    (
        "batch_size",
        "batch_sampler",
        "sampler",
        "drop_last",
        "dataset",
        "persistent_workers",
        "num_workers",
        "collate_fn",
        "worker_init_fn",
        "timeout",
        "generator",
        "multiprocessing_context",
        "prefetch_factor",
        "pin_memory",
        "pin_memory_device",
        "in_order",
    )
)

# The seed of ``seed=None`` across ranks: DistributedSampler's default, so a
# script moved from it keeps its order.
DDP_DEFAULT_SEED = 0


def draw_seed(generator: torch.Generator | None) -> int:
    """A seed in ``[0, 2**63)`` drawn from ``generator`` (else torch's global one).

    Drawing (not ``initial_seed()``) makes two loaders built one after the other
    differ, as two shuffled ``DataLoader`` s do, while ``torch.manual_seed``
    still makes a run reproducible.
    """
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def plain_sampler(sampler: Any, size: int) -> bool:
    """Whether ``sampler`` is one the loader's own plan replaces (else it is listed).

    Exact type only: a subclass may override ``__iter__``. A ``SequentialSampler``
    over another source (``SequentialSampler(range(4))`` with a 16-sample
    dataset) yields its own length, as under ``DataLoader``.
    """
    return type(sampler) is SequentialSampler and len(sampler) == size


class _Listed:
    """A SamplerPlan as a state saved in an epoch listed from a reseeded generator
    fingerprints it: with that state (``listed_from``), which the resume lists from."""

    def __init__(self, plan: SamplerPlan, listed: str) -> None:
        self.plan, self.listed = plan, listed

    def fingerprint(self) -> dict[str, Any]:
        return {**self.plan.fingerprint(), "listed_from": self.listed}

    def epoch_length(self, epoch: int) -> int:
        return self.plan.epoch_length(epoch)


class ResumableDataLoader:
    """A map-style DataLoader with exact, O(1), elastic mid-epoch resume.

    Takes the keyword arguments of ``torch.utils.data.DataLoader`` plus
    ``seed``, ``rank``/``world_size`` and ``per_sample_seeding``. Each new
    ``iter()`` starts the next epoch unless :meth:`set_epoch` said otherwise;
    after :meth:`load_state_dict`, the next ``iter()`` yields exactly the
    remaining batches of the saved epoch, and the one after that the next epoch.

    Args:
        dataset: A map-style dataset (``__len__`` and ``__getitem__``), or a torch
            ``IterableDataset``, iterated as ``DataLoader`` iterates it (see
            :mod:`loaderkit.loader._iterable`: one process, resumed from its
            state or by a checked replay, under the same ``num_workers``). Datasets
            with ``get_batch(indices)`` (loaderkit's tensor/array datasets) or
            ``__getitems__`` are fetched a whole batch per call. Or a
            :class:`~loaderkit.StreamingShardedDataset` (sizes unknown): its
            position is a cursor per (rank, worker), exact under the same
            topology (see :mod:`loaderkit.loader._stream`).
        batch_size: Samples per batch on each rank; ``None`` yields single samples,
            unbatched, as ``DataLoader`` does (``collate_fn`` then sees one sample,
            default: ``default_convert``).
        shuffle: Shuffle per ``(seed, epoch)``.
        sampler: Any sampler whose order is a function of ``(seed, epoch)``: one
            with a ``generator`` (given one seeded per epoch; with ``seed=None``, a
            ``torch.Generator`` of the user's decides: epoch 0 is torch's, later
            epochs follow its seed), one with ``set_epoch``, a
            ``DistributedSampler`` or subclass (listed whole and dealt as it deals:
            each rank yields torch's indices for it); one that lists a different
            order twice is refused. It stays ``loader.sampler`` (same object and
            class); its ``set_epoch(e)`` also sets the loader's epoch.
        batch_sampler: A loaderkit batch sampler carrying a plan (e.g.
            :class:`~loaderkit.PlanBatchSampler`); its plan replaces
            ``batch_size``/``shuffle``/``drop_last``. A torch ``BatchSampler`` is
            taken as its ``sampler``, ``batch_size`` and ``drop_last``.
        num_workers: Worker processes (0: load in this process), or ``"auto"``:
            start each epoch's first batches in this process, time how long
            the loop waits for them against its step, and start workers at the
            current position only if they shorten the step (kept only if
            measured to); map-style data only. The choice changes when batches
            are loaded, never which (see :meth:`describe`, ``"auto_workers"``).
        collate_fn: Merges a list of samples into a batch (default:
            ``default_collate``; not called for ``get_batch`` datasets).
        pin_memory: ``True``, ``False`` or ``"auto"`` (pin when the current
            accelerator is CUDA).
        drop_last: Drop the tail that does not fill a global step of
            ``world_size * batch_size``; else ranks' last batches are filled by
            wrapping to the start of the order (those samples repeat).
        timeout: Seconds to wait for a worker's batch (0: forever).
        worker_init_fn: Called in each worker after loaderkit seeded it.
        multiprocessing_context: As in ``DataLoader``. Default: ``fork``, but
            ``forkserver`` inside a torch.distributed process group, where
            forking a process with communication threads can deadlock.
        generator: Used only to draw ``seed`` when ``seed`` is None.
        prefetch_factor: Batches loaded ahead per worker (``num_workers > 0``).
        persistent_workers: Keep workers alive across epochs.
        seed: Seed of the order and of per-sample randomness. ``None``: in
            one process, drawn from ``generator`` (else torch's global
            generator), as ``DataLoader`` draws its shuffle order, so two
            loaders differ and ``torch.manual_seed`` makes them reproducible;
            across ranks (``world_size > 1`` known at construction, at a
            ``state_dict()`` or at the first batch), ``0``, the
            ``DistributedSampler`` default, since processes draw different
            seeds and every rank must split the same order. Replaced by the
            saved seed on :meth:`load_state_dict`.
        rank: This process's rank (default: ``torch.distributed``, else 0).
        world_size: Number of ranks (default: ``torch.distributed``, else 1).
        pin_memory_device: Accepted as ``DataLoader`` does (deprecated there):
            batches are pinned for the current accelerator.
        in_order: Must be ``True``: batches keep the plan's order, which is what
            makes a saved position exact.
        per_sample_seeding: Load sample ``i`` of epoch ``e`` under global RNGs
            seeded from ``(seed, e, i)``, so random augmentation is the same
            for any ``num_workers`` and after a resume. ``"auto"``: on unless
            the dataset fetches whole batches (``get_batch``), seeding torch's
            generator and those the dataset is seen drawing from
            (:class:`~loaderkit.seeding.SampleSeeder`); ``True``: all three for
            every sample. Either way a ``__getitems__`` dataset is read a whole
            batch per call while the read draws no randomness; one that draws is
            read one index at a time where it only gathers per-sample reads
            (``Subset``, ``ConcatDataset``), else refused naming the fix.

    Example:
        >>> import torch
        >>> from loaderkit import ResumableDataLoader
        >>> data = list(range(10))
        >>> loader = ResumableDataLoader(data, batch_size=4, shuffle=True, seed=0)
        >>> it = iter(loader); first = next(it)
        >>> state = loader.state_dict()
        >>> resumed = ResumableDataLoader(data, batch_size=4, shuffle=True, seed=0)
        >>> resumed.load_state_dict(state)
        >>> rest = list(resumed)
        >>> sorted(torch.cat([first, *rest]).tolist()) == data
        True
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool = False,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int | Literal["auto"] = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool | Literal["auto"] = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], Any] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        per_sample_seeding: bool | Literal["auto"] = "auto",
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        stream = isinstance(dataset, StreamingShardedDataset)
        iterable = isinstance(dataset, IterableDataset) and not stream
        given_batch_sampler = batch_sampler
        if type(batch_sampler) is BatchSampler and (batch_size, shuffle, sampler, drop_last) == (
            1,
            False,
            None,
            False,
        ):
            # torch's BatchSampler only cuts its sampler's order into batches: the same as
            # sampler=, batch_size=, drop_last=, which the plan resumes exactly.
            sampler, batch_size = batch_sampler.sampler, batch_sampler.batch_size
            drop_last, batch_sampler = batch_sampler.drop_last, None
        check_torch_only_args(pin_memory_device=pin_memory_device, in_order=in_order)
        # batch_size=None: torch's unbatched loading, one sample per step; the plan
        # deals batches of one and the collate function sees each sample alone.
        unbatched = batch_size is None and batch_sampler is None
        if unbatched:
            batch_size, collate_fn = 1, Unbatched(collate_fn)
        size = check_sources(dataset, sampler, batch_sampler, batch_size, shuffle, drop_last)
        # check_sources refused None with a batch_sampler; otherwise None became 1 above.
        batch_size = 1 if batch_size is None else batch_size
        if isinstance(sampler, DistributedSampler):
            seed, rank, world_size = from_distributed_sampler(sampler, size, seed, rank, world_size)
        # A seed the user gave the sampler's own generator decides, as under DataLoader.
        # A DistributedSamplerWrapper's seed is the wrapper's; its inner sampler's own
        # generator still lists epoch 0, as under DataLoader.
        user_generator = None
        distributed = isinstance(sampler, DistributedSampler)
        if (
            (seed is None or distributed)
            and sampler is not None
            and not plain_sampler(sampler, size)
        ):
            user_generator = generator_seed(sampler)
            if user_generator is not None and seed is None:
                seed = user_generator[0]
        self._seed_explicit = seed is not None
        plan_seed = getattr(getattr(batch_sampler, "plan", None), "seed", None)
        if plan_seed is not None and seed is not None and seed != plan_seed:
            raise ValueError(
                f"ResumableDataLoader: seed={seed} differs from the batch sampler's plan seed "
                f"{plan_seed}; leave seed=None to use the plan's, so order and augmentation "
                "share one saved seed."
            )
        if seed is None:
            seed = plan_seed
        # A seed drawn here is provisional: under DDP each process would draw its
        # own, and ranks splitting one order by different seeds lose samples
        # silently. It is settled when the topology is (the first batch).
        self._seed_drawn = seed is None
        if seed is None:
            seed = draw_seed(generator)
        self.seed = check_int(
            "seed",
            seed,
            0,
            owner="ResumableDataLoader",
            fix="pass a non-negative int such as seed=0",
        )
        self.plan: Plan
        if iterable and per_sample_seeding is True:
            raise ValueError(
                "ResumableDataLoader: per_sample_seeding=True keys randomness by sample index, "
                f"and an IterableDataset ({type(dataset).__name__}) has none; leave it 'auto' "
                "(each worker's RNGs are seeded from (seed, epoch, rank, worker), as "
                "DataLoader seeds them per worker) or draw from the dataset's own generator."
            )
        if stream or iterable:
            check_int(
                "batch_size",
                batch_size,
                1,
                owner="ResumableDataLoader",
                fix="pass the number of samples per batch",
            )
            # Stands in for the plan in code shared with map-style data; never iterated.
            self.plan = SamplePlan(num_samples=1, batch_size=batch_size, seed=self.seed)
        elif batch_sampler is not None:
            self.plan = batch_sampler.plan
            rank = batch_sampler.rank if rank is None else rank
            world_size = batch_sampler.world_size if world_size is None else world_size
        elif sampler is not None and not plain_sampler(sampler, size):
            # Any other sampler: its own order, keyed to (seed, epoch), dealt across ranks.
            # A DistributedSampler lists its whole order here (its own __iter__ yields
            # one rank's share) and is dealt as it deals; rank and world size came
            # from it above.
            self.plan = SamplerPlan(
                sampler=whole_order_sampler(sampler) if distributed else sampler,
                strided=distributed,
                dataset_size=size,
                batch_size=check_int("batch_size", batch_size, 1, owner="ResumableDataLoader"),
                seed=self.seed,
                drop_last=drop_last,
                first_state=None if user_generator is None else user_generator[1],
            )
        else:
            check_int(
                "batch_size",
                batch_size,
                1,
                owner="ResumableDataLoader",
                fix="pass the number of samples per batch",
            )
            self.plan = SamplePlan(
                num_samples=size,
                batch_size=batch_size,
                shuffle=shuffle,
                seed=self.seed,
                drop_last=drop_last,
            )
        if (
            self.plan.num_samples != size
            and not (stream or iterable)
            and not isinstance(self.plan, SamplerPlan)
        ):
            raise ValueError(
                f"ResumableDataLoader: the batch sampler's plan covers {self.plan.num_samples} "
                f"samples but the dataset has {size}; build the plan with num_samples={size}."
            )
        # Cached: state_dict() runs every step under Lightning checkpointing.
        self._fingerprint = self.plan.fingerprint()
        self._skeleton: dict[str, Any] | None = None  # state_dict()'s constant part
        self.dataset = dataset
        self.batch_size = None if unbatched else batch_size
        self.pin_memory_device = pin_memory_device
        self.in_order = in_order
        auto = isinstance(num_workers, str) and num_workers == "auto"
        if auto:
            check_auto_workers(
                dataset,
                iterable=iterable or stream,
                per_sample_seeding=per_sample_seeding,
                timeout=timeout,
            )
        workers = check_worker_args(
            # "auto" may start workers: their settings are checked as for num_workers=1.
            num_workers=1 if auto else num_workers,
            timeout=timeout,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            collate_fn=collate_fn,
            worker_init_fn=worker_init_fn,
            pin_memory=pin_memory,
            per_sample_seeding=per_sample_seeding,
            multiprocessing_context=multiprocessing_context,
        )
        pinned = resolve_pin_memory(pin_memory, select_device(), stacklevel=3)  # the caller's line
        # loaderkit's get_batch datasets and plain containers hold no randomness; others may.
        unseeded = loaderkit_batch_read(dataset) or draws_nothing(dataset)
        per_sample = not unseeded if per_sample_seeding == "auto" else per_sample_seeding
        per_sample = per_sample and not iterable
        self._fetch = BatchFetcher(
            # "auto" stays "auto" (lazy seeding) where seeding is on.
            dataset,
            collate_fn,
            seed=self.seed,
            per_sample_seeding=per_sample and per_sample_seeding,
        )
        if rank is not None or world_size is not None:
            detect(rank=rank, world_size=world_size)  # validates now, not at the first batch
        self._rank, self._world_size = rank, world_size
        # The measurements and choice of num_workers="auto" (None: a fixed count).
        self._auto: AutoWorkers | None = None
        if auto:
            local = local_processes(detect(rank=rank, world_size=world_size).world_size)
            self._auto = AutoWorkers(cap=min(cpu_budget(local), MAX_AUTO_WORKERS))
            workers = 0
        self._pool = WorkerPool(
            num_workers=workers,
            pin_memory=pinned,
            timeout=timeout,
            prefetch_factor=prefetch_factor,
            persistent=persistent_workers,
            user_init=worker_init_fn,
            start_method=multiprocessing_context,
        )
        # DataLoader's attributes, as code written for it reads them.
        fetch_collate = self._fetch.collate_fn
        self.collate_fn = (
            fetch_collate.collate_fn if isinstance(fetch_collate, Unbatched) else fetch_collate
        )
        self.drop_last = drop_last if iterable else getattr(self.plan, "drop_last", drop_last)
        self.generator = generator
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.prefetch_factor = prefetch_factor
        self.persistent_workers = persistent_workers
        # Views of the plan: Lightning calls sampler.set_epoch(e) (and
        # batch_sampler.sampler.set_epoch(e)) at every epoch start, never the loader's.
        self.sampler: Any
        self.batch_sampler: Any
        if iterable:
            # As DataLoader's: an endless constant sampler (here its set_epoch drives the
            # loader) and a BatchSampler over it, or none when unbatched.
            self.sampler = IterableOrder(self)
            self.batch_sampler = (
                None if unbatched else BatchSampler(self.sampler, batch_size, self.drop_last)
            )
        else:
            order = plan_order(self, shuffled=bool(getattr(self.plan, "shuffle", True)))
            self.sampler = sampler if sampler is not None else order
            if sampler is not None:
                hook_set_epoch(sampler, self)  # sampler.set_epoch(e) sets the loader's epoch
            self.batch_sampler = (
                given_batch_sampler if given_batch_sampler is not None else PlanBatches(order)
            )
        self._inner: DataLoader[Any] | None = None
        self._keys = KeySource()
        # The epoch of the current (or last) iteration, how far its order was
        # consumed, how many steps this rank took in it, and what comes next.
        self._cursor = PlanCursor()
        # The current iterator (the one that began last; its position is the
        # state) and every live one. Weak references: a strong one would put the
        # live iterator, its generator and the inner DataLoader's worker iterator
        # in a reference cycle. torch's worker iterator freed by the cycle
        # collector loses its queues' feeder threads first, never tells its
        # workers to stop, and waits 5 s per worker in join() (measured: 10 s with
        # 2 workers).
        self._live: weakref.ref[EpochIterator] | None = None
        self._iterators: weakref.WeakSet[EpochIterator] = weakref.WeakSet()
        self._current: Run | None = None
        self._ticks = itertools.count(1)
        self._waited = 0.0
        self._topology_cache: tuple[int, int] | None = None
        self._rounds = Rounds()  # this loader's comparisons across ranks (plan/_agree.py)
        self._lookahead: weakref.ref[Any] | None = None  # see _register_lookahead
        # Warns when an epoch outgrows the first len(), which Lightning keeps per fit.
        self._len_watch = _LenWatch()
        self._stream: StreamEngine | None = None
        self._iterable: IterableEngine | None = None
        if iterable:
            self._iterable = IterableEngine(
                self,
                dataset,
                batch_size=batch_size,
                drop_last=drop_last,
                collate_fn=self._fetch.collate_fn,
            )
        if stream:
            self._stream = StreamEngine(
                self,
                dataset,
                batch_size=batch_size,
                drop_last=drop_last,
                collate_fn=collate_fn,
                # Streams have no get_batch: every sample may carry randomness.
                per_sample_seeding=per_sample_seeding is not False,
            )
        # Where the ranks are known already (rank=/world_size=, a process group, a
        # Trainer building the loader), the seed is the ranks' common one from the start.
        self._settle_seed(final=False)
        self._built = True

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FIXED_AFTER_INIT and self.__dict__.get("_built", False):
            raise ValueError(
                f"ResumableDataLoader: {name} cannot be set after the loader is built, got "
                f"{name}={value!r:.60}; build a new ResumableDataLoader with {name}= passed to "
                "the constructor."
            )
        super().__setattr__(name, value)

    # ----------------------------------------------------------------- epochs
    @property
    def num_workers(self) -> int:
        """Worker processes loading now (0: in this process). Fixed at construction,
        except under ``num_workers="auto"``, where it is the current choice."""
        return self._pool.num_workers

    def _use_workers(self, count: int) -> None:
        """Load with ``count`` workers from the next batch on (``num_workers="auto"``)."""
        if self._inner is not None:
            # Persistent workers of the old count: stop them now, not at garbage collection.
            inner, self._inner = self._inner, None
            if inner._iterator is not None:
                stop_workers(inner, inner._iterator)
        self._pool = dataclasses.replace(self._pool, num_workers=count)

    def _rest_of_epoch(self, epoch: int, position: int) -> Schedule:
        """This rank's schedule for the rest of ``epoch`` from the global ``position``."""
        rank, world_size = self._topology()
        return self.plan.schedule(epoch, start=position, rank=rank, world_size=world_size)

    @property
    def pin_memory(self) -> bool:
        """Whether batches are pinned (``"auto"`` resolved at construction)."""
        return self._pool.pin_memory

    def _topology(self) -> tuple[int, int]:
        if self._topology_cache is not None:
            return self._topology_cache
        env = detect(rank=self._rank, world_size=self._world_size, loader=self)
        engine = self._stream or self._iterable
        if self._cursor.started or (engine is not None and engine.started):
            # Fixed from the first batch on: the process group exists by then
            # (Lightning builds loaders after it), and state_dict() stays cheap.
            self._topology_cache = (env.rank, env.world_size)
        return env.rank, env.world_size

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration (or the current one, if no batch was drawn yet) ``epoch``."""
        check_int(
            "epoch", epoch, 0, owner="ResumableDataLoader", fix="pass the trainer's current epoch"
        )
        meant = host_of(self).epoch_meant(self, epoch)
        epoch = epoch if meant is None else meant
        engine = self._stream or self._iterable
        if engine is not None:
            engine.set_epoch(epoch)
            return
        loaded = self._cursor.loaded(self.plan)
        if loaded is not None and epoch != loaded[0] and not self._keeps_loaded(epoch, *loaded):
            return
        self._cursor.set_epoch(epoch)

    def _keeps_loaded(self, epoch: int, resumes: int, mid_epoch: bool) -> bool:
        """Whether ``set_epoch(epoch)`` replaces a loaded position that resumes epoch
        ``resumes`` (False: the position wins and the call is ignored).

        Raises:
            StateMismatchError: the call would silently discard a position part-way
                through its epoch.
        """
        restarting = host_of(self).restarting_mid_epoch(self)
        if restarting is False:
            # Lightning starts its epoch afresh here, as the uninterrupted run did (a
            # loader cut short by limit_train_batches, or cycled by a CombinedLoader,
            # at the end of the trainer's epoch): the loaded position is over.
            return True
        if restarting and epoch < resumes:
            # Lightning restores a mid-epoch checkpoint and replays its epoch start's
            # set_epoch; this loader was re-iterated (cycled by CombinedLoader
            # "max_size_cycle") into a later epoch of its own since that call, as the
            # loaded position says. The uninterrupted run went on from there.
            return False
        if not mid_epoch and not restarting:
            return True  # nothing of the loaded epoch is left to lose
        cursor = self._cursor
        length = self.plan.epoch_length(cursor.epoch)
        raise StateMismatchError(
            f"ResumableDataLoader.set_epoch: epoch={epoch}, but the state loaded by "
            f"load_state_dict() is part-way through epoch {resumes} (position "
            f"{cursor.position} of {length}); starting epoch {epoch} would silently discard "
            f"that position and yield other samples than the saved run. Call "
            f"set_epoch({resumes}) (or none) to resume the saved epoch; to start epoch {epoch} "
            "from its beginning, do not load the state (build the loader with the saved "
            "seed instead)."
        )

    def __len__(self) -> int:
        """Batches this rank yields per epoch, counting a resumed epoch's steps already done.

        Under the saving topology that is exact. After a resume with another
        world size the resumed epoch (steps done + steps remaining) and a whole
        epoch differ. With :class:`~loaderkit.ElasticResume`, which re-reads the
        length at every epoch start, it is the current epoch's exact count, so
        Lightning validates at its end. Without it, Lightning reads the length
        once per ``fit``, so it is the larger of the two (no batch is cut), and a
        shorter epoch inside Lightning's loop is an error (Lightning would skip
        its end-of-epoch validation).
        """
        if self._stream is not None:
            return self._stream.length()
        if self._iterable is not None:
            return self._iterable.length()
        _, world_size = self._topology()
        live = self._live_iterator()
        cursor = self._cursor
        if (
            live is not None
            and live.schedule is not None
            and cursor.position < self.plan.epoch_length(cursor.epoch)
        ):
            whole = self.plan.num_steps(cursor.epoch, start=0, world_size=world_size)
            exact = live.steps_before + live.schedule.num_steps
        else:
            epoch, start, steps_done = cursor.upcoming(self.plan)
            whole = self.plan.num_steps(epoch, start=0, world_size=world_size)
            exact = steps_done + self.plan.num_steps(epoch, start=start, world_size=world_size)
        length = exact if self._len_watch.managed else max(whole, exact)
        self._len_watch.answered(length)
        return length

    def __iter__(self) -> Iterator[Any]:
        """A new iterator over the next epoch (see :meth:`set_epoch`).

        Iterators are independent, as ``DataLoader``'s are: an older one goes on
        with its own epoch in its own workers, and :meth:`state_dict` is the
        position of the one that began (drew its first batch) last. Two
        exceptions, where the loader has one set of workers or cursors: with
        ``persistent_workers=True`` (torch's ``DataLoader`` resets its one worker
        iterator too) and over a ``StreamingShardedDataset``, a new ``iter()``
        supersedes the old iterator, whose ``next()`` then raises.
        """
        self._lookahead = None  # a prefetcher iterating this registers after iter()
        if self._stream is not None or self._pool.persistent:
            self._supersede()
        live = EpochIterator(self)
        self._iterators.add(live)
        return live

    def _live_iterator(self) -> EpochIterator | None:
        """The current iterator: the one whose position :meth:`state_dict` reports."""
        return None if self._live is None else self._live()

    def _awaiting_first_batch(self) -> bool:
        """Whether an iterator was made (``iter()``) that has not drawn its first batch,
        while no iteration that began is part-way through its epoch (that one is the state)."""
        live = self._live_iterator()
        if live is not None and not live.run.finished:
            return False
        return any(not it.begun for it in list(self._iterators))

    def _began(self, iterator: EpochIterator) -> None:
        """``iterator`` drew its first batch: its position is the loader's from now on."""
        iterator.run.began = next(self._ticks)
        self._current = iterator.run
        self._live = weakref.ref(iterator)

    def _handed(self, run: Run, waited: float) -> None:
        run.last = next(self._ticks)
        self._waited += waited

    @property
    def wait_seconds(self) -> float:
        """Seconds spent inside ``next()`` of this loader's iterators (loading, or waiting
        for workers), summed over its life: what a training loop waited for batches
        (:class:`~loaderkit.DataWaitMonitor` reads it)."""
        return self._waited

    def _supersede(self) -> None:
        # Stop the workers of iterators that can no longer yield, now rather
        # than whenever their holders drop them.
        for old in list(self._iterators):
            old.superseded = True
            old.close()
        self._iterators = weakref.WeakSet()
        self._live, self._current = None, None

    def _check_one_position(self) -> None:
        """Refuse a state while two live iterators have both moved since the newer began."""
        current = self._current
        if current is None:
            return
        for other in list(self._iterators):
            run = other.run
            if run is current or run.finished or run.last <= current.began:
                continue
            raise LoaderkitError(
                "ResumableDataLoader.state_dict: two live iterators over this loader are both "
                "part-way through their epochs, and the older one handed out batches after the "
                "newer one began. A state holds one position (the newer iterator's), so "
                "resuming from it would silently drop the rest of the older iterator's epoch. "
                "Finish or drop (del) one of them before saving, or use one loader per "
                "iterator."
            )

    def _settle_seed(self, *, final: bool = True) -> None:
        """Fix a drawn seed before the first batch: ranks must agree without talking.

        Args:
            final: At the first batch the topology is the run's, and a drawn seed
                is kept from then on. Earlier (at construction, in ``state_dict()``)
                only a known ``world_size > 1`` settles it: a process group may
                still be set up after that.
        """
        if not self._seed_drawn:
            return
        _, world_size = self._topology()
        if world_size > 1:
            self._seed_drawn = False
            if self.seed != DDP_DEFAULT_SEED:
                self._adopt_seed(DDP_DEFAULT_SEED)
        elif final:
            self._seed_drawn = False

    def _begin(self) -> tuple[Schedule, int]:
        self._settle_seed()
        size = len(self.dataset)
        # A sampler's plan counts the sampler's indices; its dataset size is kept apart.
        if size != getattr(self.plan, "dataset_size", self.plan.num_samples):
            # Else the plan (and any saved position) silently keeps the old length.
            raise StateMismatchError(
                f"ResumableDataLoader: the dataset has {size} samples now, "
                f"{getattr(self.plan, 'dataset_size', self.plan.num_samples)} when the loader "
                "was built; its plan (and any saved "
                "position) covers the old length, so samples would be left out or indexed "
                "past the end. Build a new loader for the new dataset (a dataset must not grow "
                "or shrink while a loader iterates it)."
            )
        rank, world_size = self._topology()
        epoch, start, steps_done = self._cursor.upcoming(self.plan)
        agree_across_ranks(
            "ResumableDataLoader",
            {
                **self._fingerprint,
                "world_size": world_size,
                "epoch": epoch,
                "position": start,
                "steps_done": steps_done,
            },
            rank=rank,
            world_size=world_size,
            epoch=epoch,
            rounds=self._rounds,
        )
        # Lightning counts the epoch's batches itself and ends the epoch by that count;
        # if it disagrees with the position, it silently cuts or overruns the epoch.
        counted = host_of(self).batches_done(self)
        if counted is not None and counted != steps_done:
            loaded = self._cursor.loaded(self.plan)
            # Loaded at the end of `epoch`, which Lightning (see epoch_meant) still trains.
            ended = loaded is not None and not loaded[1] and loaded[0] == epoch + 1
            if ended and counted == self.plan.num_steps(epoch, start=0, world_size=world_size):
                # Lightning's own bookkeeping: it records a max_steps stop at an epoch's
                # last batch as processed but not completed, and on restore runs one more
                # batch in that epoch (with a DataLoader it re-trains the epoch's first).
                raise StateMismatchError(
                    f"ResumableDataLoader: the checkpoint was written when the run stopped "
                    f"exactly at the end of epoch {epoch} (max_steps, or a stop after the "
                    f"epoch's last batch, before Lightning closed the epoch): Lightning "
                    f"restores it counting all {counted} batches of epoch {epoch} as done "
                    "yet runs one more batch in that epoch, which would add a batch the "
                    "uninterrupted run never trained (it does so with any loader). Resume "
                    "from a checkpoint saved during training (ModelCheckpoint("
                    "every_n_train_steps=...)) or at an epoch's end by max_epochs, or stop "
                    "at a max_steps that is not a multiple of the epoch length."
                )
            raise StateMismatchError(
                f"ResumableDataLoader: Lightning's fit loop counts {counted} batches of epoch "
                f"{epoch} as done, but the loader's position is {steps_done} batches into it "
                f"(on {world_size} rank(s)), so Lightning would end the epoch "
                f"{abs(counted - steps_done)} batches early or late, silently skipping or "
                "repeating samples. Resumed on a different number of ranks: add "
                "Trainer(callbacks=[loaderkit.ElasticResume()]); otherwise restore the loader "
                "from the same checkpoint as the trainer (trainer.fit(..., ckpt_path=...))."
            )
        epoch, start, steps_done = self._cursor.begin(self.plan)
        sched = self.plan.schedule(epoch, start=start, rank=rank, world_size=world_size)
        batches, driven = steps_done + sched.num_steps, host_of(self).drives(self)
        self._len_watch.check("ResumableDataLoader", epoch, batches, driven=driven)
        if sched.num_steps == 0 and start > 0:
            self._cursor.position = self.plan.epoch_length(epoch)  # a dropped tail: it is over
        elif sched.num_steps == 0:
            raise ValueError(
                f"ResumableDataLoader: an epoch of {self.plan.num_samples} samples yields no "
                f"batch on {world_size} rank(s) with this batch size and drop_last=True; "
                "lower batch_size or set drop_last=False."
            )
        return sched, steps_done

    def _inner_loader(self, sched: Schedule) -> DataLoader[Any]:
        """The worker DataLoader of one epoch's schedule.

        Persistent workers serve one iteration at a time (a new ``iter()``
        supersedes the old); otherwise each iteration gets its own DataLoader
        and key source, so live iterators stay independent.
        """
        rank, _ = self._topology()
        if not self._pool.persistent:
            keys = KeySource()
            keys.schedule = sched
            return self._pool.build(
                KeyedDataset(self._fetch, self.plan.num_samples),
                seed=self.seed,
                epoch=sched.epoch,
                rank=rank,
                batch_sampler=keys,  # yields (epoch, indices) keys, not index lists
            )
        self._keys.schedule = sched
        if self._inner is None:
            self._inner = self._pool.build(
                KeyedDataset(self._fetch, self.plan.num_samples),
                seed=self.seed,
                epoch=sched.epoch,
                rank=rank,
                batch_sampler=self._keys,
            )
        else:  # workers stopped since (a failure, a dropped iterator) restart keyed to this epoch
            self._inner.worker_init_fn = self._pool.init_fn(self.seed, sched.epoch, rank)
        return self._inner

    def describe(self) -> dict[str, Any]:
        """How this loader iterates and resumes, for logs and ``loaderkit inspect``.

        Returns:
            A dict with ``engine``: ``"plan"`` (map-style data), ``"stream"``
            (a :class:`~loaderkit.StreamingShardedDataset`) or ``"iterable"`` (an
            ``IterableDataset`` passed directly); ``resume``: ``"position"``
            (a position in the sample plan: O(1), any ``num_workers`` and world
            size), ``"cursors"`` (a cursor per (rank, worker) slot: same
            topology), ``"state"`` (each worker's dataset or iterator state) or
            ``"replay"`` (each worker's stream replayed and skipped: O(position),
            exact only for a deterministic stream, which is checked);
            ``resume_reason`` (the same in words); ``num_workers`` and
            ``batch_size``; ``transport``: how batches crossed from worker
            processes so far (``slot_batches`` through reused shared-memory
            slots, ``torch_path_batches`` through torch's own path and the
            ``torch_path_reasons``, arenas received and their bytes); ``mix``
            when the dataset is a :class:`~loaderkit.MixedDataset`: its
            :meth:`~loaderkit.MixedDataset.describe` at the loader's epoch (per
            source its samples, weight, draws per epoch, repeat and the
            source-epochs the epoch's draws fall in) plus ``epoch`` and
            ``applied`` (whether the loader's plan is the mix's: a loader built
            without ``batch_sampler=mix.batch_sampler(...)`` reads every sample
            once per epoch and ignores the weights, and says so in ``reason``).
        """
        info: dict[str, Any] = {
            "num_workers": self.num_workers,
            "batch_size": self.batch_size,
            "transport": self._pool.stats.describe(),
        }
        if self._auto is not None:
            info["auto_workers"] = self._auto.describe()
        if isinstance(self.dataset, MixedDataset) and self._stream is None:
            info["mix"] = self._describe_mix(self.dataset)
        if self._stream is not None:
            return {
                **info,
                "engine": "stream",
                "resume": "cursors",
                "resume_reason": "a cursor per (rank, worker) slot and open shard: exact under "
                "the same world size and num_workers",
            }
        if self._iterable is not None:
            name = type(self.dataset).__name__
            if self._iterable.method() == "state":
                owner = name if is_stateful(self.dataset) else f"iter({name})"
                reason = (
                    f"{owner} has state_dict()/load_state_dict(): each worker's state as of its "
                    "last batch handed out is saved and loaded (O(1) in the position); exact "
                    "under the same num_workers, on one process"
                )
            else:
                reason = (
                    f"replay-and-skip: {name} has no state_dict()/load_state_dict(), so each "
                    "worker iterates its stream again and skips what it handed out (cost "
                    "grows with the position); exact for a deterministic stream (a replay "
                    "that differs is a StateMismatchError), under the same num_workers, on "
                    "one process. Give the dataset state_dict()/load_state_dict() to resume "
                    "in O(1)"
                )
            return {
                **info,
                "engine": "iterable",
                "resume": self._iterable.method(),
                "resume_reason": reason,
            }
        return {
            **info,
            "engine": "plan",
            "resume": "position",
            "resume_reason": "a position in the sample plan: O(1), exact for any num_workers "
            "and world size",
        }

    def _describe_mix(self, mix: MixedDataset) -> dict[str, Any]:
        """``describe()["mix"]``: the mix at the epoch this loader iterates (or starts next)."""
        cursor = self._cursor
        epoch = cursor.epoch if cursor.started else cursor.upcoming(self.plan)[0]
        applied = isinstance(self.plan, MixPlan | MixBucketPlan)
        info: dict[str, Any] = {"epoch": epoch, "applied": applied, **mix.describe(epoch)}
        if not applied:
            info["reason"] = (
                f"the loader's plan is a {type(self.plan).__name__}, not the mix's: each sample "
                "is read once per epoch and the weights are ignored; pass "
                "batch_sampler=mix.batch_sampler(batch_size, seed=...) (or "
                "mix.bucket_batch_sampler(...))"
            )
        return info

    # ------------------------------------------------------------------ state
    def _register_lookahead(self, holder: Any) -> None:
        """A consumer that holds batches ahead (``DevicePrefetcher``) answers ``state_dict()``.

        ``holder.held_state()`` is the state as of the last batch it handed on,
        or None when it holds nothing. Held weakly: a dropped prefetcher stops counting.
        """
        self._lookahead = weakref.ref(holder)

    def state_dict(self) -> dict[str, Any]:
        """The position of the batches handed out so far; the same on every rank.

        While a :class:`~loaderkit.DevicePrefetcher` holds a batch ahead, the
        position of the batches it handed on (the consumer's view).

        Never a collective: one rank may call it alone. For a
        :class:`~loaderkit.StreamingShardedDataset` under DDP it reads the other
        ranks' cursors at this rank's step from the process group's store (each
        rank publishes them as it hands a batch out), waiting only for a rank
        that has not handed that batch out yet; where no store is reachable the
        state holds this rank's cursors only.
        """
        holder = self._lookahead() if self._lookahead is not None else None
        held = holder.held_state() if holder is not None else None
        if held is not None:
            return dict(held)
        if self._seed_drawn:
            # Before the first batch: a state must not carry the provisional seed that
            # the first batch replaces under DDP (a resumed run would adopt it).
            self._settle_seed(final=False)
        self._check_one_position()
        if self._stream is not None:
            return self._stream.state()
        if self._iterable is not None:
            return self._iterable.state()
        skeleton = self._skeleton
        if skeleton is None:
            _, world_size = self._topology()
            skeleton = self._cursor.state(
                self._fingerprint, world_size=world_size, num_workers=self.num_workers
            )
            if self._topology_cache is not None:  # the topology is fixed from here on
                self._skeleton = skeleton
        # A shallow copy: the nested plan/topology dicts are shared between the
        # states returned (read-only, like the tensors of a torch state_dict), which
        # keeps a call at ~2 us with its checksum (measured on a busy 2-core machine), a few
        # percent of even a 50 us step.
        state = skeleton.copy()
        cursor = self._cursor
        epoch, position, steps_done = cursor.epoch, cursor.position, cursor.steps_done
        state["epoch"], state["position"], state["steps_done"] = epoch, position, steps_done
        # The constant fields' digests are the skeleton's; only the position's change
        # (inlined field_digest: this runs every step).
        checksum = skeleton["checksum"].copy()
        checksum["epoch"] = crc32(b"epoch=%d" % epoch)
        checksum["position"] = crc32(b"position=%d" % position)
        checksum["steps_done"] = crc32(b"steps_done=%d" % steps_done)
        state["checksum"] = checksum
        listed = self.plan.listed_from(epoch) if isinstance(self.plan, SamplerPlan) else None
        if listed is not None:
            # The epoch came from the user's reseeded generator, not (seed, epoch).
            state["plan"] = {**state["plan"], "listed_from": listed}
            checksum["plan"] = field_digest("plan", state["plan"])
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume at a saved position: the next ``iter()`` yields the rest of its epoch.

        Raises:
            StateMismatchError: the state was saved for a different dataset size,
                seed, batch size, shuffle or drop_last setting, or is malformed.
        """
        self._lookahead = None  # the loaded state is the position now
        # Only a SamplePlan can be rebuilt with the saved seed; any other plan's seed
        # is the user's explicit choice, and a different saved one is a mismatch.
        engine = self._stream or self._iterable
        if engine is not None:
            self._supersede()
            adopted = engine.load(state_dict, adopt_seed=not self._seed_explicit)
            if adopted is not None:
                self.seed = adopted
            self._seed_drawn = False  # the saved run's seed is the one to keep
            return
        can_adopt = not self._seed_explicit and isinstance(self.plan, SamplePlan | SamplerPlan)
        adopt = ("seed",) if can_adopt else ()
        saved = state_dict.get("plan") if isinstance(state_dict, Mapping) else None
        listed = saved.get("listed_from") if isinstance(saved, Mapping) else None
        plan: Any = self.plan
        if isinstance(plan, SamplerPlan) and listed is not None:
            plan = _Listed(plan, listed)
        state = self._cursor.load(state_dict, plan, owner="ResumableDataLoader", adopt=adopt)
        saved_seed = state["plan"]["seed"]
        if saved_seed != self.seed and isinstance(self.plan, SamplePlan | SamplerPlan):
            self._adopt_seed(saved_seed)
        if isinstance(self.plan, SamplerPlan):
            self.plan.restore(state["epoch"], listed)
        self._seed_drawn = False  # the saved run's seed is the one to keep
        self._supersede()

    def _adopt_seed(self, seed: int) -> None:
        assert isinstance(self.plan, SamplePlan | SamplerPlan)
        self.seed = seed
        self._seed_drawn = False
        self.plan = dataclasses.replace(self.plan, seed=seed)
        self._fetch.seed = seed
        self._fingerprint = self.plan.fingerprint()
        self._skeleton = None
        self._inner = None  # its KeyedDataset holds the fetcher; rebuild with the new seed
