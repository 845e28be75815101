"""Every rank's recent stream cursors, in the process group's store (private).

A stream's cursors are rank-local, yet rank 0's state must hold every rank's,
and ``state_dict()`` must not be a collective (a loop may save on rank 0 alone).
So each rank *publishes* its cursors as it hands a batch out (one
``store.set`` into a ring of the last :data:`DEFAULT_WINDOW` steps), and
``state_dict()`` on any rank *reads* the peers' entries for its own
``(epoch, steps done)``, waiting only for a peer that has not handed that step
out yet. A peer more than the window ahead, or one that dropped the loader, is
a named error, never a state with wrong cursors (``docs/design.md``, "Host
contracts").
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import torch.distributed as dist

from loaderkit.errors import LoaderkitError
from loaderkit.plan._agree import env_positive

__all__ = ["DEFAULT_WINDOW", "PeerRing", "flush_retired", "ring_window"]

_ENV_WINDOW = "LOADERKIT_STREAM_STATE_WINDOW"
_ENV_TIMEOUT = "LOADERKIT_RANK_CHECK_TIMEOUT"
# Steps a peer may be ahead of the rank that saves. DDP keeps ranks within one or
# two (a gradient all-reduce per step); Lightning's fetcher and DevicePrefetcher
# hold a batch or two more. 64 leaves room for loops that sync less often, at
# about 64 * 150 bytes per rank per loader in the store.
DEFAULT_WINDOW = 64
_POLL_S = (0.0005, 0.05)  # first and longest pause between polls of a late peer

# Rings of loaders this process dropped: retired (their keys deleted and a
# tombstone set) at the next epoch start of a stream loader, a point where the
# process group is known to be alive. A finalizer must not do network I/O.
_retired: list[PeerRing] = []


def ring_window() -> int:
    """The ring size: ``LOADERKIT_STREAM_STATE_WINDOW``, or :data:`DEFAULT_WINDOW`."""
    return env_positive(_ENV_WINDOW, DEFAULT_WINDOW, int)


def flush_retired(store: dist.Store) -> None:
    """Retire the rings of dropped loaders that live in ``store`` (others are gone with theirs)."""
    pending = list(_retired)
    _retired.clear()
    for ring in pending:
        if ring.store is store:
            ring.retire_now()


class PeerRing:
    """One stream loader's ring: this rank publishes into it, any rank reads the peers'.

    Keys ``loaderkit/stream/<namespace>/<rank>/<step % window>``; each value is
    the JSON list ``[round, epoch, step, entry]``, ``entry`` being the rank's
    part of the state (``{"cursors": [...], "next": n}``) after ``step``
    batches of ``epoch`` were handed out.

    Args:
        store: The process group's store (any ``torch.distributed.Store``).
        namespace: Names the loader; the same on every rank.
        rank: This process's rank.
        world_size: The number of ranks.
        window: Steps kept per rank.
        timeout: Seconds to wait for a peer that has not handed a step out yet.
    """

    def __init__(
        self,
        store: dist.Store,
        *,
        namespace: int,
        rank: int,
        world_size: int,
        window: int,
        timeout: float,
    ) -> None:
        self.store = store
        self.rank, self.world_size = rank, world_size
        self.window, self.timeout = window, timeout
        self._prefix = f"loaderkit/stream/{namespace}"

    def _key(self, rank: int, step: int) -> str:
        return f"{self._prefix}/{rank}/{step % self.window}"

    def _gone(self, rank: int) -> str:
        return f"{self._prefix}/{rank}/gone"

    def publish(self, round_: int, epoch: int, step: int, entry: dict[str, Any]) -> None:
        """Record this rank's ``entry`` after ``step`` batches of ``epoch`` (round ``round_``)."""
        text = json.dumps([round_, epoch, step, entry], separators=(",", ":"))
        self.store.set(self._key(self.rank, step), text)

    def retire(self) -> None:
        """The loader was dropped: retire this ring at the next safe point (no I/O here)."""
        _retired.append(self)

    def retire_now(self) -> None:
        """Mark this rank's ring gone for readers, then free its keys."""
        with contextlib.suppress(Exception):
            self.store.set(self._gone(self.rank), "1")
            for slot in range(self.window):
                self.store.delete_key(f"{self._prefix}/{self.rank}/{slot}")

    def read(self, round_: int, epoch: int, step: int, *, owner: str) -> list[Any]:
        """Every peer's entry after ``step`` batches of ``epoch`` (round ``round_``), rank order.

        This rank's place holds None. Waits only for peers that have not
        handed the step out yet.

        Raises:
            LoaderkitError: a peer is more than the window ahead, dropped the
                loader, or did not reach the step within the timeout.
        """
        entries: list[Any] = [None] * self.world_size
        peers = [r for r in range(self.world_size) if r != self.rank]
        keys = [self._key(r, step) for r in peers]
        late = peers
        if self.store.check(keys):  # one round trip for everyone in the usual case
            multi_get = getattr(self.store, "multi_get", None)
            raws = multi_get(keys) if callable(multi_get) else [self.store.get(k) for k in keys]
            late = []
            for peer, raw in zip(peers, raws, strict=True):
                found = self._match(peer, raw, round_, epoch, step, owner=owner)
                if found is None:
                    late.append(peer)
                else:
                    entries[peer] = found
        for peer in late:
            entries[peer] = self._wait(peer, round_, epoch, step, owner=owner)
        return entries

    def _match(
        self, peer: int, raw: Any, round_: int, epoch: int, step: int, *, owner: str
    ) -> Any | None:
        """The entry if ``raw`` is the step asked for; None if the peer is not there yet."""
        their_round, their_epoch, their_step, entry = json.loads(
            raw.decode() if isinstance(raw, bytes) else raw
        )
        if (their_round, their_step) == (round_, step):
            if their_epoch != epoch:  # one round is one epoch start on every rank
                raise LoaderkitError(
                    f"{owner}: rank {peer} handed out step {step} in epoch {their_epoch}, this "
                    f"rank in epoch {epoch}, at the same epoch start; the ranks iterate "
                    "different loaders in the same order. Iterate the same loaders, in the "
                    "same order, on every rank."
                )
            return entry
        if their_round > round_ or (their_round == round_ and their_step > step):
            ahead = "a later epoch" if their_round > round_ else f"step {their_step}"
            raise LoaderkitError(
                f"{owner}: rank {peer} is already at {ahead} of this loader, more than "
                f"{self.window} steps past step {step} of epoch {epoch}, where this rank's "
                f"state is; each rank keeps its cursors for its last {self.window} steps only, "
                f"so rank {peer}'s cursors at step {step} are gone and the state cannot be "
                "exact. Keep the ranks within that many steps when a rank saves (a collective "
                "each step, as DDP's gradient sync, or a dist.barrier() on every rank after "
                f"the save), or raise {_ENV_WINDOW} (now {self.window})."
            )
        return None

    def _wait(self, peer: int, round_: int, epoch: int, step: int, *, owner: str) -> Any:
        key = self._key(peer, step)
        deadline = time.monotonic() + self.timeout
        pause = _POLL_S[0]
        last = "nothing of this loader yet"
        while True:
            if self.store.check([key]):
                raw = self.store.get(key)
                found = self._match(peer, raw, round_, epoch, step, owner=owner)
                if found is not None:
                    return found
                their_round, their_epoch, their_step, _ = json.loads(
                    raw.decode() if isinstance(raw, bytes) else raw
                )
                last = f"its last: step {their_step} of epoch {their_epoch}"
                if their_round != round_:
                    last += " (an earlier epoch start)"
            elif self.store.check([self._gone(peer)]):
                raise LoaderkitError(
                    f"{owner}: rank {peer} dropped this loader before handing out step {step} "
                    f"of epoch {epoch}, so its cursors there are unknown and the state cannot "
                    "be exact. Save the state before any rank drops the loader."
                )
            if time.monotonic() >= deadline:
                raise LoaderkitError(
                    f"{owner}: waited {self.timeout:.0f} s for rank {peer} to hand out step "
                    f"{step} of epoch {epoch} ({last}); this rank's state needs every rank's "
                    "cursors at the step it is at. Iterate this loader on every rank (a rank "
                    "that stopped early never gets there); for a loader of this rank alone, "
                    f"build it with rank=0, world_size=1; or raise {_ENV_TIMEOUT} if ranks are "
                    "that far apart."
                )
            time.sleep(pause)
            pause = min(2 * pause, _POLL_S[1])
