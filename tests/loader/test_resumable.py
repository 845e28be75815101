"""ResumableDataLoader: exact resume, worker-count invariance, elastic resume, errors.

The resume oracle (docs/design.md): the first k batches of a run plus the batches
of a fresh loader resumed at k equal the uninterrupted run, over two epochs,
with k inside epoch 0, at the boundary and inside epoch 1, and num_workers in
{0, 2}. The data carries a random augmentation drawn from the global torch,
numpy and ``random`` RNGs, so "equal" means bit-identical tensors, not just the
same sample ids.
"""

from __future__ import annotations

import copy
import functools
import gc
import multiprocessing
import pickle
import random
import time
import traceback
import weakref
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, SequentialSampler

from loaderkit import (
    BucketBatchSampler,
    PlanBatchSampler,
    ResumableDataLoader,
    SamplePlan,
    StateMismatchError,
    TensorDataset,
    WorkerError,
)
from loaderkit.plan._cursor import seal

N, B = 22, 4  # 6 batches per epoch, the last one of 2 samples
STEPS = 6


class AugDataset(Dataset[torch.Tensor]):
    """Sample i: ``[i, torch draw, numpy draw, random draw]``, like a random augmentation."""

    def __init__(self, size: int = N) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(
            [index, torch.rand(()).item(), np.random.random_sample(), random.random()],
            dtype=torch.float64,
        )


def ids(batches: list[Any]) -> list[int]:
    return [int(i) for b in batches for i in b[:, 0]]


def make(num_workers: int = 0, **kwargs: Any) -> ResumableDataLoader:
    settings: dict[str, Any] = {"batch_size": B, "shuffle": True, "seed": 11}
    settings.update(kwargs)
    dataset = settings.pop("dataset") if "dataset" in settings else AugDataset()
    return ResumableDataLoader(dataset, num_workers=num_workers, **settings)


def assert_same_batches(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want), f"{len(got)} batches, expected {len(want)}"
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"batch {step} differs:\n{g}\nexpected\n{w}"


@functools.cache
def uninterrupted(num_workers: int) -> tuple[torch.Tensor, ...]:
    loader = make(num_workers)
    return tuple(b for _ in range(2) for b in loader)


def interrupt(loader: ResumableDataLoader, k: int) -> tuple[list[torch.Tensor], dict[str, Any]]:
    """The first k batches of a two-epoch run (plain loop), and the state after them."""
    before: list[torch.Tensor] = []
    for _ in range(2):
        for batch in loader:
            before.append(batch)
            if len(before) == k:
                return before, loader.state_dict()
    raise AssertionError(f"k={k} is past the end of two epochs")


def resume(
    loader: ResumableDataLoader, state: dict[str, Any], lightning: bool, epochs: int = 2
) -> list[torch.Tensor]:
    """The rest of a two-epoch run from ``state``.

    ``lightning``: iterate in Lightning's order (``iter()``, then ``set_epoch``,
    then ``next()``), with the epoch the fit loop would be in; else a plain
    ``for`` loop per epoch, without ``set_epoch``.
    """
    loader.load_state_dict(state)
    assert loader.state_dict()["position"] == state["position"]
    first = state["epoch"] + (state["position"] == loader.plan.epoch_length(state["epoch"]))
    after: list[torch.Tensor] = []
    for epoch in range(first, epochs):
        it = iter(loader)
        if lightning:
            loader.set_epoch(epoch)
        after += list(it)
    return after


ORACLE_CASES = [
    pytest.param(k, before, after, lightning, id=f"k{k}-nw{before}to{after}-{style}")
    for k in (3, STEPS, STEPS + 3)
    for before, after, lightning, style in [
        (0, 0, False, "plain"),
        (0, 0, True, "lightning"),
        (2, 2, False, "plain"),
        (2, 2, True, "lightning"),
        (0, 2, False, "plain"),
        (2, 0, True, "lightning"),
    ]
]


@pytest.mark.parametrize(("k", "nw_before", "nw_after", "lightning"), ORACLE_CASES)
def test_resume_oracle(k: int, nw_before: int, nw_after: int, lightning: bool) -> None:
    full = list(uninterrupted(nw_before))
    assert len(full) == 2 * STEPS
    before, state = interrupt(make(nw_before), k)
    assert state["epoch"] == (k - 1) // STEPS
    assert state["steps_done"] == (k - 1) % STEPS + 1
    resumed = make(nw_after)
    after = resume(resumed, state, lightning)
    assert_same_batches(before + after, full)
    # Past the resumed epoch the state counts on as if never interrupted.
    assert resumed.state_dict() == seal(
        make(nw_after).state_dict() | {"epoch": 1, "position": N, "steps_done": STEPS}
    )


@pytest.mark.filterwarnings("ignore:ResumableDataLoader. num_workers=4 is more than")
def test_identical_batches_for_any_num_workers() -> None:
    reference = list(uninterrupted(0))
    assert len(set(ids(reference[:STEPS]))) == N
    assert ids(reference[:STEPS]) != ids(reference[STEPS:])  # reshuffled per epoch
    for num_workers, extra in [(1, {}), (2, {}), (4, {}), (2, {"persistent_workers": True})]:
        loader = make(num_workers, **extra)
        got = [b for _ in range(2) for b in loader]
        assert_same_batches(got, reference)


def test_persistent_workers_abandoned_mid_epoch_then_resumed() -> None:
    full = list(uninterrupted(0))
    loader = make(2, persistent_workers=True)
    it = iter(loader)
    next(it), next(it)
    # The workers' prefetched batches of the abandoned epoch must not leak into the next.
    assert_same_batches(list(loader), full[STEPS:])
    before, state = interrupt(make(2, persistent_workers=True), 3)
    after = resume(make(2, persistent_workers=True), state, lightning=True)
    assert_same_batches(before + after, full)


def test_per_sample_seeding_is_what_makes_augmentation_reproducible() -> None:
    seeded = list(uninterrupted(0))
    loader = make(0, per_sample_seeding=False)
    unseeded = [b for _ in range(2) for b in loader]
    assert ids(unseeded) == ids(seeded)  # the same order ...
    assert not torch.equal(torch.cat(unseeded), torch.cat(seeded))  # ... other random draws


def test_iter_without_set_epoch_advances_epochs() -> None:
    loader = make()
    plan = SamplePlan(num_samples=N, batch_size=B, shuffle=True, seed=11)
    for epoch in range(3):
        assert ids(list(loader)) == plan.order(epoch).tolist()
        assert loader.state_dict()["epoch"] == epoch


def test_set_epoch_between_iter_and_first_next_retargets_the_epoch() -> None:
    plan = SamplePlan(num_samples=N, batch_size=B, shuffle=True, seed=11)
    loader = make()
    it = iter(loader)  # Lightning's order: the iterator exists before set_epoch
    loader.set_epoch(3)
    assert ids(list(it)) == plan.order(3).tolist()
    assert loader.state_dict()["epoch"] == 3
    assert ids(list(loader)) == plan.order(4).tolist()  # and the next iter() follows on
    loader.set_epoch(1)  # before iter() as well
    assert ids(list(loader)) == plan.order(1).tolist()


def test_set_epoch_in_lightning_order_matches_a_plain_loop() -> None:
    loader = make()
    lightning: list[torch.Tensor] = []
    for epoch in range(2):
        it = iter(loader)
        loader.set_epoch(epoch)
        lightning += list(it)
    assert_same_batches(lightning, list(uninterrupted(0)))


def test_len_before_and_after_resume() -> None:
    loader = make()
    assert len(loader) == STEPS
    it = iter(loader)
    next(it), next(it)
    assert len(loader) == STEPS
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert len(resumed) == STEPS  # 2 steps done + 4 remaining
    it = iter(resumed)
    next(it)
    assert len(resumed) == STEPS
    assert len(list(it)) == 3


def test_len_after_a_world_size_change_covers_the_resumed_and_the_whole_epochs() -> None:
    rank0 = make(rank=0, world_size=2)
    assert len(rank0) == 3  # 22 = 2 * 8 + 6: two full global steps and a split tail
    next(iter(rank0))
    state = rank0.state_dict()
    assert (state["position"], state["steps_done"]) == (8, 1)
    single = make(rank=0, world_size=1)
    single.load_state_dict(state)
    # max(1 done + ceil(14 / 4) remaining, a whole epoch under one rank): Lightning
    # reads the length once per fit and applies it to later epochs too.
    assert STEPS == 6 and len(single) == max(1 + 4, STEPS)
    it = iter(single)
    assert len(single) == STEPS
    next(it)
    assert len(single) == STEPS  # during the resumed epoch
    assert len(list(it)) == 3
    it = iter(single)
    assert len(single) == STEPS  # the next epoch, whole, under one rank
    assert len(list(it)) == STEPS


def _lockstep(loaders: list[ResumableDataLoader], steps: int) -> list[int]:
    """Advance every rank's loader ``steps`` batches; the states must agree."""
    its = [iter(loader) for loader in loaders]
    seen = [i for _ in range(steps) for it in its for i in ids([next(it)])]
    states = [loader.state_dict() for loader in loaders]
    assert all(s == states[0] for s in states), "state_dict differs across ranks"
    return seen


def test_elastic_resume_two_ranks_to_one() -> None:
    n = 40  # 5 global steps of 2 x 4 under two ranks
    ranks = [make(dataset=AugDataset(n), rank=r, world_size=2) for r in (0, 1)]
    seen = _lockstep(ranks, 2)
    state = ranks[0].state_dict()
    assert state["position"] == 16
    assert state["topology"] == {"world_size": 2, "num_workers": 0}
    single = make(2, dataset=AugDataset(n), rank=0, world_size=1)  # and more workers
    single.load_state_dict(state)
    rest = ids(list(single))
    assert len(rest) == 24
    assert Counter(seen + rest) == Counter(range(n))
    assert single.state_dict()["position"] == n


def test_elastic_resume_one_rank_to_three() -> None:
    n = 40
    single = make(dataset=AugDataset(n), rank=0, world_size=1)
    seen = _lockstep([single], 1)
    state = single.state_dict()
    ranks = [make(dataset=AugDataset(n), rank=r, world_size=3) for r in range(3)]
    for loader in ranks:
        loader.load_state_dict(state)
        assert len(loader) == 1 + 3  # 36 remaining = 3 global steps of 3 x 4
    rest = _lockstep(ranks, 3)
    assert Counter(seen + rest) == Counter(range(n))
    assert all(loader.state_dict()["position"] == n for loader in ranks)
    assert [len(list(loader)) for loader in ranks] == [4, 4, 4]  # next epoch: 40 -> 12+12+12+4


def test_state_dict_is_rank_symmetric() -> None:
    ranks = [make(rank=r, world_size=2) for r in (0, 1)]
    _lockstep(ranks, 2)
    state = ranks[0].state_dict()
    assert set(state) == {
        "version",
        "epoch",
        "position",
        "steps_done",
        "plan",
        "topology",
        "checksum",
    }
    assert "rank" not in state["topology"]


def test_drop_last() -> None:
    loader = make(drop_last=True)
    assert len(loader) == 5
    batches = list(loader)
    assert [len(b) for b in batches] == [B] * 5
    order = SamplePlan(num_samples=N, batch_size=B, shuffle=True, seed=11).order(0).tolist()
    assert ids(batches) == order[:20]  # the 2 dropped samples are the order's tail
    assert loader.state_dict()["position"] == N
    # Across ranks: a global step is 2 x 4, so 22 samples give 2 steps and drop 6.
    two = [make(drop_last=True, rank=r, world_size=2) for r in (0, 1)]
    assert [len(x) for x in two] == [2, 2]
    assert sorted(ids(list(two[0])) + ids(list(two[1]))) == sorted(order[:16])
    # Without drop_last the last batch is short.
    assert [len(b) for b in make(drop_last=False)] == [B] * 5 + [2]


def test_drop_last_resume_into_a_dropped_tail_ends_the_epoch() -> None:
    loader = make(drop_last=True)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    assert state["position"] == 16
    two = make(drop_last=True, rank=0, world_size=2)  # 6 left < one global step of 8
    two.load_state_dict(state)
    assert list(two) == []
    assert two.state_dict()["position"] == N
    assert len(list(two)) == 2  # then a whole next epoch
    assert two.state_dict()["epoch"] == 1


def test_drop_last_with_too_little_data_says_so() -> None:
    loader = make(dataset=AugDataset(3), drop_last=True)
    with pytest.raises(ValueError, match=r"no batch.*batch_size=\d+ and drop_last=True.*lower"):
        next(iter(loader))


# -------------------------------------------------------------- fetch paths
class _Rows(Dataset[torch.Tensor]):
    def __init__(self, n: int = N) -> None:
        self.data = torch.arange(n * 3, dtype=torch.float32).view(n, 3)
        self.calls: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        self.calls["__getitem__"] += 1
        return self.data[index]


class _BatchSpy(_Rows):
    def get_batch(self, indices: Any) -> torch.Tensor:
        self.calls["get_batch"] += 1
        return self.data.index_select(0, torch.as_tensor(indices, dtype=torch.long))


class _ItemsSpy(_Rows):
    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        self.calls["__getitems__"] += 1
        assert all(type(i) is int for i in indices)
        return [self.data[i] for i in indices]


@pytest.mark.parametrize(
    ("spy", "method", "seeding", "calls"),
    [
        # A user's get_batch is used where samples are not seeded, and under "auto" too
        # (never bypassed), checked for draws as __getitems__ is.
        (_BatchSpy, "get_batch", False, 2 * STEPS),
        (_BatchSpy, "get_batch", "auto", 2 * STEPS),
        (_ItemsSpy, "__getitems__", False, 2 * STEPS),
        # Seeded per sample, but the read draws no randomness: still a whole batch per
        # call, as torch reads it (one index per call is only for reads that draw).
        (_ItemsSpy, "__getitems__", "auto", 2 * STEPS),
    ],
)
def test_batched_fetch_paths_are_used_and_match_per_sample(
    spy: type, method: str, seeding: Any, calls: int
) -> None:
    reference = [b for _ in range(2) for b in make(dataset=_Rows())]
    dataset = spy()
    got = [b for _ in range(2) for b in make(dataset=dataset, per_sample_seeding=seeding)]
    assert_same_batches(got, reference)
    assert dataset.calls == Counter({method: calls})


class _DrawingBatch(_BatchSpy):
    def get_batch(self, indices: Any) -> torch.Tensor:
        return super().get_batch(indices) + np.random.rand()  # a batch-level augmentation


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_user_get_batch_that_draws_runs_seeded_per_batch(num_workers: int) -> None:
    # Was: read per sample through __getitem__, its augmentation silently left out.
    def epochs(nw: int) -> list[torch.Tensor]:
        loader = make(dataset=_DrawingBatch(), num_workers=nw)
        return [torch.cat(list(loader)) for _ in range(2)]

    first, second = epochs(num_workers)
    plain = torch.cat(list(make(dataset=_Rows(), per_sample_seeding=False)))
    assert not torch.equal(first, plain) and not torch.equal(first, second)
    assert all(map(torch.equal, epochs(0), [first, second]))  # any num_workers


class _IndexTypeSpy(_BatchSpy):
    def get_batch(self, indices: Any) -> torch.Tensor:
        assert type(indices) is np.ndarray and indices.dtype == np.int64 and indices.ndim == 1
        return super().get_batch(indices)


class _SortsInPlace(_IndexTypeSpy):
    def get_batch(self, indices: Any) -> torch.Tensor:
        rows = super().get_batch(indices)
        indices.sort()  # numpy's in-place idiom (before an h5py read, say)
        return rows


class _UserSchedule:
    """A user's schedule whose ``indices`` returns ``kind`` (a list, numpy, int32)."""

    def __init__(self, inner: Any, kind: str) -> None:
        self.inner, self.kind = inner, kind
        self.epoch, self.start, self.num_steps = inner.epoch, inner.start, inner.num_steps

    def position_after(self, step: int) -> int:
        return int(self.inner.position_after(step))

    def indices(self, step: int) -> Any:
        got = self.inner.indices(step)
        return {"list": got.tolist(), "numpy": got.numpy(), "int32": got.int()}[self.kind]


class _UserPlan:
    def __init__(self, kind: str) -> None:
        self.plan, self.kind = SamplePlan(num_samples=N, batch_size=B, shuffle=True, seed=3), kind

    def __getattr__(self, name: str) -> Any:
        return getattr(self.plan, name)

    def schedule(self, *args: Any, **kwargs: Any) -> _UserSchedule:
        return _UserSchedule(self.plan.schedule(*args, **kwargs), self.kind)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("spy", [_IndexTypeSpy, _SortsInPlace])
def test_a_get_batch_is_handed_its_own_int64_numpy_indices(workers: int, spy: type) -> None:
    # Review of 806c548: handed a view of a bucket plan's cached epoch order, a get_batch
    # that sorted it in place changed the order a resume replays (num_workers=0 only).
    lengths = [int(v) for v in np.random.default_rng(0).integers(1, 50, N)]

    def loader(dataset: Any) -> ResumableDataLoader:
        sampler = BucketBatchSampler(lengths, batch_size=B, seed=1)
        return ResumableDataLoader(
            dataset, batch_sampler=sampler, num_workers=workers, per_sample_seeding=False
        )

    want = list(loader(_Rows()))
    dl = loader(spy())
    it = iter(dl)
    head = [next(it) for _ in range(2)]
    state = dl.state_dict()
    assert_same_batches(head + list(it), want)
    dl.load_state_dict(state)  # the same loader: its plan's cached epoch replayed
    assert_same_batches(head + list(dl), want)
    got = list(make(workers, dataset=spy(), per_sample_seeding=False))
    assert_same_batches(got, list(make(dataset=_Rows())))


@pytest.mark.parametrize("kind", ["list", "numpy", "int32"])
def test_a_user_schedules_indices_of_another_type_reach_get_batch_as_int64(kind: str) -> None:
    sampler = PlanBatchSampler(_UserPlan(kind), rank=0, world_size=1)
    got = list(
        ResumableDataLoader(_IndexTypeSpy(), batch_sampler=sampler, per_sample_seeding=False)
    )
    sampler = PlanBatchSampler(_UserPlan("list"), rank=0, world_size=1)
    assert_same_batches(got, list(ResumableDataLoader(_Rows(), batch_sampler=sampler)))


def test_loaderkit_tensor_dataset_matches_torch_tensor_dataset() -> None:
    x = torch.randn(N, 5, generator=torch.Generator().manual_seed(0))
    y = torch.arange(N)
    fast = [b for _ in range(2) for b in make(dataset=TensorDataset(x, y))]
    slow = [b for _ in range(2) for b in make(dataset=torch.utils.data.TensorDataset(x, y))]
    assert len(fast) == len(slow) == 2 * STEPS
    for f, s in zip(fast, slow, strict=True):
        assert len(f) == len(s) == 2
        assert torch.equal(f[0], s[0]) and torch.equal(f[1], s[1])


def _new_workers(existing: set[int], wait: float = 2.0) -> list[multiprocessing.Process]:
    """Worker processes not in ``existing``, after waiting up to ``wait`` s for them to exit."""
    deadline = time.monotonic() + wait
    while True:
        workers = [p for p in multiprocessing.active_children() if p.pid not in existing]
        if not workers or time.monotonic() > deadline:
            return workers
        time.sleep(0.05)


def test_dropping_a_mid_epoch_loader_stops_its_workers_at_once() -> None:
    # Regression: with a loader <-> iterator reference cycle, torch's worker
    # iterator was freed by the cycle collector, whose shutdown loses its stop
    # sentinel and waits 5 s per worker in join(), at some later allocation.
    existing = {p.pid for p in multiprocessing.active_children()}
    gc.disable()  # only reference counting may free it
    try:
        loader = make(2)
        it = iter(loader)
        next(it)
        it_ref = weakref.ref(it)
        del it, loader
        workers = _new_workers(existing)
    finally:
        still_there = it_ref()
        if still_there is not None:  # do not leave live workers to later tests
            for _ in still_there:
                pass
            del still_there
        gc.enable()
    assert workers == [], f"{len(workers)} workers of the dropped loader still running after 2 s"


def test_a_new_iterator_supersedes_a_persistent_one() -> None:
    # persistent_workers: one set of workers, which torch also resets for each iter().
    loader = make(2, persistent_workers=True)
    old = iter(loader)
    next(old)
    new = iter(loader)
    with pytest.raises(RuntimeError, match=r"superseded by a newer iter\(\).*persistent_workers"):
        next(old)
    assert len(list(new)) == STEPS


def test_a_second_iterator_leaves_the_first_running() -> None:
    # Without persistent workers, iterators are independent, as DataLoader's are.
    loader = make(2)
    old = iter(loader)
    first = next(old)
    new = iter(loader)
    assert len(list(new)) == STEPS  # the next epoch, in its own workers
    rest = list(old)
    assert sorted(ids([first, *rest])) == list(range(N))  # epoch 0 goes on, whole


# ---------------------------------------------------------------- failures
def _explode(index: int) -> None:
    raise ValueError(f"corrupt record {index}")


class _Failing(Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        if index == 7:
            _explode(index)
        return index


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failing_sample_names_its_index_and_keeps_the_original_traceback(
    num_workers: int,
) -> None:
    loader = make(num_workers, dataset=_Failing(), shuffle=False)
    with pytest.raises(WorkerError, match=r"sample index 7\b") as info:
        list(loader)
    message = str(info.value)
    assert "ValueError: corrupt record 7" in message
    if num_workers == 0:
        assert isinstance(info.value.__cause__, ValueError)
        assert info.value.index == 7
    else:
        # Across the process boundary the traceback travels as text.
        assert "Original Traceback" in message
        assert "in _explode" in message
    # torch's reraise() leaves the exception in a cycle with its traceback, whose
    # frames hold the worker iterator: clear them so it shuts down now.
    traceback.clear_frames(info.value.__traceback__)


def test_a_worker_error_stops_the_workers_at_once() -> None:
    existing = {p.pid for p in multiprocessing.active_children()}
    gc.disable()  # only what the loader does, not the cycle collector
    try:
        with pytest.raises(WorkerError) as info:
            list(make(2, dataset=_Failing(), shuffle=False))
        workers = _new_workers(existing)  # the caller still holds the exception
    finally:
        traceback.clear_frames(info.value.__traceback__)  # frees them by refcount now
        gc.enable()
    assert workers == [], f"{len(workers)} workers still running 2 s after the error"


def test_worker_error_from_a_worker_process_keeps_its_index() -> None:
    with pytest.raises(WorkerError) as info:
        list(make(2, dataset=_Failing(), shuffle=False))
    index = info.value.index
    traceback.clear_frames(info.value.__traceback__)
    assert index == 7


class _FailingBatch(_BatchSpy):
    def get_batch(self, indices: Any) -> torch.Tensor:
        raise KeyError("no such rows")


def test_a_failing_get_batch_names_its_indices_as_plain_ints() -> None:
    with pytest.raises(WorkerError, match=r"indices \[0, 1, 2, 3\]") as info:
        list(make(dataset=_FailingBatch(), shuffle=False, per_sample_seeding=False))
    assert info.value.index == [0, 1, 2, 3]


def test_the_default_collate_failing_points_at_the_samples() -> None:
    # Hunter 313: it said "fix collate_fn" to a user who passed none (a sample was None).
    class Holes(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int) -> Any:
            return None if i == 2 else torch.tensor(i)

    fix = r"fix what the dataset returns for them, or pass a collate_fn\."
    with pytest.raises(WorkerError, match=fix):
        list(ResumableDataLoader(Holes(), batch_size=4))
    # Hunter 379: samples of other sizes are told of PadCollate.
    with pytest.raises(WorkerError, match=r"or pass collate_fn=loaderkit.PadCollate\(\) for"):
        list(ResumableDataLoader([torch.ones(n) for n in (1, 2)], batch_size=2))
    with pytest.raises(WorkerError, match=r"; fix collate_fn\."):
        list(ResumableDataLoader(Holes(), batch_size=4, collate_fn=torch.stack))


# ------------------------------------------------------------------- state
def test_state_mismatch_names_the_field_and_both_values() -> None:
    state = make().state_dict()
    cases = [
        (make(dataset=AugDataset(N + 1)), r"'num_samples' differs.*num_samples=22.*num_samples=23"),
        (make(seed=12), r"'seed' differs.*seed=11.*seed=12"),
        (make(batch_size=5), r"'batch_size' differs.*batch_size=4.*batch_size=5"),
        (make(shuffle=False), r"'shuffle' differs.*shuffle=True.*shuffle=False"),
        (make(drop_last=True), r"'drop_last' differs.*drop_last=False.*drop_last=True"),
    ]
    for loader, match in cases:
        with pytest.raises(StateMismatchError, match=match):
            loader.load_state_dict(state)


def test_malformed_states_are_refused() -> None:
    loader = make()
    good = make().state_dict()
    with pytest.raises(TypeError, match=r"state_dict must be a dict, got list"):
        loader.load_state_dict([("epoch", 0)])  # type: ignore[arg-type]
    missing = {k: v for k, v in good.items() if k != "position"}
    with pytest.raises(StateMismatchError, match=r"missing keys \['position'\], unknown keys \[\]"):
        loader.load_state_dict(missing)
    with pytest.raises(StateMismatchError, match=r"unknown keys \['rank'\]"):
        loader.load_state_dict(good | {"rank": 0})
    with pytest.raises(StateMismatchError, match=r"'version' is 6.*upgrade loaderkit"):
        loader.load_state_dict(good | {"version": 6})
    with pytest.raises(
        StateMismatchError,
        match=r"'version' is 1: .*older loaderkit.*reads "
        r"version 5; resume with the loaderkit version that saved it",
    ):
        loader.load_state_dict(good | {"version": 1})
    with pytest.raises(
        StateMismatchError,
        match=r"'version' is 2: .*older loaderkit \(state version 2, whose per-sample "
        r"augmentation seeds were derived differently \(32-bit\)\), this loaderkit reads version 5",
    ):
        loader.load_state_dict(good | {"version": 2})
    with pytest.raises(
        StateMismatchError,
        match=r"'version' is 3: .*older loaderkit \(state version 3, whose shuffled sample "
        r"order was a torch.randperm, not today's keyed permutation\), this loaderkit reads "
        r"version 5",
    ):
        loader.load_state_dict(good | {"version": 3})
    with pytest.raises(
        StateMismatchError,
        match=r"'version' is 4: .*older loaderkit \(state version 4, whose sharded order "
        r"\(ShardPlan\) shuffled shards and windows with torch.randperm, not today's keyed "
        r"permutations\), this loaderkit reads version 5",
    ):
        loader.load_state_dict(good | {"version": 4})
    with pytest.raises(StateMismatchError, match=r"'version' is True"):
        loader.load_state_dict(good | {"version": True})
    # Edited fields fail the checksum, named; re-sealed ones still fail their own checks.
    with pytest.raises(StateMismatchError, match=r"field 'position' does not match"):
        loader.load_state_dict(good | {"position": 23})
    with pytest.raises(StateMismatchError, match=r"'position' must be a non-negative int"):
        loader.load_state_dict(seal(good | {"position": -1}))
    with pytest.raises(ValueError, match=r"'position' is 23, past the epoch length 22"):
        loader.load_state_dict(seal(good | {"position": 23, "steps_done": 1}))
    plan = dict(good["plan"])
    del plan["drop_last"]
    with pytest.raises(
        StateMismatchError, match=r"different kind of plan \(fields \[.*\], here \[.*'drop_last'"
    ):
        loader.load_state_dict(seal(good | {"plan": plan}))
    with pytest.raises(StateMismatchError, match=r"'order_check' differs"):
        loader.load_state_dict(seal(good | {"plan": good["plan"] | {"order_check": 1}}))


def test_seed_none_adopts_the_saved_seed() -> None:
    before, state = interrupt(make(seed=123), 2)
    assert state["plan"]["seed"] == 123
    resumed = make(seed=None)
    assert resumed.seed != 123
    after = resume(resumed, state, lightning=False)
    assert resumed.seed == 123
    reference = make(seed=123)
    assert_same_batches(before + after, [b for _ in range(2) for b in reference])


def test_batch_sampler_resume_reproduces_augmentation_without_an_explicit_seed() -> None:
    def loader() -> ResumableDataLoader:
        plan = SamplePlan(num_samples=N, batch_size=B, shuffle=True, seed=3)
        return ResumableDataLoader(AugDataset(), batch_sampler=PlanBatchSampler(plan))

    torch.manual_seed(1)  # the first process
    reference = loader()
    full = [b for _ in range(2) for b in reference]
    before, state = interrupt(loader(), 3)
    torch.manual_seed(2)  # the resumed process seeds torch differently
    after = resume(loader(), state, lightning=False)
    assert_same_batches(before + after, full)


# --------------------------------------------------------------- arguments
BAD_ARGS: list[tuple[dict[str, Any], type, str]] = [
    ({"batch_size": 0}, ValueError, r"batch_size must be >= 1, got 0"),
    ({"batch_size": 2.0}, TypeError, r"batch_size must be an int, got 2.0"),
    ({"batch_size": 2.5}, TypeError, r"batch_size must be an int, got 2.5"),
    ({"sampler": SequentialSampler(range(N))}, ValueError, r"shuffle=True cannot be combined"),
    ({"seed": "0"}, TypeError, r"seed must be an int, got '0'.*seed=0"),
    ({"seed": -1}, ValueError, r"seed must be >= 0, got -1"),
    ({"num_workers": -1}, ValueError, r"num_workers must be >= 0, got -1"),
    ({"num_workers": 1.0}, TypeError, r"num_workers must be an int"),
    ({"prefetch_factor": 2}, ValueError, r"prefetch_factor only applies with num_workers > 0"),
    ({"persistent_workers": True}, ValueError, r"persistent_workers=True needs num_workers > 0"),
    ({"pin_memory": "yes"}, ValueError, r"pin_memory must be True, False or 'auto', got 'yes'"),
    ({"shuffle": "yes"}, TypeError, r"shuffle must be a bool, got 'yes'"),
    ({"drop_last": None}, TypeError, r"drop_last must be a bool, got None"),
    ({"per_sample_seeding": "on"}, ValueError, r"per_sample_seeding must be True, False or"),
    (
        {"timeout": -1},
        ValueError,
        r"timeout must be a finite number of seconds >= 0, got -1; pass e\.g\. timeout=60",
    ),
    ({"collate_fn": 3}, TypeError, r"collate_fn must be callable"),
    ({"worker_init_fn": "f"}, TypeError, r"worker_init_fn must be callable"),
    ({"dataset": []}, ValueError, r"dataset is empty"),
    (
        {"batch_sampler": PlanBatchSampler(SamplePlan(num_samples=N, batch_size=B))},
        ValueError,
        r"batch_sampler is mutually exclusive with batch_size, shuffle",
    ),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD_ARGS)
def test_bad_constructor_arguments_are_named(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make(**kwargs)


def test_batch_sampler_plan_must_cover_the_dataset() -> None:
    sampler = PlanBatchSampler(SamplePlan(num_samples=N + 1, batch_size=B))
    with pytest.raises(ValueError, match=r"covers 23 samples but the dataset has 22"):
        ResumableDataLoader(AugDataset(), batch_sampler=sampler)


def test_an_iterable_dataset_takes_no_sampler_or_shuffle() -> None:
    class Stream(IterableDataset[int]):
        def __iter__(self) -> Any:
            return iter(range(3))

    with pytest.raises(ValueError, match=r"IterableDataset takes no shuffle, got shuffle=True"):
        ResumableDataLoader(Stream(), shuffle=True)
    with pytest.raises(TypeError, match=r"dataset must be map-style.*got int"):
        ResumableDataLoader(3)


def test_negative_epoch_in_set_epoch_is_refused() -> None:
    with pytest.raises(ValueError, match=r"epoch must be >= 0, got -1"):
        make().set_epoch(-1)
    with pytest.raises(TypeError, match=r"epoch must be an int"):
        make().set_epoch(1.0)  # type: ignore[arg-type]


def test_a_sampler_that_changes_its_order_is_refused_with_the_fix() -> None:
    class Unseeded(torch.utils.data.Sampler[int]):
        def __iter__(self) -> Any:
            return iter(torch.randperm(N).tolist())

        def __len__(self) -> int:
            return N

    with pytest.raises(TypeError, match=r"sampler=Unseeded lists a different order.*set_epoch"):
        ResumableDataLoader(AugDataset(), batch_size=B, sampler=Unseeded())


def test_a_sequential_sampler_is_accepted() -> None:
    loader = ResumableDataLoader(AugDataset(), batch_size=B, sampler=SequentialSampler(range(N)))
    assert ids(list(loader)) == list(range(N))


def test_a_sampler_without_plan_as_batch_sampler_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"batch_sampler"):
        ResumableDataLoader(AugDataset(), batch_sampler=SequentialSampler(range(N)))


class _EvenOnly(PlanBatchSampler):
    def __iter__(self) -> Any:
        for batch in super().__iter__():
            yield [i for i in batch if i % 2 == 0]


class _Shorter(PlanBatchSampler):
    def __len__(self) -> int:
        return 1


class _Duck:
    """Has a plan, rank and world_size, but batches of its own."""

    plan, rank, world_size = SamplePlan(num_samples=N, batch_size=B, shuffle=False), 0, 1

    def __iter__(self) -> Any:
        return iter([[9, 8]])


@pytest.mark.parametrize(
    "make",
    [
        lambda: _EvenOnly(SamplePlan(num_samples=N, batch_size=B)),
        lambda: _Shorter(SamplePlan(num_samples=N, batch_size=B)),
        _Duck,
    ],
)
def test_a_batch_sampler_whose_batches_are_not_its_plans_is_refused(make: Any) -> None:
    """The loader hands out the plan's batches: a batch sampler's own __iter__ would be
    skipped, and samples it filtered out read."""
    with pytest.raises(TypeError, match=r"batch_sampler=_(EvenOnly|Shorter|Duck)"):
        ResumableDataLoader(AugDataset(), batch_sampler=make())


def test_a_batch_sampler_is_driven_through_the_loader() -> None:
    """The loader keeps a batch sampler's position: its set_epoch reaches the loader, its
    own state calls are refused, and one that already moved is refused up front."""

    def fresh() -> PlanBatchSampler:
        return PlanBatchSampler(SamplePlan(num_samples=N, batch_size=B, seed=0), world_size=1)

    ref = ResumableDataLoader(AugDataset(), batch_sampler=fresh())
    ref.set_epoch(2)
    loader = ResumableDataLoader(AugDataset(), batch_sampler=fresh())
    loader.batch_sampler.set_epoch(2)
    assert ids(list(loader)) == ids(list(ref))
    for call in (
        lambda: loader.batch_sampler.state_dict(),
        lambda: fresh_lent().load_state_dict({}),
    ):
        with pytest.raises(TypeError, match=r"the loader keeps the position; call the loader"):
            call()
    moved = fresh()
    next(iter(moved))
    with pytest.raises(ValueError, match=r"batch_sampler=PlanBatchSampler was iterated"):
        ResumableDataLoader(AugDataset(), batch_sampler=moved)
    moved = fresh()
    moved.set_epoch(3)
    with pytest.raises(ValueError, match=r"or set to an epoch, which the loader would drop"):
        ResumableDataLoader(AugDataset(), batch_sampler=moved)


def test_a_lent_batch_sampler_shows_the_loaders_position() -> None:
    """A lent sampler's epoch, position and len were its own, never moved: stale figures.
    Its own iteration is refused; a loader that failed to build leaves it unlent."""
    sampler = PlanBatchSampler(SamplePlan(num_samples=N, batch_size=B, seed=0), world_size=1)
    with pytest.raises(ValueError, match=r"num_workers"):
        ResumableDataLoader(AugDataset(), batch_sampler=sampler, num_workers=-1)
    assert sampler.state_dict()["position"] == 0  # not lent: its own state
    loader = ResumableDataLoader(AugDataset(), batch_sampler=sampler)
    loader.set_epoch(1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert (sampler.epoch, sampler.position, sampler.steps_done) == (1, 3 * B, 3)
    state = loader.state_dict()
    again = ResumableDataLoader(AugDataset(), batch_sampler=fresh_sampler())
    again.load_state_dict(state)
    assert len(again.batch_sampler) == len(again) == -(-N // B)  # steps_done + the rest
    assert (again.batch_sampler.epoch, again.batch_sampler.position) == (1, 3 * B)
    with pytest.raises(TypeError, match=r"loader keeps the position; iterate the loader"):
        next(iter(sampler))
    with pytest.raises(ValueError, match=r"was iterated"):  # its own, by the caller
        ResumableDataLoader(AugDataset(), batch_sampler=fresh_sampler(moved=True))
    # A copy (Lightning's SWA deep-copies a module holding it) is lent to no loader.
    for copied in (copy.deepcopy(sampler), pickle.loads(pickle.dumps(sampler))):
        assert copied.state_dict()["position"] == 0
    copied_loader = copy.deepcopy(again)  # lent to the copy, at the copy's position
    assert (copied_loader.batch_sampler.epoch, copied_loader.batch_sampler.position) == (1, 3 * B)


def fresh_sampler(moved: bool = False) -> PlanBatchSampler:
    sampler = PlanBatchSampler(SamplePlan(num_samples=N, batch_size=B, seed=0), world_size=1)
    if moved:
        next(iter(sampler))
    return sampler


def fresh_lent() -> PlanBatchSampler:
    sampler = PlanBatchSampler(SamplePlan(num_samples=N, batch_size=B, seed=0), world_size=1)
    ResumableDataLoader(AugDataset(), batch_sampler=sampler)
    return sampler


class _RandomBatches(_Rows):
    """A batch-fetching dataset whose get_batch draws from the global torch RNG."""

    def get_batch(self, indices: Any) -> torch.Tensor:
        rows = self.data.index_select(0, torch.as_tensor(indices, dtype=torch.long))
        return rows + torch.rand(rows.shape)


def test_explicit_per_sample_seeding_is_honoured_for_get_batch_datasets() -> None:
    runs = [
        list(make(nw, dataset=_RandomBatches(), per_sample_seeding=True, seed=0)) for nw in (0, 2)
    ]
    assert_same_batches(runs[1], runs[0])


# --------------------------------------------------------------- global RNG
@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterating_does_not_perturb_the_global_rngs(num_workers: int) -> None:
    def draws() -> tuple[float, float, float]:
        return torch.rand(()).item(), float(np.random.random_sample()), random.random()

    def seed_all() -> None:
        torch.manual_seed(1234)
        np.random.seed(1234)
        random.seed(1234)

    seed_all()
    expected = draws()
    seed_all()
    loader = make(num_workers)  # per-sample seeding (auto) with a global-RNG dataset
    for _ in range(2):
        for _ in loader:
            pass
    assert torch.initial_seed() == 1234
    assert draws() == expected


def test_pin_memory_auto_is_off_without_an_accelerator() -> None:
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present")
    assert make(pin_memory="auto").pin_memory is False


def test_state_dicts_taken_at_different_steps_are_independent() -> None:
    """state_dict() reuses its constant part; each call must still be its own position."""
    loader = ResumableDataLoader(list(range(20)), batch_size=4, shuffle=True, seed=0)
    it = iter(loader)
    next(it)
    first = loader.state_dict()
    next(it)
    second = loader.state_dict()
    first["position"] = 999
    assert (second["position"], loader.state_dict()["position"]) == (8, 8)
    resumed = ResumableDataLoader(list(range(20)), batch_size=4, shuffle=True, seed=0)
    resumed.load_state_dict(second)
    assert len(list(resumed)) == 3


def test_workers_start_by_forkserver_inside_a_process_group(tmp_path: Path) -> None:
    """Forking a process that runs gloo's threads can deadlock the child (seen in DDP runs)."""
    import torch.distributed as dist

    loader = ResumableDataLoader(list(range(8)), batch_size=2, num_workers=2)
    assert loader._host.pool.context() is None  # no process group: torch's default (fork)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert loader._host.pool.context().get_start_method() == "forkserver"
        chosen = ResumableDataLoader(
            list(range(8)), batch_size=2, num_workers=2, multiprocessing_context="spawn"
        )
        assert chosen._host.pool.context() == "spawn"  # the user's choice wins
        assert sorted(int(i) for b in loader for i in b) == list(range(8))
    finally:
        dist.destroy_process_group()


class _Refuses:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        raise ValueError("the row has no 'label' in its columns.")


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_wrapped_dataset_error_ends_each_sentence_once(num_workers: int) -> None:
    loader = ResumableDataLoader(_Refuses(), batch_size=2, num_workers=num_workers)
    with pytest.raises(ValueError, match=r"in its columns\. The original traceback") as info:
        next(iter(loader))
    assert ".. The original" not in str(info.value)


def test_an_epoch_too_small_for_a_batch_names_its_own_size() -> None:
    # Measured before: a mix of 40 samples drawing 3 a epoch said "an epoch of 40 samples".
    from loaderkit import MixedDataset, TensorDataset

    sources = {"a": TensorDataset(torch.arange(30)), "b": TensorDataset(torch.arange(10))}
    mix = MixedDataset(sources, weights={"a": 1, "b": 1}, epoch_size=3)
    sampler = mix.batch_sampler(2, rank=0, world_size=2, drop_last=True)
    with pytest.raises(ValueError, match="epoch 0 yields no batch on 2 rank"):
        next(iter(ResumableDataLoader(mix, batch_sampler=sampler)))


class _Tagged(ResumableDataLoader):
    """A subclass with an attribute of its own."""

    def __init__(self, *args: Any, tag: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tag = tag


def _note_worker(worker_id: int) -> None:
    pass


@pytest.mark.parametrize("copier", ["pickle", "deepcopy"])
@pytest.mark.parametrize("moved", ["fresh", "iterated", "loaded", "set_epoch"])
@pytest.mark.parametrize("seeded", ["torch", "loader", "sampler"])
def test_a_pickled_loader_resumes_where_the_original_is(
    copier: str, moved: str, seeded: str
) -> None:
    """Rebuilt from its constructor's arguments plus, once loaded or given an epoch, its
    ``state_dict()``; a drawn seed (torch's, the loader's generator's, or its sampler's
    generator's before the loader drew from it), a subclass's attributes and a worker_init_fn set
    afterwards are kept, and torch's RNG is not moved. A loader only iterated copies
    afresh, as a DataLoader does (a ddp_spawn fit after a look at one batch was refused)."""

    def make() -> _Tagged:
        generator = torch.Generator().manual_seed(5)
        data = list(range(30))
        if seeded == "torch":  # the seed drawn from torch's generator
            return _Tagged(data, batch_size=4, shuffle=True, tag="t")
        if seeded == "loader":
            return _Tagged(data, batch_size=4, shuffle=True, tag="t", generator=generator)
        sampler = torch.utils.data.RandomSampler(data, generator=generator)
        return _Tagged(data, batch_size=4, sampler=sampler, tag="t")

    loader = make()
    loader.worker_init_fn = _note_worker  # as Lightning's seed_everything(workers=True) does
    if moved == "iterated":
        it = iter(loader)
        [next(it) for _ in range(3)]
    elif moved == "loaded":
        source = make()
        it = iter(source)
        [next(it) for _ in range(2)]
        loader.load_state_dict(source.state_dict())
    elif moved == "set_epoch":
        loader.set_epoch(2)
    torch.manual_seed(0)
    copied = pickle.loads(pickle.dumps(loader)) if copier == "pickle" else copy.deepcopy(loader)
    assert torch.rand(()) == torch.rand((), generator=torch.Generator().manual_seed(0))
    assert (copied.tag, copied.worker_init_fn, copied.seed) == ("t", _note_worker, loader.seed)
    reference: ResumableDataLoader = loader
    if moved == "iterated":  # a fresh loader of the same seed
        reference = (
            make()
            if seeded != "torch"
            else _Tagged(list(range(30)), batch_size=4, shuffle=True, tag="t", seed=loader.seed)
        )
    for _ in range(2):  # the rest of this epoch (or the next), then the one after
        assert [b.tolist() for b in copied] == [b.tolist() for b in reference]


def _on_rank_0_of_2(generator_seed: int) -> ResumableDataLoader:
    generator = torch.Generator().manual_seed(generator_seed)
    return ResumableDataLoader(
        list(range(16)), batch_size=4, shuffle=True, generator=generator, rank=0, world_size=2
    )


def test_a_seeded_generator_decides_the_order_on_several_ranks_too() -> None:
    # Hunter 228: on several ranks the generator's draw was replaced by the ranks' default
    # seed 0, so every generator seed gave one order (and one augmentation).
    first, second = _on_rank_0_of_2(1234), _on_rank_0_of_2(99)
    orders = [[b.tolist() for b in loader] for loader in (first, second)]
    assert orders[0] != orders[1]
    seed = first.state_dict()["plan"]["seed"]
    assert (
        seed
        == ResumableDataLoader(
            list(range(16)),
            batch_size=4,
            shuffle=True,
            generator=torch.Generator().manual_seed(1234),
        ).state_dict()["plan"]["seed"]
    )
    # A state of another generator seed is refused; one saved on ranks before (seed 0) resumes.
    with pytest.raises(StateMismatchError, match="seed"):
        _on_rank_0_of_2(1234).load_state_dict(second.state_dict())
    old = ResumableDataLoader(
        list(range(16)), batch_size=4, shuffle=True, seed=0, rank=0, world_size=2
    )
    it = iter(old)
    next(it)
    resumed = _on_rank_0_of_2(1234)
    resumed.load_state_dict(old.state_dict())
    assert [b.tolist() for b in resumed] == [b.tolist() for b in it]


class _OwnCollate(ResumableDataLoader):
    """A subclass collating with its own method (the loader among its arguments)."""

    def __init__(self, dataset: Any, **kwargs: Any) -> None:
        super().__init__(dataset, collate_fn=self.collate, **kwargs)

    def collate(self, samples: list[Any]) -> Any:
        return torch.utils.data.default_collate(samples) * 10


def test_a_loader_whose_arguments_refer_to_it_pickles() -> None:
    # Hunt 371: RecursionError (pickle, deepcopy, spawn/forkserver workers).
    loader = _OwnCollate(list(range(6)), batch_size=4)
    for copied in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
        assert [b.tolist() for b in copied] == [[0, 10, 20, 30], [40, 50]]
        assert copied.collate_fn.__self__ is copied
