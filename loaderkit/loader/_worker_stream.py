"""One worker's stream of an ``IterableDataset`` (private): opened at its saved record (an own
state, else a replay checked by digest), batched, and recorded after every batch."""

from __future__ import annotations

import contextlib
import copy
import inspect
import pickle
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from loaderkit.collate import promoting_collate
from loaderkit.errors import StateMismatchError
from loaderkit.loader._engine import EngineSource
from loaderkit.loader._fetch import FailedBatch, collate_said, worker_error_from
from loaderkit.loader._rng_state import rng_state, set_rng_state
from loaderkit.seeding import rngs_put_back

OWNER = "ResumableDataLoader"
RECORD = (  # a worker's place, as saved
    *("batches", "yielded", "failed", "digest", "ended"),
    *("dataset_state", "iterator_state", "rng", "end_state"),
)
BATCH, END = "batch", "end"


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` has ``state_dict()`` and ``load_state_dict()`` (torchdata's ``Stateful``)."""
    return all(callable(getattr(obj, name, None)) for name in ("state_dict", "load_state_dict"))


def fresh_record() -> dict[str, Any]:
    """A worker that has handed out nothing."""
    return {**dict.fromkeys(RECORD), "batches": 0, "yielded": 0, "failed": 0, "ended": False}


def sample_digest(sample: Any) -> int:
    """A CRC-32 of a sample's values (never object identities: it is compared across runs)."""
    state = [0]

    def feed(data: bytes) -> None:
        state[0] = zlib.crc32(data, state[0])

    def walk(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().to("cpu").contiguous()
            feed(f"T{t.dtype}{tuple(t.shape)}".encode())
            if t.numel():
                feed(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(obj, np.ndarray) and obj.dtype != object:
            feed(f"A{obj.dtype.str}{obj.shape}".encode())
            feed(np.ascontiguousarray(obj).tobytes())
        elif isinstance(obj, str | bytes | int | float | complex | bool | type(None)):
            feed(f"{type(obj).__name__}:{obj!r}".encode())
        elif isinstance(obj, dict):
            feed(b"{")
            for key, value in obj.items():
                walk(key)
                walk(value)
            feed(b"}")
        elif isinstance(obj, list | tuple):
            feed(f"{type(obj).__name__}[".encode())
            for item in obj:
                walk(item)
            feed(b"]")
        else:
            try:
                feed(pickle.dumps(obj, protocol=4))
            except Exception:
                feed(f"<{type(obj).__qualname__}>".encode())

    walk(sample)
    return state[0]


def take(it: Iterator[Any], count: int, items: list[Any]) -> None:
    """Append up to ``count`` items of ``it`` to ``items``."""
    # By next() alone: islice calls iter(), which restarts a dataset that is its own iterator.
    for _ in range(count):
        try:
            items.append(next(it))
        except StopIteration:
            break


def open_stream(
    dataset: Any,
    start: dict[str, Any],
    worker: int,
    *,
    in_process: bool,
    source: EngineSource | None = None,
) -> Any:
    """``iter(dataset)`` placed after ``start`` (a worker's record)."""
    # The dataset's state before iter(), the iterator's after it (torchdata's order), then a
    # worker's RNGs; a dataset that is its own iterator first goes where its last epoch ended.
    if start["end_state"] is not None:
        # RNGs put back: the uninterrupted run calls iter() once for this epoch.
        with rngs_put_back():
            iter(dataset).load_state_dict(start["end_state"])
    if start["dataset_state"] is not None and is_stateful(dataset):
        dataset.load_state_dict(start["dataset_state"])
    it = iter(dataset)
    if start["iterator_state"] is not None and is_stateful(it):
        it.load_state_dict(start["iterator_state"])
    yielded, failures = int(start["yielded"]), int(start["failed"] or 0)
    restored = start["dataset_state"] is not None or start["iterator_state"] is not None
    if (yielded or failures) and not restored:
        assert source is not None  # a fresh record (priming) has nothing to skip
        # A worker's collate_fn draws from the global RNGs its stream draws from.
        collate = None if in_process else source.collate
        _skip(it, (yielded, failures), start["digest"], worker, source.batch_size, collate)
    if start.get("rng") is not None and not in_process:
        set_rng_state(start["rng"])
    return it


def worker_batches(
    source: EngineSource,
    worker: int,
    start: dict[str, Any],
    *,
    in_process: bool,
    opened: Any = None,
) -> Iterator[tuple[str, int, dict[str, Any] | None, Any]]:
    """One worker's ``(kind, worker, record after, batch)`` from ``start``, then an end mark."""
    dataset, batch_size, drop_last = source.user_dataset, source.batch_size, source.drop_last
    if start["ended"]:  # it had handed out everything before the state was saved
        yield END, worker, None, None
        return
    if opened is None:
        opened = open_stream(dataset, start, worker, in_process=in_process, source=source)
    it = opened
    rec = Recorder(dataset, it, start, in_process=in_process)
    while True:
        samples: list[Any] = []
        try:
            take(it, batch_size, samples)
        except Exception as exc:
            # Raised in the batch's place, as DataLoader does; the stream goes on, unless the
            # raise closed its generator: then a resume must not open a new one from the state.
            rec.yielded, rec.failed = rec.yielded + len(samples), rec.failed + 1
            closed = inspect.isgenerator(it) and inspect.getgeneratorstate(it) == inspect.GEN_CLOSED
            record = rec.after(samples, ended=closed)
            yield BATCH, worker, record, FailedBatch(_stream_error(exc, worker, rec.yielded))
            if closed:
                break
            continue
        if not samples or (len(samples) < batch_size and drop_last):
            break
        rec.yielded += len(samples)
        try:
            batch = source.collate(samples)  # before the RNGs are read: a collate_fn may draw too
        except Exception as exc:
            who = "the main process" if in_process else f"worker {worker}"
            where = (
                f"collate_fn failed on the batch of {len(samples)} samples {who} read after "
                f"{rec.yielded - len(samples)} of its stream"
            )
            said = collate_said(exc, own=source.collate is promoting_collate)
            batch = FailedBatch(worker_error_from(where + said, exc))
        # A short batch: the stream ran out; a position saved here must not replay it.
        ended = len(samples) < batch_size
        yield BATCH, worker, rec.after(samples, ended=ended), batch
        if ended:
            break
    # After the end: a dataset may count its epochs once its stream is exhausted.
    yield END, worker, {"dataset_state": rec.dataset_state(), "end_state": rec.end_state()}, None


class Recorder:
    """A worker's record after each batch: what the main process keeps once it hands it out."""

    def __init__(self, dataset: Any, it: Any, start: dict[str, Any], *, in_process: bool) -> None:
        self.dataset, self.it, self.in_process = dataset, it, in_process
        self.yielded, self.failed = int(start["yielded"]), int(start["failed"] or 0)
        self.digest = start["digest"]
        # A dataset that is its own iterator is saved once, as the iterator.
        self.stateful_dataset = is_stateful(dataset) and it is not dataset
        self.stateful_iter = is_stateful(it)
        self.own_iterator = self.stateful_iter and it is dataset
        # In a worker the global RNGs follow the position (in-process they are the caller's).
        self.keep_rng = not in_process and (self.stateful_dataset or self.stateful_iter)

    def _state(self, obj: Any) -> Any:
        # In-process a state is copied, or the dataset's next batch would change the one kept.
        state = obj.state_dict()
        return copy.deepcopy(state) if self.in_process else state

    def dataset_state(self) -> Any:
        return self._state(self.dataset) if self.stateful_dataset else None

    def end_state(self) -> Any:
        return self._state(self.it) if self.own_iterator else None

    def after(self, samples: list[Any], *, ended: bool = False) -> dict[str, Any]:
        if samples:
            self.digest = sample_digest(samples[-1])
        return {
            "ended": ended,
            "end_state": self.end_state() if ended else None,
            "yielded": self.yielded,
            "failed": self.failed,
            "digest": self.digest,
            "dataset_state": self.dataset_state(),
            "iterator_state": self._state(self.it) if self.stateful_iter else None,
            "rng": rng_state() if self.keep_rng else None,
        }


def _stream_error(exc: Exception, worker: int, yielded: int) -> Exception:
    """The error of a stream that raised, still caught by ``except`` of its type."""
    return worker_error_from(
        f"reading worker {worker}'s stream of the IterableDataset after its {yielded} samples "
        f"failed with {type(exc).__name__}: {exc}; fix the dataset's __iter__ (traceback "
        "chained above).",
        exc,
    )


def _skip(
    it: Iterator[Any],
    saved: tuple[int, int],
    digest: int | None,
    worker: int,
    batch_size: int,
    collate: Callable[[list[Any]], Any] | None,
) -> None:
    """Replay a worker's stream past ``saved`` (samples, raising pulls) as worker_batches pulled
    it, collating each batch; the last sample is checked against ``digest``."""
    count, failures = saved
    seen, raised, last = 0, 0, None
    while seen < count or raised < failures:
        samples: list[Any] = []
        try:
            take(it, batch_size, samples)
        except Exception:
            raised += 1
            failed = True
        else:
            failed = False
        seen, last = seen + len(samples), samples[-1] if samples else last
        if raised > failures or seen > count:
            break  # not the saved stream: refused below
        if failed:
            continue
        if not samples:
            break
        if collate is not None:  # the run's draws: the worker's RNGs end where they stood
            with contextlib.suppress(Exception):  # the run handed it out as a failed batch
                collate(samples)
        if len(samples) < batch_size:
            break
    replayed = f"{OWNER}.load_state_dict: replaying worker {worker}'s stream of the IterableDataset"
    if (seen, raised) != (count, failures):
        raise StateMismatchError(
            f"{replayed} gave {seen} samples and {raised} errors where the saved run had {count} "
            f"and {failures}. Resume with the same data and num_workers, or give the dataset "
            "state_dict()/load_state_dict()."
        )
    if digest is not None and sample_digest(last) != digest:
        raise StateMismatchError(
            f"{replayed} gave a different sample at position {count - 1} than the saved run. "
            "Make its order, and in the main process its draws from the global RNGs, a function "
            "of the data and the seed, not of its earlier passes (or use num_workers >= 1 "
            "without persistent_workers), or give the dataset (or its iterator) "
            "state_dict()/load_state_dict()."
        )
