"""Lightning's Trainer under real DDP: 2 CPU processes over gloo, every scenario in two launches.

``lightning.Trainer(strategy="ddp", accelerator="cpu", devices=2)`` fits run in
a subprocess (``tests/support/jobs.py``: Lightning's launcher re-runs that
command line for rank 1, and each later fit finds the process group there)
with a time limit, so a hang fails the tests instead of blocking CI. The first
launch (:func:`first`) runs every uninterrupted and interrupted fit below, one
after the other; the second (:func:`resumed`) resumes the interrupted ones in
fresh processes. Each test reads its own fit's records, so it fails alone.

**Exact resume** (``tests/support/lightning_job.py``). 64 samples, batch size
8 per rank, 2 ranks: 4 steps an epoch, 8 in all; the size is a multiple of
``world_size * batch_size``, so "each id exactly once per epoch" is exact. The
uninterrupted run checkpoints every step; a run interrupted after step 6
(inside epoch 1) with ``num_workers=2`` is resumed on 2 processes. The elastic
resume (2 ranks saved, 1 process resumes) runs in the test process.

**A stream.** 64 ids in 6 uneven shards (one empty) streamed by 2 ranks x 2
persistent workers, batches of 8, ``steps_per_epoch=3``: both ranks step
exactly 3 times an epoch although their shards hold different numbers of
samples (no hang); the checkpointed state is the same on both ranks and holds
both ranks' cursors; a run interrupted after step 4 (inside epoch 1) and
resumed on 2 processes continues each rank's stream exactly.

**The data-parallel group** (F6, ``_dp_group.py``): a strategy whose
``distributed_sampler_kwargs`` name one data-parallel replica (the way
``ModelParallelStrategy`` groups tensor-parallel peers; that one needs CUDA).
Measured before: the loader split by the global group, so the two peers
trained on different halves of every epoch. Now both train on the same
batches. The Fabric side of the same contract runs in ``test_fabric.py``.

**DataModules** (``tests/support/datamodule_ddp.py``): ``ShardedDataModule``
and ``MixedDataModule``, 2 workers per rank.

**Shards** (``_train_shards.py``): 7 uneven ``.npy`` token shards (one empty),
every token of global sample ``i`` being ``i``; 133 samples, batch size 8 per
rank: 8 full global steps and a tail of 5, dealt as 3 + 3 with one sample
repeated (the documented padding of ``drop_last=False``): 9 steps per rank per
epoch, 2 epochs. The example script runs in ``test_ddp_shards.py``.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch

from loaderkit import (
    ElasticResume,
    LoaderkitError,
    MixedDataset,
    ResumableDataLoader,
    ShardedDataset,
    TokenReader,
    write_shards,
)
from tests.support.helpers import (
    IdDataModule,
    IdModule,
    assert_epochs_exactly_once,
    assert_resume_exact,
    by_epoch,
    no_entry_point_callbacks,
    read_records,
    trainer_kwargs,
)
from tests.support.jobs import Jobs, job, run_jobs

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]

ID_JOB, DM_JOB = "tests.support.lightning_job", "tests.support.datamodule_ddp"
SIZE, BATCH, WORLD = 64, 8, 2
STEPS_PER_EPOCH = SIZE // (BATCH * WORLD)
CUT_AT = 6  # the resume scenario's interruption, inside epoch 1
STREAM_STEPS, STREAM_CUT_AT = 3, 4
GROUP_SIZE, GROUP_BATCH, GROUP_EPOCHS = 32, 4, 2
DM_SIZES = (9, 0, 14, 6)  # 29 samples: 3 global steps of 8, tail 5
WEB_IDS, BOOKS_IDS = np.arange(29), np.arange(100, 105)
SHARD_SIZES = (23, 7, 41, 0, 18, 11, 33)  # 133 samples
SEQ, WINDOW, SEED, EPOCHS, SHARD_STEPS_PER_EPOCH = 4, 16, 0, 2, 9


def id_args(out: Path, *extra: object, num_workers: int = 0) -> list[object]:
    """The resume scenario's arguments: 2 ranks, ``SIZE`` ids in batches of ``BATCH``."""
    return ["--out", out, "--devices", WORLD, "--num-workers", num_workers,
            "--size", SIZE, "--batch-size", BATCH, *extra]  # fmt: skip


def stream_args(out: Path, *extra: object) -> list[object]:
    return id_args(out, "--stream", "--steps-per-epoch", STREAM_STEPS, *extra, num_workers=2)


def token_shards(folder: Path, ids: list[np.ndarray]) -> Path:
    """Shards whose every token of sample ``i`` is ``i``."""
    write_shards(
        folder, [np.repeat(p, SEQ).astype(np.uint16) for p in ids], TokenReader(seq_len=SEQ)
    )
    return folder


def id_ranges(sizes: tuple[int, ...]) -> list[np.ndarray]:
    return [np.arange(a, b) for a, b in itertools.pairwise(np.cumsum((0, *sizes)))]


def records(out: Path) -> list[list[dict[str, Any]]]:
    return [read_records(out / f"records-rank{r}.jsonl") for r in range(WORLD)]


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    """The first launch: every uninterrupted and interrupted fit of this file."""
    out = tmp_path_factory.mktemp("trainer-ddp")
    token_shards(out / "dm-data", id_ranges(DM_SIZES))
    token_shards(out / "web", [WEB_IDS])
    token_shards(out / "books", [BOOKS_IDS])
    token_shards(out / "shards", id_ranges(SHARD_SIZES))
    jobs = [
        job("full", ID_JOB, *id_args(out / "full", "--every", 1)),
        job("cut", ID_JOB, *id_args(out / "cut", "--fail-at", CUT_AT, "--every", CUT_AT,
                                    num_workers=2)),
        job("stream_full", ID_JOB, *stream_args(out / "stream_full", "--every", 1)),
        job("stream_cut", ID_JOB, *stream_args(out / "stream_cut", "--every", STREAM_CUT_AT,
                                               "--fail-at", STREAM_CUT_AT)),
        job("one_replica", "tests.distributed._dp_group", out / "one_replica"),
        job("user_split", "tests.distributed._dp_group", out / "user_split", "user-split"),
        job("sharded_dm", DM_JOB, "--data", out / "dm-data", "--out", out / "sharded_dm"),
        job("mixed_dm", DM_JOB, "--data", out / "web", "--books", out / "books",
            "--out", out / "mixed_dm"),
        job("shards", "tests.distributed._train_shards", "--data", out / "shards",
            "--out", out / "shards-out", "--devices", WORLD, "--num-workers", 2,
            "--batch-size", BATCH, "--epochs", EPOCHS, "--window", WINDOW, "--seed", SEED),
    ]  # fmt: skip
    return run_jobs(out, jobs, phase="DDP fits, uninterrupted and interrupted")


@pytest.fixture(scope="module")
def resumed(first: Jobs) -> Jobs:
    """The second launch: fresh processes resume the interrupted fits from their checkpoints."""
    ckpt = {name: first.out / name / "ckpt" / f"step{k:03d}.ckpt"
            for name, k in (("cut", CUT_AT), ("stream_cut", STREAM_CUT_AT))}  # fmt: skip
    jobs = []
    if first.ok("cut", 3):  # else the test that needs it fails on that
        args = id_args(first.out / "resumed", "--resume", ckpt["cut"], "--every", 100,
                       num_workers=2)  # fmt: skip
        jobs.append(job("resumed", ID_JOB, *args))
    if first.ok("stream_cut", 3):
        args = stream_args(first.out / "stream_resumed", "--resume", ckpt["stream_cut"])
        jobs.append(job("stream_resumed", ID_JOB, *args))
    return run_jobs(first.out / "second", jobs, phase="DDP fits resumed")


# ------------------------------------------------------------------------- exact resume
@pytest.fixture(scope="module")
def full(first: Jobs) -> dict[str, Any]:
    """The uninterrupted 2-rank run, checkpointing every step."""
    assert first.rc("full") == 0
    return {"out": first.out / "full", "records": records(first.out / "full")}


def test_ranks_step_equally_and_cover_each_id_once_per_epoch(full: dict[str, Any]) -> None:
    """Both ranks step the same number of times (no DDP hang), each rank's stream is its own
    half, and per epoch the union over ranks is every id exactly once."""
    r0, r1 = full["records"]
    assert len(r0) == len(r1) == 2 * STEPS_PER_EPOCH
    assert [r["rank"] for r in r0] == [0] * len(r0) and [r["rank"] for r in r1] == [1] * len(r1)
    assert [(r["epoch"], r["step"]) for r in r0] == [(r["epoch"], r["step"]) for r in r1]
    e0, e1 = by_epoch(r0), by_epoch(r1)
    union = {epoch: e0[epoch] + e1[epoch] for epoch in (0, 1)}
    assert_epochs_exactly_once(union, SIZE, epochs=2)
    assert union[0] != union[1], "epoch 1 must be reshuffled"


def test_every_rank_holds_the_state_rank_0_checkpointed(full: dict[str, Any]) -> None:
    """DESIGN fact 3 under real DDP: at every checkpointed step both ranks' own loader states
    are equal, and equal to the one rank 0 wrote into the checkpoint file."""
    out: Path = full["out"]
    for step in range(1, 2 * STEPS_PER_EPOCH + 1):
        s0, s1 = (
            json.loads((out / f"loader-state-rank{r}-step{step}.json").read_text())
            for r in range(WORLD)
        )
        assert s0 == s1, f"step {step}: rank states differ:\n{s0}\n{s1}"
        assert s0["topology"]["world_size"] == WORLD
        if step in (2, 6):
            ckpt = torch.load(out / "ckpt" / f"step{step:03d}.ckpt", weights_only=False)
            assert ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [s0]


def test_ddp_resume_after_exception_is_exact_per_rank(
    full: dict[str, Any], first: Jobs, resumed: Jobs
) -> None:
    """An exception on both ranks right after the step-6 checkpoint (inside epoch 1), then a
    2-process resume: per rank, before + after equals the uninterrupted run. Run with
    ``num_workers=2`` against the ``num_workers=0`` reference, so it also shows the stream
    does not depend on the workers."""
    k = CUT_AT
    assert first.rc("cut") == 3, "the planned interruption did not happen"
    assert (first.out / "cut" / "ckpt" / f"step{k:03d}.ckpt").exists()
    assert resumed.rc("resumed") == 0
    before_all, after_all = records(first.out / "cut"), records(first.out / "resumed")
    for rank in range(WORLD):
        before, after = before_all[rank], after_all[rank]
        assert len(before) == k, f"rank {rank}"
        assert len(after) == 2 * STEPS_PER_EPOCH - k, f"rank {rank}"
        try:
            assert_resume_exact(full["records"][rank], before, after)
        except AssertionError as exc:
            raise AssertionError(f"rank {rank}: {exc}") from None


@pytest.fixture(scope="module")
def elastic(full: dict[str, Any]) -> dict[str, Any]:
    """Saved by 2 DDP ranks after step 2 (inside epoch 0), resumed by 1 process (no DDP)."""
    k = 2
    ckpt = full["out"] / "ckpt" / f"step{k:03d}.ckpt"
    model = IdModule()
    # The resumed epoch is shorter than a whole one: ElasticResume tells Lightning.
    trainer = L.Trainer(**trainer_kwargs(callbacks=[ElasticResume()]))
    trainer.fit(model, datamodule=IdDataModule(size=SIZE, batch_size=BATCH), ckpt_path=ckpt)
    before = [i for rank in range(WORLD) for r in full["records"][rank][:k] for i in r["ids"]]
    return {"k": k, "before": before, "after": by_epoch(model.records)}


def test_elastic_resume_two_ranks_to_one_process_finishes_the_epoch_exactly(
    elastic: dict[str, Any],
) -> None:
    """The ids both ranks trained on before the step-2 checkpoint plus the ids one process
    trained on after resuming from it are every id of epoch 0 exactly once."""
    before, after = elastic["before"], elastic["after"]
    assert len(before) == elastic["k"] * WORLD * BATCH
    assert_epochs_exactly_once({0: before + after[0]}, SIZE, epochs=1)


def test_fewer_ranks_without_elastic_resume_is_refused_with_the_fix(full: dict[str, Any]) -> None:
    """Without the callback Lightning would end the shorter resumed epoch without its
    end-of-epoch validation: an error naming the fix, not a silently skipped validation."""
    ckpt = full["out"] / "ckpt" / "step002.ckpt"
    with no_entry_point_callbacks():
        trainer = L.Trainer(**trainer_kwargs())
    with pytest.raises(
        LoaderkitError,
        match=r"yields \d+ batches, fewer than the \d+ len\(\) first answered.*ElasticResume",
    ):
        trainer.fit(
            IdModule(), datamodule=IdDataModule(size=SIZE, batch_size=BATCH), ckpt_path=ckpt
        )


def test_elastic_resume_two_ranks_to_one_process_next_epoch_is_complete(
    elastic: dict[str, Any],
) -> None:
    """After that elastic resume, epoch 1 is complete, in the 1-process order."""
    single = ResumableDataLoader(list(range(SIZE)), batch_size=BATCH, shuffle=True, seed=0)
    list(single)
    assert elastic["after"][1] == torch.cat(list(single)).tolist()


# ------------------------------------------------------------------------------ a stream
def test_ddp_stream_equal_steps_symmetric_state_and_exact_resume(
    first: Jobs, resumed: Jobs
) -> None:
    assert first.rc("stream_full") == 0
    full = records(first.out / "stream_full")
    assert [len(r) for r in full] == [2 * STREAM_STEPS] * WORLD, "ranks stepped differently"
    # Every rank wrote its own state_dict() at each step: equal, with both ranks' cursors.
    for step in range(1, 2 * STREAM_STEPS + 1):
        states = [
            json.loads((first.out / "stream_full" / f"loader-state-rank{r}-step{step}.json")
                       .read_text())
            for r in range(WORLD)
        ]  # fmt: skip
        assert states[0] == states[1], f"step {step}: rank states differ"
        assert all(entry is not None for entry in states[0]["ranks"])
    assert first.rc("stream_cut") == 3, "the planned interruption did not happen"
    assert resumed.rc("stream_resumed") == 0
    cut, after = records(first.out / "stream_cut"), records(first.out / "stream_resumed")
    for rank in range(WORLD):
        assert_resume_exact(full[rank], cut[rank], after[rank])


# ------------------------------------------------------------------ the data-parallel group
def test_peers_of_one_data_parallel_rank_train_on_the_same_batches(first: Jobs) -> None:
    assert first.rc("one_replica") == 0
    r0, r1 = records(first.out / "one_replica")
    assert len(r0) == len(r1) == GROUP_EPOCHS * GROUP_SIZE // GROUP_BATCH
    steps = [[(r["epoch"], r["step"], r["ids"]) for r in records] for records in (r0, r1)]
    assert steps[0] == steps[1], "the two peers of data-parallel rank 0 got different batches"
    assert_epochs_exactly_once(by_epoch(r0), GROUP_SIZE, GROUP_EPOCHS)


def test_use_distributed_sampler_false_under_real_ddp_reads_each_ranks_whole_loader(
    first: Jobs,
) -> None:
    """Measured before: each rank trained on half of the loader the user had given it."""
    assert first.rc("user_split") == 0
    for ranks_records in records(first.out / "user_split"):
        assert len(ranks_records) == GROUP_EPOCHS * GROUP_SIZE // GROUP_BATCH
        assert_epochs_exactly_once(by_epoch(ranks_records), GROUP_SIZE, GROUP_EPOCHS)


# ----------------------------------------------------------------------------- DataModules
def test_sharded_datamodule_under_real_ddp(first: Jobs) -> None:
    """``strategy="ddp"``, 2 CPU ranks (gloo), 2 workers each: both ranks step the same count
    and together train every sample once per epoch (plus the documented tail repeat)."""
    assert first.rc("sharded_dm") == 0
    r0, r1 = records(first.out / "sharded_dm")
    assert len(r0) == len(r1) == 2 * 4  # ceil(29 / 8) steps per epoch on each rank
    for epoch in (0, 1):
        ids = by_epoch(r0)[epoch] + by_epoch(r1)[epoch]
        assert set(ids) == set(range(29)) and len(ids) == 29 + 1  # tail 5 dealt as 3 + 3


def test_mixed_datamodule_under_real_ddp(first: Jobs) -> None:
    """A 3:1 mix (32 draws an epoch: 24 of 29 web samples, 8 of 5 books) on 2 ranks: both step
    4 times an epoch and together draw exactly the mix plan's multiset each epoch."""
    assert first.rc("mixed_dm") == 0
    r0, r1 = records(first.out / "mixed_dm")
    assert len(r0) == len(r1) == 2 * 4  # 32 draws / (2 ranks x 4) per epoch
    reader = TokenReader(seq_len=SEQ)
    mix = MixedDataset(
        {
            "web": ShardedDataset(str(first.out / "web"), reader),
            "books": ShardedDataset(str(first.out / "books"), reader),
        },
        weights={"web": 3, "books": 1},
        epoch_size=32,
    )
    ids = np.concatenate([WEB_IDS, BOOKS_IDS])
    for epoch in (0, 1):
        got = by_epoch(r0)[epoch] + by_epoch(r1)[epoch]
        want = ids[mix.plan(4, seed=0).order(epoch).numpy()].tolist()
        assert Counter(got) == Counter(want) and sum(i >= 100 for i in got) == 8


# ---------------------------------------------------------------------------------- shards
@pytest.fixture(scope="module")
def shards(first: Jobs) -> list[list[dict[str, Any]]]:
    assert first.rc("shards") == 0
    return records(first.out / "shards-out")


def test_both_ranks_step_the_same_count(shards: list[list[dict[str, Any]]]) -> None:
    r0, r1 = shards
    assert len(r0) == len(r1) == EPOCHS * SHARD_STEPS_PER_EPOCH
    assert [(r["epoch"], r["step"]) for r in r0] == [(r["epoch"], r["step"]) for r in r1]


def test_union_over_ranks_is_each_sample_once_plus_the_documented_padding(
    first: Jobs, shards: list[list[dict[str, Any]]]
) -> None:
    ds = ShardedDataset(first.out / "shards", TokenReader(seq_len=SEQ))
    assert ds.sizes == SHARD_SIZES
    plan = ds.plan(BATCH, seed=SEED, window=WINDOW)
    n = plan.num_samples
    per_rank = [by_epoch(records) for records in shards]
    for epoch in range(EPOCHS):
        union = Counter(per_rank[0][epoch] + per_rank[1][epoch])
        assert set(union) == set(range(n)), f"epoch {epoch}: lost {set(range(n)) - set(union)}"
        repeats = union - Counter(range(n))
        first_id = int(plan.order(epoch)[0])
        assert repeats == Counter([first_id]), f"epoch {epoch}: repeats {repeats}"
        # Each rank trained on exactly its planned batches, in order.
        for rank in range(WORLD):
            sched = plan.schedule(epoch, start=0, rank=rank, world_size=WORLD)
            want = [sched.indices(s).tolist() for s in range(sched.num_steps)]
            got = [r["ids"] for r in shards[rank] if r["epoch"] == epoch]
            assert got == want, f"rank {rank} epoch {epoch} differs from the plan"
    assert per_rank[0][0] != per_rank[0][1], "epoch 1 must be reshuffled"
