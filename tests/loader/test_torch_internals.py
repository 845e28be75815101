"""The torch DataLoader internals loader/_workers.py and loader/_slots.py rely on.

loaderkit reads or replaces these to name a dead worker in ``next()`` and to move
batches through its slots; a torch release that renames one fails here, not
silently in a run (the fallbacks are torch's own behaviour).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import _utils as torch_utils
from torch.utils.data._utils import signal_handling
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from loaderkit import ResumableDataLoader
from loaderkit.loader import _workers


def test_the_multiprocessing_iterator_has_what_the_worker_guard_replaces() -> None:
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=4, num_workers=1)
    it = iter(loader)
    try:
        assert isinstance(it, _MultiProcessingDataLoaderIter)
        assert callable(it._try_get_data)  # replaced by a polling version (_workers._poll)
        assert isinstance(it._task_info, dict)
        assert it._worker_pids_set is True  # torch's SIGCHLD handler is armed
        assert callable(it._shutdown_workers)
        assert [b[0].tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    finally:
        it._shutdown_workers()
    assert callable(signal_handling._remove_worker_pids)
    assert callable(DataLoader._get_iterator) and hasattr(loader, "_iterator")
    assert callable(torch_utils.ExceptionWrapper)


def test_loaderkits_workers_take_over_torchs_failure_checks(monkeypatch: Any) -> None:
    seen: list[Any] = []
    take_over = _workers._take_over_failure_checks

    def spy(workers: Any) -> None:
        take_over(workers)
        seen.append(workers)

    monkeypatch.setattr(_workers, "_take_over_failure_checks", spy)
    loader = ResumableDataLoader(TensorDataset(torch.arange(8)), batch_size=4, num_workers=1)
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    (workers,) = seen
    assert isinstance(workers, _MultiProcessingDataLoaderIter)
    assert workers._loaderkit_guarded is True
    assert workers._worker_pids_set is False  # torch's SIGCHLD handler disarmed for it
    assert workers._try_get_data.func is _workers._poll
