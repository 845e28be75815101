"""Every rank's recent stream cursors, in the process group's store (private): published per
batch, read by ``state_dict()`` at its own step, never a collective.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import torch.distributed as dist

from loaderkit.errors import LoaderkitError
from loaderkit.plan._agree import env_positive

_ENV_WINDOW = "LOADERKIT_STREAM_STATE_WINDOW"
_ENV_TIMEOUT = "LOADERKIT_RANK_CHECK_TIMEOUT"
# Steps a peer may be ahead of the rank that saves (DDP keeps ranks within a few).
DEFAULT_WINDOW = 64
_POLL_S = (0.0005, 0.05)  # first and longest pause between polls of a late peer

# Rings of dropped loaders, retired at the next stream epoch start (a finalizer must not do I/O).
_retired: list[PeerRing] = []


def ring_window() -> int:
    return env_positive(_ENV_WINDOW, DEFAULT_WINDOW, int)


def flush_retired(store: dist.Store) -> None:
    """Retire the dropped loaders' rings that live in ``store``."""
    pending = list(_retired)
    _retired.clear()
    for ring in pending:
        if ring.store is store:
            ring.retire_now()


class PeerRing:
    """One stream loader's ring: keys ``loaderkit/stream/<namespace>/<rank>/<step % window>``
    hold ``[round, epoch, step, entry]`` (JSON), the rank's state entry after ``step``."""

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
        text = json.dumps([round_, epoch, step, entry], separators=(",", ":"))
        self.store.set(self._key(self.rank, step), text)

    def retire(self) -> None:
        _retired.append(self)

    def retire_now(self) -> None:
        """Mark this rank's ring gone for readers, then free its keys."""
        with contextlib.suppress(Exception):
            self.store.set(self._gone(self.rank), "1")
            for slot in range(self.window):
                self.store.delete_key(f"{self._prefix}/{self.rank}/{slot}")

    def read(self, round_: int, epoch: int, step: int, *, owner: str) -> list[Any]:
        """Every peer's entry after ``step`` batches of ``epoch`` (None at this rank's place);
        LoaderkitError for a peer past the window, gone, or late past the timeout."""
        entries: list[Any] = [None] * self.world_size
        peers = [r for r in range(self.world_size) if r != self.rank]
        keys = [self._key(r, step) for r in peers]
        late = peers
        if self.store.check(keys):  # one round trip in the usual case
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
        their_round, their_epoch, their_step, entry = _load(raw)
        if (their_round, their_step) == (round_, step):
            if their_epoch != epoch:  # one round is one epoch start on every rank
                raise LoaderkitError(
                    f"{owner}: rank {peer} handed out step {step} in epoch {their_epoch}, this "
                    f"rank in epoch {epoch}, at the same epoch start. Iterate the same loaders, "
                    "in the same order, on every rank."
                )
            return entry
        if their_round > round_ or (their_round == round_ and their_step > step):
            ahead = "a later epoch" if their_round > round_ else f"step {their_step}"
            raise LoaderkitError(
                f"{owner}: rank {peer} is already at {ahead} of this loader, more than "
                f"{self.window} steps past step {step} of epoch {epoch}. Save while the ranks are "
                f"that close (a dist.barrier() after the save), or raise {_ENV_WINDOW} (now "
                f"{self.window})."
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
                their_round, their_epoch, their_step, _ = _load(raw)
                last = f"its last: step {their_step} of epoch {their_epoch}"
                if their_round != round_:
                    last += " (an earlier epoch start)"
            elif self.store.check([self._gone(peer)]):
                raise LoaderkitError(
                    f"{owner}: rank {peer} dropped this loader before handing out step {step} "
                    f"of epoch {epoch}. Save the state before any rank drops the loader."
                )
            if time.monotonic() >= deadline:
                raise LoaderkitError(
                    f"{owner}: waited {self.timeout:.0f} s for rank {peer} to hand out step "
                    f"{step} of epoch {epoch} ({last}). Iterate this loader on every rank (or "
                    f"build it with rank=0, world_size=1), or raise {_ENV_TIMEOUT}."
                )
            time.sleep(pause)
            pause = min(2 * pause, _POLL_S[1])


def _load(raw: Any) -> Any:
    return json.loads(raw.decode() if isinstance(raw, bytes) else raw)
