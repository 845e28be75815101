"""Batches from worker processes through reused shared-memory slots (private): a skeleton
names the slot; the rest goes through torch's own path, counted (``docs/design.md``).
"""

from __future__ import annotations

import collections
import io
import itertools
import os
import pickle
import sys
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from multiprocessing.util import Finalize
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils import ExceptionWrapper

from loaderkit.errors import WorkerError
from loaderkit.loader._fetch import FailedBatch

ENABLED = True  # whether new worker iterators use slots (benchmarks and tests switch it)
EXTRA_SLOTS = 2  # slots per worker beyond its prefetch_factor: the batch being copied out, slack
ALIGN = 64  # byte alignment of each tensor in an arena (any dtype's view is aligned)
GROWTH = 1.25  # an arena re-created for a batch that did not fit leaves this headroom
MIN_ARENA = 1 << 16
SPLIT_BYTES = 4 << 20  # a pinned tensor this large is copied out in parts, cores allowing
MAX_PARTS = 4

_DTYPE_NAMES = (
    "bool uint8 int8 int16 int32 int64 float16 bfloat16 float32 float64 complex64 complex128 "
    "uint16 uint32 uint64"
)
_DTYPES = frozenset(getattr(torch, n) for n in _DTYPE_NAMES.split() if hasattr(torch, n))

# Transports alive in this (the main) process, by token: how a result finds its slots.
_LIVE: weakref.WeakValueDictionary[int, Transport] = weakref.WeakValueDictionary()
_tokens = itertools.count(1)


@dataclass
class TransportStats:
    """How a loader's batches crossed from its workers: through slots, or torch's path by reason."""

    slot_batches: int = 0
    torch_batches: collections.Counter[str] = field(default_factory=collections.Counter)
    arenas: int = 0
    arena_bytes: int = 0

    def describe(self) -> dict[str, Any]:
        return {
            "slot_batches": self.slot_batches,
            "torch_path_batches": sum(self.torch_batches.values()),
            "torch_path_reasons": dict(self.torch_batches),
            "arenas_received": self.arenas,
            "arena_bytes_received": self.arena_bytes,
        }


class Transport:
    """The main process's side of one worker iterator's slots (made before its workers start)."""

    def __init__(
        self, num_workers: int, slots: int, pin: bool, stats: TransportStats, cores: int = 1
    ) -> None:
        self.token = (os.getpid() << 20) ^ next(_tokens)
        self.slots, self.pin, self.stats = slots, pin, stats
        self.parts = copy_parts(pin, num_workers, cores)
        self.copier = (
            ThreadPoolExecutor(self.parts - 1, "loaderkit-copy") if self.parts > 1 else None
        )
        # 0: free (the worker may write it); 1: written, not yet copied out here.
        self.flags = torch.zeros(num_workers * slots, dtype=torch.uint8).share_memory_()
        self._flags = self.flags.numpy()
        self.arenas: dict[tuple[int, int], tuple[torch.Tensor, Any]] = {}
        _LIVE[self.token] = self

    def close(self) -> None:
        """Unmap the arenas once the workers are stopped (a traceback may keep the iterator)."""
        self.arenas.clear()
        _LIVE.pop(self.token, None)
        if self.copier is not None:
            self.copier.shutdown(wait=False)

    def _copy(self, out: np.ndarray, source: np.ndarray) -> None:
        # numpy's copy: torch's would wake intra-op threads that spin on the workers' cores.
        copier = self.copier
        if copier is None or out.size < SPLIT_BYTES:
            np.copyto(out, source)
            return
        step = -(-out.size // self.parts)
        parts = []
        for i in range(step, out.size, step):
            try:
                parts.append(copier.submit(np.copyto, out[i : i + step], source[i : i + step]))
            except RuntimeError:  # the pool is shut (interpreter exit): the rest here
                np.copyto(out[i:], source[i:])
                break
        np.copyto(out[:step], source[:step])
        for part in parts:
            part.result()  # the slot is freed only after every part is out

    def writer(self) -> SlotWriter:
        return SlotWriter(self.token, self.flags, self.slots)

    def receive(
        self,
        worker: int,
        slot: int,
        skeleton: bytes,
        metas: list[tuple[int, int, torch.dtype, tuple[int, ...]]],
        arena: torch.Tensor | None,
    ) -> Any:
        """The batch in ``worker``'s ``slot``: tensors copied out, then the slot freed."""
        key = (worker, slot)
        if arena is not None:
            # Replaces (and unmaps) the slot's smaller arena.
            self.arenas[key] = (arena, arena.numpy())
            self.stats.arenas += 1
            self.stats.arena_bytes += arena.numel()
        source = self.arenas[key][1]
        tensors = []
        for offset, nbytes, dtype, shape in metas:
            out = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
            if nbytes:
                self._copy(out.numpy(), source[offset : offset + nbytes])
            tensors.append(out.view(dtype).view(shape))
        self._flags[worker * self.slots + slot] = 0
        self.stats.slot_batches += 1
        return _SkeletonUnpickler(io.BytesIO(skeleton), tensors).load()


def copy_parts(pin: bool, num_workers: int, cores: int) -> int:
    """Parts a large pinned tensor is copied out in: the cores its workers and trainer leave."""
    return max(1, min(MAX_PARTS, cores - num_workers - 1)) if pin else 1


class SlotWriter:
    """The worker's side: which slots are free, and this process's arenas."""

    def __init__(self, token: int, flags: torch.Tensor, slots: int) -> None:
        self.token, self.flags, self.slots = token, flags, slots
        self._local: tuple[int, Any, list[torch.Tensor | None]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"token": self.token, "flags": self.flags, "slots": self.slots, "_local": None}

    def local(self) -> tuple[Any, list[torch.Tensor | None]]:
        """This process's view of the flags and its arenas (a forked worker starts afresh)."""
        pid = os.getpid()
        if self._local is None or self._local[0] != pid:
            self._local = (pid, self.flags.numpy(), [None] * self.slots)
            if get_worker_info() is not None:
                # A worker leaves by os._exit: its arenas are let go as multiprocessing's exit
                # runs finalizers, or file_system sharing keeps their /dev/shm files for good.
                Finalize(None, self._local[2].clear, exitpriority=0)
        return self._local[1], self._local[2]


class _Unsupported(Exception):
    pass


class _SkeletonPickler(ForkingPickler):
    """Pickles a batch with each plain CPU tensor replaced by its index in ``tensors``."""

    def __init__(self, file: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors
        # persistent_id runs before pickle's memo: a tensor met twice keeps its first id.
        self._ids: dict[int, int] = {}
        self._storages: set[int] = set()

    def persistent_id(self, obj: Any) -> int | None:
        if not isinstance(obj, torch.Tensor):
            return None
        seen = self._ids.get(id(obj))
        if seen is not None:
            return seen
        if type(obj) is not torch.Tensor:
            raise _Unsupported(f"a tensor subclass ({type(obj).__qualname__})")
        key = id(obj)
        if obj.is_conj() or obj.is_neg():  # torch's path would drop the bit: send the values
            obj = obj.resolve_conj().resolve_neg()
        if obj.is_nested:  # no single shape: its components' layout is torch's to send
            raise _Unsupported("a nested tensor")
        if obj.layout != torch.strided or obj.device.type != "cpu":
            raise _Unsupported(f"a {obj.layout} tensor on {obj.device.type}")
        if obj.requires_grad:
            raise _Unsupported("a tensor that requires grad")
        if obj.dtype not in _DTYPES:
            raise _Unsupported(f"a tensor of dtype {obj.dtype}")
        # A slot holds elements densely; torch's path keeps strides and shared storage.
        if not obj.is_contiguous():
            raise _Unsupported("a non-contiguous tensor (strides kept by torch's path)")
        if obj.numel():
            storage = obj.untyped_storage().data_ptr()
            if storage in self._storages:
                raise _Unsupported("tensors sharing storage (kept shared by torch's path)")
            self._storages.add(storage)
        self._ids[key] = len(self.tensors)
        self.tensors.append(obj)
        return len(self.tensors) - 1


class _SkeletonUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(file)
        self.tensors = tensors

    def persistent_load(self, pid: Any) -> torch.Tensor:
        return self.tensors[pid]


class _SlotBatch:
    """What a worker returns for a batch in a slot; unpickled, it is the batch."""

    __slots__ = ("arena", "metas", "skeleton", "slot", "token", "worker")

    def __init__(self, token: int, worker: int, slot: int, skeleton: bytes, metas: Any) -> None:
        self.token, self.worker, self.slot = token, worker, slot
        self.skeleton, self.metas = skeleton, metas
        self.arena: torch.Tensor | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        args = (self.token, self.worker, self.slot, self.skeleton, self.metas, self.arena)
        return (_receive, args)


class _TorchPath:
    """A batch sent by torch's own path; unpickled, it is the batch (and is counted)."""

    # Pickled in the worker's collate: an unpicklable batch is its error (torch's queue thread
    # would drop it, and the loader wait forever).

    __slots__ = ("data", "reason", "token")

    def __init__(self, token: int, batch: Any, reason: str) -> None:
        self.token, self.reason = token, reason
        self.data = bytes(_ResolvingPickler.dumps(batch, pickle.HIGHEST_PROTOCOL))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_counted, (self.token, self.data, self.reason))


def _torch_path(token: int, batch: Any, reason: str, stream: bool) -> Any:
    """``batch`` for torch's path, or in its place the error that it does not pickle (raised
    from the worker's collate, it ended the epoch); a ``stream``'s item (a tuple, the batch
    last) keeps the rest."""
    try:
        return _TorchPath(token, batch, reason)
    except Exception as exc:
        error = WorkerError(
            f"ResumableDataLoader: a batch cannot leave its worker process, it does not pickle "
            f"({type(exc).__name__}: {exc}); return picklable data from the dataset and "
            "collate_fn, or load with num_workers=0."
        )
        error.__cause__ = exc
        if stream:
            return _torch_path(token, (*batch[:-1], FailedBatch(error)), reason, stream=False)
        return FailedBatch(error)


class _ResolvingPickler(ForkingPickler):
    """torch's own pickling, conj and neg views sent by value (torch's drops their bit)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor) and (obj.is_conj() or obj.is_neg()):
            return _same, (obj.resolve_conj().resolve_neg(),)
        return NotImplemented


def _same(value: Any) -> Any:
    return value


def _receive(token: int, *args: Any) -> Any:
    # Runs as torch unpickles a result: an error must reach the loader, not kill the pin thread.
    try:
        transport = _LIVE.get(token)
        if transport is None:
            raise RuntimeError(
                "loaderkit: a batch arrived from a worker whose loader iterator is gone"
            )
        return transport.receive(*args)
    except Exception:
        return ExceptionWrapper(sys.exc_info(), where="in loaderkit's worker transport")


def _counted(token: int, data: bytes, reason: str) -> Any:
    transport = _LIVE.get(token)
    if transport is not None:
        transport.stats.torch_batches[reason] += 1
    return pickle.loads(data)


def pack(writer: SlotWriter, batch: Any, *, stream: bool = False) -> Any:
    """The worker's ``collate_fn``: ``batch`` into a free slot, else wrapped for torch's path
    (``stream``: a stream engine's item, a tuple with the batch last)."""
    info = get_worker_info()
    if info is None:  # not in a worker: nothing crosses a process
        return batch
    flags, arenas = writer.local()
    base = info.id * writer.slots
    for slot in range(writer.slots):
        if flags[base + slot] == 0:
            break
    else:
        return _torch_path(writer.token, batch, "no free slot", stream)
    tensors: list[torch.Tensor] = []
    buffer = io.BytesIO()
    try:
        _SkeletonPickler(buffer, tensors).dump(batch)
    except _Unsupported as why:
        return _torch_path(writer.token, batch, f"{why}", stream)
    except Exception as exc:  # torch's path pickles differently: let it succeed or say why
        return _torch_path(writer.token, batch, f"did not pickle ({type(exc).__name__})", stream)
    metas = []
    end = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        metas.append((end, nbytes, tensor.dtype, tuple(tensor.shape)))
        end += -(-nbytes // ALIGN) * ALIGN
    result = _SlotBatch(writer.token, info.id, slot, buffer.getvalue(), metas)
    arena = arenas[slot]
    if arena is None or arena.numel() < end:
        arena = torch.empty(max(int(end * GROWTH), MIN_ARENA), dtype=torch.uint8)
        arena.share_memory_()
        arenas[slot] = arena
        result.arena = arena  # the main process maps it once, when this batch arrives
    flags[base + slot] = 1
    for tensor, (offset, nbytes, dtype, shape) in zip(tensors, metas, strict=True):
        if nbytes:
            arena[offset : offset + nbytes].view(dtype).view(shape).copy_(tensor)
    return result


def slots_per_worker(prefetch_factor: int | None) -> int:
    return (2 if prefetch_factor is None else prefetch_factor) + EXTRA_SLOTS
