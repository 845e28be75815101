"""A stream loader's ``state_dict()`` is never a collective (issue 11, failure 7).

Measured before: every rank's cursors were gathered with ``all_gather_object``
inside ``state_dict()``, so a plain loop that saves on rank 0 only hung. Now
each rank publishes its cursors into the process group's store as it hands a
batch out (a ring of the last W steps, ``loaderkit/loader/_stream_ring.py``),
and ``state_dict()`` on any rank reads the peers' for its own step.

Here the store is a ``torch.distributed.HashStore`` in one process: the ring
alone (waiting for a late peer, a peer too far ahead, a timeout, a dropped
loader), and two ranks' loaders side by side whose rank-0 state resumes both
exactly. ``tests/distributed/test_gloo_loops.py`` runs the same under
real 2-process gloo.
"""

from __future__ import annotations

import gc
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist

import loaderkit.loader._stream as engine_module
from loaderkit import (
    IterableReader,
    LoaderkitError,
    ResumableDataLoader,
    StateMismatchError,
    StreamingShardedDataset,
)
from loaderkit.loader._stream_ring import (
    DEFAULT_WINDOW,
    PeerRing,
    _retired,
    flush_retired,
    ring_window,
)
from loaderkit.plan._agree import Rounds

SEED, BATCH, STEPS = 3, 2, 5
ENTRY = {"cursors": [[0, 1, [[0, 2]], 0, 0]], "next": 0}


def read_range(shard: tuple[int, int]) -> Iterator[int]:
    start, n = shard
    return iter(range(start, start + n))


def ring(store: dist.Store, rank: int, *, window: int = 4, timeout: float = 60.0) -> PeerRing:
    return PeerRing(store, namespace=7, rank=rank, world_size=2, window=window, timeout=timeout)


def entry(step: int) -> dict[str, Any]:
    return {"cursors": [[0, 1, [[0, step]], 0, 0]], "next": step % 2}


# ------------------------------------------------------------------- the ring
def test_a_peer_at_the_step_is_read_in_one_go() -> None:
    store = dist.HashStore()
    peer = ring(store, 1)
    for step in range(3):
        peer.publish(1, 0, step, entry(step))
    # Rank 0 lags two steps behind: the ring still holds its step.
    assert ring(store, 0).read(1, 0, 1, owner="t") == [None, entry(1)]
    assert ring(store, 0).read(1, 0, 2, owner="t") == [None, entry(2)]


def test_a_late_peer_is_waited_for() -> None:
    store = dist.HashStore()
    peer = ring(store, 1)
    peer.publish(1, 0, 0, entry(0))
    late = threading.Timer(0.2, lambda: peer.publish(1, 0, 1, entry(1)))
    late.start()
    try:  # the timeout only catches a hang
        assert ring(store, 0, timeout=120).read(1, 0, 1, owner="t") == [None, entry(1)]
    finally:
        late.cancel()


def test_an_entry_of_an_earlier_epoch_start_is_not_taken() -> None:
    """Round 1's step 2 sits in the slot round 2's step 2 will use: rank 0 waits for the latter."""
    store = dist.HashStore()
    peer = ring(store, 1)
    peer.publish(1, 0, 2, entry(2))
    with pytest.raises(
        LoaderkitError,
        match=r"t: waited 0 s for rank 1 to hand out step 2 of epoch 1 \(its last: step 2 of "
        r"epoch 0 \(an earlier epoch start\)\).*Iterate this loader on every rank.*"
        r"rank=0, world_size=1.*LOADERKIT_RANK_CHECK_TIMEOUT",
    ):
        ring(store, 0, timeout=0.2).read(2, 1, 2, owner="t")


def test_a_peer_that_never_gets_there_is_a_timeout_error() -> None:
    store = dist.HashStore()
    with pytest.raises(
        LoaderkitError,
        match=r"waited 0 s for rank 1 to hand out step 0 of epoch 0 \(nothing of this loader yet\)",
    ):
        ring(store, 0, timeout=0.2).read(1, 0, 0, owner="t")


def test_a_peer_more_than_the_window_ahead_is_an_error() -> None:
    store = dist.HashStore()
    peer = ring(store, 1, window=4)
    for step in range(8):
        peer.publish(1, 0, step, entry(step))
    with pytest.raises(
        LoaderkitError,
        match=r"rank 1 is already at step 7 of this loader, more than 4 steps past step 3 of "
        r"epoch 0.*dist.barrier\(\).*raise LOADERKIT_STREAM_STATE_WINDOW "
        r"\(now 4\)",
    ):
        ring(store, 0, window=4).read(1, 0, 3, owner="t")
    peer.publish(2, 1, 3, entry(3))  # its next epoch start
    with pytest.raises(LoaderkitError, match=r"rank 1 is already at a later epoch"):
        ring(store, 0, window=4).read(1, 0, 3, owner="t")


def test_ranks_in_different_epochs_at_one_epoch_start_are_an_error() -> None:
    store = dist.HashStore()
    ring(store, 1).publish(1, 3, 0, entry(0))
    with pytest.raises(
        LoaderkitError, match=r"rank 1 handed out step 0 in epoch 3, this rank in epoch 0"
    ):
        ring(store, 0).read(1, 0, 0, owner="t")


def test_a_dropped_ring_is_retired_at_the_next_safe_point() -> None:
    store = dist.HashStore()
    peer = ring(store, 1, window=4)
    peer.publish(1, 0, 0, entry(0))
    peer.retire()  # no I/O yet: a finalizer calls it
    assert store.check(["loaderkit/stream/7/1/0"])
    flush_retired(dist.HashStore())  # another store: nothing of this one is touched
    assert store.check(["loaderkit/stream/7/1/0"]) and not _retired
    peer.retire()
    flush_retired(store)
    assert not store.check(["loaderkit/stream/7/1/0"]) and not _retired
    with pytest.raises(LoaderkitError, match=r"rank 1 dropped this loader before handing out"):
        ring(store, 0, timeout=60).read(1, 0, 0, owner="t")


def test_window_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ring_window() == DEFAULT_WINDOW == 64
    monkeypatch.setenv("LOADERKIT_STREAM_STATE_WINDOW", "200")
    assert ring_window() == 200
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv("LOADERKIT_STREAM_STATE_WINDOW", bad)
        assert ring_window() == DEFAULT_WINDOW


# ------------------------------------------- two ranks' loaders, one process
class Group:
    """Two ranks' loaders in one process, sharing a store as a process group's ranks do."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, store: bool = True) -> None:
        self.store = dist.HashStore() if store else None
        self.rounds = [0, 0]

        def agree(
            owner: str, fields: Any, *, rank: int, world_size: int, epoch: int, rounds: Rounds
        ) -> int:
            self.rounds[rank] += 1  # the n-th epoch start of each rank pairs up
            if rounds.channel is None:  # a loader is named by its first round, on both ranks
                rounds.channel = self.rounds[rank]
            rounds.count = self.rounds[rank]
            return self.rounds[rank]

        monkeypatch.setattr(engine_module, "agree_across_ranks", agree)
        monkeypatch.setattr(engine_module, "group_store", lambda rank, world_size: self.store)


def dataset() -> StreamingShardedDataset:
    sizes = [7, 0, 12, 4, 9, 15, 3]
    starts = itertools.accumulate([0, *sizes[:-1]])
    shards = [(s, n) for s, n in zip(starts, sizes, strict=True)]
    return StreamingShardedDataset(shards, IterableReader(read_range), steps_per_epoch=STEPS)


def rank_loader(rank: int, num_workers: int = 0) -> ResumableDataLoader:
    return ResumableDataLoader(
        dataset(), batch_size=BATCH, seed=SEED, num_workers=num_workers, rank=rank, world_size=2
    )


def batches(dl: ResumableDataLoader) -> Iterator[list[int]]:
    """The loader's batches over epochs, starting the next epoch whenever one ends."""
    while True:
        yield from ([int(i) for i in b] for b in dl)


def uninterrupted(total: int) -> list[list[list[int]]]:
    """Each rank's batches without a store (ranks simulated: no state is read)."""
    return [list(itertools.islice(batches(rank_loader(r)), total)) for r in range(2)]


@pytest.mark.parametrize("ahead", [0, 2, 4])
def test_rank0_state_alone_resumes_every_rank_exactly(
    monkeypatch: pytest.MonkeyPatch, ahead: int
) -> None:
    """Rank 0 saves at step k while rank 1, which never calls state_dict(), is up to ``ahead``
    steps further (not past the epoch's end: a real rank waits there for rank 0 to start the
    next epoch); both resume from rank 0's state: first k + resumed == uninterrupted."""
    total = 2 * STEPS
    full = uninterrupted(total)
    for k in (1, 3, STEPS, STEPS + 2):
        Group(monkeypatch)
        dls = [rank_loader(r) for r in range(2)]
        lead = min(ahead, STEPS - ((k - 1) % STEPS + 1))
        first = [
            list(itertools.islice(batches(dls[0]), k)),
            list(itertools.islice(batches(dls[1]), k + lead)),
        ]
        state = dls[0].state_dict()  # rank 0 alone
        assert all(part is not None for part in state["ranks"])
        assert state["steps_done"] == (k - 1) % STEPS + 1
        for rank in range(2):
            resumed = rank_loader(rank)
            resumed.load_state_dict(state)
            rest = list(itertools.islice(batches(resumed), total - k))
            assert first[rank][:k] + rest == full[rank], f"rank {rank}, k={k}, lead={lead}"


def test_state_under_a_held_batch_reads_the_peers_at_the_consumers_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lightning's fetcher holds a batch (ElasticResume says how many): the state is one step
    back on this rank and so are the peers' cursors it reads."""
    total = 2 * STEPS
    full = uninterrupted(total)
    Group(monkeypatch)
    dls = [rank_loader(r) for r in range(2)]
    first = [list(itertools.islice(batches(dl), 3)) for dl in dls]
    monkeypatch.setattr(dls[0]._engine.host, "held_of", lambda run: 1)  # Lightning holds one
    state = dls[0].state_dict()
    assert state["steps_done"] == 2
    for rank in range(2):
        resumed = rank_loader(rank)
        resumed.load_state_dict(state)
        assert first[rank][:2] + list(itertools.islice(batches(resumed), total - 2)) == full[rank]


def test_states_before_an_epoch_starts_need_no_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh loader is at the start on every rank; a loaded one where its state says."""
    group = Group(monkeypatch)
    fresh = rank_loader(0).state_dict()
    assert fresh["ranks"] == [{"cursors": [None], "next": 0}] * 2
    dls = [rank_loader(r) for r in range(2)]
    for dl in dls:
        list(itertools.islice(batches(dl), 3))
    state = dls[0].state_dict()
    again = rank_loader(1)
    again.load_state_dict(state)
    assert again.state_dict() == state  # nothing moved: no read, no wait
    assert group.store is not None and group.store.num_keys() == 2 * 4  # rounds 1: steps 0-3


def test_without_a_store_each_state_holds_its_own_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    Group(monkeypatch, store=False)
    dl = rank_loader(0)
    list(itertools.islice(batches(dl), 2))
    state = dl.state_dict()
    assert state["ranks"][1] is None and state["ranks"][0] is not None
    with pytest.raises(
        StateMismatchError,
        match=r"no cursors for rank 1, only for rank\(s\) \[0\], as saved without a "
        r"torch.distributed process group\. Load each rank the state_dict\(\) it saved",
    ):
        rank_loader(1).load_state_dict(state)


def test_the_ring_stays_bounded_and_a_far_peer_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOADERKIT_STREAM_STATE_WINDOW", "2")
    group = Group(monkeypatch)
    dls = [rank_loader(r) for r in range(2)]
    list(itertools.islice(batches(dls[0]), 1))
    list(itertools.islice(batches(dls[1]), 4))
    assert group.store is not None and group.store.num_keys() == 2 * 2
    with pytest.raises(
        LoaderkitError,
        match=r"ResumableDataLoader.state_dict: rank 1 is already at step 3 of this loader, "
        r"more than 2 steps past step 1 of epoch 0",
    ):
        dls[0].state_dict()


def test_ranks_with_different_num_workers_are_refused_at_the_state_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shards are dealt by rank x workers: ranks with different worker counts read some
    shards twice. The peer's published cursors show it."""
    group = Group(monkeypatch)
    dl = rank_loader(0)
    list(itertools.islice(batches(dl), 1))
    assert group.store is not None
    peer = PeerRing(group.store, namespace=1, rank=1, world_size=2, window=64, timeout=60)
    peer.publish(1, 0, 1, {"cursors": [None, None], "next": 0})  # rank 1: 2 workers
    with pytest.raises(LoaderkitError, match=r"different num_workers \(\[1, 2\] worker slots"):
        dl.state_dict()


def test_a_loader_dropped_by_a_peer_is_an_error_not_a_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    group = Group(monkeypatch)
    dls = [rank_loader(r) for r in range(2)]
    for rank in range(2):
        list(itertools.islice(batches(dls[rank]), 2))
    del dls[1]
    gc.collect()
    # The next epoch start of any stream loader retires the dropped one's ring.
    group.rounds[0] = group.rounds[1] = 10
    other = rank_loader(1)
    list(itertools.islice(batches(other), 1))
    with pytest.raises(
        LoaderkitError,
        match=r"rank 1 dropped this loader before handing out step 2 of epoch 0.*Save the state "
        "before any rank drops the loader",
    ):
        dls[0].state_dict()


def test_a_loader_started_before_the_group_claims_no_peer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started with no group (nothing published), a group that appears later must not make
    its state pass this rank's cursors off as the others'."""
    dl = rank_loader(0)
    list(itertools.islice(batches(dl), 2))
    monkeypatch.setattr(engine_module, "group_store", lambda rank, world_size: dist.HashStore())
    state = dl.state_dict()
    assert state["ranks"][0] is not None and state["ranks"][1] is None
