"""Sample lengths for length bucketing: measured once over a dataset, cached on disk."""

from __future__ import annotations

import hashlib
import json
import os
import types
import warnings
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from loaderkit._atomic import atomic_write
from loaderkit._checks import check_bool
from loaderkit.data._code import code_digest, pickle_digest
from loaderkit.data._reads import READ_UNDER, batch_fetch_is_faithful
from loaderkit.plan._bucket_order import as_lengths
from loaderkit.seeding import rngs_put_back, seeded_sample

__all__ = ["compute_lengths"]

_CHUNK = 256  # samples read in one __getitems__ call


def compute_lengths(
    dataset: Any,
    length_fn: Callable[[Any], int] | None = None,
    *,
    cache: str | os.PathLike[str] | None = None,
    key: str = "",
    progress: bool = True,
) -> np.ndarray:
    """Each sample's length, computed once over the dataset, with a progress bar and a cache.

    Args:
        dataset: A map-style dataset (``len`` and ``[i]``).
        length_fn: Maps a sample to its token count; default ``len(sample)`` (an
            array's ``shape[0]``). Dict and tuple samples need one.
        cache: A ``.npy`` path: lengths saved there for the same key are loaded (checked
            on 10 samples), else computed and saved (with a ``.json`` sidecar).
        key: Part of the cache key (with the dataset's type and length and ``length_fn``'s
            code and arguments): pass a data version when the data may change.
        progress: Show a tqdm progress bar while computing.

    Returns:
        int64 lengths, one per dataset index.

    Raises:
        ValueError: a sample's length follows its random draws (the longest and 7 others
            are read again under a seed). The caller's global RNGs are put back after.

    Example:
        >>> compute_lengths([[1, 2], [3], [4, 5, 6]], progress=False).tolist()
        [2, 1, 3]
    """
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise TypeError(
            f"compute_lengths: dataset must be map-style (len and [i]), got "
            f"{type(dataset).__name__}; pass the dataset you index, or the lengths themselves."
        )
    if length_fn is not None and not callable(length_fn):
        raise TypeError(
            f"compute_lengths: length_fn must be callable, got {length_fn!r}; pass e.g. "
            "length_fn=lambda s: len(s['input_ids']), or None for len(sample)."
        )
    check_bool("progress", progress, owner="compute_lengths")
    if not isinstance(key, str):
        raise TypeError(
            f"compute_lengths: key must be a str, got {key!r}; pass a data version, e.g. 'v2'."
        )
    size = len(dataset)
    fn = _default_length if length_fn is None else length_fn
    path = Path(cache) if cache is not None else None
    if path is not None and path.suffix != ".npy":
        raise ValueError(
            f"compute_lengths: cache must be a .npy path, got {str(cache)!r}; pass e.g. "
            "cache='lengths.npy'."
        )
    ident = None if path is None else _cache_ident(dataset, fn, key, size, path)
    # A weighted mix is read once per index here, as its lengths are (under its own plan).
    token = READ_UNDER.set(getattr(dataset, "_plan_key", None))
    try:
        with rngs_put_back():  # the caller's RNGs as they were, cached or not, whatever fn draws
            return _lengths(dataset, fn, size, path, ident, progress)
    finally:
        READ_UNDER.reset(token)


def _lengths(
    dataset: Any, fn: Any, size: int, path: Path | None, ident: str | None, progress: bool
) -> np.ndarray:
    read = _reads(dataset)
    if path is not None and ident is not None:
        cached = _load_cached_lengths(path, ident, size, lambda i: _checked(fn(read([i])[0]), i))
        if cached is not None:
            return cached  # (a length that follows random draws fails the cache's check)
    out = np.empty(size, dtype=np.int64)
    for lo in _progress(size, progress):
        rows = range(lo, min(lo + _CHUNK, size))
        samples = read(list(rows))
        if not isinstance(samples, list | tuple) or len(samples) != len(rows):
            raise TypeError(
                f"compute_lengths: {type(dataset).__name__}.__getitems__ returned "
                f"{type(samples).__name__} for {len(rows)} indices; return one sample per index."
            )
        for i, sample in zip(rows, samples, strict=True):
            try:
                got = fn(sample)
            except Exception as exc:
                exc.add_note(f"compute_lengths: raised measuring sample {i}{_where(dataset, i)}")
                raise
            out[i] = _checked(got, i)
    check_undrawn(read, fn, out)
    if path is not None and ident is not None:
        _save_cached_lengths(path, ident, out)
    return out


def _cache_ident(dataset: Any, fn: Any, key: str, size: int, path: Path) -> str | None:
    """The cache key of ``fn`` over ``dataset``; None (warned) where ``fn`` does not pickle."""
    name = f"{getattr(fn, '__qualname__', type(fn).__qualname__)}:{code_digest(fn)}"
    state = None if isinstance(fn, types.FunctionType) else pickle_digest(fn)
    if not isinstance(fn, types.FunctionType) and state is None:
        warnings.warn(
            f"compute_lengths: length_fn {name.split(':')[0]} cannot be pickled, so its "
            f"arguments cannot key the cache; computing without {str(path)!r}.",
            UserWarning,
            stacklevel=3,
        )
        return None
    name += "" if state is None else f":{state}"
    described = f"{_dataset_key(dataset)}|{size}|{name}|{key}"
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def check_own_lengths(dataset: Any, stored: np.ndarray, field: str | None, fix: str) -> None:
    """Refuse a subclass whose longest or shortest sample (at dict key ``field``, or
    whole) is longer than its source's ``stored`` length; ``fix`` ends the message."""
    for index in sorted({int(stored.argmax()), int(stored.argmin())} if stored.size else ()):
        with rngs_put_back():
            sample = _reads(dataset)([index])[0]
        if field is not None and isinstance(sample, dict) and field in sample:
            sample = sample[field]
        # Tokens longer than the source counts: a budget from it would not hold (a prompt
        # added). Shorter ones keep it (truncated, a shifted pair t[:-1], t[1:]). A 2-D stack,
        # a scalar: where the tokens are is length_fn's to say.
        bare = _seq(sample)
        if bare or not isinstance(sample, dict | tuple):
            parts = [sample] if bare else []
        else:
            parts = list(sample.values() if isinstance(sample, dict) else sample)
        found = max((len(p) for p in parts if _seq(p, ints=not bare)), default=0)
        if found > stored[index]:
            raise ValueError(
                f"{type(dataset).__name__}.lengths: sample {index} has {found} tokens, where "
                f"its source counts {int(stored[index])}. {fix}"
            )


def _seq(value: Any, *, ints: bool = False) -> bool:
    """Whether ``value`` is a 1-D tensor or array (``ints``: of integers), or a list of ints."""
    if isinstance(value, torch.Tensor):
        return value.ndim == 1 and not (ints and (value.is_floating_point() or value.is_complex()))
    if isinstance(value, np.ndarray):
        return value.ndim == 1 and not (ints and value.dtype.kind not in "iub")
    return isinstance(value, list) and all(isinstance(v, int) for v in value[:8])


def _where(dataset: Any, index: int) -> str:
    """Where sample ``index`` of a sharded dataset is stored (else nothing)."""
    locate = getattr(dataset, "locate", None)
    if not callable(locate):
        return ""
    shard, row = locate(index)
    return f" (row {row} of {dataset.shards[shard]})"


def _reads(dataset: Any) -> Callable[[list[int]], list[Any]]:
    """Samples read as the loader reads them: ``__getitems__`` where no subclass bypasses
    ``__getitem__`` with it, else ``[i]``."""
    if batch_fetch_is_faithful(dataset, "__getitems__"):
        return dataset.__getitems__
    return lambda indices: [dataset[i] for i in indices]


def check_undrawn(
    read: Callable[[list[int]], list[Any]],
    fn: Any,
    lengths: np.ndarray,
    owner: str = "compute_lengths",
    fix: str = "measure the length before any random crop, or pass the lengths.",
) -> None:
    """Refuse lengths that follow a sample's random draws (a random crop): measured at
    draws the loader does not make, a token budget would not hold."""
    if not lengths.size:
        return
    picks = [int(lengths.argmax()), *np.linspace(0, lengths.size - 1, 7).astype(int).tolist()]
    for index in dict.fromkeys(picks):  # the longest, and 7 spread
        with seeded_sample(0, 0, index):  # other draws than the measure's
            again = _checked(fn(read([index])[0]), index)
        if again != lengths[index]:
            raise ValueError(
                f"{owner}: sample {index} is {lengths[index]} then {again} long under "
                f"other random draws; {fix}"
            )


def _dataset_key(dataset: Any) -> str:
    """The dataset's type, with a subset's indices and inner key or a ``ConcatDataset``'s parts."""
    name = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
    parts = getattr(dataset, "datasets", None)  # a ConcatDataset: its parts in order
    if isinstance(parts, list | tuple) and all(hasattr(p, "__len__") for p in parts):
        return f"{name}[{','.join(f'{_dataset_key(p)}:{len(p)}' for p in parts)}]"
    indices, inner = getattr(dataset, "indices", None), getattr(dataset, "dataset", None)
    if indices is None or inner is None or not hasattr(inner, "__len__"):
        return name
    rows = np.ascontiguousarray(np.asarray(indices, dtype=np.int64))
    return f"{name}[{zlib.crc32(rows.tobytes()):08x}:{len(inner)}]({_dataset_key(inner)})"


def _checked(value: Any, i: int) -> Any:
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"compute_lengths: length_fn returned {value!r} ({type(value).__name__}) for "
            f"sample {i}; it must return the sample's token count as an int."
        )
    if value < 0:
        raise ValueError(
            f"compute_lengths: length_fn returned {value} for sample {i}; lengths must be "
            "token counts >= 0: fix length_fn for that sample."
        )
    return value


def _default_length(sample: Any) -> int:
    if isinstance(sample, (Mapping, tuple)):
        raise TypeError(
            f"compute_lengths: samples are {type(sample).__name__}s, whose len() is not a "
            "token count; pass length_fn, e.g. length_fn=lambda s: len(s['input_ids'])."
        )
    shape = getattr(sample, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if not hasattr(sample, "__len__"):
        raise TypeError(
            f"compute_lengths: a sample is a {type(sample).__name__}, which has no len(); "
            "pass length_fn, e.g. length_fn=lambda s: len(s['input_ids'])."
        )
    return len(sample)


def _progress(size: int, show: bool) -> Iterator[int]:
    """The first index of each chunk of ``_CHUNK`` samples, with a progress bar if ``show``."""
    starts = range(0, size, _CHUNK)
    if not show:
        yield from starts
        return
    from tqdm.auto import tqdm  # installed with lightning

    with tqdm(total=size, desc="loaderkit: lengths", unit="sample", mininterval=0.5) as bar:
        for lo in starts:
            yield lo
            bar.update(min(_CHUNK, size - lo))


def _load_cached_lengths(
    path: Path, ident: str, size: int, measure: Callable[[int], int]
) -> np.ndarray | None:
    meta_path = path.with_name(path.name + ".json")
    if not path.exists() or not meta_path.exists():
        return None
    why = ""
    try:
        meta = json.loads(meta_path.read_text())
        lengths = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        why = f"it cannot be read ({exc})"
    else:
        if meta.get("key") != ident:
            why = "it was saved for another dataset, length_fn or key"
        elif lengths.shape != (size,) or lengths.dtype != np.int64:
            why = f"it holds {lengths.shape} {lengths.dtype}, not {size} int64 lengths"
        elif meta.get("crc32") != zlib.crc32(lengths.tobytes()):
            why = "its checksum does not match (a torn write?)"
        elif (changed := _changed_sample(lengths, measure)) is not None:
            why = f"sample {changed[0]} has {changed[1]} tokens now, {lengths[changed[0]]} there"
        else:
            return as_lengths(lengths)
    warnings.warn(
        f"compute_lengths: recomputing the lengths cached at {path}: {why}.",
        UserWarning,
        stacklevel=3,
    )
    return None


def _changed_sample(lengths: np.ndarray, measure: Callable[[int], int]) -> tuple[int, int] | None:
    """``(index, length now)`` of the longest, shortest or 8 drawn samples that differs."""
    if not lengths.size:
        return None
    drawn = np.random.default_rng(lengths.size).integers(0, lengths.size, 8).tolist()
    for index in dict.fromkeys([int(lengths.argmax()), int(lengths.argmin()), *drawn]):
        if (now := measure(index)) != lengths[index]:
            return index, now
    return None


def _save_cached_lengths(path: Path, ident: str, lengths: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: np.save(f, lengths))
    meta = {"key": ident, "num_samples": int(lengths.size), "crc32": zlib.crc32(lengths.tobytes())}
    atomic_write(path.with_name(path.name + ".json"), lambda f: f.write(json.dumps(meta).encode()))
