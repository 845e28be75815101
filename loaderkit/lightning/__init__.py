"""Everything of loaderkit that needs Lightning: callbacks and LightningDataModules.

This is the only package of loaderkit that imports ``lightning`` or reads its
internals; the rest serves a plain training loop too, and ``import loaderkit``
stays free of Lightning's import cost (worker processes import loaderkit).
:mod:`loaderkit` re-exports these names lazily, on first access.
"""

from loaderkit.lightning.callbacks import ElasticResume
from loaderkit.lightning.datamodules import (
    ArrayDataModule,
    ImageFolderDataModule,
    LoaderDataModule,
    SequenceDataModule,
    ShardedDataModule,
    TensorDataModule,
)

__all__ = [
    "ArrayDataModule",
    "ElasticResume",
    "ImageFolderDataModule",
    "LoaderDataModule",
    "SequenceDataModule",
    "ShardedDataModule",
    "TensorDataModule",
]
