"""Plain training loops on 2 gloo ranks (no Lightning): three scenarios, one launch.

``_gloo_loops.py`` spawns the two ranks once; they run each scenario in a
process group of its own, and each scenario's tests read what the ranks wrote.

**Per-loader agreement.** Rank agreement is counted per loader.

Measured on 84cc6ec: one process-wide count of comparison rounds paired a
rank-0-only ``next(iter(val_loader))`` with rank 1's next training epoch, so
that epoch failed on both ranks with "the ranks disagree on 'epoch'". Now a
loader's n-th epoch start pairs only with the same loader's n-th on the other
ranks (``loaderkit.plan._agree.Rounds``).

**Disagreeing ranks.** Ranks that disagree on the plan fail on every rank, naming
the field.

Measured before: ranks given different seeds silently lost 68 and repeated 69
of 290 samples per epoch; ranks given datasets of different sizes crashed in
gloo with "Connection closed by peer". Now each rank publishes a fingerprint
of its plan when an epoch starts (``loaderkit.plan._agree``).

**Stream state saved by rank 0.** A stream loader's state saved by rank 0 alone
(issue 11, failure 7).

Measured before: ``state_dict()`` gathered every rank's cursors with
``all_gather_object``, so a plain loop saving on rank 0 only
(``if rank == 0: torch.save(loader.state_dict(), path)``) hung. Now it reads
the peers' cursors from the process group's store; rank 1 never calls it.
The oracle: for each rank, the first k batches plus the batches resumed from
rank 0's step-k state equal the uninterrupted run, for k inside epoch 0, at
its end and inside epoch 1, with ``num_workers`` 0 (and the last k with 2).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.distributed._stream_rank0 import RESUME_AT, SAVE_AT, TOTAL
from tests.support.helpers import log_tail, run_script

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

SCRIPT = Path(__file__).resolve().parent / "_gloo_loops.py"
AGREE_SIZE, DISAGREE_SIZE = 40, 290
TOPOLOGY_SIZE = 20  # _topology.SIZE


@pytest.fixture(scope="module")
def launch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int | str]:
    """The one launch: its output folder, and its exit status or why it failed (a hang)."""
    out = tmp_path_factory.mktemp("gloo_loops")
    try:
        rc: int | str = run_script(SCRIPT, [str(out)], out / "run.log", phase="2 gloo ranks")
    except AssertionError as exc:  # a hang: the scenarios that finished still count
        rc = str(exc)
    return out, rc


def scenario(launch: tuple[Path, int | str], name: str) -> list[dict[str, Any]]:
    """What each rank wrote for one scenario; fails the test (with the log) if it did not."""
    out, rc = launch
    paths = [out / name / f"rank{r}.json" for r in range(2)]
    if not all(p.exists() for p in paths):
        raise AssertionError(f"scenario {name} wrote no results (exit status {rc}); log:\n"
                             f"{log_tail(out / 'run.log')}")  # fmt: skip
    return [json.loads(p.read_text()) for p in paths]


@pytest.fixture(scope="module")
def agree(launch: tuple[Path, int | str]) -> list[dict[str, Any]]:
    return scenario(launch, "agree_per_loader")


@pytest.fixture(scope="module")
def disagree(launch: tuple[Path, int | str]) -> list[dict[str, Any]]:
    return scenario(launch, "disagree")


@pytest.fixture(scope="module")
def stream_rank0(launch: tuple[Path, int | str]) -> list[dict[str, Any]]:
    return scenario(launch, "stream_rank0")


@pytest.fixture(scope="module")
def topology(launch: tuple[Path, int | str]) -> list[dict[str, Any]]:
    return scenario(launch, "topology")


def test_the_launch_exits_cleanly(launch: tuple[Path, int | str]) -> None:
    out, rc = launch
    assert rc == 0, f"exit status {rc}; log:\n{log_tail(out / 'run.log')}"


# ------------------------------------------------------------------- agreement per loader
@pytest.mark.parametrize("name", ["train0", "train1", "val", "train2"])
def test_every_epoch_after_a_rank0_peek_runs_on_both_ranks_exactly_once(
    agree: list[dict[str, Any]], name: str
) -> None:
    got = [agree[rank][name] for rank in range(2)]
    assert all("ids" in g for g in got), got
    assert sorted(got[0]["ids"] + got[1]["ids"]) == list(range(AGREE_SIZE))


def test_the_peek_alone_waits_for_its_peer_and_says_so(agree: list[dict[str, Any]]) -> None:
    # The validation loader on rank 0 alone: its epoch start has no partner on rank 1.
    got = agree[0]["peek"]
    assert got.get("error") == "LoaderkitError", got
    assert "waited 3 s for ranks [1] to start it too" in got["message"]
    assert "rank=0, world_size=1" in got["message"]
    assert "peek" not in agree[1]


# ------------------------------------------------------------------- disagreeing ranks
def test_agreeing_ranks_see_every_sample_once(disagree: list[dict[str, Any]]) -> None:
    ids = disagree[0]["agree"]["ids"] + disagree[1]["agree"]["ids"]
    assert sorted(ids) == list(range(DISAGREE_SIZE))
    ok = disagree[0]["workers_ok"]["ids"] + disagree[1]["workers_ok"]["ids"]
    assert sorted(ok) == list(range(DISAGREE_SIZE)), (
        "num_workers may differ between ranks (map-style)"
    )


@pytest.mark.parametrize(
    ("case", "pattern"),
    [
        ("seeds", r"disagree on 'seed' at the start of epoch 0: 1 on rank\(s\) \[0\]; 2 on "
                  r"rank\(s\) \[1\] \(ranks \[1\] differ from rank 0\).*pass the same seed="),
        ("sizes", r"disagree on 'num_samples' .*290 on rank\(s\) \[0\]; 300 on rank\(s\) \[1\]"
                  r".*every rank must read the same dataset"),
        ("sampler_seeds", r"PlanBatchSampler: the ranks disagree on 'seed' .*0 on rank\(s\) "
                          r"\[0\]; 1 on rank\(s\) \[1\]"),
        ("later_epoch_orders", r"disagree on 'epoch_order' at the start of epoch 1: .*give "
                               r"the sampler the same seed on every rank"),
        ("stream_shards", r"disagree on 'num_shards' .*5 on rank\(s\) \[0\]; 4 on rank\(s\) \[1\]"
                          r".*every rank must read the same dataset"),
    ],
)  # fmt: skip
def test_disagreeing_ranks_raise_on_every_rank(
    disagree: list[dict[str, Any]], case: str, pattern: str
) -> None:
    for rank in range(2):
        got = disagree[rank][case]
        assert got.get("error") == "StateMismatchError", f"rank {rank}: {got}"
        assert re.search(pattern, got["message"]), f"rank {rank}: {got['message']}"


def test_a_rank_iterating_alone_gets_an_error_not_a_hang(disagree: list[dict[str, Any]]) -> None:
    got = disagree[0]["only_rank0"]
    assert got.get("error") == "LoaderkitError", got
    assert "waited 3 s for ranks [1] to start it too" in got["message"]
    assert "Iterate this loader on every rank" in got["message"]
    assert "rank=0, world_size=1" in got["message"]
    assert disagree[1]["only_rank0"] == {"ids": []}


def test_ranks_agree_again_after_a_rank_waited_alone(disagree: list[dict[str, Any]]) -> None:
    got = [disagree[rank]["after_alone"] for rank in range(2)]
    assert all("ids" in g for g in got), got
    assert sorted(got[0]["ids"] + got[1]["ids"]) == list(range(DISAGREE_SIZE))


def test_no_sample_was_lost_silently_before_the_errors(disagree: list[dict[str, Any]]) -> None:
    # The failing cases raised at the first batch: no rank yielded anything for them.
    for rank in range(2):
        for case in ("seeds", "sizes", "sampler_seeds", "stream_shards"):
            assert "ids" not in disagree[rank][case]
    counts = Counter(disagree[0]["agree"]["ids"])
    assert max(counts.values()) == 1


# ------------------------------------------------------------------- stream state saved by rank 0
@pytest.mark.parametrize("num_workers", ["0", "2"])
def test_rank0_alone_saves_and_every_rank_resumes_exactly(
    stream_rank0: list[dict[str, Any]], num_workers: str
) -> None:
    assert [len(r[num_workers]["full"]) for r in stream_rank0] == [TOTAL, TOTAL]
    assert sorted(map(int, stream_rank0[0][num_workers]["state_dict_s"])) == list(SAVE_AT)
    assert stream_rank0[1][num_workers]["state_dict_s"] == {}  # rank 1 never called it
    for rank in range(2):
        full = stream_rank0[rank][num_workers]["full"]
        for k in RESUME_AT[int(num_workers)]:
            resumed = stream_rank0[rank][num_workers]["resumed"][str(k)]
            assert full[:k] + resumed == full, f"rank {rank} resumed from rank 0's step {k}"
    # Two ranks, two streams: no sample twice in an epoch across ranks.
    epoch0 = [i for r in stream_rank0 for b in r[num_workers]["full"][: TOTAL // 2] for i in b]
    assert len(epoch0) == len(set(epoch0))


# ------------------------------------------------------------------- topology
def test_a_loader_peeked_at_before_the_group_reads_its_part_under_it(
    topology: list[dict[str, Any]],
) -> None:
    # Hunter 384: the (0, 1) read at the peek's first batch was kept, so each rank read all 20.
    for epoch in range(2):
        parts = [r["epochs"][epoch] for r in topology]
        assert [len(p) for p in parts] == [TOPOLOGY_SIZE // 2] * 2
        assert sorted(parts[0] + parts[1]) == list(range(TOPOLOGY_SIZE))
    # Review 385: world_size=2 alone was refused at construction, before the group existed.
    early = [r["early"] for r in topology]
    assert sorted(early[0] + early[1]) == list(range(TOPOLOGY_SIZE)) and early[0] != early[1]
    # Review 386: a stream's slots dealt for one process were applied to each rank's shards
    # (samples never read, or an IndexError).
    for r in topology:
        error = r["stream"]["error"]
        assert "this stream was read on 1 rank(s) (before init_process_group?)" in error
        # Review 387: one loaded from a state saved under the group was refused too.
        saver, loaded = r["stream_loaded"]
        assert loaded == saver and saver
        # Review 388: a state saved on one process is named as what was loaded; a host's one
        # data-parallel rank beside world_size=2 alone split tensor-parallel peers.
        assert "loaded from a state saved on 1 rank(s)" in r["one_rank"]["error"]
        assert "the Trainer's data-parallel group has 1 rank(s)" in r["hosted"]["error"]


def test_a_world_size_past_the_group_is_refused_and_1_alone_reads_all(
    topology: list[dict[str, Any]],
) -> None:
    # Hunter 384: world_size=4 on 2 processes left half the data unread; world_size=1 alone
    # took rank 1 from the group and raised WorkerEnv's "rank must be in [0, 1)".
    for r in topology:
        assert "larger than the torch.distributed group (2 processes)" in r["larger"]["error"]
        assert sorted(r["one"]["ids"]) == list(range(TOPOLOGY_SIZE))
