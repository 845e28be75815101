"""An ``IterableDataset`` passed directly: edges where a loader returned other data, silently.

Each case was measured wrong on 84cc6ec (issue 21): a worker's augmentation
after a resume through the dataset's own state, a dataset whose ``__iter__``
resets itself and returns ``self`` (its first item forever), and the resume
edges torchdata's ``StatefulDataLoader`` tests exercise (an epoch counter the
dataset advances after its last item, a state saved between ``iter()`` and the
first batch, a position the dataset creates in ``__iter__``).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from loaderkit import ResumableDataLoader, StateMismatchError
from tests.support.streams import (
    EpochWalk,
    NumpyDrawWalk,
    PositionFromIter,
    ResetsOnIter,
    ResumableGenerator,
    RngWalk,
    ShuffledWalk,
    Walk,
    use_bit_generator,
    worker_of,
)


def as_lists(batches: list[Any]) -> list[Any]:
    """Batches as plain nested lists (tensors and tuples of tensors alike)."""

    def plain(obj: Any) -> Any:
        if isinstance(obj, list | tuple):
            return [plain(o) for o in obj]
        return torch.as_tensor(obj).tolist()

    return [plain(b) for b in batches]


# ------------------------------------------------------- point 4: worker randomness
class NoisyPositions(IterableDataset[torch.Tensor]):
    """Keeps its own position (state_dict); each sample draws from all three global RNGs."""

    def __init__(self, per_worker: int = 12) -> None:
        self.per_worker, self.pos = per_worker, 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        worker, _ = worker_of()
        while self.pos < self.per_worker:
            self.pos += 1
            noise = [torch.rand(()).item(), float(np.random.rand()), random.random()]
            yield torch.tensor([100.0 * worker + self.pos, *noise], dtype=torch.float64)

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


def test_resume_through_the_datasets_state_keeps_each_workers_augmentation() -> None:
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(NoisyPositions(), batch_size=2, num_workers=2, seed=5)

    full = as_lists(list(loader()))
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    got = as_lists(head) + as_lists(list(resumed))
    assert [[s[0] for s in b] for b in got] == [[s[0] for s in b] for b in full]  # same samples
    assert got == full  # and the same noise, from every generator
    noise = [s[1] for b in full for s in b]
    assert len(set(noise)) == len(noise)  # the noise is real: no two samples share it


# ------------------------------------------------- point 9: __iter__ resets, returns self
@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("batch_size", [None, 2])
def test_a_dataset_that_resets_in_iter_and_returns_itself_is_read_once(
    num_workers: int, batch_size: int | None
) -> None:
    kwargs = {"batch_size": batch_size, "num_workers": num_workers}
    theirs = as_lists(list(islice(DataLoader(ResetsOnIter(5), **kwargs), 12)))
    ours = ResumableDataLoader(ResetsOnIter(5), **kwargs)
    assert as_lists(list(islice(ours, 12))) == theirs
    assert theirs in ([0, 1, 2, 3, 4], [[0, 1], [2, 3], [4]])


# ------------------------------------- point 11: resume edges (torchdata's own tests)
@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True)])
def test_an_epoch_counter_advanced_after_the_last_item_resumes_advanced(
    num_workers: int, persistent: bool
) -> None:
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(
            ResumableGenerator([4, 4], count_epochs=True),  # counts after its last item
            batch_size=2,
            num_workers=num_workers,
            persistent_workers=persistent,
            seed=0,
        )

    first = loader()
    epochs = [as_lists(list(first)) for _ in range(3)]
    assert set(epochs[2][0][1]) == {2}  # the uninterrupted run's counter in its third epoch
    saving = loader()
    assert as_lists(list(saving)) == epochs[0]
    state = saving.state_dict()  # after epoch 0 ended: the dataset counts 1 now
    resumed = loader()
    resumed.load_state_dict(state)
    assert as_lists(list(resumed)) == epochs[1]
    assert as_lists(list(resumed)) == epochs[2]


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True)])
@pytest.mark.parametrize("cut", [1, 3])
def test_an_epoch_counter_keeps_counting_after_a_mid_epoch_resume(
    num_workers: int, persistent: bool, cut: int
) -> None:
    # Review of issue 21: persistent workers started after a resumed epoch copied the
    # main process's dataset, so the counter lagged: [0], [0], [1] for [0], [1], [2].
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(
            ResumableGenerator([4, 4], count_epochs=True),
            batch_size=2,
            num_workers=num_workers,
            persistent_workers=persistent,
            seed=0,
        )

    first = loader()
    epochs = [as_lists(list(first)) for _ in range(3)]
    saving = loader()
    it = iter(saving)
    head = as_lists([next(it) for _ in range(cut)])
    state = saving.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + as_lists(list(resumed)) == epochs[0]
    assert as_lists(list(resumed)) == epochs[1]
    assert as_lists(list(resumed)) == epochs[2]


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True)])
@pytest.mark.parametrize("cut", ["mid", "last", "after"])
@pytest.mark.parametrize("dataset", [EpochWalk, PositionFromIter])
def test_a_dataset_that_is_its_own_iterator_goes_on_to_its_next_epoch(
    num_workers: int, persistent: bool, cut: str, dataset: type
) -> None:
    # The next epoch calls iter() on the object as its last epoch left it; a resumed run's
    # object had not run that end (its workers were new, or the saved epoch's rest was
    # empty), so an epoch counted at StopIteration was replayed: epochs 0, 0, 1.
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(
            dataset(12), batch_size=5, num_workers=num_workers, persistent_workers=persistent
        )

    first = loader()
    epochs = [as_lists(list(first)) for _ in range(3)]
    saving = loader()
    it = iter(saving)
    stop = {"mid": 1, "last": len(epochs[0]), "after": len(epochs[0]) + 1}[cut]
    head = as_lists(list(islice(it, stop)))  # "after" runs the epoch out
    state = saving.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [] if cut == "after" else as_lists(list(resumed))  # "after": epoch 0 is complete
    assert head + rest == epochs[0]
    assert as_lists(list(resumed)) == epochs[1]
    assert as_lists(list(resumed)) == epochs[2]
    if dataset is EpochWalk:
        assert set(epochs[2][0][1]) == {2}  # the third epoch counted twice


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True)])
@pytest.mark.parametrize("cut", ["mid", "after"])
def test_an_own_iterator_that_draws_in_iter_draws_its_next_epoch_once(
    num_workers: int, persistent: bool, cut: str
) -> None:
    # Review of 74eeb65: putting the object where its last epoch ended called iter() once
    # more, so an order drawn in __iter__ from the global RNG differed after the resume.
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(
            ShuffledWalk(12),
            batch_size=5,
            num_workers=num_workers,
            persistent_workers=persistent,
            seed=0,
        )

    def epoch(dl: ResumableDataLoader, e: int) -> list[Any]:
        torch.manual_seed(100 + e)  # in process, the caller's RNG draws the order
        return as_lists(list(dl))

    first = loader()
    epochs = [epoch(first, e) for e in range(3)]
    saving = loader()
    torch.manual_seed(100)
    it = iter(saving)
    head = as_lists(list(islice(it, 1 if cut == "mid" else len(epochs[0]) + 1)))
    state = saving.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    rest = [] if cut == "after" else as_lists(list(resumed))
    assert head + rest == epochs[0]
    assert epoch(resumed, 1) == epochs[1]
    assert epoch(resumed, 2) == epochs[2]


def test_an_own_iterators_next_epoch_resumes_under_any_numpy_bit_generator() -> None:
    # Review of f88282d: saving the global RNGs read numpy's as an MT19937 (a tuple), so
    # a resume under np.random.set_bit_generator(PCG64) raised in open_stream.
    kept = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(1))
    try:
        first = ResumableDataLoader(ShuffledWalk(12), batch_size=5, seed=0)
        torch.manual_seed(100)
        epochs = [as_lists(list(first)), as_lists(list(first))]
        saving = ResumableDataLoader(ShuffledWalk(12), batch_size=5, seed=0)
        torch.manual_seed(100)
        it = iter(saving)
        assert as_lists(list(islice(it, 4))) == epochs[0]  # the epoch run out
        state = saving.state_dict()
        del it
        resumed = ResumableDataLoader(ShuffledWalk(12), batch_size=5, seed=0)
        resumed.load_state_dict(state)
        torch.manual_seed(100)
        torch.randperm(12)  # where the uninterrupted run's RNG stood at its second iter()
        assert as_lists(list(resumed)) == epochs[1]
    finally:
        np.random.set_bit_generator(kept)


@pytest.mark.parametrize("bit_generator", ["MT19937", "PCG64", "Philox"])
def test_a_worker_drawing_from_numpy_resumes_under_any_bit_generator(bit_generator: str) -> None:
    # A worker's RNG record read numpy's state as an MT19937 tuple: under PCG64 every
    # batch of a stateful stream raised ValueError in the worker.
    def loader() -> ResumableDataLoader:
        init = functools.partial(use_bit_generator, bit_generator)
        return ResumableDataLoader(
            NumpyDrawWalk(24), batch_size=4, num_workers=2, seed=0, worker_init_fn=init
        )

    full = as_lists(list(loader()))
    first = loader()
    it = iter(first)
    head = as_lists([next(it) for _ in range(3)])
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + as_lists(list(resumed)) == full


def test_a_state_saved_under_another_numpy_bit_generator_is_refused_by_name() -> None:
    # numpy's own ValueError ("state must be for a MT19937 PRNG") did not name the fix.
    def loader(bit_generator: str) -> ResumableDataLoader:
        init = functools.partial(use_bit_generator, bit_generator)
        return ResumableDataLoader(
            NumpyDrawWalk(24), batch_size=4, num_workers=2, seed=0, worker_init_fn=init
        )

    first = loader("PCG64")
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    resumed = loader("MT19937")
    resumed.load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"as a PCG64, this worker.s is a MT19937; resume"):
        list(resumed)


class DrawsFromTheGlobalRng(IterableDataset[int]):
    """Not stateful itself; its iterator draws from the global RNG and saves it."""

    def __iter__(self) -> RngWalk:
        return RngWalk(12)


def test_a_state_saved_before_the_first_batch_restores_the_streams_start_in_process() -> None:
    loader = ResumableDataLoader(DrawsFromTheGlobalRng(), batch_size=3)
    it = iter(loader)
    state = loader.state_dict()  # after iter(), before the first batch
    saved_run = as_lists(list(it))
    torch.rand(7)  # the global RNG moves on, as a training step would
    loader.load_state_dict(state)
    assert as_lists(list(loader)) == saved_run


def test_a_state_saved_before_the_first_batch_rewinds_a_reused_exhausted_dataset() -> None:
    dataset = Walk(100)  # never rewound: one pass exhausts the object
    loader = ResumableDataLoader(dataset, batch_size=10)
    it = iter(loader)
    state = loader.state_dict()
    assert len(as_lists(list(it))) == 10  # the object is exhausted now
    again = ResumableDataLoader(dataset, batch_size=10)
    again.load_state_dict(state)
    assert [s for b in as_lists(list(again)) for s in b] == list(range(100))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_position_created_in_iter_resumes(num_workers: int) -> None:
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(PositionFromIter(40), batch_size=4, num_workers=num_workers)

    full = as_lists(list(islice(loader(), 20)))  # bounded: a reset per batch never ends
    assert sorted(s for b in full for s in b) == list(range(40))
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert as_lists(head) + as_lists(list(islice(resumed, 20))) == full


class Range(IterableDataset[int]):
    """A plain stream: no state of its own (resumed by replay)."""

    def __iter__(self) -> Iterator[int]:
        return iter(range(20))


def test_an_iterator_not_yet_started_leaves_the_state_to_the_one_part_way() -> None:
    # Review of issue 21: after B = iter(loader), state_dict() said epoch 1, step 0
    # while iterator A was 3 batches into epoch 0: a resume repeated A's batches.
    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(Range(), batch_size=2)

    full = as_lists(list(loader()))
    saving = loader()
    a = iter(saving)
    head = as_lists([next(a) for _ in range(3)])
    b = iter(saving)  # made, never started (a peek helper, a sanity check)
    state = saving.state_dict()
    assert (state["epoch"], state["steps_done"]) == (0, 3)
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + as_lists(list(resumed)) == full
    assert as_lists([next(a)]) == [full[3]]  # A goes on with its own epoch
    del b


# ------------------------------------------- point 10 for iterables: an error in a batch
class ShardedByWorker(IterableDataset[int]):
    """Splits itself by worker (torch's docs); record 2 is corrupt: its generator raises."""

    def __iter__(self) -> Iterator[int]:
        worker, workers = worker_of()
        for i in range(worker, 20, workers):
            if i == 2:
                raise KeyError(f"record {i}")
            yield i


class SkipsCorrupt(IterableDataset[int]):
    """Its own iterator: records 5 and 13 raise, the stream goes on after them."""

    def __iter__(self) -> SkipsCorrupt:
        worker, workers = worker_of()
        self.next, self.step = worker, workers
        return self

    def __next__(self) -> int:
        current = self.next
        if current >= 20:
            raise StopIteration
        self.next += self.step
        if current in (5, 13):
            raise KeyError(f"record {current}")
        return current


class StatefulSkipsCorrupt(SkipsCorrupt):
    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]


def catching(it: Any, stop: int | None = None) -> list[Any]:
    seen: list[Any] = []
    while stop is None or len(seen) < stop:
        try:
            seen.append(torch.as_tensor(next(it)).tolist())
        except StopIteration:
            break
        except KeyError:
            seen.append("KeyError")
    return seen


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["generator", "replay", "state"])
def test_an_error_in_an_iterable_batch_is_raised_and_every_other_batch_follows(
    kind: str, num_workers: int
) -> None:
    # Review of issue 21: with workers the first error ended the epoch for every worker
    # (torch: ['KeyError', [1, 3], [5, 7], ...]; loaderkit: ['KeyError'] then nothing).
    def dataset() -> IterableDataset[int]:
        kinds = {"generator": ShardedByWorker, "replay": SkipsCorrupt}
        return kinds.get(kind, StatefulSkipsCorrupt)()

    want = catching(iter(DataLoader(dataset(), batch_size=2, num_workers=num_workers)))
    assert "KeyError" in want

    def loader() -> ResumableDataLoader:
        return ResumableDataLoader(dataset(), batch_size=2, num_workers=num_workers, seed=0)

    assert catching(iter(loader())) == want
    for cut in range(1, len(want)):  # the state after every batch, the errors included
        saving = loader()
        it = iter(saving)
        head = catching(it, cut)
        state = saving.state_dict()
        del it
        resumed = loader()
        resumed.load_state_dict(state)
        assert head + catching(iter(resumed)) == want, cut
        assert resumed.describe()["resume"] == ("state" if kind == "state" else "replay")


class _AugmentedIds(IterableDataset[tuple[int, float]]):
    """Ids in a fixed order, each with a draw from torch's global RNG; no state."""

    def __iter__(self) -> Iterator[tuple[int, float]]:
        for i in range(12):
            yield i, float(torch.rand(1))


def test_an_in_process_replay_that_drew_from_the_global_rngs_names_them() -> None:
    # The order was deterministic; the refusal told the user to make it so.
    loader = ResumableDataLoader(_AugmentedIds(), batch_size=2, collate_fn=list)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    resumed = ResumableDataLoader(_AugmentedIds(), batch_size=2, collate_fn=list)
    resumed.load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"in the main process its draws from the global"):
        next(iter(resumed))
