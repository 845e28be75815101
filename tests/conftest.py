"""Shared pytest set-up: hypothesis profiles; gpu-marked tests skip where no CUDA device is.

Hypothesis profiles (``tests/support/proptest.py``): ``quick`` is the default
and what ``make test`` runs; ``thorough`` draws ten times the examples, for a
nightly-style run: ``LOADERKIT_HYPOTHESIS_PROFILE=thorough pytest`` (or
``pytest --hypothesis-profile=thorough``).
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

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
    # Files with distributed, then slow tests first, and among those the files with more
    # tests first (stable otherwise; a file's tests stay together for its module fixtures):
    # `make test`'s two processes take whole files in this order (--no-loadscope-reorder),
    # so neither ends the run alone on a long one.
    rank: dict[str, tuple[bool, bool]] = {}
    count: Counter[str] = Counter()
    for item in items:
        key = ("distributed" not in item.keywords, "slow" not in item.keywords)
        rank[item.path.as_posix()] = min(rank.get(item.path.as_posix(), key), key)
        count[item.path.as_posix()] += 1
    items.sort(key=lambda item: (*rank[item.path.as_posix()], -count[item.path.as_posix()]))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker); none is present")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in a fresh folder that also holds ``tempfile``'s folders (docs examples call
    ``tempfile.mkdtemp()``; pytest prunes its own folders, /tmp would keep them)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path
