"""How ResumableDataLoader iterates a :class:`StreamingShardedDataset` (private): each worker
plays one slot, sending each batch with the slot's cursor after it; workers take turns.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Generator, Iterator
from functools import partial
from typing import Any

from torch.utils.data import DataLoader, get_worker_info

from loaderkit.collate import promoting_collate
from loaderkit.data._open import shard_name
from loaderkit.data.streaming import (
    Cursor,
    StreamingShardedDataset,
    TransformFailed,
    slot_stream,
)
from loaderkit.errors import LoaderkitError, StateMismatchError
from loaderkit.loader._engine import EngineSource, Host, Run, WorkerStreams, settle_seed
from loaderkit.loader._fetch import FailedBatch, collate_said, worker_error_from
from loaderkit.loader._stream_ring import PeerRing, flush_retired, ring_window
from loaderkit.loader._workers import guard_workers
from loaderkit.plan._agree import Rounds, agree_across_ranks, group_store, rank_check_timeout
from loaderkit.plan._cursor import STREAM_FIELDS, check_settings
from loaderkit.transfer import pin_batch, pin_now

OWNER = "ResumableDataLoader"
_MISSING = (
    "the state was not saved by a loader over a StreamingShardedDataset. Pass what "
    "state_dict() returned by a loader over the same stream."
)
_DIFFERS = (
    "A stream resumes exactly only with the same shards (names, sizes, dtypes, object "
    "versions, order) "
    "and settings; build the loader with the saved value (the same shards, in the same order) "
    "or start without the state."
)


class _SlotBatches(EngineSource):
    """What the inner DataLoader iterates: this rank's slots, batched, with cursors."""

    def __init__(self, engine: StreamEngine, rotation: int) -> None:
        super().__init__(engine)
        self.seed, self.per_sample = engine.host.seed, engine.per_sample_seeding
        self.steps = engine.steps  # per epoch, None: one pass
        self.rank, self.world_size = engine.host.topology()
        self.workers, self.rotation = engine.workers, rotation
        self.epoch, self.steps_done = engine.epoch, engine.steps_done
        self.cursors = list(engine.cursors)
        self._iterations = 0  # a persistent worker's copy counts its epochs

    def __iter__(self) -> Iterator[tuple[int, Cursor, Any]]:
        info = get_worker_info()
        return self.batches(0 if info is None else info.id)

    def batches(self, worker: int) -> Iterator[tuple[int, Cursor, Any]]:
        """Worker ``worker``'s batches: ``(local slot, cursor after, batch)``."""
        if self._iterations == 0:
            local = (worker + self.rotation) % self.workers
            steps_done, cursor = self.steps_done, self.cursors[local]
        else:  # the next whole epoch of a persistent worker: it kept its own cursor
            local, steps_done = worker, 0
            cursor = self.cursors[local] if self.steps is not None else None
        epoch = self.epoch + self._iterations
        self._iterations += 1
        if cursor is None:  # a slot's first turn: streams going on across epochs begin at pass 0
            cursor = Cursor.start(epoch if self.steps is None else 0)
        limit = None
        if self.steps is not None:  # this worker's turns among the epoch's remaining steps
            limit = len(range(worker, self.steps - steps_done, self.workers))
        stream = slot_stream(
            self.user_dataset,
            seed=self.seed,
            slot=self.rank * self.workers + local,
            slots=self.workers * self.world_size,
            cursor=cursor,
            cycle=self.steps is not None,
            per_sample_seeding=self.per_sample,
        )
        made = 0
        while limit is None or made < limit:
            samples = []
            for sample, cursor in stream:  # noqa: B007 - the cursor after the last sample
                samples.append(sample)
                if len(samples) == self.batch_size:
                    break
            if not samples or (len(samples) < self.batch_size and self.drop_last):
                return
            self.cursors[local] = cursor
            made += 1
            yield local, cursor, self._batch(samples)
            if len(samples) < self.batch_size:
                return

    def _batch(self, samples: list[Any]) -> Any:
        """The collated batch, or a failed one in its place (the epoch goes on)."""
        failed = next((s for s in samples if type(s) is TransformFailed), None)
        if failed is not None:
            exc = failed.error
            return FailedBatch(
                worker_error_from(
                    f"the transform of {failed.where} failed with {type(exc).__name__}: {exc}; "
                    "fix the transform (traceback chained above).",
                    exc,
                )
            )
        try:
            return self.collate(samples)
        except Exception as exc:  # named as a planned loader's collate failure is
            said = collate_said(exc, own=self.collate is promoting_collate)
            where = f"collate_fn failed on a stream batch of {len(samples)} samples"
            return FailedBatch(worker_error_from(where + said, exc))


class StreamEngine(WorkerStreams):
    """Epochs, cursors and state of a loader over a :class:`StreamingShardedDataset`."""

    begun_fields = ("complete", "cursors", "next_local", "_round", "_loaded_ranks")

    one_iterator = True  # the cursors are the loader's: a new iter() supersedes the old

    dataset: StreamingShardedDataset

    def __init__(
        self,
        host: Host,
        dataset: StreamingShardedDataset,
        *,
        per_sample_seeding: bool,
        **engine: Any,
    ) -> None:
        super().__init__(host, dataset, **engine)
        self.per_sample_seeding = self.keyed = per_sample_seeding
        # Where in the shards this rank's slots are (None: start of the pass); whose turn is next.
        self.cursors: list[Cursor | None] = [None] * self.workers
        self.next_local = 0
        self._warned = False
        self._ring: PeerRing | None = None  # the peers' cursors (None without a store)
        self._rounds = Rounds()  # this loader's comparisons; its channel names the ring
        self._round: int | None = None  # of this epoch start (None: not compared since load)
        self._loaded_ranks: list[Any] | None = None  # a loaded state's, until the next epoch
        self.carries_over = dataset.limited  # each slot's stream goes on across epochs
        self._dealt_to: int | None = None  # the world size the cursors' slots were dealt for

    def epoch_length(self, epoch: int) -> int:
        """The limit, or for one pass of unknown length the batches so far (+1 while it goes on)."""
        steps = self.steps
        return super().epoch_length(epoch) if steps is None else steps

    @property
    def steps(self) -> int | None:
        _, world_size = self.host.topology()
        return self.dataset.epoch_steps(self.batch_size, world_size)

    # ----------------------------------------------------------------- epochs
    def check_world(self) -> None:
        _, world_size = self.host.topology()
        if world_size > 1 and not self.dataset.limited:
            raise LoaderkitError(
                f"ResumableDataLoader: a StreamingShardedDataset on {world_size} ranks without "
                "steps_per_epoch would step differently per rank and hang DDP. Pass "
                "steps_per_epoch= (batches per rank) or samples_per_epoch= to the dataset, or use "
                "ShardedDataset."
            )
        steps = self.steps
        if steps is not None and steps < self.workers:
            # Each epoch deals its steps from the first slot on: the others would never read.
            raise LoaderkitError(
                f"ResumableDataLoader: {steps} steps per epoch on this rank are fewer than its "
                f"{self.workers} workers, so the later workers' shards would never be read; pass "
                f"num_workers={steps} or fewer, or more steps_per_epoch/samples_per_epoch."
            )

    def length(self) -> int:
        self.check_world()
        steps = self.steps
        if steps is None:
            raise TypeError(
                "ResumableDataLoader over a StreamingShardedDataset has no length (one pass over "
                "shards of unknown size); pass steps_per_epoch= to the dataset for a fixed one."
            )
        return steps

    def _begin(self) -> int:
        """Fix the epoch of a new iteration; returns the worker rotation."""
        rank, world_size = self.host.topology()
        epoch, start, steps_done = self._position.upcoming(self)
        dealt = any(cursor is not None for cursor in self.cursors)
        going_on = start > 0 or (self.steps is not None and dealt)
        if going_on and self._dealt_to not in (None, world_size):
            how = "loaded from a state saved" if self._loaded_ranks else "read"
            raise LoaderkitError(
                f"{OWNER}: this stream was {how} on {self._dealt_to} rank(s) (before "
                f"init_process_group?), now on {world_size}: its slots' places cannot be split "
                "again. Build the loader (and load a state saved) once the group exists."
            )
        self._dealt_to = world_size
        fields = {**self.fingerprint(), "world_size": world_size, "epoch": epoch}
        fields |= {"steps_done": steps_done, "num_workers": self.host.pool.num_workers}
        round_ = agree_across_ranks(
            OWNER, fields, rank=rank, world_size=world_size, epoch=epoch, rounds=self._rounds
        )
        _, start, steps_done = self._position.begin(self)
        self.host.started = True
        rotation = self.next_local
        if start == 0:
            if self.steps is None:  # a new pass; with a limit the streams go on
                self.cursors = [None] * self.workers
            self.complete, self.next_local, rotation = False, 0, 0
            self._history.clear()
        # else the rest of a resumed epoch: go on from the saved turn
        self._round, self._loaded_ranks = round_, None
        if round_ is not None:
            self._publish_from(round_, rank, world_size, steps_done)
        return rotation

    def _publish_from(self, round_: int, rank: int, world_size: int, steps_done: int) -> None:
        """Open this loader's ring at its first epoch start; publish the epoch's start."""
        store = group_store(rank, world_size)
        if store is None:
            self._ring = None
            return
        flush_retired(store)
        if self._ring is None or self._ring.store is not store:
            assert self._rounds.channel is not None  # set by the comparison that gave round_
            self._ring = PeerRing(
                store,
                namespace=self._rounds.channel,
                rank=rank,
                world_size=world_size,
                window=ring_window(),
                timeout=rank_check_timeout(),
            )
            weakref.finalize(self, self._ring.retire)
        self._ring.publish(round_, self.epoch, steps_done, self._entry(self.cursors))

    def epoch_batches(self, run: Run) -> Generator[Any, None, None]:
        """One epoch's batches (``run`` unused: a new iteration supersedes the old)."""
        settle_seed(self.host, self)
        self.check_world()
        if self.host.name_epoch(self._position, self):
            return
        kept = self.kept()
        rotation = self._begin()
        began = self.steps_done
        source = _SlotBatches(self, rotation)
        slots = self.workers * source.world_size
        if len(self.dataset.shards) < slots and not self._warned:
            self._warned = True
            warnings.warn(
                f"StreamingShardedDataset: {len(self.dataset.shards)} shards for {slots} "
                "(rank, worker) slots, so every slot reads every shard. Use at least "
                f"{slots} shards to read each byte once.",
                RuntimeWarning,
                stacklevel=3,
            )
        if self.host.pool.num_workers == 0:
            try:
                yield from self._hand_out(iter(source), pin=pin_now(self.host.pool.pin_memory))
            except BaseException:
                if self.steps_done == began:  # nothing handed out: this epoch has not begun
                    self.undo(kept)
                raise
            return
        inner = self._inner_loader(source, rotation)
        workers = self.start(inner, partial(self._in_flight, source, rotation), kept)
        try:
            guarded = guard_workers(workers, partial(self._in_flight, source, rotation))
            yield from self._hand_out(guarded, pin=False)
        except GeneratorExit:  # a dropped iterator (the loader may be gone too)
            steps = self.steps if self.host.alive() else None
            if self._inner is inner and steps is not None and self.steps_done >= steps:
                # A consumer stopping at len() (Lightning): the workers wait at the next epoch.
                self._inner_next = self.epoch + 1
            else:
                self._drop_inner(inner, workers)
            raise
        except BaseException:
            self._drop_inner(inner, workers)
            if self.steps_done == began:
                self.undo(kept)
            raise
        if self._inner is inner:
            self._inner_next = self.epoch + 1

    def _in_flight(self, source: _SlotBatches, rotation: int, task: int, worker: int) -> Any:
        """What a dead worker was loading: the batch after its slot's last cursor."""
        local = (worker + rotation) % self.workers
        slot = source.rank * self.workers + local
        cursor = self.cursors[local] or Cursor.start(self.epoch if self.steps is None else 0)
        shards, _ = self.dataset.slot_shards(
            self.host.seed, cursor.pass_, slot, source.world_size * self.workers
        )
        lanes = ", ".join(
            f"{shard_name(self.dataset.shards[shards[pos]])} at sample {offset}"
            for pos, offset in cursor.lanes
            if pos < len(shards)
        )
        upcoming = (
            shard_name(self.dataset.shards[shards[cursor.next]])
            if cursor.next < len(shards)
            else "none (all opened)"
        )
        return (
            f"a batch of stream slot {slot} (pass {cursor.pass_}; open shards: "
            f"{lanes or 'none'}; next shard to open: {upcoming}; as of the last batch "
            "handed out)",
            None,
        )

    def _hand_out(self, batches: Iterator[Any], *, pin: bool) -> Generator[Any, None, None]:
        fresh = self.steps_done == 0
        for local, after, raw in batches:
            batch = pin_batch(raw) if pin else raw  # a pin that fails counts no step
            self._history.append((local, self.cursors[local], self.next_local, self.complete))
            self.cursors[local] = after
            self._position.consumed(self._position.position + 1)
            self.next_local = (local + 1) % self.workers
            if self._ring is not None and self._round is not None:
                entry = self._entry(self.cursors)
                self._ring.publish(self._round, self.epoch, self.steps_done, entry)
            yield batch
        if fresh and self.steps_done == 0:  # (with steps=, empty passes raise in slot_stream)
            shards = self.dataset.shards
            names = ", ".join(map(shard_name, shards[:3])) + (", ..." if len(shards) > 3 else "")
            slots = f"each of the {self.workers} worker slot(s) got fewer than batch_size="
            short = f"{slots}{self.batch_size} (drop_last=True)" if self.drop_last else ""
            raise LoaderkitError(
                f"StreamingShardedDataset: epoch {self.epoch} yielded no batch: its "
                f"{len(shards)} shard(s) ({names}) hold no sample{', or ' * bool(short)}{short}; "
                "check the shards and the reader"
                f"{', or lower batch_size or num_workers' * self.drop_last}."
            )
        self.complete = True

    def _inner_loader(self, source: _SlotBatches, rotation: int) -> DataLoader[Any]:
        # A resumed epoch starting mid-turn needs its own workers (persistent ones keep their slot).
        return self.workers_for(source, self.epoch, fresh=rotation != 0)

    def schedule(self) -> Any:
        raise TypeError(
            "ResumableDataLoader.sampler: a StreamingShardedDataset has no sample order "
            "to list (its sizes are unknown); only set_epoch() applies to it."
        )

    upcoming_steps = schedule  # the sampler views' len(): refused alike

    # ------------------------------------------------------------------ state
    def describe(self) -> dict[str, Any]:
        reason = "a cursor per (rank, worker) slot and open shard: exact under the same "
        reason += "world size and num_workers"
        return {"engine": "stream", "resume": "cursors", "resume_reason": reason}

    def identity(self) -> dict[str, Any]:
        return self.dataset.fingerprint()

    def state(self) -> dict[str, Any]:
        epoch, _, saved_steps = self._position.saved(self)
        steps_done = self.steps_done
        pending = (epoch, saved_steps) != (self.epoch, steps_done)  # set_epoch(): its start
        cursors, next_local, complete = list(self.cursors), self.next_local, self.complete
        if not pending:  # batches the consumer holds untrained are not consumed
            for local, cursor, nxt, was_complete in self.taken_back():
                cursors[local], next_local, complete = cursor, nxt, was_complete
                steps_done -= 1
        rank, world_size = self.host.topology()
        ranks = self._ranks(self._entry(cursors, next_local), rank, world_size, steps_done)
        if pending:  # every rank begins the epoch at its first slot; a new pass afresh
            complete, steps_done = False, 0
            for entry in ranks:
                if entry is not None:
                    entry["next"] = 0
                    if self.steps is None:
                        entry["cursors"] = [None] * len(entry["cursors"])
        return self.sealed(
            "stream",
            STREAM_FIELDS,
            world_size,
            epoch=epoch,
            steps_done=steps_done,
            complete=complete,
            stream=self.fingerprint(),
            ranks=ranks,
        )

    def _entry(self, cursors: list[Cursor | None], next_local: int | None = None) -> dict[str, Any]:
        """One rank's part of the state: its slots' cursors and the slot whose turn is next."""
        return {
            "cursors": [None if c is None else c.to_state() for c in cursors],
            "next": self.next_local if next_local is None else next_local,
        }

    def _ranks(self, mine: Any, rank: int, world_size: int, steps_done: int) -> list[Any]:
        """Every rank's entry at this rank's ``(epoch, steps_done)``; never a collective."""
        ranks: list[Any] = [None] * world_size
        if self._round is None:  # no epoch compared across ranks since construction or load
            if self._loaded_ranks is not None:  # nobody moved: the loaded state still holds
                ranks = copy.deepcopy(self._loaded_ranks)
            elif not self._position.started and group_store(rank, world_size) is not None:
                # Not started: every rank is at the start of its streams, as this one is.
                ranks = [copy.deepcopy(mine) for _ in range(world_size)]
        elif self._ring is not None:
            owner = "ResumableDataLoader.state_dict"
            ranks = self._ring.read(self._round, self.epoch, steps_done, owner=owner)
        ranks[rank] = mine
        counts = [len(r["cursors"]) for r in ranks if r is not None]
        if len(set(counts)) > 1:
            raise LoaderkitError(
                f"ResumableDataLoader: the ranks stream with different num_workers "
                f"({[None if r is None else len(r['cursors']) for r in ranks]} worker slots per "
                "rank). Use the same num_workers on every rank."
            )
        return ranks

    def load(self, state: Any, *, adopt_seed: bool) -> int | None:
        """Resume at ``state``; returns the saved seed when it is adopted."""
        self.open_state(state, "stream", STREAM_FIELDS, "a StreamingShardedDataset", _MISSING)
        owner = "ResumableDataLoader.load_state_dict"
        saved = dict(state["stream"])
        adopted = check_settings(
            saved, self.fingerprint(), owner=OWNER, adopt_seed=adopt_seed, fix=_DIFFERS
        )
        rank, world_size = self.host.topology()
        topo, workers = state["topology"], self.host.pool.num_workers
        if topo != {"world_size": world_size, "num_workers": workers}:
            raise StateMismatchError(
                f"{owner}: the stream was saved with world_size={topo.get('world_size')}, "
                f"num_workers={topo.get('num_workers')}; this loader has world_size="
                f"{world_size}, num_workers={workers}, and per-slot cursors cannot "
                "be re-split. Resume with the saved topology, or use ShardedDataset."
            )
        mine = state["ranks"][rank]
        if not isinstance(mine, dict):
            saved_by = [r for r, entry in enumerate(state["ranks"]) if entry is not None]
            raise StateMismatchError(
                f"{owner}: the state holds no cursors for rank {rank}, only for rank(s) "
                f"{saved_by}, as saved without a torch.distributed process group. Load each rank "
                "the state_dict() it saved, or save under an initialized process group."
            )
        self.cursors = [None if c is None else Cursor.from_state(c) for c in mine["cursors"]]
        self._dealt_to = world_size  # checked above: dealt for this world size
        self.next_local = int(mine["next"])
        self._round, self._loaded_ranks = None, list(state["ranks"])
        return self.resume(state, adopted)
