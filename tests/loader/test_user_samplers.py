"""Samplers the user passes to ResumableDataLoader behave as under torch's DataLoader.

Each test is a way a user's sampler once gave silently different data (or an
error from inside the sampler with no hint why).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import Sampler

from loaderkit import ResumableDataLoader


def epoch_ids(loader: ResumableDataLoader) -> list[int]:
    return [int(i) for batch in loader for i in batch]


# --------------------------------------------------- a non-torch generator
class NumpySampler(Sampler[int]):
    """Draws from a numpy Generator kept in ``generator``: a common pattern."""

    def __init__(self, n: int) -> None:
        self.n, self.generator = n, np.random.default_rng(0)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return iter(self.generator.permutation(self.n).tolist())


class NumpyEpochSampler(NumpySampler):
    """A numpy generator reseeded by set_epoch: its order is a function of the epoch."""

    def set_epoch(self, epoch: int) -> None:
        self.generator = np.random.default_rng(epoch)


def test_a_numpy_generator_is_not_replaced_and_an_unseeded_one_is_refused_by_name() -> None:
    # It was overwritten with a torch.Generator: AttributeError from inside __iter__.
    with pytest.raises(
        TypeError,
        match=r"sampler=NumpySampler lists a different order each time.*its `generator` is a "
        r"numpy\.random\._generator\.Generator, which loaderkit does not reseed.*set_epoch",
    ):
        ResumableDataLoader(list(range(8)), batch_size=2, sampler=NumpySampler(8))


def test_a_numpy_generator_reseeded_by_set_epoch_is_kept() -> None:
    sampler = NumpyEpochSampler(8)
    loader = ResumableDataLoader(list(range(8)), batch_size=2, sampler=sampler, seed=0)
    assert isinstance(sampler.generator, np.random.Generator)
    first, second = epoch_ids(loader), epoch_ids(loader)
    assert first == np.random.default_rng(0).permutation(8).tolist()
    assert second == np.random.default_rng(1).permutation(8).tolist()
