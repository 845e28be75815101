"""Which shards a process reads next (private): the schedule the loader noted on a
:class:`Board` whose batches it is reading, found by a batch's first sample."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import get_worker_info

Key = tuple[int, int, int, int]  # (epoch, start, rank, world_size) of a schedule


class Board:
    """The schedules the loader last started on this dataset's plans (sent to workers)."""

    def __init__(self) -> None:
        self.plan: Any = None
        self.recent: list[Key] = []

    def note(self, plan: Any, epoch: int, start: int, rank: int, world_size: int) -> None:
        if plan is not self.plan:
            self.plan, self.recent = plan, []
        entry = (epoch, start, rank, world_size)
        self.recent = [entry, *(e for e in self.recent if e != entry)][:4]


class WatchedPlan:
    """A plan that notes each schedule it starts on a :class:`Board`; otherwise the plan."""

    def __init__(self, plan: Any, board: Board) -> None:
        self.inner, self.board = plan, board

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("inner", "board"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return repr(self.inner)

    def schedule(self, epoch: int, *, start: int, rank: int, world_size: int) -> Any:
        self.board.note(self.inner, epoch, start, rank, world_size)
        return self.inner.schedule(epoch, start=start, rank=rank, world_size=world_size)


def indices(sched: Any, step: int) -> np.ndarray:
    """The sample indices of ``sched``'s batch ``step``, flat."""
    return np.asarray(sched.indices(step), dtype=np.int64).reshape(-1)


def shard_of(ends: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The shard of each sample index (``ends``: each shard's end in the sample order)."""
    return np.searchsorted(ends, idx % int(ends[-1]), side="right")


def shard_start(ends: np.ndarray, shard: int) -> int:
    """The first sample of ``shard`` in the sample order."""
    return int(ends[shard - 1]) if shard else 0


@dataclass(eq=False)
class Prediction:
    """One process's batches of one schedule: which shards each reads, first and last."""

    key: Key
    firsts: list[int]  # each batch's first sample index
    first_step: np.ndarray
    last_step: np.ndarray
    sched: Any
    steps: Sequence[int]  # this process's schedule steps, in order
    reads: np.ndarray  # samples of each shard this process reads
    workers: int
    next: int = 0  # the batch expected next

    def __post_init__(self) -> None:
        # The window changes only at a batch where some shard is first or no longer read.
        self.changes = {*self.first_step.tolist(), *(self.last_step + 1).tolist()}
        self._last: tuple[int, tuple[list[int], list[int]]] | None = None

    def find(self, first: int, reach: int = 8) -> int | None:
        """Where a batch starting at ``first`` is among the next ``reach`` expected ones."""
        ahead = range(self.next, min(self.next + reach, len(self.firsts)))
        return next((j for j in ahead if self.firsts[j] == first), None)

    def window(self, step: int, prefetch: int) -> tuple[list[int], list[int]]:
        """The shards in use at batch ``step``, and the next ``prefetch`` first read after it."""
        if self._last is None or self._last[0] != step - 1 or step in self.changes:
            in_use = np.flatnonzero((self.first_step <= step) & (self.last_step >= step))
            later = np.flatnonzero((self.first_step > step) & (self.last_step >= 0))
            later = later[np.argsort(self.first_step[later], kind="stable")][:prefetch]
            self._last = (step, (in_use.tolist(), later.tolist()))
        else:
            self._last = (step, self._last[1])
        return self._last[1]


_CHUNK = 256  # steps whose reads are counted together


def predict(plan: Any, key: Key, ends: np.ndarray) -> Prediction:
    """This process's share of schedule ``key`` of ``plan`` (shard ``i`` ends at ``ends[i]``)."""
    epoch, start, rank, world_size = key
    sched = plan.schedule(epoch, start=start, rank=rank, world_size=world_size)
    info = get_worker_info()
    worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
    n = len(ends)
    first_step = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last_step = np.full(n, -1, dtype=np.int64)
    reads = np.zeros(n, dtype=np.int64)
    firsts: list[int] = []
    steps = range(worker, sched.num_steps, workers)
    ofs: list[np.ndarray] = []  # shard of each read, by steps of a chunk
    for j, step in enumerate(steps):
        idx = indices(sched, step)
        firsts.append(int(idx[0]) if idx.size else -1)
        ofs.append(shard_of(ends, idx))
        if len(ofs) == _CHUNK or j == len(steps) - 1:  # counted per chunk, not per step:
            # a per-step bincount over every shard cost O(steps x shards)
            of = np.concatenate(ofs)
            at = np.repeat(np.arange(j + 1 - len(ofs), j + 1), [len(o) for o in ofs])
            reads += np.bincount(of, minlength=n)
            shards, first = np.unique(of, return_index=True)  # `at` ascends: the earliest
            first_step[shards] = np.minimum(first_step[shards], at[first])
            shards, last = np.unique(of[::-1], return_index=True)
            last_step[shards] = at[::-1][last]
            ofs = []
    return Prediction(key, firsts, first_step, last_step, sched, steps, reads, workers)


_KEPT = 4  # predictions a Follower keeps: this epoch's, the next, and ones tried beside


class Follower:
    """This process's place in the schedules on ``board``: the batch it reads now."""

    def __init__(self, board: Board) -> None:
        self.board = board
        self.predictions: dict[Key, Prediction] = {}
        self.current: Prediction | None = None
        self.last: Prediction | None = None  # the last matched, kept across unplanned reads
        self._plan: Any = None  # the plan of ``predictions``

    def locate(self, first: int, ends: np.ndarray) -> tuple[Prediction, int] | None:
        """The prediction and step of the batch with first index ``first``; None if none."""
        if self.board.plan is not self._plan:  # a new plan (a new sampler): new schedules
            self._plan, self.predictions, self.current = self.board.plan, {}, None
        pred = self.current
        step = None if pred is None else pred.find(first)
        if pred is None or step is None:
            pred = self.current = self._anchor(first, ends)
            if pred is None:
                return None
            step = 0
        pred.next = step + 1
        return pred, step

    def _anchor(self, first: int, ends: np.ndarray) -> Prediction | None:
        """The prediction of a started schedule (or next epoch) whose first batch is ``first``."""
        plan = self.board.plan
        if plan is None:
            return None
        candidates = list(self.board.recent)
        for pred in (self.current, self.last):
            if pred is not None:
                epoch, _, rank, world = pred.key
                following = (epoch + 1, 0, rank, world)
                if pred is self.current and pred.next >= len(pred.firsts):
                    candidates.insert(0, following)  # read to its end: the next epoch first
                else:
                    candidates.append(following)
        for key in candidates:
            if key not in self.predictions:
                self.predictions[key] = predict(plan, key, ends)
                if len(self.predictions) > _KEPT:  # an epoch's is as big as its steps: drop old
                    del self.predictions[next(iter(self.predictions))]
            pred = self.predictions[key]
            if pred.firsts and pred.firsts[0] == first:
                self.last = pred
                return pred
        return None
