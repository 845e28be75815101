"""The one ``Stateful`` protocol and the type aliases shared across modules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

__all__ = ["Batch", "Indices", "StateDict", "Stateful"]

StateDict: TypeAlias = dict[str, Any]
"""A plain, picklable dict that a Lightning checkpoint can hold."""

Indices: TypeAlias = Sequence[int]
"""Dataset indices of one batch, in the order they are yielded."""

Batch: TypeAlias = Any
"""Whatever a collate function returns: tensors nested in dicts, tuples, dataclasses."""


@runtime_checkable
class Stateful(Protocol):
    """Anything whose position can be saved and restored.

    Exactly the two methods below, with no extra parameters, so Lightning and
    torchdata can call them without knowing which loaderkit object they hold.
    A state dict carries a ``"version"`` key and the topology it depends on;
    ``load_state_dict`` rejects unknown or missing keys and names the field
    that differs.
    """

    def state_dict(self) -> StateDict:
        """Return the state as a plain dict."""
        ...

    def load_state_dict(self, state_dict: StateDict) -> None:
        """Restore the state returned by :meth:`state_dict`."""
        ...
