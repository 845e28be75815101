"""LightningDataModules built on loaderkit's resumable loaders.

Every module shares the loader policy of :class:`LoaderDataModule` (batch
sizes, workers, pinning, seed, a seeded val split) and returns
:class:`~loaderkit.ResumableDataLoader` loaders hosted by its trainer, so a
Lightning checkpoint resumes training at the exact next sample.
"""

from loaderkit.lightning.datamodules.base import LoaderDataModule
from loaderkit.lightning.datamodules.mixed import MixedDataModule
from loaderkit.lightning.datamodules.sequence import SequenceDataModule
from loaderkit.lightning.datamodules.sharded import ShardedDataModule
from loaderkit.lightning.datamodules.tensors import ArrayDataModule, TensorDataModule
from loaderkit.lightning.datamodules.vision import ImageFolderDataModule

__all__ = [
    "ArrayDataModule",
    "ImageFolderDataModule",
    "LoaderDataModule",
    "MixedDataModule",
    "SequenceDataModule",
    "ShardedDataModule",
    "TensorDataModule",
]
