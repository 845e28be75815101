"""What ``torch.utils.data.get_worker_info()`` tells user code inside loaderkit's workers (private).

torch keeps the answer in a module global of a private module; this is the
one place loaderkit writes it (``tests/test_worker_info.py`` checks the torch
internal it relies on). Two corrections, both so user code keeps the
meaning torch documents:

- ``dataset`` is the user's dataset, not the wrapper loaderkit's engine hands
  to torch, so per-worker set-up on it (opening files, ...) takes effect;
- while a stream reader reads a shard, the reader sees one worker: loaderkit
  already dealt that shard to this worker, and a reader that splits its work
  by ``get_worker_info()`` (the pattern of torch's docs) would otherwise drop
  the other workers' share silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import get_worker_info
from torch.utils.data._utils import worker as _torch_worker

__all__ = ["as_one_worker", "show_user_dataset"]


def show_user_dataset() -> None:
    """In a worker, make ``get_worker_info().dataset`` the user's dataset.

    The engine's wrapper names the user's dataset in its ``user_dataset``
    attribute; torch's worker loop keeps its own reference to the wrapper.
    """
    info = get_worker_info()
    user = getattr(getattr(info, "dataset", None), "user_dataset", None)
    if info is not None and user is not None:
        _torch_worker._worker_info = dataclasses.replace(info, dataset=user)


def as_one_worker(make: Any, *args: Any) -> Iterator[Any]:
    """Iterate ``make(*args)`` with ``get_worker_info()`` reporting worker 0 of 1.

    Every step of the iterator (where a generator runs its body) is taken
    under that view, and the real one is restored between steps, so the rest
    of the worker sees torch's answer.
    """
    info = get_worker_info()
    if info is None:  # the main process: user code already sees no workers
        yield from make(*args)
        return
    solo = dataclasses.replace(info, id=0, num_workers=1)
    it: Iterator[Any] | None = None
    while True:
        saved = _torch_worker._worker_info
        _torch_worker._worker_info = solo
        try:
            if it is None:
                source: Iterable[Any] = make(*args)
                it = iter(source)
            item = next(it)
        except StopIteration:
            return
        finally:
            _torch_worker._worker_info = saved
        yield item
