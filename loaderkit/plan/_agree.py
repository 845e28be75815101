"""Ranks compare their plans' fingerprints through the group's store as an epoch starts
(private); any difference raises on every rank (``docs/design.md``, "Host contracts").
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from loaderkit.errors import LoaderkitError, StateMismatchError

_N = TypeVar("_N", int, float)

_ENV_TIMEOUT = "LOADERKIT_RANK_CHECK_TIMEOUT"
# torch's own collective timeout: ranks wait here as long as they would in the next collective.
_DEFAULT_TIMEOUT_S = default_pg_timeout.total_seconds()
_channels = 0  # loaders this process compared: the n-th of every rank pair up

_FIXES = {
    "seed": "pass the same seed= on every rank, or leave seed=None and seed the generator "
    "a seed comes from (the sampler's or generator=) alike on every rank",
    "epoch": "resume every rank from the same checkpoint and call set_epoch() alike",
    "position": "resume every rank from the same checkpoint",
    "steps_done": "resume every rank from the same checkpoint",
    "world_size": "leave rank=/world_size= unset, or pass the same world_size on every rank",
    "num_workers": "pass the same num_workers on every rank",
    "epoch_order": "give the sampler the same seed on every rank (its generator, or the seed "
    "its set_epoch uses), not one drawn from each rank's global RNG",
    "listing_crc32": "every rank must read the same samples: seed random_split's generator= "
    "alike on every rank, and give each the same files below the folder's root",
}
_DATA_FIX = "every rank must read the same dataset: build it from the same files in the same order"
_DATA_FIELDS = (
    "num_samples",
    "num_shards",
    "shard_sizes_crc32",
    "shard_names_crc32",
    "shard_counts_crc32",
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


@dataclass(slots=True, eq=False)
class Rounds:
    """One loader's comparison rounds: its channel (None until the first) and count."""

    channel: int | None = None
    count: int = 0


def _group_matches(rank: int, world_size: int) -> bool:
    if world_size < 2 or not (dist.is_available() and dist.is_initialized()):
        return False
    # The store holds one slot per global rank: a smaller data-parallel group compares nothing.
    return dist.get_world_size() == world_size and dist.get_rank() == rank


def group_store(rank: int, world_size: int) -> dist.Store | None:
    """The default process group's store, if the loader's ranks are that group's, else None."""
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
        # The round is not taken, so late ranks still pair their next epoch start with this one.
        with contextlib.suppress(Exception):
            store.delete_key(keys[rank])
        raise LoaderkitError(
            f"{owner}: rank {rank} started epoch {epoch} and waited {timeout:.0f} s for ranks "
            f"{missing} to start it too ({type(exc).__name__}: {exc}). Iterate this loader on "
            "every rank, build a rank-local loader with rank=0, world_size=1, or raise "
            f"{_ENV_TIMEOUT}."
        ) from exc
    _channels += first
    rounds.channel, rounds.count = channel, count
    multi_get = getattr(store, "multi_get", None)
    raw = multi_get(keys) if callable(multi_get) else [store.get(k) for k in keys]
    if count > 1:  # every rank set this round, so all have read the previous one
        with contextlib.suppress(Exception):
            store.delete_key(f"loaderkit/agree/{channel}/{count - 1}/{rank}")
    return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]


def agree_across_ranks(
    owner: str, fields: Mapping[str, Any], *, rank: int, world_size: int, epoch: int, rounds: Rounds
) -> int | None:
    """Raise StateMismatchError on every rank if the ranks' JSON-able ``fields`` differ
    (LoaderkitError: a peer did not start the epoch in time); returns this loader's round
    number (the same on every rank), or None outside a matching process group."""
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
        raise StateMismatchError(
            f"{owner}: the ranks disagree on {name!r} at the start of epoch {epoch}: {held} "
            f"(ranks {differ} differ from rank 0). "
            f"{fix or 'build the loader with the same arguments on every rank'}."
        )
    return rounds.count
