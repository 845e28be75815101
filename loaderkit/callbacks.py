"""Lightning callbacks for loaderkit's loaders.

:class:`ElasticResume` makes a mid-epoch resume with *more* ranks than the
checkpoint was saved with exact under Lightning. Lightning (2.6) takes the
train loader's length, and with it the number of batches of the epoch, once
per ``fit`` and *before* it restores the loader's state: a whole epoch under
the new world size. Its own step counter, restored from the checkpoint,
counts the steps already done under the old world size. With more ranks the
two together can fall short of the batches that remain, and Lightning would
end the resumed epoch early, leaving samples untrained. The callback re-reads
the loaders' lengths after the state is restored. Resuming with the same or
fewer ranks needs no callback.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.fabric.utilities.data import sized_len
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
from lightning.pytorch.trainer.states import RunningStage

from loaderkit.loader import ResumableDataLoader

__all__ = ["ElasticResume"]


class ElasticResume(Callback):
    """Re-read the lengths of loaderkit train loaders once Lightning restored their state.

    Example:
        >>> trainer = L.Trainer(callbacks=[ElasticResume()])  # doctest: +SKIP
    """

    def on_train_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """After a restore (Lightning skips ``on_train_epoch_start`` mid-epoch)."""
        _sync_lengths(trainer)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """Each new epoch is a whole epoch again under the current world size."""
        _sync_lengths(trainer)


def _sync_lengths(trainer: L.Trainer) -> None:
    """Recompute ``trainer.num_training_batches`` from the (restored) loaders."""
    loop = trainer.fit_loop
    combined = loop._combined_loader
    if combined is None or not any(
        isinstance(dl, ResumableDataLoader) for dl in combined.flattened
    ):
        return
    combined.limits = [
        _parse_num_batches(RunningStage.TRAINING, len(dl), trainer.limit_train_batches)
        if isinstance(dl, ResumableDataLoader)
        else limit
        for dl, limit in zip(combined.flattened, combined.limits or [], strict=False)
    ]
    # The live iterator copied the limits when it was created; it answers len().
    if combined._iterator is not None:
        combined._iterator.limits = combined.limits
    length = sized_len(combined)
    if length is None:
        return
    loop.max_batches = length
    if loop._data_fetcher is not None:
        loop._data_fetcher.length = length
        loop._data_fetcher.done = loop._data_fetcher.fetched >= length
