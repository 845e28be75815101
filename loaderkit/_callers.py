"""What loaderkit asks of the host that drives a loader: the registration hook (private).

A host is a framework that iterates loaders in its own loop: Lightning's
``Trainer`` or Lightning Fabric. loaderkit needs a few facts from it, asked at
the moment they matter:

- whether the host's training loop is the caller. Lightning's loop treats
  loaders in two ways that lose batches silently (it prefetches a batch ahead
  of a loader without a length, and caps an epoch at the first ``len()`` it
  read), so loaderkit raises its errors for those only when that loop calls;
  a loop of one's own is unaffected.
- how many batches a loader handed out the host still holds untrained
  (Lightning prefetches one from a loader without a length): a state saved
  meanwhile must not count them.
- how many batches of the epoch the host's training loop counts as done:
  the loader's own count must agree, or the host ends the epoch early (or
  late) and batches are silently left out.
- whether the host's loop, setting a loader's epoch, restarts that epoch
  from a checkpoint taken part-way through it (the loader's loaded position
  then wins over the epoch start the loop replays) or starts it afresh.
- the data-parallel rank and size of the run. With tensor or model
  parallelism they differ from the global process group's: the peers of one
  data-parallel rank must all get the same batches, which only the host
  knows (Lightning: ``strategy.distributed_sampler_kwargs``).

Everything outside :mod:`loaderkit.lightning` knows nothing of Lightning, so
the answers come through inversion: :mod:`loaderkit.lightning` registers a
:class:`HostAdapter` here when it is imported (its ``_adapter`` module holds
every read of Lightning's internals). The facade asks for that import to
happen once ``lightning.pytorch`` is loaded (:func:`load_when_imported`), so
the adapter is in place whichever of the two was imported first. Without a
registered adapter there is no host: no loop is calling and the topology is
``torch.distributed``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Protocol

__all__ = [
    "HostAdapter",
    "host",
    "host_batches_done",
    "host_epoch_meant",
    "host_held_batches",
    "host_restarting_mid_epoch",
    "host_topology",
    "load_when_imported",
    "register",
    "under_lightning_loop",
]


class HostAdapter(Protocol):
    """What a host tells loaderkit (implemented by ``loaderkit.lightning._adapter``)."""

    def loop_is_calling(self) -> bool:
        """Whether the host's training loop is on the call stack."""
        ...

    def data_parallel(self) -> tuple[int, int] | None:
        """``(rank, world_size)`` of the data-parallel group of the run driving the caller,
        or None when no run of this host is driving it."""
        ...

    def held_batches(self, loader: object) -> int | None:
        """How many batches ``loader`` handed out that the host's training loop holds
        untrained (prefetched), when ``loader`` is one of its train loaders; else None."""
        ...

    def batches_done(self, loader: object) -> int | None:
        """How many of the current epoch's batches the host's training loop counts as
        done, when ``loader`` is its only training loader; else None."""
        ...

    def restarting_mid_epoch(self, loader: object) -> bool | None:
        """Whether the host's training loop, setting ``loader``'s epoch, is restarting in
        the middle of that epoch (True) or starting it (False); None when ``loader`` is
        not one of the train loaders of a host loop on the call stack."""
        ...

    def epoch_meant(self, loader: object, epoch: int) -> int | None:
        """The epoch the host's training loop trains when it sets ``loader``'s epoch to
        ``epoch`` (they differ after some restarts); None when no host loop drives it."""
        ...


_adapter: HostAdapter | None = None
# (module, load): once ``module`` is imported, ``load()`` registers the adapter.
_pending: list[tuple[str, Callable[[], None]]] = []


def register(adapter: HostAdapter) -> None:
    """Make ``adapter`` the host adapter (the last registration wins)."""
    global _adapter
    _adapter = adapter


def load_when_imported(module: str, load: Callable[[], None]) -> None:
    """Call ``load`` (which registers an adapter) the first time a host is asked about
    while ``module`` is imported, e.g. Lightning imported after loaderkit."""
    _pending.append((module, load))


def _imported(name: str) -> bool:
    module = sys.modules.get(name)
    # A module half-way through its own import is not usable yet.
    return module is not None and not getattr(module.__spec__, "_initializing", False)


def host() -> HostAdapter | None:
    """The registered adapter, loading a pending one whose host is imported by now."""
    if _adapter is None and _pending:
        for entry in list(_pending):
            if _imported(entry[0]):
                _pending.remove(entry)
                entry[1]()
    return _adapter


def under_lightning_loop() -> bool:
    """Whether a host's training loop (Lightning's) is on the call stack."""
    adapter = host()
    return adapter is not None and adapter.loop_is_calling()


def host_topology() -> tuple[int, int] | None:
    """The data-parallel ``(rank, world_size)`` of the host run driving the caller, or None."""
    adapter = host()
    return None if adapter is None else adapter.data_parallel()


def host_batches_done(loader: object) -> int | None:
    """The batches of the current epoch the host's training loop counts as done for
    ``loader`` (its only train loader), or None when no host loop drives it."""
    adapter = host()
    return None if adapter is None else adapter.batches_done(loader)


def host_restarting_mid_epoch(loader: object) -> bool | None:
    """Whether a host loop setting ``loader``'s epoch restarts mid-epoch (True), starts the
    epoch (False), or no host loop drives ``loader`` (None)."""
    adapter = host()
    return None if adapter is None else adapter.restarting_mid_epoch(loader)


def host_epoch_meant(loader: object, epoch: int) -> int | None:
    """The epoch a host loop that sets ``loader``'s epoch to ``epoch`` trains, or None when
    no host loop drives ``loader``."""
    adapter = host()
    return None if adapter is None else adapter.epoch_meant(loader, epoch)


def host_held_batches(loader: object) -> int | None:
    """The batches ``loader`` handed out that a host's training loop still holds, or None
    when no host loop drives it (the caller's own loop holds none it did not ask for)."""
    adapter = host()
    return None if adapter is None else adapter.held_batches(loader)
