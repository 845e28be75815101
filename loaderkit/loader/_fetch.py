"""One batch of planned indices to a collated batch: the same code in any process (private)."""

from __future__ import annotations

import bisect
import functools
import inspect
import operator
import pickle
import traceback
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import (
    ConcatDataset,
    Dataset,
    StackDataset,
    Subset,
    TensorDataset,
    default_collate,
    default_convert,
    get_worker_info,
)

from loaderkit.collate import STACK_FIX, promoting_collate, torch_collates
from loaderkit.data._open import OpenShards, process_generation
from loaderkit.data._reads import READ_UNDER, batch_fetch_is_faithful, torchs_wrapper, wrapped
from loaderkit.data.hf import HFDataset
from loaderkit.data.mixing import MixedDataset, held_mixes
from loaderkit.data.sharded import ShardedDataset
from loaderkit.errors import (
    CollateError,
    LoaderkitError,
    ReaderSettingError,
    ShardError,
    WorkerError,
    read_error_type,
)
from loaderkit.loader._mixed_batch import check_mixed_batch, mixed_sources
from loaderkit.plan.sample import Schedule
from loaderkit.seeding import (
    SampleSeeder,
    batch_seed,
    draws_nothing,
    read_set_on_instance,
    seeded_batch,
    torchs_own_reads,
)


def loaderkit_batch_read(dataset: Any) -> bool:
    """Whether ``dataset`` is read by a faithful ``get_batch`` loaderkit defines (draws nothing)."""
    if isinstance(dataset, _Subset):  # a split's get_batch reads the dataset's
        return loaderkit_batch_read(dataset.dataset)
    if "get_batch" in getattr(dataset, "__dict__", {}) or not batch_fetch_is_faithful(dataset):
        return False  # one set on the instance is the user's
    owner = next(cls for cls in type(dataset).__mro__ if "get_batch" in vars(cls))
    return owner.__module__.startswith("loaderkit.")


def _quiet(dataset: Any) -> bool:
    """Whether reading ``dataset`` cannot draw: plain containers and loaderkit's own batch
    reads (not a Hugging Face dataset's: its transform may), through torch's wrappers."""
    if draws_nothing(dataset):
        return True
    if isinstance(dataset, Subset) and not _plain_indices(dataset.indices):
        return False  # its indices' [i] runs a user's code
    parts = _parts(dataset)
    if parts is not None:
        return all(map(_quiet, parts))
    return loaderkit_batch_read(dataset) and not isinstance(dataset, HFDataset)


def _plain_indices(indices: Any) -> bool:
    """Whether ``indices[i]`` is a container's own (an array's or tensor's, a list's)."""
    if isinstance(indices, range | np.ndarray | torch.Tensor):
        return True
    own = type(indices).__getitem__
    return isinstance(indices, list | tuple) and own in (list.__getitem__, tuple.__getitem__)


def torch_gathered(dataset: Any) -> bool:
    """Whether ``dataset`` is torch's exact TensorDataset (or a Subset/ConcatDataset of them)."""
    if read_set_on_instance(dataset) or not torchs_own_reads(type(dataset)):
        return False
    if type(dataset) is Subset:
        return torch_gathered(dataset.dataset)
    if type(dataset) is ConcatDataset:
        return all(torch_gathered(part) for part in dataset.datasets)
    return type(dataset) is TensorDataset


def torch_gather(dataset: Any, rows: torch.Tensor) -> list[torch.Tensor] | None:
    """``default_collate`` of the ``rows`` by ``index_select``; None if that could differ."""
    if read_set_on_instance(dataset) or rows.numel() == 0:
        return None
    if int(rows.min()) < 0 or int(rows.max()) >= len(dataset):
        return None  # torch's per-sample read names the bad index
    if type(dataset) is Subset:
        mapped = _subset_rows(dataset.indices, rows)
        return None if mapped is None else torch_gather(dataset.dataset, mapped)
    if type(dataset) is ConcatDataset:
        return _concat_gather(dataset, rows)
    if type(dataset) is not TensorDataset:
        return None
    if not all(_stacks_like_rows(t, len(dataset)) for t in dataset.tensors):
        return None
    return [t.index_select(0, rows.to(t.device)) for t in dataset.tensors]


def _stacks_like_rows(t: Any, size: int) -> bool:
    """Whether ``t.index_select(0, rows)`` equals ``torch.stack`` of its rows, strides included."""
    return (
        type(t) is torch.Tensor
        and t.layout == torch.strided
        and t.dim() >= 1
        and t.size(0) == size
        and (t.dim() <= 4 or (t.is_contiguous() and 1 not in t.shape[1:]))
        and not (t.requires_grad or t.is_nested or t.is_quantized or t.is_conj() or t.is_neg())
    )


def _subset_rows(indices: Any, rows: torch.Tensor) -> torch.Tensor | None:
    if type(indices) is np.ndarray and indices.dtype.kind == "i" and indices.dtype.isnative:
        indices = torch.from_numpy(np.ascontiguousarray(indices))  # torch takes no negative stride
    if type(indices) is torch.Tensor:
        # A uint8/bool index would be read as a mask; a 2-d one would pick several rows.
        if indices.dim() != 1 or indices.dtype not in _INT_INDEX:
            return None
        return indices[rows.to(indices.device)].to("cpu", torch.int64)
    if type(indices) not in (list, tuple, range):
        return None
    mapped = [indices[i] for i in rows.tolist()]
    if not all(type(i) is int for i in mapped):
        return None
    return torch.tensor(mapped, dtype=torch.int64)


_INT_INDEX = (torch.int8, torch.int16, torch.int32, torch.int64)


def _concat_gather(dataset: ConcatDataset[Any], rows: torch.Tensor) -> list[torch.Tensor] | None:
    ends = torch.tensor(dataset.cumulative_sizes)
    part = torch.searchsorted(ends, rows, right=True)  # ConcatDataset's bisect_right
    pieces = []
    for k in torch.unique(part).tolist():
        at = (part == k).nonzero().squeeze(1)
        start = int(ends[k - 1]) if k else 0
        got = torch_gather(dataset.datasets[k], rows[at] - start)
        if got is None:
            return None
        pieces.append((at, got))
    if len(pieces) == 1:
        return pieces[0][1]
    first = pieces[0][1]
    same = [(t.dtype, t.device, t.shape[1:]) for t in first]
    if any([(t.dtype, t.device, t.shape[1:]) for t in got] != same for _, got in pieces):
        return None  # stacking would promote or fail: as torch does it, per sample
    out = [torch.empty((len(rows), *t.shape[1:]), dtype=t.dtype, device=t.device) for t in first]
    for at, got in pieces:
        for o, t in zip(out, got, strict=True):
            o.index_copy_(0, at.to(o.device), t)
    return out


class Unbatched:
    """``batch_size=None``'s collate: ``collate_fn`` (default ``default_convert``) of one sample."""

    def __init__(self, collate_fn: Callable[[Any], Any] | None) -> None:
        self.collate_fn = collate_fn if collate_fn is not None else default_convert

    def __call__(self, samples: list[Any]) -> Any:
        (sample,) = samples
        return self.collate_fn(sample)


def _one_item(getitems: Callable[[list[int]], Any], index: int) -> Any:
    samples = getitems([index])
    if not isinstance(samples, list | tuple) or len(samples) != 1:
        raise TypeError(
            f"__getitems__([{index}]) returned {type(samples).__name__} "
            f"{str(samples)[:60]!r}, not a list of one sample. Return a list of samples, "
            "or pass per_sample_seeding=False."
        )
    return samples[0]


def identity(batch: Any) -> Any:
    """Collate function of the inner DataLoader: batches arrive already collated."""
    return batch


class BatchFetcher:
    """Fetch and collate one batch (picklable), by the fastest faithful read: ``get_batch`` or
    :func:`torch_gather`, else ``__getitems__``, else ``__getitem__`` per sample, each under
    RNG states keyed by ``(seed, epoch, index)`` with ``per_sample_seeding``.
    """

    def __init__(
        self,
        dataset: Any,
        collate_fn: Callable[[list[Any]], Any] | None,
        *,
        seed: int,
        per_sample_seeding: bool | Literal["auto"],
        read_under: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    ) -> None:
        self.dataset = dataset
        self.seed = seed
        self.per_sample_seeding = bool(per_sample_seeding)
        self.seeder = (
            SampleSeeder(lazy=per_sample_seeding == "auto") if per_sample_seeding else None
        )
        seeded = self.seeder is not None and isinstance(dataset, _Subset)
        self.rows = dataset.seed_rows if seeded else None  # keys only where samples are seeded
        self.collate_fn = collate_fn if collate_fn is not None else default_collate
        # What the engines call: default_collate, promoting dtypes alike in every process.
        own = self.collate_fn is default_collate
        self.collate = promoting_collate if own else self.collate_fn
        batched = own and torch_collates()  # not a user's handler (torch's extension point)
        self.gather = batched and not self.per_sample_seeding and torch_gathered(dataset)
        # A mix's batches are checked before collate (also one a wrapper of the user's reads).
        self.mix = (_mix_under(dataset) or _held_mix(dataset)) if own else None
        # Its plan's mix, which a weighted MixedDataset read through __getitem__ must be.
        self.read_under = read_under
        lazy = self.seeder is None or self.seeder.lazy
        if collate_fn is None and batched and batch_fetch_is_faithful(dataset) and lazy:
            self.mode = "get_batch"
        elif type(self.collate_fn) is not Unbatched and batch_fetch_is_faithful(
            dataset, "__getitems__"
        ):  # batch_size=None: torch reads dataset[i]
            self.mode = "getitems"
        else:
            self.mode = "single"
        # Nothing to seed or watch (a Subset of a ShardedDataset): read whole, as unseeded.
        self.quiet = self.mode == "getitems" and _quiet(dataset)
        self.checked: tuple[int, int] | None = None  # (epoch, process) whose shards were checked
        # Split from the start: a sample may read torch.initial_seed() unseen by a parked read.
        self.split = (
            self.mode == "getitems" and self.seeder is not None and per_sample_reads(dataset)
        )
        own_class = type(dataset).__module__.startswith("loaderkit.")
        self.own_reads = self.gather or (self.mode == "get_batch" and own_class)

    def __call__(
        self, epoch: int, indices: np.ndarray | torch.Tensor, seed_keys: np.ndarray | None = None
    ) -> Any:
        """The collated batch of ``indices``; ``seed_keys`` (if given) seed in their place."""
        if self.own_reads:  # loaderkit's or torch's own: no user code holding a mix
            return self._read(epoch, indices, seed_keys)
        token = READ_UNDER.set(self.read_under)
        try:
            return self._read(epoch, indices, seed_keys)
        finally:
            READ_UNDER.reset(token)

    def _read(
        self, epoch: int, indices: np.ndarray | torch.Tensor, seed_keys: np.ndarray | None
    ) -> Any:
        here = (epoch, process_generation())
        if self.checked != here:  # this epoch's first batch in this process
            self.checked = here
            for files in _shard_sets(self.dataset):
                files.recheck()
        if seed_keys is None and self.rows is not None:
            seed_keys = self.rows[np.asarray(indices)]
        if self.mode == "get_batch" and self.seeder is None:
            return self._batched(self.dataset.get_batch, epoch, indices)
        if self.mode == "get_batch":  # a user's: seeded per batch, never bypassed
            keyed = np.asarray(indices if seed_keys is None else seed_keys)
            with seeded_batch(self.seed, epoch, keyed):
                return self._batched(self.dataset.get_batch, epoch, indices)
        if self.gather:
            rows = torch.as_tensor(indices)
            batch = self._batched(functools.partial(torch_gather, self.dataset), epoch, rows)
            if batch is not None:
                return batch
        index_list: list[int] = indices.tolist()
        keys = index_list if seed_keys is None else seed_keys.tolist()
        if self.mode == "getitems" and (self.seeder is None or self.quiet):
            samples = self._batched(self.dataset.__getitems__, epoch, index_list)
        elif self.mode == "getitems" and not self.split:
            samples = self._parked_batch(epoch, index_list, keys)
        else:
            samples = self._samples(epoch, index_list, keys)
        try:
            if self.mix is not None:
                check_mixed_batch(*self.mix, index_list, samples)
            return self.collate(samples)
        except Exception as exc:  # named with its batch, as in a worker
            where = f"collate_fn failed on the batch of sample indices {_shown(index_list)} "
            said = f"(epoch {epoch})" + collate_said(exc, own=self.collate_fn is default_collate)
            if not isinstance(exc, CollateError):
                said += mixed_sources(self.dataset, index_list, samples)
            raise worker_error(where + said, index=index_list, cause=type(exc)) from exc

    def _parked_batch(self, epoch: int, index_list: list[int], keys: list[int]) -> Any:
        """A whole ``__getitems__`` read, refused if it drew from a global RNG."""
        assert self.seeder is not None
        read = functools.partial(self._batched, self.dataset.__getitems__, epoch, index_list)
        torch_seed = batch_seed(self.seed, epoch, np.asarray(keys))
        samples, moved = self.seeder.read_parked(read, torch_seed)
        if moved is False:
            return samples
        if moved is None:
            raise ValueError(
                f"ResumableDataLoader: numpy's global generator is not an MT19937, so "
                f"{type(self.dataset).__name__}.__getitems__ cannot be checked for draws. "
                "Pass per_sample_seeding=False, or keep numpy's default bit generator."
            )
        whole = _batch_readers(self.dataset)
        why = f" (read whole for {', '.join(whole)})" if whole else ""
        wrap = " or ".join(n.split(".")[0] for n in whole) if whole else "the dataset"
        raise ValueError(
            f"ResumableDataLoader: {type(self.dataset).__name__}.__getitems__{why} draws from a "
            "global RNG while reading a batch, which cannot be seeded per sample. Draw in "
            f"__getitem__ only (wrap {wrap} in a class without __getitems__) or from "
            "loaderkit.sample_generator(seed, epoch, index), or pass per_sample_seeding=False "
            "with a fixed num_workers (in a LoaderDataModule: override per_sample_seeding(split))."
        )

    def _samples(self, epoch: int, index_list: list[int], keys: list[int]) -> list[Any]:
        # One try around the loop: the failing index follows the samples loaded.
        samples: list[Any] = []
        if self.mode == "getitems":
            getitem: Callable[[int], Any] = functools.partial(_one_item, self.dataset.__getitems__)
        else:  # dataset[i], as torch reads it (the class's, not one set on the instance)
            getitem = _class_getitem(self.dataset)
        try:
            if self.seeder is not None:
                return self.seeder.load(self.seed, epoch, index_list, getitem, samples, keys)
            samples.extend(map(getitem, index_list))
            return samples
        except Exception as exc:
            index = index_list[len(samples)]
            method = "__getitems__" if self.mode == "getitems" else "__getitem__"
            what = f"sample index {index}{_file_of(self.dataset, index)}"
            raise _load_error(what, epoch, exc, f"{method} for index {index}", index) from exc

    def _batched(self, fetch: Callable[[Any], Any], epoch: int, indices: Any) -> Any:
        try:
            return fetch(indices)
        except Exception as exc:
            listed = indices if isinstance(indices, list) else indices.tolist()
            what = f"the batch of sample indices {_shown(listed)}"
            fix = "batch read (get_batch / __getitems__) for these indices"
            raise _load_error(what, epoch, exc, fix, listed) from exc


def _shown(indices: list[int]) -> str:
    """The first 8 of a batch's indices, for a message."""
    return f"{indices[:8]}" + ("" if len(indices) <= 8 else f" (+{len(indices) - 8} more)")


def _class_getitem(dataset: Any) -> Callable[[int], Any]:
    """``dataset[i]`` as a callable: the class's plain function bound, else ``operator.getitem``."""
    method = inspect.getattr_static(type(dataset), "__getitem__", None)
    if isinstance(method, types.FunctionType):
        return types.MethodType(method, dataset)
    return functools.partial(operator.getitem, dataset)


def per_sample_reads(dataset: Any) -> bool:
    """Whether ``dataset``'s ``__getitems__`` only gathers ``__getitem__`` reads."""
    if not batch_fetch_is_faithful(dataset, "__getitems__"):
        return True  # read through __getitem__
    if read_set_on_instance(dataset):
        return False  # the user's own batch read
    owner = next((c for c in (ShardedDataset, HFDataset) if isinstance(dataset, c)), None)
    cls: Any = type(dataset)
    if owner is not None and cls.__getitems__ is vars(owner)["__getitems__"]:
        # Its own batch read goes through a subclass's (or a mixin's) __getitem__.
        return cls.__getitem__ is not vars(owner)["__getitem__"]
    parts = _parts(dataset)
    return parts is not None and all(map(per_sample_reads, parts))


def _parts(dataset: Any) -> list[Any] | None:
    """The datasets a torch wrapper (``ConcatDataset``, ``Subset``, ``StackDataset``) or a
    split reads through; None for any other dataset."""
    if type(dataset) is ConcatDataset:
        return list(dataset.datasets)
    if torchs_wrapper(dataset):
        return wrapped(dataset)
    return [dataset.dataset] if isinstance(dataset, _Subset) else None


def _batch_readers(dataset: Any) -> list[str]:
    """The parts of torch's wrappers in ``dataset`` whose own ``__getitems__`` make it read
    a batch whole (none: ``dataset`` is not such a wrapper)."""
    parts = _parts(dataset) or []
    named = [_batch_readers(p) or [f"{type(p).__name__}.__getitems__"] for p in parts]
    return [
        n for p, names in zip(parts, named, strict=True) if not per_sample_reads(p) for n in names
    ]


def _shard_sets(dataset: Any) -> list[OpenShards]:
    """The open shards ``dataset`` reads through: a ShardedDataset's, in mixes and torch's
    wrappers (Subset, ConcatDataset, StackDataset)."""
    if isinstance(dataset, ShardedDataset):
        return [dataset._files]
    inner = dataset.datasets if isinstance(dataset, ConcatDataset) else None
    if isinstance(dataset, MixedDataset):
        inner = dataset.sources
    elif isinstance(dataset, Subset | StackDataset):
        inner = wrapped(dataset)
    elif isinstance(dataset, _Subset):
        inner = [dataset.dataset]
    return [files for part in inner or () for files in _shard_sets(part)]


def _load_error(what: str, epoch: int, exc: Exception, fix: str, index: Any) -> WorkerError:
    said = f"{type(exc).__name__}: {str(exc).rstrip('.')}"
    # loaderkit's own errors (a changed shard, a reader setting) name their fix already.
    tail = "" if isinstance(exc, (ShardError, ReaderSettingError)) else f"; fix the dataset's {fix}"
    return worker_error(
        f"loading {what} (epoch {epoch}) failed with {said}. The original traceback is chained "
        f"above{tail}.",
        index=index,
        cause=type(exc),
    )


def worker_error(message: str, index: Any, cause: type[BaseException] | None) -> WorkerError:
    """A :class:`WorkerError` also caught as ``cause`` (the shard read error for a ShardError)."""
    if cause is None:
        return WorkerError(message, index=index)
    if issubclass(cause, ShardError):
        return read_error_type(cause)(message, index=index)
    try:
        return _caught_as(cause)(message, index=index)
    except TypeError:  # a type that cannot be combined (instance layout, metaclass, ...)
        return WorkerError(message, index=index)


def collate_said(exc: Exception, *, own: bool) -> str:
    """The end of a collate failure's message: loaderkit's own error names its fix; another
    gets its type and one (``own``: no collate_fn was passed, so the samples are at fault)."""
    if isinstance(exc, LoaderkitError):
        return f": {exc}"
    fix = "fix collate_fn"
    if own:
        fix = "fix what the dataset returns for them, or pass a collate_fn"
        if isinstance(exc, RuntimeError):  # torch.stack's sizes or dtypes
            fix = f"fix what the dataset returns for them, or {STACK_FIX}"
    return f" with {type(exc).__name__}: {exc}; {fix}."


def worker_error_from(message: str, exc: Exception) -> WorkerError:
    """:func:`worker_error` for ``exc`` (no sample index), chained to it."""
    error = worker_error(message, index=None, cause=type(exc))
    error.__cause__ = exc
    return error


# One combined class per exception type, so isinstance agrees across batches.
_COMBINED: dict[type[BaseException], type[WorkerError]] = {}


def _caught_as(cause: type[BaseException]) -> type[WorkerError]:
    combined = _COMBINED.get(cause)
    if combined is not None:
        return combined
    # StopIteration would end the caller's loop silently; BaseExceptions are not data errors.
    if issubclass(cause, WorkerError | StopIteration | StopAsyncIteration) or not issubclass(
        cause, Exception
    ):
        return WorkerError
    combined = type(
        f"WorkerError({cause.__name__})",
        (WorkerError, cause),
        {
            "__module__": WorkerError.__module__,
            "__str__": BaseException.__str__,  # not KeyError's repr of the message
            "__reduce__": _reduce_worker_error,
            "caught_as": cause,
        },
    )
    _COMBINED[cause] = combined
    return combined


def _reduce_worker_error(self: WorkerError) -> tuple[Any, ...]:
    # By the cause's class: the combined class is made here, not importable by name.
    return (worker_error, (str(self), self.index, type(self).caught_as))  # type: ignore[attr-defined]


class FailedBatch:
    """In a batch's place: loading it raised ``error`` (its traceback pickled as text)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        error = self.error
        source = error.__cause__ if isinstance(error, WorkerError) else error
        source = error if source is None else source
        info = get_worker_info()
        where = "in this process" if info is None else f"in DataLoader worker process {info.id}"
        text = "".join(traceback.format_exception(source))
        message = f"{error}\n\nCaught {type(source).__name__} {where}.\nOriginal {text}"
        kind: type[BaseException] | None = type(source)
        try:
            pickle.dumps(kind)  # a class defined in a function cannot cross processes
        except Exception:
            kind = None
        return (_failed, (message, getattr(error, "index", None), kind))


def _failed(message: str, index: Any, cause: type[BaseException] | None) -> FailedBatch:
    return FailedBatch(worker_error(message, index=index, cause=cause))


class KeyedDataset(Dataset[Any]):
    """The inner DataLoader's dataset: ``(epoch, indices, seed_keys)`` in, a collated batch out."""

    def __init__(self, fetch: BatchFetcher, size: int) -> None:
        self.fetch = fetch
        self.size = size

    @property
    def user_dataset(self) -> Any:
        """The user's dataset."""
        return self.fetch.dataset

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: Any) -> Any:  # pragma: no cover - torch calls __getitems__
        raise TypeError("KeyedDataset is read through __getitems__ only")

    def __getitems__(self, key: Sequence[Any]) -> Any:
        epoch, indices, seed_keys = key
        try:
            return self.fetch(epoch, indices, seed_keys)
        except Exception as exc:  # handed out in the batch's place; the epoch goes on
            return FailedBatch(exc)


def batch_indices(sched: Schedule) -> Callable[[int], np.ndarray]:
    """Each step's indices as a new int64 numpy array (a dataset may sort them in place)."""
    view = getattr(sched, "indices_numpy", None)
    if view is not None:
        return lambda step: view(step).copy()
    return lambda step: _int64_copy(sched.indices(step))


def _int64_copy(indices: Any) -> np.ndarray:
    if isinstance(indices, torch.Tensor):
        indices = indices.numpy(force=True)  # np.array(tensor) warns (numpy 2's copy=)
    return np.array(indices, dtype=np.int64).reshape(-1)


def seed_keys(sched: Schedule) -> Callable[[int], np.ndarray | None]:
    """Each step's per-sample seeding keys (None: the indices)."""
    keys = getattr(sched, "seed_keys", None)
    return (lambda step: None) if keys is None else keys


class KeySource:
    """The inner DataLoader's batch sampler over the live schedule."""

    schedule: Schedule | None = None

    def __iter__(self) -> Iterator[tuple[int, np.ndarray, np.ndarray | None]]:
        sched = self.schedule
        assert sched is not None
        indices, keys = batch_indices(sched), seed_keys(sched)
        for step in range(sched.num_steps):
            yield sched.epoch, indices(step), keys(step)

    def __len__(self) -> int:
        return 0 if self.schedule is None else self.schedule.num_steps


def _file_of(dataset: Any, index: int) -> str:
    """`` (file '...')`` of a folder dataset's sample (``samples`` of ``(path, target)``, as
    torchvision's), through splits; else ''."""
    try:
        while isinstance(dataset, _Subset | Subset | ConcatDataset):
            if isinstance(dataset, ConcatDataset):
                part = bisect.bisect_right(dataset.cumulative_sizes, index)
                index -= dataset.cumulative_sizes[part - 1] if part else 0
                dataset = dataset.datasets[part]
            else:
                index, dataset = int(dataset.indices[index]), dataset.dataset
        path = dataset.samples[index][0] if hasattr(dataset, "samples") else None
    except Exception:  # a name for the message only, never a second failure
        return ""
    return f" (file {path!r})" if isinstance(path, str) else ""


# Here, not in lightning/: workers unpickle a DataModule's val split without Lightning.
def _mix_under(dataset: Any) -> tuple[MixedDataset, list[Any]] | None:
    """The :class:`MixedDataset` ``dataset`` is, or is a split of (``Subset``, a DataModule's
    split), with the splits' indices outermost first; else None."""
    splits = []
    while isinstance(dataset, _Subset | Subset):
        splits.append(dataset.indices)
        dataset = dataset.dataset
    return (dataset, splits) if isinstance(dataset, MixedDataset) else None


def _held_mix(dataset: Any) -> tuple[MixedDataset, list[Any]] | None:
    """The one mix a wrapper of the user's holds, read index for index; else None."""
    held = [] if isinstance(dataset, MixedDataset) else held_mixes(dataset)
    if len(held) != 1 or len(held[0]) != len(dataset):
        return None
    return held[0], []


class _Subset(Dataset[Any]):
    """``dataset`` at ``indices``, with only the batched reads ``dataset`` has."""

    def __init__(self, dataset: Any, indices: np.ndarray, *, keyed: bool = False) -> None:
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)
        # keyed: a rank's part of a split, seeded by the split's indices (as on one rank)
        self.seed_rows = self.indices if keyed else None

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[int(self.indices[index])]


class _BatchedSubset(_Subset):
    def get_batch(self, indices: Any) -> Any:
        return self.dataset.get_batch(self.indices[np.asarray(indices, dtype=np.int64)])


class _ItemsSubset(_Subset):
    def __getitems__(self, indices: Sequence[int]) -> Any:
        return self.dataset.__getitems__(self.indices[np.asarray(indices)].tolist())


class _BothSubset(_BatchedSubset, _ItemsSubset):
    pass


_SPLITS = (_Subset, _BatchedSubset, _ItemsSubset, _BothSubset)


def split_source(dataset: Any) -> Any:
    """The dataset below :func:`index_subset`'s splits, which read it at int64 indices."""
    while type(dataset) in _SPLITS:
        dataset = dataset.dataset
    return dataset


def index_subset(dataset: Any, indices: np.ndarray, *, keyed: bool = False) -> _Subset:
    """A subset read as ``dataset`` is; ``keyed``: its samples seeded by ``dataset``'s indices."""
    batched = batch_fetch_is_faithful(dataset)
    items = batch_fetch_is_faithful(dataset, "__getitems__")
    kinds = ((_Subset, _ItemsSubset), (_BatchedSubset, _BothSubset))
    return kinds[batched][items](dataset, indices, keyed=keyed)
