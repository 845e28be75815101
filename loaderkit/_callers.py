"""The host that drives a loader (Lightning's Trainer or Fabric), and what loaderkit asks it.

:func:`attach` gives one loader its host; :func:`enter` / :func:`leave` make a host every
loader's default while its run lasts. A plain loop is :data:`NO_HOST`.

Example:
    >>> host_of(object()) is NO_HOST, NO_HOST.data_parallel()  # no run in progress
    (True, None)
"""

from __future__ import annotations

from typing import Any, Protocol

_ATTR = "_loaderkit_host"  # the attribute of an attached loader (or batch sampler)


class Host(Protocol):
    """What a host tells about ``loader``, one of its train loaders in a running fit (else None)."""

    def data_parallel(self) -> tuple[int, int] | None:
        """``(rank, world_size)`` of the run's data-parallel group, or None."""

    def splits_loaders(self) -> bool:
        """Whether a loader that names no rank or world size is split across that group
        (False: the user split the data, e.g. Lightning's ``use_distributed_sampler=False``)."""

    def drives(self, loader: object) -> bool:
        """Whether the training loop iterates ``loader`` (or the loader of this batch sampler)."""

    def held_batches(
        self, loader: object, drawn: tuple[int, str, int | None, int | None] | None = None
    ) -> int | None:
        """Batches ``loader`` handed out that the host holds untrained (prefetched);
        ``drawn``: the iteration's hand-outs, how its last draw failed (``Run.failure``) and
        :meth:`batches_taken` as it began and at its latest hand-out."""

    def batches_taken(self, loader: object) -> int | None:
        """Batches of the current epoch the host took from its loaders (the train loop's)."""

    def batches_done(self, loader: object) -> int | None:
        """Batches of the current epoch the host counts as done."""

    def sole_loader(self, loader: object) -> bool:
        """Whether ``loader`` is the only train loader of the host's fit."""

    def restarting_mid_epoch(self, loader: object) -> bool | None:
        """Whether the host, setting ``loader``'s epoch, restarts that epoch part-way."""

    def restored_past(self, loader: object) -> bool:
        """Whether the host restored a checkpoint of an epoch it counts complete."""

    def epoch_meant(self, loader: object, epoch: int) -> int | None:
        """The epoch the host trains when it sets ``loader``'s epoch to ``epoch``."""

    def epoch_starting(self, loader: object) -> int | None:
        """The epoch the host trains next, as ``loader`` begins one no ``set_epoch`` named."""

    def ended(self) -> bool:
        """Whether the host's run is over (an entered host is then dropped)."""

    def cycles(self, loader: object) -> bool | None:
        """Whether the host iterates ``loader`` again when it runs out inside an epoch."""

    def restored_ended(self, loader: object) -> bool:
        """Whether the host restored a checkpoint saved as its epoch ended, and reruns it."""

    def epoch_after_restore(self, loader: object, *, counted: bool = False) -> int | None:
        """After a restore on an epoch's last batch, the next epoch (every loader starts it
        afresh); ``counted``: only where the host counts that batch done as it restores."""

    def sized_epoch(self, loader: object) -> bool:
        """Whether the host knows its epoch's length (each of its train loaders has one),
        also while its run fails."""

    def counts_run_outs(self, loader: object) -> bool:
        """Whether the host's epoch ends once each of several loaders ran out (each iterated
        once as an epoch starts)."""

    def evaluating(self) -> str | None:
        """``"predict"``, ``"validate"`` or ``"test"`` while the host runs that loop."""

    def skipped_state(self, loader: object) -> dict[str, Any] | None:
        """``loader``'s state in a restored checkpoint the host did not load into it."""

    def sets_eval_epoch(self, loader: object, epoch: int) -> bool:
        """Whether the host's evaluation sets ``epoch`` (its own count) on ``loader``."""

    def fit_seed(self, loader: object, seed: int, *, drawn: bool) -> int | None:
        """The seed ``loader``'s place in the fit keeps where the host rebuilds its loaders:
        a ``drawn`` seed is replaced by it, another becomes it; None where not rebuilt."""


class _NoHost:
    """A plain loop: no data-parallel group, and nothing known about any loader."""

    def _none(self, *args: object, **kwargs: object) -> None:
        return None

    def _false(self, *args: object, **kwargs: object) -> bool:
        return False

    def splits_loaders(self) -> bool:
        return True  # over torch.distributed's group, where one is initialised

    data_parallel = held_batches = batches_done = restarting_mid_epoch = epoch_meant = _none
    batches_taken = _none
    epoch_starting = cycles = epoch_after_restore = skipped_state = evaluating = fit_seed = _none
    drives = restored_past = restored_ended = ended = counts_run_outs = sole_loader = _false
    sets_eval_epoch = sized_epoch = _false


NO_HOST: Host = _NoHost()


def epoch_begun(host: Host, obj: object) -> int | None:
    """The epoch ``host`` trains as ``obj`` begins an iteration no ``set_epoch`` named."""
    epoch = host.epoch_starting(obj)
    if epoch is None:
        return None
    after = host.epoch_after_restore(obj)
    meant = host.epoch_meant(obj, epoch) if after is None else after
    return epoch if meant is None else meant


_runs: list[Host] = []  # hosts whose run is in progress, innermost last


def attach(obj: object, host: Host | None) -> None:
    """Make ``host`` the host of ``obj`` (None: the run's default)."""
    setattr(obj, _ATTR, host)


def enter(host: Host) -> None:
    """``host``'s run starts: it hosts every loader without one of its own."""
    _runs.append(host)


def leave(host: Host) -> None:
    """``host``'s run ended (no-op if not entered)."""
    for i in range(len(_runs) - 1, -1, -1):
        if _runs[i] is host:
            del _runs[i]
            return


def host_of(obj: object | None) -> Host:
    """The host of ``obj``: its own, else the innermost run's, else :data:`NO_HOST`."""
    own = getattr(obj, _ATTR, None)
    if own is not None:
        return own
    while _runs and _runs[-1].ended():  # a failed run's, kept for its on_exception hooks
        _runs.pop()
    return _runs[-1] if _runs else NO_HOST
