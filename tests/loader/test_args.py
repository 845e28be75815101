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


def test_rank_and_world_size_are_checked_by_the_loader_and_take_numpy_ints() -> None:
    # Hunter 334: the errors named WorkerEnv, and rank=1 alone said to pass a rank; numpy ints
    # (which torch's DistributedSampler takes) were refused.
    import numpy as np

    data = list(range(10))
    with pytest.raises(ValueError, match=r"rank=1 was given without world_size=.*pass world_size="):
        list(ResumableDataLoader(data, batch_size=2, rank=1))
    # Hunter 384: world_size=2 alone made every process rank 0 (each read the same half).
    with pytest.raises(ValueError, match=r"world_size=2 was given without rank=.*pass rank="):
        list(ResumableDataLoader(data, batch_size=2, world_size=2))
    whole = ResumableDataLoader(data, batch_size=2, world_size=1)  # one part: the process's own
    assert sorted(int(i) for b in whole for i in b) == data
    with pytest.raises(
        ValueError, match=r"ResumableDataLoader: rank must be < world_size=2, got 5"
    ):
        ResumableDataLoader(data, batch_size=2, rank=5, world_size=2)
    with pytest.raises(TypeError, match=r"ResumableDataLoader: world_size must be an int"):
        ResumableDataLoader(data, batch_size=2, world_size=2.0)
    given = ResumableDataLoader(data, batch_size=2, rank=np.int64(1), world_size=np.int64(2))
    plain = ResumableDataLoader(data, batch_size=2, rank=1, world_size=2)
    assert [b.tolist() for b in given] == [b.tolist() for b in plain] == [[2, 3], [6, 7], [9]]
