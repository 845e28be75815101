"""``ResumableDataLoader``'s arguments, validated into one spec by :func:`make_spec` (private)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any, Literal

import torch
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    Subset,
)

from loaderkit._checks import check_int, check_rank
from loaderkit.collate import PadCollate
from loaderkit.data.mixing import MixedDataset, held_mixes, holds_mix, torch_parts
from loaderkit.data.streaming import StreamingShardedDataset
from loaderkit.loader._args import (
    check_auto_workers,
    check_sources,
    check_torch_only_args,
    check_worker_args,
    from_distributed_sampler,
    whole_order_sampler,
)
from loaderkit.loader._fetch import Unbatched, _Subset, loaderkit_batch_read, split_source
from loaderkit.plan._sampler_plan import (
    SamplerPlan,
    generator_seed,
    set_epoch_reseeds,
    wrapped_sampler,
)
from loaderkit.plan.mix import MixBucketPlan, MixPlan
from loaderkit.plan.sample import Plan, SamplePlan
from loaderkit.seeding import draws_nothing
from loaderkit.transfer import default_device, resolve_pin_memory

OWNER = "ResumableDataLoader"
Kind = Literal["plan", "stream", "iterable"]
_AS_GIVEN = (
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoaderSpec:
    """Everything a loader is built from, validated."""

    kind: Kind
    dataset: Any
    plan: Plan  # a stand-in for a stream or an IterableDataset: never iterated
    reseed: Callable[[int], Plan] | None  # rebuilds the plan with an adopted seed
    batch_size: int | None  # the public value (None: unbatched, or a batch_sampler given)
    step_size: int  # samples per batch (1 when unbatched)
    shown_batch_size: int | None  # describe()'s: beside a batch_sampler, its plan's
    drop_last: bool  # the plan's where it has one; as given for a stream or an IterableDataset
    collate_fn: Any  # as given (wrapped when unbatched)
    sampler: Any
    batch_sampler: Any
    seed: int
    seed_explicit: bool  # else drawn: provisional, settled once the topology is known
    seed_chosen: bool  # explicit, or drawn from a generator the user seeded
    rank: int | None
    world_size: int | None
    workers: int  # worker processes to start with
    auto: bool  # num_workers="auto"
    pin: bool
    per_sample: bool | Literal["auto"]  # for the fetcher of map-style data
    read_under: tuple[tuple[int, ...], tuple[int, ...]] | None  # a mix plan's (see data/_reads.py)
    stream_per_sample: bool
    timeout: float
    worker_init_fn: Any
    multiprocessing_context: Any
    generator: torch.Generator | None
    prefetch_factor: int | None
    persistent_workers: bool
    pin_memory_device: str
    in_order: bool
    start_epoch: int  # the epoch the user set the sampler to before the loader (0: none)


def draw_seed(generator: torch.Generator | None) -> int:
    """A seed in ``[0, 2**63)`` drawn from ``generator`` (else torch's global one)."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def plain_sampler(sampler: Any, size: int) -> bool:
    """Whether ``sampler`` is one the loader's own plan replaces (else it is listed)."""
    return type(sampler) is SequentialSampler and len(sampler) == size


def engine_kind(dataset: Any) -> Kind:
    if isinstance(dataset, StreamingShardedDataset):
        if type(dataset).__iter__ is not StreamingShardedDataset.__iter__:
            raise TypeError(
                f"ResumableDataLoader: {type(dataset).__name__} overrides __iter__, which the "
                "loader never calls; pass transform=, or filter in the reader's function "
                "(IterableReader(fn))."
            )
        if type(dataset).read_from is not StreamingShardedDataset.read_from:
            # A resume reads from a saved offset: one counting what an override yielded
            # (some samples filtered out) points elsewhere in the shard.
            raise TypeError(
                f"ResumableDataLoader: {type(dataset).__name__} overrides read_from, whose "
                "offsets count the shard's samples; pass transform=, or filter in the reader's "
                "function (IterableReader(fn))."
            )
        return "stream"
    return "iterable" if isinstance(dataset, IterableDataset) else "plan"


def _check_rounding(batch_sampler: Any, collate_fn: Any) -> None:
    """Refuse a token budget that ``collate_fn`` pads past (a fixed length, another rounding)."""
    plan = getattr(batch_sampler, "plan", None)
    budget = getattr(plan, "max_tokens", None)
    pads = collate_fn.pad_to_multiple_of if isinstance(collate_fn, PadCollate) else None
    counted = getattr(plan, "pad_to_multiple_of", None) or 1
    fixed = collate_fn.max_length if isinstance(collate_fn, PadCollate) else None
    if budget is not None and fixed and collate_fn.pad_to_max_length:
        raise ValueError(
            f"ResumableDataLoader: collate_fn pads every batch to max_length={fixed}, so a "
            f"batch of r rows holds r * {fixed} tokens, over max_tokens={budget}; pass "
            "PadCollate(..., pad_to_max_length=False)."
        )
    cut: int = getattr(plan, "max_length", None) or 0
    if budget is not None and fixed and getattr(plan, "num_truncated", 0) and fixed > cut:
        raise ValueError(
            f"ResumableDataLoader: batch_sampler counts its over-long samples cut to "
            f"max_length={cut}, but collate_fn cuts them at max_length={fixed}, over "
            f"max_tokens={budget}; pass PadCollate(max_length={cut}, truncate=True)."
        )
    if budget is not None and pads and counted % pads:
        raise ValueError(
            f"ResumableDataLoader: collate_fn pads to a multiple of {pads}, but batch_sampler "
            f"counts max_tokens={budget} with lengths rounded to a multiple of {counted}, so "
            f"batches exceed the budget; pass pad_to_multiple_of={pads} to the sampler (or to "
            "the DataModule, not to its collate)."
        )


def make_spec(dataset: Any, args: dict[str, Any]) -> LoaderSpec:
    """Validate ``ResumableDataLoader(dataset, **args)`` into its spec."""
    kind = engine_kind(dataset)
    a = _unwrap(args, kind)
    check_torch_only_args(pin_memory_device=a["pin_memory_device"], in_order=a["in_order"])
    _check_topology(a)
    unbatched = a["batch_size"] is None and a["batch_sampler"] is None
    collate_fn = Unbatched(a["collate_fn"]) if unbatched else a["collate_fn"]
    size = check_sources(
        dataset,
        a["sampler"],
        a["batch_sampler"],
        1 if unbatched else a["batch_size"],
        a["shuffle"],
        a["drop_last"],
    )
    _check_rounding(a["batch_sampler"], a["collate_fn"])
    step_size = 1 if a["batch_size"] is None else a["batch_size"]
    own_epoch = _own_epoch(a["sampler"])
    try:
        seeds = _seed(a, size)
        if kind == "iterable" and a["per_sample_seeding"] is True:
            raise ValueError(
                "ResumableDataLoader: per_sample_seeding=True needs sample indices, and the "
                f"IterableDataset {type(dataset).__name__} has none; leave it 'auto', or draw "
                "from the dataset's own generator."
            )
        plan, reseed, topology = _plan(kind, dataset, a, size, step_size, seeds["seed"])
    finally:
        _put_epoch_back(a["sampler"], own_epoch)  # the probes listed epoch 0
    _check_mix_weights(dataset, plan, a["sampler"], args["batch_sampler"])
    mix = _mix_of(plan)
    shown = getattr(plan, "batch_size", None) if args["batch_sampler"] is not None else step_size
    return LoaderSpec(
        read_under=None if mix is None else (mix.per_epoch, mix.source_sizes),
        kind=kind,
        dataset=dataset,
        plan=plan,
        reseed=reseed,
        # torch's: None beside a batch_sampler (its batches are its own size).
        batch_size=None if unbatched or args["batch_sampler"] is not None else step_size,
        step_size=step_size,
        shown_batch_size=None if unbatched else shown,
        drop_last=getattr(plan, "drop_last", a["drop_last"]) if kind == "plan" else a["drop_last"],
        collate_fn=collate_fn,
        sampler=a["sampler"],
        batch_sampler=args["batch_sampler"],
        **seeds,
        **topology,
        **_workers(kind, dataset, a),
        **{name: a[name] for name in _AS_GIVEN},
        start_epoch=own_epoch if own_epoch is not None and kind == "plan" else 0,
    )


def _own_epoch(sampler: Any) -> int | None:
    """The int ``epoch`` the user set ``sampler`` to, if any (torch's DataLoader lists that
    epoch's order)."""
    epoch = getattr(sampler, "epoch", None)
    return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def _put_epoch_back(sampler: Any, epoch: int | None) -> None:
    """Set ``sampler.epoch`` back to ``epoch`` (the construction's probes set it to 0)."""
    if epoch is not None and getattr(sampler, "epoch", None) != epoch:
        with contextlib.suppress(AttributeError, TypeError):  # read-only: nothing to restore
            sampler.epoch = epoch


def _mix_of(plan: Plan) -> MixPlan | None:
    """The mix plan ``plan`` is or buckets, else None."""
    mix = plan.mix if isinstance(plan, MixBucketPlan) else plan
    return mix if isinstance(mix, MixPlan) else None


def _check_mix_weights(dataset: Any, plan: Plan, sampler: Any, batch_sampler: Any) -> None:
    """Refuse a weighted MixedDataset that ``plan`` (or ``sampler``, even a plain one) would
    read unweighted."""
    mix = _mix_of(plan)
    if isinstance(dataset, MixedDataset) and mix is not None:
        _check_same_mix(dataset, mix)
    inner = dataset.dataset if isinstance(dataset, _Subset) else dataset  # a DataModule's split
    if not holds_mix(inner, weighted=True):
        return
    if _read_by_its_mix(dataset, mix, sampler):
        return
    if not isinstance(dataset, MixedDataset):
        raise ValueError(
            f"ResumableDataLoader: dataset is a {type(dataset).__name__} holding a weighted "
            "MixedDataset, whose weights it would ignore; pass the MixedDataset itself (to "
            "split it, mix each source's split), or read a transform wrapping it with "
            "batch_sampler=mix.batch_sampler(...)."
        )
    if sampler is not None or not isinstance(plan, MixPlan | MixBucketPlan):
        name, given = (
            ("batch_sampler", batch_sampler) if batch_sampler is not None else ("sampler", sampler)
        )
        shown = f"{name}={type(given).__name__}" if given is not None else type(plan).__name__
        raise ValueError(
            f"ResumableDataLoader: the MixedDataset's weights would be ignored by {shown}; pass "
            "no sampler or batch_sampler (or batch_sampler=mix.batch_sampler(...)), or no weights."
        )


def _read_by_its_mix(dataset: Any, mix: Any, sampler: Any) -> bool:
    """Whether ``dataset``, a user's wrapper of one weighted mix (an augmentation), is read by
    that mix's own plan: its indices are the mix's, its weights kept."""
    if sampler is not None or not isinstance(mix, MixPlan) or isinstance(dataset, MixedDataset):
        return False
    if torch_parts(dataset) is not None or isinstance(dataset, Subset | _Subset):
        return False  # indices of its own
    held = [m for m in held_mixes(dataset) if m.per_epoch != m.sizes]
    if len(held) != 1 or len(dataset) != len(held[0]):
        return False
    _check_same_mix(held[0], mix)
    return True


def _check_same_mix(dataset: MixedDataset, mix: MixPlan) -> None:
    """Refuse a mix plan built for another MixedDataset (its weights would be read)."""
    fields = {
        "source sizes": (tuple(dataset.sizes), mix.source_sizes),
        "draws per epoch (per_epoch)": (tuple(dataset.per_epoch), mix.per_epoch),
        "source names": (tuple(dataset.names), mix.source_names),
    }
    if mix.source_names == tuple(map(str, range(len(mix.source_names)))):
        del fields["source names"]  # a plan built by hand, unnamed
    for field, (ours, plans) in fields.items():
        if ours != plans:
            raise ValueError(
                f"ResumableDataLoader: the batch_sampler's mix has {field} {list(plans)}, the "
                f"MixedDataset {list(ours)}: it was built for another mix; pass "
                "batch_sampler=dataset.batch_sampler(...) of this dataset."
            )


def _check_topology(a: dict[str, Any]) -> None:
    """``rank=`` and ``world_size=`` as ints where given (numpy's too, as torch's
    ``DistributedSampler`` takes them)."""
    if a["world_size"] is not None:
        fix = "pass the number of data-parallel ranks"
        a["world_size"] = check_int(
            "world_size", a["world_size"], 1, owner=OWNER, fix=fix, numpy_ok=True
        )
    if a["rank"] is not None:
        fix = "pass this process's data-parallel rank"
        a["rank"] = check_int("rank", a["rank"], 0, owner=OWNER, fix=fix, numpy_ok=True)
        if a["world_size"] is not None:
            check_rank(a["rank"], a["world_size"], owner=OWNER)


def _unwrap(args: dict[str, Any], kind: Kind) -> dict[str, Any]:
    """The arguments, with a torch ``BatchSampler`` taken as its sampler and batch size (for
    map-style data: a stream refuses it by its name)."""
    a, given = dict(args), args["batch_sampler"]
    a["shuffle"] = False if a["shuffle"] is None else a["shuffle"]  # torch's default is None
    defaults = (a["batch_size"], a["shuffle"], a["sampler"], a["drop_last"])
    # A subclass that batches as BatchSampler does (its own __iter__/__len__ would not) too.
    torchs = isinstance(given, BatchSampler) and all(
        getattr(type(given), name) is getattr(BatchSampler, name)
        for name in ("__iter__", "__len__")
    )
    if torchs and defaults == (1, False, None, False) and kind == "plan":
        a.update(sampler=given.sampler, batch_size=given.batch_size, drop_last=given.drop_last)
        a["batch_sampler"] = None
    return a


def _seeded_by_user(sampler: Any) -> int | None:
    """The seed the user gave ``sampler``'s generator (a loader ``seed`` would replace it); None
    where its ``set_epoch`` reseeds it, or it has torch's default seed."""
    inner = wrapped_sampler(sampler)  # a DistributedSamplerWrapper's inner one
    inner = sampler if inner is None else inner
    # initial_seed(), not the state: a generator drawn from since (random_split) is still theirs.
    own = inner.generator.initial_seed()
    if own == _TORCH_DEFAULT_SEED or set_epoch_reseeds(inner):
        return None
    return int(own)


_TORCH_DEFAULT_SEED = torch.Generator().initial_seed()


def _seed(a: dict[str, Any], size: int) -> dict[str, Any]:
    """The seed (and whether the user chose it, or it was drawn); updates ``a``'s topology."""
    sampler, seed = a["sampler"], a["seed"]
    distributed = isinstance(sampler, DistributedSampler)
    if distributed:
        seed, a["rank"], a["world_size"] = from_distributed_sampler(
            sampler, size, seed, a["rank"], a["world_size"]
        )
    # A seed the user gave the sampler's own generator decides, as under DataLoader.
    a["first_state"] = a["generator_seed"] = None
    user_generator = None
    if sampler is not None and not plain_sampler(sampler, size):
        user_generator = generator_seed(sampler)
    # A seed= given would key every epoch, the generator's own too (a state cannot tell): refused,
    # unless it is the one the generator gives (a DataModule's hook seeded from self.seed).
    if user_generator is not None and (seed in (None, user_generator[0]) or distributed):
        seed = user_generator[0] if seed is None else seed
        a["first_state"] = user_generator[1]
        # Beside a DistributedSampler's seed, the generator's keys the later epochs too: its
        # initial_seed(), which a loader built after another drew from it still reads.
        inner = wrapped_sampler(sampler)
        own = (sampler if inner is None else inner).generator
        a["generator_seed"] = own.initial_seed() if distributed else None
    elif user_generator is not None and (own := _seeded_by_user(sampler)) is not None:
        drawn = " and drawn from since" if own == seed else ""  # seed=own lists another order
        raise ValueError(
            f"{OWNER}: seed={seed} would replace the order of the sampler's own generator "
            f"(seeded {own}{drawn}); leave seed=None to use it, or give both the same seed."
        )
    plan_seed = getattr(getattr(a["batch_sampler"], "plan", None), "seed", None)
    if plan_seed is not None and seed is not None and seed != plan_seed:
        raise ValueError(
            f"ResumableDataLoader: seed={seed} differs from the batch sampler's plan seed "
            f"{plan_seed}; leave seed=None to use the plan's."
        )
    if seed is None:
        seed = plan_seed
    # A user's seed (a plan's too) is never replaced by a saved one; a drawn one is provisional.
    explicit = seed is not None
    generator = a["generator"]
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"{OWNER}: generator must be a torch.Generator, got {generator!r}; pass "
            "torch.Generator().manual_seed(s), or seed=s."
        )
    # A generator the user seeded chose the seed as seed= would: a saved state's other one is
    # refused, not adopted (as for a sampler's own generator).
    own = None if generator is None else generator.initial_seed()
    chosen = own not in (None, _TORCH_DEFAULT_SEED)
    if chosen and a["seed"] is not None:
        raise ValueError(
            f"{OWNER}: seed={a['seed']} would replace the order of generator= (seeded "
            f"{own}); pass one of them."
        )
    if seed is None:
        seed = draw_seed(generator)
    seed = check_int(
        "seed",
        seed,
        0,
        owner=OWNER,
        fix="pass a non-negative int such as seed=0",
        limit=2**128,
        numpy_ok=True,
    )
    return {"seed": seed, "seed_explicit": explicit, "seed_chosen": explicit or chosen}


def _plan(
    kind: Kind, dataset: Any, a: dict[str, Any], size: int, batch_size: int, seed: int
) -> tuple[Plan, Callable[[int], Plan] | None, dict[str, Any]]:
    """The plan, how to rebuild it with another seed (None: never), and the topology."""
    sampler, batch_sampler = a["sampler"], a["batch_sampler"]
    rank, world_size = a["rank"], a["world_size"]
    plan: Any
    reseed: Callable[[int], Plan] | None = None
    if batch_sampler is None:
        fix = "pass the number of samples per batch"
        check_int("batch_size", batch_size, 1, owner=OWNER, fix=fix)
    if kind != "plan":
        plan = SamplePlan(num_samples=1, batch_size=batch_size, seed=seed)  # a stand-in
    elif batch_sampler is not None:
        plan = batch_sampler.plan
        for name, given in (("rank", rank), ("world_size", world_size)):
            its = getattr(batch_sampler, name)
            if None not in (given, its) and given != its:
                raise ValueError(
                    f"{OWNER}: {name}={given} differs from the batch_sampler's {its}; leave "
                    f"{name} unset to take the sampler's."
                )
        rank = batch_sampler.rank if rank is None else rank
        world_size = batch_sampler.world_size if world_size is None else world_size
    elif sampler is not None and not plain_sampler(sampler, size):
        distributed = isinstance(sampler, DistributedSampler)
        plan = SamplerPlan(
            sampler=whole_order_sampler(sampler) if distributed else sampler,
            strided=distributed,
            drop_tail=distributed and bool(sampler.drop_last),
            dataset_size=size,
            batch_size=batch_size,
            seed=seed,
            drop_last=a["drop_last"],
            first_state=a["first_state"],
            generator_seed=a["generator_seed"],
        )
    elif isinstance(dataset, MixedDataset) and dataset.per_epoch != dataset.sizes:
        # A weighted mix's own plan (an unweighted mix is read as any dataset).
        options = {"shuffle": a["shuffle"], "drop_last": a["drop_last"]}
        reseed = partial(_mix_plan, dataset, batch_size, options)
        plan = reseed(seed)
    else:
        plan = SamplePlan(
            num_samples=size,
            batch_size=batch_size,
            shuffle=a["shuffle"],
            seed=seed,
            drop_last=a["drop_last"],
        )
    if isinstance(plan, SamplePlan | SamplerPlan):
        reseed = partial(_replace_seed, plan)
    if plan.num_samples != size and kind == "plan" and not isinstance(plan, SamplerPlan):
        raise ValueError(
            f"ResumableDataLoader: the batch sampler's plan covers {plan.num_samples} "
            f"samples but the dataset has {size}; "
            + (
                "pass one length per dataset index."
                if hasattr(plan, "lengths")
                else f"build the plan with num_samples={size}."
                if isinstance(plan, SamplePlan)
                else "the dataset's own plans cover all of its samples: drop the len() "
                "override, or read a part as torch.utils.data.Subset(dataset, indices) with "
                "shuffle=True in place of the batch sampler."
            )
        )
    return plan, reseed, {"rank": rank, "world_size": world_size}


def _replace_seed(plan: Any, seed: int) -> Plan:
    return dataclasses.replace(plan, seed=seed)


def _mix_plan(mix: MixedDataset, batch_size: int, options: dict[str, bool], seed: int) -> Plan:
    return mix.plan(batch_size, seed=seed, **options)


def _workers(kind: Kind, dataset: Any, a: dict[str, Any]) -> dict[str, Any]:
    """The worker settings, checked."""
    num_workers, per_sample_seeding = a["num_workers"], a["per_sample_seeding"]
    auto = isinstance(num_workers, str) and num_workers == "auto"
    if auto:
        check_auto_workers(dataset, a, iterable=kind != "plan")
    workers = check_worker_args(a, 1 if auto else num_workers)
    pin = resolve_pin_memory(a["pin_memory"], default_device(), stacklevel=5)  # caller's line
    unseeded = loaderkit_batch_read(dataset) or draws_nothing(split_source(dataset))
    per_sample = not unseeded if per_sample_seeding == "auto" else per_sample_seeding
    per_sample = per_sample and kind != "iterable"
    return {
        "workers": 0 if auto else workers,
        "auto": auto,
        "pin": pin,
        "per_sample": per_sample and per_sample_seeding,
        "stream_per_sample": per_sample_seeding is not False,
    }
