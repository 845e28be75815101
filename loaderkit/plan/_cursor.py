"""Building and checking the versioned, rank-symmetric state dicts of loaders and samplers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loaderkit.errors import StateMismatchError

__all__ = ["STATE_VERSION", "STREAM_STATE_VERSION", "PlanCursor", "check_state", "new_state"]

STATE_VERSION = 1  # a position in a plan (the plan's own settings say how it orders)
# A stream's per-slot cursors. 2: a cursor per open shard (lanes, mix_shards); 1, one per
# slot, is refused by name.
STREAM_STATE_VERSION = 2
_KEYS = ("version", "epoch", "position", "steps_done", "plan", "topology")


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
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "position": position,
        "steps_done": steps_done,
        "plan": dict(plan),
        "topology": {"world_size": world_size, "num_workers": num_workers},
    }


def check_state(
    state: object, fingerprint: Mapping[str, Any], *, owner: str, adopt: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Validate a state dict against the plan settings of the object loading it.

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
        StateMismatchError: missing or unknown keys, a newer version, or a plan
            field that differs (named with both values).
    """
    if not isinstance(state, Mapping):
        raise TypeError(
            f"{owner}.load_state_dict: state_dict must be a dict, got {type(state).__name__}; "
            f"pass what {owner}.state_dict() returned."
        )
    missing = [k for k in _KEYS if k not in state]
    unknown = sorted(set(state) - set(_KEYS))
    if missing or unknown:
        raise StateMismatchError(
            f"{owner}.load_state_dict: missing keys {missing}, unknown keys {unknown}; "
            f"pass what {owner}.state_dict() returned, unmodified."
        )
    version = state["version"]
    if (
        not isinstance(version, int)
        or isinstance(version, bool)
        or not 1 <= version <= STATE_VERSION
    ):
        raise StateMismatchError(
            f"{owner}.load_state_dict: field 'version' is {version!r}, this loaderkit reads "
            f"version {STATE_VERSION}; upgrade loaderkit to load this checkpoint."
        )
    for key in ("epoch", "position", "steps_done"):
        value = state[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise StateMismatchError(
                f"{owner}.load_state_dict: field {key!r} must be a non-negative int, got {value!r}."
            )
    saved = state["plan"]
    if (
        isinstance(saved, Mapping)
        and fingerprint.get("kind") is not None
        and saved.get("kind") == fingerprint.get("kind")
        and set(saved) < set(fingerprint)
    ):
        # The same kind of plan, saved before a setting existed: name the setting.
        new = sorted(set(fingerprint) - set(saved))
        raise StateMismatchError(
            f"{owner}.load_state_dict: field 'plan' has no {', '.join(map(repr, new))}: the "
            f"state was saved by an older loaderkit, whose plan had no such setting and so "
            f"ordered the samples differently from this one ({', '.join(new)}="
            f"{', '.join(repr(fingerprint[k]) for k in new)} here). Resuming would repeat and "
            "skip samples; finish that run with the loaderkit that saved it, or start without "
            "the state."
        )
    if not isinstance(saved, Mapping) or set(saved) != set(fingerprint):
        raise StateMismatchError(
            f"{owner}.load_state_dict: field 'plan' has fields "
            f"{sorted(saved) if isinstance(saved, Mapping) else saved!r}, expected "
            f"{sorted(fingerprint)}: the state was saved by a different kind of plan."
        )
    for key, expected in fingerprint.items():
        if key == "order_check" and saved[key] != expected:
            raise StateMismatchError(
                f"{owner}.load_state_dict: field 'order_check' differs ({saved[key]} saved, "
                f"{expected} here): this torch's randperm gives a different order than the "
                "one the state was saved with (torch version changed?), so the saved position "
                "would repeat and skip samples. Resume with the torch version that saved it."
            )
        if key not in adopt and saved[key] != expected:
            raise StateMismatchError(
                f"{owner}.load_state_dict: field {key!r} differs: the state was saved with "
                f"{key}={saved[key]!r}, this object has {key}={expected!r}. Resuming would not "
                f"be exact; build it with {key}={saved[key]!r} or start without the state."
            )
    return dict(state)


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
            ValueError: the position lies past the end of its epoch.
        """
        state = check_state(state_dict, plan.fingerprint(), owner=owner, adopt=adopt)
        length = plan.epoch_length(state["epoch"])
        if state["position"] > length:
            # Else upcoming() would read it as a finished epoch and move on silently.
            raise ValueError(
                f"{owner}.load_state_dict: field 'position' is {state['position']}, "
                f"past the epoch length {length}."
            )
        self.resume_at(state["epoch"], state["position"], state["steps_done"])
        return state

    def resume_at(self, epoch: int, position: int, steps_done: int) -> None:
        """Resume at a validated position: the next iteration is the rest of its epoch."""
        self.epoch, self.position, self.steps_done = epoch, position, steps_done
        self._resume, self._explicit = True, None
