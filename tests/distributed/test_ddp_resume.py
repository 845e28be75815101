"""Exact resume under real Lightning DDP: 2 CPU processes over gloo.

``lightning.Trainer(strategy="ddp", accelerator="cpu", devices=2)`` runs in a
subprocess (``tests/support/lightning_job.py``, launched by ``tests/support/jobs.py``;
Lightning's launcher re-runs that command line for rank 1) with a time limit, so a
hang fails the test instead of blocking CI.
Each rank writes the ids it trained on to ``records-rank{R}.jsonl``.

64 samples, batch size 8 per rank, 2 ranks: 4 steps an epoch, 8 in all. The
dataset size is a multiple of ``world_size * batch_size``, so no wrap-around
padding repeats a sample and "each id exactly once per epoch" is exact.

Two launches in all: the uninterrupted run (checkpointing every step) and a
run interrupted after step 6 (inside epoch 1) with ``num_workers=2``, one after
the other in one launch (``tests/support/jobs.py``); then the 2-process resume,
in fresh processes. The elastic resume (2 ranks saved, 1 process resumes) runs
in the test process: one process is no DDP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from loaderkit import ElasticResume, LoaderkitError, ResumableDataLoader
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

SIZE, BATCH, WORLD = 64, 8, 2
STEPS_PER_EPOCH = SIZE // (BATCH * WORLD)


JOB = "tests.support.lightning_job"
CUT_AT = 6


def job_args(out: Path, *extra: object, num_workers: int = 0) -> list[object]:
    """The DDP script's arguments: 2 ranks, ``SIZE`` ids in batches of ``BATCH``."""
    return ["--out", out, "--devices", WORLD, "--num-workers", num_workers,
            "--size", SIZE, "--batch-size", BATCH, *extra]  # fmt: skip


def records(out: Path) -> list[list[dict[str, Any]]]:
    return [read_records(out / f"records-rank{r}.jsonl") for r in range(WORLD)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Jobs:
    """One launch: the uninterrupted run, then the run interrupted after step ``CUT_AT``."""
    out = tmp_path_factory.mktemp("ddp-resume")
    jobs = [
        job("full", JOB, *job_args(out / "full", "--every", 1)),
        job("cut", JOB, *job_args(out / "cut", "--fail-at", CUT_AT, "--every", CUT_AT,
                                  num_workers=2)),
    ]  # fmt: skip
    return run_jobs(out, jobs, phase="DDP fits: uninterrupted, interrupted")


@pytest.fixture(scope="module")
def full(runs: Jobs) -> dict[str, Any]:
    """The uninterrupted 2-rank run, checkpointing every step."""
    assert runs.rc("full") == 0
    return {"out": runs.out / "full", "records": records(runs.out / "full")}


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
    import json

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
    full: dict[str, Any], runs: Jobs, tmp_path: Path
) -> None:
    """An exception on both ranks right after the step-6 checkpoint (inside epoch 1), then a
    2-process resume: per rank, before + after equals the uninterrupted run. Run with
    ``num_workers=2`` against the ``num_workers=0`` reference, so it also shows the stream
    does not depend on the workers."""
    k = CUT_AT
    assert runs.rc("cut") == 3, "the planned interruption did not happen"
    ckpt = runs.out / "cut" / "ckpt" / f"step{k:03d}.ckpt"
    assert ckpt.exists()
    resumed = run_jobs(
        tmp_path, [job("resumed", JOB, *job_args(tmp_path / "resumed", "--resume", ckpt,
                                                 "--every", 100, num_workers=2))],
        phase="DDP fit resumed",
    )  # fmt: skip
    assert resumed.rc("resumed") == 0
    before_all, after_all = records(runs.out / "cut"), records(tmp_path / "resumed")
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
