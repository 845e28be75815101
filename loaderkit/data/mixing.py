"""Weighted mixing of map-style datasets under one :class:`~loaderkit.MixPlan`, resumed exactly."""

from __future__ import annotations

import inspect
import os
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Dataset, StackDataset, Subset

from loaderkit._checks import check_int
from loaderkit.data._arrow import merge_kinds, promoted
from loaderkit.data._open import names_crc32
from loaderkit.data._reads import READ_UNDER
from loaderkit.data.hf import HFDataset
from loaderkit.data.lengths import compute_lengths
from loaderkit.data.memory import ArrayDataset, TensorDataset
from loaderkit.data.parquet import ParquetReader
from loaderkit.data.readers import TokenReader
from loaderkit.data.remote import shard_paths
from loaderkit.data.sharded import OrderArgs, ShardedDataset
from loaderkit.errors import ShardError, StateMismatchError
from loaderkit.plan._bucket_order import int_lengths
from loaderkit.plan.bucket import BucketOptions
from loaderkit.plan.mix import MixPlan, mix_allotments
from loaderkit.plan.samplers import BucketBatchSampler, PlanBatchSampler

__all__ = ["MixedDataset"]

_OWNER = "MixedDataset"
_READS = ("__getitem__", "__getitems__", "get_batch")


def shard_names_crc32(dataset: object) -> int | None:
    """The shard files a dataset reads (also through a torch ``Subset``/``ConcatDataset`` or
    a :class:`MixedDataset`, with their shapes), as the crc32 a saved position is checked
    against; None: no shard files found."""
    if isinstance(dataset, ShardedDataset):
        return dataset.names_crc32
    found = _files(dataset)
    if found is None:
        return None
    groups, shape, _ = found  # one names_crc32 over all parts: swapped parts' folders differ
    names = names_crc32([p for g in groups for p in g], [len(g) for g in groups])
    return zlib.crc32(repr((names, shape)).encode())


def mix_sources_crc32(dataset: object) -> int | None:
    """crc32 of the source names and sizes of the mixes ``dataset`` is or holds (through a
    torch ``Subset``/``ConcatDataset``, by place); None: no mix."""
    shape = _mix_shape(dataset)
    return None if shape is None else zlib.crc32(repr(shape).encode())


def torch_parts(ds: object) -> tuple[Any, list[Any]] | None:
    """The parts a torch ``ConcatDataset`` or ``StackDataset`` reads, with a tag telling a
    stack apart (None for a concatenation); None for any other dataset."""
    if isinstance(ds, ConcatDataset):
        return None, list(ds.datasets)
    if not isinstance(ds, StackDataset):
        return None
    parts = ds.datasets
    if isinstance(parts, dict):  # by key: the keyword order does not change a sample
        keys = sorted(parts, key=str)
        return ("stack", tuple(keys)), [parts[k] for k in keys]
    return ("stack", len(parts)), list(parts)


def _joined(tag: Any, shapes: list[Any]) -> Any:
    """The parts' ``shapes`` as one (None where none has one), tagged as :func:`torch_parts`."""
    if shapes.count(None) == len(shapes):
        return None
    return tuple(shapes) if tag is None else (tag, tuple(shapes))


def _mix_shape(ds: object) -> Any:
    if isinstance(ds, MixedDataset):
        return tuple(ds.names), tuple(ds.sizes)
    if isinstance(ds, Subset):
        return _mix_shape(ds.dataset)
    found = torch_parts(ds)
    return None if found is None else _joined(found[0], [_mix_shape(d) for d in found[1]])


def listing_crc32(dataset: object) -> int | None:
    """crc32 of which samples a dataset holds where its length alone does not say: a torch
    ``Subset``'s indices (``random_split`` without ``generator=`` draws others each run) and
    a torchvision ``DatasetFolder``'s file names below its root, through ``ConcatDataset``
    and a mix's sources."""
    shape = _listing(dataset)
    return None if shape is None else zlib.crc32(repr(shape).encode())


def _listing(ds: object) -> Any:
    if isinstance(ds, ShardedDataset):
        return None  # its shard names hold its files
    if isinstance(ds, Subset) and _files(ds) is not None:
        return _listing(ds.dataset)  # the shard names hold its rows; not its other parts
    if isinstance(ds, Subset) or hasattr(ds, "seed_rows"):
        # loaderkit's split of a DataModule too (index_subset); a rank's own part is not all's
        inner = _listing(ds.dataset)  # type: ignore[attr-defined]
        return inner if getattr(ds, "seed_rows", None) is not None else (_rows_crc32(ds), inner)
    found = (None, ds.sources) if isinstance(ds, MixedDataset) else torch_parts(ds)
    if found is not None:
        return _joined(found[0], [_listing(d) for d in found[1]])
    arrow = _arrow_files(ds.dataset if isinstance(ds, HFDataset) else ds)
    if arrow is not None:
        return "arrow", arrow
    if not any(c.__name__ == "DatasetFolder" for c in type(ds).__mro__):
        return None
    # Below the root: a folder copied or moved elsewhere (a job's scratch) keeps it.
    root = os.path.join(os.fspath(getattr(ds, "root", "")), "")
    crc, samples = 0, getattr(ds, "samples", [])
    for lo in range(0, len(samples), 65536):
        chunk = samples[lo : lo + 65536]
        names = [s[0] if isinstance(s, tuple | list) else s for s in chunk]
        text = ("\0" + "\0".join(map(str, names))).replace("\0" + root, "\0")
        crc = zlib.crc32(text.encode("utf-8", "surrogateescape"), crc)
    classes = _classes(ds)
    return ("files", crc) if classes is None else ("files", crc, classes)


def _arrow_files(data: Any) -> int | None:
    """crc32 of the sizes of a ``datasets.Dataset``'s Arrow files (``cache_files``), else
    None. Not their times (each node of a run, or the one it resumes on, has its own
    copies) nor names (random where ``datasets`` cannot hash a ``map``)."""
    files = getattr(data, "cache_files", None)
    if not isinstance(files, list) or not files:
        return None
    stamps = []
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            return None
        try:
            size = os.path.getsize(name)
        except OSError:  # removed since it was mapped
            size = -1
        stamps.append(size)
    return zlib.crc32(repr(stamps).encode())


def _classes(folder: Any) -> Any:
    """A folder dataset's class list where its files do not imply it (an empty class folder,
    a ``find_classes`` of its own), else None: the labels then follow the file names."""
    classes = getattr(folder, "class_to_idx", None)
    if not isinstance(classes, dict):
        return None
    implied = {name: i for i, name in enumerate(sorted(classes))}
    if classes == implied and len(set(getattr(folder, "targets", ()))) == len(classes):
        return None
    return zlib.crc32(repr(sorted(classes.items(), key=str)).encode())


def _rows_crc32(subset: Any) -> int:
    """crc32 of a ``Subset``'s indices (taken modulo its dataset's length, as indexing does)."""
    rows: Any = subset.indices
    if isinstance(rows, range):  # np.asarray(range) walks it in Python
        rows = np.arange(rows.start, rows.stop, rows.step, dtype=np.int64)
    elif isinstance(rows, torch.Tensor):
        rows = rows.cpu()
    try:
        rows = np.asarray(rows, np.int64)
    except (TypeError, ValueError):  # keys of a dataset indexed by other than ints
        return zlib.crc32(repr(list(rows)).encode())
    if hasattr(subset.dataset, "__len__"):  # a Subset needs none of its dataset
        rows = rows % max(len(subset.dataset), 1)
    return zlib.crc32(rows.tobytes())


def shard_counts_crc32(dataset: object) -> int | None:
    """crc32 of the samples of each shard file :func:`shard_names_crc32` finds (or None)."""
    found = _files(dataset, shaped=False)
    return None if found is None else zlib.crc32(repr(found[2]).encode())


def _files(
    dataset: object, *, shaped: bool = True
) -> tuple[list[list[str]], Any, list[int]] | None:
    """The shard paths ``dataset`` reads (per sharded part), its shape (if ``shaped``) and
    each shard's samples."""
    if isinstance(dataset, ShardedDataset):
        paths = shard_paths(dataset.shards)
        return None if paths is None else ([paths], len(paths), list(dataset.sizes))
    if isinstance(dataset, Subset):
        inner = _files(dataset.dataset, shaped=shaped)
        if inner is None or not shaped:
            return inner
        return inner[0], (inner[1], _rows_crc32(dataset)), inner[2]
    if isinstance(dataset, MixedDataset):
        tag, parts = None, list(dataset.sources)
    elif isinstance(dataset, ConcatDataset):
        tag, parts = None, _flat(dataset)
    else:
        tag, parts = torch_parts(dataset) or (None, [])
    found = [_files(part, shaped=shaped) for part in parts]
    if found.count(None) == len(found):
        return None
    groups = [g for f in found if f is not None for g in f[0]]
    shape = [f[1] if f else ("len", len(part)) for part, f in zip(parts, found, strict=True)]
    counts = [n for f in found if f is not None for n in f[2]]
    return groups, shape if tag is None else (tag, shape), counts


def _flat(dataset: ConcatDataset[Any]) -> list[Any]:
    """A ConcatDataset's parts, nested ones spliced in (the same index reads the same)."""
    out: list[Any] = []
    for part in dataset.datasets:
        out.extend(_flat(part) if isinstance(part, ConcatDataset) else [part])
    return out


def _by_source(name: str, value: Any, names: list[str], named: bool) -> Any:
    """``weights``/``repeat`` given by source name, as a list in source order."""
    if not isinstance(value, Mapping):
        return value
    if not named:
        raise TypeError(
            f"{_OWNER}: {name} is a mapping but the sources are a sequence (no names); pass "
            f"{name} as a list in source order, or the sources as a dict."
        )
    by_name = {str(k): v for k, v in value.items()}  # as the sources' keys became names
    if len(by_name) != len(value) or set(by_name) != set(names):
        missing = sorted(set(names) - set(by_name))
        unknown = sorted(set(by_name) - set(names))
        raise ValueError(
            f"{_OWNER}: {name} must name every source once; missing {missing}, unknown "
            f"{unknown}; pass one value per source name in {names}."
        )
    return [by_name[n] for n in names]


def holds_mix(ds: Any, *, weighted: bool = False) -> bool:
    """Whether ``ds`` is or holds (through torch's ``Subset``, ``ConcatDataset``,
    ``StackDataset``, or as an attribute of a wrapper of the user's) a (weighted) mix."""
    if isinstance(ds, Subset):
        return holds_mix(ds.dataset, weighted=weighted)
    found = torch_parts(ds)
    if found is not None:
        return any(holds_mix(d, weighted=weighted) for d in found[1])
    if not isinstance(ds, MixedDataset):  # a user's transform wrapper
        return any(_is_mix(m, weighted) for m in held_mixes(ds))
    return _is_mix(ds, weighted)


def held_mixes(obj: Any, depth: int = 4, seen: set[int] | None = None) -> list[MixedDataset]:
    """The mixes ``obj`` holds in its attributes (and their small lists, tuples and dicts),
    ``depth`` levels down: a wrapper of the user's reads a mix's samples, never its weights."""
    seen = set() if seen is None else seen
    if depth < 0 or id(obj) in seen or isinstance(obj, str | bytes | np.ndarray | torch.Tensor):
        return []
    seen.add(id(obj))
    if isinstance(obj, MixedDataset):
        return [obj]
    if isinstance(obj, dict | list | tuple) and len(obj) > _HELD_AT_MOST:
        return []  # a dataset's samples, not its parts: walking them would slow every build
    if isinstance(obj, dict):
        values: list[Any] = list(obj.values())
    elif isinstance(obj, list | tuple):
        values = list(obj)
    else:
        slots = [n for c in type(obj).__mro__ for n in getattr(c, "__slots__", ())]
        values = [*getattr(obj, "__dict__", {}).values(), *(getattr(obj, n, None) for n in slots)]
    return [m for v in values for m in held_mixes(v, depth - 1, seen)]


_HELD_AT_MOST = 16  # items of a container held_mixes looks into


def _is_mix(ds: MixedDataset, weighted: bool) -> bool:
    return not (weighted and ds.per_epoch == ds.sizes)


def _check_source(name: str, ds: Any) -> None:
    if holds_mix(ds):
        what = (
            "is itself a MixedDataset"
            if isinstance(ds, MixedDataset)
            else "holds a MixedDataset (through a torch Subset, ConcatDataset, StackDataset or "
            "an attribute)"
        )
        raise TypeError(
            f"{_OWNER}: source {name!r} {what}, whose weights a mix of mixes would ignore; "
            "pass its sources to this mix directly, each weighted by its share of the inner "
            "mix times the inner mix's weight."
        )
    if isinstance(ds, str | bytes | os.PathLike):  # a str has len() and [i]: its characters
        raise TypeError(
            f"{_OWNER}: source {name!r} is a path ({ds!r}), not a dataset; pass "
            "ShardedDataset(path, reader), or give the paths to MixedDataModule."
        )
    if not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
        raise TypeError(
            f"{_OWNER}: source {name!r} must be a map-style dataset (len() and [i]), "
            f"got {type(ds).__name__}; streams cannot be mixed by position."
        )
    if len(ds) < 1:
        raise ValueError(f"{_OWNER}: source {name!r} is empty (len 0); drop it from sources.")


def _check_columns(names: list[str], datasets: list[Any]) -> None:
    """Refuse sources whose number field a batch of both (torch's promotion) would round."""
    seen: dict[Any, tuple[tuple[Any, ...], str]] = {}
    for name, ds in zip(names, datasets, strict=True):
        for kinds, fix in _field_kinds(ds):
            for field, kind in kinds.items():
                first, where = seen.setdefault(field, (kind, name))
                if first[0] == kind[0] == "python" or first == kind:
                    continue  # Python objects (strings, ...) are listed, never cast
                merged = merge_kinds(first, kind)
                if merged is None or promoted(first[1], kind[1]) != merged[1]:
                    other = "another part of it" if where == name else f"source {where!r}"
                    raise ShardError(
                        f"{_OWNER}: field {field!r} is {_kind_text(kind)} in source {name!r} but "
                        f"{_kind_text(first)} in {other}, which a batch of both cannot hold "
                        f"exactly; {fix}."
                    )


def _kind_text(kind: tuple[Any, ...]) -> str:
    """A field's kind as a message says it: ``torch.int64``, ``lists of torch.int64``, ..."""
    if kind[0] == "tensors":
        return f"lists of {kind[1]}"
    if kind[0] == "fixed":
        return f"lists of {kind[2]} {kind[1]}"
    return str(kind[1])


def _reads_as(ds: Any, base: type) -> bool:
    """Whether ``ds`` is a ``base`` whose reads neither its class nor the instance replaces."""
    if not isinstance(ds, base) or any(name in vars(ds) for name in _READS):
        return False
    below = type(ds).__mro__[: type(ds).__mro__.index(base)]
    return not any(name in vars(cls) for cls in below for name in _READS)


def _field_kinds(ds: Any) -> list[tuple[dict[Any, tuple[Any, ...]], str]]:
    """What each field of ``ds``'s samples becomes in a batch where the data says so, and how
    to change it (also through torch's ``Subset`` and ``ConcatDataset``)."""
    if _reads_as(ds, Subset):  # a subclass's reads may change the types: its batches tell
        return _field_kinds(ds.dataset)
    if _reads_as(ds, ConcatDataset):
        return [kinds for inner in ds.datasets for kinds in _field_kinds(inner)]
    cast = "give both sources' tensors one dtype (e.g. t.to(torch.int64))"
    if _reads_as(ds, TensorDataset) or _reads_as(ds, torch.utils.data.TensorDataset):
        return [({i: ("tensor", t.dtype) for i, t in enumerate(ds.tensors)}, cast)]
    if _reads_as(ds, ArrayDataset):
        dtypes = {
            i: ("tensor", torch.from_numpy(np.empty(0, a.dtype)).dtype)
            for i, a in enumerate(ds.arrays)
        }
        return [(dtypes, cast)]
    if _reads_as(ds, HFDataset):
        fix = "cast the column (Dataset.cast_column), or leave it out: HFDataset(columns=)"
        return [(ds.kinds(), fix)]
    reader = ds.reader if _reads_as(ds, ShardedDataset) else None
    if isinstance(reader, TokenReader) and reader.out_dtype is not None:
        fix = "give both readers one out_dtype, e.g. TokenReader(out_dtype=torch.int64)"
        return [({"tokens": ("tensor", reader.out_dtype)}, fix)]
    fix = "write them with one type, or leave the column out: ParquetReader(columns=)"
    return [(reader.kinds(), fix)] if isinstance(reader, ParquetReader) else []


def _check_distinct(datasets: list[Any], sizes: tuple[int, ...]) -> None:
    """Refuse two listed sources a saved position could not tell apart."""
    seen: dict[tuple[Any, int], int] = {}
    for j, ds in enumerate(datasets):
        # Not by draws per epoch: swapped, two such sources' states are alike, their mixes not.
        key = (getattr(ds, "_source_name", None), sizes[j])
        i = seen.setdefault(key, j)
        if i != j:
            named = "no name" if key[0] is None else f"the name {key[0]!r}"
            raise ValueError(
                f"{_OWNER}: sources[{i}] and sources[{j}] have {named} and the same size "
                f"({sizes[j]}), so a resume cannot tell them apart; pass the sources as a dict "
                f"by name, e.g. {{'a': sources[{i}], 'b': sources[{j}]}}."
            )


class MixedDataset(Dataset[Any]):
    """Several map-style datasets mixed by weights or repeats, with their own :class:`MixPlan`.

    Global index ``offset[s] + i`` is sample ``i`` of source ``s``; each source's samples are
    drawn once per *source-epoch* (a permutation that may span epochs).

    Args:
        sources: The datasets (``len()`` >= 1 and ``[i]``), as a dict by name or a sequence
            (named by their data where they have it, else by position).
        weights: Proportions of an epoch, one per source (a list or a dict by name): source
            ``s`` gets ``weights[s] / sum(weights) * epoch_size`` draws.
        repeat: Passes over each source per epoch instead of ``weights`` (``0.5``: half):
            ``round(repeat[s] * len(source))`` draws.
        epoch_size: Samples per epoch with ``weights`` (default: ``len(self)``); with
            neither ``weights`` nor ``repeat``, every source once per epoch.

    Example:
        >>> import torch
        >>> from loaderkit import ResumableDataLoader, TensorDataset
        >>> web = TensorDataset(torch.arange(100))
        >>> books = TensorDataset(torch.arange(100, 110))
        >>> mix = MixedDataset({"web": web, "books": books}, weights={"web": 3, "books": 1},
        ...                    epoch_size=40)
        >>> mix.per_epoch, len(mix)
        ((30, 10), 110)
        >>> loader = ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(8, seed=0))
        >>> drawn = torch.cat([b[0] for b in loader])  # TensorDataset: (rows,)
        >>> int((drawn >= 100).sum()), sorted(drawn[drawn >= 100].tolist()) == list(range(100, 110))
        (10, True)
        >>> mix.describe(epoch=1)["sources"]["web"]["source_epochs"]  # draws 30-59 of 100
        [0, 0]
    """

    def __init__(
        self,
        sources: Mapping[str, Any] | Sequence[Any],
        *,
        weights: Mapping[str, float] | Sequence[float] | None = None,
        repeat: Mapping[str, float] | Sequence[float] | None = None,
        epoch_size: int | None = None,
    ) -> None:
        named = isinstance(sources, Mapping)
        if isinstance(sources, Mapping):
            self.names = [str(k) for k in sources]
            if len(set(self.names)) < len(self.names):  # {1: a, "1": b}: one name, two sources
                raise ValueError(
                    f"{_OWNER}: the source keys {list(sources)} name two sources alike as str; "
                    "give every source its own name."
                )
            datasets = list(sources.values())
        elif isinstance(sources, Sequence) and not isinstance(sources, str | bytes):
            datasets = list(sources)
            # Named by their data, else by position; a shared name gets ``#i``.
            names = [getattr(ds, "_source_name", None) or str(i) for i, ds in enumerate(datasets)]
            shared = {n for n in names if names.count(n) > 1}
            self.names = [f"{n}#{i}" if n in shared else n for i, n in enumerate(names)]
        else:
            raise TypeError(
                f"{_OWNER}: sources must be a dict of datasets by name or a list of datasets, "
                f"got {type(sources).__name__}; pass e.g. {{'web': web, 'books': books}}."
            )
        if not datasets:
            raise ValueError(f"{_OWNER}: sources is empty; pass at least one dataset.")
        for name, ds in zip(self.names, datasets, strict=True):
            _check_source(name, ds)
        _check_columns(self.names, datasets)
        self.sources = datasets
        self.sizes: tuple[int, ...] = tuple(len(ds) for ds in datasets)
        by = weights if weights is not None else repeat
        self.per_epoch: tuple[int, ...] = mix_allotments(
            self.sizes,
            weights=_by_source("weights", weights, self.names, named),
            repeat=_by_source("repeat", repeat, self.names, named),
            epoch_size=epoch_size,
            # Errors name a source as the user did: by key in a dict, else by position.
            labels=[repr(n) for n in self.names] if isinstance(by, Mapping) else None,
        )
        if not named:
            _check_distinct(datasets, self.sizes)
        self._ends = np.cumsum(np.asarray(self.sizes, dtype=np.int64))
        self._starts = self._ends - np.asarray(self.sizes, dtype=np.int64)
        weighted = self.per_epoch != self.sizes
        self._plan_key = (self.per_epoch, self.sizes) if weighted else None

    @property
    def names_crc32(self) -> int | None:
        """crc32 of the sources' shard files (:func:`shard_names_crc32`), or None."""
        return shard_names_crc32(self)

    def __len__(self) -> int:
        """The sources' total; a source whose ``len()`` changed since is refused."""
        for name, ds, size in zip(self.names, self.sources, self.sizes, strict=True):
            if len(ds) != size:
                raise StateMismatchError(
                    f"{_OWNER}: source {name!r} has {len(ds)} samples now, {size} when the mix "
                    "was built; build a new MixedDataset and loader over the changed source."
                )
        return int(self._ends[-1])

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{n}: {size} x{a / size:.3g}"
            for n, size, a in zip(self.names, self.sizes, self.per_epoch, strict=True)
        )
        return f"MixedDataset({parts}; {self.epoch_size} samples per epoch)"

    @property
    def epoch_size(self) -> int:
        """Samples drawn per epoch: ``sum(per_epoch)``."""
        return sum(self.per_epoch)

    @property
    def weights(self) -> tuple[float, ...]:
        """Each source's share of an epoch, as allotted (``per_epoch / epoch_size``)."""
        return tuple(a / self.epoch_size for a in self.per_epoch)

    def locate(self, index: int) -> tuple[int, int]:
        """``(source, sample in source)`` of global ``index``."""
        n = int(self._ends[-1])
        if not -n <= index < n:
            raise IndexError(f"{_OWNER}: index {index} out of range for {n} samples.")
        index %= n
        source = int(np.searchsorted(self._ends, index, side="right"))
        return source, index - int(self._starts[source])

    def source_of(self, indices: Any) -> np.ndarray:
        """The source number of each global index (int64, same shape), e.g. to count a batch."""
        where = np.asarray(indices)
        if where.size and (
            where.dtype.kind not in "iu" or not 0 <= where.min() <= where.max() < len(self)
        ):
            raise IndexError(
                f"{_OWNER}.source_of: indices must be ints in [0, {len(self)}), got {indices!r}; "
                "pass global indices as the loader yields them."
            )
        return np.searchsorted(self._ends, where, side="right").astype(np.int64)

    def __getitem__(self, index: int) -> Any:
        key = getattr(self, "_plan_key", None)
        # Only a read under the mix's own plan: torch's DataLoader, a stream or another
        # sampler reads every sample once, weights lost.
        if key is not None and READ_UNDER.get(None) != key:
            raise ValueError(
                f"{_OWNER}: a weighted mix read by index {index!r} outside its own plan (or in "
                "a thread of your own), which would ignore its weights; read it (or a wrapper) "
                "with ResumableDataLoader(..., batch_sampler=mix.batch_sampler(...)), and one "
                "sample with mix.sources[s][j] where s, j = mix.locate(i)."
            )
        source, local = self.locate(int(index))
        return self.sources[source][local]

    def describe(self, epoch: int = 0) -> dict[str, Any]:
        """Per source its size, weight, draws, passes per epoch, and ``epoch``'s source-epochs."""
        epoch = check_int("epoch", epoch, 0, owner=f"{_OWNER}.describe")
        plan = MixPlan(source_sizes=self.sizes, per_epoch=self.per_epoch, batch_size=1)
        spans = plan.source_epochs(epoch)
        return {
            "samples": len(self),
            "epoch_size": self.epoch_size,
            "sources": {
                name: {
                    "samples": size,
                    "weight": a / self.epoch_size,
                    "per_epoch": a,
                    "repeat": a / size,
                    "source_epochs": list(span),
                }
                for name, size, a, span in zip(
                    self.names, self.sizes, self.per_epoch, spans, strict=True
                )
            },
        }

    def plan(
        self, batch_size: int, *, seed: int = 0, shuffle: bool = True, drop_last: bool = False
    ) -> MixPlan:
        """This dataset's :class:`~loaderkit.MixPlan` (the arguments are MixPlan's)."""
        return MixPlan(
            source_sizes=self.sizes,
            per_epoch=self.per_epoch,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            source_names=self.names,
        )

    def batch_sampler(
        self,
        batch_size: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        **plan: Unpack[OrderArgs],
    ) -> PlanBatchSampler:
        """A batch sampler over :meth:`plan` (``plan``: its keyword arguments)."""
        sampler = PlanBatchSampler(self.plan(batch_size, **plan), rank=rank, world_size=world_size)
        sampler.shard_names_crc32 = self.names_crc32
        sampler.shard_counts_crc32 = shard_counts_crc32(self)
        return sampler

    def lengths(
        self, length_fn: Callable[[Any], int] | None = None, *, progress: bool = False
    ) -> np.ndarray:
        """Each sample's token count: a source's own ``lengths()``, else ``compute_lengths``."""
        parts, first = [], 0
        for name, source in zip(self.names, self.sources, strict=True):
            own = getattr(source, "lengths", None)
            try:
                if callable(own) and length_fn is None:
                    got = own()
                elif callable(own) and _positional(own):
                    got = own(length_fn)
                else:  # no lengths() of its own, or one that cannot take length_fn (a column's)
                    got = compute_lengths(source, length_fn, progress=progress)
            except Exception as exc:
                where = f"in source {name!r}, sample i is mix sample {first} + i"
                exc.add_note(f"MixedDataset.lengths: {where}")
                raise
            parts.append(got)
            first += len(source)
        return int_lengths(parts, "MixedDataset.lengths")  # floats refused, not cut

    def bucket_batch_sampler(
        self,
        *,
        lengths: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        **options: Unpack[BucketOptions],
    ) -> BucketBatchSampler:
        """A :class:`~loaderkit.BucketBatchSampler` over the mix (``lengths``: :meth:`lengths`)."""
        sampler = BucketBatchSampler(
            self.lengths() if lengths is None else lengths,
            source_sizes=self.sizes,
            per_epoch=self.per_epoch,
            source_names=self.names,
            rank=rank,
            world_size=world_size,
            **options,
        )
        sampler.shard_names_crc32 = self.names_crc32
        sampler.shard_counts_crc32 = shard_counts_crc32(self)
        return sampler


def _positional(method: Callable[..., Any]) -> bool:
    """Whether ``method`` takes a positional argument."""
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.kind in kinds for p in inspect.signature(method).parameters.values())
