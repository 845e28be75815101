"""The DataModules' helpers: shard lists, the seeded split, stream facts, the worker probe."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import Subset

from loaderkit._tags import SeedTag
from loaderkit.data._fs import is_url
from loaderkit.data.mixing import torch_parts
from loaderkit.data.streaming import StreamingShardedDataset
from loaderkit.loader._fetch import _Subset
from loaderkit.plan._sampler_plan import SamplerPlan
from loaderkit.plan.bucket import BucketPlan
from loaderkit.plan.mix import MixPlan
from loaderkit.seeding import derive_seed

Shards = str | list[str]  # a folder, a file or a URL, or a list of files or URLs

STREAM_RESUME_REASON = (
    "the train loader streams a StreamingShardedDataset and saves one cursor per (rank, "
    "worker) in the Lightning checkpoint: a resume is exact only under the same world size "
    "and num_workers (any other is refused); an elastic resume needs sample counts: use "
    "ShardedDataset (streaming=False)"
)


def stream_epoch_steps(loader: Any, world_size: int) -> int | None:
    """Batches per rank per epoch of a stream's loader (None: one pass of unknown length)."""
    try:
        steps: int | None = loader.dataset.epoch_steps(loader.batch_size, world_size)
    except ValueError:  # below one global step: iterating it says so
        return None
    return steps


def stream_refusal(
    dataset: Any, batch_size: int, world_size: int, num_workers: int = 0
) -> str | None:
    """Why a ``StreamingShardedDataset`` cannot train on ``world_size`` ranks with
    ``num_workers`` (None: it can)."""
    if world_size > 1 and not dataset.limited:
        return (
            f"a stream without steps_per_epoch or samples_per_epoch is refused on {world_size} "
            "ranks: ranks would step different numbers of times and hang DDP; set one of them"
        )
    try:
        steps = dataset.epoch_steps(batch_size, world_size)
    except ValueError as exc:
        return str(exc)
    if steps is not None and steps < num_workers:
        return (
            f"{steps} steps per epoch are fewer than num_workers={num_workers}: some workers' "
            "shards would never be read; use fewer workers or more steps"
        )
    return None


def stream_resume_reason(dataset: Any) -> str:
    """Why a Lightning resume of a train ``StreamingShardedDataset`` is exact, and when."""
    if dataset.limited:
        return STREAM_RESUME_REASON
    found = entry_points(group="lightning.pytorch.callbacks_factory")
    if any(ep.value.startswith("loaderkit.") for ep in found):
        return (
            STREAM_RESUME_REASON + " (an epoch of unknown length: ElasticResume, on every Trainer)"
        )
    return (
        STREAM_RESUME_REASON + "; an epoch of unknown length (no steps_per_epoch or "
        "samples_per_epoch) also needs loaderkit.ElasticResume() in the Trainer's callbacks "
        "(loaderkit is not installed, so its entry point does not add it)"
    )


def split_indices(owner: str, size: int, fraction: float, seed: int) -> tuple[np.ndarray, ...]:
    """Disjoint, sorted ``(train, val)`` index arrays: a seeded permutation cut at ``fraction``."""
    n_val = round(size * fraction)
    if n_val < 1 or n_val >= size:
        raise ValueError(
            f"{owner}: val_fraction={fraction} of {size} samples leaves {n_val} for validation "
            f"and {size - n_val} for training; change val_fraction or pass more data."
        )
    gen = torch.Generator().manual_seed(derive_seed(seed, SeedTag.VAL_SPLIT))
    perm = torch.randperm(size, generator=gen).numpy()
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def batch_rows(batch: Any) -> int:
    """Rows of a collated batch: the first dim of its first tensor (dicts, tuples, ...)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        parts: Any = batch.values()
    elif isinstance(batch, (tuple, list)):
        parts = batch
    else:
        parts = vars(batch).values() if hasattr(batch, "__dict__") else ()
    for part in parts:
        if part is None:
            continue
        rows = batch_rows(part)
        if rows:
            return rows
    return 0


def epoch_samples(loader: Any, dataset: Any) -> int:
    """The samples ``loader`` draws in epoch 0 over all ranks: a mix's or a sampler's epoch,
    a bucket plan's batches, else ``len(dataset)``."""
    plan = getattr(loader, "plan", None)
    if isinstance(plan, SamplerPlan | MixPlan):
        return int(plan.epoch_length(0))
    if isinstance(plan, BucketPlan):  # its positions count batches: count the samples
        sched = plan.schedule(0, start=0, rank=0, world_size=1)
        return sum(len(sched.indices(step)) for step in range(sched.num_steps))
    return len(dataset)


def time_loader(
    loader: Any, *, first: int, budget_s: float, max_batches: int = 200
) -> tuple[float, float]:
    """``(seconds to the first ``first`` batches, samples/s after them)`` of ``loader``, the
    rate timed for about ``budget_s`` seconds (5 to ``max_batches`` batches)."""
    start = time.perf_counter()
    it = iter(loader)
    try:
        head = list(itertools.islice(it, first))
        ready = time.perf_counter()
        rows = batches = 0
        for batch in it:
            rows += batch_rows(batch)
            batches += 1
            if batches >= max_batches or (batches >= 5 and time.perf_counter() - ready >= budget_s):
                break
        if batches == 0:  # an epoch of at most `first` batches
            return ready - start, sum(map(batch_rows, head)) / max(ready - start, 1e-9)
        return ready - start, rows / max(time.perf_counter() - ready, 1e-9)
    finally:
        close = getattr(it, "close", None)
        if callable(close):
            close()  # stop the workers now, not when the iterator is collected


def probe_workers(
    dm: Any, max_workers: int, budget_s: float
) -> tuple[dict[int, float], dict[int, float], int]:
    """Train samples/s and start-up seconds by ``num_workers`` 0..``max_workers``, and the
    fewest workers within 10% of the best rate."""
    rates: dict[int, float] = {}
    startup: dict[int, float] = {}
    dataset = dm._dataset("train")
    if isinstance(dataset, StreamingShardedDataset):  # no more workers than steps
        steps = dataset.epoch_steps(dm.batch_size, dm._world_size())
        max_workers = max_workers if steps is None else min(max_workers, steps)
    for workers in range(max_workers + 1):
        loader = dm.loader("train", num_workers=workers, pin_memory=False)
        startup[workers], rates[workers] = time_loader(
            loader, first=max(workers, 1), budget_s=budget_s / (max_workers + 1)
        )
    best = max(rates.values())
    return rates, startup, min(w for w, r in rates.items() if r >= 0.9 * best)


def plain(value: Any) -> bool:
    """A path, None, or a dict of paths (or lists of paths): fit for ``hparams``, unlike data."""
    if isinstance(value, (str, os.PathLike, type(None))):
        return True
    if isinstance(value, Mapping):
        return all(
            isinstance(v, (str, os.PathLike))
            or (isinstance(v, list) and all(isinstance(p, (str, os.PathLike)) for p in v))
            for v in value.values()
        )
    return False


def path_text(value: Any) -> Any:
    """``value`` (a :func:`plain` argument) with its paths as strings, numpy scalars as Python
    numbers and numpy dtypes as their strings (``'<i4'``: byte order kept): a checkpoint that
    ``torch.load(weights_only=True)`` reads holds none of them."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).str
    if isinstance(value, Mapping):
        return {key: path_text(v) for key, v in value.items()}
    if isinstance(value, list):
        return [path_text(v) for v in value]
    if type(value) is tuple:  # not a namedtuple: its fields are the user's
        return tuple(path_text(v) for v in value)
    return value


def shard_files(dataset: Any, *, views: bool = False) -> set[str]:
    """The shard files (real paths) and URLs that ``dataset``'s samples come from, through a
    mix's sources and, with ``views``, torch's subsets, concatenations and stacks; empty for
    data that is not shards. (A train subset shares files, not samples, with a subset of the
    rest.)"""
    sources = getattr(dataset, "sources", None)
    if views and isinstance(dataset, Subset | _Subset):
        sources = [dataset.dataset]
    elif views and (wrapped := torch_parts(dataset)) is not None:
        sources = wrapped[1]
    if isinstance(sources, list):
        return set().union(*(shard_files(s, views=views) for s in sources))
    shards = getattr(dataset, "shards", None)
    files = shards if isinstance(shards, list) else []
    return {
        os.path.realpath(f) if isinstance(f, os.PathLike) else f.url
        for f in files
        if isinstance(f, os.PathLike) or isinstance(getattr(f, "url", None), str)
    }


def is_hf_dataset(value: Any) -> bool:
    """A ``datasets.Dataset`` (duck-typed: without importing ``datasets``)."""
    return type(value).__name__ == "Dataset" and callable(getattr(value, "with_format", None))


def require_datamodule(obj: Any, target: str) -> Any:
    """``obj`` if it is a LightningDataModule, else a TypeError naming ``target`` and the fix."""
    if not isinstance(obj, L.LightningDataModule):
        raise TypeError(
            f"{target} gave a {type(obj).__name__}, not a LightningDataModule; return one."
        )
    return obj


class KeyLength:
    """A sample's token count: ``len(sample[key])`` for a mapping, else the length of a
    bare sequence (picklable); a tuple's ``len`` counts its fields and is refused."""

    def __init__(self, key: str, *, owner: str) -> None:
        self.key, self.owner = key, owner

    def __call__(self, sample: Any) -> int:
        if isinstance(sample, Mapping):  # a dict, a UserDict, transformers' BatchEncoding
            if self.key not in sample:
                raise KeyError(
                    f"{self.owner}: a sample has no field {self.key!r} (fields "
                    f"{sorted(sample)[:8]}); pass length_key= naming the token field."
                )
            return len(sample[self.key])
        if isinstance(sample, tuple):
            raise TypeError(
                f"{self.owner}: samples are tuples of {len(sample)} fields, whose len() is not "
                f"a token count; return dict samples with a {self.key!r} field (length_key=)."
            )
        shape = getattr(sample, "shape", None)
        return int(shape[0]) if shape else len(sample)


def is_remote_shards(shards: Shards) -> bool:
    """Whether ``shards`` (as :func:`shard_list` returns them) are at URLs."""
    return is_url(shards) or (isinstance(shards, list) and is_url(shards[0]))


def shard_list(owner: str, name: str, value: object) -> Shards:
    """``value`` as shards: a URL or list of URLs, a folder, or a list of existing files."""
    if is_url(value):
        return str(value)
    if isinstance(value, (list, tuple)) and value and all(is_url(v) for v in value):
        return [str(v) for v in value]
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if os.path.isdir(path):
            return path
        value = [path]
    if not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{owner}: {name} must be a directory, a shard file or a list of them, got "
            f"{value!r} ({type(value).__name__})."
        )
    if not value:
        raise ValueError(
            f"{owner}: {name} is an empty list; pass at least one shard file or a directory."
        )
    paths = []
    for item in value:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"{owner}: {name} must list paths, got {item!r}; pass shard paths.")
        if not os.path.exists(item):
            raise FileNotFoundError(
                f"{owner}: {name}: shard {os.fspath(item)!r} does not exist; check the path."
            )
        paths.append(os.fspath(item))
    return paths
