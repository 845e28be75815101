"""A torch ``Sampler``'s order as a plan (private): each epoch's order keyed to ``(seed, epoch)``,
listed once and dealt like a :class:`~loaderkit.SamplePlan`'s (``docs/design.md``).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import operator
import sys
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from loaderkit._checks import check_bool, check_int, check_rank
from loaderkit._tags import SeedTag
from loaderkit.errors import StateMismatchError
from loaderkit.plan.sample import (
    _FixedSchedule,
    occurrence_keys,
    plan_settings,
    steps_from,
)
from loaderkit.seeding import derive_seed, rngs_put_back

# The attribute under which a hooked ``set_epoch`` keeps the sampler's own one.
UNHOOKED = "_loaderkit_unhooked"


def keyed_order(
    sampler: Any,
    seed: int,
    epoch: int,
    first_state: torch.Tensor | None = None,
    seen: torch.Tensor | None = None,
    restored: Any = None,
    *,
    lend: bool = True,
    advance: bool = False,
    generator_seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``sampler``'s order in ``epoch`` (int64) keyed to ``(seed, epoch)``, and the user's
    reseeded generator state it was listed from (else None).

    The ``generator`` slot is lent one started from ``restored`` (a saved state, or
    ``_KEYED``), the user's reseeded state (differing from ``seen``), epoch 0's
    ``first_state``, else ``(seed, epoch)`` (and ``generator_seed``, the user's generator's
    where ``seed`` is another's). ``lend=False``: an empty slot stays empty;
    ``advance``: the user's generator ends where the lent one did, as torch leaves it.
    """
    own = getattr(sampler, "generator", _ABSENT)
    # Only torch's slot (None or a torch.Generator); check_reproducible refuses any other.
    if not (isinstance(own, torch.Generator) or (own is None and lend)):
        _set_epoch(sampler, epoch)
        return list_order(sampler), None
    current = cpu_state(own)
    reseeded = None
    keyed = torch.Generator()
    if isinstance(restored, torch.Tensor):
        keyed.set_state(restored)
        reseeded = restored
    elif (
        restored is None
        and seen is not None
        and current is not None
        and not torch.equal(current, seen)
    ):
        keyed.set_state(current)
        reseeded = current
    elif epoch == 0 and first_state is not None:
        keyed.set_state(first_state)
    else:
        keys = (epoch,) if generator_seed is None else (epoch, generator_seed)
        keyed.manual_seed(derive_seed(seed, SeedTag.SAMPLER, *keys))
        # Keyed by the user's seed itself: their generator stays, so a later loader keys alike.
        advance = advance and generator_seed is None
    _lend_generator(sampler, keyed)
    try:
        _set_epoch(sampler, epoch)
        order = list_order(sampler)
        end = cpu_state(sampler.generator)
        if advance and isinstance(own, torch.Generator) and current is not None and end is not None:
            own.set_state(end)
        return order, reseeded
    finally:
        sampler.generator = own


def _lend_generator(sampler: Any, generator: Any) -> None:
    """``sampler.generator = generator``; a named TypeError where it cannot be set."""
    try:
        sampler.generator = generator
    except (AttributeError, TypeError) as exc:  # a read-only property, or __slots__
        name = type(sampler).__name__
        raise TypeError(
            f"ResumableDataLoader: sampler={name} has a `generator` loaderkit cannot set to key "
            f"each epoch's order ({exc}). Make {name}.generator a plain attribute, or give "
            "its property a setter."
        ) from exc


# ``restored`` for an epoch the saved run keyed to (seed, epoch), not to a reseed.
_KEYED = object()


def _encoded(state: torch.Tensor | None) -> str | None:
    """A generator state as a state dict carries it (base64), or None."""
    return None if state is None else base64.b64encode(state.numpy().tobytes()).decode()


def _restored(listed_from: str | None) -> Any:
    """``restored`` for a saved ``listed_from`` (a reseeded generator's state, base64)."""
    if listed_from is None:
        return _KEYED
    return torch.frombuffer(bytearray(base64.b64decode(listed_from)), dtype=torch.uint8)


def generator_states_ok(states: Mapping[str, Any]) -> bool:
    """Whether saved ``generator_now``/``generator_seen`` are CPU generator states (base64)."""
    size = torch.Generator().get_state().numel()
    try:
        decoded = [base64.b64decode(v, validate=True) for v in states.values()]
    except (TypeError, ValueError):
        return False
    return "generator_now" in states and all(len(d) == size for d in decoded)


def cpu_state(generator: Any) -> torch.Tensor | None:
    """The state of a CPU ``torch.Generator``, else None."""
    if isinstance(generator, torch.Generator) and generator.device.type == "cpu":
        return generator.get_state()
    return None


def _set_epoch(sampler: Any, epoch: int) -> None:
    """``sampler.set_epoch(epoch)`` if it has one, unhooked (listing must not move a loader)."""
    set_epoch = getattr(sampler, "set_epoch", None)
    set_epoch = getattr(set_epoch, UNHOOKED, set_epoch)
    if callable(set_epoch):
        set_epoch(epoch)


_ABSENT = object()


def list_order(sampler: Any, at_least: int = 0) -> torch.Tensor:
    """``sampler``'s indices: at most ``max(len(sampler), at_least) + 1`` are drawn, so an
    endless sampler is refused, not listed."""
    name = type(sampler).__name__
    try:
        length = len(sampler)
    except TypeError as exc:  # a __len__ that refuses: no end to resume from
        raise TypeError(
            f"ResumableDataLoader: sampler={name}'s len() raised ({exc}); give it a __len__ "
            "that counts its indices per epoch, or pass shuffle=True instead."
        ) from exc
    limit = max(length, at_least)
    items = itertools.islice(sampler, limit + 1)
    order = torch.as_tensor(np.fromiter((_index(i, sampler) for i in items), dtype=np.int64))
    if order.numel() > limit:
        raise ValueError(
            f"ResumableDataLoader: sampler={name} yields more than {limit} indices, past its "
            f"len() of {length} (an endless sampler has no epoch to resume in); stop its "
            "__iter__ after len() indices, or make __len__ count them all."
        )
    return order


def check_sized(sampler: Any, *, owner: str, parameter: str) -> None:
    """TypeError unless ``sampler`` is an iterable with ``__len__`` (checked before listing)."""
    if not callable(getattr(sampler, "__iter__", None)):
        raise TypeError(
            f"{owner}: {parameter} must be an iterable of dataset indices (a torch "
            f"Sampler), got {type(sampler).__name__}."
        )
    if not callable(getattr(sampler, "__len__", None)):
        name = type(sampler).__name__
        raise TypeError(
            f"{owner}: {parameter}={name} has no __len__, so its epochs have no end to resume "
            f"from (an endless sampler is never listed). Give {name} a __len__ (indices per "
            "epoch) and end its __iter__ there, or pass shuffle=True instead."
        )


def _index(item: Any, sampler: Any) -> int:
    """``item`` as a dataset index (``int(item)`` would take ``"3"`` or ``2.5``)."""
    try:
        return operator.index(item)
    except TypeError:
        batches = hasattr(sampler, "batch_size") or hasattr(sampler, "plan")  # torch's, ours
        if batches and isinstance(item, list | tuple | torch.Tensor):
            name = type(sampler).__name__
            raise TypeError(
                f"ResumableDataLoader: sampler={name} yields batches of indices ({item!r}); "
                f"pass it as batch_sampler= (and drop batch_size)."
            ) from None
        raise TypeError(
            f"ResumableDataLoader: sampler={type(sampler).__name__} yielded {item!r} "
            f"({type(item).__name__}), not an integer index. Index the dataset by position "
            "(data = [dataset[k] for k in keys]), or give it __getitems__(indices) and pass "
            "integer indices with batch_size=."
        ) from None


def wrapped_sampler(sampler: Any) -> Any:
    """The sampler inside Lightning's ``DistributedSamplerWrapper``, else None."""
    module = sys.modules.get("lightning.fabric.utilities.distributed")
    wrapper = getattr(module, "DistributedSamplerWrapper", None)
    if wrapper is None or not isinstance(sampler, wrapper):
        return None
    return getattr(sampler.dataset, "_sampler", None)


def generator_seed(sampler: Any) -> tuple[int, torch.Tensor] | None:
    """The seed (``initial_seed()``, or a digest once drawn from) and state of the CPU
    ``torch.Generator`` the user gave ``sampler`` (or its wrapped sampler), else None."""
    inner = wrapped_sampler(sampler)
    generator = getattr(sampler if inner is None else inner, "generator", None)
    if not isinstance(generator, torch.Generator) or generator.device.type != "cpu":
        return None
    state = generator.get_state()
    seed = generator.initial_seed()
    if not torch.equal(torch.Generator().manual_seed(seed).get_state(), state):
        digest = hashlib.blake2b(state.numpy().tobytes(), digest_size=8).digest()
        seed = int.from_bytes(digest, "little") >> 1
    return seed, state


# The checksum's order is keyed to this seed, so a loader adopting a saved seed still matches.
_PROBE_SEED = 0


def seeds_itself(sampler: Any, epochs: tuple[int, ...] = (0, 1)) -> bool:
    """Whether ``sampler`` with an empty ``generator`` slot lists ``epochs`` alike under any
    RNG (an epoch sorted by length, a warm-up, draws nothing)."""
    if getattr(sampler, "generator", _ABSENT) is not None:
        return False
    own_epochs = callable(getattr(sampler, "set_epoch", None))  # may fill the slot itself
    state = torch.random.get_rng_state()
    try:
        for epoch in epochs:
            orders = []
            for seed in (1, 2):
                torch.manual_seed(seed)
                before = torch.random.get_rng_state()
                orders.append(keyed_order(sampler, _PROBE_SEED, epoch, lend=False)[0])
                if not torch.equal(before, torch.random.get_rng_state()):
                    return False  # it draws from the global RNG: a small draw may repeat
                if not own_epochs and getattr(sampler, "generator", None) is not None:
                    sampler.generator = None  # as given
                    raise ValueError(
                        f"ResumableDataLoader: sampler={type(sampler).__name__} sets its "
                        "generator as it lists, so its order depends on how often it was "
                        "listed; create it in __init__ (generator=torch.Generator()"
                        ".manual_seed(seed))."
                    )
                if not torch.equal(orders[0], orders[-1]):
                    return False
    finally:
        torch.random.set_rng_state(state)
    return True


def set_epoch_reseeds(sampler: Any) -> bool:
    """Whether ``sampler.set_epoch`` seeds its ``generator`` slot (its order is then its own)."""
    own = getattr(sampler, "generator", _ABSENT)
    if not callable(getattr(sampler, "set_epoch", None)) or not (
        own is None or isinstance(own, torch.Generator)
    ):
        return False
    after = []
    _lend_generator(sampler, own)  # refused by name where it cannot be set
    try:
        for start in (1, 2):
            sampler.generator = torch.Generator().manual_seed(start)
            _set_epoch(sampler, 0)
            after.append(cpu_state(sampler.generator))
    finally:
        sampler.generator = own
    return after[0] is not None and after[1] is not None and torch.equal(after[0], after[1])


def check_reproducible(
    sampler: Any, *, owner: str, parameter: str, lend: bool = True
) -> torch.Tensor:
    """Epoch 0's order under the probe seed; TypeError unless listed twice alike."""
    check_sized(sampler, owner=owner, parameter=parameter)
    first = keyed_order(sampler, _PROBE_SEED, 0, lend=lend)[0]
    second = keyed_order(sampler, _PROBE_SEED, 0, lend=lend)[0]
    if not torch.equal(first, second):
        generator = getattr(sampler, "generator", None)
        foreign = (
            f"Its `generator` is a {type(generator).__module__}.{type(generator).__qualname__}, "
            "which loaderkit does not reseed. "
            if generator is not None and not isinstance(generator, torch.Generator)
            else ""
        )
        raise TypeError(
            f"{owner}: {parameter}={type(sampler).__name__} lists a different order each time "
            f"for the same seed and epoch. {foreign}Give the sampler a set_epoch(epoch) that "
            "reseeds it, or a `generator` attribute (a torch.Generator or None), or use "
            "shuffle=True."
        )
    return first


@dataclass(frozen=True, kw_only=True, eq=False)
class SamplerPlan:
    """The plan of a torch sampler: its per-epoch order, dealt like a SamplePlan's.

    ``first_state``: the user's generator state epoch 0 is listed from; ``generator_seed``: its
    seed, where ``seed`` is another's (a ``DistributedSamplerWrapper``'s). ``strided``: deal as
    a ``DistributedSampler``; ``drop_tail``: as one with ``drop_last=True``.
    """

    sampler: Any
    dataset_size: int
    batch_size: int
    seed: int
    drop_last: bool = False
    first_state: torch.Tensor | None = field(default=None, repr=False)
    generator_seed: int | None = None
    strided: bool = False
    drop_tail: bool = False
    shuffle: bool = field(default=True, init=False)  # an unknown order counts as shuffled
    # Epoch -> its order and seeding keys (None: no index repeats); one epoch at a time.
    _cache: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _length: int = field(default=0, init=False, repr=False, compare=False)
    _lend: bool = field(default=True, init=False, repr=False, compare=False)
    _check: int = field(default=0, init=False, repr=False, compare=False)
    # The user's generator's state at the last listing (one differing from it was reseeded).
    _seen: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)
    # Epoch -> the reseeded state (base64) it was listed from, which a saved state carries.
    _sources: dict[int, str | None] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _restored: dict[int, Any] = field(default_factory=dict, init=False, repr=False, compare=False)
    _lend_at: dict[int, bool] = field(default_factory=dict, init=False, repr=False, compare=False)
    _checked: tuple[torch.Tensor, int] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    _loaded_check: dict[int, int] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # Epochs relisted after a load that put the user's generator back: it stays where it was.
    _held: set[int] = field(default_factory=set, init=False, repr=False, compare=False)
    # The last generator states encoded: a state_dict() a step (a look-ahead) re-encodes none.
    _encodings: list[tuple[torch.Tensor, str]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        owner = "ResumableDataLoader"
        check_int("batch_size", self.batch_size, 1, owner=owner)
        check_int("seed", self.seed, 0, owner=owner)
        check_bool("drop_last", self.drop_last, owner=owner)
        check_sized(self.sampler, owner=owner, parameter="sampler")
        object.__setattr__(self, "_lend", not seeds_itself(self.sampler))
        first = check_reproducible(self.sampler, owner=owner, parameter="sampler", lend=self._lend)
        if first.numel() == 0:
            raise ValueError(
                f"{owner}: sampler={type(self.sampler).__name__} yields no index; pass a "
                "sampler over a non-empty dataset (with drop_last=True, a DistributedSampler "
                "needs at least one sample per rank)."
            )
        self._validate(first, 0)
        object.__setattr__(self, "_length", int(first.numel()))
        object.__setattr__(self, "_check", zlib.crc32(first.numpy().tobytes()))
        object.__setattr__(self, "_seen", cpu_state(getattr(self.sampler, "generator", None)))

    def _validate(self, order: torch.Tensor, epoch: int) -> None:
        low, high = int(order.min()), int(order.max())
        if low < 0 or high >= self.dataset_size:
            raise ValueError(
                f"ResumableDataLoader: sampler={type(self.sampler).__name__} yielded index "
                f"{low if low < 0 else high} in epoch {epoch}, outside the dataset's "
                f"[0, {self.dataset_size}); pass a sampler over this dataset."
            )

    @property
    def num_samples(self) -> int:
        """Entries in an epoch's order (the sampler's length)."""
        return self._length

    def epoch_length(self, epoch: int) -> int:
        """Position reached when an epoch is complete."""
        return self.num_samples

    def lends(self, epoch: int) -> bool:
        """Whether an empty ``generator`` slot is lent a keyed generator in ``epoch``: always,
        unless the sampler seeds itself (probed per epoch after the first two: a warm-up may
        end later)."""
        if self._lend or epoch < 2:
            return self._lend
        lend = self._lend_at.get(epoch)
        if lend is None:
            lend = not seeds_itself(self.sampler, (epoch,))
            self._lend_at.clear()  # a loader asks for one epoch at a time
            self._lend_at[epoch] = lend
        return lend

    def order(self, epoch: int) -> torch.Tensor:
        """The sampler's order in ``epoch``, keyed to ``(seed, epoch)``."""
        check_int("epoch", epoch, 0)
        cached = self._cache.get(epoch)
        if cached is not None:
            return cached[0]
        order, source = keyed_order(
            self.sampler,
            self.seed,
            epoch,
            self.first_state,
            self._seen,
            self._restored.pop(epoch, None),
            lend=self.lends(epoch),
            advance=epoch not in self._held,
            generator_seed=self._keying_seed(),
        )
        if epoch in self._held:  # the saved run listed it: its _seen came back with the load
            self._held.discard(epoch)
        else:
            object.__setattr__(self, "_seen", cpu_state(getattr(self.sampler, "generator", None)))
        self._sources.clear()
        self._sources[epoch] = _encoded(source)
        if order.numel() != self.num_samples:
            raise ValueError(
                f"ResumableDataLoader: sampler={type(self.sampler).__name__} yielded "
                f"{order.numel()} indices in epoch {epoch} but {self.num_samples} before; give "
                "every epoch the same length."
            )
        self._validate(order, epoch)
        self._cache.clear()  # a loader asks for one epoch at a time
        self._cache[epoch] = (order, occurrence_keys(order, self.dataset_size))
        return order

    def _keying_seed(self) -> int | None:
        """``generator_seed`` as the user's generator has it now (reseeded after the loader
        was built, its seed keys the later epochs)."""
        own = getattr(self.sampler, "generator", None)
        if self.generator_seed is None or not isinstance(own, torch.Generator):
            return self.generator_seed
        return int(own.initial_seed())

    def relist_if_reseeded(self, epoch: int) -> None:
        """Drop ``epoch``'s listed order (not begun) where the user's generator moved since:
        as under torch's ``DataLoader``, a reseed before the epoch begins decides it."""
        if self._moved() is not None and epoch in self._cache:
            self._cache.clear()

    def _moved(self) -> torch.Tensor | None:
        """The user's generator's state where it moved since the last listing, else None."""
        current, seen = cpu_state(getattr(self.sampler, "generator", None)), self._seen
        moved = current is not None and seen is not None and not torch.equal(current, seen)
        return current if moved else None

    def order_check(self, epoch: int) -> int:
        """A checksum of the order in ``epoch`` (ranks compare it as the epoch starts)."""
        order = self.order(epoch)
        memo = self._checked
        if memo is None or memo[0] is not order:  # once per listing: O(epoch) bytes
            memo = (order, zlib.crc32(order.numpy().tobytes()))
            object.__setattr__(self, "_checked", memo)
        return memo[1]

    def listed_from(self, epoch: int) -> str | None:
        """The reseeded generator state (base64) ``epoch`` was listed from (not listed yet: the
        user's generator, where it moved since), else None."""
        if epoch in self._sources:
            return self._sources[epoch]
        return _encoded(self._moved())

    def generator_states(self) -> dict[str, str]:
        """The user's generator's state now and at the last listing (base64), for a state:
        draws and reseeds since the listing decide the next epoch, after a resume too."""
        now = cpu_state(getattr(self.sampler, "generator", None))
        if now is None or self._seen is None:
            return {}
        states = {"generator_now": self._encode(now)}
        if not torch.equal(now, self._seen):  # else the one state stands for both
            states["generator_seen"] = self._encode(self._seen)
        return states

    def _encode(self, state: torch.Tensor) -> str:
        for known, text in self._encodings:
            if torch.equal(known, state):
                return text
        text = str(_encoded(state))
        self._encodings[:] = [*self._encodings[-1:], (state, text)]  # now and seen
        return text

    def restore(
        self,
        epoch: int,
        listed_from: str | None,
        check: int | None = None,
        *,
        at_start: bool,
        generator: Mapping[str, Any] | None = None,
    ) -> None:
        """List the resumed ``epoch`` as the saved run did: from ``listed_from``, else keyed
        (``at_start``, not begun: as a reseed before it begins decides); ``check``: its order's
        checksum in the state; ``generator``: :meth:`generator_states` saved, put back."""
        restored, generator = _restored(listed_from), generator or {}
        self._cache.clear()
        self._restored.clear()
        now = generator.get("generator_now")
        # At an epoch's start its listing stands only while the generator has not moved since
        # (else it is listed again from it, as relist_if_reseeded does uninterrupted).
        kept = not at_start or (listed_from is not None and "generator_seen" not in generator)
        if kept:
            self._restored[epoch] = restored
        self._loaded_check.clear()
        if check is not None:
            self._loaded_check[epoch] = check
        self._sources.clear()
        if kept or now is None:
            self._sources[epoch] = listed_from  # a state saved before it is listed again
        self._held.clear()
        own = getattr(self.sampler, "generator", None)
        if now is not None and isinstance(own, torch.Generator) and cpu_state(own) is not None:
            own.set_state(_restored(now))
            object.__setattr__(self, "_seen", _restored(generator.get("generator_seen", now)))
            if not at_start:  # listed before the save (at 0 perhaps not): it moved g then
                self._held.add(epoch)
        else:
            object.__setattr__(self, "_seen", cpu_state(own))

    def part_way(self, epoch: int, position: int) -> bool:
        """Whether a position is inside an epoch after the first (epoch 0's order is in the
        fingerprint; a later one must be listed again to resume)."""
        return epoch > 0 and 0 < position < self.num_samples

    def epoch_check(self, epoch: int, position: int) -> int | None:
        """A checksum of the order a state saved at ``position`` of ``epoch`` goes on in (one
        loaded and not listed since keeps the loaded one: a state never lists an epoch)."""
        if not self.part_way(epoch, position):
            return None
        if epoch in self._cache:
            return self.order_check(epoch)
        return self._loaded_check.get(epoch)

    def check_relisted(
        self,
        epoch: int,
        position: int,
        listed_from: str | None,
        *,
        seed: int,
        saved_check: int | None,
    ) -> None:
        """Refuse a sampler that lists ``epoch`` (resumed part-way, under the saved ``seed``)
        differently each time, or otherwise than the saved run (``saved_check``)."""
        if not self.part_way(epoch, position):
            return

        args = (seed, epoch, self.first_state, self._seen, _restored(listed_from))

        def listing() -> torch.Tensor:
            lend = self.lends(epoch)
            seed_of_generator = self._keying_seed()
            return keyed_order(self.sampler, *args, lend=lend, generator_seed=seed_of_generator)[0]

        named = self.sampler.shares[0] if isinstance(self.sampler, RankShares) else self.sampler
        name = type(getattr(named, "whole", named)).__name__  # the user's class, not a split's
        with rngs_put_back():  # it may draw from them (what this refuses)
            order = listing()
            alike = torch.equal(order, listing())
        if not alike:
            raise StateMismatchError(
                f"ResumableDataLoader.load_state_dict: sampler={name} "
                f"lists epoch {epoch} differently each time, so the saved order cannot come "
                "back. Draw each epoch from a generator seeded by (seed, epoch), not a global RNG."
            )
        if saved_check is not None and zlib.crc32(order.numpy().tobytes()) != saved_check:
            raise StateMismatchError(
                f"ResumableDataLoader.load_state_dict: sampler={name} lists epoch {epoch} "
                "otherwise than the run that saved the state (other weights or indices, or "
                "another world size), so its rest would mix two orders. Build it as it was in "
                "that epoch, on the saved world size, or start without the state."
            )

    def schedule(self, epoch: int, *, start: int, rank: int, world_size: int) -> _FixedSchedule:
        """The batches ``rank`` of ``world_size`` yields in ``epoch`` from ``start``."""
        check_rank(rank, world_size)
        steps_from(self, start, world_size)  # validates the position
        order = self.order(epoch)
        # Each draw of a repeated index gets its own augmentation (keys), as under DataLoader.
        return _FixedSchedule(self, order, epoch, start, rank, world_size, self._cache[epoch][1])

    def num_steps(self, epoch: int, *, start: int, world_size: int) -> int:
        """Batches per rank from ``start`` to the end of ``epoch``."""
        return steps_from(self, start, world_size)

    def fingerprint(self) -> dict[str, Any]:
        """The settings a position is only meaningful for (epoch 0's order by checksum)."""
        cls = type(self.sampler)
        return {
            **plan_settings(self),
            "order_check": self._check,
            # Epoch 0 from the sampler's own generator or keyed to the seed: alike in order_check.
            "epoch0_from": "own generator" if self.first_state is not None else "seed",
            "sampler": f"{cls.__module__}.{cls.__qualname__}",
            # Older states, whose draws of an index shared one seed, lack it and are refused.
            "repeat_seeding": "per_draw",
            **({"split": "strided"} if self.strided else {}),
            **({"generator_seed": self.generator_seed} if self.generator_seed is not None else {}),
        }


class RankShares:
    """The ranks' shares interleaved: entry ``k * world_size + r`` is rank ``r``'s ``k``-th."""

    def __init__(self, shares: list[Any]) -> None:
        self.shares = shares

    def set_epoch(self, epoch: int) -> None:
        for share in self.shares:
            share.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        for row in zip(*self.shares, strict=True):
            yield from row

    def __len__(self) -> int:
        return len(self.shares) * len(self.shares[0])
