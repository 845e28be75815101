"""Building and checking the versioned, rank-symmetric state dicts of loaders and samplers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loaderkit.errors import StateMismatchError

__all__ = ["STATE_VERSION", "check_state", "new_state"]

STATE_VERSION = 1
_KEYS = ("version", "epoch", "position", "steps_done", "plan", "topology")


def new_state(
    *,
    epoch: int,
    position: int,
    steps_done: int,
    plan: dict[str, Any],
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
