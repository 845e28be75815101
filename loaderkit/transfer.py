"""Moving batches to the accelerator, the fast way and only where it helps.

- :func:`select_device` picks the accelerator through :mod:`torch.accelerator`
  (CPU when there is none) and validates a user's choice.
- :func:`should_pin_memory` / :func:`resolve_pin_memory`: page-locked host
  memory only pays off (and only works) for copies to CUDA or XPU.
- :func:`non_blocking_for`: ``non_blocking`` is used where it is both useful
  and safe (see there).
- :func:`move_to_device` / :func:`pin_batch` walk dicts, lists, tuples,
  namedtuples and dataclasses, and defer to a custom batch type's own
  ``.to()`` / ``.pin_memory()``.
- :class:`DevicePrefetcher` copies batch ``n + 1`` on a side CUDA stream while
  the model computes on batch ``n``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sized
from typing import Any, Literal, TypeAlias

import torch

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

# Device types whose copies from page-locked host memory run asynchronously
# (and for which torch can pin memory). MPS is deliberately absent: torch
# refuses to pin for it, as does DataLoader(pin_memory=True).
_PINNABLE = frozenset({"cuda", "xpu"})
# Targets for which non_blocking is never used: a device-to-host copy with
# non_blocking returns before the data is there, and MPS copies with
# non_blocking have been unreliable (Lightning blocks them too).
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


@functools.lru_cache(maxsize=64)
def _unavailable(target: torch.device) -> str | None:
    """Why ``target`` cannot take tensors here, or None (cached: called per batch)."""
    if target.type in ("cpu", "meta"):
        return None
    accelerator = _available_accelerator()
    if accelerator is None or accelerator.type != target.type:
        found = "no accelerator" if accelerator is None else f"only {accelerator.type!r}"
        return f"{found} is available to torch.accelerator"
    count = torch.accelerator.device_count()
    if target.index is not None and target.index >= count:
        return (
            f"{count} {target.type} device(s) are visible, so index {target.index} is out of range"
        )
    return None


def _check_available(func: str, target: torch.device) -> None:
    why = _unavailable(target)
    if why is not None:
        raise ValueError(
            f"{func}: device {str(target)!r} is not available ({why}); pass an available "
            "device (select_device() picks the current accelerator, or 'cpu')."
        )


def select_device(device: DeviceLike | None = None) -> torch.device:
    """Return the device to put batches on, validated.

    Args:
        device: ``None`` picks the current accelerator (``torch.accelerator``),
            or the CPU when none is available. Otherwise a ``torch.device``,
            a string (``"cpu"``, ``"cuda"``, ``"cuda:1"``) or an int index on
            the current accelerator.

    Returns:
        A ``torch.device``; for an accelerator it always carries an index
        (``"cuda"`` becomes ``cuda:<current index>``).

    Raises:
        TypeError: ``device`` is not one of the accepted types.
        ValueError: the string is not a device, the device type is not the
            available accelerator, or the index is out of range.

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
            "to torch.accelerator); pass device=None to use the available accelerator, "
            "or 'cpu'."
        )
    count = torch.accelerator.device_count()
    index = torch.accelerator.current_device_index() if parsed.index is None else parsed.index
    if index >= count:
        raise ValueError(
            f"select_device: device {device!r} is out of range: {count} {parsed.type} "
            f"device(s) are visible; pass an index in [0, {count})."
        )
    return torch.device(parsed.type, index)


def should_pin_memory(device: DeviceLike) -> bool:
    """Whether host batches bound for ``device`` should be pinned.

    True only when ``device`` is CUDA or XPU and that accelerator is available:
    pinned memory makes host-to-device copies faster and lets them run
    asynchronously. Never for CPU (nothing to copy) or MPS (unsupported).
    """
    target = _parse_device("should_pin_memory", device)
    if target.type not in _PINNABLE:
        return False
    accelerator = _available_accelerator()
    return accelerator is not None and accelerator.type == target.type


def resolve_pin_memory(
    pin_memory: bool | Literal["auto"], device: DeviceLike, *, stacklevel: int = 2
) -> bool:
    """Turn a loader's ``pin_memory`` argument into a decision for ``device``.

    ``"auto"`` is :func:`should_pin_memory`. ``False`` is always honoured.
    ``True`` where pinning cannot help or cannot work (CPU or MPS target, no
    accelerator) warns and returns False: this mirrors
    ``torch.utils.data.DataLoader``, which warns and skips pinning when no
    accelerator is found or the accelerator is MPS, so code written for a GPU
    machine still runs on a laptop. ``stacklevel`` says whose line the warning
    names, as for :func:`warnings.warn` (2: the caller of this function).

    Raises:
        TypeError: ``pin_memory`` is neither a bool nor ``"auto"``.
    """
    if isinstance(pin_memory, str) and pin_memory == "auto":
        return should_pin_memory(device)
    if not isinstance(pin_memory, bool):
        raise TypeError(
            f"resolve_pin_memory: pin_memory must be True, False or 'auto', got "
            f"{pin_memory!r} ({type(pin_memory).__name__}); use 'auto' to pin only "
            "where it helps."
        )
    if not pin_memory:
        return False
    if should_pin_memory(device):
        return True
    warnings.warn(
        f"pin_memory=True has no effect for device {str(device)!r}: pinning only helps "
        "copies to an available CUDA/XPU device; continuing without pinning. "
        "Pass pin_memory='auto' to silence this.",
        UserWarning,
        stacklevel=stacklevel,
    )
    return False


def non_blocking_for(
    tensor: torch.Tensor, device: DeviceLike, non_blocking: bool | None = None
) -> bool:
    """The ``non_blocking`` flag to copy ``tensor`` to ``device`` with.

    - Target CPU or MPS: always False. A device-to-host copy with
      ``non_blocking=True`` returns before the data has arrived, so reading the
      result without a synchronisation is a race; MPS is excluded as in
      Lightning.
    - ``non_blocking=None`` (auto): True only for a pinned CPU tensor going to
      CUDA/XPU. From pageable memory the copy is staged synchronously anyway,
      so the flag buys nothing.
    - An explicit True/False is honoured for every other target (host-to-device
      and device-to-device copies are stream-ordered, so True is safe there).
    """
    target = _parse_device("non_blocking_for", device)
    if target.type in _BLOCKING_TARGETS:
        return False
    if non_blocking is not None:
        return non_blocking
    return tensor.device.type == "cpu" and target.type in _PINNABLE and tensor.is_pinned()


_CONTINUE = object()  # a leaf function's "not a leaf: look inside" answer


def _apply(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """Rebuild ``obj`` with ``leaf`` applied to its leaves.

    ``leaf`` returns the replacement of a leaf, or ``_CONTINUE`` to recurse into
    mappings (type kept where it can be rebuilt), namedtuples, lists, tuples and
    dataclass instances; anything else is returned unchanged.
    """
    result = leaf(obj)
    if result is not _CONTINUE:
        return result
    if isinstance(obj, Mapping):
        items = {key: _apply(value, leaf) for key, value in obj.items()}
        if type(obj) is dict:
            return items
        try:
            if isinstance(obj, MutableMapping):
                clone = copy.copy(obj)  # keeps defaultdict factories, subclass attributes
                clone.update(items)
                return clone
            return type(obj)(items)  # type: ignore[call-arg]
        except TypeError:
            return items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_apply(value, leaf) for value in obj))
    if isinstance(obj, (list, tuple)):
        values = [_apply(value, leaf) for value in obj]
        try:
            return type(obj)(values)
        except TypeError:
            return values if isinstance(obj, list) else tuple(values)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # copy + setattr (not replace()): works for frozen dataclasses and
        # init=False fields, and does not re-run __post_init__.
        new = copy.copy(obj)
        for field in dataclasses.fields(obj):
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
    """Move every tensor of ``batch`` to ``device``.

    Recurses through mappings, lists, tuples, namedtuples and dataclasses
    (rebuilding them, the input is not modified); an object with a ``.to()``
    method (a custom batch type, checked before recursing) is moved with its
    own ``.to(device)``. Other leaves (ints, strings, numpy arrays) are left
    alone.

    Args:
        batch: The batch.
        device: Target device (not validated for availability: see
            :func:`select_device`).
        non_blocking: ``None`` decides per tensor with :func:`non_blocking_for`
            (async only for pinned host tensors to CUDA/XPU). An explicit value
            is honoured where safe; custom ``.to()`` methods receive it only if
            it is True, safe, and their signature accepts ``non_blocking``.

    Example:
        >>> move_to_device({"x": torch.ones(2), "n": 3}, "cpu")
        {'x': tensor([1., 1.]), 'n': 3}
    """
    target = _parse_device("move_to_device", device)
    _check_available("move_to_device", target)
    if non_blocking is not None and not isinstance(non_blocking, bool):
        raise TypeError(
            f"move_to_device: non_blocking must be None, True or False, got {non_blocking!r}; "
            "use None to let loaderkit decide per tensor."
        )

    def leaf(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj.to(target, non_blocking=non_blocking_for(obj, target, non_blocking))
        if _has_method(obj, "to"):
            if (
                non_blocking
                and target.type not in _BLOCKING_TARGETS
                and _accepts_non_blocking(obj.to)
            ):
                return obj.to(target, non_blocking=True)
            return obj.to(target)
        return _CONTINUE

    return _apply(batch, leaf)


def pin_batch(batch: Batch) -> Batch:
    """Return ``batch`` with every CPU tensor in page-locked (pinned) memory.

    Recurses like :func:`move_to_device`; tensors already pinned or not on the
    CPU are kept as they are, and custom types with a ``.pin_memory()`` method
    are pinned by it. Needs an accelerator that supports pinning: without one
    it raises a ``ValueError`` saying so; guard with :func:`should_pin_memory`.
    """
    accelerator = _available_accelerator()
    if accelerator is None or accelerator.type not in _PINNABLE:
        found = "no accelerator" if accelerator is None else f"only {accelerator.type!r}"
        raise ValueError(
            f"pin_batch: pinned memory needs a CUDA or XPU device, and {found} is available "
            "to torch.accelerator; pass pin_memory=False (or 'auto', which pins only where "
            "it helps), or call pin_batch only when should_pin_memory(device) is True."
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
    """A batch the wrapped iterator raised for, in its place (the epoch goes on)."""

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
    """Iterates a prefetching generator, raising each ``_Failed`` where its batch would be:
    a generator that raised itself would end the epoch, where ``DataLoader`` goes on."""

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
        """Stop the iteration (and the wrapped iterator's look-ahead) now."""
        close = getattr(self._batches, "close", None)
        if callable(close):
            close()


class DevicePrefetcher:
    """Iterate ``iterable`` with every batch already on ``device``.

    On CUDA, batch ``n + 1`` is pinned (if it is not already: prefer the
    loader's own ``pin_memory``, which pins in a background thread) and copied
    on a side stream while the consumer computes on batch ``n``. Before a
    batch is handed over, the consumer's current stream waits for the copy,
    and each of its tensors is ``record_stream``-ed on the consumer's stream
    so the caching allocator does not reuse the memory while kernels still
    read it. The side stream also waits for the consumer's stream before each
    copy, which orders copies after kernels still reading memory the consumer
    released, including tensors hidden inside custom batch types.

    On a CPU target it is a transparent pass-through (the batches themselves);
    on other devices (MPS, XPU, ...) batches are moved synchronously with
    :func:`move_to_device`.

    Each ``iter()`` starts over from a fresh ``iter(iterable)``; ``len()``
    is the iterable's length when it has one. An exception the iterable raises
    for a batch is raised in that batch's place, and the next ``next()`` goes on
    with the following batch, as with the iterable alone.

    On CUDA the wrapped iterator is one batch ahead of what the consumer has
    seen, so its own state would resume one batch late (a batch skipped).
    When the iterable is stateful (``state_dict()``), the prefetcher takes a
    snapshot of that state before each look-ahead; :meth:`state_dict` returns
    it, and a :class:`~loaderkit.ResumableDataLoader` returns it from its own
    ``state_dict()`` while the prefetcher holds a batch, so saving either is
    exact.

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
        # The iterable's state as of the last batch handed over, while one is held ahead.
        self._held: dict[str, Any] | None = None

    def held_state(self) -> dict[str, Any] | None:
        """The wrapped iterable's state as the consumer has seen it, while a batch is held."""
        return self._held

    def state_dict(self) -> dict[str, Any]:
        """The wrapped iterable's state as of the last batch handed over.

        Raises:
            TypeError: the iterable has no ``state_dict()``.
        """
        if self._held is not None:
            return self._held
        return dict(self._stateful("state_dict").state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the wrapped iterable at ``state_dict`` (from :meth:`state_dict`)."""
        self._stateful("load_state_dict").load_state_dict(state_dict)
        self._held = None

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
            if isinstance(batch, _Failed):
                yield batch
                continue
            yield move_to_device(pin_batch(batch) if self.pin_memory else batch, self.device)

    def _cuda_batches(self) -> Iterator[Any]:
        side = torch.cuda.Stream(device=self.device)
        iterator = iter(self.iterable)
        stateful = callable(getattr(self.iterable, "state_dict", None))
        register = getattr(self.iterable, "_register_lookahead", None)
        if callable(register):
            register(self)  # the loader's own state_dict() answers with held_state()
        self._held = None
        try:
            upcoming = self._copy_next(iterator, side)
            while upcoming is not _END:
                if isinstance(upcoming, _Failed):
                    # The iterable's own state is the one after the failed batch: no
                    # look-ahead runs until the consumer asks again, as a loop without
                    # the prefetcher would.
                    self._held = None
                    yield upcoming
                    upcoming = self._copy_next(iterator, side)
                    continue
                consumer = torch.cuda.current_stream(self.device)
                consumer.wait_stream(side)
                _record_stream(upcoming, consumer)
                batch = upcoming
                if stateful:  # the state once `batch` is consumed, before the look-ahead
                    self._held = None
                    self._held = dict(self.iterable.state_dict())  # type: ignore[attr-defined]
                upcoming = self._copy_next(iterator, side)  # overlaps the consumer's work
                yield batch
        finally:
            self._held = None

    def _copy_next(self, iterator: Iterator[Batch], side: torch.cuda.Stream) -> Any:
        batch = _next_or_failure(iterator)
        if batch is _END or isinstance(batch, _Failed):
            return batch
        if self.pin_memory:
            batch = pin_batch(batch)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            return move_to_device(batch, self.device)
