"""A schedule maps the order lazily: the first batch (from the start or after a resume) maps
only its own positions, later batches in growing chunks, and every batch equals the
materialized order."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loaderkit import ShardPlan
from loaderkit.plan.shard import _ShardOrder


def spy_positions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of positions of each call to the shard order's map, recorded."""
    mapped: list[int] = []
    real = _ShardOrder.at

    def at(self: _ShardOrder, positions: Any) -> np.ndarray:
        mapped.append(int(np.size(positions)))
        return real(self, positions)

    monkeypatch.setattr(_ShardOrder, "at", at)
    return mapped


@pytest.mark.parametrize(("start", "world_size"), [(0, 1), (10_800, 1), (10_800, 2)])
def test_the_first_batch_maps_only_its_own_positions(
    monkeypatch: pytest.MonkeyPatch, start: int, world_size: int
) -> None:
    plan = ShardPlan(shard_sizes=(3001, 5000, 0, 3999), batch_size=8, seed=3, window=64)
    order = plan.order(0).numpy()  # the reference, mapped before the spy
    mapped = spy_positions(monkeypatch)
    sched = plan.schedule(0, start=start, rank=world_size - 1, world_size=world_size)
    first = sched.indices_numpy(0)
    # Before: the whole rest of the epoch (up to a chunk) and the tail batch were mapped.
    assert mapped == [8]
    lo = start + (world_size - 1) * 8
    assert first.tolist() == order[lo : lo + 8].tolist()
    got = [sched.indices_numpy(s).tolist() for s in range(sched.num_steps)]
    step = 8 * world_size
    want = [order[lo + s * step : lo + s * step + 8].tolist() for s in range(sched._full)]
    assert got[: sched._full] == want
    assert max(mapped) <= 65_536 and len(mapped) <= 2 + np.log2(sched._full) / 2 + 2
