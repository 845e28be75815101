"""LightningDataModules built on loaderkit's resumable loaders.

Every module shares the loader policy of :class:`LoaderDataModule` (batch
sizes, workers, pinning, seed, a seeded val split) and returns
:class:`~loaderkit.ResumableDataLoader` loaders, so a Lightning checkpoint
resumes training at the exact next sample. With :mod:`loaderkit.callbacks`,
the only part of loaderkit that imports Lightning.
"""

from loaderkit.datamodules.base import LoaderDataModule
from loaderkit.datamodules.sequence import SequenceDataModule
from loaderkit.datamodules.sharded import ShardedDataModule
from loaderkit.datamodules.tensors import ArrayDataModule, TensorDataModule
from loaderkit.datamodules.vision import ImageFolderDataModule
from loaderkit.errors import MissingDependencyError

__all__ = [
    "ArrayDataModule",
    "ImageFolderDataModule",
    "LoaderDataModule",
    "MissingDependencyError",
    "SequenceDataModule",
    "ShardedDataModule",
    "TensorDataModule",
]
