"""The one ``Stateful`` protocol and the type aliases shared across modules."""

from __future__ import annotations

from typing import Any, Protocol, TypeAlias, runtime_checkable

__all__ = ["Batch", "Stateful"]

Batch: TypeAlias = Any
"""Whatever a collate function returns: tensors nested in dicts, tuples, dataclasses."""


@runtime_checkable
class Stateful(Protocol):
    """Anything whose position can be saved and restored with these two methods."""

    def state_dict(self) -> dict[str, Any]:
        """Return the state as a plain, picklable dict."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict`."""
