"""Ranks compare their plans once when an epoch starts (private).

Every rank computes its share of an epoch from the same few integers (seed,
dataset size, batch size, topology, epoch, position). Nothing forces those to
be equal across processes, and when they are not, nothing fails where the
cause is: measured under 2-process gloo, ranks given different seeds silently
lost 68 and repeated 69 of 290 samples per epoch, and ranks given datasets of
different sizes crashed later in gloo with "Connection closed by peer".

So when an epoch starts under an initialized ``torch.distributed`` group, each
rank publishes a small fingerprint of its plan and reads everyone else's; any
difference is a :class:`~loaderkit.errors.StateMismatchError` raised on every
rank, naming the field, the values and the ranks that hold them. It is not
done in ``state_dict()`` (which must stay free of collectives).

The exchange goes through the process group's key-value store, with a
timeout, rather than a collective: it never waits on a GPU stream and cannot
hang forever. Rounds are counted per loader (:class:`Rounds`): a loader's
``n``-th epoch start on one rank is compared with the same loader's ``n``-th
on the others, whatever other loaders did in between (a process-wide count
paired a rank-0-only ``next(iter(val_loader))`` with the other rank's next
train epoch, failing both). A loader is named across ranks by the order in
which loaders first compare (a process-wide count that only first rounds
advance). Assumption (which Lightning's loops meet, and which DDP needs
anyway for ranks to step together): every rank iterates each loader's epochs,
and loaders start their first epochs in the same order. A rank that starts an
epoch the others never start waits ``LOADERKIT_RANK_CHECK_TIMEOUT`` seconds
(default 1800), then raises an error saying so instead of hanging.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from loaderkit.errors import LoaderkitError, StateMismatchError

__all__ = ["Rounds", "agree_across_ranks", "env_positive", "group_store", "rank_check_timeout"]

_N = TypeVar("_N", int, float)

_ENV_TIMEOUT = "LOADERKIT_RANK_CHECK_TIMEOUT"
# torch's own default for a process group's collectives (30 min): ranks that would
# simply wait in the next collective without this check wait as long here.
_DEFAULT_TIMEOUT_S = default_pg_timeout.total_seconds()
_channels = 0  # loaders this process compared: the n-th of every rank pair up

_FIXES = {
    "seed": "pass the same seed= on every rank (e.g. seed=0), or leave seed=None, which "
    "every rank settles to the same value",
    "epoch": "resume every rank from the same checkpoint and call set_epoch() with the same "
    "epoch on every rank",
    "position": "resume every rank from the same checkpoint (the state rank 0 saved is right "
    "for all ranks)",
    "steps_done": "resume every rank from the same checkpoint",
    "world_size": "let the loader read rank and world size from torch.distributed (leave "
    "rank=/world_size= unset), or pass the same world_size on every rank",
    "num_workers": "pass the same num_workers on every rank (a stream deals its shards to "
    "rank x worker slots)",
}
_DATA_FIX = (
    "every rank must read the same dataset (the same files in the same order, the same "
    "length); build it from the same source on every rank"
)
_DATA_FIELDS = (
    "num_samples",
    "num_shards",
    "shard_sizes_crc32",
    "shard_names_crc32",
    "lengths_crc32",
    "dataset_size",
)


def env_positive(name: str, default: _N, cast: Callable[[str], _N]) -> _N:
    """Environment variable ``name`` as ``cast`` reads it where positive, else ``default``."""
    raw = os.environ.get(name, "")
    try:
        value = cast(raw) if raw else default
    except ValueError:
        value = default
    return value if value > 0 else default


def rank_check_timeout() -> float:
    """Seconds a rank waits for its peers (``LOADERKIT_RANK_CHECK_TIMEOUT``, default 1800)."""
    return env_positive(_ENV_TIMEOUT, _DEFAULT_TIMEOUT_S, float)


class Rounds:
    """One loader's comparison rounds: its channel (the same on every rank) and count.

    ``channel`` is None until the loader's first comparison succeeds.
    """

    __slots__ = ("channel", "count")

    def __init__(self) -> None:
        self.channel: int | None = None
        self.count = 0


def _group_matches(rank: int, world_size: int) -> bool:
    if world_size < 2 or not (dist.is_available() and dist.is_initialized()):
        return False
    # Only when the loader's ranks are the process group's: ranks simulated with explicit
    # rank=/world_size= inside another group, and a data-parallel group smaller than the
    # global one (tensor/model parallelism: a Trainer's or Fabric's strategy names it),
    # compare nothing. The store holds one slot per global rank, and peers of one
    # data-parallel rank do not know each other's global ranks from here.
    return dist.get_world_size() == world_size and dist.get_rank() == rank


def group_store(rank: int, world_size: int) -> dist.Store | None:
    """The default process group's key-value store, if the loader's ranks are that group's.

    None outside a process group of ``world_size`` ranks in which this process
    is ``rank``, and where the group has no store to reach.
    """
    if not _group_matches(rank, world_size):
        return None
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except Exception:
        return None


def _exchange(
    mine: str, rank: int, world_size: int, owner: str, epoch: int, rounds: Rounds
) -> list[str]:
    """Every rank's fingerprint (as JSON text), in rank order; advances ``rounds``."""
    global _channels
    first = rounds.channel is None
    channel = _channels + 1 if rounds.channel is None else rounds.channel
    count = rounds.count + 1
    store = group_store(rank, world_size)
    if store is None:  # no store to use: a collective (no timeout of our own)
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, mine)
        _channels += first
        rounds.channel, rounds.count = channel, count
        return [str(g) for g in gathered]
    key = f"loaderkit/agree/{channel}/{count}"
    keys = [f"{key}/{r}" for r in range(world_size)]
    store.set(keys[rank], mine)
    timeout = rank_check_timeout()
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception as exc:
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        # This round is not taken: the ranks that never came still pair this loader's
        # next epoch start (and, on a first round, the next loader) with this one's.
        with contextlib.suppress(Exception):
            store.delete_key(keys[rank])
        raise LoaderkitError(
            f"{owner}: rank {rank} started epoch {epoch} and waited {timeout:.0f} s for ranks "
            f"{missing} to start it too ({type(exc).__name__}: {exc}). loaderkit compares the "
            "plan across ranks when an epoch starts and assumes every rank iterates each "
            "loader's epochs (Lightning does; DDP needs it for ranks to step together). "
            "Iterate this loader on every rank; or, for a loader meant for this rank alone, "
            f"build it with rank=0, world_size=1; or raise {_ENV_TIMEOUT} if ranks are that "
            "far apart."
        ) from exc
    _channels += first
    rounds.channel, rounds.count = channel, count
    multi_get = getattr(store, "multi_get", None)
    raw = multi_get(keys) if callable(multi_get) else [store.get(k) for k in keys]
    if count > 1:  # every rank set this round, so all have read the previous one
        # Stores without delete keep a few bytes per epoch.
        with contextlib.suppress(Exception):
            store.delete_key(f"loaderkit/agree/{channel}/{count - 1}/{rank}")
    return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]


def agree_across_ranks(
    owner: str,
    fields: Mapping[str, Any],
    *,
    rank: int,
    world_size: int,
    epoch: int,
    rounds: Rounds,
) -> int | None:
    """Raise on every rank if the ranks' ``fields`` differ (no-op outside a process group).

    Returns the number of this comparison round of the loader, which every
    rank shares for the same loader's same epoch start (a stream's peer
    cursors are keyed by it and ``rounds.channel``, ``loader/_stream_ring.py``),
    or None where nothing was compared.

    Args:
        owner: Names the loader or sampler in messages.
        fields: JSON-able plan settings that must be equal on every rank.
        rank: This process's rank as the loader sees it.
        world_size: The number of ranks as the loader sees it.
        epoch: The epoch that starts (for messages).
        rounds: The loader's own rounds (one :class:`Rounds` per loader or sampler).

    Raises:
        StateMismatchError: some field differs between ranks (on every rank).
        LoaderkitError: another rank did not start the epoch within the timeout.
    """
    if not _group_matches(rank, world_size):
        return None
    mine = json.dumps(dict(fields), sort_keys=True, default=repr)
    exchanged = _exchange(mine, rank, world_size, owner, epoch, rounds)
    everyone = [json.loads(text) for text in exchanged]
    names = sorted({k for fp in everyone for k in fp})
    for name in names:
        values = [fp.get(name) for fp in everyone]
        if all(v == values[0] for v in values):
            continue
        groups: dict[str, list[int]] = {}
        for r, v in enumerate(values):
            groups.setdefault(json.dumps(v), []).append(r)
        held = "; ".join(f"{v} on rank(s) {rs}" for v, rs in groups.items())
        differ = [r for r, v in enumerate(values) if v != values[0]]
        fix = _FIXES.get(name, _DATA_FIX if name in _DATA_FIELDS else None)
        if fix is None:
            fix = "build the loader with the same arguments on every rank"
        raise StateMismatchError(
            f"{owner}: the ranks disagree on {name!r} at the start of epoch {epoch}: {held} "
            f"(ranks {differ} differ from rank 0). Each rank would take its share of a "
            "different plan, silently losing and repeating samples (or stepping different "
            f"numbers of times and hanging DDP); {fix}."
        )
    return rounds.count
