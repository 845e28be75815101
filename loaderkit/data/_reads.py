"""Which of a dataset's reads a loader calls: a batch read only where no subclass bypasses
``__getitem__`` (private)."""

from __future__ import annotations

import inspect
from contextvars import ContextVar
from typing import Any

from torch.utils.data import StackDataset, Subset

from loaderkit.seeding import read_set_on_instance

# The mix plan, ``(per_epoch, source_sizes)``, a loaderkit read runs under (None: another plan;
# unset outside loaderkit's reads), per context: a thread of another reader (torch's
# DataLoader) must not borrow it, so a thread the user's read starts has none. A weighted mix
# read outside its plan loses its weights.
READ_UNDER: ContextVar[tuple[tuple[int, ...], tuple[int, ...]] | None] = ContextVar(
    "loaderkit_read_under"
)


def batch_fetch_is_faithful(dataset: Any, method: str = "get_batch") -> bool:
    """Whether no subclass overrides ``__getitem__`` (for ``get_batch``, also ``__getitems__``)
    below the class defining ``dataset.<method>``."""
    if not callable(getattr(dataset, method, None)):
        return False
    own = getattr(dataset, "__dict__", {})
    if "__getitems__" in own:  # set on the instance: torch's fetcher calls it, so we do
        return method == "__getitems__" or method in own
    overrides = ("__getitem__", "__getitems__") if method == "get_batch" else ("__getitem__",)
    mro = type(dataset).__mro__
    owner = next((cls for cls in mro if method in vars(cls)), None)
    if owner is None:
        return False
    for cls in mro[: mro.index(owner)]:
        # torch calls __getitems__ whatever __getitem__ a mixin beside it defines; loaderkit's
        # get_batch is faithful only with no __getitem__ before it at all.
        beside = method == "__getitems__" and not issubclass(cls, owner)
        if not beside and any(name in vars(cls) for name in overrides):
            return False
    if method == "__getitems__" and torchs_wrapper(dataset):
        # torch's Subset/StackDataset call their datasets' batch reads: faithful if theirs are.
        return all(
            not callable(getattr(d, method, None)) or batch_fetch_is_faithful(d, method)
            for d in wrapped(dataset)
        )
    return True


def torchs_wrapper(dataset: Any) -> bool:
    """Whether ``dataset`` is a torch ``Subset`` or ``StackDataset`` reading as torch's do."""
    cls = type(dataset)
    if not isinstance(dataset, Subset | StackDataset) or read_set_on_instance(dataset):
        return False
    base = Subset if isinstance(dataset, Subset) else StackDataset
    names = ("__getitem__", "__getitems__")
    return all(inspect.getattr_static(cls, n) is vars(base)[n] for n in names)


def wrapped(dataset: Subset[Any] | StackDataset[Any]) -> list[Any]:
    if isinstance(dataset, Subset):
        return [dataset.dataset]
    parts = dataset.datasets
    return list(parts.values() if isinstance(parts, dict) else parts)
