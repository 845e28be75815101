"""``TensorDataModule`` and ``ArrayDataModule``: in-memory columns, fetched a batch per call."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from loaderkit._checks import check_path
from loaderkit.data.memory import ArrayDataset, TensorDataset
from loaderkit.lightning.datamodules._args import check_settings
from loaderkit.lightning.datamodules.base import LoaderDataModule, loading_checkpoint

__all__ = ["ArrayDataModule", "TensorDataModule"]

Tensors = str | torch.Tensor | Sequence[torch.Tensor] | None
Arrays = str | np.ndarray | Sequence[np.ndarray] | None


class _ColumnsDataModule(LoaderDataModule):
    """Splits given as data (checked now) or as paths (read in ``setup``)."""

    suffixes: ClassVar[tuple[str, ...]] = ()
    kind: ClassVar[str] = ""  # what a column is, in messages
    column_type: ClassVar[type] = object
    dataset_type: ClassVar[Any] = None

    def _set_sources(self, columns: tuple[Any, ...], splits: dict[str, Any]) -> None:
        owner = type(self).__name__
        if columns:
            path = next((c for c in columns if isinstance(c, str | os.PathLike)), None)
            if path is not None:
                raise TypeError(
                    f"{owner}: got the path {str(path)!r} positionally, where {self.kind}s go; "
                    f"pass it as train={str(path)!r}."
                )
            if splits["train"] is not None:
                raise ValueError(
                    f"{owner}: train data was passed both positionally ({len(columns)} "
                    f"{self.kind}s) and as train=; pass it one way."
                )
            splits["train"] = columns
        self._sources: dict[str, Any] = {}
        for split, source in splits.items():
            if source is None:
                continue
            if isinstance(source, (str, os.PathLike)):
                self._sources[split] = check_path(split, source, self.suffixes, owner=owner)
            else:
                self._sources[split] = self._columns(split, source)
        if not loading_checkpoint(self):
            self.refuse_no_data()

    def refuse_no_data(self) -> None:
        if not self._sources:
            owner = type(self).__name__
            raise ValueError(
                f"{owner}: no data; pass {self.kind}s, e.g. {owner}(x, y), or train=, val=, "
                f"test=, predict= ({self.kind}s or a {'/'.join(self.suffixes)} path)."
            )

    def _columns(self, split: str, source: Any) -> Any:
        owner = type(self).__name__
        if isinstance(source, self.column_type):
            source = (source,)
        elif not isinstance(source, Sequence) or isinstance(source, (str, bytes)):
            raise TypeError(
                f"{owner}: {split} must be a {self.kind}, a tuple of {self.kind}s or a path, got "
                f"{type(source).__name__}."
            )
        try:
            return self.dataset_type(*source)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{owner}: {split}: {exc}") from exc

    def _read(self, split: str, path: str) -> Any:
        raise NotImplementedError

    def build_datasets(self, stage: str) -> Mapping[str, Any]:
        """Every split; a path is read here, in each process."""
        return {
            split: self._read(split, src) if isinstance(src, str) else src
            for split, src in self._sources.items()
            if split not in self._datasets  # built by an earlier stage's setup
        }


class TensorDataModule(_ColumnsDataModule):
    """Rows of tensors that share their first dimension; batches are tuples of tensors.

    Args:
        *tensors: The train tensors (shorthand for ``train=``).
        train: A tensor, a tuple of tensors, or the path of a ``.pt`` file holding one
            (loaded with ``weights_only=True``, memory-mapped).
        val: The val split, the same way (or use ``val_fraction``); ``test`` and
            ``predict`` likewise.
        **kwargs: The loader policy of :class:`~loaderkit.lightning.datamodules.LoaderDataModule`.

    Example:
        >>> import torch
        >>> from loaderkit import TensorDataModule
        >>> x, y = torch.randn(100, 8), torch.randint(0, 2, (100,))
        >>> dm = TensorDataModule(x, y, batch_size=16, val_fraction=0.2, seed=0)
        >>> dm.setup("fit")
        >>> xb, yb = next(iter(dm.train_dataloader()))
        >>> xb.shape, len(dm.val_dataset)
        (torch.Size([16, 8]), 20)
    """

    suffixes = (".pt", ".pth")
    kind = "tensor"
    column_type = torch.Tensor
    dataset_type = TensorDataset

    def __init__(
        self,
        *tensors: torch.Tensor,
        train: Tensors = None,
        val: Tensors = None,
        test: Tensors = None,
        predict: Tensors = None,
        **kwargs: Any,
    ) -> None:
        splits = {"train": train, "val": val, "test": test, "predict": predict}
        self.set_data_args(**splits | ({"train": tensors} if tensors else {}))
        super().__init__(**kwargs)
        self._set_sources(tensors, splits)

    def _read(self, split: str, path: str) -> TensorDataset:
        held = torch.load(path, mmap=True, weights_only=True)
        if not isinstance(held, torch.Tensor | tuple | list):
            raise TypeError(
                f"TensorDataModule: {split} file {path!r} holds a {type(held).__name__}, not a "
                "tensor or a tuple of tensors; save one, e.g. torch.save((x, y), path)."
            )
        return self._columns(split, held)


class ArrayDataModule(_ColumnsDataModule):
    """Rows of numpy arrays (``np.memmap`` too) that share their first dimension; only the
    rows of each batch are read. Batches are tuples of tensors.

    Args:
        *arrays: The train arrays (shorthand for ``train=``).
        train: An array, a tuple of arrays, or the path of a ``.npy`` file (memory-mapped
            when ``mmap``) or an ``.npz`` file (its arrays in ``keys`` order).
        val: The val split, the same way (or use ``val_fraction``); ``test`` and
            ``predict`` likewise.
        keys: The arrays of a ``.npz`` file, in batch order (default: all, as saved).
        mmap: Memory-map ``.npy`` files instead of reading them.
        **kwargs: The loader policy of :class:`~loaderkit.lightning.datamodules.LoaderDataModule`.

    Example:
        >>> import numpy as np
        >>> from loaderkit import ArrayDataModule
        >>> x = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
        >>> dm = ArrayDataModule(x, np.arange(50), batch_size=10)
        >>> dm.setup("fit")
        >>> [b.shape[0] for b, _ in dm.train_dataloader()]
        [10, 10, 10, 10, 10]
    """

    suffixes = (".npy", ".npz")
    kind = "numpy array"
    column_type = np.ndarray
    dataset_type = ArrayDataset
    mmap: bool

    def __init__(
        self,
        *arrays: np.ndarray,
        train: Arrays = None,
        val: Arrays = None,
        test: Arrays = None,
        predict: Arrays = None,
        keys: list[str] | None = None,
        mmap: bool = True,
        **kwargs: Any,
    ) -> None:
        if keys is not None and (
            isinstance(keys, str) or not all(isinstance(k, str) for k in keys) or not keys
        ):
            raise TypeError(
                f"{type(self).__name__}: keys must be a non-empty list of .npz array names, "
                f"got {keys!r}; pass e.g. keys=['x', 'y']."
            )
        splits = {"train": train, "val": val, "test": test, "predict": predict}
        self.set_data_args(**splits | ({"train": arrays} if arrays else {}))
        check_settings(self, mmap=mmap)
        self.keys = keys
        super().__init__(**kwargs)
        self._set_sources(arrays, splits)
        paths = [s for s in self._sources.values() if isinstance(s, str)]
        for name, value, default, suffix in (
            ("keys", keys, None, ".npz"),
            ("mmap", mmap, True, ".npy"),
        ):
            if value != default and not any(p.endswith(suffix) for p in paths):
                raise ValueError(
                    f"{type(self).__name__}: {name}={value!r} applies to {suffix} files only, "
                    f"but no split is one; drop {name}."
                )

    def _read(self, split: str, path: str) -> ArrayDataset:
        if path.endswith(".npy"):
            return self._columns(split, np.load(path, mmap_mode="r" if self.mmap else None))
        with np.load(path) as npz:
            keys = self.keys if self.keys is not None else list(npz.files)
            missing = [k for k in keys if k not in npz.files]
            if missing:
                raise ValueError(
                    f"{type(self).__name__}: keys {missing} are not in {path!r} (it has "
                    f"{npz.files}); fix keys=."
                )
            return self._columns(split, tuple(npz[k] for k in keys))
