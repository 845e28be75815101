"""LightningDataModules over loaderkit's resumable loaders, under :class:`LoaderDataModule`'s
loader policy."""

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
