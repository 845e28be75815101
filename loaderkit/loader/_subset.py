"""Subsets of a dataset that keep its batched fetch (private).

A DataModule's seeded val split hands the loader a subset of the train data.
The subset must fetch the way the dataset does (``get_batch``, ``__getitems__``)
or the loader would fall back to per-sample reads; and it is unpickled by
every worker process, so it lives here, away from Lightning's import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from loaderkit.loader._fetch import batch_fetch_is_faithful

__all__ = ["index_subset"]


class _Subset(Dataset[Any]):
    """The samples of ``dataset`` at ``indices``; unlike ``torch.utils.data.Subset`` it
    keeps the batched fetch paths only where the dataset has them, so per-sample seeding
    stays per sample."""

    def __init__(self, dataset: Any, indices: np.ndarray) -> None:
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[int(self.indices[index])]


class _BatchedSubset(_Subset):
    def get_batch(self, indices: Any) -> Any:
        return self.dataset.get_batch(self.indices[np.asarray(indices, dtype=np.int64)])


class _ItemsSubset(_Subset):
    def __getitems__(self, indices: Sequence[int]) -> Any:
        return self.dataset.__getitems__(self.indices[np.asarray(indices)].tolist())


class _BothSubset(_BatchedSubset, _ItemsSubset):
    pass


def index_subset(dataset: Any, indices: np.ndarray) -> _Subset:
    """A subset of ``dataset`` fetched the same way as ``dataset`` itself."""
    # Else a subset would bypass an override of __getitem__.
    batched = batch_fetch_is_faithful(dataset)
    items = batch_fetch_is_faithful(dataset, "__getitems__")
    kind = {
        (False, False): _Subset,
        (True, False): _BatchedSubset,
        (False, True): _ItemsSubset,
        (True, True): _BothSubset,
    }[(batched, items)]
    return kind(dataset, indices)
