"""The exception types users catch.

Every loaderkit error is a ``ValueError`` or ``TypeError`` subclass, so code
that already guards ``torch.utils.data`` calls keeps working, and every one
also derives from :class:`LoaderkitError` so a caller can catch them all.
Messages name the parameter, the rule, the value received and the fix.
"""

from __future__ import annotations

import re

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


_INDEX_IN_MESSAGE = re.compile(r"loading sample index (\d+) ")
_INDICES_IN_MESSAGE = re.compile(r"loading the batch of sample indices \[([\d, ]*)\]")


class LoaderkitError(Exception):
    """Base class of every error raised by loaderkit itself."""


class CollateError(LoaderkitError, ValueError):
    """A batch could not be collated: names the key, the sample index and the fix."""


class StateMismatchError(LoaderkitError, ValueError):
    """A state dict does not fit the object it is loaded into.

    Raised when resuming would not be exact: the state was saved for a
    different dataset size, seed, batch size or shuffle setting, or is from a
    newer loaderkit version. The message names the field and both values.
    """


class WorkerError(LoaderkitError, RuntimeError):
    """A sample failed to load; carries the sample index and the original traceback."""

    def __init__(self, message: str, *, index: object = None) -> None:
        super().__init__(message)
        if index is None:
            # torch re-raises a worker's exception in the main process as
            # ``type(exc)(message)``: recover the index from the message.
            found = _INDEX_IN_MESSAGE.search(message)
            batch = _INDICES_IN_MESSAGE.search(message)
            if found:
                index = int(found.group(1))
            elif batch:
                index = [int(i) for i in batch.group(1).split(",") if i.strip()]
        self.index = index


class WorkerStartError(LoaderkitError, TypeError):
    """Worker processes could not start: what they need could not be pickled.

    Raised under the ``spawn`` and ``forkserver`` start methods (loaderkit picks
    ``forkserver`` inside a torch.distributed process group), which send the
    dataset, ``collate_fn`` and ``worker_init_fn`` to each worker by pickling.
    The message names the object that failed and the fixes.
    """


class ShardError(LoaderkitError, ValueError):
    """A shard or its index cannot be used: missing, corrupt, truncated, or changed since indexing.

    The message names the file, what is wrong and the fix; ``path`` holds the file.
    """

    def __init__(self, message: str, *, path: object = None) -> None:
        super().__init__(message)
        self.path = path


class MissingShardError(ShardError, FileNotFoundError):
    """A shard file (or its offsets sidecar) does not exist, or a folder lacks shards its
    index lists."""


class ShardChangedError(ShardError):
    """A shard file or object is not the one that was listed or indexed: its identity (ETag,
    version, size, mtime) changed, so its samples would come from another version."""


class MissingDependencyError(LoaderkitError, ImportError):
    """An optional dependency (an extra such as ``loaderkit[vision]``) is not installed."""


class ShardReadError(WorkerError, ShardError):
    """A shard failed while a batch was loaded from it: names the file and the sample indices.

    Both a :class:`WorkerError` (the batch, ``index``) and a :class:`ShardError`
    (the file): catch either. Raised, for example, when a shard was truncated
    or rewritten while memory-mapped, instead of the zeros or the SIGBUS the
    read would otherwise give.
    """


class MissingShardReadError(ShardReadError, MissingShardError):
    """A :class:`ShardReadError` whose cause is a missing shard: ``except MissingShardError``
    catches it too."""


class ShardChangedReadError(ShardReadError, ShardChangedError):
    """A :class:`ShardReadError` whose cause is a changed shard: ``except ShardChangedError``
    catches it too."""


def read_error_type(cause: type[BaseException]) -> type[WorkerError]:
    """The error a failed sample or batch read raises for an exception of type ``cause``: one
    type per cause, so a missing or changed shard is caught by the same ``except`` in or out
    of workers."""
    if issubclass(cause, MissingShardError):
        return MissingShardReadError
    if issubclass(cause, ShardChangedError):
        return ShardChangedReadError
    if issubclass(cause, ShardError):
        return ShardReadError
    return WorkerError
