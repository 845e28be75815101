"""Streaming sharded data: each (rank, worker) slot reads its own shards, ``mix_shards`` at
a time, and keeps a cursor that resumes by seeking (docs/design.md, streaming datasets)."""

from __future__ import annotations

import itertools
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple, Protocol, cast, runtime_checkable

import numpy as np
import torch
from torch.utils.data import IterableDataset

from loaderkit._checks import check_bool, check_int, check_suffixes
from loaderkit._tags import SeedTag
from loaderkit._worker_info import as_one_worker
from loaderkit.data._codec import (
    decoded_local,
    decoded_name,
    default_cache_root,
    is_compressed,
    verify_local,
)
from loaderkit.data._open import (
    loaderkit_reads,
    names_crc32,
    prepare_reader,
    resolve_shards,
    shard_name,
)
from loaderkit.data._written import check_written
from loaderkit.data.readers import DTYPE_SUFFIX, ShardReader, check_pinned, pinned_dtype
from loaderkit.data.remote import RemoteCache, RemoteShard, remote_source, shard_paths
from loaderkit.errors import (
    LoaderkitError,
    MissingDependencyError,
    ReaderSettingError,
    ShardChangedError,
    ShardError,
)
from loaderkit.plan.shard import DEFAULT_MIX
from loaderkit.seeding import derive_seed, seeded_sample

# The public names; Cursor and slot_stream serve the stream engine (loaderkit.loader).
__all__ = ["IterableReader", "StreamReader", "StreamingShardedDataset"]

_OFFSET_BITS = 40  # a sample's seeding key is shard << 40 | offset
EMPTY_PASSES = 32  # consecutive passes without a sample before a slot is declared starved
_END = object()  # a lane's shard has no sample left
_OWNER = "StreamingShardedDataset"


@runtime_checkable
class StreamReader(Protocol):
    """A picklable format read front to back (any :class:`ShardReader` works too)."""

    @property
    def suffixes(self) -> tuple[str, ...]:
        """File suffixes of the format, to list a directory of shards."""
        ...

    def iter_from(self, shard: Any, offset: int) -> Iterator[Any]:
        """The samples of ``shard`` from ``offset`` on."""
        ...


class IterableReader:
    """A :class:`StreamReader` from a function ``shard -> iterable of samples``.

    Resuming at ``offset`` drops the first ``offset`` samples; ``fn`` must pickle.

    Args:
        fn: Opens a shard and yields its samples.
        suffixes: File suffixes, to list a directory of shards.

    Example:
        >>> import gzip, json, tempfile
        >>> def read_jsonl_gz(path):
        ...     with gzip.open(path, "rt") as f:
        ...         yield from map(json.loads, f)
        >>> d = Path(tempfile.mkdtemp())
        >>> with gzip.open(d / "a.jsonl.gz", "wt") as f:
        ...     _ = f.write('{"t": 1}\\n{"t": 2}\\n')
        >>> list(IterableReader(read_jsonl_gz, suffixes=(".gz",)).iter_from(d / "a.jsonl.gz", 1))
        [{'t': 2}]
    """

    def __init__(self, fn: Callable[[Any], Iterable[Any]], suffixes: Iterable[str] = ()) -> None:
        if not callable(fn):
            raise TypeError(
                f"IterableReader: fn must be callable, got {fn!r}; pass a module-level function."
            )
        self.fn = fn
        self.suffixes = check_suffixes("suffixes", suffixes, owner="IterableReader")

    def __repr__(self) -> str:
        return f"IterableReader({getattr(self.fn, '__name__', self.fn)!r})"

    def iter_from(self, shard: Any, offset: int) -> Iterator[Any]:
        """The samples of ``shard`` from ``offset`` on; ``fn`` sees one DataLoader worker.

        Raises:
            ShardError: the shard ends before ``offset`` (a saved cursor past its end).
        """
        samples = as_one_worker(self.fn, shard)
        skipped = sum(1 for _ in itertools.islice(samples, offset))
        if skipped < offset:
            raise _past_end(shard, offset, skipped)
        yield from samples


def _reader_key(reader: Any) -> Any:
    """What a cursor's offsets depend on in ``reader``: its ``spec()`` as JSON reads it back
    (as a checkpoint stores it), else its class name."""
    if callable(getattr(reader, "spec", None)):
        return json.loads(json.dumps(reader.spec(), sort_keys=True, default=str))
    return type(reader).__qualname__  # not its module: __main__ in a script, a name imported


def _past_end(shard: Any, offset: int, length: int) -> ShardError:
    return ShardError(
        f"shard {shard_name(shard)} holds {length} samples, but the cursor resumes it at "
        f"sample {offset}; restore the shard, or start the loader without the saved state.",
        path=shard,
    )


def _seek_by_index(
    reader: Any, shard: Any, offset: int, pinned: str | None = None, listed: Any = None
) -> Iterator[Any]:
    """``iter_from`` for a :class:`ShardReader` (counting once if it needs a sidecar);
    ``pinned``: the token dtype it was listed with; ``listed``: the shard as listed, for
    errors (``shard`` may be its decoded or downloaded copy)."""
    try:
        handle = reader.open(shard)
    except Exception:
        if not (isinstance(shard, Path) and shard.exists() and callable(reader.count)):
            raise
        reader.count(shard)  # e.g. JsonlReader's line offsets, written on first count
        handle = reader.open(shard)
    try:
        check_pinned(handle, pinned, shard_name(listed or shard), listed or shard)
        if offset > len(handle):
            raise _past_end(shard, offset, len(handle))
        for i in range(offset, len(handle)):
            yield handle.read(i)
    finally:
        close = getattr(handle, "close", None)
        if callable(close):
            close()


class Cursor(NamedTuple):
    """Where one slot stands in pass ``pass_``: its ``next`` shard to start, open ``lanes``
    ``(shard position, offset)``, the lane whose ``turn`` it is, samples ``seen``."""

    pass_: int
    next: int
    lanes: tuple[tuple[int, int], ...]
    turn: int
    seen: int

    @classmethod
    def start(cls, pass_: int) -> Cursor:
        return cls(pass_, 0, (), 0, 0)

    def to_state(self) -> list[Any]:
        return [self.pass_, self.next, [list(lane) for lane in self.lanes], self.turn, self.seen]

    @classmethod
    def from_state(cls, saved: Any) -> Cursor:
        pass_, nxt, lanes, turn, seen = saved
        lanes = tuple((int(p), int(o)) for p, o in lanes)
        return cls(int(pass_), int(nxt), lanes, int(turn), int(seen))


def _check_args(
    shards: Any,
    reader: Any,
    shuffle_shards: Any,
    mix_shards: Any,
    steps_per_epoch: Any,
    samples_per_epoch: Any,
    transform: Any,
) -> tuple[int, tuple[str, ...]]:
    if not any(callable(getattr(reader, m, None)) for m in ("iter_from", "open")):
        raise TypeError(
            "StreamingShardedDataset: reader must have iter_from(shard, offset) (a "
            "StreamReader such as IterableReader) or open(shard) (a ShardReader such as "
            f"TokenReader), got {type(reader).__name__}."
        )
    check_bool("shuffle_shards", shuffle_shards, owner=_OWNER)
    fix = f"pass the shards a slot reads at once, e.g. {DEFAULT_MIX}, or 1"
    mix_shards = check_int("mix_shards", mix_shards, 1, owner=_OWNER, fix=fix, numpy_ok=True)
    if steps_per_epoch is not None and samples_per_epoch is not None:
        raise ValueError(
            "StreamingShardedDataset: pass steps_per_epoch or samples_per_epoch, not both "
            f"(got {steps_per_epoch} and {samples_per_epoch})."
        )
    for name, value, what in [
        ("steps_per_epoch", steps_per_epoch, "the batches each rank takes per epoch"),
        ("samples_per_epoch", samples_per_epoch, "the samples of an epoch over all ranks"),
    ]:
        if value is not None:
            fix = f"pass {what}, or None for one pass"
            check_int(name, value, 1, owner=_OWNER, fix=fix, numpy_ok=True)
    if transform is not None and not callable(transform):
        raise TypeError(
            f"StreamingShardedDataset: transform must be callable, got {transform!r}; pass a "
            "module-level function, or None."
        )
    if not hasattr(reader, "suffixes") and isinstance(shards, str | os.PathLike):
        raise ValueError(
            f"StreamingShardedDataset: shards={str(shards)!r} is a directory, but the "
            f"reader {type(reader).__name__} has no suffixes to list it by; give the "
            "reader suffixes (IterableReader(fn, suffixes=(...))) or pass a list of shards."
        )
    suffixes = getattr(reader, "suffixes", ())
    return mix_shards, check_suffixes("reader.suffixes", suffixes, owner=_OWNER)


def _bytes_crc32(shards: list[Any], stamps: list[tuple[int, int]] | None) -> int | None:
    """crc32 of the shards' sizes (and versions at URLs) a cursor holds for (None: objects)."""
    if all(isinstance(s, RemoteShard) for s in shards):
        return zlib.crc32(repr([(s.size, s.version) for s in shards]).encode())
    if stamps is not None:
        return zlib.crc32(repr([size for size, _ in stamps]).encode())
    return None


def _header_dtype(path: Path) -> str | None:
    """The dtype a raw token shard's header holds now (a compressed one's own header wins over
    its plain name's, as when it is decoded); None without one."""
    found = pinned_dtype(path)
    if not found and is_compressed(path.name):
        found = pinned_dtype(path.with_name(decoded_name(path.name)))
    return found.get("dtype")


def _headers_crc32(shards: list[Any], dtypes: list[str | None] | None) -> int | None:
    """crc32 of the token dtype headers a cursor's offsets count in (at URLs: their versions)."""
    if all(isinstance(s, RemoteShard) for s in shards):
        sides = [[x for x in s.sidecars if x[0].endswith(DTYPE_SUFFIX)] for s in shards]
        # Versions, and what a header holds where its version cannot tell a rewrite.
        return zlib.crc32(repr([sides, dtypes]).encode()) if any(sides) else None
    if dtypes is None or not any(dtypes):
        return None
    return zlib.crc32(repr(dtypes).encode())


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _object_name(shard: Any, depth: int = 3) -> str:
    """A shard object's repr; where it holds an address (other in every process), the class
    and state of each object without a repr of its own instead."""
    text = repr(shard)
    if depth == 0 or not _ADDRESS.search(text):
        return _ADDRESS.sub("", text)
    if isinstance(shard, tuple | list):
        return f"{type(shard).__name__}({', '.join(_object_name(s, depth - 1) for s in shard)})"
    if isinstance(shard, dict):
        inner = ", ".join(f"{k!r}: {_object_name(v, depth - 1)}" for k, v in shard.items())
        return f"dict({inner})"
    state, cls = getattr(shard, "__dict__", None), type(shard)
    if cls.__repr__ is not object.__repr__ or not isinstance(state, dict):
        return _ADDRESS.sub("", text)
    items = ", ".join(f"{k}={_object_name(v, depth - 1)}" for k, v in sorted(state.items()))
    return f"{cls.__module__}.{cls.__qualname__}({items})"


class StreamingShardedDataset(IterableDataset[Any]):
    """Shards of unknown length, read as per-(rank, worker) streams that resume exactly.

    Iterate it through :class:`~loaderkit.ResumableDataLoader`. An epoch is one pass over
    all shards (one process only), or ``steps_per_epoch``/``samples_per_epoch`` exactly,
    each slot's stream going on across epochs.

    Args:
        shards: A directory (its files with the reader's suffixes), a list of paths or of
            objects the reader accepts, a folder URL or a list of shard URLs.
        reader: A :class:`StreamReader` or a :class:`~loaderkit.ShardReader` (seeks by index).
        shuffle_shards: Shuffle the shard order per ``(seed, pass)``.
        mix_shards: Shards each slot reads at once, interleaved; 1 reads one at a time.
        steps_per_epoch: Batches per rank per epoch.
        samples_per_epoch: Samples per epoch over all ranks (rounded down to whole global
            batches: ``samples_per_epoch // (world_size * batch_size)`` steps).
        transform: Applied to each sample (seeded under the loader's ``per_sample_seeding``).
        remote: For shards at URLs: a :class:`~loaderkit.RemoteCache` (default one).

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> from loaderkit import ResumableDataLoader, TokenReader, write_shards
        >>> reader = TokenReader(seq_len=2)
        >>> paths = write_shards(tempfile.mkdtemp(), [np.arange(8), np.arange(8, 12)], reader)
        >>> ds = StreamingShardedDataset(paths, reader)
        >>> loader = ResumableDataLoader(ds, batch_size=2, seed=0)
        >>> it = iter(loader); first = next(it); state = loader.state_dict()
        >>> again = ResumableDataLoader(ds, batch_size=2, seed=0)
        >>> again.load_state_dict(state)
        >>> sorted(int(s[0]) for b in [first, *again] for s in b)
        [0, 2, 4, 6, 8, 10]
    """

    def __init__(
        self,
        shards: str | os.PathLike[str] | Iterable[Any],
        reader: Any,
        *,
        shuffle_shards: bool = True,
        mix_shards: int = DEFAULT_MIX,
        steps_per_epoch: int | None = None,
        samples_per_epoch: int | None = None,
        transform: Callable[[Any], Any] | None = None,
        remote: RemoteCache | None = None,
    ) -> None:
        args = (shards, reader, shuffle_shards, mix_shards, steps_per_epoch, samples_per_epoch)
        mix_shards, reader_suffixes = _check_args(*args, transform)
        self._remote = remote_source(shards, reader_suffixes, remote, _OWNER)
        if self._remote is not None:
            self.shards: list[Any] = list(self._remote.shards)
        else:
            suffixes = cast("ShardReader", SimpleNamespace(suffixes=reader_suffixes))
            # An IterableReader reads with the user's function: it may open folders.
            method = "iter_from" if hasattr(reader, "iter_from") else "open"
            files = loaderkit_reads(reader, method) and not isinstance(reader, IterableReader)
            self.shards = resolve_shards(shards, suffixes, owner=_OWNER, files=files)
        # As ShardedDataset: decided once for all files, and the reader the workers get.
        self.reader = prepare_reader(
            reader, self.shards, self._local if self._remote is None else self._remote.footer_source
        )
        self.shuffle_shards, self.mix_shards, self.transform = shuffle_shards, mix_shards, transform
        # Plain ints: they go into every state (a numpy int does not unpickle under weights_only).
        self.steps_per_epoch = None if steps_per_epoch is None else int(steps_per_epoch)
        self.samples_per_epoch = None if samples_per_epoch is None else int(samples_per_epoch)
        paths = shard_paths(self.shards)
        if paths is None:  # objects: by their reprs
            names = zlib.crc32("\n".join(map(_object_name, self.shards)).encode())
        else:
            names = names_crc32(paths)
        settings = ("shuffle_shards", "mix_shards", "steps_per_epoch", "samples_per_epoch")
        # Local files as listed: one rewritten since (between epochs) is refused, not read anew.
        local = all(isinstance(s, Path) for s in self.shards)
        self._stamps = [_stamp(s) for s in self.shards] if local else None
        # A stream keeps no index, but the one write_shards left in a folder holds for it.
        self._written = check_written(self.shards) if local else None
        # The dtype each raw shard's header held when listed: a header rewritten later would
        # read other tokens at the cursor's offsets, so it is refused instead.
        self._dtypes: list[str | None] | None = None
        if self._written is not None:
            # A shard without a header reads in the reader's dtype=: pinned too, so adding a
            # header that agrees with it changes nothing.
            given = getattr(self.reader, "dtype", None)
            given = given.str if isinstance(given, np.dtype) else None
            pins = zip(self.shards, self._written, strict=True)
            self._dtypes = [(w or {}).get("dtype") or _header_dtype(s) or given for s, w in pins]
        elif self._remote is not None:
            self._dtypes = self._remote.header_dtypes()
        self._fingerprint = {
            "num_shards": len(self.shards),
            "shard_names_crc32": names,
            "shard_bytes_crc32": _bytes_crc32(self.shards, self._stamps),
            "dtype_headers_crc32": _headers_crc32(self.shards, self._dtypes),
            **{name: getattr(self, name) for name in settings},
            "reader": _reader_key(self.reader),  # a cursor's offsets count this reader's samples
        }

    def __repr__(self) -> str:
        return f"StreamingShardedDataset({len(self.shards)} shards, {self.reader!r})"

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(
            "StreamingShardedDataset: iterate it through loaderkit.ResumableDataLoader, not a "
            "plain DataLoader (which would give every worker and rank all of it)."
        )

    def describe(self) -> dict[str, Any]:
        """Shards, and for shards at URLs the cache's counts (``remote``, else None)."""
        remote = None if self._remote is None else self._remote.stats()
        return {"shards": len(self.shards), "remote": remote}

    @property
    def limited(self) -> bool:
        """Whether epochs have a fixed number of steps (streams then go on across epochs)."""
        return self.steps_per_epoch is not None or self.samples_per_epoch is not None

    def epoch_steps(self, batch_size: int, world_size: int) -> int | None:
        """Batches per rank per epoch, or ``None`` when an epoch is one pass."""
        if self.steps_per_epoch is not None:
            return self.steps_per_epoch
        if self.samples_per_epoch is None:
            return None
        steps = self.samples_per_epoch // (world_size * batch_size)
        if steps == 0:
            raise ValueError(
                f"StreamingShardedDataset: samples_per_epoch={self.samples_per_epoch} is less "
                f"than one global step of world_size * batch_size = {world_size * batch_size}; "
                "raise samples_per_epoch."
            )
        return steps

    def fingerprint(self) -> dict[str, Any]:
        """What a saved cursor depends on: the shards by count and file names (not paths)."""
        return dict(self._fingerprint)

    def pass_order(self, seed: int, pass_: int) -> list[int]:
        """Shard ids in the order of pass ``pass_``."""
        n = len(self.shards)
        if not self.shuffle_shards:
            return list(range(n))
        g = torch.Generator().manual_seed(derive_seed(seed, SeedTag.STREAM_SHARDS, pass_))
        return torch.randperm(n, generator=g).tolist()

    def slot_shards(self, seed: int, pass_: int, slot: int, slots: int) -> tuple[list[int], bool]:
        """The shards slot ``slot`` of ``slots`` reads in pass ``pass_``, and whether it strides."""
        order = self.pass_order(seed, pass_)
        if len(order) >= slots:
            return order[slot::slots], False
        return order, True

    def _local(self, shard: int) -> Any:
        """Local shard ``shard`` as the reader reads it (a compressed one decoded once)."""
        path = self.shards[shard]
        if isinstance(path, Path) and is_compressed(path.name):
            return decoded_local(path)
        return path

    def read_from(self, shard: int, offset: int) -> Iterator[Any]:
        """The samples of shard id ``shard`` from ``offset`` on; errors name the file."""
        path = self.shards[shard]
        iter_from = getattr(self.reader, "iter_from", None)
        at = offset  # the sample read next: where a failure is
        try:
            listed = None if self._stamps is None else self._stamps[shard]
            if listed is not None and (now := _stamp(path)) != listed:
                raise ShardChangedError(
                    f"shard {shard_name(path)} changed after the dataset listed it (now {now[0]} "
                    f"bytes, mtime {now[1]} ns; listed: {listed[0]} bytes, {listed[1]} ns); "
                    "restart the run with the dataset made again.",
                    path=path,
                )
            written = (None if self._written is None else self._written[shard]) or {}
            if written.get("hash") is not None:
                verify_local(path, written["hash"], default_cache_root())
            local = self._local(shard) if self._remote is None else self._remote.local(shard)
            if callable(iter_from):
                samples = iter_from(local, offset)
            else:
                pinned = None if self._dtypes is None else self._dtypes[shard]
                samples = _seek_by_index(self.reader, local, offset, pinned, path)
            for sample in samples:
                yield sample
                at += 1
        except (ShardError, MissingDependencyError, ReaderSettingError):
            raise
        except Exception as exc:
            raise ShardError(
                f"reading sample {at} of shard {shard_name(path)} failed with "
                f"{type(exc).__name__}: {exc}; fix or remove the shard.",
                path=path,
            ) from exc


class TransformFailed(NamedTuple):
    """In a sample's place: the dataset's ``transform`` raised ``error`` on it."""

    error: Exception
    where: str


def slot_stream(
    ds: StreamingShardedDataset,
    *,
    seed: int,
    slot: int,
    slots: int,
    cursor: Cursor,
    cycle: bool,
    per_sample_seeding: bool,
) -> Iterator[tuple[Any, Cursor]]:
    """The samples of one slot from ``cursor`` on, each with the cursor after it; ``cycle``:
    pass after pass."""
    pass_, nxt, saved, turn, seen = cursor
    empty = 0
    took = cursor != Cursor.start(pass_)
    while True:
        shards, stride = ds.slot_shards(seed, pass_, slot, slots)
        if nxt == 0 and not saved:  # the pass's start: the first K shards open
            nxt = min(ds.mix_shards, len(shards))
            saved = tuple((p, 0) for p in range(nxt))
        lanes = [list(lane) for lane in saved]  # [shard position, offset], mutable
        readers: list[Iterator[Any] | None] = [None] * len(lanes)  # opened on first use
        while lanes:
            lane, reader = lanes[turn], readers[turn]
            if reader is None:
                if ds._remote is not None:  # fetch the open lanes' shards and the next ones
                    ds._remote.note_lanes([shards[p] for p, _ in lanes], shards[nxt:])
                reader = readers[turn] = ds.read_from(shards[lane[0]], lane[1])
            sample = next(reader, _END)
            if sample is _END:  # this lane's shard ended: its next shard, or it drops out
                if nxt < len(shards):
                    lanes[turn], readers[turn] = [nxt, 0], None
                    nxt += 1
                else:
                    del lanes[turn], readers[turn]
                    turn = turn % len(lanes) if lanes else 0
                continue
            if lane[1] >> _OFFSET_BITS:  # its seeding key would be the next shard's
                raise ShardError(
                    f"shard {ds.shards[shards[lane[0]]]!s:.200} holds more than "
                    f"2**{_OFFSET_BITS} samples, past what a stream's per-sample seeding tells "
                    "apart; split it."
                )
            key = (shards[lane[0]] << _OFFSET_BITS) | lane[1]
            lane[1] += 1
            turn = (turn + 1) % len(lanes)
            seen += 1
            if stride and (seen - 1) % slots != slot:
                continue
            took = True
            after = Cursor(pass_, nxt, tuple((p, o) for p, o in lanes), turn, seen)
            if ds.transform is not None:
                try:
                    with seeded_sample(seed, pass_, key) if per_sample_seeding else nullcontext():
                        sample = ds.transform(sample)
                except Exception as exc:  # the stream goes on, as a map-style epoch does
                    where = (
                        f"sample {lane[1] - 1} of shard {shard_name(ds.shards[shards[lane[0]]])}"
                    )
                    sample = TransformFailed(exc, where)
            yield sample, after
        if not cycle:
            return
        empty = 0 if took else empty + 1
        # Only reshuffled passes can deal this slot non-empty shards.
        if empty >= (EMPTY_PASSES if ds.shuffle_shards else 1):
            names = [shard_name(ds.shards[s]) for s in shards]
            fix = (
                f"use more non-empty shards than ranks x workers ({slots}), or fewer workers"
                if ds.shuffle_shards
                else "remove the empty shards, or pass shuffle_shards=True"
            )
            raise LoaderkitError(
                f"StreamingShardedDataset: slot {slot} of {slots} read no sample in {empty} "
                f"whole pass(es) over its shards (last: {names}); {fix}."
            )
        pass_, nxt, saved, turn, seen, took = pass_ + 1, 0, (), 0, 0, False
