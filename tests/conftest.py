"""Shared pytest set-up: gpu-marked tests skip themselves where no CUDA device is present."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker); none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
