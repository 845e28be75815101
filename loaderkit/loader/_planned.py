"""The engine of map-style data: a position in the sample plan, a batch counted consumed when
handed out, in-process or from workers (private).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Generator, Mapping
from functools import partial
from typing import Any
from zlib import crc32

from torch.utils.data import DataLoader

from loaderkit._callers import epoch_begun
from loaderkit.data.mixing import (
    MixedDataset,
    listing_crc32,
    mix_sources_crc32,
    shard_counts_crc32,
    shard_names_crc32,
)
from loaderkit.errors import LoaderkitError, StateMismatchError
from loaderkit.loader._engine import Host, Run, ran_out, set_epoch_keeping, settle_seed
from loaderkit.loader._fetch import (
    BatchFetcher,
    FailedBatch,
    KeyedDataset,
    KeySource,
    batch_indices,
    seed_keys,
)
from loaderkit.loader._views import count_indices
from loaderkit.loader._workers import (
    guard_workers,
    outdated,
    start_workers,
    stop_inner,
    stop_workers,
)
from loaderkit.plan._agree import Rounds, agree_across_ranks
from loaderkit.plan._cursor import PlanCursor, check_state, field_digest
from loaderkit.plan._sampler_plan import SamplerPlan, generator_states_ok
from loaderkit.plan.mix import MixBucketPlan, MixPlan
from loaderkit.plan.sample import Plan, Schedule
from loaderkit.transfer import pin_batch, pin_now

OWNER = "ResumableDataLoader"
# A user's sampler's state beside its plan: the reseeded generator an epoch was listed from,
# its order's checksum, and the generator now and at the last listing.
_SAMPLER_EXTRA = ("listed_from", "epoch_check", "generator_now", "generator_seen")


class PlanEngine:
    """Epochs, batches and state of a loader over map-style data: a position in its plan."""

    one_iterator = False
    carries_over = False

    def __init__(
        self,
        host: Host,
        *,
        dataset: Any,
        plan: Plan,
        fetch: BatchFetcher,
        reseed: Callable[[int], Plan] | None,
    ) -> None:
        self.host, self.dataset, self.fetch = host, dataset, fetch
        self.plan = plan
        self._reseed = reseed  # None: the plan's seed is the user's, never adopted
        self._names = shard_names_crc32(dataset)  # once: it lists the files
        self._mix = mix_sources_crc32(dataset)
        self._listing = listing_crc32(dataset)
        self._counts: int | None = None  # the shards' samples, where the plan has no sizes
        self.fingerprint = self._fingerprint(plan)  # cached: state() runs every step
        self._skeleton: dict[str, Any] | None = None  # state()'s constant part
        self._skeleton_topology: tuple[int, int] | None = None  # the topology it was made for
        self._sampler_plan: tuple[Any, dict[str, Any], dict[str, Any], int] | None = None
        self.cursor = PlanCursor()
        self._keys = KeySource()
        self._inner: DataLoader[Any] | None = None  # persistent workers' loader
        self._rounds = Rounds()

    def _fingerprint(self, plan: Any, **extra: Any) -> dict[str, Any]:
        """The plan's settings (and ``extra``), and the shard files (in order) it names."""
        fields = {**plan.fingerprint(), **extra}
        if self._mix is not None and "source_names" not in fields:  # a plain plan over a mix
            fields["mix_sources_crc32"] = self._mix
        if self._listing is not None:
            fields["listing_crc32"] = self._listing
        if self._names is not None:
            fields.setdefault("shard_names_crc32", self._names)
            if "shard_sizes_crc32" not in fields:  # a ShardPlan's own counts
                if self._counts is None:
                    self._counts = shard_counts_crc32(self.dataset)
                fields.setdefault("shard_counts_crc32", self._counts)
        return fields

    def length(self) -> int:
        _, world_size = self.host.topology()
        run, cursor, plan = self.host.live_run(), self.cursor, self.plan
        # A set_epoch of the next epoch wins over a live run cut short (limit_train_batches).
        if run is not None and run.schedule is not None and cursor.iterating(plan):
            whole = plan.num_steps(cursor.epoch, start=0, world_size=world_size)
            exact = run.steps_before + run.schedule.num_steps
        else:
            caller, loaded = self.host.caller(), cursor.loaded(plan)
            # A loader rebuilt by the host is told its epoch as it begins (name_epoch).
            host_epoch = epoch_begun(caller, self.host.loader)
            epoch, start, steps_done = cursor.upcoming(plan, host_epoch)
            after = caller.epoch_after_restore(self.host.loader, counted=True)
            at_last = caller.epoch_after_restore(self.host.loader) is not None
            if loaded is not None and after is not None and after > epoch:
                # Restored at a limited epoch's last batch end, Lightning's loop goes on to the
                # next epoch in the same run, with this length.
                epoch, start, steps_done = after, 0, 0
            elif at_last and after is None and loaded == (cursor.epoch + 1, False):
                # Restored in the validation after the saved epoch's last batch, the loop first
                # ends that epoch where its count reaches the length: the saved epoch's.
                epoch, start, steps_done = cursor.epoch, cursor.position, cursor.steps_done
            whole = plan.num_steps(epoch, start=0, world_size=world_size)
            exact = steps_done + plan.num_steps(epoch, start=start, world_size=world_size)
        watch = self.host.len_watch
        length = exact if watch.managed else max(whole, exact)
        watch.answered(length)
        return length

    def set_epoch(self, epoch: int, *, late: bool = False) -> None:
        set_epoch_keeping(self.host, self.cursor, self.plan, epoch, late=late)

    def schedule(self) -> Schedule:
        """This rank's schedule of the next iteration."""
        epoch, start, _ = self.cursor.upcoming(self.plan)
        return self.rest_of_epoch(epoch, start)

    def upcoming_steps(self) -> int:
        """Batches of this rank's next iteration (``schedule().num_steps``, nothing listed)."""
        epoch, start, _ = self.cursor.upcoming(self.plan)
        _, world_size = self.host.topology()
        return self.plan.num_steps(epoch, start=start, world_size=world_size)

    def iterate(self, run: Run) -> Generator[Any, None, None]:
        """Begin the next iteration (its epoch fixed now) and return its batches."""
        settle_seed(self.host, self)
        self._check_size()
        rank, world_size = self.host.topology()
        if self.host.name_epoch(self.cursor, self.plan):
            return ran_out()
        if isinstance(self.plan, SamplerPlan):  # listed early (batch_sampler) before a reseed
            epoch, start, _ = self.cursor.upcoming(self.plan)
            if start == 0:
                self.plan.relist_if_reseeded(epoch)
        self._check_start(rank, world_size)
        before = dataclasses.replace(self.cursor)
        epoch, start, steps_done = self.cursor.begin(self.plan)
        self.host.started = True
        sched = self.plan.schedule(epoch, start=start, rank=rank, world_size=world_size)
        # A DistributedSampler the user gave pads as Lightning lets it (strided plan).
        stage = self.host.caller().evaluating() if world_size > 1 else None
        if stage is not None and not getattr(self.plan, "strided", False):
            self._refuse_repeats(stage, epoch, start, world_size)
        driven = self.host.caller().drives(self.host.loader)
        self.host.len_watch.check(OWNER, epoch, steps_done + sched.num_steps, driven=driven)
        if sched.num_steps == 0 and start > 0:
            self.cursor.position = self.plan.epoch_length(epoch)  # only a dropped tail left
        elif sched.num_steps == 0:
            name = "batch_size" if getattr(self.plan, "max_tokens", None) is None else "max_tokens"
            raise ValueError(
                f"ResumableDataLoader: epoch {epoch} yields no batch on {world_size} rank(s) "
                f"with {name}={getattr(self.plan, name, None)} and drop_last=True; lower {name}, "
                "use fewer ranks or set drop_last=False."
            )
        run.schedule, run.steps_before = sched, steps_done
        return run_epoch(self, sched, run, before)

    def _check_start(self, rank: int, world_size: int) -> None:
        """Refuse the next epoch start where the ranks or the host count it differently."""
        epoch, start, steps_done = self.cursor.upcoming(self.plan)
        fields = {**self.fingerprint, "world_size": world_size, "epoch": epoch}
        fields |= {"position": start, "steps_done": steps_done}
        if isinstance(self.plan, SamplerPlan) and world_size > 1:
            # A user's sampler lists each epoch itself (here, before the schedule lists it).
            fields["epoch_order"] = self.plan.order_check(epoch)
        agree_across_ranks(
            OWNER, fields, rank=rank, world_size=world_size, epoch=epoch, rounds=self._rounds
        )
        self._check_counted(epoch, start, steps_done, world_size)

    def _refuse_repeats(self, stage: str, epoch: int, start: int, world_size: int) -> None:
        """Refuse an evaluation repeating more samples than Lightning's samplers would."""
        one = count_indices(self.plan.schedule(epoch, start=start, rank=0, world_size=1))
        ranks = range(world_size)
        dealt = [
            self.plan.schedule(epoch, start=start, rank=r, world_size=world_size) for r in ranks
        ]
        extra = sum(map(count_indices, dealt)) - one
        if extra > (0 if stage == "predict" else world_size - 1):
            raise ValueError(
                f"ResumableDataLoader: trainer.{stage} on {world_size} ranks would repeat "
                f"{extra} sample(s) (its ranks step equally). Pass the DataModule as "
                "datamodule= (a loaderkit one whose batch_sampler() hook buckets: return True "
                "from its eval_batches_by_rank()), or give each rank its own part with "
                "world_size=1."
            )

    def _check_size(self) -> None:
        # A sampler's plan counts the sampler's indices; the dataset size is kept apart.
        built = getattr(self.plan, "dataset_size", self.plan.num_samples)
        size = len(self.dataset)
        if size != built:
            raise StateMismatchError(
                f"ResumableDataLoader: the dataset has {size} samples now, {built} when the "
                "loader was built. Build a new loader for the new dataset."
            )

    def _check_counted(self, epoch: int, start: int, steps_done: int, world_size: int) -> None:
        """Refuse a host whose count of the epoch's batches disagrees with the position."""
        counted = self.host.caller().batches_done(self.host.loader)
        if counted is None or counted == steps_done:
            return
        if start > 0 and self.plan.num_steps(epoch, start=start, world_size=world_size) == 0:
            # Lightning restores an epoch with no batch left as one to start over.
            raise StateMismatchError(
                f"ResumableDataLoader: the saved position {start} of epoch {epoch} leaves only "
                f"a tail that drop_last drops on {world_size} rank(s), so Lightning would start "
                "the epoch over. Resume on the saved number of ranks, or from another checkpoint."
            )
        raise StateMismatchError(
            f"ResumableDataLoader: Lightning's fit loop counts {counted} batches of epoch "
            f"{epoch} as done, but the loader's position is {steps_done} batches into it "
            f"(on {world_size} rank(s)). Resume from a step checkpoint of this run (Lightning "
            "miscounts one saved after the fit ended, or at an epoch's end with max_steps set), "
            "add loaderkit.ElasticResume() on another number of ranks, and draw one batch per "
            "training_step(dataloader_iter)."
        )

    def rest_of_epoch(self, epoch: int, position: int) -> Schedule:
        """This rank's schedule for the rest of ``epoch`` from the global ``position``."""
        rank, world_size = self.host.topology()
        return self.plan.schedule(epoch, start=position, rank=rank, world_size=world_size)

    def use_workers(self, count: int) -> None:
        """Load with ``count`` workers from the next batch on (``num_workers="auto"``)."""
        self.close()
        self.host.pool = dataclasses.replace(self.host.pool, num_workers=count)
        self._skeleton = None  # the state's topology names the count

    def inner_loader(self, sched: Schedule) -> DataLoader[Any]:
        """The worker DataLoader of ``sched``: the persistent one, else a new one per iteration."""
        rank, _ = self.host.topology()
        pool, seed = self.host.pool, self.host.seed
        keyed = self.fetch.seeder is not None  # per-sample seeds: numpy's bit generator counts
        keys = self._keys if pool.persistent else KeySource()
        keys.schedule = sched
        if outdated(self._inner):
            self.close()  # numpy's bit generator changed here since the workers took it
        if pool.persistent and self._inner is not None:
            # Workers stopped since (a failure, a dropped iterator) restart keyed to this epoch.
            self._inner.worker_init_fn = pool.init_fn(seed, sched.epoch, rank, keyed)
            return self._inner
        source = KeyedDataset(self.fetch, self.plan.num_samples)
        inner = pool.build(
            source, seed=seed, epoch=sched.epoch, rank=rank, batch_sampler=keys, keyed=keyed
        )
        if pool.persistent:
            self._inner = inner
        return inner

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if isinstance(self.dataset, MixedDataset):  # at the epoch iterated (or starting next)
            cursor = self.cursor
            epoch = cursor.epoch if cursor.started else cursor.upcoming(self.plan)[0]
            applied = isinstance(self.plan, MixPlan | MixBucketPlan)  # else unweighted: read once
            info["mix"] = {"epoch": epoch, "applied": applied, **self.dataset.describe(epoch)}
        reason = "a position in the sample plan: O(1), exact for any num_workers and world size"
        return {**info, "engine": "plan", "resume": "position", "resume_reason": reason}

    def state(self) -> dict[str, Any]:
        skeleton, cached = self._skeleton, self.host.topology_cache
        # Rebuilt where the epoch began under another topology (a group came after a peek);
        # not re-read per call (a state saved before that epoch begins keeps the old one).
        if skeleton is None or cached != self._skeleton_topology:
            _, world_size = self.host.topology()
            skeleton = self.cursor.state(
                self.plan,
                self.fingerprint,
                world_size=world_size,
                num_workers=self.host.pool.num_workers,
            )
            if self.host.topology_cache is not None:  # fixed from here on (or until a group)
                self._skeleton, self._skeleton_topology = skeleton, self.host.topology_cache
        # Shallow: nested dicts are shared read-only, like a torch state_dict's tensors.
        state = skeleton.copy()
        epoch, position, steps_done = self._unheld(*self.cursor.saved(self.plan))
        state["epoch"], state["position"], state["steps_done"] = epoch, position, steps_done
        # Only the position's digests change (field_digest inlined).
        checksum = skeleton["checksum"].copy()
        checksum["epoch"] = crc32(b"epoch=%d" % epoch)
        checksum["position"] = crc32(b"position=%d" % position)
        checksum["steps_done"] = crc32(b"steps_done=%d" % steps_done)
        state["checksum"] = checksum
        if isinstance(self.plan, SamplerPlan):
            # The user's reseeded generator the epoch came from, and its order's checksum.
            extra = {
                "listed_from": self.plan.listed_from(epoch),
                "epoch_check": self.plan.epoch_check(epoch, position),
                **self.plan.generator_states(),
            }
            extra = {key: value for key, value in extra.items() if value is not None}
            if extra:
                # Digested once while it stays (its generator states are 13 KB of JSON).
                memo, base = self._sampler_plan, state["plan"]
                if memo is None or memo[0] is not base or memo[1] != extra:
                    plan = {**base, **extra}
                    memo = self._sampler_plan = (base, extra, plan, field_digest("plan", plan))
                state["plan"], checksum["plan"] = memo[2], memo[3]
        return state

    def _unheld(self, epoch: int, position: int, steps_done: int) -> tuple[int, int, int]:
        """The running iteration's position before the batches the host holds untrained."""
        cursor, run = self.cursor, self.host.current
        if (epoch, position, steps_done) != (cursor.epoch, cursor.position, cursor.steps_done):
            return epoch, position, steps_done  # a pending set_epoch's start
        held = self.host.held_of(run)
        if not held or run is None or run.schedule is None:
            return epoch, position, steps_done
        kept = steps_done - run.steps_before - held  # batches of this iteration trained
        if kept < 0:
            raise LoaderkitError(
                f"ResumableDataLoader: the host holds {held} batches, but this iteration "
                f"handed out {steps_done - run.steps_before}; save the state after a batch "
                "of the new iteration was trained."
            )
        sched = run.schedule
        return epoch, sched.position_after(kept - 1) if kept else sched.start, steps_done - held

    def load(self, state: Any, *, adopt_seed: bool) -> int | None:
        """Resume at ``state``; returns the saved seed when it is adopted."""
        # Only a plan the loader built takes the saved seed; a user's plan's seed must match.
        adopt = ("seed",) if adopt_seed and self._reseed is not None else ()
        saved = state.get("plan") if isinstance(state, Mapping) else {}
        saved = saved if isinstance(saved, Mapping) else {}
        # A reseeded generator's epoch the saved state was listed from; its order's checksum.
        extra = {}
        if isinstance(self.plan, SamplerPlan):
            extra = {k: saved[k] for k in _SAMPLER_EXTRA if k in saved}
        generator = {k: v for k, v in extra.items() if k.startswith("generator_")}
        if generator and not generator_states_ok(generator):
            raise StateMismatchError(
                f"{OWNER}.load_state_dict: field 'plan' holds {sorted(generator)}, which are not "
                "a CPU torch.Generator's states; pass the state as state_dict() returned it."
            )
        fingerprint = self._fingerprint(self.plan, **extra)
        if (self.host.own_part() or (0, 1))[0] != 0:  # each rank's own part; the state rank 0's
            fingerprint.pop("listing_crc32", None)
        listed, check = extra.get("listed_from"), extra.get("epoch_check")
        check = check if isinstance(check, int) else None
        if check is not None and self._part_way(state) and "order_check" in saved:
            # That epoch's own order is checked (check_relisted), so epoch 0's may differ: a
            # sampler's weights may change between epochs and be built as they are now.
            fingerprint["order_check"] = saved["order_check"]
        if "epoch0_from" in saved and not self._in_epoch0(state):  # it lists epoch 0 only
            fingerprint["epoch0_from"] = saved["epoch0_from"]
        if isinstance(self.plan, SamplerPlan) and isinstance(state, Mapping):
            # Before anything changes; the settings first, which name what differs.
            check_state(state, fingerprint, owner=OWNER, adopt=adopt)
            epoch, position, seed = state.get("epoch"), state.get("position"), saved.get("seed")
            if isinstance(epoch, int) and isinstance(position, int) and epoch >= 0:
                # Under another seed that stays, cursor.load names the seed.
                same = isinstance(seed, int) and (bool(adopt) or seed == self.plan.seed)
                self.plan.check_relisted(
                    epoch,
                    position,
                    listed,
                    seed=seed if same else self.plan.seed,  # type: ignore[arg-type]
                    saved_check=check if same else None,
                )
        loaded = self.cursor.load(
            state, self.plan, owner=OWNER, adopt=adopt, fingerprint=fingerprint
        )
        saved_seed, adopted = loaded["plan"]["seed"], None
        if saved_seed != self.host.seed and self._reseed is not None:
            self.adopt_seed(saved_seed)
            adopted = saved_seed
        if isinstance(self.plan, SamplerPlan):
            at_start = loaded["position"] == 0
            self.plan.restore(
                loaded["epoch"], listed, check, at_start=at_start, generator=generator
            )
        self.host.supersede()
        return adopted

    def _in_epoch0(self, state: Mapping[str, Any]) -> bool:
        """Whether ``state`` is inside epoch 0 (begun, not finished)."""
        position = state.get("position")
        return (
            state.get("epoch") == 0
            and isinstance(position, int)
            and 0 < position < self.plan.epoch_length(0)
        )

    def _part_way(self, state: Mapping[str, Any]) -> bool:
        """Whether ``state`` is inside an epoch after the first of a user's sampler."""
        epoch, position = state.get("epoch"), state.get("position")
        return (
            isinstance(self.plan, SamplerPlan)
            and isinstance(epoch, int)
            and isinstance(position, int)
            and self.plan.part_way(epoch, position)
        )

    def adopt_seed(self, seed: int) -> None:
        assert self._reseed is not None
        self.host.seed, self.host.seed_drawn = seed, False
        self.plan = self._reseed(seed)
        self.fetch.seed = seed
        self.fingerprint = self._fingerprint(self.plan)
        self._skeleton = None
        self.close()  # its KeyedDataset holds the fetcher; rebuild with the new seed

    def close(self) -> None:
        inner, self._inner = self._inner, None
        stop_inner(inner)


def run_epoch(
    engine: PlanEngine, sched: Schedule, run: Run, before: PlanCursor
) -> Generator[Any, None, None]:
    # A function: the generator must not reference the iterator that owns it (Host.live).
    cursor, host = engine.cursor, engine.host

    def consumed(position: int) -> None:
        if host.current is run:  # only the current run moves the loader's position
            cursor.consumed(position)

    try:
        if host.auto is not None and not host.auto.settled:
            yield from _run_auto(engine, sched, consumed)
            return
        # Closed explicitly: Python 3.12 keeps the abandoned generator (and its workers) alive.
        with contextlib.closing(_batches(engine, sched)) as batches:
            for step, batch in batches:
                consumed(sched.position_after(step))
                yield batch
    except BaseException:
        # Nothing handed out (its workers failed to start, or died): the next iter() serves
        # this epoch, as its state says, not the one after.
        if run.handed == 0 and host.current is run:
            cursor.restore(before)
        raise


def _batches(engine: PlanEngine, sched: Schedule) -> Generator[tuple[int, Any], None, None]:
    """``(step, batch)`` of ``sched``, in this process or from the loader's workers."""
    host = engine.host
    if host.pool.num_workers == 0:
        fetch, pin, keys = engine.fetch, pin_now(host.pool.pin_memory), seed_keys(sched)
        indices = batch_indices(sched)
        for step in range(sched.num_steps):
            try:
                batch = fetch(sched.epoch, indices(step), keys(step))
            except Exception as exc:  # raised in the batch's place (EpochIterator)
                batch = FailedBatch(exc)
            else:
                batch = pin_batch(batch) if pin else batch
            yield step, batch
        return
    inner = engine.inner_loader(sched)
    workers = start_workers(inner, partial(describe_step, sched))
    try:
        # Task k of torch's worker iterator is step k of the schedule (keys in order).
        yield from enumerate(guard_workers(workers, partial(describe_step, sched)))
    except GeneratorExit:
        if not host.pool.persistent:
            stop_workers(inner, workers)
        raise
    except BaseException:
        # The exception's traceback cycles through torch's iterator: stop workers now.
        stop_workers(inner, workers)
        raise


def _run_auto(
    engine: PlanEngine, sched: Schedule, consumed: Callable[[int], None]
) -> Generator[Any, None, None]:
    """One epoch under ``num_workers="auto"``: measure, and switch workers at a batch boundary."""
    auto = engine.host.auto
    assert auto is not None
    while True:
        switch_to: int | None = None
        position: int | None = None
        asked = time.perf_counter()
        with contextlib.closing(_batches(engine, sched)) as source:
            for step, batch in source:
                got = time.perf_counter()
                consumed(sched.position_after(step))
                yield batch
                back = time.perf_counter()
                auto.record(got - asked, back - got)
                asked = back
                switch_to = auto.decide()
                if switch_to is not None and step + 1 < sched.num_steps:
                    position = sched.position_after(step)
                    break
        if switch_to is not None:  # decided at the epoch's last batch: the next epoch's count
            engine.use_workers(switch_to)
        if position is None:
            return
        sched = engine.rest_of_epoch(sched.epoch, position)


def describe_step(sched: Schedule, task: int, worker: int) -> tuple[str, Any]:
    """What batch ``task`` of ``sched`` holds, for a message about a dead worker."""
    if not 0 <= task < sched.num_steps:
        return f"batch {task} (past the epoch's {sched.num_steps})", None
    indices = sched.indices(task).tolist()
    shown = indices if len(indices) <= 16 else [*indices[:16], "..."]
    return f"sample indices {shown} (epoch {sched.epoch}, batch {task})", indices
