"""``ResumableDataLoader`` refuses bad worker arguments at construction, naming each one.

Without these checks ``timeout="5"`` fails deep inside torch's worker loop at the
first batch (``'<' not supported between 'str' and 'int'``), and
``prefetch_factor=0`` or ``"2"`` only when the workers start.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from loaderkit import ResumableDataLoader

DATA = list(range(16))

BAD_ARGS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("timeout str", {"timeout": "5"}, TypeError, r"timeout must be a number.*'5'"),
    ("timeout bool", {"timeout": True}, TypeError, r"timeout must be a number"),
    (
        "timeout negative",
        {"timeout": -1},
        ValueError,
        r"timeout must be a finite number of seconds >= 0, got -1; pass e\.g\. timeout=60",
    ),
    (
        "prefetch str",
        {"num_workers": 2, "prefetch_factor": "2"},
        TypeError,
        r"prefetch_factor must be an int, got '2'",
    ),
    (
        "prefetch zero",
        {"num_workers": 2, "prefetch_factor": 0},
        ValueError,
        r"prefetch_factor must be >= 1, got 0",
    ),
    (
        "prefetch bool",
        {"num_workers": 2, "prefetch_factor": True},
        TypeError,
        r"prefetch_factor must be an int",
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"), [c[1:] for c in BAD_ARGS], ids=[c[0] for c in BAD_ARGS]
)
def test_bad_worker_args_are_refused_at_construction(
    kwargs: dict[str, Any], exc: type[Exception], match: str
) -> None:
    with pytest.raises(exc, match=match):
        ResumableDataLoader(DATA, batch_size=4, **kwargs)


def test_good_worker_args_still_load() -> None:
    loader = ResumableDataLoader(DATA, batch_size=4, num_workers=1, timeout=30.0, seed=0)
    assert torch.cat(list(loader)).tolist() == DATA
    ResumableDataLoader(DATA, batch_size=4, num_workers=2, prefetch_factor=1, timeout=30)
