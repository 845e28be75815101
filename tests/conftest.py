"""Shared pytest set-up: hypothesis profiles; gpu-marked tests skip where no CUDA device is.

Hypothesis profiles (``tests/support/proptest.py``): ``quick`` is the default
and what ``make test`` runs; ``thorough`` draws ten times the examples, for a
nightly-style run: ``LOADERKIT_HYPOTHESIS_PROFILE=thorough pytest`` (or
``pytest --hypothesis-profile=thorough``).
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from tests.support.proptest import QUICK_BASE

# No deadline: a loaded CI machine must not turn a slow example into a failure.
settings.register_profile("quick", max_examples=QUICK_BASE, deadline=None)
settings.register_profile(
    "thorough",
    max_examples=10 * QUICK_BASE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("LOADERKIT_HYPOTHESIS_PROFILE", "quick"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker); none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
