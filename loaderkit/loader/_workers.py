"""Worker processes: how they start, are seeded and stop; the engines' inner ``DataLoader``
(private; ``docs/design.md``, "Worker transport").
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import pickle
import re
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torch.utils.data import TensorDataset as TorchTensorDataset

from loaderkit._tags import SeedTag
from loaderkit._worker_info import show_user_dataset
from loaderkit.collate import promote_in_worker
from loaderkit.data.memory import TensorDataset
from loaderkit.errors import WorkerError, WorkerStartError
from loaderkit.loader import _slots
from loaderkit.loader._fetch import identity
from loaderkit.seeding import (
    check_bit_generator,
    derive_seed,
    epoch_worker_init_fn,
    numpy_bit_generator,
    take_bit_generator,
)
from loaderkit.transfer import pin_now

PARENT_POLL_S = 0.25  # how often a worker looks for its parent
DEATH_POLL_S = 1.0  # how often the main process looks for dead workers
ORPHAN_EXIT_CODE = 75  # a worker that found its parent gone (EX_TEMPFAIL)

# What a batch in flight was: (text for the message, its sample indices or None).
Describe = Callable[[int, int], tuple[str, Any]]

SHARE_MIN_BYTES = 1 << 20  # tensors moved to shared memory before pickled workers start
_TOO_MANY_WORKERS = "This DataLoader will create"  # torch's warning of more workers than cores
_announced_forkserver = False

FORKSERVER_NOTICE = (
    "ResumableDataLoader: inside a torch.distributed process group, worker processes start "
    "by 'forkserver' (fork can deadlock on gloo/NCCL threads), so the dataset, collate_fn and "
    "worker_init_fn must pickle, and a script's top-level code needs an `if __name__ == "
    "'__main__':` guard. Pass multiprocessing_context= to choose the start method."
)


@dataclass(frozen=True, kw_only=True)
class WorkerPool:
    """One loader's worker settings (``DataLoader``'s) and the DataLoaders built from them."""

    num_workers: int
    pin_memory: bool
    timeout: float
    prefetch_factor: int | None
    persistent: bool
    user_init: Callable[[int], None] | None  # runs after loaderkit seeds the worker
    start_method: Any
    cores: int = 1  # this rank's share of the node's cores
    stats: _slots.TransportStats = field(
        default_factory=_slots.TransportStats, compare=False, repr=False
    )

    def context(self) -> Any:
        """How worker processes start: the user's choice, else ``forkserver`` under DDP."""
        if self.start_method is not None or self.num_workers == 0:
            return self.start_method
        if not (dist.is_available() and dist.is_initialized()):
            return None
        ctx = multiprocessing.get_context("forkserver")
        # Heavy imports once in the server; "__main__" lets workers unpickle the script's classes.
        ctx.set_forkserver_preload(["__main__", "torch", "loaderkit"])
        global _announced_forkserver
        if not _announced_forkserver:
            _announced_forkserver = True
            warnings.warn(FORKSERVER_NOTICE, RuntimeWarning, stacklevel=2)
        return ctx

    def method_name(self) -> str:
        ctx = self.context()
        if ctx is None:
            return str(multiprocessing.get_start_method())
        return ctx if isinstance(ctx, str) else str(ctx.get_start_method())

    def init_fn(
        self, seed: int, epoch: int, rank: int, keyed: bool = False
    ) -> Callable[[int], None]:
        """``epoch``'s ``worker_init_fn`` (restarted workers must not replay an earlier epoch);
        ``keyed``: its samples draw under per-sample seeds, as in this process."""
        seeding = epoch_worker_init_fn(
            derive_seed(seed, SeedTag.WORKERS, epoch), rank, self.user_init
        )
        # A worker not forked starts in float32 and MT19937: numbers are made as in this process.
        here = (torch.get_default_dtype(), numpy_bit_generator() if keyed else None)
        return functools.partial(start_worker, os.getpid(), seeding, here)

    def base_seed(self, seed: int, epoch: int) -> torch.Generator:
        """The workers' ``get_worker_info().seed`` source: new each epoch unless persistent."""
        keys = () if self.persistent else (epoch,)
        return torch.Generator().manual_seed(derive_seed(seed, SeedTag.BASE, *keys))

    def build(
        self,
        dataset: Dataset[Any],
        *,
        seed: int,
        epoch: int,
        rank: int,
        batch_sampler: Iterable[Any] | None = None,
        persistent: bool | None = None,
        keyed: bool = False,
    ) -> DataLoader[Any]:
        """A DataLoader of ``dataset``'s items, already batches (no ``batch_sampler``: iterable);
        ``keyed`` as :meth:`init_fn`'s."""
        if self.num_workers > 0 and self.method_name() != "fork":
            share_tensors(getattr(dataset, "user_dataset", dataset))
        inner = _WorkerLoader(
            self,
            dataset,
            batch_size=None if batch_sampler is None else 1,
            batch_sampler=cast("Iterable[list[Any]] | None", batch_sampler),
            num_workers=self.num_workers,
            collate_fn=identity,
            pin_memory=pin_now(self.pin_memory),
            timeout=self.timeout,
            worker_init_fn=self.init_fn(seed, epoch, rank, keyed),
            multiprocessing_context=self.context(),
            generator=self.base_seed(seed, epoch),
            prefetch_factor=self.prefetch_factor,
            persistent_workers=self.persistent if persistent is None else persistent,
        )
        inner.numpy_made = numpy_bit_generator() if keyed else None
        return inner


class _WorkerLoader(DataLoader[Any]):
    """The inner DataLoader: batches cross through slots; names what failed to pickle."""

    def __init__(self, pool: WorkerPool, *args: Any, **kwargs: Any) -> None:
        with warnings.catch_warnings():
            # ResumableDataLoader said it once, at its caller's line.
            warnings.filterwarnings("ignore", message=_TOO_MANY_WORKERS, category=UserWarning)
            super().__init__(*args, **kwargs)
        self._loaderkit_pool = pool
        self.numpy_made: type | None = None  # numpy's bit generator keyed workers start with

    def _get_iterator(self) -> Any:
        transport = None
        if self.num_workers > 0 and _slots.ENABLED:
            # New slots per worker iterator (its workers are new); pinned when this loader pins.
            transport = _slots.Transport(
                self.num_workers,
                _slots.slots_per_worker(self.prefetch_factor),
                pin=self.pin_memory,
                stats=self._loaderkit_pool.stats,
                cores=self._loaderkit_pool.cores,
            )
            stream = isinstance(self.dataset, IterableDataset)  # an engine's stream of items
            self.collate_fn = functools.partial(_slots.pack, transport.writer(), stream=stream)
        else:
            self.collate_fn = identity
        try:
            with warnings.catch_warnings():
                # torch's own hint for this failure; the error raised below names the object.
                warnings.filterwarnings("ignore", message="Got pickle error", category=UserWarning)
                warnings.filterwarnings("ignore", message=_TOO_MANY_WORKERS, category=UserWarning)
                workers: Any = super()._get_iterator()
            if transport is not None:
                workers._loaderkit_transport = transport  # maps its arenas while it lives
            # Index queues held outside any cycle until ``workers`` goes, so its shutdown reaches
            # each worker (docs/design.md, "Worker transport").
            queues = getattr(workers, "_index_queues", None)  # none without workers
            if queues is not None:
                weakref.finalize(workers, _held, queues).atexit = False
            return workers
        except Exception as exc:
            if not _is_pickling_error(exc):
                raise
            raise unpicklable(self._loaderkit_pool, self.dataset, exc) from exc


def _is_pickling_error(exc: BaseException) -> bool:
    # Python names the failure in its text only ("Can't pickle local object ...").
    text = str(exc)
    return isinstance(exc, pickle.PicklingError) or (
        isinstance(exc, AttributeError | TypeError)
        and ("pickle" in text.lower() or "local object" in text)
    )


# Attribute names of loaderkit's wrappers, as the user knows them.
_PART_NAMES = {
    "dataset": "the dataset",
    "user_dataset": "the dataset",
    "collate_fn": "collate_fn",
    "collate": "collate_fn",
    "user_init": "worker_init_fn",
}


def _first_unpicklable(obj: Any, name: str, depth: int = 0) -> tuple[str, Any, Exception] | None:
    """``(name, object, error)`` of the innermost part of ``obj`` that does not pickle."""
    try:
        ForkingPickler.dumps(obj)
    except Exception as exc:
        if depth < 4 and type(obj).__module__.startswith("loaderkit.") and hasattr(obj, "__dict__"):
            for attr, value in vars(obj).items():
                found = _first_unpicklable(value, _PART_NAMES.get(attr, attr), depth + 1)
                if found is not None:
                    return found
        return name, obj, exc
    return None


def unpicklable(pool: WorkerPool, dataset: Any, exc: BaseException) -> WorkerStartError:
    """The :class:`WorkerStartError` naming what did not pickle, and the fixes."""
    method = pool.method_name()
    if pool.start_method is not None:
        why = f"multiprocessing_context={pool.start_method!r}"
    elif method == "forkserver" and pool.context() is not None:
        why = "loaderkit's choice inside a torch.distributed process group"
    else:
        why = "this platform's default"
    init = _first_unpicklable(pool.user_init, "worker_init_fn")
    found = init or _first_unpicklable(dataset, "the dataset")
    if found is None:
        what, detail = "the dataset, collate_fn or worker_init_fn", str(exc)
    else:
        name, obj, error = found
        label = getattr(obj, "__qualname__", None) or type(obj).__qualname__
        what, detail = f"{name} ({label})", f"{type(error).__name__}: {error}"
    return WorkerStartError(
        f"ResumableDataLoader: worker processes start by {method!r} ({why}), which pickles "
        f"what they run, and {what} cannot be pickled ({detail}). Define it at module level "
        "(not a lambda or a local class or function), or pass multiprocessing_context='fork' "
        "or num_workers=0."
    )


def share_tensors(dataset: Any) -> int:
    """Move a (subset of a) tensor dataset's large CPU tensors to shared memory; count them."""
    for _ in range(8):  # a Subset of a Subset of ...: bounded, never a cycle
        if isinstance(dataset, TensorDataset | TorchTensorDataset):
            break
        dataset = getattr(dataset, "dataset", None)
        if dataset is None:
            return 0
    else:
        return 0
    moved = 0
    for tensor in dataset.tensors:
        if (
            isinstance(tensor, torch.Tensor)
            and tensor.device.type == "cpu"
            and not tensor.is_shared()
            and tensor.untyped_storage().nbytes() >= SHARE_MIN_BYTES
        ):
            tensor.share_memory_()
            moved += 1
    return moved


def stop_workers(inner: DataLoader[Any], workers: Iterator[Any]) -> None:
    """Shut down the worker processes behind ``workers`` now, not at garbage collection."""
    owner = getattr(workers, "_loaderkit_pid", None)
    if owner is not None and owner != os.getpid():
        return  # a forked worker's inherited copy: those workers are not its to stop
    shutdown = getattr(workers, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()
    transport = getattr(workers, "_loaderkit_transport", None)
    if transport is not None:  # the workers stopped: unmap their slots' arenas
        transport.close()
    if inner._iterator is workers:  # a persistent iterator must not be reused once stopped
        inner._iterator = None


def _held(*_: Any) -> None:
    """What :func:`weakref.finalize` calls once the objects it held may go."""


def outdated(inner: DataLoader[Any] | None) -> bool:
    """Whether ``inner``'s workers draw keyed samples under a numpy bit generator this process
    no longer has (set here since they started)."""
    made = inner.numpy_made if isinstance(inner, _WorkerLoader) else None
    return made is not None and made is not numpy_bit_generator()


def stop_inner(inner: DataLoader[Any] | None) -> None:
    """Stop the persistent workers of ``inner``, if it has any."""
    if inner is not None and inner._iterator is not None:
        stop_workers(inner, inner._iterator)


# ------------------------------------------------------------------ in the worker
def start_worker(
    parent: int, init: Callable[[int], None], here: tuple[torch.dtype, type | None], worker_id: int
) -> None:
    """Every worker's ``worker_init_fn``: watch the parent, take its default dtype (and numpy
    bit generator, for keyed draws), then seed (and the user's init)."""
    watch_parent(parent)
    promote_in_worker()  # a user's collate_fn calling default_collate: as in the main process
    torch.set_default_dtype(here[0])
    if here[1] is not None:
        take_bit_generator(here[1])
    show_user_dataset()  # before the user's worker_init_fn (called by ``init``) runs
    init(worker_id)
    if here[1] is not None:
        check_bit_generator(here[1])


def watch_parent(parent: int, interval: float = PARENT_POLL_S) -> threading.Thread:
    """Exit this process within ``interval`` seconds of its parent's death."""
    # torch checks only between tasks, so a stuck worker lived on.
    ppid = os.getppid()

    def loop() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != ppid or not process_alive(parent):
                os._exit(ORPHAN_EXIT_CODE)

    thread = threading.Thread(target=loop, name="loaderkit-parent-watch", daemon=True)
    thread.start()
    return thread


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: kill() said it exists
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


# --------------------------------------------------------------- in the main process
_TORCH_FAILURE = re.compile(
    r"DataLoader worker \(pid|DataLoader timed out after|Pin memory thread exited unexpectedly"
)


def _poll(ref: weakref.ref[Any], timeout: float = DEATH_POLL_S) -> Any:
    workers = ref()
    assert workers is not None
    return type(workers)._try_get_data(workers, timeout)


def _take_over_failure_checks(workers: Any) -> None:
    """Make a dead worker surface in ``next()``, not in torch's SIGCHLD handler (anywhere)."""
    if getattr(workers, "_loaderkit_guarded", False) or not hasattr(workers, "_task_info"):
        return
    workers._loaderkit_pid = os.getpid()
    if getattr(workers, "_worker_pids_set", False):
        from torch.utils.data._utils import signal_handling

        signal_handling._remove_worker_pids(id(workers))
        workers._worker_pids_set = False
    # Weakly bound: a self-reference would leave the iterator to the cycle collector.
    workers._try_get_data = functools.partial(_poll, weakref.ref(workers))
    workers._loaderkit_guarded = True
    workers._loaderkit_oom = oom_kills()


def guard_workers(workers: Iterator[Any], describe: Describe) -> Generator[Any, None, None]:
    """The batches of ``workers``; a dead worker or a timeout becomes a :class:`WorkerError`."""
    _take_over_failure_checks(workers)
    while True:
        try:
            batch = next(workers)
        except StopIteration:
            return
        except RuntimeError as exc:
            if isinstance(exc, WorkerError) or not _TORCH_FAILURE.search(str(exc)):
                raise
            raise worker_failure(workers, exc, describe) from exc
        except (OSError, EOFError) as exc:
            # A worker dying mid-unpickle breaks its connection: a dead worker explains it.
            if not _any_dead(workers):
                raise
            raise worker_failure(workers, exc, describe) from exc
        yield batch


def start_workers(inner: DataLoader[Any], describe: Describe) -> Iterator[Any]:
    """``iter(inner)``; a persistent worker that died while idle is a :class:`WorkerError`,
    and its workers stop, so the next iteration starts new ones."""
    try:
        return iter(inner)
    except RuntimeError as exc:
        workers = inner._iterator
        if workers is None or isinstance(exc, WorkerError) or not _TORCH_FAILURE.search(str(exc)):
            raise
        error = worker_failure(workers, exc, describe, starting=True)
        stop_workers(inner, workers)
        raise error from exc


def _any_dead(workers: Any, wait: float = 2.0) -> bool:
    """Whether a worker ended (within ``wait`` s: the error can arrive before the exit status)."""
    procs = list(getattr(workers, "_workers", []))
    deadline = time.monotonic() + wait
    while procs:
        if any(not p.is_alive() for p in procs):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return False


def _in_flight(workers: Any, worker: int) -> list[int]:
    info: dict[int, tuple[Any, ...]] = getattr(workers, "_task_info", {})
    return sorted(task for task, entry in info.items() if len(entry) == 1 and entry[0] == worker)


def _how_it_ended(exitcode: int | None, oom: bool) -> str:
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        seen = "and it did: the cgroup's oom_kill count rose" if oom else "see dmesg"
        why = {
            "SIGSEGV": "a segmentation fault: a crash in native code the dataset calls",
            "SIGBUS": "a bus error: a memory-mapped file (a shard?) was truncated while read",
            "SIGKILL": f"the kernel's out-of-memory killer sends it ({seen}), as does `kill -9`",
            "SIGABRT": "an abort: a failed assertion in native code",
            "SIGTERM": "another process asked it to stop",
        }.get(name, "")
        return f"was killed by {name}" + (f" ({why})" if why else "")
    if exitcode == 1:  # Python's status for an exception no one caught
        return (
            "exited with code 1: an uncaught exception outside the batch loading (traceback "
            "on stderr; under spawn or forkserver, a script's unguarded top-level code runs "
            "again there, and a class or function defined under `if __name__ == '__main__':` "
            "cannot be loaded: define it at top level), or sys.exit(1)"
        )
    return (
        f"exited with code {exitcode} without raising an error (os._exit() or sys.exit() "
        "inside the dataset, collate_fn or worker_init_fn?)"
    )


def worker_failure(
    workers: Any, exc: BaseException, describe: Describe, *, starting: bool = False
) -> WorkerError:
    """The :class:`WorkerError` for torch's report ``exc`` of a dead worker or a timeout
    (``starting``: as the epoch's workers were started)."""
    procs = list(getattr(workers, "_workers", []))
    dead = [w for w, p in enumerate(procs) if not p.is_alive()]
    timed_out = "timed out" in str(exc)
    before = getattr(workers, "_loaderkit_oom", None)
    now = oom_kills()
    oom = before is not None and now is not None and now > before
    parts: list[str] = []
    indices: list[Any] = []
    for w in dead if not timed_out else range(len(procs)):
        proc = procs[w]
        loading = []
        for task in _in_flight(workers, w):
            text, idx = describe(task, w)
            loading.append(text)
            if idx is not None:
                indices.append(idx)
        what = "; ".join(loading) if loading else "no batch (it was idle)"
        if timed_out:
            parts.append(f"worker {w} (pid {proc.pid}) held {what}")
        else:
            how = _how_it_ended(proc.exitcode, oom)
            parts.append(f"worker {w} (pid {proc.pid}) {how}; batches it had not delivered: {what}")
    if timed_out:
        timeout = getattr(workers, "_timeout", "?")
        message = (
            f"no batch arrived from the DataLoader workers within timeout={timeout} s: "
            + "; ".join(parts)
            + ". Load those samples with num_workers=0 to see where they hang, or raise timeout=."
        )
    elif not dead:
        message = (
            f"{exc}; no worker process is dead now, so the batches in flight are unknown. "
            "Load with num_workers=0 to reproduce the failure in this process."
        )
    else:
        fix = (
            "Give the workers more memory (fewer workers, a smaller prefetch_factor or batch)"
            if oom
            else "Load those samples with num_workers=0 to reproduce the failure here (or give "
            "the workers more memory if the kernel killed them for it)"
        )
        if starting and not oom:  # died idle: nothing of the epoch was loaded
            fix = (
                "The epoch has not begun: iterate the loader again for new workers (under a "
                "Trainer, resume the fit from its last checkpoint)"
            )
        message = "DataLoader " + "; ".join(parts) + f". {fix}."
    return WorkerError(message, index=indices[0] if len(indices) == 1 else indices or None)


def oom_kills() -> int | None:
    """This process's cgroup's count of out-of-memory kills (None where it cannot be read)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            candidates.append(Path("/sys/fs/cgroup", path.lstrip("/"), "memory.events"))
        elif "memory" in controllers.split(","):
            candidates.append(Path("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.oom_control"))
    for candidate in candidates:
        try:
            text = candidate.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None
