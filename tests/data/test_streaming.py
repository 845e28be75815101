"""StreamingShardedDataset through ResumableDataLoader: per-slot cursors, exact resume.

The oracle of a slot's stream is written here from the spec (module docstring
of ``loaderkit.data.streaming``), independently of the code: pass ``p`` orders the
shards by ``dataset.pass_order``; slot ``s`` of ``S`` reads
``order[s::S]`` front to back, or with fewer shards than slots every shard,
keeping every ``S``-th sample. Worker processes are emulated in-process
(torch's turn order: workers in turn, skipping those whose stream ended);
``test_real_workers_*`` checks the emulation against real worker processes.
"""

from __future__ import annotations

import copy
import itertools
import json
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from loaderkit import (
    IterableReader,
    LoaderkitError,
    ResumableDataLoader,
    ShardError,
    StateMismatchError,
    StreamingShardedDataset,
    TokenReader,
    write_shards,
)
from loaderkit.data.streaming import EMPTY_PASSES
from loaderkit.loader._stream import StreamEngine, _SlotBatches
from loaderkit.plan._cursor import seal
from tests.support.proptest import examples

SEED = 5
FIXTURE_HEALTH = HealthCheck.function_scoped_fixture  # the fixture only patches a class


# ----------------------------------------------------------------- the data
def read_range(shard: tuple[int, int]) -> Iterator[int]:
    """Shard ``(start, n)`` holds the sample ids ``start .. start + n - 1``."""
    start, n = shard
    return iter(range(start, start + n))


def make_shards(sizes: list[int]) -> list[tuple[int, int]]:
    starts = itertools.accumulate([0, *sizes[:-1]])
    return [(s, n) for s, n in zip(starts, sizes, strict=True)]


class CountingReader:
    """A StreamReader that records every ``iter_from`` call."""

    suffixes = ()

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, int], int]] = []

    def iter_from(self, shard: tuple[int, int], offset: int) -> Iterator[int]:
        self.calls.append((shard, offset))
        start, n = shard
        return iter(range(start + offset, start + n))


def slot_oracle(ds: StreamingShardedDataset, slot: int, slots: int, passes: int) -> list[int]:
    return list(slot_passes(ds, slot, slots, passes))


def slot_passes(
    ds: StreamingShardedDataset, slot: int, slots: int, passes: int | None = None
) -> Iterator[int]:
    """The samples slot ``slot`` reads, pass after pass (forever when ``passes`` is None)."""
    for p in itertools.count() if passes is None else range(passes):
        yield from one_pass(ds, slot, slots, p)


def late_empty_run(
    ds: StreamingShardedDataset, slot: int, slots: int, limit: int, need: int
) -> bool:
    """Whether ``slot`` meets ``limit`` passes in a row without a sample, after its first
    ``limit`` passes gave one and before it has read ``need`` samples."""
    got, empty = 0, 0
    for p in itertools.count():
        if got >= need or (p == limit and got == 0):
            return False
        n = len(one_pass(ds, slot, slots, p))
        got, empty = got + n, 0 if n else empty + 1
        if empty >= limit and p >= limit:
            return True
    return False


def interleave(runs: list[list[int]], k: int) -> list[int]:
    """K lanes over runs, as the spec says: lane j starts with run j, the lanes take turns one
    sample each, a lane whose run ends goes on with the next run not yet started, or drops
    out (the turn passes to the next lane)."""
    pending = [list(r) for r in runs]
    lanes = [pending.pop(0) for _ in range(min(k, len(pending)))]
    out, turn = [], 0
    while lanes:
        if lanes[turn]:
            out.append(lanes[turn].pop(0))
            turn = (turn + 1) % len(lanes)
        elif pending:
            lanes[turn] = pending.pop(0)
        else:
            lanes.pop(turn)
            turn = turn % len(lanes) if lanes else 0
    return out


def one_pass(ds: StreamingShardedDataset, slot: int, slots: int, p: int) -> list[int]:
    """The samples slot ``slot`` reads in pass ``p``."""
    order = ds.pass_order(SEED, p)
    if len(order) >= slots:
        runs = [list(read_range(ds.shards[shard])) for shard in order[slot::slots]]
        return interleave(runs, ds.mix_shards)
    every = interleave([list(read_range(ds.shards[shard])) for shard in order], ds.mix_shards)
    return every[slot::slots]


def test_interleave_oracle_by_hand() -> None:
    runs = [[0, 1, 2], [10], [], [20, 21], [30]]
    assert interleave(runs, 1) == [0, 1, 2, 10, 20, 21, 30]
    # Lane 1 ends run 1 first: it takes run 2 (empty), then run 3; lane 0 then takes run 4.
    assert interleave(runs, 2) == [0, 10, 1, 20, 2, 21, 30]
    assert interleave(runs, 9) == [0, 10, 20, 30, 1, 21, 2]


# ------------------------------------------------------- emulated workers
class EmulatedWorkers:
    """In-process stand-in for the inner DataLoader: each worker a copy, taking turns."""

    _iterator = None

    def __init__(self, source: _SlotBatches, workers: int) -> None:
        self.source, self.workers = source, workers

    def __iter__(self) -> Iterator[Any]:
        its = [copy.deepcopy(self.source).batches(w) for w in range(self.workers)]
        alive = [True] * self.workers
        w = 0
        while any(alive):
            if alive[w]:
                try:
                    yield next(its[w])
                except StopIteration:
                    alive[w] = False
            w = (w + 1) % self.workers


@pytest.fixture
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    def inner(self: StreamEngine, source: _SlotBatches, rotation: int) -> EmulatedWorkers:
        return EmulatedWorkers(source, self.host.pool.num_workers)

    monkeypatch.setattr(StreamEngine, "_inner_loader", inner)


def loader(ds: Any, nw: int = 0, **kw: Any) -> ResumableDataLoader:
    kw.setdefault("batch_size", 3)
    return ResumableDataLoader(ds, seed=SEED, num_workers=nw, **kw)


def ids(batch: Any) -> list[int]:
    return [int(i) for i in batch]


def take(dl: ResumableDataLoader, k: int) -> list[list[int]]:
    """The first k batches over epochs, starting a new epoch whenever one ends."""
    got: list[list[int]] = []
    it = iter(dl)
    while len(got) < k:
        try:
            got.append(ids(next(it)))
        except StopIteration:
            it = iter(dl)
    return got


def epochs(dl: ResumableDataLoader, n: int) -> list[list[list[int]]]:
    return [[ids(b) for b in dl] for _ in range(n)]


def resumed(ds: Any, state: dict[str, Any], nw: int, n: int, **kw: Any) -> list[list[int]]:
    dl = loader(ds, nw, **kw)
    dl.load_state_dict(state)
    out: list[list[int]] = []
    for _ in range(4):
        out += [ids(b) for b in dl]
        if len(out) >= n:
            break
    return out[:n]


sizes_st = st.lists(
    st.one_of(st.integers(0, 12), st.just(0), st.integers(60, 120)), min_size=1, max_size=9
)


# -------------------------------------------------------- one pass per epoch
@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sizes=sizes_st,
    nw=st.integers(0, 4),
    batch=st.integers(1, 5),
    drop=st.booleans(),
    shuffle=st.booleans(),
    mix=st.integers(1, 4),
    data=st.data(),
)
def test_pass_per_epoch_exactly_once_and_exact_resume(
    emulate: None,
    sizes: list[int],
    nw: int,
    batch: int,
    drop: bool,
    shuffle: bool,
    mix: int,
    data: Any,
) -> None:
    ds = StreamingShardedDataset(
        make_shards(sizes), IterableReader(read_range), shuffle_shards=shuffle, mix_shards=mix
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # fewer shards than slots
        try:
            dl = loader(ds, nw, batch_size=batch, drop_last=drop)
            assert dl.drop_last is drop  # as DataLoader reports it (Lightning copies it)
            full = epochs(dl, 2)
        except LoaderkitError as err:  # an epoch of no batch is an error, never silent
            assert "yielded no batch" in str(err)
            assert sum(sizes) <= (batch - 1) * max(nw, 1) * drop
            return
        assert all(full), "an empty epoch passed silently"
        for e, epoch in enumerate(full):
            seen = Counter(i for b in epoch for i in b)
            assert max(seen.values(), default=1) == 1, f"epoch {e} repeats a sample"
            lost = sum(sizes) - len(seen)
            if drop:  # only the partial tail of each slot, never a whole batch
                assert 0 <= lost <= (batch - 1) * max(nw, 1)
                assert all(len(b) == batch for b in epoch)
            else:
                assert lost == 0
            # Each slot's stream of pass e, cut into batches, appears in the epoch in order.
            slot_of = {}
            for slot in range(max(nw, 1)):
                stream = one_pass(ds, slot, max(nw, 1), e)
                chunks = [stream[i : i + batch] for i in range(0, len(stream), batch)]
                if drop and chunks and len(chunks[-1]) < batch:
                    chunks.pop()
                slot_of.update({tuple(c): slot for c in chunks})
                assert [b for b in epoch if slot_of.get(tuple(b)) == slot] == chunks
            assert len(slot_of) == len(epoch)
        flat = [b for epoch in full for b in epoch]
        if not flat:
            return
        k = data.draw(st.integers(0, len(flat)), label="resume after k batches")
        dl = loader(ds, nw, batch_size=batch, drop_last=drop)
        before = take(dl, k) if k else []
        after = resumed(ds, dl.state_dict(), nw, len(flat) - k, batch_size=batch, drop_last=drop)
    assert before + after == flat


# ------------------------------------------------------ fixed steps per epoch
@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    sizes=sizes_st,
    world=st.integers(1, 8),
    nw=st.integers(0, 4),
    batch=st.integers(1, 4),
    steps=st.integers(1, 6),
    shuffle=st.booleans(),
    mix=st.integers(1, 4),
    data=st.data(),
)
def test_steps_per_epoch_equal_steps_slot_streams_and_resume(
    emulate: None,
    sizes: list[int],
    world: int,
    nw: int,
    batch: int,
    steps: int,
    shuffle: bool,
    mix: int,
    data: Any,
) -> None:
    ds = StreamingShardedDataset(
        make_shards(sizes),
        IterableReader(read_range),
        steps_per_epoch=steps,
        shuffle_shards=shuffle,
        mix_shards=mix,
    )
    nw = min(nw, steps)  # fewer steps than workers is refused (its own test)
    workers = max(nw, 1)
    slots = world * workers
    # A slot with no sample in EMPTY_PASSES passes can never fill its turns (worker w has
    # turns iff w < steps).
    limit = EMPTY_PASSES if shuffle else 1
    starved = {
        s // workers
        for s in range(slots)
        if s % workers < steps and not slot_oracle(ds, s, slots, limit)
    }
    # A run of `limit` empty passes later on (the counter restarts each epoch) may raise or
    # not: leave those examples out rather than guess.
    need = [2 * len(range(s % workers, steps, workers)) * batch for s in range(slots)]
    assume(not any(late_empty_run(ds, s, slots, limit, need[s]) for s in range(slots)))
    per_rank = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for rank in range(world):
            dl = loader(ds, nw, batch_size=batch, rank=rank, world_size=world)
            assert len(dl) == steps
            if rank in starved:
                with pytest.raises(LoaderkitError, match=r"read no sample in (32|1) whole pass"):
                    epochs(dl, 2)
            else:
                per_rank.append(epochs(dl, 2))
    if starved:
        return
    # Every rank steps the same number of times, every batch is full.
    assert all(len(epoch) == steps for r in per_rank for epoch in r)
    assert all(len(b) == batch for r in per_rank for epoch in r for b in epoch)
    # Worker w of a rank takes the epoch's batches w, w + workers, ...; each slot's
    # batches, in order, are a prefix of its stream (no sample skipped or repeated).
    for rank, rank_epochs in enumerate(per_rank):
        for local in range(workers):
            mine = [
                i
                for epoch in rank_epochs
                for j, b in enumerate(epoch)
                if j % workers == local
                for i in b
            ]
            oracle = slot_passes(ds, rank * workers + local, slots)
            assert mine == list(itertools.islice(oracle, len(mine))), f"rank {rank} slot {local}"
    # Pass 0 of all slots together is every sample exactly once.
    pass0 = [i for s in range(slots) for i in slot_oracle(ds, s, slots, 1)]
    assert sorted(pass0) == list(range(sum(sizes)))
    # Resume every rank after k batches (the same k: DDP ranks step together).
    k = data.draw(st.integers(0, 2 * steps), label="k")
    states = []
    for rank in range(world):
        dl = loader(ds, nw, batch_size=batch, rank=rank, world_size=world)
        take(dl, k)
        states.append(dl.state_dict())
    state = copy.deepcopy(states[0])
    state["ranks"] = [s["ranks"][r] for r, s in enumerate(states)]  # what a store read builds
    seal(state)
    for rank in range(world):
        flat = [b for epoch in per_rank[rank] for b in epoch]
        after = resumed(ds, state, nw, 2 * steps - k, batch_size=batch, rank=rank, world_size=world)
        assert flat[:k] + after == flat, f"rank {rank} resumed at {k}"


# ------------------------------------------------------------ real workers
@pytest.mark.parametrize("persistent", [False, True])
def test_real_workers_match_emulation_and_resume(persistent: bool) -> None:
    ds = StreamingShardedDataset(make_shards([5, 0, 9, 3, 12, 7, 1]), IterableReader(read_range))
    kw = {"persistent_workers": persistent}
    full = epochs(loader(ds, 2, **kw), 2)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            StreamEngine,
            "_inner_loader",
            lambda self, source, rotation: EmulatedWorkers(source, 2),
        )
        assert epochs(loader(ds, 2), 2) == full
    flat = [b for e in full for b in e]
    for k in (3, len(full[0]), len(full[0]) + 2):
        dl = loader(ds, 2, **kw)
        before = take(dl, k)
        assert before + resumed(ds, dl.state_dict(), 2, len(flat) - k, **kw) == flat


def test_resume_skips_earlier_shards_without_opening_them() -> None:
    reader = CountingReader()
    ds = StreamingShardedDataset(
        make_shards([4, 4, 4, 4]), reader, shuffle_shards=False, mix_shards=1
    )
    dl = loader(ds, batch_size=3)
    take(dl, 3)  # 9 samples: shards 0, 1 and the first of shard 2
    state = dl.state_dict()
    reader.calls.clear()
    dl2 = loader(ds, batch_size=3)
    dl2.load_state_dict(state)
    rest = [i for b in dl2 for i in ids(b)]
    assert rest == list(range(9, 16))
    assert reader.calls == [((8, 4), 1), ((12, 4), 0)]  # seeks into shard 2, never 0 or 1


def test_lanes_mix_shards_in_a_batch_and_resume_seeks_each_open_shard() -> None:
    """Two lanes over five shards of 4: a batch of 2 holds one sample of each open shard;
    the state keeps a cursor per open shard, and a resume seeks into each of them (and
    opens no finished shard)."""
    reader = CountingReader()
    ds = StreamingShardedDataset(
        make_shards([4, 4, 4, 4, 4]), reader, shuffle_shards=False, mix_shards=2
    )
    dl = loader(ds, batch_size=2)
    first = take(dl, 5)
    assert first == [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12]]
    state = dl.state_dict()
    assert state["version"] == 5
    assert state["ranks"][0]["cursors"] == [[0, 4, [[2, 1], [3, 1]], 0, 10]]
    reader.calls.clear()
    dl2 = loader(ds, batch_size=2)
    dl2.load_state_dict(state)
    rest = [ids(b) for b in dl2]
    # Shard 4 is the last: once lane 1 ends shard 3 it drops out, lane 0 reads shard 4 alone.
    assert rest == [[9, 13], [10, 14], [11, 15], [16, 17], [18, 19]]
    # Seeks into the two open shards mid-way, then opens the last; never a finished one.
    assert reader.calls == [((8, 4), 1), ((12, 4), 1), ((16, 4), 0)]
    assert first + rest == [ids(b) for b in loader(ds, batch_size=2)]


def test_a_stream_state_of_loaderkit_0_1_is_refused_by_version() -> None:
    ds = StreamingShardedDataset(make_shards([4, 4]), IterableReader(read_range))
    dl = loader(ds)
    take(dl, 1)
    state = dl.state_dict()
    state["version"] = 1
    state["ranks"][0]["cursors"] = [[0, 0, 3, 3]]
    with pytest.raises(
        StateMismatchError, match=r"field 'version' is 1: the state was saved by an older"
    ):
        loader(ds).load_state_dict(state)
    state = dl.state_dict()
    with pytest.raises(StateMismatchError, match=r"field 'mix_shards' differs: saved 8, here 1"):
        loader(StreamingShardedDataset(ds.shards, ds.reader, mix_shards=1)).load_state_dict(state)


def test_token_shards_seek_by_index(tmp_path: Path) -> None:
    import numpy as np

    from loaderkit import JsonlReader, TokenReader, write_shards

    reader = TokenReader(seq_len=2)
    paths = write_shards(tmp_path / "t", [np.arange(10), np.arange(10, 16)], reader)
    ds = StreamingShardedDataset(tmp_path / "t", reader, shuffle_shards=False)
    dl = loader(ds, batch_size=2)
    got = [b[:, 0].tolist() for b in dl]
    assert got == [[0, 10], [2, 12], [4, 14], [6, 8]]  # the two shards' samples in turn
    one_at_a_time = StreamingShardedDataset(
        tmp_path / "t", reader, shuffle_shards=False, mix_shards=1
    )
    got = [b[:, 0].tolist() for b in loader(one_at_a_time, batch_size=2)]
    assert got == [[0, 2], [4, 6], [8, 10], [12, 14]]
    assert [str(p) for p in ds.shards] == [str(p) for p in paths]
    jr = JsonlReader()
    (tmp_path / "j").mkdir()
    jr.write(tmp_path / "j" / "a.jsonl", [{"i": i} for i in range(5)])  # never counted
    dl = loader(StreamingShardedDataset(tmp_path / "j", jr), batch_size=2)
    assert [b["i"].tolist() for b in dl] == [[0, 1], [2, 3], [4]]


def test_per_sample_transform_same_for_any_workers_and_after_resume(emulate: None) -> None:
    def noisy(i: int) -> torch.Tensor:
        return torch.tensor([float(i)]) + torch.rand(1)

    ds = StreamingShardedDataset(
        make_shards([6, 5, 7, 4]), IterableReader(read_range), transform=noisy, steps_per_epoch=3
    )
    runs = {}
    for nw in (0, 2):
        dl = loader(ds, nw, batch_size=2)
        runs[nw] = [b for _ in range(2) for b in dl]
    # The same samples in other batches: compare value per sample id.
    by_id = [{int(x): float(x) for b in run for x in b} for run in runs.values()]
    common = set(by_id[0]) & set(by_id[1])
    assert common and all(by_id[0][i] == by_id[1][i] for i in common)
    dl = loader(ds, 2, batch_size=2)
    take(dl, 2)
    dl2 = loader(ds, 2, batch_size=2)
    dl2.load_state_dict(dl.state_dict())
    assert torch.equal(torch.cat(list(dl2)), torch.cat(runs[2][2:3]))


def test_fewer_shards_than_slots_warns_once(emulate: None) -> None:
    ds = StreamingShardedDataset(make_shards([10]), IterableReader(read_range))
    dl = loader(ds, 3, batch_size=2)
    with pytest.warns(RuntimeWarning, match="1 shards for 3 .rank, worker. slots"):
        first = epochs(dl, 1)
    assert sorted(i for b in first[0] for i in b) == list(range(10))


# ---------------------------------------------------------------- refusals
def test_topology_change_is_refused_with_the_reason(emulate: None) -> None:
    ds = StreamingShardedDataset(make_shards([5, 5, 5, 5]), IterableReader(read_range))
    dl = loader(ds, 2)
    take(dl, 2)
    state = dl.state_dict()
    for nw in (0, 3):
        with pytest.raises(StateMismatchError, match=r"cannot be re-split.*ShardedDataset"):
            loader(ds, nw).load_state_dict(state)
    ds_l = StreamingShardedDataset(
        make_shards([5, 5, 5, 5]), IterableReader(read_range), steps_per_epoch=2
    )
    dl = loader(ds_l, rank=0, world_size=2)
    take(dl, 1)
    with pytest.raises(StateMismatchError, match=r"world_size=2.*world_size=1"):
        loader(ds_l).load_state_dict(dl.state_dict())
    with pytest.raises(StateMismatchError, match="no cursors for rank 1"):
        loader(ds_l, rank=1, world_size=2).load_state_dict(dl.state_dict())


def test_state_mismatch_and_malformed_states() -> None:
    ds = StreamingShardedDataset(make_shards([5, 5]), IterableReader(read_range))
    dl = loader(ds)
    take(dl, 1)
    state = dl.state_dict()
    with pytest.raises(StateMismatchError, match="field 'batch_size' differs: saved 3"):
        loader(ds, batch_size=2).load_state_dict(state)
    other = StreamingShardedDataset(make_shards([5, 6]), IterableReader(read_range))
    with pytest.raises(StateMismatchError, match="field 'shard_names_crc32' differs"):
        loader(other).load_state_dict(state)
    explicit = ResumableDataLoader(ds, batch_size=3, seed=SEED + 1)
    with pytest.raises(StateMismatchError, match="field 'seed' differs"):
        explicit.load_state_dict(state)
    assert state["stream"]["reader"] == "IterableReader"  # no spec(): its class, not module
    adopting = ResumableDataLoader(ds, batch_size=3)
    adopting.load_state_dict(state)
    assert adopting.seed == adopting.plan.seed == SEED  # the plan reports the seed in use
    with pytest.raises(TypeError, match="must be a dict, got list"):
        loader(ds).load_state_dict([])  # type: ignore[arg-type]
    with pytest.raises(StateMismatchError, match=r"missing keys \['ranks'\]"):
        loader(ds).load_state_dict({k: v for k, v in state.items() if k != "ranks"})
    with pytest.raises(StateMismatchError, match="not saved by a loader over a Streaming"):
        loader(ds).load_state_dict(ResumableDataLoader(list(range(4))).state_dict())
    with pytest.raises(StateMismatchError, match="upgrade loaderkit"):
        loader(ds).load_state_dict({**state, "version": 99})


def test_a_state_saved_with_another_reader_is_refused(tmp_path: Path) -> None:
    # A cursor's offsets count the saved reader's samples: with seq_len=4, offset 2 skipped
    # tokens 4-7 of the shard in silence.
    paths = write_shards(tmp_path, [np.arange(16), np.arange(100, 116)], TokenReader(seq_len=2))

    def stream(seq_len: int) -> ResumableDataLoader:
        ds = StreamingShardedDataset(paths, TokenReader(seq_len=seq_len), shuffle_shards=False)
        return ResumableDataLoader(ds, batch_size=2, seed=SEED)

    dl = stream(2)
    it = iter(dl)
    next(it)
    state, rest = dl.state_dict(), list(it)
    with pytest.raises(StateMismatchError, match=r"field 'reader' differs: saved .*'seq_len': 2"):
        stream(4).load_state_dict(state)
    same = stream(2)
    same.load_state_dict(state)
    assert [b.tolist() for b in same] == [b.tolist() for b in rest]
    stream(2).load_state_dict(json.loads(json.dumps(state)))  # a checkpoint kept as JSON
    older = copy.deepcopy(state)  # saved before the field existed: loaded as it was then
    del older["stream"]["reader"]
    seal(older)
    stream(2).load_state_dict(older)


def test_ddp_without_a_limit_is_refused_explaining_the_hang() -> None:
    ds = StreamingShardedDataset(make_shards([5, 5]), IterableReader(read_range))
    dl = loader(ds, rank=0, world_size=2)
    with pytest.raises(LoaderkitError, match=r"hang DDP.*steps_per_epoch"):
        next(iter(dl))
    with pytest.raises(LoaderkitError, match="hang DDP"):
        len(dl)


def test_fewer_steps_per_epoch_than_workers_is_refused(emulate: None) -> None:
    """Each epoch deals its steps from the first slot on: 18 of 36 samples were ever read
    with one step an epoch and two workers (shards 1, 3, 5 never)."""
    ds = StreamingShardedDataset(
        make_shards([6] * 6), IterableReader(read_range), steps_per_epoch=1
    )
    with pytest.raises(LoaderkitError, match=r"1 steps per epoch.*fewer than its 2 workers"):
        next(iter(loader(ds, nw=2)))
    assert len(take(loader(ds, nw=1), 1)) == 1


def test_numpy_epoch_limits_are_taken_as_plain_ints() -> None:
    """As ``mix_shards`` is: they were refused (a numpy int from a config or a computation)."""
    steps = StreamingShardedDataset(
        make_shards([8]), IterableReader(read_range), steps_per_epoch=np.int64(2)
    )
    assert type(steps.steps_per_epoch) is int and len(loader(steps)) == 2
    samples = StreamingShardedDataset(
        make_shards([8]), IterableReader(read_range), samples_per_epoch=np.int32(6)
    )
    assert type(samples.samples_per_epoch) is int and len(loader(samples)) == 2


def test_length() -> None:
    unsized = loader(StreamingShardedDataset(make_shards([5]), IterableReader(read_range)))
    with pytest.raises(TypeError, match=r"has no length.*steps_per_epoch"):
        len(unsized)
    by_samples = StreamingShardedDataset(
        make_shards([50]), IterableReader(read_range), samples_per_epoch=40
    )
    assert len(loader(by_samples, batch_size=4, rank=1, world_size=2)) == 5
    with pytest.raises(ValueError, match="samples_per_epoch=4 is less than one global step"):
        len(
            loader(
                by_samples_small := StreamingShardedDataset(
                    make_shards([5]), IterableReader(read_range), samples_per_epoch=4
                ),
                batch_size=4,
                rank=0,
                world_size=2,
            )
        )
    del by_samples_small


def test_read_error_names_the_shard() -> None:
    def broken(shard: tuple[int, int]) -> Iterator[int]:
        yield shard[0]
        raise OSError("truncated gzip stream")

    ds = StreamingShardedDataset(make_shards([3]), IterableReader(broken))
    with pytest.raises(  # the sample that failed, not where the read began (hunter 344)
        ShardError, match=r"reading sample 1 of shard \(0, 3\) failed with OSError: truncated"
    ):
        list(loader(ds))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"reader": object()}, TypeError, "reader must have iter_from"),
        ({"shuffle_shards": 1}, TypeError, "shuffle_shards must be a bool, got 1"),
        ({"steps_per_epoch": 2, "samples_per_epoch": 8}, ValueError, "not both"),
        ({"steps_per_epoch": 0}, ValueError, "steps_per_epoch"),
        ({"samples_per_epoch": "8"}, TypeError, "samples_per_epoch"),
        ({"transform": 3}, TypeError, "transform must be callable, got 3"),
        ({"shards": []}, ValueError, "shards is empty"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    args: dict[str, Any] = {"shards": make_shards([3]), "reader": IterableReader(read_range)}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        StreamingShardedDataset(**args)


def test_misuse_through_torch_dataloader_and_samplers() -> None:
    ds = StreamingShardedDataset(make_shards([3]), IterableReader(read_range))
    with pytest.raises(TypeError, match=r"iterate it through loaderkit.ResumableDataLoader"):
        list(torch.utils.data.DataLoader(ds))
    with pytest.raises(ValueError, match="takes no sampler, batch_sampler or shuffle"):
        ResumableDataLoader(ds, shuffle=True)
    with pytest.raises(TypeError, match="fn must be callable"):
        IterableReader(3)  # type: ignore[arg-type]


def test_a_pass_ending_exactly_at_a_batch_boundary_is_not_starvation() -> None:
    """Regression: the cursor at the very end of a pass (the last batch ended with the
    last shard) used to count the empty rest of that pass as a starved pass."""
    ds = StreamingShardedDataset(
        make_shards([8]), IterableReader(read_range), shuffle_shards=False, steps_per_epoch=2
    )
    dl = loader(ds, batch_size=4)
    assert epochs(dl, 3) == [[[0, 1, 2, 3], [4, 5, 6, 7]]] * 3
    resumed_dl = loader(ds, batch_size=4)
    resumed_dl.load_state_dict(dl.state_dict())
    assert [ids(b) for b in resumed_dl] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_persistent_workers_survive_epochs_taken_to_their_length() -> None:
    """Lightning takes len() batches and never asks for the end of a sized epoch: the
    persistent workers, idle at the next epoch's cursors, are kept."""
    ds = StreamingShardedDataset(
        make_shards([9, 7, 11, 5]), IterableReader(read_range), steps_per_epoch=3
    )
    dl = loader(ds, 2, batch_size=2, persistent_workers=True)
    inners, got = [], []
    for _ in range(3):
        it = iter(dl)
        got.append([ids(next(it)) for _ in range(len(dl))])
        inners.append(dl._engine._inner)
        del it
    assert inners[0] is not None and all(i is inners[0] for i in inners)
    assert got == epochs(loader(ds, 2, batch_size=2), 3)  # the same batches as fresh workers


def test_a_slot_first_served_after_a_cut_epoch_begins_at_its_first_pass() -> None:
    # Epoch 0 stopped after one batch, so slot 1 had no turn in it: it began at pass 1 while
    # slot 0 was in pass 0 (both read one shard; 4 of its samples twice, 3 never).
    ds = StreamingShardedDataset(
        make_shards([8, 10, 8, 10]), IterableReader(read_range), steps_per_epoch=4
    )
    dl = loader(ds, 2, batch_size=2)
    it = iter(dl)
    head = ids(next(it))
    del it
    cut = head + [i for _ in range(3) for b in dl for i in ids(b)]
    whole = [i for batches in epochs(loader(ds, 2, batch_size=2), 3) for b in batches for i in b]
    # Slot 0 goes on ([8, 26] then [9, 27]); slot 1's first batch is its first pass's.
    assert head == whole[:2] and cut[4:6] == whole[2:4]
    assert len(set(cut[:18])) == len(set(whole[:18]))  # 14 of 18 were distinct, for 17


def test_a_stream_resumes_after_its_shard_folder_moved(tmp_path: Path) -> None:
    """Checkpoints name shards by file name, not path: copied to local scratch, they resume."""
    import shutil

    import numpy as np

    from loaderkit import TokenReader, write_shards

    reader = TokenReader(seq_len=2)
    write_shards(tmp_path / "a", [np.arange(10), np.arange(10, 16)], reader)
    dl = loader(StreamingShardedDataset(tmp_path / "a", reader, shuffle_shards=False), batch_size=2)
    it = iter(dl)
    next(it), next(it)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    moved = loader(
        StreamingShardedDataset(tmp_path / "b", reader, shuffle_shards=False), batch_size=2
    )
    moved.load_state_dict(dl.state_dict())
    assert [b[:, 0].tolist() for b in moved] == [[4, 14], [6, 8]]  # after [0, 10], [2, 12]


def test_a_stream_state_over_shards_rewritten_since_is_refused(tmp_path: Path) -> None:
    """A cursor is an offset into its shard: one rewritten with another size (or, at a URL,
    in another version) would go on at that offset in other data."""
    import numpy as np

    from loaderkit import TokenReader, write_shards

    reader = TokenReader(seq_len=2)
    write_shards(tmp_path, [np.arange(20), np.arange(20, 26)], reader)
    dl = loader(StreamingShardedDataset(tmp_path, reader, shuffle_shards=False), batch_size=2)
    next(iter(dl))
    state = dl.state_dict()
    write_shards(tmp_path, [np.arange(100, 110), np.arange(20, 26)], reader)  # shard 0 shrank
    again = loader(StreamingShardedDataset(tmp_path, reader, shuffle_shards=False), batch_size=2)
    with pytest.raises(StateMismatchError, match=r"field 'shard_bytes_crc32' differs"):
        again.load_state_dict(state)
    # The same files listed in another order: named by their names, with the fix (hunter 302).
    files = sorted(tmp_path.glob("*.npy"))[::-1]
    turned = loader(StreamingShardedDataset(files, reader, shuffle_shards=False), batch_size=2)
    with pytest.raises(StateMismatchError, match=r"'shard_names_crc32' differs.*same order"):
        turned.load_state_dict(state)
    older = copy.deepcopy(state)  # saved before the field existed: loaded as it was then
    del older["stream"]["shard_bytes_crc32"]
    seal(older)
    fresh = loader(StreamingShardedDataset(tmp_path, reader, shuffle_shards=False), batch_size=2)
    fresh.load_state_dict(older)


@pytest.mark.parametrize("nw", [0, 2])
@pytest.mark.parametrize("grown", [True, False])
def test_a_shard_rewritten_between_epochs_is_refused_not_read_anew(
    tmp_path: Path, nw: int, grown: bool
) -> None:
    """Epoch 1 read the rewritten shard: 8 samples, then 24 (a map-style dataset refuses it)."""
    import os

    import numpy as np

    from loaderkit import ShardChangedError, TokenReader, write_shards

    reader = TokenReader(seq_len=2)
    paths = write_shards(tmp_path, [np.arange(8), np.arange(100, 108)], reader, progress=False)
    dl = loader(StreamingShardedDataset(tmp_path, reader), nw, batch_size=2)
    assert sorted(int(s[0]) for b in dl for s in b) == [0, 2, 4, 6, 100, 102, 104, 106]
    st = paths[1].stat()
    np.save(paths[1], np.arange(100, 140) if grown else np.arange(200, 208))
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns + (0 if grown else 10**9)))
    with pytest.raises(ShardChangedError, match=r"shard-00001.npy' changed after the dataset "):
        list(dl)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_dtype_header_rewritten_under_a_stream_is_refused(
    tmp_path: Path, compression: str | None
) -> None:
    """Measured before: shards with a hand-written ``<u2`` header, rewritten as ``<i2``,
    resumed reading token 40004 as -25532 (the stream kept no pin of the header)."""
    from loaderkit import ShardChangedError

    if compression:
        zstd = pytest.importorskip("zstandard")
    for k in range(2):
        raw = np.arange(40_000 + 100 * k, 40_016 + 100 * k, dtype=np.uint16).tobytes()
        name = f"s{k}.bin"
        if compression:
            (tmp_path / (name + ".zst")).write_bytes(zstd.ZstdCompressor().compress(raw))
        else:
            (tmp_path / name).write_bytes(raw)
        (tmp_path / (name + ".lkdtype")).write_text("<u2")
    reader = TokenReader(seq_len=4, out_dtype=None)

    def make() -> ResumableDataLoader:
        ds = StreamingShardedDataset(tmp_path, reader, samples_per_epoch=4, shuffle_shards=False)
        return loader(ds, batch_size=2)

    dl = make()
    assert next(iter(dl))[:, 0].tolist() == [40_000, 40_100]
    state = dl.state_dict()
    for k in range(2):
        (tmp_path / f"s{k}.bin.lkdtype").write_text("<i2")
    with pytest.raises(StateMismatchError, match=r"field 'dtype_headers_crc32' differs"):
        make().load_state_dict(state)
    # Headers added that agree with the dtype= it was read in change no token (review 315).
    bare = tmp_path / "bare"
    bare.mkdir()
    np.arange(16, dtype=np.uint16).tofile(bare / "s.bin")
    typed = TokenReader(seq_len=4, dtype=np.uint16)
    saved = loader(StreamingShardedDataset(bare, typed), batch_size=1)
    next(iter(saved))
    (bare / "s.bin.lkdtype").write_text("<u2")
    loader(StreamingShardedDataset(bare, typed), batch_size=1).load_state_dict(saved.state_dict())
    if not compression:  # a decoded copy keeps the header it was decoded with
        with pytest.raises(ShardChangedError, match=r"reads as <i2 tokens, listed as <u2"):
            list(itertools.islice(iter(dl), 4))  # the next epoch opens the shards again


@pytest.mark.parametrize("suffixes", [".gz", b".gz", ["gz"], [".gz", 3], 5])
def test_iterable_reader_suffixes_must_be_a_list_of_dot_suffixes(suffixes: Any) -> None:
    """A str would be split into its letters and list every file ending in "g" or "z"."""
    with pytest.raises(TypeError, match="suffixes must be a list of suffixes"):
        IterableReader(read_range, suffixes=suffixes)
    assert IterableReader(read_range, suffixes=[".gz"]).suffixes == (".gz",)


def test_a_stream_readers_suffixes_as_one_str_are_refused(tmp_path: Path) -> None:
    reader = CountingReader()
    reader.suffixes = ".jsonl"  # type: ignore[assignment]
    with pytest.raises(TypeError, match=r"reader\.suffixes must be a list"):
        StreamingShardedDataset(tmp_path, reader)


def test_shards_without_a_sample_are_an_error_not_an_empty_epoch() -> None:
    ds = StreamingShardedDataset(make_shards([0, 0, 0]), IterableReader(read_range))
    with pytest.raises(LoaderkitError, match=r"epoch 0 yielded no batch: its 3 shard"):
        list(loader(ds, 0, batch_size=2))
    short = StreamingShardedDataset(make_shards([1, 1]), IterableReader(read_range))
    with pytest.raises(LoaderkitError, match=r"each of the 2 worker slot\(s\) got fewer than "):
        list(loader(short, 2, batch_size=2, drop_last=True))


class _OwnIter(StreamingShardedDataset):
    def __iter__(self) -> Iterator[Any]:  # a filter the loader would never call
        return (s for s in super().__iter__() if int(s) % 2)


def test_a_subclass_overriding_iter_is_refused_by_the_loader() -> None:
    # Was: the loader read the shards itself, the subclass's filter silently skipped.
    ds = _OwnIter(make_shards([4, 4]), IterableReader(read_range))
    with pytest.raises(
        TypeError, match=r"_OwnIter overrides __iter__.*pass transform=, or filter in the reader"
    ):
        ResumableDataLoader(ds, batch_size=2)


class _OwnReadFrom(StreamingShardedDataset):
    def read_from(self, shard: int, offset: int) -> Iterator[Any]:  # filtered: offsets shift
        return (s for s in super().read_from(shard, offset) if int(s) % 2)


def test_a_subclass_overriding_read_from_is_refused_by_the_loader() -> None:
    # Hunt 371: a resume read the saved count of filtered samples as a raw offset: repeated.
    ds = _OwnReadFrom(make_shards([4, 4]), IterableReader(read_range))
    with pytest.raises(TypeError, match=r"_OwnReadFrom overrides read_from, whose offsets count"):
        ResumableDataLoader(ds, batch_size=2)


class _Part:
    """A shard object with the default repr (its address, which differs in every process)."""

    def __init__(self, start: int, n: int) -> None:
        self.start, self.n = start, n


def _read_part(part: _Part) -> Iterator[int]:
    return iter(range(part.start, part.start + part.n))


def test_a_stream_over_objects_with_the_default_repr_resumes_over_equal_ones() -> None:
    # Hunt 376: their names were checked by repr, an address, so no new process (nor fresh
    # objects here) could resume the state: "'shard_names_crc32' differs".
    def build(first: int = 0) -> ResumableDataLoader:
        parts = [_Part(first, 5), _Part(5, 4), _Part(9, 6)]
        stream = StreamingShardedDataset(parts, IterableReader(_read_part), shuffle_shards=False)
        return ResumableDataLoader(stream, batch_size=2)

    saver, whole = build(), [int(x) for b in build() for x in b]
    it = iter(saver)
    head = [int(x) for _ in range(3) for x in next(it)]
    resumed = build()
    resumed.load_state_dict(saver.state_dict())
    assert head + [int(x) for b in resumed for x in b] == whole
    with pytest.raises(StateMismatchError, match=r"'shard_names_crc32' differs"):
        build(first=100).load_state_dict(saver.state_dict())  # other shards (review 378)


def test_a_dtype_given_on_resume_over_npy_shards_is_named_as_the_readers(tmp_path: Path) -> None:
    # Hunter 390: the refusal blamed ".lkdtype headers changed since the save" where the
    # folder has none: the reader's dtype= was spelled out on resume.
    write_shards(tmp_path, [np.arange(n * 4, dtype=np.int32) for n in (5, 3)], TokenReader(4))
    first = ResumableDataLoader(StreamingShardedDataset(tmp_path, TokenReader(4)), batch_size=4)
    next(iter(first))
    state = first.state_dict()
    again = StreamingShardedDataset(tmp_path, TokenReader(4, dtype=np.int32))
    with pytest.raises(StateMismatchError, match=r"\.lkdtype headers, or the reader's dtype="):
        ResumableDataLoader(again, batch_size=4).load_state_dict(state)


def test_a_shard_past_the_seeding_keys_offset_bits_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hunter 394: at 2**40 samples a shard's key spilled into the next shard's bits, so two
    # samples drew the same augmentation. The bound is lowered here to read past it cheaply.
    import loaderkit.data.streaming as streaming

    monkeypatch.setattr(streaming, "_OFFSET_BITS", 3)
    write_shards(tmp_path, [np.arange(12, dtype=np.int32)], TokenReader(1))
    loader = ResumableDataLoader(StreamingShardedDataset(tmp_path, TokenReader(1)), batch_size=4)
    with pytest.raises(ShardError, match=r"holds more than 2\*\*3 samples.*split it"):
        list(loader)
