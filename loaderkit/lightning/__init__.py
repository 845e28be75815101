"""Everything of loaderkit that needs Lightning: callbacks, ``attach_host`` and DataModules.

The only package of loaderkit that imports ``lightning``; its internals are read
in :mod:`loaderkit.lightning._adapter` alone. :mod:`loaderkit` re-exports these
names lazily, on first access, so ``import loaderkit`` stays free of Lightning.
"""

from loaderkit.lightning.callbacks import AttachLoaders, ElasticResume, attach_host
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
    "AttachLoaders",
    "DataWaitMonitor",
    "ElasticResume",
    "ImageFolderDataModule",
    "LoaderDataModule",
    "MixedDataModule",
    "SequenceDataModule",
    "ShardedDataModule",
    "TensorDataModule",
    "attach_host",
]
