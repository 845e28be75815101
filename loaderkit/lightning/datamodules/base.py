"""``LoaderDataModule``: the loader policy every loaderkit DataModule shares."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any, Literal, Self

import lightning as L
import numpy as np
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import IterableDataset

from loaderkit._checks import check_int
from loaderkit.data.mixing import MixedDataset, holds_mix
from loaderkit.data.streaming import StreamingShardedDataset
from loaderkit.env import cpu_budget, detect
from loaderkit.errors import StateMismatchError
from loaderkit.lightning._adapter import data_parallel_of, restricted_classmethod, splits_loaders
from loaderkit.lightning.callbacks import attach_host
from loaderkit.lightning.datamodules._args import check_settings
from loaderkit.lightning.datamodules._util import (
    epoch_samples,
    path_text,
    plain,
    probe_workers,
    split_indices,
    stream_epoch_steps,
    stream_refusal,
    stream_resume_reason,
)
from loaderkit.loader._fetch import index_subset
from loaderkit.loader.resumable import ResumableDataLoader
from loaderkit.transfer import default_device, should_pin_memory

__all__ = ["LoaderDataModule"]

SPLITS = ("train", "val", "test", "predict")
_STAGES = ("fit", "validate", "test", "predict")
_STAGE_READS = {
    "fit": ("train", "val"),
    "validate": ("val",),
    "test": ("test",),
    "predict": ("predict",),
}
_SPLIT_OF = {"sources": "train"}  # the data arguments named for a split otherwise (Mixed's)
_STATE_VERSION = 1  # of state_dict()


def _kept_out(name: str, value: Any) -> bool:
    """Whether a data argument stays out of ``hparams``: data given as objects, and fsspec
    options (they may hold credentials, and checkpoints and loggers' files are shared; they
    change no sample, so a module rebuilt without them is not refused)."""
    return (name == "storage_options" and value is not None) or not plain(value)


def _split_view(split: str) -> Any:
    return property(lambda self: self._datasets.get(split), doc=f"The {split} split, or None.")


#: The class ``load_from_checkpoint`` builds, whose splits given as objects the checkpoint
#: names as lost: that module's constructor leaves refusing "no data" to it.
_LOADING: ContextVar[type | None] = ContextVar("loaderkit_loading", default=None)


def loading_checkpoint(module: object) -> bool:
    """Whether ``load_from_checkpoint`` builds ``module`` (once: a module its constructor
    builds is checked as any other)."""
    loading = _LOADING.get()
    if loading is None or not isinstance(module, loading):  # a subclass too (LightningCLI's)
        return False
    _LOADING.set(None)
    return True


class LoaderDataModule(L.LightningDataModule):
    """Base class: a :class:`~loaderkit.ResumableDataLoader` for every split, under one policy.

    A subclass says what the data is (:meth:`build_datasets`); one whose ``__init__``
    takes data names it with :meth:`set_data_args`. The train loader shuffles per
    ``(seed, epoch)``; the others never shuffle nor drop. Loaders are hosted by the
    running Trainer; their position goes into the checkpoint.

    Args:
        batch_size: Samples per train batch on each rank.
        eval_batch_size: Samples per val/test/predict batch (default: ``batch_size``).
        num_workers: Worker processes, or ``"auto"`` (streams need an int).
        pin_memory: ``"auto"`` pins when the trainer's device (else the current
            accelerator) is CUDA/XPU.
        persistent_workers: Keep workers alive across epochs (needs workers).
        seed: Seed of the shuffle, of per-sample randomness and of ``val_fraction``.
        val_fraction: Hold out this fraction of the train samples as a seeded val split.
        shuffle: Shuffle the train split.
        drop_last: Drop the train tail that does not fill a global step.

    Example:
        >>> import torch
        >>> from loaderkit import LoaderDataModule
        >>> class Squares(LoaderDataModule):
        ...     def build_datasets(self, stage):
        ...         return {"train": [torch.tensor([i, i * i]) for i in range(10)]}
        >>> dm = Squares(batch_size=4, val_fraction=0.2)
        >>> dm.setup("fit")
        >>> len(dm.train_dataset), len(dm.val_dataset), len(dm.train_dataloader())
        (8, 2, 2)
    """

    # Set (checked) by check_settings.
    batch_size: int
    eval_batch_size: int
    num_workers: int | Literal["auto"]
    pin_memory: bool | Literal["auto"]
    persistent_workers: bool
    seed: int
    val_fraction: float
    shuffle: bool
    drop_last: bool

    def __init__(
        self,
        *,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int | Literal["auto"] = 0,
        pin_memory: bool | Literal["auto"] = "auto",
        persistent_workers: bool = False,
        seed: int = 0,
        val_fraction: float = 0.0,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        super().__init__()
        check_settings(
            self,
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            seed=seed,
            val_fraction=val_fraction,
            shuffle=shuffle,
            drop_last=drop_last,
        )
        self.eval_batch_size = self.eval_batch_size or self.batch_size
        data = getattr(self, "_data_args", {})
        self.save_hyperparameters(ignore=[name for name, v in data.items() if _kept_out(name, v)])
        for name, value in self.hparams.items():
            self.hparams[name] = path_text(value)
        #: Samples/s per ``num_workers`` measured by :meth:`probe_num_workers`.
        self.num_workers_probe: dict[int, float] | None = None
        #: The ``num_workers`` the probe picked.
        self.num_workers_best: int | None = None
        #: ``(train, val)`` indices into the original train data after a ``val_fraction`` split.
        self.split: tuple[Any, Any] | None = None
        self._datasets: dict[str, Any] = {}
        self._stages: set[str] = set()
        self._lost: list[str] = []  # data arguments lost by load_from_checkpoint

    def set_data_args(self, **values: Any) -> None:
        """Name the ``__init__`` arguments that may hold data, before ``super().__init__()``;
        those that are not paths stay out of ``hparams``.

        Example:
            >>> class Points(LoaderDataModule):
            ...     def __init__(self, points, **kwargs):
            ...         self.set_data_args(points=points)
            ...         super().__init__(**kwargs)
            ...         self.points = points
            >>> "points" in Points([[0.0, 1.0]]).hparams, Points("pts.npy").hparams["points"]
            (False, 'pts.npy')
        """
        self._data_args = values

    def build_datasets(self, stage: str) -> Mapping[str, Any]:
        """The datasets by split (``"train"``, ``"val"``, ``"test"``, ``"predict"``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement build_datasets(stage)")

    def batch_sampler(self, split: str, dataset: Any, batch_size: int) -> Any | None:
        """A loaderkit batch sampler for ``split``, or None for fixed batches."""
        return None

    def collate_fn(self, split: str) -> Callable[[list[Any]], Any] | None:
        """The ``collate_fn`` of ``split``'s loader (None: the loader's default)."""
        return None

    def per_sample_seeding(self, split: str) -> bool | Literal["auto"]:
        """The loader's ``per_sample_seeding`` (False where samples hold no randomness)."""
        return "auto"

    def val_view(self, train: Any) -> Any:
        """The train data as a ``val_fraction`` split sees it (e.g. without augmentation)."""
        return train

    def padding_fraction(self, split: str) -> float | None:
        """Fraction of padded tokens in an epoch of ``split``, when the module pads."""
        return None

    def resume_info(self, world_size: int | None = None) -> tuple[bool, str]:
        """Whether (and why) a Lightning resume of the train loader is exact on ``world_size``."""
        train = self._datasets.get("train")
        if train is None:
            return False, "no train split: there is no training position to resume"
        if isinstance(train, StreamingShardedDataset):
            refusal = stream_refusal(train, self.batch_size, world_size or self._world_size())
            return (False, refusal) if refusal else (True, stream_resume_reason(train))
        if isinstance(train, IterableDataset):  # the loader says how it resumes one
            info = self.loader("train", num_workers=0, pin_memory=False).describe()
            return (world_size or self._world_size()) == 1, str(info["resume_reason"])
        reason = (
            "the train loader (ResumableDataLoader) saves its position in the sample plan in "
            "the Lightning checkpoint; resume is exact for any num_workers and world size "
            "(add loaderkit.ElasticResume() to resume on more ranks than it was saved with)"
        )
        if getattr(self, "max_tokens", None) is not None:
            reason += (
                "; under max_tokens the number of batches changes from epoch to epoch: add "
                "loaderkit.ElasticResume() to the Trainer's callbacks, or Lightning stops a "
                "longer epoch early"
            )
        return True, reason

    def state_dict(self) -> dict[str, Any]:
        """The names of the data arguments given as objects, which ``hparams`` leave out."""
        data = getattr(self, "_data_args", {}).items()
        kept = [k for k, v in data if not plain(v) and k != "storage_options"]
        return {"version": _STATE_VERSION, "data_not_in_hparams": kept}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Record the data arguments the saved module was given as objects and this one,
        built by ``load_from_checkpoint`` (no trainer), lacks: ``setup`` refuses them."""
        owner = f"{type(self).__name__}.load_state_dict"
        fields = {"version", "data_not_in_hparams"}
        if set(state_dict) != fields or state_dict["version"] != _STATE_VERSION:
            raise StateMismatchError(
                f"{owner}: expected the keys {sorted(fields)} at version {_STATE_VERSION}, got "
                f"{sorted(state_dict)} (version {state_dict.get('version')!r}); pass this "
                "method only these keys (a subclass pops its own first)."
            )
        if self.trainer is None:  # a Trainer restores into the module its user built
            data = getattr(self, "_data_args", {})
            lost = [k for k in state_dict["data_not_in_hparams"] if data.get(k) is None]
            self._lost = [k for k in lost if k != "storage_options"]  # saved so before 0.2.0

    @restricted_classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Self:
        """As Lightning's; a data argument passed here, even None, is the caller's choice, and
        one that is not a split (a reader, a collate, a transform) is refused when lost."""
        token = _LOADING.set(cls)
        try:
            module = super().load_from_checkpoint(checkpoint_path, *args, **kwargs)
        finally:
            _LOADING.reset(token)
        module._lost = [k for k in module._lost if k not in kwargs]
        module._refuse_lost(None)
        if not module._lost:  # else setup() names the splits to pass
            module.refuse_no_data()
        return module

    def refuse_no_data(self) -> None:
        """Raise where no split was given (a module of in-memory data)."""

    def _refuse_lost(self, stage: str | None) -> None:
        """Refuse the data lost by ``load_from_checkpoint`` that ``stage`` (None: any) reads."""
        reads = _STAGE_READS.get(stage or "", ())
        if self.val_fraction and "val" in reads:  # the val split is cut from train
            reads += ("train",)
        splits = {k: _SPLIT_OF.get(k, k) for k in self._lost}
        lost = [k for k, split in splits.items() if split in reads or split not in SPLITS]
        if lost:
            what = f"setup({stage!r}) reads" if stage else "every split reads"
            drop = " (None: go without it)" if splits[lost[0]] in SPLITS else ""
            raise ValueError(
                f"{type(self).__name__}: the checkpoint's module was given {lost} as objects, "
                f"which the checkpoint does not hold, and {what} them; pass them to "
                f"load_from_checkpoint, e.g. load_from_checkpoint(path, {lost[0]}=...){drop}."
            )

    def _world_size(self) -> int:
        if self.trainer is None:
            return detect().world_size
        group = self._group()
        return 1 if group is None else group[1]

    def _group(self) -> tuple[int, int] | None:
        """The trainer's data-parallel ``(rank, world_size)``, which every split is dealt over."""
        group = None if self.trainer is None else data_parallel_of(self.trainer)
        # Lightning's flag says the user split the data: whether this module's data is one
        # rank's part, or the flag was set out of habit, cannot be told, so neither is guessed.
        if group is not None and group[1] > 1 and not splits_loaders(self.trainer):
            raise ValueError(
                f"{type(self).__name__} deals each split across the {group[1]} data-parallel "
                "ranks itself, but the Trainer has use_distributed_sampler=False. Drop that "
                "argument, or return your own ResumableDataLoader(...) for data split per rank."
            )
        return group

    def setup(self, stage: str) -> None:
        """Build the datasets (once per stage) and apply ``val_fraction``."""
        owner = type(self).__name__
        stage = getattr(stage, "value", stage)  # Lightning passes its TrainerFn
        if stage not in _STAGES:
            raise ValueError(f"{owner}.setup: stage must be one of {_STAGES}, got {stage!r}.")
        self._refuse_lost(stage)
        if stage in self._stages:
            return
        built = self.build_datasets(stage)
        if not isinstance(built, Mapping):
            raise TypeError(
                f"{owner}.build_datasets must return a dict of splits, got "
                f"{type(built).__name__}; return e.g. {{'train': dataset}}."
            )
        built = dict(built)
        unknown = sorted(set(built) - set(SPLITS))
        if unknown:
            raise ValueError(
                f"{owner}.build_datasets returned unknown splits {unknown}; use {SPLITS}."
            )
        fresh = {k: v for k, v in built.items() if k not in self._datasets}
        if self.val_fraction and "val" in built:  # at any stage: one would replace the other
            raise ValueError(
                f"{owner}: val_fraction={self.val_fraction} splits the train data, but "
                "val data was given too; pass one or the other."
            )
        if self.val_fraction and "train" in fresh:
            train = fresh["train"]
            if holds_mix(train, weighted=True):
                raise ValueError(
                    f"{owner}: val_fraction={self.val_fraction} would split a weighted "
                    "MixedDataset and ignore its weights; split each source, mix the train "
                    "splits, and pass the val data with val_fraction=0."
                )
            if isinstance(train, StreamingShardedDataset):
                raise ValueError(
                    f"{owner}: val_fraction={self.val_fraction} needs a train split of known "
                    "size, not a stream; pass val data and val_fraction=0."
                )
            train_idx, val_idx = split_indices(owner, len(train), self.val_fraction, self.seed)
            fresh["val"] = index_subset(self.val_view(train), val_idx)
            fresh["train"] = index_subset(train, train_idx)
            self.split = (train_idx, val_idx)
        self._datasets.update(fresh)
        self._stages.add(stage)
        if self.val_fraction and stage == "validate" and "val" not in self._datasets:
            self.setup("fit")  # a build_datasets(stage) that builds train at "fit" only

    def _dataset(self, split: str) -> Any:
        # A missing split's own stage, once: a predict-only module may lack train, and a
        # build_datasets(stage) may build only that stage's splits.
        stage = {"train": "fit", "val": "validate"}.get(split, split)
        if split not in self._datasets and stage not in self._stages:
            self.setup(stage)
        if split not in self._datasets:
            fix = f"pass {split} data when building it"
            if not type(self).build_datasets.__module__.startswith("loaderkit."):
                fix = f"return it from build_datasets({stage!r})"  # a user's subclass builds it
            raise ValueError(
                f"{type(self).__name__} has no {split} data (it has {sorted(self._datasets)}); "
                + fix
                + (
                    ", or set val_fraction to hold out train samples"
                    if split == "val" and not self.val_fraction
                    else ""
                )
                + "."
            )
        return self._datasets[split]

    train_dataset = _split_view("train")
    """The train split (after ``val_fraction``), or None before ``setup``/without one."""
    val_dataset = _split_view("val")
    """The val split, or None."""
    test_dataset = _split_view("test")
    """The test split, or None."""
    predict_dataset = _split_view("predict")
    """The predict split, or None."""

    def train_dataloader(self) -> ResumableDataLoader:
        """Shuffled per ``(seed, epoch)``; its state goes into the Lightning checkpoint."""
        return self.loader("train")

    def val_dataloader(self) -> ResumableDataLoader | list[Any]:
        """In order; ``[]`` (a fit without validation) when there is no val split.

        Raises:
            ValueError: ``trainer.validate`` on a module without a val split.
        """
        if not self._stages:
            self.setup("validate")
        # Lightning validates nothing, with a warning only, for an empty list.
        validating = self.trainer is not None and self.trainer.state.fn == "validate"
        return self.loader("val") if "val" in self._datasets or validating else []

    def test_dataloader(self) -> ResumableDataLoader:
        """In order."""
        return self.loader("test")

    def predict_dataloader(self) -> ResumableDataLoader:
        """In order."""
        return self.loader("predict")

    def loader(
        self, split: str, *, num_workers: int | None = None, pin_memory: bool | None = None
    ) -> ResumableDataLoader:
        """A fresh loader of ``split`` under this module's policy, hosted by the trainer."""
        if split not in SPLITS:
            raise ValueError(
                f"{type(self).__name__}.loader: split must be one of {SPLITS}, got {split!r}."
            )
        group = self._group()
        dataset = self._dataset(split)
        train = split == "train"
        workers: int | Literal["auto"] = self.num_workers if num_workers is None else num_workers
        seeding = self.per_sample_seeding(split)
        if workers == "auto" and seeding is False:
            seeding = "auto"  # lazy: free without randomness, exact across the auto switch
        common: dict[str, Any] = {
            "num_workers": workers,
            "collate_fn": self.collate_fn(split),
            "pin_memory": self.resolve_pin_memory() if pin_memory is None else pin_memory,
            "persistent_workers": self.persistent_workers and (workers == "auto" or workers > 0),
            "seed": self.seed,
            "per_sample_seeding": seeding,
        }
        if split != "train" and isinstance(dataset, IterableDataset):
            ranks = detect().world_size if group is None else group[1]
            if ranks > 1:  # a stream's ranks would step differently (or need a cut it refuses)
                raise ValueError(
                    f"{type(self).__name__}: the {split} split is a {type(dataset).__name__}, "
                    f"which {ranks} ranks cannot evaluate in equal parts; make it a map-style "
                    "dataset (e.g. ShardedDataset), or evaluate on one device."
                )
        if split != "train" and not isinstance(dataset, StreamingShardedDataset):
            dataset, topology = self._rank_part(split, dataset, group)
            common |= topology
        batch_size = self.batch_size if train else self.eval_batch_size
        batching: dict[str, Any] = {"batch_size": batch_size, "drop_last": self.drop_last and train}
        if isinstance(dataset, StreamingShardedDataset):
            self._check_stream(split, dataset, workers)  # it batches and shuffles itself
        else:
            sampler = self.batch_sampler(split, dataset, batch_size)
            if sampler is None and train and isinstance(dataset, MixedDataset):
                # Plain batches would read each sample once per epoch, weights ignored.
                sampler = dataset.batch_sampler(
                    batch_size,
                    seed=self.seed,
                    shuffle=self._shuffles(split),
                    drop_last=self.drop_last,
                )
            if sampler is not None:
                batching = {"batch_sampler": sampler}
            elif not isinstance(dataset, IterableDataset):  # one orders itself
                batching["shuffle"] = self._shuffles(split)
        built = ResumableDataLoader(dataset, **batching, **common)
        return attach_host(built, self.trainer)

    def _shuffles(self, split: str) -> bool:
        """Whether ``split`` is shuffled: train only, and not under ``Trainer(overfit_batches)``
        (Lightning turns a DataLoader's shuffle off there, and cannot rebuild a loaderkit one)."""
        overfit = getattr(self.trainer, "overfit_batches", 0)
        return self.shuffle and split == "train" and not overfit

    def _rank_part(
        self, split: str, dataset: Any, hosted: tuple[int, int] | None
    ) -> tuple[Any, dict[str, int]]:
        """This rank's part of an eval split as Lightning deals it (predict: each sample once;
        val/test where :meth:`eval_batches_by_rank`, padded by < ``world_size``) and the
        loader's topology then ``(0, 1)``."""
        if split != "predict" and not self.eval_batches_by_rank():
            return dataset, {}
        env = detect() if hosted is None else detect(rank=hosted[0], world_size=hosted[1])
        rank, world_size = env.rank, env.world_size
        if world_size == 1:  # an IterableDataset has no len() (on several ranks: refused)
            return dataset, {}
        n = len(dataset)
        if split == "predict" and n < world_size:
            raise ValueError(
                f"{type(self).__name__}: the predict split has {n} samples, fewer than the "
                f"{world_size} ranks; predict on fewer devices."
            )
        end = n if split == "predict" else -(-n // world_size) * world_size
        rows = np.arange(rank, end, world_size) % n
        return index_subset(dataset, rows, keyed=True), {"rank": 0, "world_size": 1}

    def eval_batches_by_rank(self) -> bool:
        """Whether val/test batches are made on each rank from its own samples (a bucketing
        sampler would deal whole batches, repeating up to ``world_size - 1`` of them)."""
        return False

    def _check_stream(self, split: str, dataset: Any, workers: int | str) -> None:
        owner = type(self).__name__
        if workers == "auto":
            raise ValueError(
                f"{owner}: num_workers='auto' cannot serve a stream ({split} split); pass an "
                "int, e.g. num_workers=2."
            )
        if split != "train" and dataset.limited:
            raise ValueError(
                f"{owner}: the {split} split's StreamingShardedDataset has steps_per_epoch or "
                "samples_per_epoch, so each run would read on where the last stopped (and a "
                "resume other samples); build it without them (one pass), or use ShardedDataset."
            )
        reload = getattr(self.trainer, "reload_dataloaders_every_n_epochs", 0)
        if split == "train" and dataset.limited and reload:
            # A loader made anew starts its streams over: every epoch would repeat the first.
            raise ValueError(
                f"{owner}: a train StreamingShardedDataset with steps_per_epoch or "
                f"samples_per_epoch cannot be reloaded, got Trainer(reload_dataloaders_every_"
                f"n_epochs={reload}); leave it 0 (the stream goes on across epochs)."
            )
        shuffle = self.shuffle and split == "train"
        if dataset.shuffle_shards != shuffle:
            raise ValueError(
                f"{owner}: the {split} split's StreamingShardedDataset has shuffle_shards="
                f"{dataset.shuffle_shards}, but this module's shuffle={self.shuffle}; build the "
                f"dataset with shuffle_shards={shuffle}."
            )

    def resolve_pin_memory(self) -> bool:
        """``pin_memory`` as the loaders get it: ``"auto"`` follows the trainer's device."""
        if isinstance(self.pin_memory, bool):
            return self.pin_memory
        trainer = self.trainer
        device = trainer.strategy.root_device if trainer is not None else default_device()
        return should_pin_memory(device)

    def probe_num_workers(
        self, max_workers: int | None = None, *, budget_s: float = 2.0
    ) -> dict[int, float]:
        """Time the train loader with 0..``max_workers`` workers; samples/s per count.

        Records the rates in :attr:`num_workers_probe` and the fewest workers within
        10% of the best in :attr:`num_workers_best`. It reads the train split in this
        process: a dataset that opens a file at its first read must reopen it in workers
        forked later (``docs/troubleshooting.md``).

        Args:
            max_workers: The most workers tried (default: this process's share of the
                cores, at most 8).
            budget_s: Seconds of timed loading, roughly (start-ups come on top).
        """
        owner = f"{type(self).__name__}.probe_num_workers"
        if max_workers is None:
            devices = self.trainer.num_devices if self.trainer is not None else 1
            max_workers = min(cpu_budget(devices), 8)
        fix = "pass e.g. max_workers=4, or None"
        check_int("max_workers", max_workers, 0, owner=owner, fix=fix, numpy_ok=True)
        if not isinstance(budget_s, (int, float)) or isinstance(budget_s, bool) or budget_s <= 0:
            raise ValueError(
                f"{owner}: budget_s must be a number > 0, got {budget_s!r}; pass e.g. budget_s=2.0."
            )
        self._dataset("train")
        rates, _, self.num_workers_best = probe_workers(self, max_workers, budget_s)
        self.num_workers_probe = rates
        shown = ", ".join(f"{w}: {r:,.0f}" for w, r in rates.items())
        rank_zero_info(
            f"{type(self).__name__}: num_workers={self.num_workers_best} "
            f"(train samples/s by num_workers: {shown})"
        )
        return rates

    def describe(self) -> dict[str, Any]:
        """What the loaders will do, for ``loaderkit inspect`` and logs.

        Returns:
            A dict: ``datamodule``, ``world_size``, ``splits`` (per split ``samples``,
            ``batch_size``, ``batches_per_epoch`` per rank in epoch 0, or None),
            ``num_workers``, ``num_workers_probe``, ``num_workers_best``, ``pin_memory``,
            ``seed``, ``padding_fraction``, ``shards_per_batch``, ``single_shard_batches``,
            ``mix``, ``resumable_exactly``, ``resumable_reason``.
        """
        if "fit" not in self._stages:
            self.setup("fit")
        world_size = self._world_size()
        splits: dict[str, dict[str, Any]] = {}
        loaders = {s: self.loader(s, num_workers=0, pin_memory=False) for s in self._datasets}
        for split, dataset in self._datasets.items():
            loader = loaders[split]
            if isinstance(dataset, StreamingShardedDataset):  # its plan is a stand-in
                samples, batches = None, stream_epoch_steps(loader, world_size)
            elif isinstance(dataset, IterableDataset):  # of unknown length
                samples = batches = None
            else:
                part = getattr(loader.dataset, "seed_rows", None) is not None  # _rank_part's
                samples = len(dataset) if part else epoch_samples(loader, dataset)
                dealt = 1 if part else world_size
                batches = loader.plan.num_steps(0, start=0, world_size=dealt)
            # The plan's: a budget or a batch_sampler() hook's sampler decides, not the setting.
            size = getattr(loader.plan, "batch_size", None)
            splits[split] = {"samples": samples, "batch_size": size, "batches_per_epoch": batches}
        resumable, reason = self.resume_info(world_size)
        mix = sources = None
        if "train" in splits and not isinstance(self._datasets["train"], StreamingShardedDataset):
            batch_mix = getattr(loaders["train"].plan, "batch_mix", None)
            mix = None if batch_mix is None else batch_mix(0, world_size=world_size)
            sources = loaders["train"].describe().get("mix")
        return {
            "datamodule": type(self).__name__,
            "world_size": world_size,
            "splits": splits,
            "num_workers": self.num_workers,
            "num_workers_probe": self.num_workers_probe,
            "num_workers_best": self.num_workers_best,
            "pin_memory": self.resolve_pin_memory(),
            "seed": self.seed,
            "padding_fraction": self.padding_fraction("train") if "train" in splits else None,
            "shards_per_batch": None if mix is None else mix.mean,
            "single_shard_batches": None if mix is None else mix.single,
            "mix": sources,
            "resumable_exactly": resumable,
            "resumable_reason": reason,
        }
