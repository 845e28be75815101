"""The torch internal behind get_worker_info() that loaderkit._worker_info writes."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torch.utils.data._utils import worker as torch_worker

from loaderkit._worker_info import _replaced, as_one_worker


def test_get_worker_info_reads_the_module_global() -> None:
    # loaderkit relies on get_worker_info() returning torch_worker._worker_info, built
    # from keywords (a frozen dataclass since torch 2.13).
    assert get_worker_info() is None
    info = torch_worker.WorkerInfo(id=1, num_workers=2, seed=3, dataset=None)
    torch_worker._worker_info = info
    try:
        assert get_worker_info() is info
    finally:
        torch_worker._worker_info = None


def halves(n: int) -> Any:
    info = get_worker_info()
    lo = 0 if info is None else info.id * n // info.num_workers
    hi = n if info is None else (info.id + 1) * n // info.num_workers
    yield from range(lo, hi)


class Views(IterableDataset[Any]):
    def __iter__(self) -> Any:
        outside = get_worker_info()
        inside = list(as_one_worker(halves, 6))
        after = get_worker_info()
        yield (outside.id, outside.num_workers, inside, after is outside)


def test_as_one_worker_inside_real_workers() -> None:
    rows = list(DataLoader(Views(), batch_size=None, num_workers=2))
    assert sorted(r[0] for r in rows) == [0, 1]
    for _wid, num_workers, inside, restored in rows:
        assert num_workers == 2
        assert inside == list(range(6))  # the function saw one worker: nothing split
        assert restored


def test_as_one_worker_in_the_main_process_is_plain_iteration() -> None:
    assert list(as_one_worker(halves, 4)) == [0, 1, 2, 3]
    assert torch.utils.data.get_worker_info() is None


class KeywordWorkerInfo:
    """torch's ``WorkerInfo`` before 2.13 (torch 2.11 on the GPU machine): built from
    keywords, frozen once built, not a dataclass."""

    _built = False

    def __init__(self, **kwargs: Any) -> None:
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._built = True

    def __setattr__(self, name: str, value: Any) -> None:
        if self._built:
            raise RuntimeError(f"Cannot assign attributes to {type(self).__name__} objects")
        super().__setattr__(name, value)


def test_a_worker_info_of_either_torch_is_copied_with_the_changes() -> None:
    dataset, rng = object(), object()
    for kind in (torch_worker.WorkerInfo, KeywordWorkerInfo):
        info = kind(id=1, num_workers=2, seed=3, dataset=None, rng=rng, worker_method="thread")
        copy = _replaced(info, dataset=dataset, num_workers=4)
        assert type(copy) is kind
        assert (copy.id, copy.num_workers, copy.seed, copy.dataset) == (1, 4, 3, dataset)
        assert (copy.rng, copy.worker_method) == (rng, "thread")  # every other field kept
        assert (info.num_workers, info.dataset) == (2, None)
