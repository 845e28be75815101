"""Building and checking the versioned, rank-symmetric state dicts of loaders and samplers.

Every state carries a ``checksum``: one CRC-32 per field, so a state edited by
hand, truncated or corrupted in storage is refused naming the field that no
longer matches, instead of being resumed at a position the plan never reached
(measured before: a position off a batch boundary yielded 119 ids for 100
samples; an edited ``steps_done`` made ``len()`` disagree with the epoch).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from loaderkit.errors import StateMismatchError

__all__ = [
    "ITERABLE_FIELDS",
    "PLAN_FIELDS",
    "STATE_VERSION",
    "STREAM_FIELDS",
    "PlanCursor",
    "check_seal",
    "check_envelope",
    "check_settings",
    "check_state",
    "check_version",
    "field_digest",
    "new_state",
    "seal",
]

# 2: states carry a per-field checksum (version 1 had none).
# 3: per-sample randomness is keyed by 64-bit splitmix keys (seeding.sample_seed);
#    a version-2 position resumed here would augment the rest of its epoch differently.
# 4: SamplePlan's shuffled order is a keyed Feistel permutation evaluated per position
#    (plan/_permutation.py), no longer a materialized torch.randperm; a version-3
#    position would point into a different order.
# 5: ShardPlan's order is evaluated per position too: shards ordered and windows shuffled
#    by keyed permutations (plan/shard.py), no longer torch.randperm; a version-4
#    position of a sharded dataset would point into a different order.
STATE_VERSION = 5
# What each older version lacks, for the message that refuses it.
_OLDER = {
    1: "without a checksum",
    2: "whose per-sample augmentation seeds were derived differently (32-bit)",
    3: "whose shuffled sample order was a torch.randperm, not today's keyed permutation",
    4: "whose sharded order (ShardPlan) shuffled shards and windows with torch.randperm, "
    "not today's keyed permutations",
}
# State keys. Every state has a version, an epoch, the topology it was saved under and
# a checksum; a plan position adds its position and plan, a stream its cursors per rank,
# an IterableDataset its records per worker.
VERSION, KIND, EPOCH, POSITION, STEPS_DONE = "version", "kind", "epoch", "position", "steps_done"
PLAN, TOPOLOGY, COMPLETE, CHECKSUM = "plan", "topology", "complete", "checksum"
PLAN_FIELDS = (VERSION, EPOCH, POSITION, STEPS_DONE, PLAN, TOPOLOGY)
STREAM_FIELDS = (VERSION, KIND, EPOCH, STEPS_DONE, COMPLETE, "stream", TOPOLOGY, "ranks")
ITERABLE_FIELDS = (VERSION, KIND, EPOCH, STEPS_DONE, COMPLETE, "iterable", TOPOLOGY, "workers")


def field_digest(name: str, value: Any) -> int:
    """CRC-32 of one state field, keyed by its name (a value moved to another field fails).

    The per-step fields are ints, hashed from their decimal text (~0.2 us);
    nested fields from canonical JSON, so a state that went through JSON or
    YAML (tuples become lists) still matches.
    """
    if type(value) is int:
        return zlib.crc32(b"%s=%d" % (name.encode(), value))
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    return zlib.crc32(f"{name}={text}".encode())


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
            "loader without this state (its epoch then restarts from the beginning)."
        )
    raise StateMismatchError(
        f"{owner}: field 'version' is {version!r}, this loaderkit reads version "
        f"{STATE_VERSION}; upgrade loaderkit to load this checkpoint (or pass what "
        "state_dict() returned, unmodified)."
    )


def check_seal(state: Mapping[str, Any], fields: Iterable[str], *, owner: str) -> None:
    """Refuse a state whose fields no longer match its checksum, naming the first that differs."""
    checksum = state.get("checksum")
    names = list(fields)
    if not isinstance(checksum, Mapping) or sorted(checksum) != sorted(names):
        raise StateMismatchError(
            f"{owner}: field 'checksum' is malformed (got "
            f"{sorted(checksum) if isinstance(checksum, Mapping) else checksum!r}, expected "
            f"one entry per field {sorted(names)}); the state was edited or truncated: pass "
            "what state_dict() returned, unmodified."
        )
    for name in names:
        if checksum[name] != field_digest(name, state[name]):
            raise StateMismatchError(
                f"{owner}: field {name!r} does not match the state's checksum (value "
                f"{_short(state[name])}): the state was edited, truncated or corrupted after "
                "state_dict() returned it, and resuming from it would repeat or skip samples. "
                "Load the checkpoint's state unmodified (to restart an epoch, call set_epoch() "
                "instead of editing the state)."
            )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def new_state(
    *,
    epoch: int,
    position: int,
    steps_done: int,
    plan: Mapping[str, Any],
    world_size: int,
    num_workers: int,
) -> dict[str, Any]:
    """The state of a position in a plan.

    No rank in it: every rank is at the same position, so the dict that rank 0
    writes into the checkpoint is right for all ranks. The topology is recorded
    for the message of a later resume, not enforced: the plan re-splits.
    """
    state = {
        "version": STATE_VERSION,
        "epoch": epoch,
        "position": position,
        "steps_done": steps_done,
        "plan": dict(plan),
        "topology": {"world_size": world_size, "num_workers": num_workers},
    }
    return seal(state, PLAN_FIELDS)


def check_envelope(state: object, fields: tuple[str, ...], *, owner: str, hint: str = "") -> None:
    """Refuse what is not a whole, unedited state of this format: every state's first check.

    Args:
        state: What the caller passed to ``load_state_dict``.
        fields: The state's fields (its keys but ``checksum``).
        owner: Class name for messages.
        hint: The fix for missing or unknown keys (default: pass the state unmodified).

    Raises:
        TypeError: ``state`` is not a dict.
        StateMismatchError: another version, missing or unknown keys, or a field that
            does not match the checksum (edited or corrupted).
    """
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
    check_seal(state, fields, owner=where)


def check_settings(
    saved: Mapping[str, Any], here: Mapping[str, Any], *, owner: str, adopt_seed: bool, fix: str
) -> int | None:
    """Compare a state's saved settings with the loading object's; returns the saved seed
    where it is adopted (``adopt_seed``) and differs.

    Raises:
        StateMismatchError: a setting differs (named with both values).
    """
    here, adopted = dict(here), None
    if adopt_seed and saved.get("seed") != here["seed"]:
        adopted = here["seed"] = saved["seed"]
    for key in sorted(set(saved) | set(here)):
        if saved.get(key) != here.get(key):
            raise StateMismatchError(
                f"{owner}.load_state_dict: field {key!r} differs: saved {saved.get(key)!r}, "
                f"here {here.get(key)!r}. {fix}"
            )
    return adopted


def check_state(
    state: object, fingerprint: Mapping[str, Any], *, owner: str, adopt: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Validate a plan position's state dict against the plan settings of the object loading it.

    Args:
        state: What the caller passed to ``load_state_dict``.
        fingerprint: The loading object's plan settings (``Plan.fingerprint()``).
        owner: Class name for messages.
        adopt: Plan fields the loading object did not set explicitly; for these
            the saved value is accepted instead of compared.

    Returns:
        The state, validated.

    Raises:
        TypeError: ``state`` is not a dict.
        StateMismatchError: see :func:`check_envelope`; a position field that is not a
            non-negative int, or a plan field that differs (named with both values).
    """
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
            f"{state[POSITION]}: a position is 0 exactly when no step was taken in the "
            f"epoch; pass what {owner}.state_dict() returned, unmodified."
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
    if (
        isinstance(saved, Mapping)
        and fingerprint.get("kind") is not None
        and saved.get("kind") == fingerprint.get("kind")
        and set(saved) < set(fingerprint)
    ):
        # The same kind of plan, saved before a setting existed: name the settings.
        new = [repr(k) for k in sorted(set(fingerprint) - set(saved))]
        names = new[0] if len(new) == 1 else f"{', '.join(new[:-1])} or {new[-1]}"
        here = ", ".join(f"{k}={fingerprint[k]!r}" for k in sorted(set(fingerprint) - set(saved)))
        raise StateMismatchError(
            f"{where}: field 'plan' has no {names} (this loaderkit's plan: "
            f"{here}), so the state was saved by an older loaderkit that ordered the samples "
            "differently. Finish that run with the loaderkit that saved it, or start without "
            "the state."
        )
    if not isinstance(saved, Mapping) or set(saved) != set(fingerprint):
        raise StateMismatchError(
            f"{where}: field 'plan' has fields "
            f"{sorted(saved) if isinstance(saved, Mapping) else saved!r}, expected "
            f"{sorted(fingerprint)}: the state was saved by a different kind of plan; load it "
            "into the kind of loader or sampler that saved it, or start without the state."
        )
    # A SamplerPlan's; loaderkit's own names a DistributedSampler subclass it lists whole.
    listed = str(fingerprint.get("sampler", ""))
    sampler = (
        "the DistributedSampler subclass"
        if listed.startswith("loaderkit.")
        else f"sampler={listed.rsplit('.', 1)[-1]}"
    )
    for key, expected in fingerprint.items():
        if saved[key] == expected:
            continue
        if key == "order_check" and listed:
            raise StateMismatchError(
                f"{where}: field 'order_check' differs ({saved[key]} saved, {expected} here): "
                f"{sampler} lists another order than the saved run's (other weights or indices, "
                "another world size for a sampler that splits ranks itself, or another torch "
                f"version). Build it as the saved run did (world size {world}), or start without "
                "the state."
            )
        if key == "order_check":
            raise StateMismatchError(
                f"{where}: field 'order_check' differs ({saved[key]} saved, "
                f"{expected} here): this torch and loaderkit compute a different order than "
                "the one the state was saved with (torch or loaderkit version changed?), so the "
                "saved position would repeat and skip samples. Resume with the torch and "
                "loaderkit versions that saved it."
            )
        if key == "num_samples" and fingerprint.get("split") == "strided":
            if sampler == "sampler=DistributedSampler":  # its length changes only when trimmed
                raise StateMismatchError(
                    f"{where}: the DistributedSampler(drop_last=True) order has {saved[key]} "
                    f"entries under the saved world size of {world} and {expected} under this "
                    "one (trimmed to a multiple of the ranks). Resume on the saved world size of "
                    f"{world}, or build the sampler with drop_last=False to re-split on any."
                )
            raise StateMismatchError(
                f"{where}: {sampler} splits ranks itself (padding or trimming their shares), so "
                f"its order has {saved[key]} entries under the saved world size of {world} and "
                f"{expected} under this one. Resume on the saved world size of {world}."
            )
        if key not in adopt:
            raise StateMismatchError(
                f"{where}: field {key!r} differs: the state was saved with "
                f"{key}={saved[key]!r}, this object has {key}={expected!r}. Resuming would not "
                f"be exact; build it with {key}={saved[key]!r} or start without the state."
            )


class PlanCursor:
    """Where a loader or sampler stands in its plan, and which epoch it iterates next.

    The one place that keeps a position: ``(epoch, position, steps_done)`` plus
    the rules for the next iteration. Each new iteration starts the next epoch
    unless :meth:`set_epoch` named one; after :meth:`load`, the next iteration
    is the rest of the saved epoch (or the epoch after it, if it was complete),
    unless :meth:`set_epoch` named another.
    """

    __slots__ = ("_explicit", "_resume", "_started", "epoch", "position", "steps_done")

    def __init__(self) -> None:
        self.epoch = 0
        self.position = 0
        self.steps_done = 0
        self._explicit: int | None = None
        self._resume = False
        self._started = False

    @property
    def started(self) -> bool:
        """Whether an iteration has begun since construction."""
        return self._started

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration ``epoch``."""
        self._explicit = epoch

    def loaded(self, plan: Any) -> tuple[int, bool] | None:
        """``(epoch the loaded position resumes, whether it is part-way through it)``
        while a loaded position awaits its iteration; else None."""
        if not self._resume:
            return None
        length = plan.epoch_length(self.epoch)
        if self.position >= length:
            return self.epoch + 1, False
        return self.epoch, self.position > 0

    def upcoming(self, plan: Any) -> tuple[int, int, int]:
        """``(epoch, start, steps already done in it)`` of the next iteration."""
        complete = self.position >= plan.epoch_length(self.epoch)
        resume_epoch = self.epoch + 1 if complete else self.epoch
        if self._resume and self._explicit in (None, resume_epoch):
            if complete:
                return resume_epoch, 0, 0
            return self.epoch, self.position, self.steps_done
        if self._explicit is not None:
            return self._explicit, 0, 0
        return (self.epoch + 1 if self._started else self.epoch), 0, 0

    def begin(self, plan: Any) -> tuple[int, int, int]:
        """Start the next iteration; returns what :meth:`upcoming` said."""
        epoch, start, steps_done = self.upcoming(plan)
        self._resume, self._explicit, self._started = False, None, True
        self.epoch, self.position, self.steps_done = epoch, start, steps_done
        return epoch, start, steps_done

    def consumed(self, position: int) -> None:
        """One more batch of this rank was handed out; the plan is now at ``position``."""
        self.position = position
        self.steps_done += 1

    def state(
        self, fingerprint: Mapping[str, Any], *, world_size: int, num_workers: int
    ) -> dict[str, Any]:
        """The state dict of this position (see :func:`new_state`)."""
        return new_state(
            epoch=self.epoch,
            position=self.position,
            steps_done=self.steps_done,
            plan=fingerprint,
            world_size=world_size,
            num_workers=num_workers,
        )

    def load(
        self, state_dict: object, plan: Any, *, owner: str, adopt: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """Validate ``state_dict`` against ``plan`` and resume at its position.

        Returns:
            The validated state (its ``plan`` field holds the saved settings).

        Raises:
            StateMismatchError: see :func:`check_state`.
            StateMismatchError: the position lies past the end of its epoch (a ValueError).
        """
        state = check_state(state_dict, plan.fingerprint(), owner=owner, adopt=adopt)
        length = plan.epoch_length(state["epoch"])
        if state["position"] > length:
            # Else upcoming() would read it as a finished epoch and move on silently.
            raise StateMismatchError(
                f"{owner}.load_state_dict: field 'position' is {state['position']}, "
                f"past the epoch length {length}; the state is for another dataset or plan: "
                "build the object with the saved settings, or start without the state."
            )
        self.resume_at(state["epoch"], state["position"], state["steps_done"])
        return state

    def resume_at(self, epoch: int, position: int, steps_done: int) -> None:
        """Resume at a validated position: the next iteration is the rest of its epoch."""
        self.epoch, self.position, self.steps_done = epoch, position, steps_done
        self._resume, self._explicit = True, None
