"""Exact mid-epoch resume of ``ResumableDataLoader`` under a real ``lightning.Trainer`` (CPU).

Every test checks one claim with the one oracle of ``tests/support/helpers.py``: the
steps of a run interrupted at step k plus the steps of a run resumed from the
step-k checkpoint (a fresh model, DataModule and loader) equal the
uninterrupted run over two epochs. 64 samples in batches of 8: 8 steps an
epoch, 16 in all; k = 3 (inside epoch 0), 8 (the epoch boundary), 11 (inside
epoch 1). Runs are shared between tests through a module-scoped cache: each
distinct run happens once.

The named tests below each prove that loaderkit does not have one of the
failures of Lightning 2.6.6 + torchdata 0.11 listed in ``docs/design.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loops.fetchers import _PrefetchDataFetcher
from torch.utils.data import RandomSampler

from loaderkit import ResumableDataLoader
from tests.support.helpers import (
    SUPPORT_DIR,
    IdDataModule,
    IdDataset,
    IdModule,
    assert_resume_exact,
    by_epoch,
    fit_or_interrupt,
    log_tail,
    read_records,
    run_script,
    step_checkpoints,
    trainer_kwargs,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]

SIZE, BATCH = 64, 8
STEPS_PER_EPOCH = SIZE // BATCH
K_VALUES = (3, 8, 11)  # inside epoch 0, the epoch boundary, inside epoch 1


class Probe(Callback):
    """Records what the fit loop saw: the fetcher, ``len(loader)``, the loader's position."""

    def __init__(self) -> None:
        self.fetchers: list[tuple[str, int | None, int]] = []
        self.lengths: list[int] = []
        self.positions: list[tuple[int, int, int]] = []  # (epoch, batch_idx, position)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        fetcher = trainer.fit_loop._data_fetcher
        assert isinstance(fetcher, _PrefetchDataFetcher)
        self.fetchers.append((type(fetcher).__name__, fetcher.length, fetcher.prefetch_batches))
        self.lengths.append(len(trainer.datamodule.loader))

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        state = trainer.datamodule.loader.state_dict()
        self.positions.append((state["epoch"], state["steps_done"], state["position"]))


@dataclass
class Run:
    records: list[dict[str, Any]]
    features: list[torch.Tensor]
    probe: Probe
    ckpt: Path | None = None


def fit(
    root: Path,
    *,
    num_workers: int,
    fail_at: int | None = None,
    resume: Path | None = None,
    dm_kwargs: dict[str, Any] | None = None,
) -> Run:
    """One ``trainer.fit`` with a fresh model, DataModule and loader."""
    model = IdModule(fail_at=fail_at, keep_x=True)
    dm = IdDataModule(size=SIZE, batch_size=BATCH, num_workers=num_workers, **(dm_kwargs or {}))
    probe = Probe()
    callbacks: list[Callback] = [probe]
    if fail_at is not None:
        callbacks.append(step_checkpoints(root, fail_at))
    trainer = L.Trainer(
        **trainer_kwargs(enable_checkpointing=fail_at is not None, callbacks=callbacks)
    )
    fit_or_interrupt(trainer, model, dm, interrupted=fail_at is not None, resume=resume)
    ckpt = root / f"step{fail_at:03d}.ckpt" if fail_at is not None else None
    return Run(model.records, model.features, probe, ckpt)


class Runs:
    """Each distinct run once per module: uninterrupted, interrupted at k, resumed at k."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[tuple[Any, ...], Run] = {}

    def _get(self, key: tuple[Any, ...], make: Any) -> Run:
        if key not in self._cache:
            path = self.root.joinpath("-".join(map(str, key)))
            path.mkdir(parents=True)
            self._cache[key] = make(path)
        return self._cache[key]

    def full(self, nw: int) -> Run:
        return self._get(("full", nw), lambda p: fit(p, num_workers=nw))

    def interrupted(self, nw: int, k: int) -> Run:
        return self._get(("cut", nw, k), lambda p: fit(p, num_workers=nw, fail_at=k))

    def resumed(self, nw: int, k: int, saved_with: int | None = None) -> Run:
        cut = self.interrupted(nw if saved_with is None else saved_with, k)
        assert cut.ckpt is not None and cut.ckpt.exists(), "no checkpoint at step k"
        return self._get(
            ("resumed", nw, k, saved_with), lambda p: fit(p, num_workers=nw, resume=cut.ckpt)
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("runs"))


def loader_state(ckpt: Path) -> dict[str, Any]:
    """The loader state Lightning wrote into a checkpoint."""
    checkpoint = torch.load(ckpt, weights_only=False)
    states = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert len(states) == 1
    return states[0]


# --------------------------------------------------------------- the oracle, everywhere


@pytest.mark.parametrize("k", K_VALUES)
@pytest.mark.parametrize("nw", [0, 2])
def test_resume_after_exception_is_exact(runs: Runs, nw: int, k: int) -> None:
    """An exception in ``training_step`` right after step k's checkpoint, then a resume from
    it with a fresh model/DataModule/loader: the two runs together are the uninterrupted run.

    k = 3 also covers DESIGN fact 7 (a resume inside epoch 0 must not change epoch 1's
    order), k = 8 the checkpoint written at the very end of an epoch.
    """
    full, cut, after = runs.full(nw), runs.interrupted(nw, k), runs.resumed(nw, k)
    assert len(full.records) == 2 * STEPS_PER_EPOCH
    assert len(cut.records) == k
    assert_resume_exact(full.records, cut.records, after.records)


def test_resume_with_different_num_workers_is_exact(runs: Runs) -> None:
    """A checkpoint saved with ``num_workers=2`` resumes exactly with ``num_workers=0``
    (DESIGN fact 6: torchdata refuses a different ``num_workers``)."""
    full, cut = runs.full(0), runs.interrupted(2, 3)
    after = runs.resumed(0, 3, saved_with=2)
    assert_resume_exact(full.records, cut.records, after.records)
    for step, x in enumerate(after.features, start=3):
        assert torch.equal(x, full.features[step]), f"features differ at step {step}"


@pytest.mark.slow
@pytest.mark.parametrize("nw", [0, 2])
def test_resume_after_kill_9_is_exact(runs: Runs, tmp_path: Path, nw: int) -> None:
    """A training process SIGKILLed right after the step-11 checkpoint was written (no
    teardown, no ``finally``), resumed in a second process: exact, with 0 and 2 workers."""
    k, script = 11, SUPPORT_DIR / "lightning_job.py"
    first, second = tmp_path / "killed", tmp_path / "resumed"
    job = ["--num-workers", str(nw), "--size", str(SIZE), "--batch-size", str(BATCH)]
    rc = run_script(script, [*job, "--out", str(first), "--kill-at", str(k)], tmp_path / "a.log")
    assert rc == -9, f"expected death by SIGKILL, got {rc}:\n{log_tail(tmp_path / 'a.log')}"
    ckpt = first / "ckpt" / f"step{k:03d}.ckpt"
    assert ckpt.exists()
    assert not (first / "ckpt" / f"step{k + 1:03d}.ckpt").exists()
    rc = run_script(script, [*job, "--out", str(second), "--resume", str(ckpt)], tmp_path / "b.log")
    assert rc == 0, log_tail(tmp_path / "b.log")
    before = read_records(first / "records-rank0.jsonl")
    after = read_records(second / "records-rank0.jsonl")
    assert len(before) == k
    assert_resume_exact(runs.full(nw).records, before, after)


# ------------------------------------------------- the measured failures, one test each


def test_resume_in_epoch_1_does_not_replay_epoch_0_order(runs: Runs) -> None:
    """DESIGN fact 2: Lightning creates the iterator *before* it calls ``set_epoch``, so a
    sampler that fixes its epoch at ``iter()`` resumes epoch 1 in epoch 0's order.

    Proves: the batches of a run resumed inside epoch 1 are the uninterrupted run's epoch-1
    batches, and these differ from epoch 0's batches at the same positions. Also checked on
    the loader alone, in Lightning's call order (``iter()``, then ``set_epoch(1)``).
    """
    k = 11
    full, after = runs.full(0), runs.resumed(0, k)
    assert [r["epoch"] for r in after.records] == [1] * (2 * STEPS_PER_EPOCH - k)
    resumed_ids = [r["ids"] for r in after.records]
    assert resumed_ids == [r["ids"] for r in full.records[k:]]
    epoch0_same_slots = [r["ids"] for r in full.records[k - STEPS_PER_EPOCH : STEPS_PER_EPOCH]]
    assert all(a != b for a, b in zip(resumed_ids, epoch0_same_slots, strict=True))

    def make() -> ResumableDataLoader:
        return ResumableDataLoader(list(range(SIZE)), batch_size=BATCH, shuffle=True, seed=0)

    reference = make()
    epochs = [[b.tolist() for b in reference] for _ in range(2)]
    assert epochs[0] != epochs[1]
    saving = make()
    list(saving)
    it = iter(saving)
    for _ in range(3):
        next(it)
    resumed = make()
    resumed.load_state_dict(saving.state_dict())
    it = iter(resumed)
    resumed.set_epoch(1)  # what the fit loop does, after iter()
    assert [b.tolist() for b in it] == epochs[1][3:]


def test_checkpointed_loader_state_is_rank_symmetric(runs: Runs, tmp_path: Path) -> None:
    """DESIGN fact 3: only rank 0's loader state reaches the checkpoint file.

    Proves that this is enough: loaders of rank 0 and rank 1 (``world_size=2``, built
    directly) at the same step have equal state dicts, equal to the one Lightning wrote into
    ``checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]`` from a rank-0 run;
    and rank 1 resumed from rank 0's state -- directly, and through ``trainer.fit`` from rank
    0's checkpoint -- yields exactly rank 1's remaining batches over both epochs.
    """
    k, ws = 2, 2

    def make(rank: int, nw: int = 0) -> ResumableDataLoader:
        return ResumableDataLoader(
            IdDataset(SIZE),
            batch_size=BATCH,
            shuffle=True,
            seed=0,
            rank=rank,
            world_size=ws,
            num_workers=nw,
        )

    states, rank1_stream = [], []
    for rank in (0, 1):
        loader = make(rank)
        it = iter(loader)
        for _ in range(k):
            next(it)
        states.append(loader.state_dict())
        if rank == 1:
            rank1_stream = [b["id"].tolist() for b in it] + [b["id"].tolist() for b in loader]
    assert states[0] == states[1]
    assert "rank" not in str(sorted(states[0]))

    resumed = make(1, nw=2)
    resumed.load_state_dict(states[0])
    resumed_stream = [b["id"].tolist() for b in resumed] + [b["id"].tolist() for b in resumed]
    assert resumed_stream == rank1_stream

    cut = fit(tmp_path, num_workers=0, fail_at=k, dm_kwargs={"rank": 0, "world_size": ws})
    assert cut.ckpt is not None
    assert loader_state(cut.ckpt) == states[0]
    after = fit(
        tmp_path / "resumed",
        num_workers=0,
        resume=cut.ckpt,
        dm_kwargs={"rank": 1, "world_size": ws},
    )
    assert [r["ids"] for r in after.records] == rank1_stream


@pytest.mark.parametrize("k", [3, 11])
def test_random_augmentation_is_reproduced_after_resume(runs: Runs, k: int) -> None:
    """DESIGN fact 4: random augmentations are not reproduced after a resume.

    The dataset adds ``torch.rand`` noise from the global RNG in ``__getitem__``. Proves: the
    features of every resumed batch are bit-identical to the uninterrupted run's, with 0 and
    2 workers, and the uninterrupted runs with 0 and 2 workers are bit-identical too.
    """
    full0, full2 = runs.full(0), runs.full(2)
    assert len(full0.features) == len(full2.features) == 2 * STEPS_PER_EPOCH
    for step, (a, b) in enumerate(zip(full0.features, full2.features, strict=True)):
        assert torch.equal(a, b), f"num_workers 0 and 2 differ at step {step}"
    assert not torch.equal(full0.features[0], full0.features[1])
    for nw, full in ((0, full0), (2, full2)):
        after = runs.resumed(nw, k)
        assert len(after.features) == 2 * STEPS_PER_EPOCH - k
        for step, x in enumerate(after.features, start=k):
            assert torch.equal(x, full.features[step]), f"nw={nw}: features differ at step {step}"


@pytest.mark.parametrize("nw", [0, 2])
def test_lightning_does_not_prefetch_past_the_checkpoint(runs: Runs, nw: int) -> None:
    """DESIGN fact 1: Lightning prefetches one batch ahead when the loader has no length, so
    a state taken from the loader is one batch ahead and a resume skips a batch.

    Proves: ``len(loader)`` is the number of batches each epoch yields, so Lightning's
    ``_PrefetchDataFetcher`` knows the length and does not run ahead; at every step the
    loader's saved position is exactly the batches trained on (even with workers loading
    ahead); the step-3 checkpoint holds position 3 * batch_size; and the resumed stream is
    exact.
    """
    k = 3
    full = runs.full(nw)
    assert full.probe.fetchers == [("_PrefetchDataFetcher", STEPS_PER_EPOCH, 1)] * 2
    assert full.probe.lengths == [STEPS_PER_EPOCH] * 2
    assert [len(ids) for ids in by_epoch(full.records).values()] == [SIZE, SIZE]
    expected = [
        (e, i + 1, SIZE if i + 1 == STEPS_PER_EPOCH else (i + 1) * BATCH)
        for e in range(2)
        for i in range(STEPS_PER_EPOCH)
    ]
    assert full.probe.positions == expected
    cut = runs.interrupted(nw, k)
    assert cut.ckpt is not None
    state = loader_state(cut.ckpt)
    assert (state["epoch"], state["position"], state["steps_done"]) == (0, k * BATCH, k)
    assert_resume_exact(full.records, cut.records, runs.resumed(nw, k).records)


@pytest.mark.parametrize(
    ("size", "batch", "world_size", "drop_last"),
    [(64, 8, 1, False), (61, 8, 1, False), (61, 8, 1, True), (61, 4, 2, False), (61, 4, 3, True)],
)
def test_len_equals_batches_yielded(
    size: int, batch: int, world_size: int, drop_last: bool
) -> None:
    """``len(loader)`` is what an epoch yields on every rank, fresh and after a resume (where it
    counts the steps done before the checkpoint too, as Lightning's batch index does)."""
    for rank in range(world_size):
        kwargs = dict(
            batch_size=batch,
            shuffle=True,
            seed=1,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )
        loader = ResumableDataLoader(list(range(size)), **kwargs)
        n = len(loader)
        assert len(list(loader)) == n and len(loader) == n
        it = iter(loader)
        next(it)
        next(it)
        resumed = ResumableDataLoader(list(range(size)), **kwargs)
        resumed.load_state_dict(loader.state_dict())
        assert len(resumed) == n
        assert 2 + len(list(resumed)) == n


def test_unseeded_random_sampler_resumes_without_loss() -> None:
    """DESIGN fact 8: a random sampler without its own state is resumed by skipping items of a
    *new* permutation (torchdata: 790 unique samples in 1000 draws). loaderkit seeds its
    generator from (seed, epoch), so the resumed epoch is the rest of the same order."""
    data = list(range(1000))

    def make() -> ResumableDataLoader:
        return ResumableDataLoader(data, batch_size=10, sampler=RandomSampler(data), seed=4)

    loader = make()
    it = iter(loader)
    first = [i for _ in range(37) for i in next(it).tolist()]
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    rest = [i for batch in resumed for i in batch.tolist()]
    assert sorted(first + rest) == data  # 1000 unique of 1000
    assert first + rest == [i for batch in make() for i in batch.tolist()]


def test_abandoned_iterator_stops_its_workers_promptly() -> None:
    """A bug found by these tests: an epoch iterator abandoned mid-epoch (an exception in
    ``training_step``, a dropped loader, a newer ``iter()``) was only freed by the cycle
    collector, where torch's worker iterator cannot reach its workers and waits 5 s per
    worker. Dropping it must stop the workers at once."""
    import gc
    import multiprocessing

    def make() -> ResumableDataLoader:
        return ResumableDataLoader(IdDataset(SIZE), batch_size=BATCH, seed=0, num_workers=2)

    loader = make()
    it = iter(loader)
    next(it)
    assert len(multiprocessing.active_children()) == 2
    it2 = iter(loader)  # an independent iterator, as DataLoader's: the first keeps its workers
    gc.disable()  # "at once" means by reference counting, not by the cycle collector
    try:
        del it  # dropping the first stops its workers now
        assert not multiprocessing.active_children()
        next(it2)
        del it2, loader
        assert not multiprocessing.active_children()
    finally:
        gc.enable()
