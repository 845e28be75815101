"""Digests of a user's function for caches keyed by it (private): the code it runs (with the
helpers it calls), and by pickle a ``partial``'s arguments or a callable's state."""

from __future__ import annotations

import dis
import functools
import hashlib
import importlib.util
import inspect
import io
import os
import pickle
import sys
import sysconfig
import types
import zlib
from typing import Any

import numpy as np
import torch

# Code installed here (the standard library, packages) changes with an upgrade, not an edit.
_INSTALLED = tuple(
    {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)
_PACKAGES = tuple(f"{os.sep}{d}{os.sep}" for d in ("site-packages", "dist-packages"))
# loaderkit's own code, installed editable or not: a library's, as the packages' is.
_LOADERKIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_PLAIN = (int, float, complex, str, bytes, type(None))
_C_MEMBERS = (
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
    types.WrapperDescriptorType,
    types.BuiltinFunctionType,
)
# What functools.update_wrapper copies onto a wrapper: the wrapped function's, no setting.
_WRAPPER_FIELDS = frozenset(
    {*functools.WRAPPER_ASSIGNMENTS, *functools.WRAPPER_UPDATES, "__wrapped__"}
)


def code_digest(fn: Any) -> str | None:
    """A digest of ``fn``'s code and, recursively, of the user code and values it reads
    (globals, closure, defaults); None when ``fn`` runs no Python code. A value that does
    not pickle makes it a digest of this call only; installed packages are not seen.

    Example:
        >>> code_digest(lambda s: len(s["a"])) != code_digest(lambda s: len(s["b"]))
        True
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    digest = hashlib.sha256()
    seen: set[int] = set()
    try:
        fn = _unwrapped(fn, digest, seen)
        if isinstance(fn, types.MethodType):  # its class's code: a helper method it calls
            owner = fn.__self__
            _class(digest, owner if isinstance(owner, type) else type(owner), seen)
            fn = _unwrapped(fn.__func__, digest, seen)
        elif not isinstance(fn, types.FunctionType):  # a callable object: its class's code
            _class(digest, type(fn), seen)  # (self.helper() in __call__), then __call__
            fn = _unwrapped(inspect.getattr_static(type(fn), "__call__", None), digest, seen)
            if isinstance(fn, staticmethod | classmethod):
                fn = fn.__func__
        if not isinstance(fn, types.FunctionType):
            return None
        _function(digest, fn, seen)
    except _Unseen:
        return os.urandom(8).hex()
    return digest.hexdigest()[:16]


def class_digest(cls: type) -> str | None:
    """A digest of the methods' code and class attributes of ``cls`` and its bases in user
    code; None when an attribute does not pickle.

    Example:
        >>> A = type("A", (), {"scale": 10, "__module__": "notebook"})
        >>> B = type("A", (), {"scale": 1000, "__module__": "notebook"})
        >>> class_digest(A) != class_digest(B)
        True
    """
    digest = hashlib.sha256()
    try:
        _class(digest, cls, set())
    except _Unseen:
        return None
    return digest.hexdigest()[:16]


def settings_digest(obj: Any, skip: frozenset[str] = frozenset()) -> str | None:
    """A digest of ``obj``'s class and of its attributes (slots too) but ``skip``; None
    when one does not pickle.

    Example:
        >>> from types import SimpleNamespace
        >>> settings_digest(SimpleNamespace(k=1)) != settings_digest(SimpleNamespace(k=2))
        True
    """
    names = {n for c in type(obj).__mro__ for n in _slots(c)} | set(getattr(obj, "__dict__", {}))
    digest = hashlib.sha256()
    seen: set[int] = set()
    try:
        _class(digest, type(obj), seen)
        for name in sorted(names - skip):
            if hasattr(obj, name):  # a slot not yet set
                _value(digest, name, getattr(obj, name), set(), seen)
    except _Unseen:
        return None
    return digest.hexdigest()[:16]


def _slots(cls: type) -> tuple[str, ...]:
    slots = vars(cls).get("__slots__", ())
    slots = (slots,) if isinstance(slots, str) else slots
    return tuple(s for s in slots if s not in ("__dict__", "__weakref__"))


class _Unseen(Exception):
    """A value the code or class holds that no digest can stand for (it does not pickle)."""


def _class(digest: Any, cls: type, seen: set[int]) -> None:
    if id(cls) in seen:
        return
    seen.add(id(cls))
    for klass in cls.__mro__:
        if not _user_class(klass):
            continue
        digest.update(klass.__qualname__.encode())
        for name, value in sorted(vars(klass).items()):
            if isinstance(value, staticmethod | classmethod | functools.cached_property):
                value = value.__func__ if hasattr(value, "__func__") else value.func
            parts = [value.fget, value.fset] if isinstance(value, property) else [value]
            dunder = name.startswith("__") and name.endswith("__")
            if name == "_abc_impl" or (dunder and not isinstance(value, types.FunctionType)):
                continue  # the class's bookkeeping (its name, doc, line, ABC caches)
            if isinstance(value, _C_MEMBERS):
                continue  # a compiled class's methods and fields: C code, not settings
            for part in parts:  # a method, a nested `Opts` class, a setting
                _value(digest, name, part, set(), seen)


def _user_class(cls: type) -> bool:
    """Built in, compiled or installed: not the user's. No file: a notebook's or `python -c`'s."""
    if cls.__module__ in sys.builtin_module_names:
        return False
    file = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return file is None or _edited(file)


def _unwrapped(fn: Any, digest: Any, seen: set[int]) -> Any:
    """The function under wrapper objects, each wrapper's class and state (a setting, as
    in ``@scaled(k)``) fed to ``digest``; ``functools.cache``'s holds none."""
    for _ in range(100):  # a cycle of __wrapped__ ends here
        if isinstance(fn, types.FunctionType | types.MethodType | type):
            return fn  # a function's own __wrapped__ is read by its code, as a closure
        try:
            inner = inspect.getattr_static(fn, "__wrapped__")
        except AttributeError:
            return fn
        cache = type(fn).__module__ == "functools" and hasattr(fn, "cache_parameters")
        if not cache:  # functools.cache's own wrapper holds no setting
            _class(digest, type(fn), seen)
            state = getattr(fn, "__dict__", None)
            if not isinstance(state, dict):
                raise _Unseen  # a C wrapper with a setting we cannot read
            for name in sorted(state.keys() - _WRAPPER_FIELDS):
                _value(digest, name, state[name], set(), seen)
        fn = inner
    return fn


def _function(digest: Any, fn: types.FunctionType, seen: set[int]) -> None:
    if id(fn) in seen:
        return
    seen.add(id(fn))
    names = _code(digest, fn.__code__)
    for name in sorted(names & fn.__globals__.keys()):
        _value(digest, name, fn.__globals__[name], names, seen)
    cells = [c.cell_contents for c in fn.__closure__ or () if _filled(c)]
    defaults = [*(fn.__defaults__ or ()), *(fn.__kwdefaults__ or {}).values()]
    for value in cells + defaults:
        _value(digest, "", value, names, seen)
    # `from cfg import SCALE` in its body: a module imported where fn runs.
    for module in sorted(_imported(fn.__code__, fn.__globals__.get("__package__"))):
        _source(digest, module)


def _imported(code: types.CodeType, package: str | None) -> set[str]:
    """The modules ``code`` (and code nested in it) imports, relative ones resolved, with
    each ``from m import x``'s ``m.x`` (a submodule, where it is one)."""
    found: set[str] = set()
    ins = list(dis.get_instructions(code))
    for k, i in enumerate(ins):
        if i.opname != "IMPORT_NAME" or k < 2:
            continue
        level, names = ins[k - 2].argval, ins[k - 1].argval  # the two constants it takes
        try:
            base = (
                importlib.util.resolve_name("." * level + i.argval, package) if level else i.argval
            )
        except (ImportError, ValueError, TypeError):
            continue
        found |= {base, *(f"{base}.{n}" for n in names or () if n != "*")}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _imported(const, package)
    return {name for name in found if name}


def _source(digest: Any, module: str) -> None:
    """The file of user module ``module``, whole: imported when the function runs, maybe
    in another process, so read as a file, the same whether imported here or not."""
    try:
        spec = importlib.util.find_spec(module)
    except Exception:  # not importable here: it fails where the function runs
        return
    origin = getattr(spec, "origin", None) or ""
    if _edited(origin) and os.path.isfile(origin):
        with open(origin, "rb") as file:
            digest.update(module.encode() + hashlib.sha256(file.read()).digest())


def _code(digest: Any, code: types.CodeType) -> set[str]:
    """Feed ``code``, its nested code and the names it reads to ``digest``; the names."""
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code(digest, const)
        elif isinstance(const, frozenset):  # a set literal: its repr's order is hash-seeded
            digest.update(repr(sorted(map(repr, const))).encode())
        else:
            digest.update(repr(const).encode())
    return names


def _value(digest: Any, name: str, value: Any, names: set[str], seen: set[int]) -> None:
    digest.update(name.encode())
    value = _unwrapped(value, digest, seen)
    if isinstance(value, types.FunctionType) and _edited(value.__code__.co_filename):
        _function(digest, value, seen)
    elif isinstance(value, type) and _user_class(value):
        _class(digest, value, seen)
    elif isinstance(value, types.ModuleType):
        if _edited(getattr(value, "__file__", "") or ""):
            for attr in sorted(names & vars(value).keys()):  # helpers.tokenize(...)
                _value(digest, attr, vars(value)[attr], set(), seen)
    elif _plain_tree(value):  # numbers, strings, and dicts, lists, tuples of them (all
        digest.update(_canonical(value).encode())  # of a dict: a key may come at run time)
    elif isinstance(value, functools.partial):  # pickle names its function only
        for part in (value.func, value.args, value.keywords):
            _value(digest, "", part, names, seen)
    elif isinstance(value, dict | list | tuple) and _holds_code(value):  # pipeline steps
        if id(value) in seen:
            return
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        digest.update(type(value).__name__.encode())
        for key, item in items:  # in order: a pipeline's steps run in it
            _value(digest, _canonical(key) if _plain_tree(key) else "", key, names, seen)
            _value(digest, "", item, names, seen)
    elif (state := pickle_digest(value)) is not None:  # an object: its state is a setting,
        _class(digest, type(value), seen)  # its class's code (pickle names the class only)
        digest.update(state.encode())
    else:
        raise _Unseen


_CODE = (types.FunctionType, types.MethodType, type, types.ModuleType, functools.partial)


def _holds_code(value: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> bool:
    """Whether a container holds code, user class instances or containers: pickle would
    name their classes only."""
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    return any(isinstance(v, (*_CODE, dict, list, tuple)) or _user_class(type(v)) for v in items)


def _canonical(value: Any) -> str:
    """``repr`` with dicts in key order (a dict built from a set is ordered by hash seed)."""
    if isinstance(value, dict):
        items = sorted((_canonical(k), _canonical(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return type(value).__name__ + "(" + ", ".join(map(_canonical, value)) + ")"
    return repr(value)


def _plain_tree(value: Any, depth: int = 0) -> bool:
    """Whether ``value``'s repr is its content: plain values in dicts, lists and tuples."""
    if isinstance(value, (*_PLAIN, np.generic)):
        return True
    if depth > 8 or not isinstance(value, dict | list | tuple):
        return False
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    return all(_plain_tree(v, depth + 1) for v in items)


def _edited(filename: str) -> bool:
    """Whether code from ``filename`` is the user's (not installed, not built in)."""
    # A packages folder outside this interpreter's: --user, a distro's, one a .pth names.
    installed = filename.startswith(("<frozen", _LOADERKIT, *_INSTALLED)) or any(
        part in filename for part in _PACKAGES
    )
    return bool(filename) and not installed


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # a cell not yet assigned
        return False
    return True


class _DigestPickler(pickle.Pickler):
    """Pickles a tensor as its dtype, shape and bytes (its own pickle names its address)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            data = obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            return torch.Tensor, (str(obj.dtype), tuple(obj.shape), data)
        return NotImplemented


class _SortedSetPickler(_DigestPickler):
    """Also pickles a set in its items' pickles' order (its own follows the hash seed)."""

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) in (set, frozenset):
            return type(obj).__name__, sorted(obj, key=_item_pickle)
        return None


def _item_pickle(item: Any) -> bytes:
    out = io.BytesIO()
    _SortedSetPickler(out, protocol=5).dump(item)
    return out.getvalue()


def pickle_digest(item: Any, sorted_sets: bool = True) -> str | None:
    """A digest of ``item``'s pickle; None if it does not pickle. ``sorted_sets=False``
    pickles sets in their own order: a digest of this process only, but faster."""
    # Large buffers out of band, summed with crc32: a resume compares data, guards no secret.
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    pickler = _SortedSetPickler if sorted_sets else _DigestPickler
    try:
        pickler(out, protocol=5, buffer_callback=buffers.append).dump(item)
    except Exception:
        return None
    digest = hashlib.sha256(out.getbuffer())
    for buffer in buffers:
        raw = buffer.raw()
        digest.update(f"{raw.nbytes}:{zlib.crc32(raw)};".encode())
    return digest.hexdigest()[:32]
