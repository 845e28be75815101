"""``loader.sampler`` and ``loader.batch_sampler`` (private): views of the loader's plan whose
``set_epoch`` drives the loader; a user's sampler stays, its ``set_epoch`` hooked.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Iterator
from typing import Any

from torch.utils.data import Sampler, SequentialSampler


def _alive(ref: weakref.ref[Any]) -> Any:
    loader = ref()
    if loader is None:
        raise ReferenceError("this sampler's ResumableDataLoader no longer exists")
    return loader


class PlanOrder(Sampler[int]):
    """This rank's sample order in the loader's next epoch; ``set_epoch`` sets that epoch."""

    def __init__(self, loader: Any, engine: Any) -> None:
        # Weak: a cycle would delay freeing the loader's workers.
        self._loader, self._engine = weakref.ref(loader), weakref.ref(engine)

    def set_epoch(self, epoch: int) -> None:
        """Make the loader's next iteration ``epoch``, as ``DistributedSampler.set_epoch`` does;
        while Lightning evaluates, its own epoch count is kept at 0 (``loader.set_epoch`` is
        not)."""
        _alive(self._loader)._set_epoch(epoch)

    def _schedule(self) -> Any:
        _alive(self._loader)
        return self._engine().schedule()  # type: ignore[union-attr]

    def _num_steps(self) -> int:
        # Counted without listing the order: a reseed of the user's generator after len()
        # still applies to that epoch.
        _alive(self._loader)
        return int(self._engine().upcoming_steps())  # type: ignore[union-attr]

    def _batches(self) -> Iterator[list[int]]:
        # One batch at a time: a plan's order may be too large to list whole.
        sched = self._schedule()
        for step in range(sched.num_steps):
            yield sched.indices(step).tolist()

    def __iter__(self) -> Iterator[int]:
        for batch in self._batches():
            yield from batch

    def __len__(self) -> int:
        return count_indices(self._schedule())


def count_indices(sched: Any) -> int:
    """Indices ``sched`` yields over its steps (a sample plan's counted without mapping them)."""
    count = getattr(sched, "num_indices", None)
    if count is not None:
        return int(count())
    return sum(len(sched.indices(step)) for step in range(sched.num_steps))


class SequentialPlanOrder(PlanOrder, SequentialSampler):
    """:class:`PlanOrder` of an unshuffled plan: a ``SequentialSampler`` to code that checks."""


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
        return self.sampler._num_steps()


class IterableOrder(Sampler[None]):
    """``loader.sampler`` over an ``IterableDataset``: endless ``None``, as ``DataLoader``'s."""

    def __init__(self, loader: Any) -> None:
        self._loader = weakref.ref(loader)  # weak, as PlanOrder's

    def set_epoch(self, epoch: int) -> None:
        """Make the loader's next iteration ``epoch`` (kept at 0 as :class:`PlanOrder`'s)."""
        _alive(self._loader)._set_epoch(epoch)

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None


class SetEpochHook:
    """A user's sampler's ``set_epoch``, on the instance: the original, then every loader's
    (an iterable dataset's: its engine's) ``_set_epoch``."""

    def __init__(self, original: Any) -> None:
        self._loaderkit_unhooked = original
        self._loaders: weakref.WeakSet[Any] = weakref.WeakSet()

    def __call__(self, epoch: int, *args: Any, **kwargs: Any) -> Any:
        result = self._loaderkit_unhooked(epoch, *args, **kwargs)
        for loader in list(self._loaders):
            loader._set_epoch(epoch)
        return result

    def __reduce__(self) -> Any:
        # A copied or pickled sampler gets its own method back, unhooked.
        return self._loaderkit_unhooked.__reduce__()


def _takes_epoch(set_epoch: Any) -> bool:
    """Whether ``set_epoch`` can be called with the epoch alone (torch's samplers' form)."""
    try:
        inspect.signature(set_epoch).bind(0)
    except TypeError:  # set_epoch(self), set_epoch(self, epoch, num_epochs)
        return False
    except ValueError:  # no signature to read (a C function)
        pass
    return True


def hook_set_epoch(sampler: Any, loader: Any, *, required: bool = True) -> bool:
    """Make ``sampler.set_epoch(e)`` (also an iterable dataset's) set ``loader``'s epoch too;
    whether it does (one without it, or with another signature: no-op; one that cannot be
    hooked: refused where ``required``, else left as it is)."""
    current = getattr(sampler, "set_epoch", None)
    if not callable(current) or not _takes_epoch(current):
        return False
    if not isinstance(current, SetEpochHook):
        hook = SetEpochHook(current)
        try:
            sampler.set_epoch = hook
        except (AttributeError, TypeError) as exc:  # __slots__ or a read-only attribute
            if not required:
                return False
            name = type(sampler).__name__
            raise TypeError(
                f"ResumableDataLoader: sampler={name} has set_epoch(), but loaderkit cannot "
                f"hook it to set the loader's epoch ({exc}). Give {name} a __dict__ (no "
                "__slots__), or wrap it in a Sampler that forwards __iter__, __len__, set_epoch."
            ) from exc
        current = hook
    current._loaders.add(loader)
    return True
