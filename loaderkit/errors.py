"""The exception types users catch: each derives from :class:`LoaderkitError` and from the
built-in type code guarding ``torch.utils.data`` calls already catches."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from typing import Any

__all__ = [
    "CollateError",
    "LoaderkitError",
    "MissingDependencyError",
    "MissingShardError",
    "ShardChangedError",
    "ShardError",
    "ShardReadError",
    "StateMismatchError",
    "WorkerError",
    "WorkerStartError",
]


class LoaderkitError(Exception):
    """Base class of every error raised by loaderkit itself."""


class CollateError(LoaderkitError, ValueError):
    """A batch could not be collated (the message names the key and the sample)."""


class StateMismatchError(LoaderkitError, ValueError):
    """A state dict does not fit the object it is loaded into (resuming would not be exact)."""


class WorkerError(LoaderkitError, RuntimeError):
    """A sample failed to load; carries the sample index and the original traceback."""

    def __init__(self, message: str, *, index: object = None) -> None:
        super().__init__(message)
        self.index = index


class WorkerStartError(LoaderkitError, TypeError):
    """Worker processes could not start: what they need could not be pickled."""


class ShardError(LoaderkitError, ValueError):
    """A shard or its index cannot be used (missing, corrupt, changed); ``path`` is the file."""

    def __init__(self, message: str, *, path: object = None) -> None:
        super().__init__(message)
        self.path = path


class MissingShardError(ShardError, FileNotFoundError):
    """A shard file, its sidecar, or a shard the index lists does not exist."""


class ShardChangedError(ShardError):
    """A shard's identity (ETag, version, size, mtime) is not the one listed or indexed."""


class ReaderSettingError(LoaderkitError, ValueError):
    """A reader's setting does not fit the data it reads (a token its ``out_dtype`` cannot
    hold, an ``eos`` its dtype cannot hold); never skipped by ``on_error="skip"``."""


class MissingDependencyError(LoaderkitError, ImportError):
    """An optional dependency (an extra such as ``vision``) is not installed."""


class ShardReadError(WorkerError, ShardError):
    """A shard failed while a batch was read: a :class:`WorkerError` and a :class:`ShardError`."""


class MissingShardReadError(ShardReadError, MissingShardError):
    """A :class:`ShardReadError` caused by a missing shard."""


class ShardChangedReadError(ShardReadError, ShardChangedError):
    """A :class:`ShardReadError` caused by a changed shard."""


def require(module: str, need: str, extra: str, fix: str = "") -> Any:
    """``module`` imported, else a :class:`MissingDependencyError`: ``need`` (what needs it)
    and the loaderkit ``extra`` that installs it."""
    try:  # the package first: a submodule imported earlier stays in sys.modules without it
        importlib.import_module(module.split(".")[0])
        return importlib.import_module(module)
    except ImportError as exc:
        top, installed = module.split(".")[0], False
        with contextlib.suppress(ImportError, ValueError):  # None in sys.modules: absent
            installed = importlib.util.find_spec(top) is not None
        if installed:  # but broken (a missing shared library, a version clash)
            raise MissingDependencyError(
                f"{need} {top}, which is installed but failed to import ({exc}); reinstall "
                f"it: pip install --force-reinstall '.[{extra}]'."
            ) from exc
        raise MissingDependencyError(
            f"{need} {top}, which is not installed; install the extra in the loaderkit "
            f"clone: pip install '.[{extra}]'{fix}."
        ) from exc


def read_error_type(cause: type[BaseException]) -> type[WorkerError]:
    """The error a failed read raises for a ``cause``, in or out of workers."""
    if issubclass(cause, MissingShardError):
        return MissingShardReadError
    if issubclass(cause, ShardChangedError):
        return ShardChangedReadError
    if issubclass(cause, ShardError):
        return ShardReadError
    return WorkerError
