"""How a Trainer or Fabric reaches loaderkit's loaders: callbacks and ``attach_host``
(``docs/design.md``, "The Lightning adapter")."""

from __future__ import annotations

from typing import Any, TypeVar

import lightning as L
from lightning.fabric.utilities.data import sized_len
from lightning.pytorch.callbacks import Callback

from loaderkit._callers import attach, enter, leave
from loaderkit.lightning._adapter import (
    LightningHost,
    early_stop,
    held_loaders,
    refuse_early_stop,
    refuse_restarted_epoch,
    resize_train_epoch,
    train_loaders,
)
from loaderkit.loader.resumable import ResumableDataLoader
from loaderkit.plan.samplers import PlanBatchSampler

__all__ = ["AttachLoaders", "ElasticResume", "attach_host"]

LoaderT = TypeVar("LoaderT")


def attach_host(loader: LoaderT, host: Any) -> LoaderT:
    """Hand ``loader`` (a :class:`~loaderkit.ResumableDataLoader` or a ``DataLoader`` over a
    :class:`~loaderkit.PlanBatchSampler`) the ``Trainer`` or ``Fabric`` that drives it, held
    weakly (None detaches it); returns ``loader``.

    Raises:
        TypeError: ``loader`` is neither, or ``host`` has no ``strategy``.

    Example:
        >>> def train_dataloader(self):  # in a LightningModule or LightningDataModule
        ...     return attach_host(ResumableDataLoader(data, batch_size=32), self.trainer)
    """
    sampler = getattr(loader, "batch_sampler", None)
    if isinstance(loader, ResumableDataLoader):
        target: object = loader
    elif isinstance(sampler, PlanBatchSampler):
        target = sampler
    else:
        raise TypeError(
            f"attach_host: loader is a {type(loader).__name__}, not a ResumableDataLoader nor "
            "a DataLoader with a loaderkit PlanBatchSampler; pass one of those."
        )
    if host is not None and not hasattr(host, "strategy"):
        raise TypeError(
            f"attach_host: host must be a Lightning Trainer or Fabric, got "
            f"{type(host).__name__}; pass self.trainer (or the Fabric)."
        )
    attach(target, None if host is None else LightningHost(host))
    if isinstance(target, PlanBatchSampler):
        target.prefetched_by = getattr(loader, "num_workers", 0)  # they draw batches ahead
    return loader


class AttachLoaders(Callback):
    """Make the Trainer the host of every loaderkit loader without one, from ``setup`` (before
    any ``*_dataloader()`` call) to ``teardown``; then stop the workers of the Trainer's
    :class:`~loaderkit.ResumableDataLoader` s (persistent ones too), as Lightning stops a
    ``DataLoader``'s.

    Example:
        >>> trainer = L.Trainer(callbacks=[AttachLoaders()])  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._host: LightningHost | None = None
        self._auto = False  # added by the entry point, not by the user
        self._idle = False  # an auto instance where the user gave one of its kind
        self._stopped: str | None = None  # why a restored early stop would skip batches

    def setup(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        self._end()
        self._idle = self._auto and any(
            cb is not self and isinstance(cb, type(self))
            for cb in getattr(trainer, "callbacks", ())
        )
        if not self._idle:
            self._host = LightningHost(trainer)
            enter(self._host)

    def teardown(self, trainer: L.Trainer, pl_module: Any, stage: str) -> None:
        # The host does not end at on_exception: Lightning calls checkpoint callbacks'
        # on_exception last (an OnExceptionCheckpoint saves the loaders there); a failed
        # fit's host ends by itself.
        self._end()
        if not self._idle:
            _close(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        # Lightning drops its fetcher after this: a checkpoint saved after the fit (stopped
        # by max_steps) must still leave out the batch the fetcher held.
        _settle(trainer)

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: Any, checkpoint: dict[str, Any]
    ) -> None:
        # By steps (max_steps), Lightning loads the loader states: their own checks hold.
        if trainer.state.fn == "fit" and trainer.max_steps == -1:
            refuse_restarted_epoch(checkpoint)
            self._stopped = early_stop(checkpoint)

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        why, self._stopped = self._stopped, None
        if why is not None:  # the train loaders are known now
            refuse_early_stop(trainer, why)

    def on_exception(self, trainer: L.Trainer, pl_module: Any, exception: BaseException) -> None:
        _settle(trainer)  # as on_train_end, for a fit that failed
        if not self._idle:
            _close(trainer)  # a state saved later does not need them

    def _end(self) -> None:
        self._stopped = None
        if self._host is not None:
            leave(self._host)
            self._host = None


class ElasticResume(AttachLoaders):
    """Re-read the lengths of loaderkit train loaders after a restore and every epoch: needed
    for token budgets, a resume on another number of ranks, and streams without a length.

    Example:
        >>> trainer = L.Trainer(callbacks=[ElasticResume()])  # doctest: +SKIP
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Sync the lengths after a restore (Lightning skips ``on_train_epoch_start`` mid-epoch)
        and at each epoch's start (a whole epoch again under the current world size)."""
        super().on_train_start(trainer, pl_module)
        if not self._idle:
            _sync_lengths(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if not self._idle:
            _sync_lengths(trainer)


def entry_point_callbacks() -> list[Callback]:
    """The ``callbacks_factory`` entry point: an :class:`ElasticResume` for every ``Trainer``,
    idle where the user gave one.

    Example:
        >>> [type(cb).__name__ for cb in entry_point_callbacks()]
        ['ElasticResume']
    """
    callback = ElasticResume()
    callback._auto = True
    return [callback]


def _settle(trainer: L.Trainer) -> None:
    for dl in train_loaders(trainer):
        if isinstance(dl, ResumableDataLoader):
            dl._settle()


def _close(trainer: L.Trainer) -> None:
    for dl in held_loaders(trainer):
        if isinstance(dl, ResumableDataLoader):
            dl.close()


def _sync_lengths(trainer: L.Trainer) -> None:
    loaders = train_loaders(trainer)
    if not any(_is_planned(dl) for dl in loaders):
        return
    for dl in loaders:
        # Its length is kept in sync: it need not refuse a change.
        for owner in (dl, getattr(dl, "batch_sampler", None)):
            watch = getattr(owner, "_len_watch", None)
            if watch is not None:
                watch.managed = True
    resize_train_epoch(trainer, _is_planned)


def _is_planned(loader: object) -> bool:
    """A loader whose length comes from a loaderkit plan (unsized streams have none)."""
    if isinstance(loader, ResumableDataLoader):
        return sized_len(loader) is not None
    return isinstance(getattr(loader, "batch_sampler", None), PlanBatchSampler)
