"""State integrity: a state carries a per-field checksum; any edit is refused, naming the field.

Measured before the checksum: a hand-edited position off a batch boundary
yielded 119 ids for 100 samples, an edited ``steps_done`` made ``len()``
disagree with what the epoch yields, and a stream cursor past a shard's end
silently dropped 100 of 177 samples. Each is shown here to have been silent
(the data would be wrong) and to be refused now.
"""

from __future__ import annotations

import collections
import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import (
    IterableReader,
    PlanBatchSampler,
    ResumableDataLoader,
    SamplePlan,
    ShardError,
    StateMismatchError,
    StreamingShardedDataset,
)
from loaderkit.plan._cursor import STATE_VERSION, field_digest, seal
from tests.reliability._cases import ids, read_range

N, B = 100, 7


def planned(**kwargs: Any) -> ResumableDataLoader:
    kwargs.setdefault("shuffle", True)
    return ResumableDataLoader(list(range(N)), batch_size=B, seed=3, **kwargs)


def after(loader: ResumableDataLoader, k: int) -> dict[str, Any]:
    it = iter(loader)
    for _ in range(k):
        next(it)
    return loader.state_dict()


def test_every_state_carries_a_checksum_of_every_field() -> None:
    st = after(planned(), 3)
    assert st["version"] == STATE_VERSION == 5
    assert sorted(st["checksum"]) == sorted(k for k in st if k != "checksum")
    for name, digest in st["checksum"].items():
        assert digest == field_digest(name, st[name])


def test_a_state_survives_json_and_torch_save_round_trips(tmp_path: Path) -> None:
    loader = planned()
    st = after(loader, 3)
    through_json = json.loads(json.dumps(st))
    torch.save(st, tmp_path / "s.pt")
    through_torch = torch.load(tmp_path / "s.pt", weights_only=True)
    full = ids(planned())
    for saved in (through_json, through_torch):
        resumed = planned()
        resumed.load_state_dict(saved)
        assert ids(list(iter(planned()))[:3]) + ids(resumed) == full


@pytest.mark.parametrize(
    ("field", "value"),
    [("epoch", 1), ("position", 25), ("steps_done", 2), ("version", 1)],
)
def test_each_edited_field_is_named(field: str, value: Any) -> None:
    st = after(planned(), 3)
    edited = {**st, field: value}
    pattern = f"field '{field}'" if field != "version" else "field 'version' is 1"
    with pytest.raises(StateMismatchError, match=pattern):
        planned().load_state_dict(edited)


def test_position_off_a_batch_boundary_was_silent_and_is_refused() -> None:
    st = after(planned(), 3)  # position 21
    edited = {**st, "position": 24}
    # What the loader would have yielded without the checksum (the same edit, resealed):
    # the rest of the epoch from 24 overlaps nothing and skips 21..23 of the order.
    resumed = planned()
    resumed.load_state_dict(seal(copy.deepcopy(edited)))
    seen = ids(list(iter(planned()))[:3]) + ids(resumed)
    assert (len(seen), len(set(seen))) == (97, 97)  # 3 samples lost, silently
    with pytest.raises(StateMismatchError, match=r"field 'position' does not match .*value 24"):
        planned().load_state_dict(edited)


def test_edited_steps_done_was_a_wrong_len_and_is_refused() -> None:
    st = after(planned(), 3)
    wrong = planned()
    wrong.load_state_dict(seal({**st, "steps_done": 9}))
    claimed = len(wrong)
    batches = list(wrong)
    # The epoch has 15 batches (3 done + 12 left); len() claimed 9 + 12 = 21.
    assert (len(planned()), len(batches), claimed) == (15, 12, 21)
    with pytest.raises(StateMismatchError, match=r"field 'steps_done' does not match .*value 9"):
        planned().load_state_dict({**st, "steps_done": 9})


def test_sampler_states_are_sealed_too() -> None:
    sampler = PlanBatchSampler(SamplePlan(num_samples=N, batch_size=B, shuffle=True), rank=0)
    it = iter(sampler)
    next(it)
    st = sampler.state_dict()
    again = PlanBatchSampler(SamplePlan(num_samples=N, batch_size=B, shuffle=True), rank=0)
    again.load_state_dict(st)
    with pytest.raises(StateMismatchError, match="field 'position' does not match"):
        again.load_state_dict({**st, "position": 3})


# ------------------------------------------------------------------- streams
SHARDS = [(0, 100), (100, 77)]  # 177 samples


def stream() -> ResumableDataLoader:
    # One shard at a time (mix_shards=1): the stream reads 0..176 in order.
    ds = StreamingShardedDataset(
        SHARDS, IterableReader(read_range), shuffle_shards=False, mix_shards=1
    )
    return ResumableDataLoader(ds, batch_size=10, seed=0)


def test_stream_states_are_sealed_and_round_trip() -> None:
    loader = stream()
    first = ids(list(iter(loader))[:0])
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    st = loader.state_dict()
    assert sorted(st["checksum"]) == sorted(k for k in st if k != "checksum")
    resumed = stream()
    resumed.load_state_dict(json.loads(json.dumps(st)))
    assert first + ids(head) + ids(resumed) == list(range(177))


def test_stream_cursor_past_a_shard_end_was_silent_and_is_refused() -> None:
    loader = stream()
    it = iter(loader)
    next(it)
    st = loader.state_dict()
    cursor = st["ranks"][0]["cursors"][0]
    assert cursor[:3] == [0, 1, [[0, 10]]]  # pass 0, next shard 1, shard 0 open at 10
    edited = copy.deepcopy(st)
    edited["ranks"][0]["cursors"][0] = [0, 1, [[0, 200]], 0, 200]  # past the shard's 100
    with pytest.raises(StateMismatchError, match="field 'ranks' does not match"):
        stream().load_state_dict(edited)
    # Resealed (or a shard that shrank since the save): reading stops with the file named,
    # where before 100 - 10 samples of the first shard were dropped without a word.
    resumed = stream()
    resumed.load_state_dict(seal(edited))
    with pytest.raises(
        ShardError, match=r"holds 100 samples, but the cursor resumes it at sample 200"
    ):
        list(resumed)


def test_a_stream_shard_that_shrank_since_the_save_is_refused_at_the_load(tmp_path: Path) -> None:
    from loaderkit import JsonlReader, write_shards

    paths = write_shards(tmp_path, [[{"i": i} for i in range(30)], [{"i": 99}]], JsonlReader())
    ds = StreamingShardedDataset(paths, JsonlReader(), shuffle_shards=False, mix_shards=1)
    loader = ResumableDataLoader(ds, batch_size=4, seed=0)
    it = iter(loader)
    for _ in range(5):
        next(it)  # cursor at sample 20 of shard 0
    st = loader.state_dict()
    write_shards(tmp_path, [[{"i": i} for i in range(12)], [{"i": 99}]], JsonlReader())
    resumed = ResumableDataLoader(
        StreamingShardedDataset(paths, JsonlReader(), shuffle_shards=False, mix_shards=1),
        batch_size=4,
        seed=0,
    )
    with pytest.raises(StateMismatchError, match=r"field 'shard_bytes_crc32' differs"):
        resumed.load_state_dict(st)  # refused at the load: the shard's size changed


class _OwnState(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Shards of 4 ids whose state is ``{shard: offset}`` plus whatever ``extra`` holds."""

    def __init__(self, extra: Any = None) -> None:
        self.offsets: dict[int, int] = {}
        self.extra = extra

    def __iter__(self) -> Any:
        for shard in range(3):
            for i in range(self.offsets.get(shard, 0), 4):
                self.offsets[shard] = i + 1
                yield shard * 100 + i
        self.offsets = {}

    def state_dict(self) -> dict[str, Any]:
        return {"offsets": dict(self.offsets), "extra": self.extra}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.offsets = dict(state["offsets"])


def _own_state_after(batches: int, extra: Any = None) -> dict[str, Any]:
    loader = ResumableDataLoader(_OwnState(extra), batch_size=2, seed=0)
    it = iter(loader)
    for _ in range(batches):
        next(it)
    return loader.state_dict()


def test_a_datasets_state_json_changed_is_refused() -> None:
    # JSON made its int keys strings and the checksum (JSON text) did not see it: the
    # dataset restarted its shards, 3 batches trained twice (hunt 368).
    state = json.loads(json.dumps(_own_state_after(3)))
    with pytest.raises(StateMismatchError, match="field 'workers' does not match"):
        ResumableDataLoader(_OwnState(), batch_size=2, seed=0).load_state_dict(state)


@pytest.mark.parametrize(
    "extra",
    [
        {"b", "a", "c"},  # its order follows the process's string hashing
        torch.Generator().manual_seed(1),  # its repr and pickle held addresses
        {(0, 1): 2, "epoch": 1, 3: 4},  # tuple and mixed keys crashed state_dict()
    ],
    ids=["set", "generator", "keys"],
)
def test_a_datasets_own_state_checks_by_value_through_copies(extra: Any, tmp_path: Path) -> None:
    state = _own_state_after(3, extra)
    torch.save(state, tmp_path / "s.pt")
    for copied in (copy.deepcopy(state), torch.load(tmp_path / "s.pt", weights_only=False)):
        resumed = ResumableDataLoader(_OwnState(), batch_size=2, seed=0)
        resumed.load_state_dict(copied)
        assert [b.tolist() for b in resumed] == [[102, 103], [200, 201], [202, 203]]
    edited = copy.deepcopy(state)
    edited["workers"][0]["dataset_state"]["extra"] = None
    with pytest.raises(StateMismatchError, match="field 'workers' does not match"):
        ResumableDataLoader(_OwnState(), batch_size=2, seed=0).load_state_dict(edited)


def test_a_set_digests_alike_under_any_string_hashing() -> None:
    import subprocess
    import sys

    code = (
        "from loaderkit.plan._cursor import field_digest; print(field_digest('f', {'b','a','c'}))"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**__import__("os").environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in (1, 2, 3)
    }
    assert len(outs) == 1


def test_a_state_sealed_before_the_value_checksum_still_loads() -> None:
    # States of 0.1 digested a dataset's state as JSON with repr() for the rest.
    state = _own_state_after(3, {0: 1})
    state["checksum"]["workers"] = field_digest("workers", state["workers"], legacy=True)
    assert state["checksum"]["workers"] != field_digest("workers", state["workers"])
    resumed = ResumableDataLoader(_OwnState(), batch_size=2, seed=0)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [[102, 103], [200, 201], [202, 203]]


def test_a_class_saved_under_its_scripts_module_name_loads_where_imported() -> None:
    # Saved by `python train.py` ("__main__.X"), resumed by a script importing train
    # ("train.X"): refused as another dataset or sampler (hunt 368).
    state = _own_state_after(3)
    state["iterable"]["dataset"] = state["iterable"]["dataset"].replace(__name__, "__main__")
    resumed = ResumableDataLoader(_OwnState(), batch_size=2, seed=0)
    resumed.load_state_dict(seal(state))
    assert [b.tolist() for b in resumed] == [[102, 103], [200, 201], [202, 203]]
    state["iterable"]["dataset"] = "__main__.Other"
    with pytest.raises(StateMismatchError, match="field 'dataset' differs"):
        resumed.load_state_dict(seal(state))

    def sampler() -> Any:
        return torch.utils.data.RandomSampler(range(8), generator=torch.Generator().manual_seed(0))

    loader = ResumableDataLoader(list(range(8)), sampler=sampler(), batch_size=2)
    it = iter(loader)
    next(it)
    saved = loader.state_dict()
    assert saved["plan"]["sampler"] == "torch.utils.data.sampler.RandomSampler"
    saved["plan"]["sampler"] = "__main__.RandomSampler"
    again = ResumableDataLoader(list(range(8)), sampler=sampler(), batch_size=2)
    again.load_state_dict(seal(saved))


@pytest.mark.parametrize(
    ("before", "after"),
    [(b"rng-A", b"rng-B"), (np.int64(12), np.int64(99)), (collections.deque([1]), [2])],
    ids=["bytes", "numpy", "deque"],
)
def test_an_edit_inside_a_datasets_own_state_is_refused(before: Any, after: Any) -> None:
    # Review 370: bytes (and numpy scalars, kept as bytes) unpacked into themselves until a
    # depth cut, so every value digested alike; a deque's items were left out.
    state = _own_state_after(3, before)
    if isinstance(before, collections.deque):
        after = collections.deque(after)
    state["workers"][0]["dataset_state"]["extra"] = after
    with pytest.raises(StateMismatchError, match="field 'workers' does not match"):
        ResumableDataLoader(_OwnState(), batch_size=2, seed=0).load_state_dict(state)


def test_a_datasets_state_holding_itself_round_trips() -> None:
    # Review 372: a cycle (a tree's parent links) is digested as a reference back, as
    # pickle keeps it, not refused; an edit inside is still seen.
    looped: dict[str, Any] = {"n": 1}
    looped["self"] = looped
    state = _own_state_after(3, looped)
    resumed = ResumableDataLoader(_OwnState(), batch_size=2, seed=0)
    resumed.load_state_dict(copy.deepcopy(state))
    assert [b.tolist() for b in resumed] == [[102, 103], [200, 201], [202, 203]]
    state["workers"][0]["dataset_state"]["extra"]["n"] = 2
    with pytest.raises(StateMismatchError, match="field 'workers' does not match"):
        ResumableDataLoader(_OwnState(), batch_size=2, seed=0).load_state_dict(state)
