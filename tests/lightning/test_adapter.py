"""One test per Lightning internal (and hook order) that ``loaderkit/lightning/_adapter.py``
relies on.

Each test fails with a message naming the internal and the adapter function
that reads it, so a Lightning release that moves one is found here, not as a
loader that is silently wrong. The fast tests run in this process against
the installed Lightning; the slow one runs them again against the oldest
Lightning ``pyproject.toml`` declares, installed (no dependencies) into a
cache folder and put first on ``PYTHONPATH`` of a child pytest.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.fabric.utilities.data import sized_len
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import CombinedLoader
from packaging.version import Version

from loaderkit import (
    AttachLoaders,
    IterableReader,
    LoaderkitError,
    ResumableDataLoader,
    StateMismatchError,
    StreamingShardedDataset,
    attach_host,
)
from loaderkit._callers import NO_HOST, host_of
from loaderkit.lightning import _adapter
from tests.support.helpers import (
    AnswersForGroup,
    DataParallelOf,
    IdDataModule,
    IdDataset,
    IdModule,
    no_entry_point_callbacks,
    step_checkpoints,
    trainer_kwargs,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec"),
]

REPO = Path(__file__).resolve().parents[2]
ADAPTER = "loaderkit/lightning/_adapter.py"


def changed(internal: str, reader: str) -> str:
    """The message of a failed internal check."""
    return (
        f"Lightning {L.__version__} changed {internal}, which {ADAPTER} reads in {reader}: "
        "update the adapter (and this test) to the new internal"
    )


class _Probe:
    """A train loader that records what the adapter sees whenever Lightning sizes or iterates it."""

    def __init__(self, batches: int = 4) -> None:
        self.length = batches
        self.seen: list[dict[str, Any]] = []
        self.epochs: list[int] = []
        self.sampler = _EpochRecorder(self.epochs)

    def _record(self, where: str) -> None:
        host = host_of(self)
        self.seen.append(
            {"where": where, "drives": host.drives(self), "topology": host.data_parallel()}
        )

    def __len__(self) -> int:
        self._record("len")
        return self.length

    def __iter__(self) -> Iterator[torch.Tensor]:
        self._record("iter")
        for i in range(self.length):
            if i == 0:
                self._record("next")
            yield torch.full((1, 4), float(i))


class _Unsized:
    """A train loader without a length: Lightning prefetches from it."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        for i in range(4):
            yield torch.full((1, 4), float(i))


class _EpochRecorder:
    def __init__(self, epochs: list[int]) -> None:
        self.epochs = epochs

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


class _Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.steps: list[tuple[int, int]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.steps.append((self.current_epoch, batch_idx))
        return self.layer(batch).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.fixture(scope="module")
def probed() -> dict[str, Any]:
    """One fit of 2 epochs over a probe, under a strategy naming data-parallel rank 1 of 3."""
    probe = _Probe()
    trainer = L.Trainer(
        **trainer_kwargs(strategy=DataParallelOf(1, 3), callbacks=[AttachLoaders()])
    )
    trainer.fit(_Linear(), train_dataloaders=probe)
    return {"probe": probe, "trainer": trainer}


def test_attach_loaders_hosts_a_loader_from_its_first_len_until_the_run_ends(
    probed: dict[str, Any],
) -> None:
    # The callback's setup hook runs before Lightning first sizes or iterates a train loader
    # (FitLoop.setup_data), and a running fit lists it in fit_loop._combined_loader.
    seen = probed["probe"].seen
    assert seen[0]["where"] == "len" and {s["where"] for s in seen} == {"len", "iter", "next"}
    assert all(s["drives"] and s["topology"] == (1, 3) for s in seen), changed(
        "the order of Callback.setup and FitLoop.setup_data, trainer.state (fn 'fit', status "
        f"'running') or fit_loop._combined_loader.flattened; seen {seen}",
        "LightningHost._fitting",
    )
    assert host_of(probed["probe"]) is NO_HOST  # teardown ended the run


def test_a_trainer_that_is_not_fitting_drives_no_loader(probed: dict[str, Any]) -> None:
    host = _adapter.LightningHost(probed["trainer"])
    assert host.data_parallel() == (1, 3)  # the strategy still names its group
    assert not host.drives(probed["probe"]) and host.held_batches(probed["probe"]) is None


def test_ddp_and_model_parallel_strategies_name_their_data_parallel_group() -> None:
    ddp = DDPStrategy(parallel_devices=[torch.device("cpu")] * 2)
    ddp.set_world_ranks()
    assert _adapter.data_parallel_of(_Driver(ddp)) == (ddp.global_rank, 2), changed(
        "DDPStrategy.distributed_sampler_kwargs", "data_parallel_of"
    )
    from lightning.pytorch.strategies import ModelParallelStrategy

    mp = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2)
    mp._device_mesh = {"data_parallel": _Mesh(size=2, local_rank=1)}  # type: ignore[assignment]
    assert _adapter.data_parallel_of(_Driver(mp)) == (1, 2), changed(
        "ModelParallelStrategy.distributed_sampler_kwargs (the 'data_parallel' mesh)",
        "data_parallel_of",
    )


class _Driver:
    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy


class _Mesh:
    def __init__(self, size: int, local_rank: int) -> None:
        self._size, self._local_rank = size, local_rank

    def size(self) -> int:
        return self._size

    def get_local_rank(self) -> int:
        return self._local_rank


def test_a_strategy_without_rank_and_replicas_is_an_error_naming_the_fix() -> None:
    class Odd:
        @property
        def distributed_sampler_kwargs(self) -> dict[str, int]:
            return {"replicas": 2}

    with pytest.raises(LoaderkitError, match=r"Odd.distributed_sampler_kwargs is \{'replicas'.*"
                       r"Pass rank= and world_size="):  # fmt: skip
        _adapter.data_parallel_of(_Driver(Odd()))


def _share(rank: int, world_size: int) -> list[list[int]]:
    alone = ResumableDataLoader(IdDataset(24), batch_size=2, shuffle=True, seed=0, rank=rank,
                                world_size=world_size)  # fmt: skip
    return [b["id"].tolist() for _ in range(2) for b in alone]


@pytest.mark.parametrize("how", ["datamodule", "callback"])
def test_a_loader_under_a_data_parallel_strategy_yields_that_ranks_share(how: str) -> None:
    # Rank and world size come from the data-parallel group the strategy names, not the
    # global process group (here: none at all), whichever way the loader gets its host.
    model = IdModule()
    callbacks = [AttachLoaders()] if how == "callback" else []
    trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(2, 3), callbacks=callbacks))
    trainer.fit(model, datamodule=IdDataModule(size=24, batch_size=2, host=how == "datamodule"))
    assert [r["ids"] for r in model.records] == _share(2, 3)


class Predicts(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[int] = []

    def predict_step(self, batch: Any, batch_idx: int) -> None:
        self.seen += [int(i) for i in batch]


def test_a_prediction_on_several_ranks_that_would_repeat_a_sample_is_refused() -> None:
    """Measured before: 11 samples in batches of 3 on 2 ranks predicted sample 0 twice
    (Lightning's own unrepeated sampler gives each sample once)."""
    trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(1, 2)))
    with pytest.raises(ValueError, match=r"trainer.predict on 2 ranks would repeat 1 sample"):
        trainer.predict(Predicts(), dataloaders=ResumableDataLoader(list(range(11)), batch_size=3))
    model = Predicts()  # a split the ranks share evenly repeats none
    trainer.predict(model, dataloaders=ResumableDataLoader(list(range(12)), batch_size=3))
    assert model.seen == [3, 4, 5, 9, 10, 11]
    given = torch.utils.data.DistributedSampler(range(11), num_replicas=2, rank=1, shuffle=False)
    model = Predicts()  # a DistributedSampler the user gave pads as Lightning lets it
    trainer.predict(model, dataloaders=ResumableDataLoader(list(range(11)), sampler=given))
    assert model.seen == [1, 3, 5, 7, 9, 0]


class Validates(Predicts):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.seen += [int(i) for i in batch]


def test_a_validation_repeating_whole_batches_on_several_ranks_is_refused() -> None:
    """Measured before: a batch sampler (e.g. a bucketing one) dealt whole batches to 2 ranks,
    so 13 samples were evaluated for 9 (Lightning's DistributedSampler pads at most 1)."""
    from loaderkit import BucketBatchSampler

    if Version(L.__version__) < Version("2.6"):
        pytest.skip("Lightning 2.5 eval loops read batch_sampler.sampler, which ours lacks")
    trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(1, 2)))
    sampler = BucketBatchSampler([1] * 9, batch_size=4, shuffle=False)
    bucketed = ResumableDataLoader(list(range(9)), batch_sampler=sampler)
    with pytest.raises(
        ValueError, match=r"validate on 2 ranks would repeat 4 sample.*eval_batches_by_rank\(\)"
    ):  # hunter 345: the DataModule hook is named
        trainer.validate(Validates(), dataloaders=bucketed)
    model = Validates()  # plain batches pad one sample, as DistributedSampler does
    trainer.validate(model, dataloaders=ResumableDataLoader(list(range(9)), batch_size=4))
    assert len(model.seen) == 5


@pytest.mark.parametrize("how", ["datamodule", "callback", "entry point"])
def test_use_distributed_sampler_false_leaves_each_rank_the_whole_loader(how: str) -> None:
    """Measured before: rank 2 of 3 trained on a third of the 24 samples its loader held (the
    user had split the data, as Lightning's flag says); now it reads them all, as a torch
    DataLoader does, while a rank/world_size the user passed still splits."""
    callbacks = [AttachLoaders()] if how == "callback" else []
    kwargs = trainer_kwargs(
        strategy=DataParallelOf(2, 3), callbacks=callbacks, use_distributed_sampler=False
    )
    model = IdModule()
    L.Trainer(**kwargs).fit(model, datamodule=IdDataModule(24, 2, host=how == "datamodule"))
    assert [r["ids"] for r in model.records] == _share(0, 1)
    for given, share in [({"rank": 1, "world_size": 3}, (1, 3)), ({"world_size": 3}, (2, 3))]:
        model = IdModule()  # a split the user asked for; the rest of it from the group
        kwargs["strategy"] = DataParallelOf(2, 3)
        L.Trainer(**kwargs).fit(model, datamodule=IdDataModule(24, 2, **given))
        assert [r["ids"] for r in model.records] == _share(*share)


def test_use_distributed_sampler_false_predicts_every_sample_of_each_ranks_loader() -> None:
    # The repeat refusal (several ranks sharing one split) does not apply: nothing is shared.
    trainer = L.Trainer(
        **trainer_kwargs(strategy=DataParallelOf(1, 2), use_distributed_sampler=False)
    )
    model = Predicts()
    trainer.predict(model, dataloaders=ResumableDataLoader(list(range(11)), batch_size=3))
    assert model.seen == list(range(11))


class _Lines(torch.utils.data.IterableDataset):
    """A rank's own records; its state is its offset, as a file reader keeps."""

    def __init__(self, rank: int) -> None:
        self.rows, self.offset = [f"r{rank}-{i}" for i in range(12)], 0

    def __iter__(self) -> Iterator[str]:
        while self.offset < len(self.rows):
            self.offset += 1
            yield self.rows[self.offset - 1]

    def state_dict(self) -> dict[str, int]:
        return {"offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.offset = state["offset"]


def _own_part_loader(rank: int, kind: str, flag: bool = False) -> ResumableDataLoader:
    """Rank ``rank``'s loader over its own data: the flag, or ``world_size=1`` given."""
    trainer = L.Trainer(
        **trainer_kwargs(strategy=DataParallelOf(rank, 2), use_distributed_sampler=not flag)
    )
    data: Any = _Lines(rank)
    if kind == "stream":
        shards = [(rank * 100 + 10 * s, 5) for s in range(3)]
        data = StreamingShardedDataset(
            shards, IterableReader(lambda s: iter(range(s[0], s[0] + s[1]))), steps_per_epoch=4
        )
    split = {} if flag else {"rank": 0, "world_size": 1}
    return attach_host(ResumableDataLoader(data, batch_size=2, **split), trainer)


@pytest.mark.parametrize("flag", [True, False], ids=["flag", "world_size=1"])
@pytest.mark.parametrize("kind", ["iterable", "stream"])
def test_rank_0s_state_of_its_own_data_is_refused_on_another_rank(kind: str, flag: bool) -> None:
    # Lightning restores rank 0's checkpoint on every rank. Rank 1 resumed its own stream at
    # rank 0's offset (an IterableDataset's state: samples trained twice, no error); a
    # stream's fingerprint already refuses other shards.
    saver = _own_part_loader(0, kind, flag)
    at_start = saver.state_dict()
    it = iter(saver)
    next(it), next(it)
    state = saver.state_dict()
    message = "rank 0's place in its own data, this is rank 1" if kind == "iterable" else "differs"
    with pytest.raises(StateMismatchError, match=message):
        _own_part_loader(1, kind, flag).load_state_dict(state)
    again = _own_part_loader(0, kind, flag)  # rank 0 resumes its own place
    again.load_state_dict(state)
    rest = list(_own_part_loader(0, kind, flag))[2:]
    plain = [b.tolist() if isinstance(b, torch.Tensor) else b for b in rest]
    assert [b.tolist() if isinstance(b, torch.Tensor) else b for b in again] == plain
    if kind == "iterable":  # an epoch's start holds no dataset state: every rank takes it
        other = _own_part_loader(1, kind, flag)
        other.load_state_dict(at_start)
        assert list(other) == list(_own_part_loader(1, kind, flag))


class _Replayed(torch.utils.data.IterableDataset):
    """A rank's own records with no state of its own: resumed by replay."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __iter__(self) -> Iterator[str]:
        return iter(f"r{self.rank}-{i}" for i in range(12))


@pytest.mark.parametrize("stateful", [True, False], ids=["state", "replay"])
def test_a_place_in_its_own_part_is_refused_under_another_rank_or_group_size(
    stateful: bool,
) -> None:
    # Saved by rank 0 of 2 and resumed on one process, the dataset read its part of one
    # (all the data) from rank 0's place: 8 samples trained twice, no error. A replay on
    # rank 1 was refused as a nondeterministic stream.
    def loader(rank: int, world_size: int) -> ResumableDataLoader:
        data = _Lines(rank) if stateful else _Replayed(rank)
        trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(rank, world_size)))
        return attach_host(ResumableDataLoader(data, batch_size=2, rank=0, world_size=1), trainer)

    saver = loader(0, 2)
    it = iter(saver)
    next(it), next(it)
    state = saver.state_dict()
    with pytest.raises(StateMismatchError, match=r"this is rank 0 \(saved under 2 ranks, now 1\)"):
        loader(0, 1).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"rank 0's place in its own data, this is rank 1"):
        loader(1, 2).load_state_dict(state)
    again = loader(0, 2)
    again.load_state_dict(state)
    assert list(again) == [["r0-4", "r0-5"], *(list(loader(0, 2)))[3:]]


def test_a_drawn_seed_is_the_ranks_common_one_where_each_reads_its_own_part() -> None:
    # seed_everything(base + rank) drew a seed per rank; rank 1 then resumed mid-epoch in
    # rank 0's permutation (15 of 20 samples).
    seeds = []
    for rank in (0, 1):
        torch.manual_seed(100 + rank)
        trainer = L.Trainer(
            **trainer_kwargs(strategy=DataParallelOf(rank, 2), use_distributed_sampler=False)
        )
        loader = attach_host(
            ResumableDataLoader(list(range(20)), batch_size=4, shuffle=True), trainer
        )
        next(iter(loader))
        seeds.append(loader.state_dict()["plan"]["seed"])
    assert seeds[0] == seeds[1]


def test_the_trainers_use_distributed_sampler_is_read() -> None:
    for flag in (True, False):
        trainer = L.Trainer(**trainer_kwargs(use_distributed_sampler=flag))
        assert _adapter.LightningHost(trainer).splits_loaders() is flag, changed(
            "where Trainer(use_distributed_sampler=) is kept "
            "(trainer._accelerator_connector.use_distributed_sampler)",
            "splits_loaders",
        )
    fabric = L.Fabric(accelerator="cpu", devices=1)  # its flag is setup_dataloaders'
    assert _adapter.LightningHost(fabric).splits_loaders()


def test_load_from_checkpoint_is_a_class_call_guarded_by_lightning() -> None:
    # LoaderDataModule.load_from_checkpoint wraps Lightning's under the same guard.
    guard = vars(L.LightningDataModule)["load_from_checkpoint"]
    assert isinstance(guard, _adapter.restricted_classmethod), changed(
        "the descriptor of LightningDataModule.load_from_checkpoint "
        "(lightning.pytorch.utilities.model_helpers._restricted_classmethod)",
        "restricted_classmethod",
    )
    from loaderkit import TensorDataModule

    with pytest.raises(TypeError, match="class"):
        TensorDataModule(torch.zeros(4, 1)).load_from_checkpoint("unused.ckpt")


def test_a_loader_without_a_host_uses_the_global_group() -> None:
    # Documented limit (docs/design.md): nothing hands it the Trainer, so it cannot know
    # the strategy's data-parallel group.
    model = IdModule()
    with no_entry_point_callbacks():
        trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(2, 3)))
    trainer.fit(model, datamodule=IdDataModule(size=24, batch_size=2, host=False))
    assert [r["ids"] for r in model.records] == _share(0, 1)


def test_an_installed_loaderkit_hosts_a_bare_loader_without_a_callback_in_the_code() -> None:
    # Lightning's callbacks_factory entry point (pyproject.toml) adds the host to every
    # Trainer, so a loader returned bare from train_dataloader() knows the group.
    model = IdModule()
    trainer = L.Trainer(**trainer_kwargs(strategy=DataParallelOf(2, 3)))
    trainer.fit(model, datamodule=IdDataModule(size=24, batch_size=2, host=False))
    assert [r["ids"] for r in model.records] == _share(2, 3)


def test_a_datamodules_loader_keeps_its_trainers_group_outside_the_trainer() -> None:
    # Handed self.trainer, the loader knows its run's group wherever it is asked, not
    # only while the Trainer is on the call stack.
    dm = IdDataModule(size=24, batch_size=2)
    L.Trainer(**trainer_kwargs(strategy=DataParallelOf(2, 3))).fit(IdModule(), datamodule=dm)
    assert len(dm.train_dataloader()) == 4  # 24 samples / 3 ranks / 2 per batch


def test_the_fit_loop_sets_the_epoch_on_the_samplers(probed: dict[str, Any]) -> None:
    assert probed["probe"].epochs == [0, 1], changed(
        "the fit loop's set_epoch(epoch) calls on loader.sampler at each epoch start "
        "(_set_sampler_epoch), through which loaderkit's sampler views learn the epoch",
        "(no code: loader/_views.py relies on it)",
    )


class _HeldAtEachStep(L.Callback):
    def __init__(self) -> None:
        self.held: list[int] = []

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        (loader,) = _adapter.train_loaders(trainer)
        self.held.append(_adapter.LightningHost(trainer).held_batches(loader))


def test_the_fetcher_holds_one_batch_ahead_of_an_unsized_loader_only() -> None:
    counts = {}
    for name, loader in (("unsized", _Unsized()), ("sized", _Probe())):
        held = _HeldAtEachStep()
        trainer = L.Trainer(**trainer_kwargs(max_epochs=1, callbacks=[held]))
        trainer.fit(_Linear(), train_dataloaders=loader)
        counts[name] = held.held
    assert counts == {"unsized": [1, 1, 1, 0], "sized": [0, 0, 0, 0]}, changed(
        f"fit_loop._data_fetcher.batches (the prefetched batches; got {counts})",
        "LightningHost.held_batches",
    )


class _UnsizedEpochs:
    """An unsized train loader recording, at each ``iter()``, what the host answers to
    ``asks`` (the epoch it starts)."""

    asks = "epoch_starting"

    def __init__(self) -> None:
        self.starting: list[Any] = []
        self.sampler = _EpochRecorder([])

    def __iter__(self) -> Iterator[torch.Tensor]:
        self.starting.append(getattr(host_of(self), self.asks)(self))
        for i in range(2):
            yield torch.full((1, 4), float(i))


def test_an_unsized_loader_is_iterated_before_the_fit_loop_sets_its_epoch(tmp_path: Path) -> None:
    loader = _UnsizedEpochs()
    ends = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)
    kwargs = trainer_kwargs(max_epochs=2, enable_checkpointing=True)
    trainer = L.Trainer(**kwargs, callbacks=[AttachLoaders(), ends])
    trainer.fit(_Linear(), train_dataloaders=loader)
    first = sorted(tmp_path.glob("epoch=0*.ckpt"))[0]
    trainer = L.Trainer(**trainer_kwargs(max_epochs=2), callbacks=[AttachLoaders()])
    trainer.fit(_Linear(), train_dataloaders=loader, ckpt_path=first)
    # iter() of epoch 0 precedes set_epoch(0); the epoch-end restore starts epoch 1.
    assert loader.starting[0] == 0 and loader.sampler.epochs[0] == 0
    assert loader.starting[2] == 1, changed(
        f"fit_loop.epoch_progress.current.processed at an unsized loader's iter() "
        f"(got {loader.starting})",
        "LightningHost.epoch_starting",
    )


class _FailingStep(_Linear):
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if batch_idx == 1:
            raise RuntimeError("the step fails")
        return super().training_step(batch, batch_idx)


class _HeldOnException(L.Callback):
    def __init__(self) -> None:
        self.held: list[Any] = []

    def on_exception(self, trainer: L.Trainer, *args: Any) -> None:
        (loader,) = _adapter.train_loaders(trainer)
        host = _adapter.LightningHost(trainer)
        self.held.append((host.held_batches(loader), host.ended()))


def test_a_failed_step_is_started_not_processed_while_the_trainer_is_interrupted() -> None:
    held = _HeldOnException()
    trainer = L.Trainer(**trainer_kwargs(max_epochs=1, callbacks=[held]))
    with pytest.raises(RuntimeError, match="the step fails"):
        trainer.fit(_FailingStep(), train_dataloaders=_Unsized())
    # The prefetched batch and the failed one; the host ends once the handling is over.
    assert held.held == [(2, False)] and _adapter.LightningHost(trainer).ended(), changed(
        f"trainer.state (status 'interrupted', stage) or epoch_loop.batch_progress.current "
        f"(started - processed) in on_exception (got {held.held})",
        "LightningHost.held_batches / ended",
    )


class _FailsAtThird:
    """An unsized train loader whose third batch fails to load."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        yield from (torch.zeros(1, 4), torch.ones(1, 4))
        raise ValueError("the third batch fails")


class _FetcherOnException(L.Callback):
    def on_exception(self, trainer: L.Trainer, *args: Any) -> None:
        fetcher, batch = trainer.fit_loop._data_fetcher, trainer.fit_loop.epoch_loop.batch_progress
        self.seen = (len(fetcher.batches), fetcher.length, batch.current.ready)


def test_a_failed_refill_leaves_the_popped_batch_neither_listed_nor_ready() -> None:
    seen = _FetcherOnException()
    trainer = L.Trainer(**trainer_kwargs(max_epochs=1, callbacks=[seen]))
    with pytest.raises(ValueError, match="third batch"):
        trainer.fit(_Linear(), train_dataloaders=_FailsAtThird())
    # Two batches handed out, one trained; the second was popped as the third's draw raised.
    assert seen.seen == (0, None, 1), changed(
        f"_PrefetchDataFetcher.__next__ (pop, then refill) or its length (got {seen.seen})",
        "LightningHost.held_batches",
    )


class _RestoredEpochs(_UnsizedEpochs):
    """Records, at each ``iter()``, the epoch the host goes on to after a restore."""

    asks = "epoch_after_restore"


def test_a_restore_on_an_epochs_last_batch_names_the_next_epoch(tmp_path: Path) -> None:
    kwargs = trainer_kwargs(max_epochs=2, enable_checkpointing=True)
    trainer = L.Trainer(**kwargs, callbacks=[AttachLoaders(), step_checkpoints(tmp_path, 1)])
    trainer.fit(_Linear(), train_dataloaders=_RestoredEpochs())
    seen = {}
    for step in (1, 2):  # mid-epoch 0; epoch 0's last batch (2 a epoch)
        loader = _RestoredEpochs()
        trainer = L.Trainer(**trainer_kwargs(max_epochs=2), callbacks=[AttachLoaders()])
        trainer.fit(
            _Linear(), train_dataloaders=loader, ckpt_path=tmp_path / f"step{step:03d}.ckpt"
        )
        seen[step] = loader.starting[0]
    assert seen == {1: None, 2: 1}, changed(
        "fit_loop.restarting, epoch_loop.batch_progress.is_last_batch and "
        f"epoch_progress.current at an unsized loader's first iter() (got {seen})",
        "LightningHost.epoch_after_restore",
    )


class _RestoredPast(_Probe):
    """Records, at each ``set_epoch``, whether the host restored past the saved epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.restored: list[tuple[int, bool]] = []
        self.sampler = self

    def set_epoch(self, epoch: int) -> None:
        self.restored.append((epoch, host_of(self).restored_past(self)))


def test_a_restore_says_whether_its_epoch_is_over(tmp_path: Path) -> None:
    def fit(ckpt: Path | None = None, **options: Any) -> list[tuple[int, bool]]:
        loader = _RestoredPast()
        kwargs = trainer_kwargs(enable_checkpointing=ckpt is None, **options)
        callbacks = [AttachLoaders()] + [step_checkpoints(tmp_path / str(options), 1)] * (not ckpt)
        L.Trainer(**kwargs, callbacks=callbacks).fit(_Linear(), loader, ckpt_path=ckpt)
        return loader.restored

    assert fit(max_epochs=2) == [(0, False), (1, False)]
    limited = {"max_epochs": 2, "limit_train_batches": 2}
    fit(**limited)
    seen = {
        "mid": fit(tmp_path / "{'max_epochs': 2}" / "step001.ckpt", max_epochs=2),
        "limited": fit(tmp_path / str(limited) / "step002.ckpt", **limited),
    }
    # limit_train_batches ends epoch 0 at the saved batch: the restore goes on to epoch 1.
    assert seen == {"mid": [(0, False), (1, False)], "limited": [(1, True)]}, changed(
        f"fit_loop.restarting and epoch_progress.current at set_epoch (got {seen})",
        "LightningHost.restored_past",
    )


class _StatefulEpochs(_UnsizedEpochs):
    """Saves ``{"epoch": n}`` (n: its iterations so far); records ``skipped_state`` at iter()."""

    asks = "skipped_state"

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[dict[str, Any]] = []

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": len(self.starting) - 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded.append(state)


def test_an_epoch_end_checkpoint_leaves_the_loader_state_unloaded(tmp_path: Path) -> None:
    ends = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)
    kwargs = trainer_kwargs(max_epochs=1, enable_checkpointing=True)
    L.Trainer(**kwargs, callbacks=[AttachLoaders(), ends]).fit(
        _Linear(), train_dataloaders=_StatefulEpochs()
    )
    loader = _StatefulEpochs()
    trainer = L.Trainer(**trainer_kwargs(max_epochs=3), callbacks=[AttachLoaders()])
    ckpt = sorted(tmp_path.glob("epoch=0*.ckpt"))[0]
    trainer.fit(_Linear(), train_dataloaders=loader, ckpt_path=ckpt)
    trainer.fit_loop.max_epochs = 4
    trainer.fit(_Linear(), train_dataloaders=loader)  # a later fit restores nothing
    # Offered in the restored fit's first epoch only (fit_loop._loaded_from_state_dict).
    offered = (loader.loaded, loader.starting)
    first, later = loader.starting[0], loader.starting[-3:]  # epoch 2, the next fit's 3
    assert (loader.loaded, first, later) == ([], {"epoch": 0}, [None] * 3), changed(
        "fit_loop.restarting, _loaded_from_state_dict, _combined_loader_states_to_load after an "
        f"epoch-end restore (loaded, offered: {offered})",
        "LightningHost.skipped_state",
    )


class _AnyBatch(_Linear):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(torch.ones(1, 4)).sum()


def test_a_combined_loaders_mode_says_whether_it_cycles() -> None:
    class Mode(L.Callback):
        def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
            loader = _adapter.train_loaders(trainer)[0]
            host = _adapter.LightningHost(trainer)
            seen[mode] = host.cycles(loader)
            counts[mode] = host.counts_run_outs(loader)

    seen: dict[str, Any] = {}
    counts: dict[str, Any] = {}
    for mode in ("max_size_cycle", "max_size", "unsized"):
        second: Any = _UnsizedEpochs() if mode == "unsized" else _Probe(2)
        combined = "max_size_cycle" if mode == "unsized" else mode
        loaders = CombinedLoader({"a": _Probe(), "b": second}, mode=combined)
        trainer = L.Trainer(**trainer_kwargs(max_epochs=1, callbacks=[Mode()]))
        trainer.fit(_AnyBatch(), train_dataloaders=loaders)
    assert seen == {"max_size_cycle": True, "max_size": False, "unsized": True}, changed(
        f"fit_loop._combined_loader._mode (got {seen})", "LightningHost.cycles"
    )
    # Only without a length does the epoch end once every loader ran out.
    assert counts == {"max_size_cycle": False, "max_size": False, "unsized": True}, changed(
        f"sized_len(fit_loop._combined_loader) (got {counts})", "LightningHost.counts_run_outs"
    )


def test_a_trainers_loops_hold_each_runs_loaders_at_its_teardown() -> None:
    train, val, test, predict, other = (
        torch.utils.data.DataLoader(torch.ones(2, 4)) for _ in range(5)
    )

    class Loaders(_AnyBatch):
        def val_dataloader(self) -> Any:
            return val

        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            pass

        test_step = validation_step

        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            return None

    class Held(L.Callback):
        def teardown(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
            held[stage] = _adapter.held_loaders(trainer)

    held: dict[str, list[Any]] = {}
    trainer = L.Trainer(**trainer_kwargs(max_epochs=1, limit_val_batches=1, callbacks=[Held()]))
    model = Loaders()
    trainer.fit(model, train_dataloaders=train)
    trainer.validate(model, dataloaders=[val, other])
    trainer.test(model, dataloaders=test)
    trainer.predict(model, dataloaders=predict)
    # (Lightning rebuilds a predict DataLoader to record indices: a ResumableDataLoader is kept.)
    want = {"fit": [train, val], "validate": [val, other], "test": [test], "predict": [predict]}
    got = {
        stage: [w for w in want[stage] if any(dl is w for dl in loaders)]
        for stage, loaders in held.items()
    }
    got["predict"] = [predict] if len(held.get("predict", ())) == 1 else held.get("predict", [])
    assert got == want, changed(
        "the _combined_loader (flattened) of fit_loop, fit_loop.epoch_loop.val_loop, "
        f"validate_loop, test_loop or predict_loop at a run's teardown (got {held})",
        "held_loaders",
    )


class _Resize(L.Callback):
    """At epoch 1's start the probe grows to 6 batches and the adapter resizes the epoch."""

    def __init__(self, probe: _Probe) -> None:
        self.probe = probe
        self.snapshots: list[dict[str, Any]] = []

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        loop = trainer.fit_loop
        self.snapshots.append(
            {
                "limits": list(loop._combined_loader.limits),
                "iterator_limits": list(loop._combined_loader._iterator.limits),
                "max_batches": loop.max_batches,
                "fetcher": (loop._data_fetcher.length, loop._data_fetcher.done),
                "val_check_batch": trainer.val_check_batch,
                "loaders": _adapter.train_loaders(trainer),
                "sized_len": sized_len(loop._combined_loader),
            }
        )
        if trainer.current_epoch == 1:
            self.probe.length = 6
            _adapter.resize_train_epoch(trainer, lambda dl: dl is self.probe)


class _Validated(_Linear):
    def __init__(self) -> None:
        super().__init__()
        self.validated: list[int] = []

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        if batch_idx == 0:
            self.validated.append(self.global_step)


def test_an_epoch_is_resized_through_the_lengths_lightning_derived_it_from() -> None:
    probe = _Probe(batches=4)
    resize = _Resize(probe)
    model = _Validated()
    trainer = L.Trainer(
        **trainer_kwargs(callbacks=[resize], val_check_interval=0.5, limit_val_batches=1)
    )
    trainer.fit(model, train_dataloaders=probe, val_dataloaders=[torch.zeros(1, 4)])
    first = resize.snapshots[0]
    assert first["limits"] == first["iterator_limits"] == [4], changed(
        "fit_loop._combined_loader.limits / ._iterator.limits", "resize_train_epoch"
    )
    assert (first["max_batches"], first["fetcher"], first["val_check_batch"]) == (
        4,
        (4, False),
        2,
    ), changed(
        "fit_loop.max_batches, _data_fetcher.length/done or trainer.val_check_batch",
        "resize_train_epoch",
    )
    assert first["loaders"] == [probe], changed("_combined_loader.flattened", "train_loaders")
    assert first["sized_len"] == 4, changed("sized_len(combined loader)", "resize_train_epoch")
    # Without the resize Lightning would stop epoch 1 after 4 batches and validate at 2.
    assert [e for e, _ in model.steps].count(1) == 6, changed(
        "how the fit loop counts an epoch's batches", "resize_train_epoch"
    )
    assert model.validated == [2, 4, 7, 10], changed(
        "how a fractional val_check_interval becomes trainer.val_check_batch",
        "resize_train_epoch",
    )


class _RestartSpy(L.Callback):
    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        epoch_loop = trainer.fit_loop.epoch_loop
        progress = epoch_loop.batch_progress
        self.seen = (
            epoch_loop.restarted_on_train_batch_end,
            progress.is_last_batch,
            progress.current.completed,
        )


def test_a_restore_after_an_epochs_last_batch_is_marked_in_the_batch_progress(
    tmp_path: Path,
) -> None:
    # resize_train_epoch lifts current.completed so that Lightning's own end-of-epoch
    # test (completed >= the epoch's length) holds when fewer ranks made the epoch longer.
    first = L.Trainer(
        **trainer_kwargs(
            max_epochs=1, enable_checkpointing=True, callbacks=[step_checkpoints(tmp_path, 1)]
        )
    )
    first.fit(_Linear(), train_dataloaders=_Probe())
    spy = _RestartSpy()
    model = _Linear()
    second = L.Trainer(**trainer_kwargs(callbacks=[spy]))
    second.fit(model, train_dataloaders=_Probe(), ckpt_path=tmp_path / "step004.ckpt")
    assert spy.seen == (True, True, 3), changed(
        "fit_loop.epoch_loop.restarted_on_train_batch_end / batch_progress.is_last_batch / "
        f"batch_progress.current.completed after an end-of-epoch restore (got {spy.seen})",
        "resize_train_epoch",
    )
    assert model.steps == [(1, i) for i in range(4)]


class _Recorder(L.LightningModule):
    """Trains on ``IdDataset`` batches and records ``(current_epoch, ids)`` per step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[tuple[int, list[int]]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen.append((self.current_epoch, batch["id"].tolist()))
        return self.layer(batch["id"].float().view(-1, 1)).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit_to(
    max_steps: int, root: Path, ckpt: Path | None = None, host: bool = True, save: bool = False
) -> list[Any]:
    model = _Recorder()
    loader = ResumableDataLoader(IdDataset(16), batch_size=4, shuffle=True, seed=0)
    callbacks = [L.pytorch.callbacks.ModelCheckpoint(dirpath=root, save_last=True)]
    kwargs = trainer_kwargs(
        max_steps=max_steps, max_epochs=-1, callbacks=callbacks + [AttachLoaders()] * host
    )
    with contextlib.nullcontext() if host else no_entry_point_callbacks():
        trainer = L.Trainer(**{**kwargs, "enable_checkpointing": True})
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt)
    if save:
        trainer.save_checkpoint(root / "after_fit.ckpt")
    return model.seen


@pytest.mark.parametrize("stop", [1, 6, 9])
def test_a_run_stopped_by_max_steps_mid_epoch_resumes_from_its_last_checkpoint(
    tmp_path: Path, stop: int
) -> None:
    # Internal: fit_loop.epoch_progress.current (processed vs completed). Lightning records
    # a max_steps stop part-way through an epoch as processed but not completed; on
    # restore it goes on with that epoch's batches while setting samplers to the next
    # epoch (`processed`). The loader follows current_epoch (`completed`).
    full = _fit_to(10, tmp_path / "full")
    before = _fit_to(stop, tmp_path / "cut")
    after = _fit_to(10, tmp_path / "resumed", ckpt=tmp_path / "cut" / "last.ckpt")
    assert before + after == full, changed(
        "fit_loop.epoch_progress (processed/completed after a max_steps stop)",
        "LightningHost.epoch_meant",
    )


def test_without_a_host_a_max_steps_resume_is_refused_not_trained_wrong(tmp_path: Path) -> None:
    # Documented limit (docs/design.md): the loader cannot follow the fit loop's epoch
    # bookkeeping, so set_epoch of the next epoch meets its part-way position and raises.
    _fit_to(6, tmp_path / "cut", host=False)
    with pytest.raises(StateMismatchError, match=r"part-way through epoch 1"):
        _fit_to(10, tmp_path / "resumed", ckpt=tmp_path / "cut" / "last.ckpt", host=False)


@pytest.mark.parametrize("stop", [4, 6])
def test_a_checkpoint_saved_after_a_max_steps_stop_is_refused_naming_the_cause(
    tmp_path: Path, stop: int
) -> None:
    # Lightning records the stopped epoch as completed there and restores the next epoch
    # with the stopped one's batch count done (a DataLoader trains from the wrong batch).
    _fit_to(stop, tmp_path / "cut", save=True)
    with pytest.raises(StateMismatchError, match=r"one saved after the fit ended"):
        _fit_to(10, tmp_path / "resumed", ckpt=tmp_path / "cut" / "after_fit.ckpt")


def test_a_max_steps_stop_at_an_epochs_last_batch_resumes_exactly(tmp_path: Path) -> None:
    # Lightning restores it counting the whole epoch done and names that epoch again: the
    # loader yields its empty rest (it replayed the epoch, then refused it), then the next.
    full = _fit_to(10, tmp_path / "full")
    before = _fit_to(4, tmp_path / "cut")
    after = _fit_to(10, tmp_path / "resumed", ckpt=tmp_path / "cut" / "last.ckpt")
    assert before + after == full


@pytest.mark.parametrize("limit", [3, 1.0])
def test_an_epoch_end_checkpoint_under_max_steps_trains_no_batch_past_the_limit(
    tmp_path: Path, limit: float
) -> None:
    # Note 15: Lightning restores it as the saved epoch again (restarted_on_epoch_end) and
    # loads the loader's state, part-way through a limit_train_batches epoch: the loader
    # went on with it, and a 4th batch of epoch 0 ([1, 4]) was trained past the limit of 3.
    def fit(root: Path, ckpt: Path | None = None) -> list[tuple[int, list[int]]]:
        model = IdModule()
        saver = L.pytorch.callbacks.ModelCheckpoint(root, filename="e{epoch}", save_top_k=-1)
        kwargs = trainer_kwargs(max_epochs=3, max_steps=100, limit_train_batches=limit)
        trainer = L.Trainer(**{**kwargs, "enable_checkpointing": True, "callbacks": [saver]})
        trainer.fit(model, datamodule=IdDataModule(size=12, batch_size=2), ckpt_path=ckpt)
        return [(r["epoch"], r["ids"]) for r in model.records]

    full = fit(tmp_path / "full")
    after = fit(tmp_path / "after", tmp_path / "full" / "eepoch=0.ckpt")
    # Lightning then ends the fit an epoch early, whatever the loader (docs/guide/resume.md).
    assert after == [r for r in full if r[0] == 1], changed(
        "fit_loop.restarted_on_epoch_end", "LightningHost.restored_ended"
    )


class _FabricDataParallelOf(AnswersForGroup, L.fabric.strategies.SingleDeviceStrategy):
    """A Fabric strategy on one CPU that names a data-parallel group."""


def test_a_loader_attached_to_fabric_yields_its_data_parallel_share() -> None:
    fabric = L.Fabric(accelerator="cpu", devices=1, strategy=_FabricDataParallelOf(1, 2))
    loader = attach_host(ResumableDataLoader(list(range(12)), batch_size=2, shuffle=True, seed=0),
                         fabric)  # fmt: skip
    assert host_of(loader).data_parallel() == (1, 2), changed(
        "Fabric.strategy.distributed_sampler_kwargs", "LightningHost.data_parallel"
    )
    alone = ResumableDataLoader(list(range(12)), batch_size=2, shuffle=True, seed=0, rank=1,
                                world_size=2)  # fmt: skip
    assert [int(i) for b in loader for i in b] == [int(i) for b in alone for i in b]


def test_attach_host_refuses_what_it_cannot_host() -> None:
    with pytest.raises(TypeError, match=r"loader is a list, not a ResumableDataLoader.*pass"):
        attach_host([1, 2], None)
    loader = ResumableDataLoader(list(range(4)), batch_size=2)
    with pytest.raises(TypeError, match=r"host must be a Lightning Trainer or Fabric, got int"):
        attach_host(loader, 3)
    assert attach_host(loader, None) is loader and host_of(loader) is NO_HOST


def test_fabric_setup_dataloaders_takes_only_torch_dataloaders() -> None:
    # The README tells Fabric users to iterate a ResumableDataLoader directly (it splits
    # itself); this is why. If Fabric starts accepting other loaders, revisit that advice.
    fabric = L.Fabric(accelerator="cpu", devices=1)
    loader = ResumableDataLoader(list(range(4)), batch_size=2)
    with pytest.raises(TypeError, match="Only PyTorch DataLoader are currently supported"):
        fabric.setup_dataloaders(loader)


def test_fabric_save_and_load_resume_the_loader_exactly(tmp_path: Path) -> None:
    fabric = L.Fabric(accelerator="cpu", devices=1)

    def build() -> ResumableDataLoader:
        return ResumableDataLoader(IdDataset(20), batch_size=4, shuffle=True, seed=3)

    uninterrupted = build()
    full = [b["id"].tolist() for _ in range(2) for b in uninterrupted]
    loader = build()
    it = iter(loader)
    before = [next(it)["id"].tolist() for _ in range(3)]
    fabric.save(tmp_path / "ckpt", {"loader": loader, "step": 3})
    resumed = build()
    rest = fabric.load(tmp_path / "ckpt", {"loader": resumed})
    assert rest == {"step": 3}
    after = [b["id"].tolist() for _ in range(2) for b in resumed]
    assert before + after == full


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_plan_batch_sampler_under_a_dataloader_with_workers_refuses_its_state(
    num_workers: int,
) -> None:
    """Measured before: its state counts the batches the workers drew ahead, so a resume
    after 3 of 10 batches skipped 4 (16 samples) without an error."""
    from loaderkit import PlanBatchSampler, SamplePlan

    sampler = PlanBatchSampler(SamplePlan(num_samples=40, batch_size=4, seed=0), world_size=1)
    loader = torch.utils.data.DataLoader(list(range(40)), batch_sampler=sampler,
                                         num_workers=num_workers)  # fmt: skip
    attach_host(loader, L.Fabric(accelerator="cpu", devices=1))
    it = iter(loader)
    [next(it) for _ in range(3)]
    if num_workers:
        with pytest.raises(ValueError, match=r"num_workers=2 draws batches ahead"):
            sampler.state_dict()
    else:
        assert sampler.state_dict()["position"] == 12
    list(it)
    sampler.set_epoch(1)  # an epoch's start: nothing drawn ahead, with workers too
    assert sampler.state_dict()["epoch"] == 1


def _declared_minimum() -> str:
    text = (REPO / "pyproject.toml").read_text()
    match = re.search(r'"lightning>=([0-9.]+)[,<0-9.]*"', text)
    assert match, "pyproject.toml declares no lightning>= lower bound"
    return match.group(1)


@pytest.mark.slow
def test_the_adapter_contracts_hold_on_the_oldest_declared_lightning(tmp_path: Path) -> None:
    version = _declared_minimum()
    default = Path(tempfile.gettempdir()) / "loaderkit-lightning"
    cache = Path(os.environ.get("LOADERKIT_LIGHTNING_CACHE", default)) / version
    if not (cache / "lightning" / "__init__.py").exists():
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
             str(cache), f"lightning=={version}"],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if pip.returncode != 0 and re.search(r"(?i)connection|network|resolve|proxy", pip.stderr):
            pytest.skip(f"cannot reach the package index to install lightning=={version}")
        assert pip.returncode == 0, pip.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cache), str(REPO)])}
    env["PYTHONWARNINGS"] = "ignore"
    probe = subprocess.run(
        [sys.executable, "-c", "import lightning; print(lightning.__version__)"],
        capture_output=True, text=True, timeout=300, env=env, cwd=REPO,
    )  # fmt: skip
    assert Version(probe.stdout.strip() or "0") == Version(version), probe.stderr[-2000:]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/lightning/test_adapter.py"],
        capture_output=True, text=True, timeout=900, env=env, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, f"lightning {version}:\n{run.stdout[-6000:]}{run.stderr[-2000:]}"


class _CountProbe(_Probe):
    """Records what the adapter says Lightning counts as done when an epoch's first batch is
    drawn (where ResumableDataLoader fixes its epoch and compares)."""

    def __init__(self) -> None:
        super().__init__()
        self.done_at_first: list[int | None] = []

    def __iter__(self) -> Iterator[torch.Tensor]:
        for i, batch in enumerate(super().__iter__()):
            if i == 0:
                self.done_at_first.append(host_of(self).batches_done(self))
            yield batch


def test_the_batch_progress_counts_an_epochs_done_batches_when_its_iterator_is_made(
    tmp_path: Path,
) -> None:
    # ResumableDataLoader compares this count with its own position at an epoch's first
    # batch: a fresh epoch must read 0, a restored mid-epoch run the batches done (step 6
    # of 4-batch epochs: 2 of epoch 1). The sanity check's validation draws none here.
    first = _CountProbe()
    callbacks = [step_checkpoints(tmp_path, 1), AttachLoaders()]
    L.Trainer(**trainer_kwargs(max_epochs=2, enable_checkpointing=True, callbacks=callbacks)).fit(
        _Linear(), train_dataloaders=first
    )
    resumed = _CountProbe()
    L.Trainer(**trainer_kwargs(max_epochs=2, callbacks=[AttachLoaders()])).fit(
        _Linear(), train_dataloaders=resumed, ckpt_path=tmp_path / "step006.ckpt"
    )
    assert (first.done_at_first, resumed.done_at_first) == ([0, 0], [2]), changed(
        "fit_loop.epoch_loop.batch_progress.current.completed when the epoch loop creates "
        f"the train iterator (got {first.done_at_first}, {resumed.done_at_first})",
        "LightningHost.batches_done",
    )
    assert host_of(first).batches_done(first) is None  # no run in progress


class _RestartProbe(_Probe):
    """Records what the adapter says about a restart whenever the fit loop sets the epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.restarting: list[tuple[int, bool | None]] = []
        probe = self

        class _Sampler:
            def set_epoch(self, epoch: int) -> None:
                host = host_of(probe)
                probe.restarting.append((epoch, host.restarting_mid_epoch(probe)))

        self.sampler = _Sampler()


@pytest.mark.parametrize(("step", "expected"), [(6, [(1, True)]), (4, [(1, False)])])
def test_the_fit_loop_says_whether_its_set_epoch_restarts_an_epoch_mid_way(
    tmp_path: Path, step: int, expected: list[tuple[int, bool]]
) -> None:
    # ResumableDataLoader keeps a loaded position against the replayed set_epoch of a
    # mid-epoch restart (a loader CombinedLoader cycled is ahead of the trainer's epoch),
    # not against the set_epoch that starts the epoch after a last-batch checkpoint.
    first = _RestartProbe()
    callbacks = [step_checkpoints(tmp_path, 1), AttachLoaders()]
    L.Trainer(**trainer_kwargs(max_epochs=2, enable_checkpointing=True, callbacks=callbacks)).fit(
        _Linear(), train_dataloaders=first
    )
    resumed = _RestartProbe()
    L.Trainer(**trainer_kwargs(max_epochs=2, callbacks=[AttachLoaders()])).fit(
        _Linear(), train_dataloaders=resumed, ckpt_path=tmp_path / f"step{step:03d}.ckpt"
    )
    got = (first.restarting, resumed.restarting)
    assert got == ([(0, False), (1, False)], expected), changed(
        f"fit_loop.restarted_mid_epoch / epoch_progress.current when the fit loop sets the "
        f"samplers' epoch (got {got})",
        "LightningHost.restarting_mid_epoch",
    )
    assert host_of(first).restarting_mid_epoch(first) is None  # no run in progress
