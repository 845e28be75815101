"""``ResumableDataLoader``: a DataLoader whose position is a point in the sample plan.

The front end validates its arguments into one spec and builds one engine
(``docs/design.md``, "The loader: one spec, one engine"); after that it delegates.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
from torch.utils.data import BatchSampler

from loaderkit._callers import host_of
from loaderkit._checks import check_int
from loaderkit.env import cpu_budget, detect
from loaderkit.loader._auto import MAX_AUTO_WORKERS, AutoWorkers, local_processes
from loaderkit.loader._engine import Engine, EpochIterator, Host, settle_seed
from loaderkit.loader._fetch import BatchFetcher, Unbatched
from loaderkit.loader._iterable import IterableEngine
from loaderkit.loader._planned import PlanEngine
from loaderkit.loader._spec import LoaderSpec, make_spec
from loaderkit.loader._stream import StreamEngine
from loaderkit.loader._views import IterableOrder, PlanBatches, hook_set_epoch, plan_order
from loaderkit.loader._workers import WorkerPool
from loaderkit.plan.sample import Plan
from loaderkit.plan.samplers import _LenWatch

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
        "timeout",
        "generator",
        "multiprocessing_context",
        "prefetch_factor",
        "pin_memory",
        "pin_memory_device",
        "in_order",
    )
)


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
            the dataset cannot draw (plain containers, ``TensorDataset``, a
            ``Subset``/``ConcatDataset`` of them) or fetches whole batches
            (``get_batch``), seeding torch's
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
        args = dict(batch_size=batch_size, shuffle=shuffle, sampler=sampler)
        args |= dict(batch_sampler=batch_sampler, num_workers=num_workers, collate_fn=collate_fn)
        args |= dict(pin_memory=pin_memory, drop_last=drop_last, timeout=timeout)
        args |= dict(worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context)
        args |= dict(generator=generator, prefetch_factor=prefetch_factor, seed=seed, rank=rank)
        args |= dict(persistent_workers=persistent_workers, world_size=world_size)
        args |= dict(per_sample_seeding=per_sample_seeding, pin_memory_device=pin_memory_device)
        self._spec = spec = make_spec(dataset, args | dict(in_order=in_order))
        self._host, self._engine, fetch = build_engine(self, spec)
        self._lookahead: weakref.ref[Any] | None = None  # see _register_lookahead
        self._expose(spec, fetch)
        # Where the ranks are known already (rank=/world_size=, a process group, a
        # Trainer building the loader), the seed is the ranks' common one from the start.
        settle_seed(self._host, self._engine, final=False)
        self._built = True

    def _expose(self, spec: LoaderSpec, fetch: BatchFetcher) -> None:
        """DataLoader's attributes, as code written for it reads them."""
        self.dataset = spec.dataset
        self.batch_size = spec.batch_size
        self.pin_memory_device = spec.pin_memory_device
        self.in_order = spec.in_order
        collate = fetch.collate_fn
        self.collate_fn = collate.collate_fn if type(collate) is Unbatched else collate
        self.drop_last = spec.drop_last
        self.generator = spec.generator
        self.timeout = spec.timeout
        self.worker_init_fn = spec.worker_init_fn
        self.multiprocessing_context = spec.multiprocessing_context
        self.prefetch_factor = spec.prefetch_factor
        self.persistent_workers = spec.persistent_workers
        # Views of the plan: Lightning calls sampler.set_epoch(e) (and
        # batch_sampler.sampler.set_epoch(e)) at every epoch start, never the loader's.
        self.sampler, self.batch_sampler = views(self, spec, self._engine)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "worker_init_fn" and self.__dict__.get("_built", False):
            self._set_worker_init_fn(value)
        elif name in _FIXED_AFTER_INIT and self.__dict__.get("_built", False):
            raise ValueError(
                f"ResumableDataLoader: {name} cannot be set after the loader is built, got "
                f"{name}={value!r:.60}; build a new ResumableDataLoader with {name}= passed to "
                "the constructor."
            )
        super().__setattr__(name, value)

    def _set_worker_init_fn(self, value: Any) -> None:
        # Lightning's seed_everything(workers=True) sets it before the first epoch: it
        # runs in every worker started from then on (after loaderkit's seeding).
        if value is not None and not callable(value):
            raise TypeError(
                f"ResumableDataLoader: worker_init_fn must be callable or None, got "
                f"{value!r:.60}; pass a function taking the worker id."
            )
        pool = self._host.pool
        if self._host.started and pool.persistent and pool.num_workers > 0:
            raise ValueError(
                "ResumableDataLoader: worker_init_fn cannot be set once persistent workers "
                "started; pass worker_init_fn= to the constructor."
            )
        self._host.pool = dataclasses.replace(pool, user_init=value)

    # ----------------------------------------------------------------- epochs
    @property
    def num_workers(self) -> int:
        """Worker processes loading now (0: in this process). Fixed at construction,
        except under ``num_workers="auto"``, where it is the current choice."""
        return self._host.num_workers

    @property
    def pin_memory(self) -> bool:
        """Whether batches are pinned (``"auto"`` resolved at construction)."""
        return self._host.pin_memory

    @property
    def seed(self) -> int:
        """Seed of the order and of per-sample randomness (a loaded state's, once loaded)."""
        return self._host.seed

    @property
    def plan(self) -> Plan:
        """The sample plan (a stand-in for a stream or an ``IterableDataset``)."""
        return self._engine.plan

    @property
    def _len_watch(self) -> _LenWatch:
        return self._host.len_watch  # ElasticResume marks it managed

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration (or the current one, if no batch was drawn yet) ``epoch``."""
        check_int(
            "epoch", epoch, 0, owner="ResumableDataLoader", fix="pass the trainer's current epoch"
        )
        meant = host_of(self).epoch_meant(self, epoch)
        self._engine.set_epoch(epoch if meant is None else meant)

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
        return self._engine.length()

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
        if self._engine.one_iterator or self._host.pool.persistent:
            self._host.supersede()
        live = EpochIterator(self, self._host, self._engine)
        self._host.iterators.add(live)
        return live

    @property
    def wait_seconds(self) -> float:
        """Seconds spent inside ``next()`` of this loader's iterators (loading, or waiting
        for workers), summed over its life: what a training loop waited for batches
        (:class:`~loaderkit.DataWaitMonitor` reads it)."""
        return self._host.waited

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
            ``applied`` (whether the loader's plan is the mix's; a loader given
            another sampler or batch sampler reads every sample once per epoch
            and ignores the weights, and says so in ``reason``).
        """
        info: dict[str, Any] = {
            "num_workers": self.num_workers,
            "batch_size": self.batch_size,
            "transport": self._host.pool.stats.describe(),
        }
        if self._host.auto is not None:
            info["auto_workers"] = self._host.auto.describe()
        return {**info, **self._engine.describe()}

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
        # Before the first batch: a state must not carry the provisional seed that the
        # first batch replaces under DDP (a resumed run would adopt it).
        settle_seed(self._host, self._engine, final=False)
        self._host.check_one_position()
        return self._engine.state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume at a saved position: the next ``iter()`` yields the rest of its epoch.

        Raises:
            StateMismatchError: the state was saved for a different dataset size,
                seed, batch size, shuffle or drop_last setting, or is malformed.
        """
        self._lookahead = None  # the loaded state is the position now
        adopted = self._engine.load(state_dict, adopt_seed=not self._spec.seed_explicit)
        if adopted is not None:
            self._host.seed = adopted
        self._host.seed_drawn = False  # the saved run's seed is the one to keep


# ------------------------------------------------------------- construction
def build_engine(loader: object, spec: LoaderSpec) -> tuple[Host, Engine, BatchFetcher]:
    """The loader's host and its one engine, chosen by ``spec.kind`` (the only place)."""
    fetch = BatchFetcher(
        spec.dataset, spec.collate_fn, seed=spec.seed, per_sample_seeding=spec.per_sample
    )
    topology = {"rank": spec.rank, "world_size": spec.world_size}
    if spec.rank is not None or spec.world_size is not None:
        detect(**topology)  # validates now, not at the first batch
    auto = None
    if spec.auto:
        local = local_processes(detect(**topology).world_size)
        auto = AutoWorkers(cap=min(cpu_budget(local), MAX_AUTO_WORKERS))
    pool = WorkerPool(
        num_workers=spec.workers,
        pin_memory=spec.pin,
        timeout=spec.timeout,
        prefetch_factor=spec.prefetch_factor,
        persistent=spec.persistent_workers,
        user_init=spec.worker_init_fn,
        start_method=spec.multiprocessing_context,
    )
    host = Host(
        loader, seed=spec.seed, seed_drawn=spec.seed_drawn, pool=pool, auto=auto, **topology
    )
    common: dict[str, Any] = {"plan": spec.plan, "reseed": spec.reseed}
    common["batch_size"] = spec.step_size
    common["drop_last"] = spec.engine_drop_last
    engine: Engine
    if spec.kind == "iterable":
        engine = IterableEngine(host, spec.dataset, collate_fn=fetch.collate_fn, **common)
    elif spec.kind == "stream":
        engine = StreamEngine(
            host,
            spec.dataset,
            collate_fn=spec.collate_fn,
            per_sample_seeding=spec.stream_per_sample,
            **common,
        )
    else:
        engine = PlanEngine(
            host, dataset=spec.dataset, plan=spec.plan, fetch=fetch, reseed=spec.reseed
        )
    return host, engine, fetch


def views(loader: object, spec: LoaderSpec, engine: Engine) -> tuple[Any, Any]:
    """``loader.sampler`` and ``loader.batch_sampler``, as ``DataLoader`` has them."""
    if spec.kind == "iterable":
        # As DataLoader's: an endless constant sampler (here its set_epoch drives the
        # loader) and a BatchSampler over it, or none when unbatched.
        order: Any = IterableOrder(loader)
        if spec.batch_size is None:
            return order, None
        return order, BatchSampler(order, spec.step_size, spec.drop_last)
    order = plan_order(loader, engine, shuffled=bool(getattr(engine.plan, "shuffle", True)))
    if spec.sampler is not None:
        hook_set_epoch(spec.sampler, loader)  # sampler.set_epoch(e) sets the loader's epoch
    sampler = spec.sampler if spec.sampler is not None else order
    return sampler, spec.batch_sampler if spec.batch_sampler is not None else PlanBatches(order)
