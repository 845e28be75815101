"""How ResumableDataLoader iterates an ``IterableDataset`` passed directly (private): as
``DataLoader`` does, each worker its own copy, batches from the workers in turn.
"""

from __future__ import annotations

import copy
import warnings
from collections import deque
from collections.abc import Generator, Iterator
from typing import Any

from torch.utils.data import get_worker_info

from loaderkit._tags import SeedTag
from loaderkit.errors import LoaderkitError, StateMismatchError
from loaderkit.loader._engine import EngineSource, Host, Run, WorkerStreams, settle_seed
from loaderkit.loader._fetch import FailedBatch
from loaderkit.loader._views import hook_set_epoch
from loaderkit.loader._worker_stream import (
    END,
    OWNER,
    RECORD,
    Recorder,
    fresh_record,
    is_stateful,
    open_stream,
    worker_batches,
)
from loaderkit.loader._workers import guard_workers
from loaderkit.plan._cursor import ITERABLE_FIELDS, check_settings
from loaderkit.seeding import derive_seed, seed_global_rngs, worker_seed
from loaderkit.transfer import pin_batch, pin_now

_MISSING = (
    "the state was not saved by a loader over an IterableDataset. Pass what "
    "state_dict() returned by a loader over the same dataset."
)
_DIFFERS = (
    "An IterableDataset resumes exactly only with the same dataset and settings; "
    "build the loader with the saved value or start without the state."
)
_OWN_PART = "own_part"  # the fingerprint's rank, where each rank's data is its own
_OWN_PARTS = "own_parts"  # and the number of ranks its data was split by


class _StreamsSource(EngineSource):
    """What the inner DataLoader's workers iterate: their own streams, batched, with records."""

    def __init__(
        self, engine: IterableEngine, starts: list[dict[str, Any]], *, epoch: int, rank: int
    ) -> None:
        super().__init__(engine)
        self.starts = starts
        self.seed, self.epoch, self.rank = engine.host.seed, epoch, rank
        self.tells = engine._tells  # whether the dataset is told the loader's epochs
        self._passes = 0  # a persistent worker's copy counts its passes

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        # A persistent worker's later epochs start fresh (after an ended one: at its saved end).
        start = self.starts[worker]
        later = fresh_record()
        if start["ended"]:
            later |= {"dataset_state": start["dataset_state"], "end_state": start["end_state"]}
        self.starts[worker] = later
        if self._passes and info is not None:
            # Seeded as a worker started for this epoch (worker_init_fn seeded the first pass).
            epoch_seed = derive_seed(self.seed, SeedTag.WORKERS, self.epoch + self._passes)
            seed_global_rngs(worker_seed(epoch_seed, self.rank, worker))
            if self.tells:
                _tell_epoch(self.user_dataset, self.epoch + self._passes)  # its copy, kept
        self._passes += 1
        return worker_batches(self, worker, start, in_process=info is None)


class IterableEngine(WorkerStreams):
    """Epochs, per-worker positions and state of a loader over a plain ``IterableDataset``."""

    begun_fields = ("complete", "records", "_primed")

    one_iterator = False  # see Engine

    def __init__(self, host: Host, dataset: Any, **engine: Any) -> None:
        super().__init__(host, dataset, **engine)
        # Per worker, as of its last batch handed out in the current epoch.
        self.records: list[dict[str, Any]] = [fresh_record() for _ in range(self.workers)]
        self.state_seen = False  # a worker reported an iterator state
        self.reported: int | None = None  # the len() given out, for DataLoader's warning
        # The in-process stream opened before its first batch: (epoch, iterator, record).
        self._primed: tuple[int, Any, dict[str, Any]] | None = None
        self._ran_end = False  # the in-process dataset ran its last complete epoch to the end
        # Whether the loader's epoch was named (set_epoch, a later epoch): its epoch 0, fresh or
        # loaded, keeps the epoch the user gave the dataset (as under DataLoader).
        self._named = False
        # The user's dataset.set_epoch(e) sets the loader's epoch too; one that cannot be
        # hooked (a frozen dataclass) is never told the loader's count, as under DataLoader.
        self._tells = hook_set_epoch(dataset, self, required=False)

    def method(self) -> str:
        """``"state"`` or ``"replay"``: how a resume finds each worker's place."""
        return "state" if is_stateful(self.dataset) or self.state_seen else "replay"

    def length(self) -> int:
        """Batches per epoch from ``len(dataset)``, as ``DataLoader`` counts them."""
        size = len(self.dataset)  # TypeError without __len__, as with DataLoader
        self.reported = size // self.batch_size if self.drop_last else -(-size // self.batch_size)
        return self.reported

    # ----------------------------------------------------------------- epochs
    def check_world(self) -> None:
        _, world_size = self.host.topology()
        if world_size > 1:
            raise LoaderkitError(
                f"ResumableDataLoader: an IterableDataset passed directly runs on one process, "
                f"got world_size={world_size}. Wrap it in StreamingShardedDataset(shards, "
                "IterableReader(fn), steps_per_epoch=...), or, where it splits itself by rank, "
                "pass rank=0, world_size=1 (under a Trainer: use_distributed_sampler=False)."
            )

    def epoch_batches(self, run: Run) -> Generator[Any, None, None]:
        """One epoch's batches; ``run`` is the iteration's place among the loader's."""
        host = self.host
        settle_seed(host, self)
        self.check_world()
        if host.name_epoch(self._position, self):
            return
        kept = self.kept()
        loaded = self._position.loaded(self)
        primed, self._primed = self._primed, None
        epoch, start, began = self._position.begin(self)
        self._tell(epoch)
        host.started = True
        cut_short = loaded is None and not self.complete  # live: the object stopped in place
        records = self.records = self._starts(epoch, loaded)
        self._history.clear()
        if host.pool.num_workers == 0:
            yield from self._in_process(run, epoch, primed if start == 0 else None, cut_short)
            return
        rank, _ = host.topology()
        streams = _StreamsSource(self, [dict(r) for r in records], epoch=epoch, rank=rank)
        # Persistent workers serve a resumed epoch too: their copies go on from the replay.
        inner = self.workers_for(streams, epoch, fresh=False)
        workers = self.start(inner, self._in_flight, kept)
        try:
            guarded = guard_workers(workers, self._in_flight)
            yield from self._hand_out(guarded, records, run, pin=False)
            for extra in guarded:  # only end marks are left (workers resumed ended); not batches
                if extra[0] != END:
                    raise RuntimeError("ResumableDataLoader: a worker sent a batch after its end")
        except BaseException:  # its workers ran ahead of what was handed out
            self._drop_inner(inner, workers)
            if self.steps_done == began and host.current is run:  # not if a later one began
                self.undo(kept)
            raise
        if self._inner is inner:
            self._inner_next = epoch + 1

    def _in_process(
        self, run: Run, epoch: int, primed: tuple[int, Any, dict[str, Any]] | None, cut_short: bool
    ) -> Generator[Any, None, None]:
        """``iterate`` in-process (``primed``: its stream, opened at ``iter()``)."""
        records, opened = self.records, None
        if primed is not None:
            opened, records[0] = primed[1], dict(primed[2])
        streams = _StreamsSource(self, records, epoch=epoch, rank=0)  # world_size is 1
        opens = not records[0]["ended"]
        # There the object is where its carried end state says: that is for a saved state.
        first = {**records[0], "end_state": None} if cut_short else records[0]
        source = worker_batches(streams, 0, first, in_process=True, opened=opened)
        yield from self._hand_out(source, records, run, pin=pin_now(self.host.pool.pin_memory))
        self._ran_end = opens and self.complete

    def _starts(self, epoch: int, loaded: tuple[int, bool] | None) -> list[dict[str, Any]]:
        """Each worker's record to start ``epoch`` from (``loaded``: see PlanCursor.loaded)."""
        if loaded is not None and loaded[0] == epoch and not self.complete:
            return [dict(r) for r in self.records]  # the rest of a loaded epoch
        if loaded is not None and loaded[0] == epoch + 1 and self.complete:
            return [{**r, "ended": True} for r in self.records]  # a loaded epoch's empty rest
        fresh = self._next_records()
        self.complete = False
        return fresh

    def _next_records(self) -> list[dict[str, Any]]:
        """Each worker's record to start a new epoch from."""
        fresh = [fresh_record() for _ in range(self.workers)]
        # Objects that live on start where the complete epoch left them, unless this process's
        # object ran that end: loading it again would put a stream that does not rewind (a
        # Hugging Face IterableDataset) past its last item.
        ran_end = self.host.pool.num_workers == 0 and self._ran_end
        if self.complete and self.objects_live_on and not ran_end:
            for record, saved in zip(fresh, self.records, strict=True):
                record["dataset_state"] = saved["dataset_state"]
                record["end_state"] = saved["end_state"]
        elif not self.complete and self.host.pool.num_workers == 0:
            # An epoch cut short: in-process, an object that is its own iterator goes on where
            # it stopped, as uninterrupted. (Its dataset state is not carried: a dataset that
            # starts over at each iter() unless loaded would go on instead; design.md.)
            for record, saved in zip(fresh, self.records, strict=True):
                record["end_state"] = saved["iterator_state"]
        return fresh

    def _prime(self) -> None:
        """Open the in-process stream now, as ``DataLoader`` does at ``iter()``."""
        epoch = self._position.upcoming(self)[0]
        self._tell(epoch)
        it = open_stream(self.dataset, fresh_record(), 0, in_process=True)
        opened = Recorder(self.dataset, it, fresh_record(), in_process=True).after([])
        self._primed = (epoch, it, {**fresh_record(), **opened})

    def _tell(self, epoch: int) -> None:
        if self._tells and (epoch or self._named):
            _tell_epoch(self.dataset, epoch)
        self._named = self._named or epoch > 0

    def set_epoch(self, epoch: int, *, late: bool = False) -> None:
        self._named = True
        super().set_epoch(epoch, late=late)

    def _set_epoch(self, epoch: int) -> None:
        """The user's ``dataset.set_epoch(epoch)`` (hooked): ``loader.set_epoch(epoch)``, but
        a loaded position's own epoch keeps it (the loop names the epoch it resumes)."""
        loaded = self._position.loaded(self)
        if loaded is None or epoch != loaded[0]:
            loader: Any = self.host.loader
            loader.set_epoch(epoch)

    def _in_flight(self, task: int, worker: int) -> tuple[str, Any]:
        record = self.records[worker] if worker < len(self.records) else fresh_record()
        return (
            f"a batch of worker {worker}'s stream of the IterableDataset (after its "
            f"{record['yielded']} samples handed out)",
            None,
        )

    def _hand_out(
        self, source: Iterator[Any], records: list[dict[str, Any]], run: Any, *, pin: bool
    ) -> Generator[Any, None, None]:
        """Hand out in torch's order (a resumed epoch's may wait up to one round here)."""
        host = self.host
        pending: list[deque[Any]] = [deque() for _ in range(self.workers)]
        flowing = {w for w in range(self.workers) if not records[w]["ended"]}
        while flowing:  # until each worker's end mark (a record may say ended before it)
            turn = min(flowing, key=lambda w: (records[w]["batches"], w))
            while not pending[turn]:
                try:
                    item = next(source)
                except StopIteration:
                    raise RuntimeError(
                        f"ResumableDataLoader: worker {turn}'s stream ended without its end mark"
                    ) from None
                pending[item[1]].append(item)
            kind, worker, after, batch = pending[turn].popleft()
            if kind == END:
                records[worker] = {**records[worker], **(after or {}), "ended": True}
                flowing.discard(worker)
                continue
            assert after is not None
            if pin and type(batch) is not FailedBatch:  # a pin that fails counts no step
                batch = pin_batch(batch)
            self.state_seen = self.state_seen or after["iterator_state"] is not None
            before = records[worker]
            records[worker] = {"ended": False, **after, "batches": before["batches"] + 1}
            if host.current is run:  # only the current iteration moves the position
                self._history.append((worker, before, self.complete))
                self._position.consumed(self._position.position + 1)
                self._check_length()
            yield batch
        if host.current is run:
            self.complete = True

    def _check_length(self) -> None:
        """Warn, as ``DataLoader`` does, once an epoch outgrows the ``len()`` given out."""
        done = self.steps_done
        if self.reported is not None and done > self.reported:
            warnings.warn(
                f"ResumableDataLoader: len() said {self.reported} batches (from len(dataset)), "
                f"but {done} were handed out this epoch. Split the dataset by get_worker_info() "
                "as torch's docs show, or correct its __len__.",
                UserWarning,
                stacklevel=5,  # the caller's next()
            )

    # ------------------------------------------------------------------ state
    @property
    def objects_live_on(self) -> bool:
        """Whether one epoch's dataset objects iterate the next (in-process, persistent workers)."""
        return self.host.pool.num_workers == 0 or self.host.pool.persistent

    def part_entry(self) -> dict[str, int]:
        """The fingerprint entries of a loader reading its rank's own part (see ``own_part``)."""
        part = self.host.own_part()
        return {} if part is None else {_OWN_PART: part[0], _OWN_PARTS: part[1]}

    def check_part(self, saved: dict[str, Any], placed: bool) -> None:
        """Pop the saved fingerprint's part; refuse a state ``placed`` in another rank's part
        or in parts of another number of ranks (an epoch's start fits every part)."""
        rank, size = self.host.own_part() or (0, 1)
        # States from before own_parts was saved: their part's size is unknown.
        saved_size = saved.pop(_OWN_PARTS, size if _OWN_PART in saved else 1)
        saved_rank = saved.pop(_OWN_PART, 0)
        if placed and (saved_rank, saved_size) != (rank, size):
            raise StateMismatchError(
                f"ResumableDataLoader.load_state_dict: the state is rank {saved_rank}'s place "
                f"in its own data, this is rank {rank} (saved under {saved_size} ranks, now "
                f"{size}). Load each rank the state it saved, or let loaderkit split one dataset "
                "(ShardedDataset, StreamingShardedDataset) without use_distributed_sampler=False "
                "or world_size=1."
            )

    def describe(self) -> dict[str, Any]:
        name, method = type(self.dataset).__name__, self.method()
        if method == "state":
            owner = name if is_stateful(self.dataset) else f"iter({name})"
            reason = (
                f"{owner} has state_dict()/load_state_dict(): each worker's state as of its "
                "last batch handed out is saved and loaded (O(1) in the position); exact "
                "under the same num_workers, on one process"
            )
        else:
            reason = (
                f"replay-and-skip: {name} has no state_dict()/load_state_dict(), so each "
                "worker replays its stream up to its position; exact for a deterministic "
                "stream, under the same num_workers, on one process. Give the dataset "
                "state_dict()/load_state_dict() to resume in O(1)"
            )
        return {"engine": "iterable", "resume": method, "resume_reason": reason}

    def identity(self) -> dict[str, Any]:
        dataset = type(self.dataset)
        out: dict[str, Any] = {"dataset": f"{dataset.__module__}.{dataset.__qualname__}"}
        shards = getattr(self.dataset, "num_shards", None)  # its state is per shard (datasets)
        if isinstance(shards, int) and not isinstance(shards, bool):
            out["num_shards"] = shards
        return out

    def state(self) -> dict[str, Any]:
        records, complete = list(self.records), self.complete
        epoch, _, steps_done = self._position.saved(self)
        held = 0
        if (epoch, steps_done) != (self.epoch, self.steps_done):  # set_epoch()
            records, complete = self._next_records(), False  # that epoch's start
        else:  # batches the consumer holds untrained are not consumed
            back = self.taken_back()
            for worker, before, was_complete in back:
                records[worker], complete = before, was_complete
            held = len(back)
            steps_done -= held
        host = self.host
        if held == 0 and host.pool.num_workers == 0 and self._position.loaded(self) is None:
            if self._primed is None and host.awaiting_first_batch():
                self._prime()
            if self._primed is not None:  # iter() was called: the state is the stream's start
                epoch, records, complete, steps_done = self._primed[0], [self._primed[2]], False, 0
        return self.sealed(
            "iterable",
            ITERABLE_FIELDS,
            host.topology()[1],
            epoch=epoch,
            steps_done=steps_done,
            complete=complete,
            iterable={**self.fingerprint(), "resume": self.method(), **self.part_entry()},
            workers=[{k: r[k] for k in RECORD} for r in records],
        )

    def load(self, state: Any, *, adopt_seed: bool) -> int | None:
        """Resume at ``state``; returns the saved seed when it is adopted."""
        self.open_state(state, "iterable", ITERABLE_FIELDS, "an IterableDataset", _MISSING)
        owner = "ResumableDataLoader.load_state_dict"
        saved = {k: v for k, v in state["iterable"].items() if k != "resume"}
        # A dataset's own state, where loaded, is opaque (a replay has its digest).
        carried = state["complete"] is not True or self.objects_live_on
        kept = state["workers"] if carried and isinstance(state["workers"], list) else []
        own = ("dataset_state", "iterator_state", "end_state", "yielded", "failed")
        self.check_part(saved, any(isinstance(r, dict) and r.get(k) for r in kept for k in own))
        adopted = check_settings(
            saved, self.fingerprint(), owner=OWNER, adopt_seed=adopt_seed, fix=_DIFFERS
        )
        topo = state["topology"]
        workers = self.host.pool.num_workers
        if topo.get("num_workers") != workers:
            raise StateMismatchError(
                f"{owner}: the IterableDataset was saved with num_workers="
                f"{topo.get('num_workers')}, this loader has num_workers={workers}; resume with "
                f"num_workers={topo.get('num_workers')}, or use ShardedDataset (any num_workers)."
            )
        records = state["workers"]
        if not isinstance(records, list) or len(records) != max(workers, 1):
            held = len(records) if isinstance(records, list) else repr(records)
            raise StateMismatchError(
                f"{owner}: field 'workers' holds {held} records for num_workers={workers}; pass "
                "what state_dict() returned, unmodified."
            )
        # "rng", "failed" and "end_state" are absent from states saved before they were kept;
        # copied, as a dataset may keep (and move on) what its load_state_dict is given.
        self.records = copy.deepcopy(
            [
                {k: r.get(k) if k in ("rng", "failed", "end_state") else r[k] for k in RECORD}
                for r in records
            ]
        )
        self._primed, self._ran_end = None, False
        return self.resume(state, adopted)


def _tell_epoch(dataset: Any, epoch: int) -> None:
    """``dataset.set_epoch(epoch)`` (one the engine hooked), as accelerate's loaders call it: a
    ``datasets.IterableDataset`` reshuffles by it, and applies a loaded state to the saved
    epoch only (else again at every later one)."""
    set_epoch = dataset.set_epoch
    getattr(set_epoch, "_loaderkit_unhooked", set_epoch)(epoch)  # not back to the loader
