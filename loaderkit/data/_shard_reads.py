"""Which reads of an open shard :meth:`ShardedDataset.get_batch` may use (private): never
one that bypasses a subclass's or wrapper's ``read``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from loaderkit.data.readers import OpenShard, _Documents, _FixedTokens


class RowSource(NamedTuple):
    """An open shard as :meth:`ShardedDataset.get_batch` reads it: its ``rows`` (None: not
    to be copied), their ``kind`` (shape and returned dtype, one object per kind), its guard's
    ``sizers`` and their ``expected`` sizes; ``take``: the rows are disjoint."""

    handle: OpenShard
    rows: np.ndarray | None
    kind: tuple[tuple[int, ...], np.dtype] | None
    sizers: list[Callable[[], int]]
    expected: list[int]
    take: bool


_READS = ("read", "read_batch")


def _own(handle: Any) -> dict[str, Any]:
    """The attributes set on ``handle`` itself (none under ``__slots__``)."""
    try:
        own: dict[str, Any] = object.__getattribute__(handle, "__dict__")
    except AttributeError:
        return {}
    return own


def _defined_at(mro: tuple[type, ...], name: str) -> int:
    """Where in ``mro`` ``name`` is first defined, statically; ``len(mro)``: nowhere."""
    return next((k for k, c in enumerate(mro) if name in vars(c)), len(mro))


def batch_read(handle: Any) -> Callable[[np.ndarray], Any] | None:
    """``handle.read_batch`` where it is at least as much the handle's own as ``read`` is (else
    None: an overridden ``read`` or a wrapper's ``__getattr__`` would be bypassed)."""
    return _beside_read(handle, "read_batch")


def shard_lengths(handle: Any) -> Callable[[], Any] | None:
    """``handle.lengths`` where it is at least as much the handle's own as ``read`` is (else
    None: a wrapper adding tokens in ``read`` forwards the inner shard's)."""
    return _beside_read(handle, "lengths")


def _beside_read(handle: Any, name: str) -> Any:
    own = _own(handle)
    if name not in own:
        if "read" in own:
            return None
        cls = type(handle)
        if cls is not _FixedTokens and cls is not _Documents:  # both define all three
            mro = cls.__mro__
            at = _defined_at(mro, name)
            if at == len(mro) or at > _defined_at(mro, "read"):
                return None
    found = getattr(handle, name, None)
    return found if callable(found) else None


def own_rows(handle: Any) -> Any:
    """``handle.rows`` where copying them is what the shard's own reads return (no read
    redefined below where ``rows`` is; an instance's counts as the base-most ``__init__``'s)."""
    own = _own(handle)
    if any(name in own for name in _READS):
        return None
    cls = type(handle)
    if cls is _FixedTokens:
        return own.get("rows")
    mro = cls.__mro__
    if "rows" in own:
        bases = [k for k, c in enumerate(mro) if c is not object and "__init__" in vars(c)]
        where = bases[-1] if bases else len(mro) - 1
    else:
        where = _defined_at(mro, "rows")
        if where == len(mro):
            return None
    if any(_defined_at(mro, name) < where for name in _READS):
        return None
    if "rows" in own:
        return own["rows"]
    rows = vars(mro[where])["rows"]
    get = getattr(type(rows), "__get__", None)
    try:
        return rows if get is None else get(rows, handle, cls)
    except AttributeError:  # an unset slot, say: no rows
        return None


class Sources(dict[int, RowSource]):
    """This process's row sources by shard (not pickled); ``opens``: as of the last prune."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: dict[Any, Any] = {}
        self.lengths: dict[int, tuple[Any, Any]] = {}  # shard: (handle, its lengths or None)
        self.opens = 0

    def __reduce__(self) -> tuple[Any, ...]:
        return (Sources, ())
