"""Argument checks shared by every public entry point (private): ``owner``, the parameter,
the rule, the value received and the fix; ``TypeError`` for a kind, ``ValueError`` for a range."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np


def _head(owner: str) -> str:
    return f"{owner}: " if owner else ""


def check_int(
    name: str,
    value: object,
    minimum: int | None = 0,
    *,
    owner: str = "",
    fix: str = "",
    numpy_ok: bool = False,
    limit: int | None = None,
) -> int:
    """``value`` as a plain int in ``[minimum, limit)`` (None: unbounded; ``limit`` a power of
    two); ``owner`` prefixes the message, ``fix`` ends it; ``numpy_ok`` takes numpy ints."""
    if not fix:
        fix = f"pass an int >= {minimum}" if minimum is not None else "pass an int"
    head, tail = _head(owner), f"; {fix}"
    kinds = (int, np.integer) if numpy_ok else int
    if not isinstance(value, kinds) or isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"{head}{name} must be an int, got {value!r} ({type(value).__name__}){tail}."
        )
    if minimum is not None and value < minimum:
        raise ValueError(f"{head}{name} must be >= {minimum}, got {value}{tail}.")
    if limit is not None and value >= limit:
        bound = f"2**{limit.bit_length() - 1}"
        raise ValueError(
            f"{head}{name} must be < {bound}, got {value}; pass a value in "
            f"[{minimum if minimum is not None else '-inf'}, {bound})."
        )
    return int(value)


def check_rank(
    rank: object, world_size: int, *, owner: str = "", fix: str = "", numpy_ok: bool = False
) -> int:
    """``rank`` as an int in ``[0, world_size)``; ``fix`` as :func:`check_int`'s."""
    value = check_int("rank", rank, 0, owner=owner, fix=fix, numpy_ok=numpy_ok)
    if value >= world_size:
        raise ValueError(
            f"{_head(owner)}rank must be < world_size={world_size}, got {value}; pass a rank "
            f"in [0, {world_size})."
        )
    return value


def check_bool(name: str, value: object, *, owner: str = "") -> bool:
    """``value`` if it is a bool."""
    if not isinstance(value, bool):
        raise TypeError(
            f"{_head(owner)}{name} must be a bool, got {value!r} ({type(value).__name__}); "
            f"pass {name}=True or {name}=False."
        )
    return value


def check_choice(name: str, value: object, choices: Sequence[object], *, owner: str = "") -> Any:
    """``value`` if it is one of ``choices``."""
    if isinstance(value, bool) or value not in choices:
        raise ValueError(
            f"{_head(owner)}{name} must be one of {', '.join(map(repr, choices))}, "
            f"got {value!r}; pass one of these."
        )
    return value


def check_fraction(name: str, value: object, *, owner: str = "") -> float:
    """``value`` as a float in ``[0, 1)``."""
    head = _head(owner)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(
            f"{head}{name} must be a float in [0, 1), got {value!r} "
            f"({type(value).__name__}); pass e.g. {name}=0.1."
        )
    if not 0.0 <= value < 1.0:
        raise ValueError(
            f"{head}{name} must be in [0, 1), got {value}; pass e.g. {name}=0.1 to hold "
            "out 10% of the training samples, or 0 for none."
        )
    return float(value)


def check_path(name: str, value: object, suffixes: Sequence[str], *, owner: str = "") -> str:
    """``value`` as the path of an existing file with one of ``suffixes``."""
    head = _head(owner)
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"{head}{name} must be a path (str), got {type(value).__name__}; pass the path "
            f"of a {'/'.join(suffixes)} file."
        )
    path = os.fspath(value)
    if not path.endswith(tuple(suffixes)):
        raise ValueError(
            f"{head}{name}={path!r} must end with {' or '.join(suffixes)}; convert the data "
            "to one of these formats."
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{head}{name}={path!r} does not exist; check the path.")
    return path


def check_suffixes(name: str, value: object, *, owner: str) -> tuple[str, ...]:
    """``value`` as a tuple of file suffixes, each a str starting with ``"."``."""
    items: tuple[Any, ...] | None
    try:
        items = None if isinstance(value, str | bytes) else tuple(value)  # type: ignore[arg-type]
    except TypeError:
        items = None
    if items is None or not all(isinstance(s, str) and s.startswith(".") for s in items):
        raise TypeError(
            f"{owner}: {name} must be a list of suffixes each starting with '.', got "
            f"{value!r}; pass e.g. {name}=('.jsonl.gz',)."
        )
    return items


def check_index_path(value: object, *, owner: str) -> None:
    """``value`` (a shard ``index=`` argument) is None, a str or an ``os.PathLike``."""
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"{owner}: index must be a path or URL of the shard index file, got {value!r} "
            f"({type(value).__name__}); pass e.g. index='shards/index.json', or leave it out."
        )
    if value is not None and os.path.isdir(value):
        raise ValueError(
            f"{owner}: index={str(value)!r} is a directory, not the index file; pass e.g. "
            "index='shards/index.json', or leave it out."
        )


def reads_overridden(dataset: Any, batched: str) -> bool:
    """Whether ``dataset``'s class overrides ``__getitem__`` or ``__getitems__`` (what the
    loader reads) below the one defining ``batched``."""
    return getitem_overridden(dataset, batched, also=("__getitems__",))


def getitem_overridden(dataset: Any, batched: str, also: tuple[str, ...] = ()) -> bool:
    """Whether ``dataset``'s class overrides ``__getitem__`` (or a method in ``also``) below
    the one defining ``batched`` (the nearer of the two decides)."""
    for cls in type(dataset).__mro__:
        if batched in vars(cls):
            return False
        if any(name in vars(cls) for name in ("__getitem__", *also)):
            return True
    return False
