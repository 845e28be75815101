"""Live iterators over one ResumableDataLoader are independent, as DataLoader's are.

``state_dict()`` is the position of the iterator that began last; it is a named
error only when an older live iterator moved after that (one position cannot
describe both). Persistent workers and streams have one set of workers or
cursors, so there a new ``iter()`` supersedes the old one (torch resets its
persistent worker iterator too).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from loaderkit import LoaderkitError, ResumableDataLoader

N, B = 20, 4


def make(num_workers: int = 0, **kwargs: Any) -> ResumableDataLoader:
    return ResumableDataLoader(
        list(range(N)), batch_size=B, shuffle=True, seed=5, num_workers=num_workers, **kwargs
    )


def ids(batches: Any) -> list[int]:
    return [int(i) for b in batches for i in torch.as_tensor(b).reshape(-1)]


def epoch(e: int) -> list[int]:
    loader = make()
    loader.set_epoch(e)
    return ids(loader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_two_live_iterators_each_yield_a_whole_epoch(num_workers: int) -> None:
    loader = make(num_workers)
    a, b = iter(loader), iter(loader)
    pairs = list(zip(a, b, strict=True))  # interleaved, as zip(loader, loader) does
    assert ids(p[0] for p in pairs) == epoch(0)
    assert ids(p[1] for p in pairs) == epoch(1)  # each iter() is the next epoch


def test_state_while_two_iterators_interleave_is_a_named_error() -> None:
    loader = make()
    a, b = iter(loader), iter(loader)
    next(a)
    next(b)  # b began last: its position is the state
    loader.state_dict()
    next(a)  # ... but a moved after b began
    with pytest.raises(
        LoaderkitError, match=r"two live iterators.*Finish or drop \(del\) the older one"
    ):
        loader.state_dict()
    del a  # dropping it removes the ambiguity
    assert loader.state_dict()["epoch"] == 1


def test_an_idle_older_iterator_leaves_the_newer_ones_state_exact() -> None:
    loader = make(2)
    old = iter(loader)
    next(old)  # e.g. a peek whose iterator is still referenced
    new = iter(loader)
    first = [next(new), next(new)]
    state = loader.state_dict()
    assert (state["epoch"], state["steps_done"]) == (1, 2)
    resumed = make(2)
    resumed.load_state_dict(state)
    assert ids(first) + ids(resumed) == epoch(1)
    assert len(list(old)) == N // B - 1  # the older one still finishes its own epoch


def test_a_finished_older_iterator_is_no_ambiguity() -> None:
    loader = make()
    old = iter(loader)
    next(old)
    new = iter(loader)
    next(new)
    list(old)  # moved after new began, but its epoch is over
    assert loader.state_dict()["steps_done"] == 1


def test_a_peek_then_a_loop_saves_the_loops_position() -> None:
    loader = make()
    next(iter(loader))  # the peek's iterator is gone at once
    it = iter(loader)
    next(it)
    assert loader.state_dict()["steps_done"] == 1


def test_load_state_dict_supersedes_every_live_iterator() -> None:
    loader = make()
    a = iter(loader)
    next(a)
    state = loader.state_dict()
    loader.load_state_dict(state)
    with pytest.raises(RuntimeError, match=r"superseded by a newer iter\(\) or load_state_dict"):
        next(a)


class Numbers(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(N))


def test_iterators_over_an_iterable_dataset_are_independent() -> None:
    loader = ResumableDataLoader(Numbers(), batch_size=B, num_workers=2)
    a, b = iter(loader), iter(loader)
    got = list(zip(a, b, strict=True))
    # Not split by worker, so each worker yields all of it: DataLoader's result, twice over.
    want = ids(DataLoader(Numbers(), batch_size=B, num_workers=2))
    assert ids(p[0] for p in got) == ids(p[1] for p in got) == want


def _closing_loader(kind: str, persistent: bool) -> ResumableDataLoader:
    from loaderkit import IterableReader, StreamingShardedDataset
    from tests.support.helpers import id_stream_shards, read_id_shard

    if kind == "plan":
        return make(2, persistent_workers=persistent)
    data: Any = Numbers()
    if kind == "stream":
        data = StreamingShardedDataset(id_stream_shards(N), IterableReader(read_id_shard))
    return ResumableDataLoader(
        data, batch_size=B, seed=5, num_workers=2, persistent_workers=persistent
    )


@pytest.mark.parametrize("kind", ["plan", "iterable", "stream"])
@pytest.mark.parametrize("persistent", [False, True])
def test_close_stops_the_workers_and_keeps_the_position(kind: str, persistent: bool) -> None:
    import multiprocessing

    def run(close: bool) -> list[list[int]]:
        loader = _closing_loader(kind, persistent)
        first = iter(loader)
        got = [next(first), next(first)]
        state = loader.state_dict()
        if close:
            before = len(multiprocessing.active_children())
            loader.close()
            assert before >= 2 and multiprocessing.active_children() == []
            with pytest.raises(RuntimeError, match=r"stopped by close\(\)"):
                next(first)
            assert loader.state_dict() == state
        del first
        resumed = _closing_loader(kind, persistent)
        resumed.load_state_dict(state)
        return [ids(b["id"] if isinstance(b, dict) else b) for b in [*got, *resumed, *loader]]

    assert run(close=True) == run(close=False)
