"""``loader.sampler`` and ``loader.batch_sampler`` of a ResumableDataLoader (private).

Code written for ``torch.utils.data.DataLoader`` reaches into these two
attributes; above all ``sampler.set_epoch(e)``, which Lightning's fit loop
calls on ``loader.sampler`` and ``loader.batch_sampler.sampler`` at the start
of every epoch (and never on the loader itself). Here they are views of the
loader's plan: ``set_epoch`` drives the loader, and iterating them lists the
indices the loader's next epoch yields on this rank. A sampler the user passed
stays ``loader.sampler`` itself, its ``set_epoch`` hooked (:class:`SetEpochHook`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler, SequentialSampler

__all__ = [
    "IterableOrder",
    "PlanBatches",
    "PlanOrder",
    "SetEpochHook",
    "hook_set_epoch",
    "plan_order",
]


class PlanOrder(Sampler[int]):
    """This rank's sample order in the loader's next epoch; ``set_epoch`` sets that epoch."""

    def __init__(self, loader: Any, engine: Any) -> None:
        # Weak: the loader holds this view; a cycle would delay freeing its workers.
        self._loader, self._engine = weakref.ref(loader), weakref.ref(engine)

    def _owner(self) -> Any:
        loader = self._loader()
        if loader is None:
            raise ReferenceError("this sampler's ResumableDataLoader no longer exists")
        return loader

    def set_epoch(self, epoch: int) -> None:
        """Make the loader's next iteration ``epoch``, as ``DistributedSampler.set_epoch`` does."""
        self._owner().set_epoch(epoch)

    def _schedule(self) -> Any:
        self._owner()
        return self._engine().schedule()  # type: ignore[union-attr]

    def _batches(self) -> Iterator[list[int]]:
        # One batch at a time: a plan's order is never listed whole (10^10 samples fit no list).
        sched = self._schedule()
        for step in range(sched.num_steps):
            yield sched.indices(step).tolist()

    def __iter__(self) -> Iterator[int]:
        for batch in self._batches():
            yield from batch

    def __len__(self) -> int:
        sched = self._schedule()
        # A sample plan's schedule counts its indices without mapping a position
        # (len() of a 10^10-sample epoch would otherwise map all of them); other
        # plans' batches vary in size and are counted.
        count = getattr(sched, "num_indices", None)
        if count is not None:
            return int(count())
        return sum(len(sched.indices(step)) for step in range(sched.num_steps))


class SequentialPlanOrder(PlanOrder, SequentialSampler):
    """:class:`PlanOrder` of an unshuffled plan: a ``SequentialSampler`` to code that checks."""

    # SequentialSampler's __init__ is not called: the order comes from the plan.


def plan_order(loader: Any, engine: Any, shuffled: bool) -> PlanOrder:
    """The ``sampler`` view of ``loader``; sequential when the plan does not shuffle."""
    return (PlanOrder if shuffled else SequentialPlanOrder)(loader, engine)


class PlanBatches(Sampler[list[int]]):
    """The loader's next epoch as index batches; ``.sampler`` is its :class:`PlanOrder`."""

    def __init__(self, order: PlanOrder) -> None:
        self.sampler = order

    def __iter__(self) -> Iterator[list[int]]:
        return self.sampler._batches()

    def __len__(self) -> int:
        return int(self.sampler._schedule().num_steps)


class IterableOrder(Sampler[None]):
    """``loader.sampler`` over an ``IterableDataset``: like ``DataLoader``'s, an endless
    sampler of ``None`` (the dataset decides its order), whose ``set_epoch`` drives the
    loader, as Lightning's fit loop expects of ``loader.sampler``."""

    def __init__(self, loader: Any) -> None:
        # Weak: the loader holds this view; a cycle would delay freeing its workers.
        self._loader = weakref.ref(loader)

    def set_epoch(self, epoch: int) -> None:
        """Make the loader's next iteration ``epoch``."""
        loader = self._loader()
        if loader is None:
            raise ReferenceError("this sampler's ResumableDataLoader no longer exists")
        loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None


class SetEpochHook:
    """The ``set_epoch`` a user's sampler gets while a loader exposes it as ``loader.sampler``.

    torch code drives the epoch through the sampler, ``loader.sampler.set_epoch(e)``
    (the DDP idiom, Lightning's fit loop); the loader lists the sampler's order
    itself, so that call must reach the loader too, or a run restarted at epoch 2
    silently yields epoch 0's order. The hook is an attribute on the instance, so
    ``loader.sampler is sampler``, ``type()`` and ``isinstance`` stay the
    user's. It calls the sampler's own ``set_epoch`` first (its attributes say
    the epoch, as before), then every loader that exposes it (a sampler shared by
    two loaders drives both, as it does two ``DataLoader`` s). The plan lists the
    order through the sampler's own method (:data:`UNHOOKED`), never this hook.
    """

    def __init__(self, original: Any) -> None:
        self._loaderkit_unhooked = original
        self._loaders: weakref.WeakSet[Any] = weakref.WeakSet()

    def __call__(self, epoch: int) -> Any:
        result = self._loaderkit_unhooked(epoch)
        for loader in list(self._loaders):
            loader.set_epoch(epoch)
        return result

    def __reduce__(self) -> Any:
        # A copied or pickled sampler gets its own method back, unhooked (no loader
        # is pickled with it).
        return self._loaderkit_unhooked.__reduce__()


def hook_set_epoch(sampler: Any, loader: Any) -> None:
    """Make ``sampler.set_epoch(e)`` also set ``loader``'s epoch (a sampler without one: no-op)."""
    current = getattr(sampler, "set_epoch", None)
    if not callable(current):
        return
    if not isinstance(current, SetEpochHook):
        hook = SetEpochHook(current)
        try:
            sampler.set_epoch = hook
        except (AttributeError, TypeError) as exc:  # __slots__ or a read-only attribute
            name = type(sampler).__name__
            raise TypeError(
                f"ResumableDataLoader: sampler={name} has set_epoch(), but loaderkit cannot "
                f"make sampler.set_epoch(e) also set the loader's epoch ({exc}): the loader "
                "lists the sampler's order itself, so that call would be silently ignored. "
                f"Give {name} a __dict__ (no __slots__), or wrap it in a Sampler subclass that "
                "forwards __iter__, __len__ and set_epoch."
            ) from exc
        current = hook
    current._loaders.add(loader)
