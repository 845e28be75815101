"""Who is iterating a loader: the one fact loaderkit needs about its caller (private).

Lightning's training loop treats loaders in two ways that lose batches
silently: it prefetches a batch ahead of a loader without a length, and it
caps an epoch at the first ``len()`` it read. Both are only a problem when
Lightning's loop is the caller, so loaderkit raises its errors for them only
then; a loop of one's own is unaffected.
"""

from __future__ import annotations

import sys

__all__ = ["under_lightning_loop"]

_LOOP_MODULES = ("lightning.pytorch.loops", "pytorch_lightning.loops")


def under_lightning_loop() -> bool:
    """Whether a Lightning training loop is on the call stack."""
    if "lightning.pytorch" not in sys.modules and "pytorch_lightning" not in sys.modules:
        return False
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith(_LOOP_MODULES):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False
