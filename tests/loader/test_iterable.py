"""An ``IterableDataset`` passed directly to ResumableDataLoader: DataLoader's behaviour, and
exact resume by the best method the dataset allows (its own state, else a checked replay).

The resume oracle (docs/design.md): the first k batches plus the batches of a fresh
loader resumed at k equal the uninterrupted run, over two epochs, num_workers 0 and 2.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from loaderkit import LoaderkitError, ResumableDataLoader, StateMismatchError

N = 23


def split(start: int, end: int) -> range:
    """The torch docs' split of [start, end) by worker info (the whole range in-process)."""
    info = get_worker_info()
    if info is None:
        return range(start, end)
    per = math.ceil((end - start) / info.num_workers)
    lo = start + info.id * per
    return range(lo, min(lo + per, end))


class Sharded(IterableDataset[int]):
    """torch's docs example: each worker yields its own slice of [start, end)."""

    def __init__(self, start: int = 0, end: int = N) -> None:
        self.start, self.end = start, end

    def __iter__(self) -> Iterator[int]:
        return iter(split(self.start, self.end))


class Jittered(Sharded):
    """Sharded, plus noise from the worker's global RNG (loaderkit seeds it per epoch)."""

    def __iter__(self) -> Iterator[Any]:
        for i in split(self.start, self.end):
            yield torch.tensor([float(i), torch.rand(()).item()])


class Positioned(IterableDataset[int]):
    """A Stateful dataset (torchdata's protocol): keeps its position, restarts from it.

    Every worker's copy strides over [0, size) by worker; ``pos`` counts its own samples.
    """

    def __init__(self, size: int = N) -> None:
        self.size, self.pos, self.replayed = size, 0, 0

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        while worker + self.pos * workers < self.size:
            self.pos += 1
            yield worker + (self.pos - 1) * workers
        self.pos = 0  # the next pass starts over

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


class StatefulIter:
    """An iterator with state_dict/load_state_dict (the dataset itself has none)."""

    def __init__(self, items: range) -> None:
        self.items, self.pos = items, 0

    def __iter__(self) -> StatefulIter:
        return self

    def __next__(self) -> int:
        if self.pos >= len(self.items):
            raise StopIteration
        self.pos += 1
        return self.items[self.pos - 1]

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


class IterState(Sharded):
    def __iter__(self) -> Iterator[int]:
        return StatefulIter(split(self.start, self.end))


class Unseeded(IterableDataset[int]):
    """A different order every pass (OS entropy): cannot be replayed."""

    def __iter__(self) -> Iterator[int]:
        return iter(random.Random().sample(range(10**9), 20))  # 1e-9 that two passes agree


class Sized(Sharded):
    def __len__(self) -> int:
        return self.end - self.start


def values(batches: list[Any]) -> list[list[float]]:
    return [torch.as_tensor(b).tolist() for b in batches]


def run(loader: ResumableDataLoader, epochs: int = 2) -> list[Any]:
    return values([b for _ in range(epochs) for b in loader])


def resumed_at(make: Any, k: int, epochs: int = 2) -> tuple[list[Any], ResumableDataLoader]:
    """The first k batches of a run (over ``epochs``), then a fresh loader resumed there."""
    loader = make()
    first: list[Any] = []
    for _ in range(epochs):
        it = iter(loader)
        while len(first) < k:
            try:
                first.append(next(it))
            except StopIteration:
                break
        if len(first) == k:
            break
    state = loader.state_dict()
    del it
    fresh = make()
    fresh.load_state_dict(state)
    return values(first), fresh


def assert_resume_exact(make: Any, ks: list[int]) -> None:
    whole = run(make())
    for k in ks:
        first, fresh = resumed_at(make, k)
        rest = values(list(fresh))
        if len(first) + len(rest) < len(whole):  # resumed inside epoch 0: epoch 1 follows
            rest += values(list(fresh))
        assert first + rest == whole, f"resumed at batch {k}"


# ------------------------------------------------------------- like DataLoader
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_batches_are_dataloaders(num_workers: int, batch_size: int | None) -> None:
    torch_batches = values(
        list(DataLoader(Sharded(), batch_size=batch_size, num_workers=num_workers))
    )
    ours = values(
        list(ResumableDataLoader(Sharded(), batch_size=batch_size, num_workers=num_workers))
    )
    assert ours == torch_batches  # same samples, same round-robin order of workers
    flat = [x for b in ours for x in (b if isinstance(b, list) else [b])]
    assert sorted(flat) == list(range(N))  # the worker-info split loses nothing


def test_drop_last_drops_each_workers_short_batch_as_dataloader_does() -> None:
    want = values(list(DataLoader(Sharded(), batch_size=5, num_workers=2, drop_last=True)))
    got = values(list(ResumableDataLoader(Sharded(), batch_size=5, num_workers=2, drop_last=True)))
    assert got == want and all(len(b) == 5 for b in got)


def test_len_is_dataloaders() -> None:
    assert len(ResumableDataLoader(Sized(), batch_size=4)) == len(DataLoader(Sized(), batch_size=4))
    assert len(ResumableDataLoader(Sized(), batch_size=4, drop_last=True)) == N // 4
    with pytest.raises(TypeError):
        len(ResumableDataLoader(Sharded(), batch_size=4))  # no __len__: as DataLoader


def test_sampler_attributes_and_set_epoch() -> None:
    loader = ResumableDataLoader(Sharded(), batch_size=4, drop_last=True)
    assert loader.batch_sampler.batch_size == 4 and loader.drop_last is True
    assert ResumableDataLoader(Sharded(), batch_size=None).batch_sampler is None
    loader.sampler.set_epoch(5)  # what Lightning's fit loop calls
    list(loader)
    assert loader.state_dict()["epoch"] == 5


def test_workers_see_their_real_id_and_the_users_dataset() -> None:
    seen = list(ResumableDataLoader(WhoAmI(), batch_size=None, num_workers=2))
    assert sorted(map(tuple, seen)) == [(0, 2, "WhoAmI"), (1, 2, "WhoAmI")]


class WhoAmI(IterableDataset[tuple[int, int, str]]):
    def __iter__(self) -> Iterator[tuple[int, int, str]]:
        info = get_worker_info()
        assert info is not None
        yield info.id, info.num_workers, type(info.dataset).__name__


# ---------------------------------------------------------------------- resume
@pytest.mark.parametrize("num_workers", [0, 2])
def test_replay_resume_is_exact(num_workers: int) -> None:
    def make() -> ResumableDataLoader:
        return ResumableDataLoader(Sharded(), batch_size=4, num_workers=num_workers, seed=3)

    assert make().describe()["resume"] == "replay"
    assert_resume_exact(make, [0, 1, 3, 6, 8])  # 6 batches per epoch: inside, at, after the end


def test_replay_resume_reproduces_worker_randomness() -> None:
    def make() -> ResumableDataLoader:
        return ResumableDataLoader(Jittered(), batch_size=3, num_workers=2, seed=3)

    assert_resume_exact(make, [1, 4, 10])


def test_a_loader_without_a_seed_reports_the_seed_it_adopted() -> None:
    saved = ResumableDataLoader(Jittered(), batch_size=3, num_workers=2, seed=3)
    it = iter(saved)
    next(it)
    resumed = ResumableDataLoader(Jittered(), batch_size=3, num_workers=2)
    assert resumed.plan.seed != 3
    resumed.load_state_dict(saved.state_dict())
    # The workers draw with seed 3 now: the plan must not report the drawn one.
    assert resumed.seed == resumed.plan.seed == 3
    rest, got = list(it), list(resumed)
    assert len(got) == len(rest) > 0 and all(map(torch.equal, got, rest))


def draw_in_collate(samples: list[Any]) -> torch.Tensor:
    """A collate_fn that draws from the worker's global RNG (random masking, mixup)."""
    return torch.stack([torch.cat([torch.as_tensor(s).view(-1), torch.rand(1)]) for s in samples])


@pytest.mark.parametrize("persistent", [False, True])
def test_replay_resume_reproduces_a_collate_fns_randomness(persistent: bool) -> None:
    # The replay skipped collate_fn: a resumed worker drew its batches' noise again.
    def make() -> ResumableDataLoader:
        return ResumableDataLoader(
            Jittered(),
            batch_size=3,
            num_workers=2,
            seed=3,
            collate_fn=draw_in_collate,
            persistent_workers=persistent,
        )

    assert make().describe()["resume"] == "replay"
    assert_resume_exact(make, [1, 4, 10])


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("dataset", [Positioned, IterState])
def test_a_stateful_dataset_or_iterator_resumes_from_its_own_state(
    num_workers: int, dataset: type
) -> None:
    def make() -> ResumableDataLoader:
        return ResumableDataLoader(dataset(), batch_size=4, num_workers=num_workers, seed=3)

    # Positioned would skip its samples twice if the loader replayed it after loading its state.
    assert_resume_exact(make, [1, 3, 7])
    loader = make()
    if dataset is IterState:  # known once a worker reported its iterator's state
        assert loader.describe()["resume"] == "replay"
        next(iter(loader))
    assert loader.describe()["resume"] == "state"
    assert "state_dict()/load_state_dict()" in loader.describe()["resume_reason"]


class Resets(IterableDataset[int]):
    """A stateful stream whose end code resets its position (torchdata-style)."""

    def __init__(self, n: int = 10) -> None:
        self.n, self.pos = n, 0

    def __iter__(self) -> Iterator[int]:
        while self.pos < self.n:
            self.pos += 1
            yield self.pos - 1
        self.pos = 0

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_position_saved_at_a_short_last_batch_does_not_replay_the_stream(
    num_workers: int,
) -> None:
    """The stream ran out while its short last batch was taken, so the dataset's state is
    already the reset one: resuming there is the epoch's end, not its start again."""

    def make() -> ResumableDataLoader:
        return ResumableDataLoader(Resets(), batch_size=4, num_workers=num_workers)

    assert_resume_exact(make, list(range(1, 7)))  # 3 batches an epoch and worker


class ResumesOnce(IterableDataset[int]):
    """Stateful as a Hugging Face ``IterableDataset``: ``load_state_dict`` places the next
    ``__iter__`` only, and the state after the last item says the pass is done."""

    def __init__(self, n: int = 10) -> None:
        self.n, self.pos, self.resume_at = n, 0, 0

    def __iter__(self) -> Iterator[int]:
        start, self.resume_at = self.resume_at, 0
        for i in range(start, self.n):
            self.pos = i + 1
            yield i

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.resume_at = state["pos"]


def test_a_stream_that_does_not_rewind_at_its_end_reads_every_epoch_in_process() -> None:
    # The in-process loader loaded the state the dataset ended epoch 0 in before epoch 1's
    # iter(): that epoch was empty with num_workers=0, whole with workers and under DataLoader.
    loader = ResumableDataLoader(ResumesOnce(), batch_size=4)
    torch_loader = DataLoader(ResumesOnce(), batch_size=4)
    assert run(loader, epochs=3) == run(torch_loader, epochs=3)  # type: ignore[arg-type]


class DiesOnError(Positioned):
    """Positioned, raising at its third sample: the raise ends its generator (and stream)."""

    def __iter__(self) -> Iterator[int]:
        for sample in super().__iter__():
            if self.pos == 3:
                raise KeyError(sample)
            yield sample


def with_errors(it: Iterator[Any], count: int | None = None) -> list[Any]:
    """Up to ``count`` batches of ``it``, a KeyError raised in a batch's place as "KeyError"."""
    out: list[Any] = []
    while count is None or len(out) < count:
        try:
            out.append(torch.as_tensor(next(it)).tolist())
        except StopIteration:
            break
        except KeyError:
            out.append("KeyError")
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_stateful_generator_that_raised_stays_ended_after_a_resume(num_workers: int) -> None:
    # Resumed after its failed batch, a new generator went on from the dataset's state: samples
    # the uninterrupted run never yielded.
    def make() -> ResumableDataLoader:
        return ResumableDataLoader(DiesOnError(), batch_size=2, num_workers=num_workers)

    whole = with_errors(iter(make()))
    assert "KeyError" in whole
    for k in range(1, len(whole) + 1):
        loader = make()
        it = iter(loader)
        first = with_errors(it, k)
        state = loader.state_dict()
        del it
        fresh = make()
        fresh.load_state_dict(state)
        assert first + with_errors(iter(fresh)) == whole, f"resumed at batch {k}"


def test_unbatched_resume_is_exact() -> None:
    def make() -> ResumableDataLoader:
        return ResumableDataLoader(Sharded(), batch_size=None, num_workers=2, seed=3)

    assert_resume_exact(make, [1, 5, 30])


def test_persistent_workers_match_fresh_workers_and_resume() -> None:
    def make(persistent: bool = True) -> ResumableDataLoader:
        return ResumableDataLoader(
            Jittered(), batch_size=3, num_workers=2, seed=3, persistent_workers=persistent
        )

    assert run(make(), epochs=3) == run(make(False), epochs=3)
    assert_resume_exact(make, [2, 10])


class OwnShuffle(IterableDataset[int]):
    """No state_dict: shuffles each pass from its own RNG, so its copy's earlier passes decide
    the order (as uninterrupted, where an in-process or persistent worker's copy lives on)."""

    def __init__(self, size: int = 11) -> None:
        self.size, self.rng = size, random.Random(0)

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.size))
        self.rng.shuffle(order)
        info = get_worker_info()
        return iter(order if info is None else order[info.id :: info.num_workers])


def _own_shuffle_loader(num_workers: int, persistent: bool) -> ResumableDataLoader:
    return ResumableDataLoader(
        OwnShuffle(), batch_size=3, num_workers=num_workers, persistent_workers=persistent
    )


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True)])
def test_a_replayed_copy_that_lives_on_resumes_exactly_inside_epoch_0(
    num_workers: int, persistent: bool
) -> None:
    # Persistent workers served a resumed epoch 0 from copies they then dropped: epoch 1 was a
    # fresh copy's first pass, epoch 0's order again.
    make = functools.partial(_own_shuffle_loader, num_workers, persistent)
    assert make().describe()["resume"] == "replay"
    per_epoch = len(list(make()))
    assert_resume_exact(make, list(range(1, per_epoch)))


@pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True)])
def test_a_replayed_copy_that_lives_on_is_refused_inside_a_later_epoch(
    num_workers: int, persistent: bool
) -> None:
    # A fresh copy cannot be brought to the uninterrupted copy's second pass by a replay.
    make = functools.partial(_own_shuffle_loader, num_workers, persistent)
    loader = make()
    list(loader)
    it = iter(loader)
    with_errors(it, 1)
    state = loader.state_dict()
    del it
    fresh = make()
    with pytest.raises(
        StateMismatchError, match=r"different sample at position .*not of its earlier passes"
    ):
        fresh.load_state_dict(state)
        list(fresh)


def test_persistent_workers_resumed_at_epoch_0s_end_stay_exact_for_a_deterministic_stream() -> None:
    def make() -> ResumableDataLoader:
        return ResumableDataLoader(
            Jittered(), batch_size=3, num_workers=2, seed=3, persistent_workers=True
        )

    assert_resume_exact(make, [8, 9])  # 8 batches an epoch: at its end, then inside epoch 1


def test_a_stream_that_replays_differently_is_a_named_error() -> None:
    loader = ResumableDataLoader(Unseeded(), batch_size=4, seed=0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    fresh = ResumableDataLoader(Unseeded(), batch_size=4, seed=0)
    fresh.load_state_dict(state)
    with pytest.raises(
        StateMismatchError,
        match=r"different sample at position 3.*Make its order, and in the main process its draws.*"
        r"state_dict\(\)/load_state_dict\(\)",
    ):
        next(iter(fresh))


def test_a_stream_that_got_shorter_is_a_named_error() -> None:
    loader = ResumableDataLoader(Sharded(0, 20), batch_size=4, num_workers=2, seed=0)
    it = iter(loader)
    for _ in range(4):
        next(it)
    state = loader.state_dict()
    del it  # not left to the traceback's reference cycle (its workers would wait for the GC)
    fresh = ResumableDataLoader(Sharded(0, 10), batch_size=4, num_workers=2, seed=0)
    fresh.load_state_dict(state)
    with pytest.raises(
        StateMismatchError,
        match=r"worker 0's stream .* gave 5 samples and 0 errors where the saved run had 8",
    ):
        list(fresh)


def test_another_num_workers_is_a_named_error() -> None:
    loader = ResumableDataLoader(Sharded(), batch_size=4, num_workers=2, seed=0)
    next(iter(loader))
    with pytest.raises(
        StateMismatchError,
        match=r"saved with num_workers=2, this loader has num_workers=0.*resume with num_workers=2",
    ):
        ResumableDataLoader(Sharded(), batch_size=4, seed=0).load_state_dict(loader.state_dict())
    with pytest.raises(StateMismatchError, match=r"field 'batch_size' differs: saved 4, here 5"):
        ResumableDataLoader(Sharded(), batch_size=5, num_workers=2, seed=0).load_state_dict(
            loader.state_dict()
        )


def test_a_map_style_state_is_refused_by_name() -> None:
    planned = ResumableDataLoader(list(range(8)), batch_size=4, seed=0)
    next(iter(planned))
    with pytest.raises(
        StateMismatchError, match=r"missing keys .*not saved by a loader over an IterableDataset"
    ):
        ResumableDataLoader(Sharded(), batch_size=4, seed=0).load_state_dict(planned.state_dict())


def test_more_than_one_rank_is_refused_with_the_fix() -> None:
    loader = ResumableDataLoader(Sharded(), batch_size=4, rank=1, world_size=2)
    with pytest.raises(
        LoaderkitError, match=r"runs on one process, got world_size=2.*StreamingShardedDataset"
    ):
        next(iter(loader))


def test_per_sample_seeding_needs_indices() -> None:
    with pytest.raises(ValueError, match=r"per_sample_seeding=True .*Sharded.*leave it 'auto'"):
        ResumableDataLoader(Sharded(), batch_size=4, per_sample_seeding=True)


def test_inspect_names_the_resume_method() -> None:
    from loaderkit.cli.inspect import _facts

    class Module:  # what inspect asks of any LightningDataModule
        def __init__(self, dataset: Any) -> None:
            self.dataset = dataset

        def setup(self, stage: str) -> None:
            pass

        def train_dataloader(self) -> ResumableDataLoader:
            return ResumableDataLoader(self.dataset, batch_size=4)

    facts = _facts(Module(Sized()), 1, None)
    assert facts["resumable_exactly"] and "'replay'" in facts["resumable_reason"]
    assert facts["splits"]["train"]["batches_per_rank"] == 6
    assert "'state'" in _facts(Module(Positioned()), 1, None)["resumable_reason"]
    two = _facts(Module(Sized()), 2, None)
    assert not two["resumable_exactly"] and "one process" in two["resumable_reason"]


class _KeepsGivenState(IterableDataset[int]):
    """Keeps the very dict its load_state_dict is given, and counts on in it."""

    def __init__(self) -> None:
        self.state = {"i": 0}

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        if self.state["i"] >= 12:
            self.state["i"] = 0
            raise StopIteration
        self.state["i"] += 1
        return self.state["i"] - 1

    def state_dict(self) -> dict[str, int]:
        return self.state

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = state


def test_loading_a_state_leaves_the_callers_dict_as_it_was() -> None:
    # Was: the dataset was handed the caller's own dict and counted on in it, so loading
    # that dict a second time was refused by its checksum.
    loader = ResumableDataLoader(_KeepsGivenState(), batch_size=4, seed=0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    for _ in range(2):
        resumed = ResumableDataLoader(_KeepsGivenState(), batch_size=4, seed=0)
        resumed.load_state_dict(state)
        assert [b.tolist() for b in resumed] == [[4, 5, 6, 7], [8, 9, 10, 11]]


class _EpochOrdered(IterableDataset[int]):
    """Ordered by the epoch its set_epoch was given (the Hugging Face / webdataset form)."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        order = torch.randperm(8, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        return iter(order if info is None else order[info.id :: info.num_workers])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_users_dataset_set_epoch_is_not_overridden(num_workers: int) -> None:
    # Hunter 381: a new loader told the dataset its own epoch 0 at iter(), so a loop calling
    # dataset.set_epoch(e) (before or after building the loader) read epoch 0's order each time.
    def torch_order(epoch: int) -> list[int]:
        ds = _EpochOrdered()
        ds.set_epoch(epoch)
        return torch.cat(list(DataLoader(ds, batch_size=4, num_workers=num_workers))).tolist()

    for epoch in range(3):
        ds = _EpochOrdered()
        ds.set_epoch(epoch)  # then a new loader, as code written for DataLoader does
        loader = ResumableDataLoader(ds, batch_size=4, seed=0, num_workers=num_workers)
        assert torch.cat(list(loader)).tolist() == torch_order(epoch)
    ds = _EpochOrdered()
    loader = ResumableDataLoader(ds, batch_size=4, seed=0, num_workers=num_workers)
    ds.set_epoch(2)  # a loop restarting at epoch 2: the loader's epoch follows
    assert torch.cat(list(loader)).tolist() == torch_order(2) != torch_order(0)
    assert ds.epoch == 2 and torch.cat(list(loader)).tolist() == torch_order(3)


class _TwoArgEpochs(Sharded):
    def set_epoch(self, epoch: int, num_epochs: int) -> None:
        raise AssertionError("torch never calls it, nor may loaderkit")


def test_a_dataset_set_epoch_of_another_signature_is_not_called() -> None:
    # Hunter 381: loaderkit called it with the epoch alone: a bare TypeError at iter().
    loader = ResumableDataLoader(_TwoArgEpochs(0, 4), batch_size=2, seed=0)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


def test_batch_size_none_and_1_are_told_apart_on_resume() -> None:
    # Hunter 381: a state saved unbatched loaded into batch_size=1 (samples became batches
    # of one mid-run), and the message showed None as 1.
    unbatched = ResumableDataLoader(Sharded(0, 6), batch_size=None, seed=0)
    it = iter(unbatched)
    next(it)
    with pytest.raises(StateMismatchError, match=r"'batch_size' differs: saved None, here 1"):
        ResumableDataLoader(Sharded(0, 6), batch_size=1, seed=0).load_state_dict(
            unbatched.state_dict()
        )


class _PositionedEpochs(_EpochOrdered):
    """_EpochOrdered that keeps its place in state_dict() (as a datasets.IterableDataset)."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = 0

    def state_dict(self) -> dict[str, int]:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.pos = state["pos"]

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(8, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        start, self.pos = self.pos, 0
        for i in range(start, 8):
            self.pos = i + 1
            yield order[i]
        self.pos = 0  # the next pass starts over


def test_a_dataset_epoch_set_before_the_loader_resumes_in_that_epoch() -> None:
    # Review 382: resumed, the loader told the dataset its own epoch 0 (the rest of epoch 1
    # read in epoch 0's order: 9 distinct samples of 12). Review 385: a set_epoch(1) after the
    # load was ignored while the position waited, mixing two epochs' orders; it is now
    # loader.set_epoch(1) (epoch 1 from its start), as the loader's own call is.
    def build(set_before: bool) -> tuple[_PositionedEpochs, ResumableDataLoader]:
        ds = _PositionedEpochs()
        if set_before:
            ds.set_epoch(1)
        return ds, ResumableDataLoader(ds, batch_size=2, seed=0)

    _, saver = build(True)
    whole = [b.tolist() for b in build(True)[1]]
    it = iter(saver)
    head = [next(it).tolist()]
    _, resumed = build(True)
    resumed.load_state_dict(saver.state_dict())
    assert head + [b.tolist() for b in resumed] == whole
    ds, late = build(False)
    late.load_state_dict(saver.state_dict())
    ds.set_epoch(1)
    assert [b.tolist() for b in late] == whole


def test_dataset_set_epoch_after_loading_a_state_at_an_epochs_last_batch_resumes() -> None:
    # Review 386: the Hugging Face loop (ds.set_epoch(e) at each epoch's top), saved after
    # epoch 0's last batch and resumed at epoch 1, was refused as "part-way".
    def run(ds: _PositionedEpochs, loader: ResumableDataLoader, epochs: range) -> list[Any]:
        out = []
        for epoch in epochs:
            ds.set_epoch(epoch)
            out += [b.tolist() for b in loader]
        return out

    ds = _PositionedEpochs()
    whole = run(ds, ResumableDataLoader(ds, batch_size=2, seed=0), range(2))
    ds = _PositionedEpochs()
    saver = ResumableDataLoader(ds, batch_size=2, seed=0)
    it = iter(saver)
    head = [next(it).tolist() for _ in range(4)]  # epoch 0's last batch, not yet ended
    ds = _PositionedEpochs()
    resumed = ResumableDataLoader(ds, batch_size=2, seed=0)
    resumed.load_state_dict(saver.state_dict())
    assert head + run(ds, resumed, range(1, 2)) == whole


def test_a_frozen_dataset_with_set_epoch_is_read_as_dataloader_reads_it() -> None:
    # Review 382: hooking its set_epoch failed, and the dataset was refused at construction.
    @dataclasses.dataclass(frozen=True)
    class Frozen(IterableDataset[int]):
        size: int

        def set_epoch(self, epoch: int) -> None:
            pass

        def __iter__(self) -> Iterator[int]:
            return iter(range(self.size))

    loader = ResumableDataLoader(Frozen(4), batch_size=2, seed=0)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    # Review 385: unhooked, it was told the loader's epochs (1, 2, ...) over the user's own.
    told: list[int] = []

    @dataclasses.dataclass(frozen=True)
    class Told(Frozen):
        def set_epoch(self, epoch: int) -> None:
            told.append(epoch)

    loader = ResumableDataLoader(Told(4), batch_size=2, seed=0)
    for _ in range(3):
        list(loader)
    assert told == []


class _Ragged(IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return (torch.ones(1 + i % 2) for i in range(4))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_collate_failure_over_an_iterable_names_its_worker_and_batch(num_workers: int) -> None:
    # Review 395: torch's bare "stack expects ..." came with no batch or worker named.
    loader = ResumableDataLoader(_Ragged(), batch_size=2, num_workers=num_workers)
    who = "worker 0" if num_workers else "the main process"
    match = rf"collate_fn failed on the batch of 2 samples {who} read after 0 of its stream"
    with pytest.raises(RuntimeError, match=match):
        next(iter(loader))
