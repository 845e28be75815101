"""The worker transport: batches cross from workers through reused shared-memory slots.

Checked against torch's own path (``_slots.ENABLED = False``): the same batches
(values, dtypes, shapes, container types) for any batch structure, any
num_workers, persistent or not; a worker that dies mid-batch is still named
with its sample indices; nothing is left in ``/dev/shm`` or mapped in this
process once the loader is gone, even after a worker was killed.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import Dataset

from loaderkit import (
    IterableReader,
    ResumableDataLoader,
    StreamingShardedDataset,
    TensorDataset,
    WorkerError,
)
from loaderkit.loader import _slots, resumable
from tests.support.proptest import examples

N = 12
B = 4


class Pair(NamedTuple):
    first: Any
    second: Any


@dataclass
class Box:
    first: Any
    second: Any


DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
]


def build(spec: Any, base: int) -> Any:
    """The batch structure ``spec`` describes, its values keyed by ``base``."""
    kind = spec[0]
    if kind == "tensor":
        _, dtype, shape, layout = spec
        count = 1
        for size in shape:
            count *= size
        if layout == "scalar":
            return torch.tensor(base % 7, dtype=torch.float64).to(dtype)
        values = torch.arange(base, base + 2 * count, dtype=torch.float64) % 11 - 3
        if dtype is torch.bool:
            values = values > 0
        tensor = values.to(dtype)
        if layout == "strided":  # every other element: a non-contiguous view
            return tensor[::2].view(*shape) if count else tensor[:0].view(*shape)
        if layout == "transposed" and len(shape) == 2:
            return tensor[:count].view(shape[1], shape[0]).t()
        return tensor[:count].view(*shape)
    if kind == "str":
        return f"batch-{base}"
    if kind == "int":
        return base
    if kind == "none":
        return None
    children = [build(child, base + i) for i, child in enumerate(spec[1])]
    if kind == "dict":
        return {f"k{i}": child for i, child in enumerate(children)}
    if kind == "tuple":
        return tuple(children)
    if kind == "list":
        return children
    if kind == "pair":
        return Pair(*children)
    if kind == "box":
        return Box(*children)
    raise AssertionError(kind)


def collate_spec(spec: Any, samples: list[int]) -> Any:
    """A module-level collate_fn (it pickles): the batch ``spec`` keyed by its samples."""
    return {"ids": torch.tensor(samples), "body": build(spec, sum(samples))}


class Ids(Dataset[int]):
    def __init__(self, n: int = N) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def assert_identical(got: Any, want: Any, where: str = "batch") -> None:
    assert type(got) is type(want), f"{where}: {type(got)} != {type(want)}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert torch.equal(got, want), f"{where}: {got} != {want}"
        # Strides too (torch's path keeps them), over the dimensions that have any.
        sized = [d for d in range(want.dim()) if want.shape[d] > 1]
        assert [got.stride(d) for d in sized] == [want.stride(d) for d in sized], where
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for key in want:
            assert_identical(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_identical(g, w, f"{where}[{i}]")
    elif is_dataclass(want):
        for f in fields(want):
            assert_identical(getattr(got, f.name), getattr(want, f.name), f"{where}.{f.name}")
    else:
        assert got == want, where


def run(spec: Any, num_workers: int, persistent: bool, slots: bool) -> tuple[list[Any], Any]:
    _slots.ENABLED = slots
    try:
        loader = ResumableDataLoader(
            Ids(),
            batch_size=B,
            shuffle=True,
            seed=3,
            num_workers=num_workers,
            persistent_workers=persistent and num_workers > 0,
            collate_fn=functools.partial(collate_spec, spec),
        )
        epochs = 2 if persistent else 1
        batches = [batch for _ in range(epochs) for batch in loader]
        return batches, loader.describe()["transport"]
    finally:
        _slots.ENABLED = True


# ------------------------------------------------------------- batch structures
SHAPES = st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple)
TENSORS = st.tuples(
    st.just("tensor"),
    st.sampled_from(DTYPES),
    SHAPES,
    st.sampled_from(["contiguous", "strided", "transposed", "scalar"]),
)
LEAVES = TENSORS | st.sampled_from([("str",), ("int",), ("none",)])
STRUCTURES = st.recursive(
    LEAVES,
    lambda children: (
        st.tuples(st.sampled_from(["dict", "tuple", "list"]), st.lists(children, max_size=3))
        | st.tuples(st.sampled_from(["pair", "box"]), st.lists(children, min_size=2, max_size=2))
    ),
    max_leaves=6,
)


@settings(
    max_examples=examples(4),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(spec=STRUCTURES, num_workers=st.integers(0, 4), persistent=st.booleans())
def test_slots_give_the_batches_of_torchs_path(
    spec: Any, num_workers: int, persistent: bool
) -> None:
    want, _ = run(spec, num_workers, persistent, slots=False)
    got, transport = run(spec, num_workers, persistent, slots=True)
    assert len(got) == len(want) == (2 if persistent else 1) * (N // B)
    assert_identical(got, want)
    if num_workers > 0:
        # Batches holding a non-contiguous tensor take torch's path (it keeps strides).
        assert transport["slot_batches"] + transport["torch_path_batches"] == len(got)
        assert set(transport["torch_path_reasons"]) <= {NON_CONTIGUOUS}, transport


def test_a_fixed_rich_structure_with_every_worker_count() -> None:
    spec = (
        "dict",
        [
            ("tensor", torch.float16, (3, 2), "contiguous"),
            ("pair", [("tensor", torch.bool, (5,), "contiguous"), ("str",)]),
            ("box", [("tensor", torch.int64, (0, 3), "contiguous"), ("none",)]),
            ("list", [("tensor", torch.bfloat16, (), "scalar"), ("int",)]),
        ],
    )
    reference, _ = run(spec, 0, False, slots=False)
    for num_workers, persistent in [(1, False), (2, True), (4, False)]:
        want, _ = run(spec, num_workers, persistent, slots=False)
        got, transport = run(spec, num_workers, persistent, slots=True)
        assert_identical(got, want)
        assert_identical(got[: len(reference)], reference)
        assert transport["torch_path_batches"] == 0


# ------------------------------------------------------------- the fallback
NON_CONTIGUOUS = "a non-contiguous tensor (strides kept by torch's path)"
SHARING = "tensors sharing storage (kept shared by torch's path)"


def collate_aliased(samples: list[int]) -> Any:
    base = torch.tensor(samples, dtype=torch.float32)
    kind = samples[0] // B % 3
    if kind == 0:  # one tensor twice: through a slot, still one object
        return {"a": base, "b": base, "n": len(samples)}
    if kind == 1:  # a view and its base: torch's path keeps the storage shared
        return {"a": base, "b": base[1:], "n": len(samples)}
    return {"a": base.view(2, 2).t(), "n": len(samples)}  # strides: torch's path


def test_aliasing_and_strides_are_kept_as_torchs_path_keeps_them() -> None:
    want, _ = run_collate(collate_aliased, slots=False)
    got, transport = run_collate(collate_aliased, slots=True)
    assert_identical(got, want)
    for g, w in zip(got, want, strict=True):
        kind = g["a"].flatten()[0].item() // B % 3
        if kind == 0:
            assert g["a"] is g["b"] and w["a"] is w["b"]
        elif kind == 1:
            assert g["b"].untyped_storage().data_ptr() == g["a"].untyped_storage().data_ptr()
        else:
            assert not g["a"].is_contiguous() and g["a"].stride() == w["a"].stride()
    assert transport["slot_batches"] == 1, transport
    assert transport["torch_path_reasons"] == {SHARING: 1, NON_CONTIGUOUS: 1}, transport


def run_collate(collate: Any, slots: bool) -> tuple[list[Any], Any]:
    _slots.ENABLED = slots
    try:
        loader = ResumableDataLoader(Ids(), batch_size=B, num_workers=2, collate_fn=collate)
        return list(loader), loader.describe()["transport"]
    finally:
        _slots.ENABLED = True


def collate_with_grad(samples: list[int]) -> Any:
    return {"x": torch.tensor(samples, dtype=torch.float32, requires_grad=True), "n": len(samples)}


def test_what_cannot_go_through_a_slot_takes_torchs_path_and_is_counted() -> None:
    loader = ResumableDataLoader(Ids(), batch_size=B, num_workers=2, collate_fn=collate_with_grad)
    batches = list(loader)
    assert [b["x"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert all(b["x"].requires_grad for b in batches)
    transport = loader.describe()["transport"]
    assert transport["slot_batches"] == 0
    assert transport["torch_path_batches"] == N // B
    assert transport["torch_path_reasons"] == {"a tensor that requires grad": N // B}


def collate_growing(samples: list[int]) -> torch.Tensor:
    # Batches that grow: each slot's arena is re-created larger, then reused.
    return torch.full((samples[0] + 1, 20000), samples[0], dtype=torch.int64)


def test_a_batch_that_outgrows_its_slot_gets_a_larger_arena() -> None:
    loader = ResumableDataLoader(
        Ids(40), batch_size=1, num_workers=2, collate_fn=collate_growing, prefetch_factor=1
    )
    batches = list(loader)
    assert [int(b[0, 0]) for b in batches] == list(range(40))
    assert [b.shape[0] for b in batches] == list(range(1, 41))
    transport = loader.describe()["transport"]
    assert transport["slot_batches"] == 40 and transport["torch_path_batches"] == 0
    assert transport["arenas_received"] < 40  # grown with headroom, not once per batch


def test_persistent_workers_free_the_slots_of_an_abandoned_epoch() -> None:
    # torch drains an abandoned epoch's batches when the next starts: their slots
    # must come back, or the workers would run out and fall back to torch's path.
    loader = ResumableDataLoader(Ids(64), batch_size=2, num_workers=2, persistent_workers=True)
    for _ in range(4):
        it = iter(loader)
        next(it)
        del it
    assert len(list(loader)) == 32
    transport = loader.describe()["transport"]
    assert transport["torch_path_batches"] == 0, transport


# ------------------------------------------------------------- worker deaths
class Dies(Dataset[int]):
    """Sample 7 ends its worker: ``os._exit`` or SIGKILL."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        if index == 7 and torch.utils.data.get_worker_info() is not None:
            if self.how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        return index


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_a_worker_dying_mid_batch_is_named_with_its_sample_indices(how: str) -> None:
    loader = ResumableDataLoader(Dies(how), batch_size=B, num_workers=2)
    with pytest.raises(WorkerError, match=r"sample indices \[4, 5, 6, 7\]") as info:
        list(loader)
    assert info.value.index == [4, 5, 6, 7]
    traceback.clear_frames(info.value.__traceback__)


def dying_pack(writer: Any, batch: Any, *, stream: bool = False) -> Any:
    # Claims a slot and dies while writing it: the slot is lost with the worker.
    if isinstance(batch, torch.Tensor) and int(batch[0]) == 4:
        flags, _ = writer.local()
        info = torch.utils.data.get_worker_info()
        assert info is not None
        flags[info.id * writer.slots] = 1
        os.kill(os.getpid(), signal.SIGKILL)
    return REAL_PACK(writer, batch, stream=stream)


REAL_PACK = _slots.pack


def test_a_worker_killed_while_writing_a_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_slots, "pack", dying_pack)  # forked workers inherit it
    loader = ResumableDataLoader(Ids(), batch_size=B, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(WorkerError, match=r"SIGKILL.*sample indices \[4, 5, 6, 7\]") as info:
        list(loader)
    traceback.clear_frames(info.value.__traceback__)
    monkeypatch.undo()
    assert len(list(loader)) == N // B  # new workers, new slots


# ------------------------------------------------------------- nothing left behind
def shm_entries() -> set[str]:
    # Semaphores (sem.*) come and go with any multiprocessing user on the machine.
    return {name for name in os.listdir("/dev/shm") if not name.startswith("sem.")}


def mapped_segments(min_size: int = 0) -> set[str]:
    """The shared-memory segments this process maps (torch's are named torch_*), those of
    at least ``min_size`` bytes."""
    found = set()
    for line in Path(f"/proc/{os.getpid()}/maps").read_text().splitlines():
        span, *_, name = line.split(maxsplit=5)
        lo, hi = (int(x, 16) for x in span.split("-"))
        if ("/dev/shm/" in name or "/torch_" in name) and hi - lo >= min_size:
            found.add(name)
    return found


def assert_nothing_left(entries: set[str], mapped: set[str], patience: float = 60.0) -> None:
    """No /dev/shm entry nor mapping beyond those before the test, waiting out other
    processes' transient ones (another test process shares /dev/shm): a leak stays."""
    deadline = time.monotonic() + patience
    while True:
        left, still_mapped = shm_entries() - entries, mapped_segments() - mapped
        if not (left or still_mapped) or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    assert left == set(), f"left in /dev/shm: {sorted(left)}"
    assert still_mapped == set(), f"still mapped here: {sorted(still_mapped)}"


def big_batches(samples: list[int]) -> torch.Tensor:
    return torch.full((len(samples), 50000), samples[0], dtype=torch.float32)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("sharing", ["file_descriptor", "file_system"])
def test_no_shared_memory_left_after_the_loader_is_closed(persistent: bool, sharing: str) -> None:
    # Hunter 383: under file_system sharing each worker's arenas stayed in /dev/shm until this
    # process exited (a worker leaves by os._exit): ~5 MiB per loader, ENOSPC in a long run.
    before = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(sharing)
    try:
        gc.collect()
        entries, mapped = shm_entries(), mapped_segments()
        loader = ResumableDataLoader(
            Ids(),
            batch_size=B,
            num_workers=2,
            collate_fn=big_batches,
            persistent_workers=persistent,
        )
        it = iter(loader)
        next(it)
        assert mapped_segments() - mapped  # the arenas are mapped here while the loader runs
        rest = list(it)
        assert len(rest) == N // B - 1
        assert loader.describe()["transport"]["slot_batches"] == N // B
        del it, rest, loader
        gc.collect()
        assert_nothing_left(entries, mapped)
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_arenas_are_unmapped_when_the_workers_stop_not_when_the_iterator_goes() -> None:
    def arenas() -> set[str]:  # not the one-page slot flags, nor the queues' semaphores
        return mapped_segments(min_size=_slots.MIN_ARENA)

    gc.collect()
    mapped = arenas()
    loader = ResumableDataLoader(
        FailsAt(N - 1), batch_size=B, num_workers=2, collate_fn=big_batches
    )
    gc.disable()  # the cycle below must not be what frees them
    try:
        with pytest.raises(WorkerError, match="bad sample") as info:
            list(loader)
        # The error's traceback holds torch's worker iterator in a reference cycle,
        # alive until the cycle collector runs; its workers were stopped, its arenas go.
        assert arenas() - mapped == set()
    finally:
        del info
        gc.enable()
        gc.collect()


class FailsAt(Ids):
    def __init__(self, bad: int) -> None:
        super().__init__()
        self.bad = bad

    def __getitem__(self, index: int) -> int:
        if index == self.bad:
            raise ValueError("bad sample")
        return index


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_no_shared_memory_left_after_a_worker_is_killed(tmp_path: Path) -> None:
    gc.collect()
    entries, mapped = shm_entries(), mapped_segments()
    marker = tmp_path / "stuck"
    # Batch 2 (worker 0's second, after its first arena is made) holds sample 8.
    loader = ResumableDataLoader(
        StuckAt(8, marker), batch_size=B, num_workers=2, collate_fn=big_batches
    )
    it = iter(loader)
    next(it)
    while not marker.exists():  # no time budget: the worker gets there, however slowly
        time.sleep(0.05)
    # Killed inside __getitem__, not between torch's shm_open and its unlink: SIGKILL
    # there leaves the half-made segment named in /dev/shm for good, on torch's own
    # path as on slots (docs/design.md, "Worker transport").
    os.kill(int(marker.read_text()), signal.SIGKILL)
    with pytest.raises(WorkerError, match="SIGKILL") as info:
        list(it)
    traceback.clear_frames(info.value.__traceback__)
    del info, it, loader
    gc.collect()
    assert_nothing_left(entries, mapped)


class StuckAt(Ids):
    """Sample ``stuck`` writes its worker's pid to ``marker`` and never returns."""

    def __init__(self, stuck: int, marker: Path) -> None:
        super().__init__(40)
        self.stuck, self.marker = stuck, marker

    def __getitem__(self, index: int) -> int:
        if index == self.stuck:
            part = self.marker.with_suffix(".part")
            part.write_text(str(os.getpid()))
            part.replace(self.marker)  # whole or absent when the test reads it
            time.sleep(3600)
        return index


# ------------------------------------------------------------- resume
def test_resume_oracle_through_slots() -> None:
    def make() -> ResumableDataLoader:
        return ResumableDataLoader(Ids(), batch_size=B, shuffle=True, seed=5, num_workers=2)

    steps = N // B
    uninterrupted = make()
    full = [b.tolist() for _ in range(2) for b in uninterrupted]
    for k in (2, steps + 1):  # inside epoch 0, inside epoch 1
        loader = make()
        before = [b.tolist() for b in loader][: min(k, steps)]
        if k > steps:
            it = iter(loader)
            before.append(next(it).tolist())
        else:  # state after k batches of epoch 0
            loader = make()
            it = iter(loader)
            before = [next(it).tolist() for _ in range(k)]
        state = loader.state_dict()
        del it
        resumed = make()
        resumed.load_state_dict(state)
        after = [b.tolist() for b in resumed]
        if k <= steps:
            after += [b.tolist() for b in resumed]
        assert before + after == full, f"resume at {k}"
        assert resumed.describe()["transport"]["slot_batches"] == len(after)
        assert resumed.describe()["transport"]["torch_path_batches"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (pin_memory)")
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_pinned_batches_are_copied_out_of_the_slot_into_pinned_memory(layout: str) -> None:
    # A non-contiguous tensor takes torch's path (strides kept); pinned all the same.
    spec = ("pair", [("tensor", torch.float32, (3, 2), layout), ("str",)])
    want, _ = run(spec, 0, False, slots=False)
    _slots.ENABLED = True
    loader = ResumableDataLoader(
        Ids(),
        batch_size=B,
        shuffle=True,
        seed=3,
        num_workers=2,
        pin_memory=True,
        collate_fn=functools.partial(collate_spec, spec),
    )
    got = list(loader)
    assert_identical(got, want)
    assert all(b["ids"].is_pinned() and b["body"].first.is_pinned() for b in got)
    transport = loader.describe()["transport"]
    by_slots = layout == "contiguous"
    assert transport["slot_batches"] == (len(got) if by_slots else 0), transport
    assert transport["torch_path_batches"] == (0 if by_slots else len(got)), transport


def test_pinned_copies_take_the_cores_the_workers_and_ranks_leave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(resumable, "cpu_budget", lambda processes=1: 16 // processes)

    def parts(workers: int, pin: bool = True) -> int:
        loader = ResumableDataLoader(list(range(4)), num_workers=workers)
        return _slots.copy_parts(pin, workers, loader._host.pool.cores)

    assert [parts(w) for w in (2, 12, 13, 15)] == [4, 3, 2, 1]
    assert parts(2, pin=False) == 1  # no pin thread: no threads
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # 4 ranks a node
    assert [parts(w) for w in (1, 2)] == [2, 1]


class _Deferred:
    """An executor whose parts run only when their result is asked for."""

    def submit(self, fn: Any, *args: Any) -> Any:
        return type("Part", (), {"result": staticmethod(lambda: fn(*args))})()


@pytest.mark.parametrize("nbytes", [_slots.SPLIT_BYTES, _slots.SPLIT_BYTES * 3 + 5])
def test_a_tensor_copied_out_in_parts_waits_for_every_part(nbytes: int) -> None:
    transport = _slots.Transport(1, 1, pin=False, stats=_slots.TransportStats())
    transport.parts, transport.copier = 4, cast(Any, _Deferred())
    source = torch.randint(0, 255, (nbytes,), dtype=torch.uint8).numpy()
    out = source * 0
    transport._copy(out, source)
    assert (out == source).all()
    shut = ThreadPoolExecutor(2)
    shut.shutdown()  # as at interpreter exit: parts not taken are copied on this thread
    transport.copier, out[:] = shut, 0
    transport._copy(out, source)
    assert (out == source).all()


@pytest.mark.parametrize("persistent", [False, True])
def test_large_batches_copied_out_in_parts_keep_their_values(
    monkeypatch: pytest.MonkeyPatch, persistent: bool
) -> None:
    # As where pinning on spare cores (no pinning without CUDA): odd sizes, so parts differ.
    monkeypatch.setattr(_slots, "copy_parts", lambda pin, num_workers, cores: 3)
    data = TensorDataset(
        torch.randint(0, 255, (24, (_slots.SPLIT_BYTES >> 2) + 13), dtype=torch.uint8),
        torch.randn(24, (_slots.SPLIT_BYTES >> 5) + 7, dtype=torch.float64),
    )
    kwargs: dict[str, Any] = {"batch_size": 5, "shuffle": True, "seed": 3}
    loader = ResumableDataLoader(data, num_workers=2, persistent_workers=persistent, **kwargs)
    want = ResumableDataLoader(data, **kwargs)
    for epoch in range(2):
        loader.set_epoch(epoch)
        want.set_epoch(epoch)
        got, copying = [], False
        for batch in loader:  # the copy threads live with the worker iterator
            got.append(batch)
            copying |= any(t.name.startswith("loaderkit-copy") for t in threading.enumerate())
        assert copying
        for batch, expected in zip(got, want, strict=True):
            assert all(torch.equal(g, e) for g, e in zip(batch, expected, strict=True))
    assert loader.describe()["transport"]["slot_batches"] == 2 * len(got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (pin_memory)")
def test_large_pinned_batches_from_workers_keep_their_values() -> None:
    # Batches over SPLIT_BYTES are copied out of the slot in parts where cores allow.
    rows = torch.randn(96, _slots.SPLIT_BYTES // 4 // 8 + 3)
    loader = ResumableDataLoader(
        TensorDataset(rows), batch_size=16, shuffle=True, seed=1, num_workers=2, pin_memory=True
    )
    got = list(loader)
    in_process = ResumableDataLoader(TensorDataset(rows), batch_size=16, shuffle=True, seed=1)
    order = list(in_process.batch_sampler)
    assert all(b[0].is_pinned() for b in got)
    assert all(torch.equal(b[0], rows[ids]) for b, ids in zip(got, order, strict=True))
    assert loader.describe()["transport"]["slot_batches"] == len(got)


class Held:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value


def conj_views(rows: list[int]) -> dict[str, Any]:
    z = torch.complex(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])) * (rows[0] + 1)
    # The transposed tensor sends the batch by torch's path, which drops the bits itself.
    beside = torch.arange(6.0).view(2, 3).t() if rows[0] else torch.ones(1)
    return {"conj": z.conj(), "neg": z.conj().imag, "box": Held(z.conj().imag), "t": beside}


def test_conj_and_neg_views_keep_their_values_from_workers() -> None:
    """torch's tensor pickling drops a view's conj/neg bit: [-3, -4] arrived as [3, 4] when
    the (non-contiguous) neg view sent the batch by torch's path; now its values go by slot."""

    def batches(num_workers: int) -> list[list[Any]]:
        loader = ResumableDataLoader(
            list(range(3)), batch_size=1, collate_fn=conj_views, num_workers=num_workers
        )
        return [
            [b[k].resolve_conj().resolve_neg().tolist() for k in ("conj", "neg")]
            + [b["box"].value.resolve_neg().tolist()]
            for b in loader
        ]

    first = batches(0)
    assert batches(2) == first and first[0][1:] == [[-3.0, -4.0], [-3.0, -4.0]]


def unpicklable(rows: list[int]) -> dict[str, Any]:
    return {"x": torch.ones(2), "f": lambda: rows}


def unpicklable_at(rows: list[int]) -> Any:
    return unpicklable(rows) if 3 in rows else torch.tensor(rows)


class _Six(torch.utils.data.IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(6))


def _read_ids(shard: list[int]) -> Any:
    return iter(shard)


@pytest.mark.parametrize("kind", ["map-style", "iterable", "stream"])
def test_a_batch_that_does_not_pickle_is_the_workers_error_not_a_hang(kind: str) -> None:
    """torch's queue thread drops a batch it cannot pickle, and the loader waited forever.
    The error stands in the batch's place and the epoch goes on (it ended the epoch: 4 of
    6 batches lost, while the state counted them; a stream's item lost its record)."""
    data: Any = {
        "map-style": lambda: list(range(6)),
        "iterable": _Six,
        "stream": lambda: StreamingShardedDataset(
            [[0, 1, 2, 3, 4, 5]], IterableReader(_read_ids), shuffle_shards=False
        ),
    }[kind]()
    loader = ResumableDataLoader(
        data, batch_size=1, collate_fn=unpicklable_at, num_workers=1, timeout=120, seed=0
    )
    got: list[Any] = []
    it = iter(loader)
    for _ in range(6):
        try:
            got.append(next(it).tolist())
        except AttributeError as exc:  # the cause's type, as a dataset's error is
            assert "does not pickle" in str(exc) and "num_workers=0" in str(exc)
            got.append("failed")
    assert got == [[0], [1], [2], "failed", [4], [5]]
    with pytest.raises(StopIteration):
        next(it)


class _Tagged(torch.Tensor):
    """A tensor subclass (as torchvision's ``tv_tensors`` are)."""


class _Kinds(Dataset[Any]):
    """Samples a slot cannot hold: a tensor subclass, a sparse tensor, a dtype it lacks."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.kind == "subclass":
            return (torch.arange(3.0) + i).as_subclass(_Tagged)
        if self.kind == "sparse":
            return (torch.eye(3) * i).to_sparse()
        return torch.full((3,), i, dtype=torch.complex32)


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("subclass", "a tensor subclass (_Tagged)"),
        ("sparse", "a torch.sparse_coo tensor on cpu"),
        ("complex32", "a tensor of dtype torch.complex32"),
    ],
)
def test_a_subclass_sparse_or_rare_dtype_batch_keeps_its_kind_through_workers(
    kind: str, reason: str
) -> None:
    # Each takes torch's path: a slot would send a plain dense tensor of another kind.
    collate = list if kind == "sparse" else None
    loaders = [
        ResumableDataLoader(_Kinds(kind), batch_size=4, num_workers=w, collate_fn=collate, seed=0)
        for w in (0, 2)
    ]
    (alone, _), (pooled, _) = (list(loader) for loader in loaders)
    first = pooled[0] if kind == "sparse" else pooled
    expected = alone[0] if kind == "sparse" else alone
    assert (type(first), first.layout, first.dtype) == (
        type(expected),
        expected.layout,
        expected.dtype,
    )
    assert torch.equal(
        first.to_dense().to(torch.complex64), expected.to_dense().to(torch.complex64)
    )
    assert loaders[1].describe()["transport"]["torch_path_reasons"] == {reason: 2}
