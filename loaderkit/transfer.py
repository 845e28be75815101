"""Moving batches to the accelerator: device choice, pinning, ``non_blocking`` where safe, and
:class:`DevicePrefetcher` (batch ``n + 1`` copied on a side CUDA stream during batch ``n``)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import warnings
from collections import UserDict, UserList, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any, Literal, TypeAlias

import torch

from loaderkit.errors import LoaderkitError
from loaderkit.types import Batch

__all__ = [
    "DeviceLike",
    "DevicePrefetcher",
    "move_to_device",
    "non_blocking_for",
    "pin_batch",
    "resolve_pin_memory",
    "select_device",
    "should_pin_memory",
]

DeviceLike: TypeAlias = torch.device | str | int
"""A device as torch accepts it: ``torch.device``, ``"cuda:1"``, or an accelerator index."""

_PINNABLE = frozenset({"cuda", "xpu"})  # torch refuses to pin for MPS
# A non_blocking copy to the host returns before the data is there; MPS's are unreliable.
_BLOCKING_TARGETS = frozenset({"cpu", "mps"})


def _parse_device(func: str, device: object) -> torch.device:
    if isinstance(device, torch.device):
        return device
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise TypeError(
            f"{func}: device must be a torch.device, a str such as 'cuda:0' or an int "
            f"accelerator index, got {device!r} ({type(device).__name__})."
        )
    if isinstance(device, int) and device < 0:
        raise ValueError(
            f"{func}: device index must be >= 0, got {device}; pass e.g. 0 or 'cuda:0'."
        )
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            f"{func}: device {device!r} is not a valid device string; "
            "pass e.g. 'cpu', 'cuda' or 'cuda:1'."
        ) from error


def _available_accelerator() -> torch.device | None:
    return torch.accelerator.current_accelerator(check_available=True)


def _visible_accelerator() -> torch.device | None:
    # For decisions at construction: torch.cuda.is_available() starts CUDA's driver (a process
    # forked after that cannot use CUDA); device_count() asks NVML, which does not.
    accelerator = torch.accelerator.current_accelerator()
    return accelerator if accelerator is not None and torch.accelerator.device_count() else None


def pin_now(pin: bool) -> bool:
    """``pin`` (decided at construction) confirmed by the runtime as batches start: NVML can
    count a GPU that CUDA cannot use (a driver too old for this torch)."""
    return pin and torch.accelerator.is_available()


@functools.lru_cache(maxsize=64)
def _unavailable(target: torch.device) -> str | None:
    """Why ``target`` cannot take tensors here, or None."""
    if target.type in ("cpu", "meta"):
        return None
    accelerator = _available_accelerator()
    if accelerator is None or accelerator.type != target.type:
        found = "no accelerator" if accelerator is None else f"only {accelerator.type!r}"
        return f"{found} is available to torch.accelerator"
    count = torch.accelerator.device_count()
    if target.index is not None and target.index >= count:
        return f"{count} {target.type} device(s) are visible: index {target.index} is out of range"
    return None


def select_device(device: DeviceLike | None = None) -> torch.device:
    """The device to put batches on, validated; an accelerator's always carries an index.

    Args:
        device: ``None`` picks the current accelerator, or the CPU when there is none;
            else a ``torch.device``, a string (``"cuda:1"``) or an accelerator index.

    Raises:
        TypeError: ``device`` is not one of the accepted types.
        ValueError: ``device`` is not a device, not available, or out of range.

    Example:
        >>> select_device("cpu")
        device(type='cpu')
    """
    accelerator = _available_accelerator()
    if device is None:
        if accelerator is None:
            return torch.device("cpu")
        return torch.device(accelerator.type, torch.accelerator.current_device_index())
    parsed = _parse_device("select_device", device)
    if parsed.type == "cpu":
        return torch.device("cpu")
    if accelerator is None or accelerator.type != parsed.type:
        found = "no accelerator" if accelerator is None else f"only {accelerator.type!r}"
        raise ValueError(
            f"select_device: device {device!r} is not available ({found} is available "
            "to torch.accelerator); pass device=None or 'cpu'."
        )
    count = torch.accelerator.device_count()
    index = torch.accelerator.current_device_index() if parsed.index is None else parsed.index
    if index >= count:
        raise ValueError(
            f"select_device: device {device!r} is out of range: {count} {parsed.type} "
            f"device(s) are visible; pass an index in [0, {count})."
        )
    return torch.device(parsed.type, index)


def default_device() -> torch.device:
    """:func:`select_device`'s pick without its index, found without starting CUDA (asking the
    index does), so the process can still fork CUDA workers or Lightning's ``ddp_fork``."""
    accelerator = _visible_accelerator()
    return torch.device("cpu") if accelerator is None else torch.device(accelerator.type)


def should_pin_memory(device: DeviceLike) -> bool:
    """Whether host batches bound for ``device`` should be pinned: only for a CUDA or XPU
    device that is there (counted without starting CUDA)."""
    target = _parse_device("should_pin_memory", device)
    if target.type not in _PINNABLE:
        return False
    accelerator = _visible_accelerator()
    return accelerator is not None and accelerator.type == target.type


def resolve_pin_memory(
    pin_memory: bool | Literal["auto"], device: DeviceLike, *, stacklevel: int = 2
) -> bool:
    """Whether to pin for ``device``: ``"auto"`` is :func:`should_pin_memory`; ``True`` where
    pinning cannot work warns (as ``DataLoader`` does, at ``stacklevel``) and returns False.

    Raises:
        TypeError: ``pin_memory`` is neither a bool nor ``"auto"``.
    """
    if isinstance(pin_memory, str) and pin_memory == "auto":
        return should_pin_memory(device)
    if not isinstance(pin_memory, bool):
        raise TypeError(
            f"resolve_pin_memory: pin_memory must be True, False or 'auto', got {pin_memory!r} "
            f"({type(pin_memory).__name__}); use 'auto' to pin only where it helps."
        )
    if not pin_memory or should_pin_memory(device):
        return pin_memory
    warnings.warn(
        f"pin_memory=True has no effect for device {str(device)!r} (no available CUDA/XPU "
        "device); pass pin_memory='auto' to silence this.",
        UserWarning,
        stacklevel=stacklevel,
    )
    return False


def non_blocking_for(
    tensor: torch.Tensor, device: DeviceLike, non_blocking: bool | None = None
) -> bool:
    """The ``non_blocking`` flag to copy ``tensor`` to ``device`` with: False to CPU or MPS;
    for ``None``, True only for a pinned CPU tensor to CUDA/XPU; else ``non_blocking``."""
    target = _parse_device("non_blocking_for", device)
    if target.type in _BLOCKING_TARGETS:
        return False
    if non_blocking is not None:
        return non_blocking
    return tensor.device.type == "cpu" and target.type in _PINNABLE and tensor.is_pinned()


_CONTINUE = object()  # a leaf function's "look inside" answer


def _rebuilt(obj: Any, items: Any) -> Any:
    """A ``type(obj)`` of ``items``: never another container type, silently."""
    try:
        return type(obj)(items)
    except TypeError as exc:
        raise TypeError(
            f"move_to_device: a {type(obj).__name__} cannot be rebuilt from its moved items "
            f"({exc}); return a dict, list, tuple or dataclass from collate_fn."
        ) from exc


def _apply(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``obj`` rebuilt with ``leaf`` applied, recursing into containers on ``_CONTINUE``."""
    result = leaf(obj)
    if result is not _CONTINUE:
        return result
    if isinstance(obj, Mapping):
        items = {key: _apply(value, leaf) for key, value in obj.items()}
        if type(obj) is dict:
            return items
        if isinstance(obj, dict | UserDict):  # copies own their storage
            try:
                clone = copy.copy(obj)  # keeps defaultdict factories, subclass attributes
                for key, value in items.items():  # not update(): a Counter's adds
                    clone[key] = value
                return clone
            except TypeError:
                pass  # a frozen mapping: built anew
        kept = all(items[key] is value for key, value in obj.items())
        return obj if kept else _rebuilt(obj, items)
    if isinstance(obj, UserList) or (isinstance(obj, list) and type(obj) is not list):
        moved = copy.copy(obj)  # keeps subclass attributes; the copy owns its items
        moved[:] = [_apply(value, leaf) for value in obj]
        return moved
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_apply(value, leaf) for value in obj))
    if isinstance(obj, (list, tuple)):
        values = [_apply(value, leaf) for value in obj]
        try:
            return type(obj)(values)
        except TypeError:
            return values if isinstance(obj, list) else tuple(values)
    if isinstance(obj, deque):
        return type(obj)((_apply(value, leaf) for value in obj), maxlen=obj.maxlen)
    if isinstance(obj, Sequence) and not isinstance(obj, str | bytes | bytearray | range):
        values = [_apply(value, leaf) for value in obj]
        kept = all(new is old for new, old in zip(values, obj, strict=True))
        return obj if kept else _rebuilt(obj, values)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # Not replace(): works for frozen and init=False fields, skips __post_init__.
        new = copy.copy(obj)
        for field in dataclasses.fields(obj):
            if hasattr(obj, field.name):  # an init=False field may be unset
                object.__setattr__(new, field.name, _apply(getattr(obj, field.name), leaf))
        return new
    return obj


def _has_method(obj: Any, name: str) -> bool:
    return not isinstance(obj, type) and callable(getattr(obj, name, None))


def _accepts_non_blocking(method: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return "non_blocking" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


def move_to_device(batch: Batch, device: DeviceLike, non_blocking: bool | None = None) -> Batch:
    """A copy of ``batch`` with every tensor, and every object with a ``.to()``, on ``device``.

    Recurses through mappings, lists, tuples, namedtuples and dataclasses; other
    leaves are left alone.

    Args:
        batch: The batch.
        device: Target device.
        non_blocking: ``None`` decides per tensor with :func:`non_blocking_for`; a custom
            ``.to()`` gets ``non_blocking=True`` only where safe and accepted.

    Example:
        >>> move_to_device({"x": torch.ones(2), "n": 3}, "cpu")
        {'x': tensor([1., 1.]), 'n': 3}
    """
    target = _parse_device("move_to_device", device)
    why = _unavailable(target)
    if why is not None:
        raise ValueError(
            f"move_to_device: device {str(target)!r} is not available ({why}); pass an available "
            "device (select_device() picks the current accelerator, or 'cpu')."
        )
    if non_blocking is not None and not isinstance(non_blocking, bool):
        raise TypeError(
            f"move_to_device: non_blocking must be None, True or False, got {non_blocking!r}; "
            "use None to let loaderkit decide per tensor."
        )

    safe = non_blocking and target.type not in _BLOCKING_TARGETS

    def leaf(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj.to(target, non_blocking=non_blocking_for(obj, target, non_blocking))
        if _has_method(obj, "to"):
            if safe and _accepts_non_blocking(obj.to):
                return obj.to(target, non_blocking=True)
            return obj.to(target)
        return _CONTINUE

    return _apply(batch, leaf)


def pin_batch(batch: Batch) -> Batch:
    """``batch`` with every CPU tensor (and object with a ``.pin_memory()``) pinned.

    Raises:
        ValueError: no CUDA or XPU device is available (see :func:`should_pin_memory`).
    """
    accelerator = _available_accelerator()
    if accelerator is None or accelerator.type not in _PINNABLE:
        found = "no accelerator" if accelerator is None else f"only {accelerator.type!r}"
        raise ValueError(
            f"pin_batch: pinned memory needs a CUDA or XPU device, and {found} is available "
            "to torch.accelerator; pass pin_memory=False or 'auto'."
        )

    def leaf(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj.pin_memory() if obj.device.type == "cpu" and not obj.is_pinned() else obj
        if _has_method(obj, "pin_memory"):
            return obj.pin_memory()
        return _CONTINUE

    return _apply(batch, leaf)


def _record_stream(batch: Batch, stream: torch.cuda.Stream) -> None:
    def leaf(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if obj.device.type == "cuda":
                obj.record_stream(stream)
            return obj
        if _has_method(obj, "record_stream"):
            obj.record_stream(stream)
            return obj
        return _CONTINUE

    _apply(batch, leaf)


_END = object()


class _Failed:
    """An exception the wrapped iterator raised, in its batch's place."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _next_or_failure(iterator: Iterator[Any]) -> Any:
    """The next batch, ``_END``, or the ``_Failed`` of an exception raised in its place."""
    try:
        return next(iterator)
    except StopIteration:
        return _END
    except Exception as error:
        return _Failed(error)


class _Raising(Iterator[Batch]):
    # Raises each _Failed in its batch's place: a raising generator would end the epoch.

    def __init__(self, batches: Iterator[Any]) -> None:
        self._batches = batches

    def __next__(self) -> Batch:
        item = next(self._batches)
        if isinstance(item, _Failed):
            error = item.error
            del item
            try:
                raise error
            finally:
                del error
        return item

    def close(self) -> None:
        """Stop the iteration and the look-ahead now."""
        close = getattr(self._batches, "close", None)
        if callable(close):
            close()


class _Held:
    """A loader's state as of each of the last batches handed to the consumer, newest last
    (empty: ask the loader). A host holding batches untrained (Lightning's fetcher, without
    a length) takes an older one."""

    def __init__(self) -> None:
        self.states: deque[dict[str, Any]] = deque(maxlen=4)

    def held_state(self, back: int = 0) -> dict[str, Any] | None:
        """The state ``back`` batches before the last one handed over, or None."""
        if not self.states:
            return None
        if back >= len(self.states):
            raise LoaderkitError(
                f"DevicePrefetcher: the consumer holds {back} batches untrained but only "
                f"{len(self.states) - 1} are remembered; save the state while it holds fewer."
            )
        return self.states[-1 - back]

    def drop(self) -> None:
        self.states.clear()


class DevicePrefetcher:
    """Iterate ``iterable`` with every batch already on ``device``.

    On CUDA, batch ``n + 1`` is pinned and copied on a side stream while the consumer
    computes on batch ``n``; on the CPU batches pass through; elsewhere they are moved
    synchronously. An exception the iterable raises for a batch is raised in its place and
    iteration goes on (a failed copy ends it). :meth:`state_dict` (and a wrapped
    ``ResumableDataLoader``'s) stays exact.

    Args:
        iterable: Anything iterable yielding batches, typically a DataLoader.
        device: Target device; ``None`` picks it with :func:`select_device`.
        pin_memory: ``"auto"`` (pin only where it helps), True or False; see
            :func:`resolve_pin_memory`.

    Example:
        >>> batches = [torch.ones(2), torch.zeros(2)]
        >>> [b.sum().item() for b in DevicePrefetcher(batches, "cpu")]
        [2.0, 0.0]
    """

    def __init__(
        self,
        iterable: Iterable[Batch],
        device: DeviceLike | None = None,
        *,
        pin_memory: bool | Literal["auto"] = "auto",
    ) -> None:
        if not isinstance(iterable, Iterable):
            raise TypeError(
                f"DevicePrefetcher: iterable must be iterable, got {type(iterable).__name__}; "
                "pass a DataLoader (or any iterable of batches)."
            )
        self.iterable = iterable
        self.device = select_device(device)
        self.pin_memory = resolve_pin_memory(pin_memory, self.device, stacklevel=3)
        # The state as of the last batch handed over: the loader keeps the holder, so a loop
        # that stopped early (a break, an exception) still saves what it consumed.
        self._holder = _Held()

    @property
    def sampler(self) -> Any:
        """The wrapped loader's ``sampler``: Lightning sets the epoch through it."""
        return getattr(self.iterable, "sampler", None)

    @property
    def batch_sampler(self) -> Any:
        """The wrapped loader's ``batch_sampler``."""
        return getattr(self.iterable, "batch_sampler", None)

    def held_state(self) -> dict[str, Any] | None:
        """The wrapped iterable's state as of the last batch handed over (not the batch
        ahead), or None."""
        return self._holder.held_state()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped iterable's state as of the last batch handed over, less the batches its
        host holds untrained for a loaderkit loader (TypeError if it has none)."""
        held = self._holder.held_state()
        if held is not None and not callable(getattr(self.iterable, "_register_lookahead", None)):
            return held  # a loaderkit loader answers itself (less what its host holds)
        return dict(self._stateful("state_dict").state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the wrapped iterable at ``state_dict`` (from :meth:`state_dict`)."""
        self._stateful("load_state_dict").load_state_dict(state_dict)
        self._holder.drop()

    def _stateful(self, method: str) -> Any:
        if not callable(getattr(self.iterable, method, None)):
            raise TypeError(
                f"DevicePrefetcher.{method}: the wrapped {type(self.iterable).__name__} has no "
                f"{method}(); wrap a stateful loader (e.g. loaderkit.ResumableDataLoader) to "
                "save and resume its position."
            )
        return self.iterable

    def __len__(self) -> int:
        if not isinstance(self.iterable, Sized):
            raise TypeError(
                f"DevicePrefetcher: the wrapped {type(self.iterable).__name__} has no length; "
                "iterate it without len(), or wrap a loader that has one."
            )
        return len(self.iterable)

    def __iter__(self) -> Iterator[Batch]:
        if self.device.type == "cpu":
            return iter(self.iterable)
        if self.device.type == "cuda":
            return _Raising(self._cuda_batches())
        return _Raising(self._moved_batches())

    def __repr__(self) -> str:
        return (
            f"DevicePrefetcher({type(self.iterable).__name__}, device={str(self.device)!r}, "
            f"pin_memory={self.pin_memory})"
        )

    def _moved_batches(self) -> Iterator[Any]:
        iterator = iter(self.iterable)
        while (batch := _next_or_failure(iterator)) is not _END:
            if not isinstance(batch, _Failed):
                batch = move_to_device(pin_batch(batch) if self.pin_memory else batch, self.device)
            yield batch

    def _cuda_batches(self) -> Iterator[Any]:
        side = torch.cuda.Stream(device=self.device)
        iterator = iter(self.iterable)
        stateful = callable(getattr(self.iterable, "state_dict", None))
        register = getattr(self.iterable, "_register_lookahead", None)
        self._holder.drop()
        if callable(register):
            register(self._holder)  # the loader's state_dict() answers with held_state()
        if stateful:  # the start, should the first copy fail
            self._holder.states.append(self._own_state())
        upcoming = self._copy_next(iterator, side)
        while upcoming is not _END:
            if isinstance(upcoming, _Failed):
                # No look-ahead until the consumer asks again, as without the prefetcher.
                self._holder.drop()
                yield upcoming
                upcoming = self._copy_next(iterator, side)
                continue
            consumer = torch.cuda.current_stream(self.device)
            consumer.wait_stream(side)
            _record_stream(upcoming, consumer)
            batch = upcoming
            state = self._own_state() if stateful else None  # once `batch` is consumed
            upcoming = self._copy_next(iterator, side)  # overlaps the consumer's work
            if state is not None:
                self._holder.states.append(state)
            yield batch
        # Kept while the consumer stops early (a break, an exception): the look-ahead is
        # not its; once the iterable ran out, its own state is.
        self._holder.drop()

    def _own_state(self) -> dict[str, Any]:
        """The wrapped iterable's own state: a registering loader answers with the holder's
        while it holds one, so the holder is emptied for the call."""
        held = list(self._holder.states)
        self._holder.drop()
        try:
            state = self.iterable.state_dict()  # type: ignore[attr-defined]
            if callable(getattr(self.iterable, "_register_lookahead", None)):
                return dict(state)  # loaderkit's: a new dict whose parts are never changed
            # Another loader's (torchdata's) may hold its dataset's live objects, which the
            # look-ahead moves on.
            return copy.deepcopy(state)
        finally:
            self._holder.states.extend(held)

    def _copy_next(self, iterator: Iterator[Batch], side: torch.cuda.Stream) -> Any:
        batch = _next_or_failure(iterator)
        if batch is _END or isinstance(batch, _Failed):
            return batch
        if self.pin_memory:
            batch = pin_batch(batch)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            return move_to_device(batch, self.device)
