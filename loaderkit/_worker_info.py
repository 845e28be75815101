"""What ``get_worker_info()`` tells user code in loaderkit's workers: the one place loaderkit
writes torch's private module global (``tests/test_worker_info.py`` pins it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import get_worker_info
from torch.utils.data._utils import worker as _torch_worker


def _replaced(info: Any, **changes: Any) -> Any:
    """A copy of torch's ``WorkerInfo`` with ``changes``. It is a frozen dataclass since torch
    2.13; before, a class built from keywords that refuses ``setattr`` once built."""
    if dataclasses.is_dataclass(info) and not isinstance(info, type):
        return dataclasses.replace(info, **changes)
    fields = {name: value for name, value in vars(info).items() if not name.startswith("_")}
    return type(info)(**{**fields, **changes})


def show_user_dataset() -> None:
    """In a worker, make ``get_worker_info().dataset`` the user's dataset, not the wrapper."""
    info = get_worker_info()
    user = getattr(getattr(info, "dataset", None), "user_dataset", None)
    if info is not None and user is not None:
        _torch_worker._worker_info = _replaced(info, dataset=user)


def as_one_worker(make: Any, *args: Any) -> Iterator[Any]:
    """Iterate ``make(*args)`` with ``get_worker_info()`` reporting worker 0 of 1 during each
    step, so a reader splitting by worker keeps the shard loaderkit dealt it whole."""
    info = get_worker_info()
    if info is None:  # the main process: user code already sees no workers
        yield from make(*args)
        return
    solo = _replaced(info, id=0, num_workers=1)
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
