"""Dying workers are named with the samples they held; orphaned workers exit on their own.

Measured before: a worker that segfaulted, called ``os._exit`` or was
SIGKILLed surfaced as torch's "killed by signal" with no sample index (the
loader knew which indices it had dispatched to that worker); ``timeout=2``
with ``num_workers=0`` was accepted and never applied; a worker stuck inside
``__getitem__`` when its parent was SIGKILLed stayed alive (one was still
running 65 minutes later, parent pid 1).

The out-of-memory kill cannot be provoked safely on a shared machine (it
needs a memory cgroup of one's own): the kernel's OOM killer sends SIGKILL,
which is tested here, and the message's OOM wording follows the cgroup's
``oom_kill`` counter, which is faked here.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaderkit import (
    IterableReader,
    LoaderkitError,
    MissingShardError,
    ResumableDataLoader,
    ShardedDataset,
    ShardError,
    StreamingShardedDataset,
    TokenReader,
    WorkerError,
    write_shards,
)
from loaderkit.loader import _workers
from tests.reliability._cases import Faulty
from tests.support.helpers import REPO_ROOT


def no_children_left(wait: float = 120.0) -> bool:
    # Returns as soon as the children are gone; the long wait is for a loaded machine
    # (torch joins a worker for up to 5 s before it terminates it): 10 s ran out on 16
    # cores running 14 test processes.
    deadline = time.monotonic() + wait
    while multiprocessing.active_children():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize(
    ("how", "ending"),
    [
        ("segfault", r"was killed by SIGSEGV \(a segmentation fault"),
        ("exit", r"exited with code 3 without raising an error \(os._exit\(\)"),
        ("exit0", r"exited with code 0 without raising an error"),
        ("sigkill", r"was killed by SIGKILL \(the kernel's out-of-memory killer"),
    ],
)
def test_a_dead_worker_is_named_with_the_indices_it_held(how: str, ending: str) -> None:
    loader = ResumableDataLoader(Faulty(how, 17), batch_size=4, num_workers=2, seed=0)
    got: list[int] = []
    with pytest.raises(WorkerError, match=rf"DataLoader worker 0 \(pid \d+\) {ending}") as info:
        for batch in loader:
            got += batch.tolist()
    # Batch 4 (indices 16..19) went to worker 0 (batches alternate between the workers).
    assert "sample indices [16, 17, 18, 19] (epoch 0, batch 4)" in str(info.value)
    held = info.value.index if isinstance(info.value.index[0], list) else [info.value.index]
    assert [16, 17, 18, 19] in held
    assert got == list(range(len(got))) and len(got) <= 16  # nothing after the dead batch
    assert no_children_left(), "the other worker was left running"


def test_an_oom_kill_is_named_as_one(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = iter([0, 1])  # the cgroup's oom_kill count, at the start and at the death
    monkeypatch.setattr(_workers, "oom_kills", lambda: next(counts))
    loader = ResumableDataLoader(Faulty("sigkill", 5), batch_size=4, num_workers=1, seed=0)
    with pytest.raises(
        WorkerError,
        match=r"SIGKILL \(.*\(and it did: the cgroup's oom_kill count rose\).*"
        r"sample indices \[4, 5, 6, 7\].*Give the workers more memory",
    ):
        list(loader)


def test_a_persistent_worker_that_dies_in_a_later_epoch_is_named() -> None:
    loader = ResumableDataLoader(
        Faulty("exit", 37, size=40), batch_size=4, num_workers=2, persistent_workers=True, seed=0
    )
    loader.set_epoch(0)
    with pytest.raises(WorkerError, match=r"exited with code 3.*sample indices \[36, 37, 38, 39\]"):
        list(loader)
    assert no_children_left()


def draw(flag: Path, i: int) -> torch.Tensor:
    if flag.exists() and torch.utils.data.get_worker_info() is not None:
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies loading its first batch
    return torch.tensor([i, int(torch.randint(0, 10**6, ()))])  # keyed by the sample


class Drawing(torch.utils.data.Dataset[torch.Tensor]):
    def __init__(self, flag: Path) -> None:
        self.flag = flag

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> torch.Tensor:
        return draw(self.flag, i)


class DrawingStream(Drawing, torch.utils.data.IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        info = torch.utils.data.get_worker_info()
        assert info is not None
        return map(functools.partial(draw, self.flag), range(info.id, 16, info.num_workers))


def spans(shard: tuple[int, int]) -> Iterator[int]:
    return iter(range(shard[0], shard[0] + shard[1]))


@pytest.mark.parametrize("when", ["idle", "loading"])
@pytest.mark.parametrize("engine", ["planned", "stream", "iterable"])
def test_workers_dead_before_an_epochs_first_batch_are_named_and_the_epoch_served_next(
    tmp_path: Path, engine: str, when: str
) -> None:
    # Persistent workers killed while idle: torch's RuntimeError came from iter(), outside the
    # guard. The first WorkerError for it, and one for workers dying on the first batch, let
    # the next iter() skip that epoch (review 324): the failed iteration had begun it.
    flag = tmp_path / "kill"

    def make() -> ResumableDataLoader:
        dataset: Any = {
            "planned": Drawing(flag),
            "stream": StreamingShardedDataset(
                [(0, 8), (8, 8)],
                IterableReader(spans),
                mix_shards=1,
                transform=functools.partial(draw, flag),
            ),
            "iterable": DrawingStream(flag),
        }[engine]
        shuffle = engine == "planned"
        return ResumableDataLoader(
            dataset, batch_size=4, shuffle=shuffle, num_workers=2, persistent_workers=True, seed=0
        )

    def epoch(loader: ResumableDataLoader) -> list[list[int]]:
        return [row for batch in loader for row in batch.tolist()]

    uninterrupted = make()
    expected = [epoch(uninterrupted) for _ in range(3)]
    uninterrupted.close()
    assert expected[1] != expected[2]  # the epochs tell apart
    loader = make()
    assert epoch(loader) == expected[0]
    state = loader.state_dict()
    if when == "idle":
        for child in multiprocessing.active_children():
            os.kill(child.pid, signal.SIGKILL)
    else:
        flag.touch()
    idle = "no batch \\(it was idle\\).* has not begun.*resume the fit from its last checkpoint"
    held = idle if when == "idle" else "not delivered"
    with pytest.raises(WorkerError, match=rf"worker \d \(pid \d+\) was killed by SIGKILL.*{held}"):
        next(iter(loader))
    flag.unlink(missing_ok=True)
    assert no_children_left()
    assert loader.state_dict() == state
    assert [epoch(loader), epoch(loader)] == expected[1:]
    loader.close()


def boom_at(shard: tuple[int, int]) -> object:
    start, n = shard
    for i in range(start, start + n):
        if i == 7:
            os.kill(os.getpid(), signal.SIGKILL)
        yield i


def test_a_dead_stream_worker_is_named_with_its_slot_and_shard() -> None:
    ds = StreamingShardedDataset(
        [(0, 4), (4, 6), (10, 4), (14, 4)],
        IterableReader(boom_at),
        shuffle_shards=False,
        mix_shards=1,
    )
    loader = ResumableDataLoader(ds, batch_size=2, num_workers=2, seed=0)
    with pytest.raises(
        WorkerError,
        match=r"worker [01] \(pid \d+\) was killed by SIGKILL.*a batch of stream slot [01] "
        r"\(pass 0; open shards: .*\((0, 4|4, 6|10, 4|14, 4)\)",
    ):
        list(loader)
    assert no_children_left()


def test_a_worker_timeout_is_applied_and_named() -> None:
    loader = ResumableDataLoader(Faulty("hang", 9), batch_size=4, num_workers=1, timeout=1, seed=0)
    with pytest.raises(
        WorkerError, match=r"within timeout=1 s: worker 0 \(pid \d+\) held sample indices \[8, 9"
    ):
        list(loader)
    assert no_children_left()


def test_a_timeout_without_workers_is_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match=r"timeout=2 needs num_workers >= 1.*never apply"):
        ResumableDataLoader(Faulty("hang", 9), batch_size=4, timeout=2)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    ("method", "mode"),
    [("fork", "sleep"), ("fork", "busy"), pytest.param("spawn", "sleep", marks=pytest.mark.slow)],
)
def test_workers_exit_within_seconds_of_their_parents_death(method: str, mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.reliability._stuck_parent", method, mode],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, "the parent did not start its workers"
        info = json.loads(line)
        children = info["children"]
        assert len(children) >= 2 and all(_alive(p) for p in children)
        os.kill(info["parent"], signal.SIGKILL)
        proc.wait(timeout=30)
        died = time.monotonic()
        while any(_alive(p) for p in children) and time.monotonic() - died < 10:
            time.sleep(0.05)
        left = [p for p in children if _alive(p)]
        # The watchdog polls every 0.25 s; seconds allow for a loaded machine.
        assert not left, f"workers {left} outlived their parent by 10 s"
    finally:
        proc.kill()
        for pid in info.get("children", []) if "info" in locals() else []:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_workers_of_a_loader_collected_in_a_cycle_exit_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Measured before: a failed batch's error kept in a reference cycle with the loader; at
    # the next gc.collect() the index queues' feeder threads stopped first, the workers never
    # got torch's None, and each was joined for 5 s, then terminated (10 s with 2 workers, at
    # a random later point of the run; so does a plain DataLoader). With the join made 15 s
    # here, a None that does not arrive takes 30 s; one that does, 0.4-4 s under load.
    import gc

    from torch.utils.data import _utils

    monkeypatch.setattr(_utils, "MP_STATUS_CHECK_INTERVAL", 15.0)
    before = set(multiprocessing.active_children())

    reader = TokenReader(seq_len=4, dtype=np.uint16)
    write_shards(tmp_path, [np.arange(40, dtype=np.uint16)] * 2, reader, progress=False)
    dataset = ShardedDataset(tmp_path, reader)
    next(tmp_path.glob("*-00001.*")).unlink()  # a shard lost: its batches fail, others go on

    def fail() -> None:
        batches = iter(ResumableDataLoader(dataset, batch_size=2, num_workers=2))
        try:
            for _ in batches:
                pass
        except MissingShardError as exc:
            error = exc  # this frame holds the error, whose traceback holds this frame
        assert error is not None

    fail()
    assert len(set(multiprocessing.active_children()) - before) == 2  # left running
    start = time.monotonic()
    gc.collect()
    assert time.monotonic() - start < 15.0  # no join ran out
    assert no_children_left()


@pytest.mark.parametrize("persistent", [False, True])
def test_an_iteration_caught_going_on_past_a_dead_worker_is_refused_not_ended(
    persistent: bool,
) -> None:
    # Hunter 265: the next() after the WorkerError raised StopIteration, so a loop that
    # caught the error and went on ended the epoch there, its other batches never read.
    loader = ResumableDataLoader(
        Faulty("exit", 17), batch_size=4, num_workers=2, persistent_workers=persistent, seed=0
    )
    it, got = iter(loader), []
    with pytest.raises(WorkerError):
        for batch in it:
            got += batch.tolist()
    with pytest.raises(LoaderkitError, match=r"stopped at the error it raised.*load_state_dict"):
        next(it)
    with pytest.raises(StopIteration):  # said once: a loop going on past errors ends
        next(it)
    state = loader.state_dict()
    resumed = ResumableDataLoader(range(40), batch_size=4, seed=0)  # the rest, read
    resumed.load_state_dict(state)
    assert got + [i for batch in resumed for i in batch.tolist()] == list(range(40))


class _FlakyOnce:
    """A stream reader whose next open fails once (``fail`` set), as a dropped read does."""

    def __init__(self) -> None:
        self.fail = False

    def __call__(self, shard: tuple[int, int]) -> Iterator[int]:
        if self.fail:
            self.fail = False
            raise OSError("flaky read")
        return spans(shard)


def test_a_stream_in_process_failing_before_an_epochs_first_batch_serves_that_epoch_next() -> None:
    # Review 329: with num_workers=0 the epoch had begun, so the next iter() served the one
    # after it while state_dict() still held its start.
    reader = _FlakyOnce()

    def make() -> ResumableDataLoader:
        shards = [(0, 8), (8, 8), (16, 6), (22, 10)]
        ds = StreamingShardedDataset(shards, IterableReader(reader), mix_shards=2)
        return ResumableDataLoader(ds, batch_size=4, seed=0)

    def epoch(loader: ResumableDataLoader) -> list[list[int]]:
        return [batch.tolist() for batch in loader]

    uninterrupted = make()
    expected = [epoch(uninterrupted) for _ in range(3)]
    assert expected[1] != expected[2]
    loader = make()
    assert epoch(loader) == expected[0]
    state, reader.fail = loader.state_dict(), True
    with pytest.raises(ShardError, match="flaky read"):
        next(iter(loader))
    assert loader.state_dict() == state
    assert [epoch(loader), epoch(loader)] == expected[1:]
