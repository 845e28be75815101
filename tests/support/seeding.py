"""Importable helpers for tests/test_seeding.py: spawn/forkserver workers unpickle them by name."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch.utils.data import Dataset

USER_FN_CALLS: list[int] = []


def record_user_call(worker_id: int) -> None:
    """A user ``worker_init_fn``: leaves a trace the dataset reports back."""
    USER_FN_CALLS.append(worker_id)


class RandomDrawDataset(Dataset[tuple[int, int, float, float, float, tuple[int, ...]]]):
    """Item i: (i, worker id, one draw each from random / numpy / torch, user_fn calls)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[int, int, float, float, float, tuple[int, ...]]:
        info = torch.utils.data.get_worker_info()
        worker_id = -1 if info is None else info.id
        return (
            index,
            worker_id,
            random.random(),
            float(np.random.random_sample()),
            float(torch.rand(1).item()),
            tuple(USER_FN_CALLS),
        )
