"""Bounded property runs: how many examples a hypothesis test draws under the active profile.

Two profiles are registered in ``tests/conftest.py``: ``quick`` (the default,
what ``make test`` runs) and ``thorough`` (ten times the examples, for a
nightly-style run; see the README). A test states the count it needs under
``quick`` as ``@settings(max_examples=examples(250))``; the profile scales it.
"""

from __future__ import annotations

from hypothesis import settings

__all__ = ["QUICK_BASE", "examples"]

QUICK_BASE = 100  # max_examples of the quick profile: the unit the scale is measured in


def examples(quick: int) -> int:
    """``quick`` examples under the quick profile, scaled by the active profile's size."""
    return max(1, round(quick * settings.default.max_examples / QUICK_BASE))
