"""Records of a plain (Lightning-free) loader loop, for the resume oracle
(:func:`tests.support.helpers.assert_resume_exact`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loaderkit import ResumableDataLoader
from tests.support.helpers import Record, assert_resume_exact


def loader_records(
    loader: ResumableDataLoader,
    ids: Callable[[Any], list[int]],
    *,
    epochs: int = 2,
    stop: int | None = None,
    first_epoch: int = 0,
) -> list[Record]:
    """``{"epoch", "batch_idx", "ids"}`` per batch over ``epochs`` epochs (each ``iter``
    of the loader is its next epoch), stopping after ``stop`` batches if given."""
    out: list[Record] = []
    for epoch in range(first_epoch, epochs):
        for batch_idx, batch in enumerate(loader):
            out.append({"epoch": epoch, "batch_idx": batch_idx, "ids": ids(batch)})
            if stop is not None and len(out) == stop:
                return out
    return out


def check_resume_oracle(
    make: Callable[[int], ResumableDataLoader],
    ids: Callable[[Any], list[int]],
    cuts: tuple[int, ...],
    num_workers: int,
) -> list[Record]:
    """The resume oracle over two epochs, cut at each of ``cuts`` batches, resumed with a
    new loader from ``make(num_workers)``; returns the uninterrupted run's records."""
    full = loader_records(make(num_workers), ids)
    for k in cuts:
        cut = make(num_workers)
        before = loader_records(cut, ids, stop=k)
        state = cut.state_dict()
        resumed = make(num_workers)
        resumed.load_state_dict(state)
        after = loader_records(resumed, ids, first_epoch=state["epoch"])
        # batch_idx restarts in the resumed epoch: compare epochs and ids only.
        assert_resume_exact(full, before, after)
    return full
