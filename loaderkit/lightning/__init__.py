"""Everything of loaderkit that needs Lightning: callbacks and LightningDataModules.

This is the only package of loaderkit that imports ``lightning``; the reads of
its internals are all in :mod:`loaderkit.lightning._adapter`, which registers
itself with :mod:`loaderkit._callers` when this package is imported (so the
loaders, which know nothing of Lightning, learn the data-parallel topology of
a Trainer or Fabric run and whether Lightning's loop is calling). The rest of
loaderkit serves a plain training loop too, and ``import loaderkit`` stays
free of Lightning's import cost (worker processes import loaderkit).
:mod:`loaderkit` re-exports these names lazily, on first access.
"""

import loaderkit.lightning._adapter  # noqa: F401  (registers the host adapter)
from loaderkit.lightning.callbacks import ElasticResume
from loaderkit.lightning.datamodules import (
    ArrayDataModule,
    ImageFolderDataModule,
    LoaderDataModule,
    MixedDataModule,
    SequenceDataModule,
    ShardedDataModule,
    TensorDataModule,
)
from loaderkit.lightning.telemetry import DataWaitMonitor

__all__ = [
    "ArrayDataModule",
    "DataWaitMonitor",
    "ElasticResume",
    "ImageFolderDataModule",
    "LoaderDataModule",
    "MixedDataModule",
    "SequenceDataModule",
    "ShardedDataModule",
    "TensorDataModule",
]
