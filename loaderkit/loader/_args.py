"""Checks of ``ResumableDataLoader``'s ``DataLoader`` keyword arguments (private)."""

from __future__ import annotations

import copy
import math
import multiprocessing
import multiprocessing.context
import warnings
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DistributedSampler, IterableDataset

from loaderkit._checks import check_bool, check_int
from loaderkit.data.streaming import StreamingShardedDataset
from loaderkit.env import cpu_budget
from loaderkit.plan._sampler_plan import RankShares, list_order, wrapped_sampler
from loaderkit.plan.samplers import check_lendable, check_resumable_sampler

OWNER = "ResumableDataLoader"


def check_sources(
    dataset: Any,
    sampler: Any,
    batch_sampler: Any,
    batch_size: int | None,
    shuffle: bool,
    drop_last: bool,
) -> int:
    """Validate the dataset and how it is sampled; returns its size (0 for a stream)."""
    stream = isinstance(dataset, StreamingShardedDataset)
    iterable = isinstance(dataset, IterableDataset) and not stream
    if not stream and not iterable and not hasattr(dataset, "__getitem__"):
        raise TypeError(
            f"ResumableDataLoader: dataset must be map-style (with __len__ and "
            f"__getitem__), a torch IterableDataset or a StreamingShardedDataset, got "
            f"{type(dataset).__name__}; wrap streams in a torch IterableDataset."
        )
    if stream and (sampler is not None or batch_sampler is not None or shuffle):
        raise ValueError(
            "ResumableDataLoader: a StreamingShardedDataset takes no sampler, batch_sampler "
            "or shuffle; leave them unset (shuffle_shards=True shuffles its shards)."
        )
    if iterable:
        _check_iterable(dataset, sampler, batch_sampler, shuffle, drop_last)
        return 0
    if not stream and not callable(getattr(dataset, "__len__", None)):
        raise TypeError(
            f"ResumableDataLoader: dataset {type(dataset).__name__} has __getitem__ but no "
            "__len__; add __len__, or make it a torch IterableDataset."
        )
    size = 0 if stream else len(dataset)
    if size == 0 and not stream:
        raise ValueError(
            "ResumableDataLoader: dataset is empty (len 0); pass a dataset with at least "
            "one sample."
        )
    check_bool("shuffle", shuffle, owner=OWNER)
    check_bool("drop_last", drop_last, owner=OWNER)
    if sampler is not None and shuffle:
        raise ValueError(
            "ResumableDataLoader: shuffle=True cannot be combined with an explicit "
            f"sampler ({type(sampler).__name__}); pass one or the other."
        )
    if batch_sampler is not None:
        _check_batch_sampler(batch_sampler, batch_size, shuffle, sampler, drop_last)
    return size


def _check_iterable(
    dataset: Any, sampler: Any, batch_sampler: Any, shuffle: bool, drop_last: bool
) -> None:
    given = {"sampler": sampler, "batch_sampler": batch_sampler, "shuffle": shuffle}
    for name, value in given.items():
        if value not in (None, False):
            raise ValueError(
                f"ResumableDataLoader: an IterableDataset takes no {name}, got {name}={value!r} "
                f"({type(dataset).__name__}); leave it unset and shuffle inside the dataset."
            )
    check_bool("drop_last", drop_last, owner=OWNER)


def _check_batch_sampler(
    batch_sampler: Any, batch_size: int | None, shuffle: bool, sampler: Any, drop_last: bool
) -> None:
    given = {"batch_size": batch_size, "shuffle": shuffle, "sampler": sampler}
    given["drop_last"] = drop_last
    # A value counts as set unless it is the default itself (0 and 0.0 are not 1 or False).
    default = {"batch_size": 1, "shuffle": False, "sampler": None, "drop_last": False}
    clash = [
        f"{k}={v!r}" for k, v in given.items() if type(v) is not type(default[k]) or v != default[k]
    ]
    if clash:
        raise ValueError(
            "ResumableDataLoader: batch_sampler is mutually exclusive with batch_size, "
            f"shuffle, sampler and drop_last, got {', '.join(clash)}; set those on the batch "
            "sampler's plan and leave them at their defaults here."
        )
    check_resumable_sampler(batch_sampler, parameter="batch_sampler")
    check_lendable(batch_sampler)


def check_worker_args(a: dict[str, Any], num_workers: Any) -> int:
    """Validate the worker and transfer settings of the arguments ``a``, ``num_workers`` the
    count to start with; returns it."""
    fix = "use 0 to load in-process, or 'auto' to choose from measurement"
    workers = check_int("num_workers", num_workers, 0, owner=OWNER, fix=fix)
    _check_timeout(a["timeout"], workers)
    prefetch_factor, persistent_workers = a["prefetch_factor"], a["persistent_workers"]
    if prefetch_factor is not None:
        fix = "pass batches per worker, e.g. 2"
        check_int("prefetch_factor", prefetch_factor, 1, owner=OWNER, fix=fix)
    if prefetch_factor is not None and num_workers == 0:
        raise ValueError(
            "ResumableDataLoader: prefetch_factor only applies with num_workers > 0, got "
            f"prefetch_factor={prefetch_factor} with num_workers=0; leave it None."
        )
    check_bool("persistent_workers", persistent_workers, owner=OWNER)
    if persistent_workers and num_workers == 0:
        raise ValueError(
            "ResumableDataLoader: persistent_workers=True needs num_workers > 0, got "
            "num_workers=0; pass num_workers=1 (or more), or persistent_workers=False."
        )
    _check_choices(a)
    check_start_method(a["multiprocessing_context"], workers)
    cores = cpu_budget()
    if workers > cores:
        # Said once here; torch's per-epoch copy is silenced in the workers' DataLoader.
        warnings.warn(
            f"ResumableDataLoader: num_workers={workers} is more than the {cores} CPU cores "
            "this process may use, and excess workers slow loading or freeze the machine; "
            "lower num_workers, or pass num_workers='auto'.",
            UserWarning,
            stacklevel=5,  # the caller of ResumableDataLoader(), through make_spec
        )
    return workers


def _check_choices(a: dict[str, Any]) -> None:
    collate_fn, worker_init_fn = a["collate_fn"], a["worker_init_fn"]
    pin_memory, per_sample_seeding = a["pin_memory"], a["per_sample_seeding"]
    for name, fn in (("collate_fn", collate_fn), ("worker_init_fn", worker_init_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(
                f"ResumableDataLoader: {name} must be callable, got {fn!r} "
                f"({type(fn).__name__}); pass a function (module-level, so workers can "
                "unpickle it), or None for the default."
            )
    if not (isinstance(pin_memory, bool) or pin_memory == "auto"):
        raise ValueError(
            f"ResumableDataLoader: pin_memory must be True, False or 'auto', got "
            f"{pin_memory!r}; pass one of these."
        )
    if not (isinstance(per_sample_seeding, bool) or per_sample_seeding == "auto"):
        raise ValueError(
            "ResumableDataLoader: per_sample_seeding must be True, False or 'auto', got "
            f"{per_sample_seeding!r}; pass one of these."
        )


def _check_timeout(timeout: Any, workers: int) -> None:
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise TypeError(
            f"ResumableDataLoader: timeout must be a number of seconds, got {timeout!r} "
            f"({type(timeout).__name__}); pass e.g. timeout=60, or 0 to wait forever."
        )
    if not math.isfinite(timeout) or timeout < 0:
        raise ValueError(
            f"ResumableDataLoader: timeout must be a finite number of seconds >= 0, got "
            f"{timeout}; pass e.g. timeout=60, or 0 to wait forever."
        )
    if timeout > 0 and workers == 0:
        raise ValueError(
            f"ResumableDataLoader: timeout={timeout} needs num_workers >= 1 (it would never "
            "apply in-process); pass num_workers=1 (or more), or timeout=0."
        )


def check_torch_only_args(*, pin_memory_device: Any, in_order: Any) -> None:
    """DataLoader arguments the loader takes for compatibility, checked."""
    if not isinstance(pin_memory_device, str):
        raise TypeError(
            f"{OWNER}: pin_memory_device must be a str, got {pin_memory_device!r}; pass e.g. "
            "'cuda', or leave it '' for the current accelerator."
        )
    check_bool("in_order", in_order, owner=OWNER)
    if not in_order:
        raise ValueError(
            f"{OWNER}: in_order=False is not supported (a saved position needs batches in "
            "order); pass in_order=True."
        )


def from_distributed_sampler(
    sampler: Any, size: int, seed: int | None, rank: int | None, world_size: int | None
) -> tuple[int, int, int]:
    """A ``DistributedSampler``'s ``(seed, rank, world_size)``, checked against the arguments."""
    # A subclass may wrap another sampler: its indices are checked as it lists them.
    covered = len(sampler.dataset)
    if type(sampler) is DistributedSampler and covered != size:
        raise ValueError(
            f"{OWNER}: the DistributedSampler covers {covered} samples but the "
            f"dataset has {size}; build the sampler over this dataset."
        )
    for name, given, its in (
        ("seed", seed, sampler.seed),
        ("rank", rank, sampler.rank),
        ("world_size", world_size, sampler.num_replicas),
    ):
        if given is not None and given != its:
            raise ValueError(
                f"{OWNER}: {name}={given} differs from the DistributedSampler's {its}; leave "
                f"{name} unset to take the sampler's."
            )
    if isinstance(sampler.seed, bool) or not isinstance(sampler.seed, int) or sampler.seed < 0:
        # A numpy int passes Integral, then torch's own manual_seed refuses it.
        raise ValueError(
            f"{OWNER}: the DistributedSampler's seed must be an int >= 0 (it keys the order "
            f"and each sample's randomness), got seed={sampler.seed!r}; build it with seed=0."
        )
    return int(sampler.seed), int(sampler.rank), int(sampler.num_replicas)  # numpy ints too


def whole_order_sampler(sampler: Any) -> Any:
    """A copy of a ``DistributedSampler`` (or subclass) listing every rank's indices, for the
    loader to deal (:class:`RankShares` for a subclass with its own split)."""
    whole = _sampler_copy(sampler, 1, 0)
    whole.num_samples = whole.total_size = (
        sampler.total_size if sampler.drop_last else len(sampler.dataset)
    )
    if type(sampler) is DistributedSampler:
        return whole
    inner = wrapped_sampler(sampler)
    if inner is not None:
        return WrapperWhole(whole, inner)
    shares = [_sampler_copy(sampler, sampler.num_replicas, r) for r in range(sampler.num_replicas)]
    listed = [_listing(share, len(whole)) for share in shares]  # uneven ones named below
    order = _listing(whole)
    ranks = len(shares)
    if _listing(whole) != order:
        return whole  # not reproducible: refused by name (check_reproducible)
    if order and listed == [
        [order[i % len(order)] for i in range(r, len(listed[0]) * ranks, ranks)]
        for r in range(ranks)
    ]:
        return whole  # torch's stride: dealt from the whole order, on any world size
    if len({len(share) for share in listed}) > 1:
        raise ValueError(
            f"ResumableDataLoader: sampler={type(sampler).__name__} gives its ranks "
            f"{[len(share) for share in listed]} indices, not equal shares; pad its per-rank "
            "shares to equal length, as DistributedSampler does."
        )
    return RankShares(shares)


def _sampler_copy(sampler: Any, num_replicas: int, rank: int) -> Any:
    copied = copy.copy(sampler)
    copied.__dict__.pop("set_epoch", None)  # a loader's hook on the original (views.py)
    copied.num_replicas, copied.rank = num_replicas, rank
    return copied


def _listing(sampler: Any, at_least: int = 0) -> list[int]:
    sampler.set_epoch(0)
    return [int(i) for i in list_order(sampler, at_least)]  # bounded: endless ones refused


class WrapperWhole:
    """A ``DistributedSamplerWrapper``'s whole order; ``generator`` is its inner sampler's."""

    def __init__(self, whole: Any, inner: Any) -> None:
        self.whole, self.inner = whole, inner

    @property
    def generator(self) -> Any:
        return self.inner.generator  # AttributeError where it has none: nothing to key

    @generator.setter
    def generator(self, value: Any) -> None:
        self.inner.generator = value

    def set_epoch(self, epoch: int) -> None:
        self.whole.set_epoch(epoch)  # forwarded to the inner sampler by the wrapper

    def __iter__(self) -> Iterator[int]:
        return iter(self.whole)

    def __len__(self) -> int:
        return len(self.whole)


def check_start_method(context: Any, workers: int) -> None:
    """``multiprocessing_context``: None, a start method's name, or a multiprocessing context."""
    if context is None:
        return
    methods = multiprocessing.get_all_start_methods()
    if isinstance(context, str):
        if context not in methods:
            raise ValueError(
                f"ResumableDataLoader: multiprocessing_context={context!r} is not a start "
                f"method of this platform; pass one of {', '.join(map(repr, methods))}, a "
                "multiprocessing context, or None for the default."
            )
    elif not isinstance(context, multiprocessing.context.BaseContext):
        raise TypeError(
            f"ResumableDataLoader: multiprocessing_context must be a start method name or a "
            f"multiprocessing context, got {context!r} ({type(context).__name__}); pass e.g. "
            "'spawn' or multiprocessing.get_context('spawn'), or None for the default."
        )
    if workers == 0:
        raise ValueError(
            f"ResumableDataLoader: multiprocessing_context={context!r} needs num_workers >= 1; "
            "pass num_workers=1 (or more), or leave it None."
        )


def check_auto_workers(dataset: Any, a: dict[str, Any], *, iterable: bool) -> None:
    """Refuse ``num_workers="auto"`` where switching workers changes the data or the timeout."""
    timeout, per_sample_seeding = a["timeout"], a["per_sample_seeding"]
    if isinstance(timeout, int | float) and timeout > 0:
        raise ValueError(
            f"ResumableDataLoader: timeout={timeout} with num_workers='auto' would not hold: "
            "each epoch starts loading in this process; pass an int num_workers >= 1 to "
            "enforce the timeout, or timeout=0."
        )
    if iterable:
        raise ValueError(
            f"ResumableDataLoader: num_workers='auto' cannot serve the iterable "
            f"{type(dataset).__name__} (its worker count must stay fixed); pass an int "
            "num_workers, e.g. num_workers=2."
        )
    if a["worker_init_fn"] is not None:
        raise ValueError(
            "ResumableDataLoader: num_workers='auto' loads batches in this process until it "
            "starts workers, so worker_init_fn would miss them; pass an int num_workers, or "
            "worker_init_fn=None."
        )
    if per_sample_seeding is False:
        raise ValueError(
            "ResumableDataLoader: num_workers='auto' with per_sample_seeding=False makes "
            "augmentation depend on which process loads a sample; leave per_sample_seeding "
            "'auto' (or True), or pass an int num_workers."
        )
