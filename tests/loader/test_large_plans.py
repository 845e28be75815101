"""A ResumableDataLoader over 10^10 samples: nothing of the epoch's size is built.

Its sampler views count and list the plan batch by batch, and a state saved
at 90 % of the epoch resumes to the batch the plan deals there (the keyed
order is evaluated only at the positions dealt; ``benchmarks/plans`` times it).
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from loaderkit import ResumableDataLoader, SamplePlan
from loaderkit.plan._cursor import PlanCursor

N = 10**10


class Huge:
    """A map-style dataset whose sample is its index (only the lengths are big)."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        return index


def test_the_sampler_views_count_a_huge_epoch_without_listing_it() -> None:
    loader = ResumableDataLoader(Huge(), batch_size=256, shuffle=True, seed=0)
    assert len(loader.sampler) == N
    assert len(loader.batch_sampler) == -(-N // 256) == len(loader)
    first = next(iter(loader.batch_sampler))
    assert len(set(first)) == 256 and all(0 <= i < N for i in first)
    assert first == next(iter(loader)).tolist()


def test_a_resume_at_90_percent_of_a_huge_epoch_yields_the_planned_batch() -> None:
    loader = ResumableDataLoader(Huge(), batch_size=256, shuffle=True, seed=0)
    plan = loader.plan
    assert isinstance(plan, SamplePlan)
    position = N // 10 * 9
    saved = PlanCursor()
    saved.resume_at(2, position, position // 256)
    state = saved.state(plan, plan.fingerprint(), world_size=1, num_workers=0)
    resumed = ResumableDataLoader(Huge(), batch_size=256, shuffle=True, seed=0)
    tracemalloc.start()
    try:
        resumed.load_state_dict(state)
        batch = next(iter(resumed))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    expected = plan.order_at(2, np.arange(position, position + 256))
    assert batch.tolist() == expected.tolist()
    assert resumed.state_dict()["position"] == position + 256
