"""Building and checking the versioned, rank-symmetric state dicts of loaders and samplers.

Every state carries a ``checksum`` (one CRC-32 per field): an edited state is refused by field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from loaderkit.errors import StateMismatchError
from loaderkit.plan._digest import field_digest, legacy_digest

# Bumped when a saved position would mean other data; _OLDER says what each older one lacks.
STATE_VERSION = 5
_OLDER = {
    1: "without a checksum",
    2: "whose per-sample augmentation seeds were derived differently (32-bit)",
    3: "whose shuffled sample order was a torch.randperm, not today's keyed permutation",
    4: "whose sharded order (ShardPlan) shuffled shards and windows with torch.randperm, "
    "not today's keyed permutations",
}
# State keys of a plan position, a stream (cursors per rank) and an IterableDataset (per worker).
VERSION, KIND, EPOCH, POSITION, STEPS_DONE = "version", "kind", "epoch", "position", "steps_done"
PLAN, TOPOLOGY, COMPLETE, CHECKSUM = "plan", "topology", "complete", "checksum"
PLAN_FIELDS = (VERSION, EPOCH, POSITION, STEPS_DONE, PLAN, TOPOLOGY)
STREAM_FIELDS = (VERSION, KIND, EPOCH, STEPS_DONE, COMPLETE, "stream", TOPOLOGY, "ranks")
ITERABLE_FIELDS = (VERSION, KIND, EPOCH, STEPS_DONE, COMPLETE, "iterable", TOPOLOGY, "workers")


def seal(state: dict[str, Any], fields: Iterable[str] | None = None) -> dict[str, Any]:
    """Add (or refresh) ``state["checksum"]``: the digest of every field but the checksum."""
    names = [k for k in state if k != "checksum"] if fields is None else list(fields)
    state["checksum"] = {k: field_digest(k, state[k]) for k in names}
    return state


def check_version(state: Mapping[str, Any], *, owner: str) -> None:
    """Refuse a state of another format version, saying what to do with it."""
    if "version" not in state:
        return  # reported with the other missing keys
    version = state["version"]
    if version == STATE_VERSION and type(version) is int:
        return
    if type(version) is int and 1 <= version < STATE_VERSION:
        raise StateMismatchError(
            f"{owner}: field 'version' is {version}: the state was saved by an older loaderkit "
            f"(state version {version}, {_OLDER[version]}), this loaderkit reads version "
            f"{STATE_VERSION}; resume with the loaderkit version that saved it, or start the "
            "loader without this state."
        )
    raise StateMismatchError(
        f"{owner}: field 'version' is {version!r}, this loaderkit reads version "
        f"{STATE_VERSION}; upgrade loaderkit to load this checkpoint (or pass what "
        "state_dict() returned, unmodified)."
    )


def _fields(value: Any) -> str:
    return str(sorted(value)) if isinstance(value, Mapping) else repr(value)


def _plan_name(plan: Any) -> str:
    """What chose a saved or built plan, as a refusal names it."""
    if not isinstance(plan, Mapping):
        return _short(plan)
    if "sampler" in plan:
        return f"sampler={str(plan['sampler']).rsplit('.', 1)[-1]}"
    if "kind" not in plan:
        return "a plan of the loader's own (no sampler=)"
    budget = f" under max_tokens={plan['max_tokens']!r}" if plan.get("max_tokens") else ""
    return f"a {plan['kind']!r} plan{budget}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def check_envelope(state: object, fields: tuple[str, ...], *, owner: str, hint: str = "") -> None:
    """Refuse (TypeError, StateMismatchError) what is not a whole, unedited state of ``fields``;
    ``hint`` is the fix for missing or unknown keys."""
    where = f"{owner}.load_state_dict"
    if not isinstance(state, Mapping):
        raise TypeError(
            f"{where}: state_dict must be a dict, got {type(state).__name__}; "
            f"pass what {owner}.state_dict() returned."
        )
    check_version(state, owner=where)
    missing = [k for k in (*fields, CHECKSUM) if k not in state]
    unknown = sorted(set(state) - {*fields, CHECKSUM})
    if missing or unknown:
        hint = hint or f"pass what {owner}.state_dict() returned, unmodified."
        raise StateMismatchError(f"{where}: missing keys {missing}, unknown keys {unknown}; {hint}")
    checksum = state[CHECKSUM]
    if not isinstance(checksum, Mapping) or sorted(checksum) != sorted(fields):
        raise StateMismatchError(
            f"{where}: field 'checksum' is malformed (got {_fields(checksum)}, expected one "
            f"entry per field {sorted(fields)}); the state was edited or truncated: pass what "
            "state_dict() returned, unmodified."
        )
    for name in fields:  # the first field that differs is named
        value, want = state[name], checksum[name]
        if want != field_digest(name, value) and want != legacy_digest(name, value):
            raise StateMismatchError(
                f"{where}: field {name!r} does not match the state's checksum (value "
                f"{_short(state[name])}). Load the checkpoint's state unmodified, or call "
                "set_epoch() to restart an epoch."
            )


# Settings a saved state holds since a later release: one saved before is checked without.
_ADDED = frozenset({"shard_bytes_crc32", "reader", "dtype_headers_crc32"})  # a stream's
_PLAN_ADDED = frozenset(  # a plan's
    {"shard_counts_crc32", "mix_sources_crc32", "listing_crc32", "epoch0_from"}
)


_FIXES = {  # where the loader's general fix does not say it
    "dtype_headers_crc32": "The shards' dtypes (.lkdtype headers, or the reader's dtype=) "
    "differ from the saved run's; restore them, or start without the state."
}


_CLASS_KEYS = frozenset({"dataset", "sampler"})  # "module.Class" fields


def _same_class(key: str, saved: Any, here: Any) -> bool:
    """Whether ``key`` names one class in both: a script's module is ``__main__`` when run
    and its file's name when imported, so the module is not compared (as a stream's reader)."""
    if key not in _CLASS_KEYS or not (isinstance(saved, str) and isinstance(here, str)):
        return False
    return saved.rsplit(".", 1)[-1] == here.rsplit(".", 1)[-1]


def check_settings(
    saved: Mapping[str, Any], here: Mapping[str, Any], *, owner: str, adopt_seed: bool, fix: str
) -> int | None:
    """Refuse saved settings that differ from ``here``; returns a differing seed it adopted."""
    here, adopted = dict(here), None
    if adopt_seed and saved.get("seed") != here["seed"]:
        adopted = here["seed"] = saved["seed"]
    keys = sorted(set(saved) | (set(here) - (_ADDED - set(saved))))
    # Count, then names, before bytes: a shard list reordered or renamed is told as such.
    for key in sorted(keys, key=lambda k: {"num_shards": 0, "shard_names_crc32": 1}.get(k, 2)):
        if saved.get(key) != here.get(key) and not _same_class(key, saved.get(key), here.get(key)):
            raise StateMismatchError(
                f"{owner}.load_state_dict: field {key!r} differs: saved {saved.get(key)!r}, "
                f"here {here.get(key)!r}. {_FIXES.get(key, fix)}"
            )
    return adopted


def check_state(
    state: object, fingerprint: Mapping[str, Any], *, owner: str, adopt: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Validate a plan position's state against ``fingerprint`` (saved ``adopt`` fields kept)."""
    check_envelope(state, PLAN_FIELDS, owner=owner)
    assert isinstance(state, Mapping)
    where = f"{owner}.load_state_dict"
    for key in (EPOCH, POSITION, STEPS_DONE):
        value = state[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise StateMismatchError(
                f"{where}: field {key!r} must be a non-negative int, got "
                f"{value!r}; pass what {owner}.state_dict() returned, unmodified."
            )
    if (state[POSITION] == 0) != (state[STEPS_DONE] == 0):
        raise StateMismatchError(
            f"{where}: field 'steps_done' is {state[STEPS_DONE]} at position "
            f"{state[POSITION]}; pass what {owner}.state_dict() returned, unmodified."
        )
    topology = state.get("topology")
    world = topology.get("world_size") if isinstance(topology, Mapping) else None
    _check_plan(state[PLAN], fingerprint, where=where, adopt=adopt, world=world)
    return dict(state)


def _check_plan(
    saved: Any,
    fingerprint: Mapping[str, Any],
    *,
    where: str,
    adopt: tuple[str, ...],
    world: int | None,
) -> None:
    if isinstance(saved, Mapping):
        fingerprint = {k: v for k, v in fingerprint.items() if k in saved or k not in _PLAN_ADDED}
        if "listing_crc32" not in fingerprint:  # saved over a Subset, here the same data bare
            saved = {k: v for k, v in saved.items() if k != "listing_crc32"}
    names_only = {"shard_names_crc32"}  # a SamplePlan's fingerprint has no kind
    if (
        isinstance(saved, Mapping)
        and (fingerprint.get("kind") is not None or set(fingerprint) - set(saved) == names_only)
        and saved.get("kind") == fingerprint.get("kind")
        and set(saved) < set(fingerprint)
    ):
        # The same kind of plan, saved before a setting existed: name the settings.
        added = sorted(set(fingerprint) - set(saved))
        if added == ["shard_names_crc32"]:
            raise StateMismatchError(
                f"{where}: field 'plan' has no 'shard_names_crc32': saved by an older loaderkit "
                "or a sampler built by hand; resume with the loaderkit and sampler that saved "
                "it, or start without the state."
            )
        new = [repr(k) for k in added]
        names = new[0] if len(new) == 1 else f"{', '.join(new[:-1])} or {new[-1]}"
        here = ", ".join(f"{k}={fingerprint[k]!r}" for k in added)
        raise StateMismatchError(
            f"{where}: field 'plan' has no {names} (this loaderkit's plan: {here}), so the "
            "state was saved by an older loaderkit that ordered the samples differently. Finish "
            "that run with the loaderkit that saved it, or start without the state."
        )
    if not isinstance(saved, Mapping) or set(saved) != set(fingerprint):
        was, here = _plan_name(saved), _plan_name(fingerprint)
        what = (
            f"{was}, here {here}"
            if was != here
            else f"fields {_fields(saved)}, here {sorted(fingerprint)}"
        )
        raise StateMismatchError(
            f"{where}: field 'plan' was saved by a different kind of plan ({what}); build the "
            "loader or sampler as the saved run did (sampler=, max_tokens=, bucketing), or "
            "start without the state."
        )
    for key, expected in fingerprint.items():
        if saved[key] != expected and not _same_class(key, saved[key], expected):
            message = _difference(key, saved[key], expected, fingerprint, adopt, world)
            if message is not None:
                raise StateMismatchError(f"{where}: {message}")


# What a checksum of the data differs by, in a refusal.
_HELD = {
    "shard_names_crc32": "the dataset reads other shard files than the saved run's, the same in "
    "another order or grouping, or a Subset of other indices",
    "shard_counts_crc32": "the shard files hold other sample counts than the saved run's "
    "(rewritten since)",
    "epoch0_from": "epoch 0 was listed from the sampler's own generator in one run and keyed to "
    "the seed in the other (a generator= given or removed since)",
    "listing_crc32": "the dataset holds other samples than the saved run's at the same length: "
    "a Subset of other indices (random_split without a seeded generator=), other files (Arrow "
    "files of other sizes), or an image folder's other classes",
}


def _difference(
    key: str,
    was: Any,
    expected: Any,
    fingerprint: Mapping[str, Any],
    adopt: tuple[str, ...],
    world: int | None,
) -> str | None:
    # A SamplerPlan's; loaderkit's own names a DistributedSampler subclass it lists whole.
    listed = str(fingerprint.get("sampler", ""))
    sampler = (
        "the DistributedSampler subclass"
        if listed.startswith("loaderkit.")
        else f"sampler={listed.rsplit('.', 1)[-1]}"
    )
    if key == "order_check" and listed:
        return (
            f"field 'order_check' differs ({was} saved, {expected} here): {sampler} lists "
            "another order than the saved run's (other weights or indices, another world size, "
            f"or another torch version). Build it as the saved run built it (world size {world}; "
            "weights changed since: set them after building), or start without the state."
        )
    if key == "order_check":
        return (
            f"field 'order_check' differs ({was} saved, {expected} here): this torch and "
            "loaderkit compute another order than the saved run's. Resume with the torch and "
            "loaderkit versions that saved it."
        )
    if key == "generator_seed":
        return (
            f"the sampler's generator was seeded {was} in the saved run and {expected} here; "
            f"seed it with torch.Generator().manual_seed({was}), or start without the state."
        )
    if key == "num_samples" and fingerprint.get("split") == "strided":
        if sampler == "sampler=DistributedSampler":  # its length changes only when trimmed
            return (
                f"the DistributedSampler(drop_last=True) order has {was} entries under the saved "
                f"world size of {world} and {expected} under this one (trimmed to a multiple of "
                f"the ranks). Resume on the saved world size of {world}, or build the sampler "
                "with drop_last=False to re-split on any."
            )
        return (
            f"{sampler} splits ranks itself, so its order has {was} entries under the saved world "
            f"size of {world} and {expected} under this one. Resume on the saved world size of "
            f"{world}."
        )
    if key in _HELD:
        fix = "pass the saved run's, or start without the state"
        return f"field {key!r} differs: {_HELD[key]}; {fix}."
    if key in adopt:
        return None
    if key in ("per_epoch", "source_names"):
        what = "source names"
        if key == "per_epoch":
            what = "draws per source (weights=, repeat= or epoch_size=)"
        return (
            f"field {key!r} differs: the mix has other {what} than the saved run's "
            f"({was!r}, here {expected!r}); build the MixedDataset as it was, or start without "
            "the state."
        )
    if key.endswith("_crc32"):  # a checksum of what the object was built from
        what = key[: -len("_crc32")].replace("_", " ")
        return (
            f"field {key!r} differs: this object was built from other {what} than the saved "
            "run's; pass the saved run's, or start without the state."
        )
    if key == "seed":  # from a seeded generator beside no seed= (then seed= is refused)
        fix = f"build it with seed={was!r} and no generator="
        if "generator_now" in fingerprint:  # drawn from the sampler's generator
            fix = f"build {sampler}'s generator in the saved run's state (seeded, drawn from)"
        return (
            f"field 'seed' differs: the state was saved with seed={was!r}, this object has "
            f"seed={expected!r}; {fix}, or start without the state."
        )
    return (
        f"field {key!r} differs: the state was saved with {key}={was!r}, this object has "
        f"{key}={expected!r}; build it with {key}={was!r} or start without the state."
    )


@dataclass(slots=True, eq=False)
class PlanCursor:
    """Where a loader or sampler stands (``epoch, position, steps_done``) and what it iterates
    next: the next epoch, the one :meth:`set_epoch` named, or a loaded epoch's rest."""

    epoch: int = 0
    position: int = 0
    steps_done: int = 0
    started: bool = False  # an iteration began
    _explicit: int | None = None
    _resume: bool = False
    _host_epoch: int | None = None  # the host's epoch as the iteration began
    _ran_out: bool = False  # a loaded position's empty iteration was handed out
    _named_late: int | None = None  # set_epoch(late=True) of the iteration's epoch
    from_load: bool = False  # the last iteration began at a loaded position part-way
    named_in_run: bool = False  # set_epoch named the epoch of the iteration running then
    by_loop: bool = False  # the last set_epoch came from a loop, not a Trainer
    afresh: bool = False  # a loop's set_epoch of the epoch it left part-way: a retry

    def host_names(
        self, epoch: int | None, plan: Any, *, cycles: bool = False, restarts: bool = False
    ) -> bool:
        """Before an iteration begins in the host's ``epoch`` (None: no host): make it that
        epoch unless ``set_epoch``, a loaded position or an earlier iteration in the same host
        epoch names one. True where this iteration must be empty: a host that ``cycles``
        loaders (``"max_size_cycle"``) records none that ran out, so one loaded as run out
        (its position completes the host's epoch or is past it) runs out again first.
        """
        if epoch is None:
            return False
        if self._resume and self._ran_out and epoch != self._host_epoch:
            # The host epoch that gave it an empty iteration ended without another: a cycled
            # loader's place lasts its host epoch, the next begins it afresh.
            self.host_starts(epoch, ended=True)
        if cycles and self._resume and not self._ran_out:
            done = self.position >= plan.epoch_length(self.epoch)
            if self.epoch > epoch or (self.epoch == epoch and done):
                self._ran_out, self._host_epoch = True, epoch
                return True
        named = self._named(epoch, plan, restarts)
        self._host_epoch = epoch
        if named is not None:
            self._explicit = named
        return False

    def _named(self, epoch: int, plan: Any, restarts: bool) -> int | None:
        """The epoch the host's ``epoch`` names for the next iteration, or None."""
        same = self.started and epoch == self._host_epoch
        again = self._named_late == epoch or (restarts and self._explicit is None)
        if same and again and self.position < plan.epoch_length(self.epoch):
            # The host prefetched, then began the epoch again before it ran out: it starts over.
            return self.epoch
        if self._explicit is None and not self._resume and not same:
            return epoch
        return None

    @property
    def ran_out(self) -> bool:
        """Whether :meth:`host_names` gave a loaded position an empty iteration."""
        return self._ran_out

    def host_starts(self, epoch: int, *, ended: bool = False) -> bool:
        """The host begins ``epoch`` afresh (restored from its previous epoch's last batch): drop
        a loaded position in ``epoch`` or later (``ended``: or before, an epoch the host ended
        short); returns whether one was."""
        if not self._resume or (self.epoch < epoch and not ended):
            return False
        self._resume, self._explicit, self._host_epoch = False, epoch, epoch
        return True

    def set_epoch(
        self, epoch: int, *, late: bool = False, in_run: bool = False, by_loop: bool = False
    ) -> None:
        """Make the next iteration ``epoch``; ``late``: set after the host took this iteration's
        first batch (Lightning prefetches an unsized loader), so it names nothing new;
        ``in_run``: while an iteration of ``epoch`` runs (a state there keeps its position);
        ``by_loop``: a loop's call, not a Trainer's."""
        if late and self.started and epoch == self._host_epoch:
            self._named_late = epoch
            return
        self.named_in_run = in_run and self._live() and self.epoch == epoch
        self.afresh = by_loop and not in_run and self.epoch == epoch
        self._explicit, self.by_loop = epoch, by_loop

    def loaded(self, plan: Any) -> tuple[int, bool] | None:
        """``(epoch a pending loaded position resumes, whether part-way through)``, else None."""
        if not self._resume:
            return None
        length = plan.epoch_length(self.epoch)
        if self.position >= length:
            return self.epoch + 1, False
        return self.epoch, self.position > 0

    def end_loaded(self, plan: Any) -> None:
        """Move a loaded position to its epoch's end: the rest of that epoch is empty."""
        self.position = plan.epoch_length(self.epoch)

    def _live(self) -> bool:
        """Whether no loaded position or ``set_epoch`` of another epoch replaces the last one."""
        return not self._resume and self._explicit in (None, self.epoch)

    def iterating(self, plan: Any) -> bool:
        """Whether the next iteration goes on in the epoch begun last (live, not complete)."""
        return self._live() and self.position < plan.epoch_length(self.epoch)

    def drawn_into(self) -> bool:
        """Whether batches of the epoch a state would hold were drawn since it began (live)."""
        return self.position > 0 and self._live()

    def upcoming(
        self, plan: Any, host_epoch: int | None = None, *, restarts: bool = False
    ) -> tuple[int, int, int]:
        """``(epoch, start, steps done)`` of the next iteration. After a load, ``set_epoch`` of
        its epoch is that epoch's rest (empty if complete: a resumed loop must not replay it)."""
        complete = self.position >= plan.epoch_length(self.epoch)
        resume_epoch = self.epoch + 1 if complete else self.epoch
        if self._resume and self._explicit in (None, resume_epoch, self.epoch):
            if complete and self._explicit != self.epoch:
                return resume_epoch, 0, 0
            return self.epoch, self.position, self.steps_done
        if self._explicit is not None:
            return self._explicit, 0, 0
        named = None if host_epoch is None else self._named(host_epoch, plan, restarts)
        if named is not None:
            return named, 0, 0
        return (self.epoch + 1 if self.started else self.epoch), 0, 0

    def begin(self, plan: Any) -> tuple[int, int, int]:
        """Start the next iteration; returns what :meth:`upcoming` said."""
        again = self.by_loop and self._explicit == self.epoch  # a loop's set_epoch of it
        if again and self.from_load and self.iterating(plan):
            raise StateMismatchError(
                f"ResumableDataLoader: iter() begins epoch {self.epoch} afresh, but the iteration "
                "that resumed the loaded state in it was left part-way (a peek, or an epoch "
                f"stopped early without set_epoch({self.epoch + 1})), so what the loop trained of "
                "it is unknown. Peek before load_state_dict, or load the state again."
            )
        epoch, start, steps_done = self.upcoming(plan)
        self.from_load = self._resume and start > 0
        self._resume, self._explicit, self.started, self._named_late = False, None, True, None
        self.named_in_run = self.afresh = False
        self.epoch, self.position, self.steps_done = epoch, start, steps_done
        return epoch, start, steps_done

    def restore(self, before: PlanCursor) -> None:
        """Go back to ``before``, a copy taken as an iteration began that handed out nothing
        (its workers failed to start): the next iteration is that one again."""
        for name in self.__slots__:
            setattr(self, name, getattr(before, name))

    def consumed(self, position: int) -> None:
        """One more batch of this rank was handed out; the plan is now at ``position``."""
        self.position = position
        self.steps_done += 1

    def saved(self, plan: Any) -> tuple[int, int, int]:
        """``(epoch, position, steps_done)`` a state holds: the last iteration's, or after
        ``set_epoch`` of another (or a finished) epoch the next one's start."""
        # Lightning names the running epoch again after its first batch, a loop's step hook at
        # any batch (its last too): that keeps the position.
        explicit, length = self._explicit, plan.epoch_length(self.epoch)
        kept = (self.position < length and not self.afresh) or self.named_in_run
        running = explicit == self.epoch and kept
        if explicit is None or running:
            return self.epoch, self.position, self.steps_done
        return self.upcoming(plan)

    def state(
        self, plan: Any, fingerprint: Mapping[str, Any], *, world_size: int, num_workers: int
    ) -> dict[str, Any]:
        """The rank-free state dict of this position (the topology is for messages, not
        enforced)."""
        epoch, position, steps_done = self.saved(plan)
        state: dict[str, Any] = {"version": STATE_VERSION, "epoch": epoch, "position": position}
        state |= {"steps_done": steps_done, "plan": dict(fingerprint)}
        state["topology"] = {"world_size": world_size, "num_workers": num_workers}
        return seal(state, PLAN_FIELDS)

    def load(
        self,
        state_dict: object,
        plan: Any,
        *,
        owner: str,
        adopt: tuple[str, ...] = (),
        fingerprint: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Validate ``state_dict`` against ``fingerprint`` (default: the plan's), resume there."""
        fields = plan.fingerprint() if fingerprint is None else fingerprint
        state = check_state(state_dict, fields, owner=owner, adopt=adopt)
        length = plan.epoch_length(state["epoch"])
        if state["position"] > length:
            raise StateMismatchError(
                f"{owner}.load_state_dict: field 'position' is {state['position']}, "
                f"past the epoch length {length}; build the object with the saved settings, or "
                "start without the state."
            )
        self.resume_at(state["epoch"], state["position"], state["steps_done"])
        return state

    def resume_at(self, epoch: int, position: int, steps_done: int) -> None:
        """Resume at a validated position: the next iteration is its epoch's rest."""
        self.epoch, self.position, self.steps_done = epoch, position, steps_done
        self._resume, self._explicit, self._ran_out = True, None, False
