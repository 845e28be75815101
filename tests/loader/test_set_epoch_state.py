"""A state saved after ``set_epoch(e)`` resumes where the live loader goes next: epoch e.

Measured before: every engine saved the epoch it had last iterated, so a loader resumed
from it (without calling ``set_epoch`` again, as a plain loop does) replayed that epoch's
order instead of epoch e's.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from loaderkit import (
    IterableReader,
    PlanBatchSampler,
    ResumableDataLoader,
    SamplePlan,
    StreamingShardedDataset,
)
from loaderkit.errors import StateMismatchError

N, BATCH = 23, 4


def read_range(shard: tuple[int, int]) -> Iterator[int]:
    start, n = shard
    return iter(range(start, start + n))


class Noisy(IterableDataset[Any]):
    """Draws from the global generator, which loaderkit seeds per worker and epoch."""

    def __iter__(self) -> Iterator[Any]:
        for i in range(N):
            yield torch.tensor([float(i), torch.rand(()).item()])


def stream(steps: int | None) -> Callable[[], ResumableDataLoader]:
    sizes = [7, 5, 11]
    starts = itertools.accumulate([0, *sizes[:-1]])
    shards = [(s, n) for s, n in zip(starts, sizes, strict=True)]

    def make() -> ResumableDataLoader:
        data = StreamingShardedDataset(shards, IterableReader(read_range), steps_per_epoch=steps)
        return ResumableDataLoader(data, batch_size=BATCH, seed=5)

    return make


LOADERS: dict[str, Callable[[], Any]] = {
    "planned": lambda: ResumableDataLoader(list(range(N)), batch_size=BATCH, shuffle=True, seed=5),
    "stream": stream(None),
    "stream with a limit": stream(3),
    "iterable": lambda: ResumableDataLoader(Noisy(), batch_size=BATCH, seed=5, num_workers=2),
    "PlanBatchSampler": lambda: DataLoader(
        list(range(N)),
        batch_sampler=PlanBatchSampler(
            SamplePlan(num_samples=N, batch_size=BATCH, shuffle=True, seed=5)
        ),
    ),
}


def values(batches: Any) -> list[Any]:
    return [torch.as_tensor(b).tolist() for b in batches]


def set_epoch(loader: Any, epoch: int) -> None:
    target = loader if isinstance(loader, ResumableDataLoader) else loader.batch_sampler
    target.set_epoch(epoch)


def save(loader: Any) -> dict[str, Any]:
    target = loader if isinstance(loader, ResumableDataLoader) else loader.batch_sampler
    return target.state_dict()


def load(loader: Any, state: dict[str, Any]) -> None:
    target = loader if isinstance(loader, ResumableDataLoader) else loader.batch_sampler
    target.load_state_dict(state)


@pytest.mark.parametrize("name", list(LOADERS))
@pytest.mark.parametrize(
    ("taken", "epoch"),
    [(None, 2), (2, 2), (None, 0)],
    ids=["after a whole epoch", "part-way", "the finished epoch again"],
)
def test_a_state_saved_after_set_epoch_resumes_that_epoch(
    name: str, taken: int | None, epoch: int
) -> None:
    make = LOADERS[name]
    live = make()
    batches = iter(live)
    for _ in itertools.islice(batches, taken):
        pass
    del batches
    set_epoch(live, epoch)
    state = save(live)
    resumed = make()
    load(resumed, state)
    expected = values(live)
    assert values(resumed) == expected
    if name != "stream with a limit":  # its streams go on across epochs
        reference = make()
        set_epoch(reference, epoch)
        assert expected == values(reference)  # the live loader did run that epoch
    assert values(resumed) == values(live)  # and both go on alike


class _Twelve(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(12))


@pytest.mark.parametrize("driver", ["loader", "sampler", "iterable"])
@pytest.mark.parametrize("k", [1, 2, 3, None])  # None: iterated to its end
def test_a_loop_resuming_at_the_saved_epoch_does_not_replay_it(driver: str, k: int | None) -> None:
    """`for e in range(saved_epoch, E): set_epoch(e)` after a save at the epoch's last
    batch (k=3) replayed that whole epoch; mid-epoch saves resumed its rest."""

    def make() -> Any:
        if driver == "sampler":
            plan = SamplePlan(num_samples=12, batch_size=BATCH, shuffle=True, seed=0)
            return PlanBatchSampler(plan, world_size=1)
        if driver == "iterable":
            return ResumableDataLoader(_Twelve(), batch_size=BATCH, seed=0)
        return ResumableDataLoader(list(range(12)), batch_size=BATCH, shuffle=True, seed=0)

    def batches(it: Any) -> list[list[int]]:
        return [[int(i) for i in b] for b in it]

    ref, full = make(), []
    for e in range(2):
        ref.set_epoch(e)
        full += batches(ref)
    first = make()
    first.set_epoch(0)
    head = batches(first if k is None else itertools.islice(iter(first), k))
    saved = {"epoch": 0, "state": first.state_dict()}
    again, rest = make(), []
    again.load_state_dict(saved["state"])
    for e in range(saved["epoch"], 2):
        again.set_epoch(e)
        rest += batches(again)
    assert head + rest == full
    if driver != "sampler":  # its count of the epoch's batches goes on from the saved one
        assert again.state_dict()["steps_done"] == 3


class _SizedTwelve(_Twelve):
    def __len__(self) -> int:
        return 12


def test_set_epoch_after_a_save_on_an_iterables_last_batch_starts_that_epoch() -> None:
    # Not seen ending (no StopIteration yet), the position was taken for part-way through
    # and set_epoch(1) refused; without a fit driving it, set_epoch names the epoch.
    first = ResumableDataLoader(_SizedTwelve(), batch_size=BATCH, seed=0)
    it = iter(first)
    head = [next(it) for _ in range(len(first))]
    again = ResumableDataLoader(_SizedTwelve(), batch_size=BATCH, seed=0)
    again.load_state_dict(first.state_dict())
    again.set_epoch(1)
    assert [b.tolist() for b in again] == [b.tolist() for b in head]


@pytest.mark.parametrize("name", ["planned", "stream", "iterable"])
def test_set_epoch_repeated_inside_the_epoch_names_the_running_one(name: str) -> None:
    # Hunter 354: a loop naming its epoch again mid-epoch (a per-step hook) saved, at the
    # epoch's last batch, that epoch's start: the resumed loop trained it twice.
    make = LOADERS[name]
    reference, full = make(), []
    for e in range(2):
        set_epoch(reference, e)
        full += values(reference)
    first, head = make(), []
    set_epoch(first, 0)
    for batch in first:
        set_epoch(first, 0)
        head.append(torch.as_tensor(batch).tolist())
    again, rest = make(), []
    load(again, save(first))
    for e in range(save(first)["epoch"], 2):
        set_epoch(again, e)
        rest += values(again)
    assert head + rest == full


@pytest.mark.parametrize("name", ["planned", "stream", "iterable"])
def test_a_peek_after_loading_a_part_way_state_is_refused_by_set_epoch(name: str) -> None:
    # Hunter 354: the peek took the loaded epoch's next batch and set_epoch(0) then began the
    # epoch afresh: the resumed loop trained the saved batches twice.
    make = LOADERS[name]
    epoch0, first = values(make()), make()
    set_epoch(first, 0)
    batches = iter(first)
    head = [torch.as_tensor(next(batches)).tolist() for _ in range(2)]
    state = save(first)
    del batches
    again = make()
    load(again, state)
    next(iter(again))  # a look at the shapes
    set_epoch(again, 0)
    with pytest.raises(StateMismatchError, match=LEFT):
        values(again)
    again = make()
    next(iter(again))  # before loading: the state decides
    load(again, state)
    set_epoch(again, 0)
    assert head + values(again) == epoch0


def test_a_numpy_epoch_is_taken_as_torch_samplers_take_it() -> None:
    # Hunter 354: `for epoch in np.arange(E)` was refused (DistributedSampler takes it).
    def order(epoch: Any) -> list[Any]:
        loader = LOADERS["planned"]()
        set_epoch(loader, epoch)
        return values(loader)

    assert order(np.int64(1)) == order(1) != order(0)
    plan = SamplePlan(num_samples=N, batch_size=BATCH, shuffle=True, seed=5)
    sampler = PlanBatchSampler(plan, world_size=1)
    sampler.set_epoch(np.int32(1))
    assert [list(b) for b in sampler] == order(1)


LEFT = r"iter\(\) begins epoch 0 afresh, but the iteration that resumed the loaded state"


@pytest.mark.parametrize("name", ["planned", "stream", "iterable"])
def test_set_epoch_beside_a_held_iterator_begins_that_epoch(name: str) -> None:
    # Review 357: a peek's iterator held while set_epoch(0) was called made the loop's iter()
    # begin epoch 1 (epoch 0 never trained); review 361: so did an iterator stopped by
    # close() or kept by a traceback. set_epoch names the next iteration, as torch's do.
    make = LOADERS[name]
    epoch0 = values(make())
    loader = make()
    peek = iter(loader)
    next(peek)
    set_epoch(loader, 0)
    assert values(loader) == epoch0
    first = make()
    batches = iter(first)
    next(batches)
    state = save(first)
    again = make()
    load(again, state)
    held = iter(again)
    next(held)  # a peek after loading, held: the loaded epoch's rest is not known
    set_epoch(again, 0)
    with pytest.raises(StateMismatchError, match=LEFT):
        values(again)


class _EpochShuffled(IterableDataset[int]):
    """Reshuffles by the epoch ``set_epoch`` gives, as a datasets.IterableDataset does."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(12, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        info = torch.utils.data.get_worker_info()
        return iter(order if info is None else order[info.id :: info.num_workers])


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, False), (2, True)])
def test_the_loader_tells_an_iterable_dataset_its_epoch_in_every_worker(
    num_workers: int, persistent: bool
) -> None:
    # Review 360: persistent workers kept the copy they started with at epoch 0.
    def expected(epoch: int) -> set[tuple[int, ...]]:
        order = torch.randperm(12, generator=torch.Generator().manual_seed(epoch)).tolist()
        streams = [order[w::num_workers] for w in range(num_workers)] if num_workers else [order]
        return {tuple(s[k : k + 3]) for s in streams for k in range(0, len(s), 3)}

    loader = ResumableDataLoader(
        _EpochShuffled(),
        batch_size=3,
        seed=0,
        num_workers=num_workers,
        persistent_workers=persistent,
    )
    for epoch in range(3):
        assert {tuple(b.tolist()) for b in loader} == expected(epoch)


@pytest.mark.parametrize("name", ["planned", "stream", "iterable"])
def test_a_state_saved_for_a_retry_of_an_epoch_left_part_way_holds_its_start(name: str) -> None:
    # Review 362: break after 2 batches, set_epoch(0) to run epoch 0 again, save: the state
    # held the left iteration's place and the resumed loader skipped the retry's first batches.
    make = LOADERS[name]
    live = make()
    set_epoch(live, 0)
    for step, _ in enumerate(live):
        if step == 1:
            break
    set_epoch(live, 0)
    state = save(live)
    again = make()
    load(again, state)
    set_epoch(again, 0)
    assert values(again) == values(live) == values(make())
