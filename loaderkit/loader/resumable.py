"""``ResumableDataLoader``: a DataLoader whose position is a point in the sample plan; it
validates its arguments into one spec and delegates to one engine (``docs/design.md``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Sized
from typing import Any, Literal

import torch
from torch.utils.data import BatchSampler

from loaderkit._callers import host_of
from loaderkit._checks import check_int
from loaderkit.env import cpu_budget, detect
from loaderkit.errors import LoaderkitError, StateMismatchError
from loaderkit.loader._auto import MAX_AUTO_WORKERS, AutoWorkers, local_processes
from loaderkit.loader._engine import DDP_DEFAULT_SEED, Engine, EpochIterator, Host, settle_seed
from loaderkit.loader._fetch import BatchFetcher, Unbatched
from loaderkit.loader._iterable import IterableEngine
from loaderkit.loader._planned import PlanEngine
from loaderkit.loader._spec import LoaderSpec, make_spec
from loaderkit.loader._stream import StreamEngine
from loaderkit.loader._views import IterableOrder, PlanBatches, hook_set_epoch, plan_order
from loaderkit.loader._workers import WorkerPool
from loaderkit.plan.sample import Plan
from loaderkit.plan.samplers import PlanBatchSampler, _LenWatch, lend_batch_sampler

__all__ = ["ResumableDataLoader"]

# Read once at construction: an assignment afterwards would be silently ignored.
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
    """A ``DataLoader`` with exact, O(1), elastic mid-epoch resume.

    Takes ``torch.utils.data.DataLoader``'s arguments plus ``seed``,
    ``rank``/``world_size`` and ``per_sample_seeding``. Each ``iter()`` starts the
    next epoch unless :meth:`set_epoch` said otherwise; after
    :meth:`load_state_dict` the next ``iter()`` yields the rest of the saved epoch.

    Args:
        dataset: Map-style (``__len__``, ``__getitem__``, maybe ``get_batch`` or
            ``__getitems__``), a torch ``IterableDataset`` (same ``num_workers`` on resume),
            or a :class:`~loaderkit.StreamingShardedDataset` (same topology on resume).
        batch_size: Samples per batch on each rank; ``None`` yields single samples.
        shuffle: Shuffle per ``(seed, epoch)`` (None: False, as torch takes it).
        sampler: A sampler whose order is a function of ``(seed, epoch)`` (its
            ``generator`` seeded per epoch, ``set_epoch``, or a
            ``DistributedSampler``, dealt as it deals). It stays ``loader.sampler``.
        batch_sampler: A loaderkit batch sampler with a plan (e.g.
            :class:`~loaderkit.PlanBatchSampler`), or a torch ``BatchSampler``
            (taken as its sampler, batch size and drop_last).
        num_workers: Worker processes (0: in this process), or ``"auto"`` (map-style
            data): start workers mid-epoch only if measured to shorten the step; it changes
            when batches load, never which.
        collate_fn: Merges samples into a batch (default ``default_collate``).
        pin_memory: ``True``, ``False`` or ``"auto"`` (pin on CUDA).
        drop_last: Drop the tail short of ``world_size * batch_size``; else the
            last batches wrap to the start of the order.
        timeout: Seconds to wait for a worker's batch (0: forever).
        worker_init_fn: Called in each worker after loaderkit seeded it.
        multiprocessing_context: As in ``DataLoader`` (default ``fork``;
            ``forkserver`` inside a torch.distributed process group).
        generator: Draws ``seed`` when ``seed`` is None.
        prefetch_factor: Batches loaded ahead per worker.
        persistent_workers: Keep workers alive across epochs.
        seed: Seed of the order and per-sample randomness. ``None``: drawn from
            ``generator`` (else torch's) in one process, ``0`` across ranks unless you
            seeded ``generator`` (alike on every rank). A loaded state's seed replaces a
            drawn one; another than yours or your generator's is refused.
        rank: This process's rank (default: ``torch.distributed``, else 0).
        world_size: Number of ranks (default: ``torch.distributed``, else 1).
        pin_memory_device: Accepted as ``DataLoader`` does (deprecated there).
        in_order: Must be ``True`` (a saved position needs ordered batches).
        per_sample_seeding: Load sample ``i`` of epoch ``e`` under global RNGs seeded
            from ``(seed, e, i)``, for any ``num_workers`` and after a resume. ``"auto"``:
            only the generators the dataset draws from, off for data that cannot draw;
            ``True``: all three always. A ``__getitems__`` of your own that draws is
            refused (a batch read cannot be split into samples); loaderkit's datasets and
            torch's wrappers read through ``__getitem__`` where a subclass defines one.

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
        shuffle: bool | None = False,
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
        args = dict(locals())  # the arguments by name: no other local is bound yet
        del args["self"], args["dataset"]
        self._args = args  # what __reduce__ rebuilds from, the sampler's generator as given
        self._sampler_rng = _own_generator_state(sampler)
        self._positioned = False  # loaded or given an epoch: __reduce__ keeps the position
        self._spec = spec = make_spec(dataset, args)
        self._host, self._engine, fetch = build_engine(self, spec)
        self._lookahead: Any = None  # a holder with held_state() and drop(): _register_lookahead
        self._skipped: Any = None  # the last state taken from an epoch-end checkpoint
        self._expose(spec, fetch)
        settle_seed(self._host, self._engine, final=False)
        if spec.start_epoch > 0:  # sampler.set_epoch(e) before the loader: epoch e is next
            self.set_epoch(spec.start_epoch)
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
        # Views of the plan: Lightning calls sampler.set_epoch(e), never the loader's.
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
        # Lightning's seed_everything(workers=True) sets it before the first epoch.
        if value is not None and not callable(value):
            raise TypeError(
                f"ResumableDataLoader: worker_init_fn must be callable or None, got "
                f"{value!r:.60}; pass a function taking the worker id."
            )
        pool = self._host.pool
        if (
            value is not pool.user_init
            and pool.persistent
            and pool.num_workers
            and self._host.started
        ):
            self.close()  # its workers ran the old one: the next iter() starts new ones
        self._host.pool = dataclasses.replace(pool, user_init=value)

    @property
    def num_workers(self) -> int:
        """Worker processes loading now (0: in this process; under ``"auto"``, the choice)."""
        return self._host.pool.num_workers

    @property
    def pin_memory(self) -> bool:
        """Whether batches are pinned (``"auto"`` resolved at construction; unpinned if the
        runtime refuses, as ``DataLoader``)."""
        return self._host.pool.pin_memory

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

    def _settle(self) -> None:
        self._host.settle()  # AttachLoaders, as a fit fails

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration (or the current one, if no batch was drawn yet) ``epoch``;
        a state saved before it begins holds that epoch's start."""
        self._set_epoch(epoch, sampler=False)

    def _set_epoch(self, epoch: int, *, sampler: bool = True) -> None:
        """:meth:`set_epoch`, from ``loader.sampler.set_epoch`` where ``sampler`` (the call
        Lightning makes): an evaluation's own epoch count is then kept at 0."""
        fix = "pass the epoch your loop (or the trainer) counts"
        epoch = check_int("epoch", epoch, 0, owner="ResumableDataLoader", fix=fix, numpy_ok=True)
        host = host_of(self)
        meant = host.epoch_meant(self, epoch)  # None: not the host's fit loop
        late = meant is not None and bool(host.held_batches(self))  # it prefetched first
        target = epoch if meant is None else meant
        if sampler and meant is None and host.sets_eval_epoch(self, epoch):
            # Lightning's fit epoch count, 0 outside a fit: evaluation keeps epoch 0's draws,
            # so a checkpoint validated again gives the metric its fit logged.
            target = 0
        self._positioned = True
        held = self._lookahead.held_state() if self._lookahead is not None else None
        if held is not None and held.get("epoch") != target:
            self._drop_lookahead()  # another epoch's start is pending (the running one's is kept)
            self._take_back(held)
        self._engine.set_epoch(target, late=late)

    def __len__(self) -> int:
        """Batches this rank yields per epoch, counting a resumed epoch's steps already done
        (on another world size, the larger of that and a whole epoch, unless
        :class:`~loaderkit.ElasticResume` re-reads it every epoch)."""
        return self._engine.length()

    def __iter__(self) -> Iterator[Any]:
        """A new iterator over the next epoch; :meth:`state_dict` is the position of the one
        that drew its first batch last (under ``persistent_workers=True`` or a stream, a new
        ``iter()`` supersedes the old one)."""
        held = self._lookahead.held_state() if self._lookahead is not None else None
        self._drop_lookahead()  # a prefetcher iterating this registers after iter()
        if self._engine.carries_over:
            try:
                if held is not None and self._take_back(held):
                    self.set_epoch(int(held["epoch"]) + 1)
                skipped = self._host.caller().skipped_state(self)
                if skipped is not None and skipped is not self._skipped:  # once a restore
                    self._skipped = skipped
                    self.load_state_dict(skipped)
            except LoaderkitError as exc:  # at next(): Lightning's teardown masks one from iter()
                return _raising(exc)
        elif not self._spec.seed_explicit:  # drawn, even if a first batch settled it
            self._adopt_skipped_seed()
        if not (self._spec.seed_explicit or self._spec.seed_chosen):
            self._adopt_fit_seed()
        if self._engine.one_iterator or self._host.pool.persistent:
            self._host.supersede()
        live = EpochIterator(self, self._host, self._engine)
        self._host.iterators.add(live)
        return live

    def _adopt_skipped_seed(self) -> None:
        """Take the seed of the epoch-end state Lightning leaves unloaded (a fit resumed from
        an epoch-end checkpoint) in place of a drawn one; the epoch is Lightning's."""
        try:
            skipped = self._host.caller().skipped_state(self)
        except StateMismatchError:
            return  # reloaded every n > 1 epochs: each reload draws anew, resumed or not
        if skipped is None or skipped is self._skipped:
            return
        self._skipped = skipped  # once per restore
        seed = _adoptable_seed(skipped, self._spec)
        if seed is not None and seed != self._host.seed:
            self._engine.adopt_seed(seed)
            self._host.seed, self._host.seed_drawn = seed, False

    def _adopt_fit_seed(self) -> None:
        """Under Lightning's reloads, take the seed of the loader this one replaces in place
        of a drawn one, so that a resumed fit's reloads draw what the saved run's did."""
        host = self._host
        seed = host.caller().fit_seed(self, host.seed, drawn=host.seed_drawn)
        if seed is not None and seed != host.seed:
            self._engine.adopt_seed(seed)
            host.seed, host.seed_drawn = seed, False

    @property
    def wait_seconds(self) -> float:
        """Seconds spent inside ``next()`` of this loader's iterators, summed over its life."""
        return self._host.waited

    def describe(self) -> dict[str, Any]:
        """How this loader iterates and resumes, for logs and ``loaderkit inspect``.

        Returns:
            A dict with ``engine`` (``"plan"``, ``"stream"`` or ``"iterable"``),
            ``resume`` (``"position"``, ``"cursors"``, ``"state"`` or ``"replay"``)
            and ``resume_reason``, ``num_workers``, ``batch_size``, ``transport``
            (how batches crossed from workers), ``auto_workers`` under
            ``num_workers="auto"``, and ``mix`` for a :class:`~loaderkit.MixedDataset`
            (its :meth:`~loaderkit.MixedDataset.describe` plus ``epoch``,
            ``applied`` and, where not applied, ``reason``).
        """
        info: dict[str, Any] = {
            "num_workers": self.num_workers,
            "batch_size": self._spec.shown_batch_size,
            "transport": self._host.pool.stats.describe(),
        }
        if self._host.auto is not None:
            info["auto_workers"] = self._host.auto.describe()
        return {**info, **self._engine.describe()}

    def close(self) -> None:
        """Stop this loader's worker processes now, persistent ones included; the next
        ``iter()`` starts new ones. Open iterators refuse their next batch (a
        :class:`~loaderkit.DevicePrefetcher` first hands over the one it copied ahead); the
        position (:meth:`state_dict`) stays. :class:`~loaderkit.AttachLoaders` calls it as a
        Trainer's run ends, as Lightning stops a ``DataLoader``'s workers.

        Example:
            >>> loader = ResumableDataLoader(list(range(8)), batch_size=4)
            >>> [batch.tolist() for batch in loader]
            [[0, 1, 2, 3], [4, 5, 6, 7]]
            >>> loader.close()  # a plain loop done with it; Lightning's runs need not
        """
        self._host.stop_iterators()
        self._engine.close()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its constructor's arguments, a subclass's attributes, its seed and (once
        loaded or given an epoch) its position: a spawned process (Lightning's ``ddp_spawn``)
        rebuilds it on its own rank, as a ``DataLoader`` built there. A loader only iterated
        is copied afresh, as a ``DataLoader`` is."""
        args = {**self._args, "worker_init_fn": self._host.pool.user_init}
        if self._sampler_rng is not None:
            args["sampler"] = _with_generator_at(args["sampler"], self._sampler_rng)
        state = self.state_dict() if self._positioned else None
        host = self._host
        seed = None if self._spec.seed_explicit else (host.seed, host.seed_drawn)
        extra = {k: v for k, v in vars(self).items() if k not in _OWN_ATTRIBUTES}
        # Made first, then built from its arguments (__setstate__): arguments that refer to
        # the loader (a subclass's bound method as collate_fn) are pickled as references.
        return _blank, (type(self),), (self.dataset, args, state, seed, extra)

    def __setstate__(self, built: tuple[Any, ...]) -> None:
        """Build an unpickled loader (:meth:`__reduce__`) from its arguments."""
        dataset, args, state, seed, extra = built
        with torch.random.fork_rng(devices=[]):  # a seed drawn here must not move torch's RNG
            ResumableDataLoader.__init__(self, dataset, **args)
        host = self._host
        if seed is not None and host.seed != seed[0]:  # the same draw (ranks may replace it)
            self._engine.adopt_seed(seed[0])
            host.seed, host.seed_drawn = seed
        self.__dict__.update(extra)
        if state is not None:
            self.load_state_dict(state)

    def _register_lookahead(self, holder: Any) -> None:
        """A consumer holding batches ahead answers ``state_dict()`` until the next ``iter()``,
        load or ``set_epoch`` of another epoch."""
        self._lookahead = holder

    def _take_back(self, held: dict[str, Any]) -> bool:
        """Go back to a dropped holder's ``held`` state where batches were drawn past it (a
        prefetcher's look-ahead of a stopped loop) and a stream goes on across epochs from
        there; returns whether it did."""
        if not self._engine.carries_over:
            return False
        own = self._engine.state()
        if (held["epoch"], held["steps_done"]) >= (own["epoch"], own["steps_done"]):
            return False  # nothing drawn past the consumer (its epoch ran to the end)
        self.load_state_dict(held)
        return True

    def _drop_lookahead(self) -> None:
        """Stop asking the holder, and empty it."""
        if self._lookahead is not None:
            self._lookahead.drop()
            self._lookahead = None

    def state_dict(self) -> dict[str, Any]:
        """The position of the batches handed out so far (a
        :class:`~loaderkit.DevicePrefetcher`'s consumer view); the same on every rank, never a
        collective (a stream's reads the other ranks' cursors from the process group's store)."""
        held = self._lookahead.held_state() if self._lookahead is not None else None
        if held is not None:
            # As of the last batch the host trained: it may hold some untrained (Lightning).
            return dict(self._lookahead.held_state(self._host.held_of(self._host.current)))
        # A state must not carry a provisional seed that the first batch replaces under DDP.
        settle_seed(self._host, self._engine, final=False)
        self._host.check_one_position()
        return self._engine.state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume at a saved position: the next ``iter()`` yields the rest of its epoch.

        Raises:
            StateMismatchError: the state was saved for a different dataset size,
                seed, batch size, shuffle or drop_last setting, or is malformed.
        """
        settle_seed(self._host, self._engine, final=False)  # a known DDP world settles first
        adopted = self._engine.load(state_dict, adopt_seed=not _keeps_seed(self._spec, state_dict))
        self._positioned = True
        self._drop_lookahead()  # loaded (a refused state leaves the consumer's view)
        if adopted is not None:
            self._host.seed = adopted
        self._host.seed_drawn = False  # the saved run's seed is the one to keep


# Set by ResumableDataLoader itself (or a host attached to it), never pickled as they are.
_OWN_ATTRIBUTES = _FIXED_AFTER_INIT | {
    "_args",
    "_sampler_rng",
    "_positioned",
    "_spec",
    "_host",
    "_engine",
    "_lookahead",
    "_skipped",
    "_built",
    "worker_init_fn",
    "_loaderkit_host",
}


def _blank(cls: type[ResumableDataLoader]) -> ResumableDataLoader:
    """An unpickled loader before :meth:`ResumableDataLoader.__setstate__` builds it."""
    return cls.__new__(cls)


def _own_generator_state(sampler: Any) -> torch.Tensor | None:
    """The state of the CPU ``torch.Generator`` a user's sampler holds as ``generator``."""
    generator = getattr(sampler, "generator", None)
    if isinstance(generator, torch.Generator) and generator.device.type == "cpu":
        return generator.get_state()
    return None


def _with_generator_at(sampler: Any, state: torch.Tensor) -> Any:
    """A copy of ``sampler`` whose generator is back at ``state`` (the loader's listings drew
    from it since, and a drawn generator would give another seed)."""
    copied = copy.copy(sampler)
    if hasattr(copied, "__dict__"):  # __slots__: no hook of the loader's on it
        copied.__dict__.pop("set_epoch", None)  # the loader's hook on the original (views.py)
    copied.generator = torch.Generator().set_state(state)
    return copied


def _saved_on_ranks(state: Any) -> bool:
    """Whether ``state`` was saved on several ranks with their default seed (0), not the
    draw of the generator a loader was given (kept on ranks since 0.2.0)."""
    topology = state.get("topology") if isinstance(state, dict) else None
    ranks = isinstance(topology, dict) and topology.get("world_size", 1) != 1
    return ranks and _settings(state).get("seed") == DDP_DEFAULT_SEED


def _keeps_seed(spec: LoaderSpec, state: Any) -> bool:
    """Whether a loader keeps its own seed over ``state``'s: the user's, or drawn from the
    user's seeded generator (unless ``state`` was saved on ranks)."""
    return spec.seed_explicit or (spec.seed_chosen and not _saved_on_ranks(state))


def _adoptable_seed(state: Any, spec: LoaderSpec) -> int | None:
    """The seed of ``state`` that a loader without a seed of its own takes; None if none."""
    seed = _settings(state).get("seed")
    if _keeps_seed(spec, state):
        return None
    return seed if isinstance(seed, int) and seed >= 0 else None


def _settings(state: Any) -> dict[str, Any]:
    """The settings field of ``state`` that holds the seed, by engine kind: "plan",
    "stream", "iterable" (empty if none)."""
    if not isinstance(state, dict):
        return {}
    settings = state.get("plan", state.get(str(state.get("kind")), {}))
    return settings if isinstance(settings, dict) else {}


def build_engine(loader: Sized, spec: LoaderSpec) -> tuple[Host, Engine, BatchFetcher]:
    """The loader's host and its one engine, chosen by ``spec.kind`` (the only place)."""
    fetch = BatchFetcher(
        spec.dataset,
        spec.collate_fn,
        seed=spec.seed,
        per_sample_seeding=spec.per_sample,
        read_under=spec.read_under,
    )
    topology = {"rank": spec.rank, "world_size": spec.world_size}
    # This rank's share of the cores; a world_size given alone is checked at the first batch
    # (the group that gives its rank may come after this loader).
    world = spec.world_size if spec.world_size is not None else detect(rank=spec.rank).world_size
    cores = cpu_budget(local_processes(world))
    auto = AutoWorkers(cap=min(cores, MAX_AUTO_WORKERS)) if spec.auto else None
    pool = WorkerPool(
        num_workers=spec.workers,
        pin_memory=spec.pin,
        timeout=spec.timeout,
        prefetch_factor=spec.prefetch_factor,
        persistent=spec.persistent_workers,
        user_init=spec.worker_init_fn,
        start_method=spec.multiprocessing_context,
        cores=cores,
    )
    host = Host(
        loader,
        seed=spec.seed,
        seed_drawn=not spec.seed_explicit,
        seed_chosen=spec.seed_chosen,
        pool=pool,
        auto=auto,
        **topology,
    )
    common: dict[str, Any] = {"plan": spec.plan, "reseed": spec.reseed}
    common |= {"batch_size": spec.step_size, "drop_last": spec.drop_last}
    common["collate_fn"] = fetch.collate
    engine: Engine
    if spec.kind == "iterable":
        engine = IterableEngine(host, spec.dataset, **common)
    elif spec.kind == "stream":
        engine = StreamEngine(
            host, spec.dataset, per_sample_seeding=spec.stream_per_sample, **common
        )
    else:
        engine = PlanEngine(
            host, dataset=spec.dataset, plan=spec.plan, fetch=fetch, reseed=spec.reseed
        )
        if isinstance(spec.batch_sampler, PlanBatchSampler):  # now its checks all passed
            lend_batch_sampler(spec.batch_sampler, engine.cursor, loader)
    return host, engine, fetch


def views(loader: object, spec: LoaderSpec, engine: Engine) -> tuple[Any, Any]:
    """``loader.sampler`` and ``loader.batch_sampler``, as ``DataLoader`` has them."""
    if spec.kind == "iterable":
        # As DataLoader's: an endless constant sampler and a BatchSampler over it.
        order: Any = IterableOrder(loader)
        if spec.batch_size is None:
            return order, None
        return order, BatchSampler(order, spec.step_size, spec.drop_last)
    order = plan_order(loader, engine, shuffled=bool(getattr(engine.plan, "shuffle", True)))
    for given in (spec.sampler, spec.batch_sampler):
        if given is not None:
            hook_set_epoch(given, loader)  # sampler.set_epoch(e) sets the loader's epoch
    sampler = spec.sampler if spec.sampler is not None else order
    return sampler, spec.batch_sampler if spec.batch_sampler is not None else PlanBatches(order)


def _raising(exc: Exception) -> Iterator[Any]:
    raise exc
    yield  # a generator: raises at its first next()
