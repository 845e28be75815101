"""``ImageFolderDataModule``: class-per-folder images with reproducible augmentation."""

from __future__ import annotations

import inspect
import numbers
import os
from collections.abc import Callable, Mapping
from typing import Any, TypeGuard

import torch

from loaderkit.errors import require
from loaderkit.lightning.datamodules._args import check_settings
from loaderkit.lightning.datamodules.base import LoaderDataModule

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ImageFolderDataModule"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _torchvision() -> tuple[Any, Any]:
    need = "ImageFolderDataModule needs"
    return require("torchvision.datasets", need, "vision"), require(
        "torchvision.transforms.v2", need, "vision"
    )


def _real(value: object) -> TypeGuard[float]:
    """A number (Python's or numpy's scalar), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _triple(owner: str, name: str, value: object, positive: bool) -> tuple[float, float, float]:
    given = list(value) if isinstance(value, (tuple, list)) and all(map(_real, value)) else []
    if len(given) != 3 or (positive and min(given) <= 0):
        rule = "a tuple of 3 numbers > 0" if positive else "a tuple of 3 numbers"
        raise ValueError(
            f"{owner}: {name} must be {rule}, one per RGB channel, got {value!r}; "
            f"pass e.g. {name}={IMAGENET_STD if positive else IMAGENET_MEAN}."
        )
    return (float(given[0]), float(given[1]), float(given[2]))


def _number(
    owner: str, name: str, value: object, rule: str, ok: Callable[[float], bool], example: str
) -> float:
    if not _real(value):
        raise TypeError(
            f"{owner}: {name} must be a number {rule}, got {value!r} ({type(value).__name__}); "
            f"pass {example}."
        )
    if not ok(value):
        raise ValueError(f"{owner}: {name} must be {rule}, got {value!r}; pass {example}.")
    return float(value)


def _folder(owner: str, name: str, value: object) -> str:
    fix = "pass a folder with one subfolder of images per class."
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{owner}: {name} must be a directory path, got {value!r}; {fix}")
    if not os.path.isdir(value):
        raise ValueError(f"{owner}: {name}={os.fspath(value)!r} is not a directory; {fix}")
    return os.path.abspath(value)  # the images of the folder given, whatever the cwd is later


class ImageFolderDataModule(LoaderDataModule):
    """Images in one folder per class (torchvision ``ImageFolder``), augmented for training.

    Train: ``RandomResizedCrop``, ``RandomHorizontalFlip``, ``ColorJitter``,
    ``Normalize``; eval: ``Resize(image_size / crop_fraction)``, ``CenterCrop``,
    ``Normalize``. Batches are float32 ``(B, 3, image_size, image_size)`` images and
    int64 labels, augmented the same for any ``num_workers`` and after a resume.

    Args:
        root: The train images: ``root/<class>/<image>``.
        val_root: The val images, with the same class folders (or use ``val_fraction``).
        test_root: The test images, with the same class folders.
        image_size: Side of the square crops.
        mean: Per-channel mean of ``Normalize`` (default ImageNet's).
        std: Per-channel std of ``Normalize`` (default ImageNet's).
        color_jitter: Brightness, contrast and saturation jitter (0: none).
        crop_fraction: Eval crops are this fraction of the resized side.
        train_transform: Replaces the train transform (a callable on a PIL image).
        eval_transform: Replaces the val/test transform.
        **kwargs: The loader policy of :class:`~loaderkit.lightning.datamodules.LoaderDataModule`.

    Raises:
        MissingDependencyError: torchvision is not installed.

    Example:
        >>> from loaderkit import ImageFolderDataModule
        >>> dm = ImageFolderDataModule("data/train", val_root="data/val", image_size=64,
        ...                            batch_size=32, num_workers=4)  # doctest: +SKIP
    """

    image_size: int

    def __init__(
        self,
        root: str,
        val_root: str | None = None,
        test_root: str | None = None,
        *,
        image_size: int = 224,
        mean: tuple[float, float, float] = IMAGENET_MEAN,
        std: tuple[float, float, float] = IMAGENET_STD,
        color_jitter: float = 0.4,
        crop_fraction: float = 0.875,
        train_transform: Callable[[Any], Any] | None = None,
        eval_transform: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.set_data_args(train_transform=train_transform, eval_transform=eval_transform)
        super().__init__(**kwargs)
        owner = type(self).__name__
        _torchvision()  # fail now, with the install command, not at setup
        given = {"train": ("root", root), "val": ("val_root", val_root)}
        given["test"] = ("test_root", test_root)
        self.roots = {s: _folder(owner, n, v) for s, (n, v) in given.items() if v is not None}
        check_settings(self, image_size=image_size)
        self.mean = _triple(owner, "mean", mean, positive=False)
        self.std = _triple(owner, "std", std, positive=True)
        self.color_jitter = _number(
            owner, "color_jitter", color_jitter, ">= 0", lambda v: v >= 0, "e.g. 0.4, or 0"
        )
        self.crop_fraction = _number(
            owner, "crop_fraction", crop_fraction, "in (0, 1]", lambda v: 0 < v <= 1, "e.g. 0.875"
        )
        for name, fn in (("train_transform", train_transform), ("eval_transform", eval_transform)):
            if fn is not None and not callable(fn):
                raise TypeError(
                    f"{owner}: {name} must be callable or None, got {fn!r}; pass a transform, "
                    "or None for the default."
                )
        self._refuse_replaced(train_transform, eval_transform)
        self.train_transform = train_transform or self._default_transform(train=True)
        self.eval_transform = eval_transform or self._default_transform(train=False)

    def _refuse_replaced(self, train: Any, evaluate: Any) -> None:
        """A default transform's setting is refused where a given transform replaces every
        default that would use it."""
        own_train, own_eval = train is not None, evaluate is not None
        replaced = {
            "image_size": own_train and own_eval,
            "mean": own_train and own_eval,
            "std": own_train and own_eval,
            "color_jitter": own_train,
            "crop_fraction": own_eval,
        }
        # The defaults of the class built (a subclass may have its own).
        signature = inspect.signature(type(self).__init__).parameters
        base = inspect.signature(ImageFolderDataModule.__init__).parameters
        for name, unused in replaced.items():
            default = (signature[name] if name in signature else base[name]).default
            value = getattr(self, name)
            if unused and value != (tuple(default) if name in ("mean", "std") else default):
                raise ValueError(
                    f"{type(self).__name__}: {name}={value!r} has no effect, since the given "
                    f"transforms replace the defaults that use it; apply it in your transform, "
                    f"or leave {name} at its default."
                )

    def _default_transform(self, train: bool) -> Callable[[Any], Any]:
        v2, size, jitter = _torchvision()[1], self.image_size, self.color_jitter
        if train:
            steps = [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
            steps += [v2.ColorJitter(jitter, jitter, jitter)] if jitter else []
        else:
            resize = v2.Resize(round(size / self.crop_fraction), antialias=True)
            steps = [resize, v2.CenterCrop(size)]
        return v2.Compose(
            [
                v2.ToImage(),
                *steps,
                v2.ToDtype(torch.float32, scale=True),
                v2.Normalize(self.mean, self.std),
            ]
        )

    def _images(self, root: str, transform: Callable[[Any], Any]) -> Any:
        return _torchvision()[0].ImageFolder(root, transform=transform)

    def build_datasets(self, stage: str) -> Mapping[str, Any]:
        """``ImageFolder`` datasets; every split must have the train split's classes."""
        out = {}
        for split, root in self.roots.items():
            if split in self._datasets:  # built by an earlier stage's setup
                continue
            transform = self.train_transform if split == "train" else self.eval_transform
            out[split] = self._images(root, transform)
        first = out["train"].classes if "train" in out else self.classes
        for split, ds in out.items():
            if ds.classes != first:
                raise ValueError(
                    f"{type(self).__name__}: the {split} folder has classes {ds.classes}, but "
                    f"the train folder has {first}; give every split the same class folders."
                )
        return out

    def val_view(self, train: Any) -> Any:
        """The train images under the eval transform, for a ``val_fraction`` split."""
        return self._images(self.roots["train"], self.eval_transform)

    @property
    def classes(self) -> list[str]:
        """The class names (folder names, sorted); index = label."""
        dataset = self._dataset("train")
        while hasattr(dataset, "dataset"):  # a val_fraction subset
            dataset = dataset.dataset
        return list(dataset.classes)
