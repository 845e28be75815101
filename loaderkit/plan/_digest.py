"""The checksum of one state field (private): its value as canonical JSON, so an edit, or a
round trip that changes a value's type (JSON's string keys), is refused by field.

Example:
    >>> field_digest("k", {0: 1}) == field_digest("k", {"0": 1})  # JSON made the key a str
    False
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import numpy as np
import torch


def field_digest(name: str, value: Any, *, legacy: bool = False) -> int:
    """CRC-32 of one state field keyed by its name; nested values as canonical JSON (JSON's
    own values as JSON writes them; ``legacy``: the others by ``repr``, as before 0.2)."""
    if type(value) is int:
        return zlib.crc32(b"%s=%d" % (name.encode(), value))
    try:
        shown = value if legacy else _canonical(value, ())
    except RecursionError:  # not a cycle (those are named), but too deep for Python
        shown = "<too deep>"
    text = json.dumps(shown, sort_keys=True, separators=(",", ":"), default=repr)
    return zlib.crc32(f"{name}={text}".encode())


def _canonical(value: Any, path: tuple[int, ...]) -> Any:
    """``value`` as JSON whose text follows its value, never an object's address: a dataset's
    own state may hold int or tuple keys (JSON would make them strings), sets, bytes,
    tensors, arrays or generators. ``path``: the ids of the values holding it."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {f"<{type(value).__name__}>": zlib.crc32(bytes(value))}
    if isinstance(value, torch.Tensor | np.ndarray | np.generic):
        return _array_form(value, path)
    if id(value) in path:  # a cycle (a tree's parent links): which holder it points back to
        return {"<ref>": len(path) - path.index(id(value))}
    inner = (*path, id(value))
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _canonical(v, inner) for k, v in value.items()}
        pairs = [[_canonical(k, inner), _canonical(v, inner)] for k, v in value.items()]
        return {"<dict>": sorted(pairs, key=_text)}
    if isinstance(value, list | tuple):
        return [_canonical(v, inner) for v in value]
    if isinstance(value, set | frozenset):
        return {"<set>": sorted((_canonical(v, inner) for v in value), key=_text)}
    name = f"<{type(value).__module__}.{type(value).__qualname__}>"
    if isinstance(value, type):
        return f"<{value.__module__}.{value.__qualname__}>"
    try:  # as pickle takes it apart, without its bytes (a tensor's hold addresses)
        parts = value.__reduce_ex__(4)
    except Exception:
        return name
    if isinstance(parts, str):  # a global: a function, an enum member
        return f"{name}{parts}"
    maker = getattr(parts[0], "__qualname__", type(parts[0]).__qualname__)
    items = [list(p) if p is not None and not isinstance(p, list) else p for p in parts[3:5]]
    return {name: [maker, _canonical([*parts[1:3], *items], inner)]}


def _array_form(value: torch.Tensor | np.ndarray | np.generic, path: tuple[int, ...]) -> Any:
    """A tensor's, array's or numpy scalar's dtype, shape and a CRC-32 of its bytes."""
    try:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous().reshape(-1)
            data = t.view(torch.uint8).numpy().tobytes()
            dtype = str(value.dtype)
        elif value.dtype.hasobject:  # its bytes are addresses
            items = _canonical(np.asarray(value).tolist(), path)
            return {"<array>": [value.dtype.str, list(value.shape), items]}
        else:
            data, dtype = np.ascontiguousarray(value).tobytes(), value.dtype.str
    except (RuntimeError, TypeError, ValueError):  # sparse, meta
        return f"<{type(value).__qualname__}>"
    return {"<array>": [dtype, list(value.shape), zlib.crc32(data)]}


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def legacy_digest(name: str, value: Any) -> int | None:
    """``field_digest`` as states saved before 0.2 hold it (None where it cannot be made)."""
    try:
        return field_digest(name, value, legacy=True)
    except (TypeError, ValueError):
        return None
