"""Lightning callbacks for loaderkit's loaders.

:class:`ElasticResume` keeps Lightning's count of an epoch's batches equal to
what loaderkit's train loader yields. Lightning (2.6) takes the train loader's
length, and with it the number of batches of the epoch (and the batch at which
validation runs), once per ``fit`` and *before* it restores the loader's state.
Two cases of length need it:

- Plans whose epoch length varies from epoch to epoch, like
  :class:`~loaderkit.BucketBatchSampler` under a token budget: Lightning would
  end a longer epoch early, leaving batches untrained, and validate mid-epoch
  or not at all. (The loader raises when such an epoch starts without it.)
- A mid-epoch resume on a different number of ranks: Lightning's own step
  counter, restored from the checkpoint, counts the steps done under the old
  world size. With *more* ranks, that count plus the new whole-epoch length can
  fall short of the batches that remain; with *fewer*, the resumed epoch ends
  before the batch Lightning validates at.

The callback re-reads the loaders' lengths after the state is restored and at
the start of every epoch, and recomputes the validation batch of a fractional
``val_check_interval``; the loaders it manages answer ``len()`` with the
current epoch's exact count. Fixed-size plans resumed with the same number of
ranks need no callback.

A third case: a :class:`~loaderkit.StreamingShardedDataset` without
``steps_per_epoch`` has no length, so Lightning prefetches one batch ahead of
training, and a state saved at a checkpoint would count that batch as done.
Such loaders ask the Lightning adapter how many batches Lightning holds
(the callback tells them too), and their ``state_dict()`` leaves those out.

What the callback reads of Lightning's fit loop (the fetcher's held batches,
the lengths Lightning derived an epoch from) is read in
:mod:`loaderkit.lightning._adapter`, the one module that touches Lightning's internals.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.fabric.utilities.data import sized_len
from lightning.pytorch.callbacks import Callback

from loaderkit.lightning._adapter import held_batches, resize_train_epoch, train_loaders
from loaderkit.loader.resumable import ResumableDataLoader
from loaderkit.plan.samplers import PlanBatchSampler

__all__ = ["ElasticResume"]


class ElasticResume(Callback):
    """Re-read the lengths of loaderkit train loaders every epoch and after a restore.

    Covers :class:`~loaderkit.ResumableDataLoader` and torch ``DataLoader`` objects
    whose ``batch_sampler`` is a :class:`~loaderkit.PlanBatchSampler` (e.g. a
    :class:`~loaderkit.BucketBatchSampler`). Needed for token-budget batches,
    for resuming with more ranks, and for streams without a length (see the
    module docstring).

    Example:
        >>> trainer = L.Trainer(callbacks=[ElasticResume()])  # doctest: +SKIP
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """After a restore (Lightning skips ``on_train_epoch_start`` mid-epoch)."""
        _watch_prefetch(trainer)
        _sync_lengths(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Each new epoch is a whole epoch again under the current world size."""
        _watch_prefetch(trainer)
        _sync_lengths(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Unhook the stream loaders: a later fit without this callback must not be told
        that no batch is held (its saves would then be one batch ahead)."""
        _watch_prefetch(trainer, unhook=True)


def _watch_prefetch(trainer: L.Trainer, *, unhook: bool = False) -> None:
    """Let unsized stream loaders subtract the batch Lightning prefetched from their state."""
    for dl in train_loaders(trainer):
        engine = getattr(dl, "_stream", None) if isinstance(dl, ResumableDataLoader) else None
        if engine is not None:
            engine.held_batches = None if unhook else held_batches(trainer)


def _sync_lengths(trainer: L.Trainer) -> None:
    """Make Lightning's epoch the (restored) loaders' current length."""
    loaders = train_loaders(trainer)
    if not any(_is_planned(dl) for dl in loaders):
        return
    for dl in loaders:
        # Tell the loader its length is kept in sync, so it does not warn about it.
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
