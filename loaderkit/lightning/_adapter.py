"""Every read of Lightning's internals, in one module (private).

:class:`LightningHost` is the :class:`~loaderkit._callers.Host` a Trainer or Fabric is;
why each answer reads what it reads: ``docs/design.md`` ("The Lightning adapter").

Example:
    >>> import lightning as L
    >>> LightningHost(L.Trainer(accelerator="cpu", logger=False)).data_parallel() is None
    True
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from lightning.fabric.utilities.data import sized_len
from lightning.pytorch import Trainer
from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.model_helpers import _restricted_classmethod

from loaderkit.errors import LoaderkitError, StateMismatchError
from loaderkit.transfer import DevicePrefetcher

#: Lightning's guard that keeps ``load_from_checkpoint`` a class call (an instance call would
#: return a new module and leave the instance as it was), for a DataModule that wraps it.
restricted_classmethod = _restricted_classmethod


def data_parallel_of(driver: Any) -> tuple[int, int] | None:
    """``(rank, world_size)`` from ``driver.strategy.distributed_sampler_kwargs`` (or None)."""
    kwargs = getattr(driver.strategy, "distributed_sampler_kwargs", None)
    if kwargs is None:
        return None
    try:
        return int(kwargs["rank"]), int(kwargs["num_replicas"])
    except (KeyError, TypeError, ValueError) as exc:
        raise LoaderkitError(
            f"{type(driver.strategy).__name__}.distributed_sampler_kwargs is {kwargs!r}, "
            "without the int 'rank' and 'num_replicas'. Pass rank= and world_size= to the "
            "loader, or return both keys from the strategy."
        ) from exc


def splits_loaders(driver: Any) -> bool:
    """A Trainer's ``use_distributed_sampler``; True for a Fabric (per ``setup_dataloaders``
    call, never seeing loaderkit's loaders)."""
    if not isinstance(driver, Trainer):
        return True
    return bool(driver._accelerator_connector.use_distributed_sampler)


#: Per Trainer, the seed of each of its fit's train loaders by place (``fit_seed``).
_FIT_SEEDS: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()


class LightningHost:
    """The host a ``Trainer`` or ``Fabric`` is, held weakly; only a Trainer's running fit
    answers about its train loaders."""

    def __init__(self, driver: Any) -> None:
        self._driver = weakref.ref(driver)

    def data_parallel(self) -> tuple[int, int] | None:
        driver = self._driver()
        return None if driver is None else data_parallel_of(driver)

    def splits_loaders(self) -> bool:
        driver = self._driver()
        return driver is None or splits_loaders(driver)

    def ended(self) -> bool:
        """Whether the driver is gone, or its run failed and Lightning tore it down."""
        trainer = self._driver()
        if trainer is None:
            return True
        state = getattr(trainer, "state", None)
        return state is not None and state.status == "interrupted" and not _failing(trainer)

    def evaluating(self) -> str | None:
        trainer: Any = self._driver()
        if not hasattr(trainer, "predicting"):  # Fabric runs no loop of its own
            return None
        if trainer.predicting:
            return "predict"
        if trainer.validating or trainer.sanity_checking:
            return "validate"
        return "test" if trainer.testing else None

    def _fitting(self, loader: object, *, failing: bool = False) -> Any | None:
        """The Trainer while its fit (or, ``failing``, its ``on_exception``) runs ``loader``."""
        trainer = self._driver()
        if trainer is None or not hasattr(trainer, "fit_loop"):
            return None
        if trainer.state.fn != "fit":
            return None
        if trainer.state.status != "running" and not (failing and _failing(trainer)):
            return None
        for dl in train_loaders(trainer):
            if dl is loader or getattr(dl, "batch_sampler", None) is loader:
                return trainer
        return None

    def drives(self, loader: object) -> bool:
        return self._fitting(loader) is not None

    def held_batches(
        self, loader: object, drawn: tuple[int, str, int | None, int | None] | None = None
    ) -> int | None:
        """``fit_loop._data_fetcher.batches``; while the fit fails, also a failed step's
        unprocessed batch, and after a failed draw of ``loader`` (``drawn``, see
        :class:`~loaderkit._callers.Host`) the failed batch and the one the prefetcher popped
        before its refill raised."""
        trainer = self._fitting(loader, failing=True)
        if trainer is None:
            return None
        fetcher = trainer.fit_loop._data_fetcher
        listed = len(getattr(fetcher, "batches", ()) or ())
        if not _failing(trainer):
            return listed
        batch = trainer.fit_loop.epoch_loop.batch_progress.current
        held = listed + max(int(batch.ready) - int(batch.processed), 0)
        if drawn is None:
            return held
        handed, failure, taken_before, taken_last = drawn
        if not hasattr(fetcher, "batches"):
            # A dataloader_iter step is counted ready before it draws: an unprocessed failed step
            # holds a batch only if it drew one (the latest hand-out came after it was counted).
            return listed + int(taken_last == int(batch.ready) > int(batch.processed))
        if len(train_loaders(trainer)) > 1:
            # A hand-out neither taken by the loop nor listed went into a fetch that raised
            # (not one that ran out: min_size ends the epoch there).
            taken = int(batch.ready) - (taken_before or 0)
            if handed > taken + listed and not getattr(fetcher, "done", False):
                raise LoaderkitError(
                    "ResumableDataLoader: a batch of a combined train loader failed to load, "
                    "so this loader's batch of that step was handed out but never trained. "
                    "Resume from a step checkpoint saved before the failure."
                )
            return held
        if failure:
            counted = failure == "counted"
            # Ahead of an unsized loader, a refill that raised had popped the list's first
            # batch: neither listed nor counted ready.
            popped = getattr(fetcher, "length", 0) is None and handed - counted > listed
            held += int(popped) + int(counted)
        return held

    def batches_taken(self, loader: object) -> int | None:
        """``epoch_loop.batch_progress.current.ready`` while the fit runs ``loader``."""
        trainer = self._fitting(loader)
        return (
            None
            if trainer is None
            else int(trainer.fit_loop.epoch_loop.batch_progress.current.ready)
        )

    def sole_loader(self, loader: object) -> bool:
        """Whether ``loader`` is the fit's only train loader (also while ``on_exception`` runs)."""
        trainer = self._fitting(loader, failing=True)
        return trainer is not None and len(train_loaders(trainer)) == 1

    def batches_done(self, loader: object) -> int | None:
        """``epoch_loop.batch_progress.current.completed``, for the only train loader."""
        trainer = self._fitting(loader)
        if trainer is None or not trainer.training or len(train_loaders(trainer)) != 1:
            return None  # combined loaders cycle or stop at their own lengths
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.completed)

    def restarting_mid_epoch(self, loader: object) -> bool | None:
        """``fit_loop.restarted_mid_epoch``, unless ``reset()`` moved past a finished epoch."""
        trainer = self._fitting(loader)
        if trainer is None:
            return None
        loop = trainer.fit_loop
        progress = loop.epoch_progress.current
        return bool(loop.restarted_mid_epoch and progress.processed < progress.started)

    def restored_past(self, loader: object) -> bool:
        """A restore (``restarting`` or ``_loaded_from_state_dict``) of a completed epoch."""
        trainer = self._fitting(loader)
        loop = None if trainer is None else trainer.fit_loop
        if loop is None or not (loop.restarting or loop._loaded_from_state_dict):
            return False
        progress = loop.epoch_progress.current
        return bool(progress.completed == progress.processed == progress.started)

    def restored_ended(self, loader: object) -> bool:
        """``fit_loop.restarted_on_epoch_end`` and ``batch_progress.is_last_batch``."""
        trainer = self._fitting(loader)
        loop = None if trainer is None else trainer.fit_loop
        return loop is not None and bool(
            loop.restarted_on_epoch_end and loop.epoch_loop.batch_progress.is_last_batch
        )

    def epoch_starting(self, loader: object) -> int | None:
        """``epoch_progress.current.processed`` (read before the loop sets the epoch)."""
        trainer = self._fitting(loader)
        return None if trainer is None else int(trainer.fit_loop.epoch_progress.current.processed)

    def cycles(self, loader: object) -> bool | None:
        """Whether the train loaders are combined in mode ``"max_size_cycle"``."""
        trainer = self._fitting(loader)
        if trainer is None:
            return None
        return getattr(trainer.fit_loop._combined_loader, "_mode", None) == "max_size_cycle"

    def epoch_after_restore(self, loader: object, *, counted: bool = False) -> int | None:
        """With ``restarting`` and ``is_last_batch``: the next epoch (``counted``: only where
        ``batch_progress.total`` shows the saved batch processed, not completed)."""
        trainer = self._fitting(loader)
        if trainer is None:
            return None
        loop = trainer.fit_loop
        batches = loop.epoch_loop.batch_progress
        if not (loop.restarting and batches.is_last_batch):
            return None
        total = batches.total
        if counted and not total.ready == total.processed == total.completed + 1:
            return None
        progress = loop.epoch_progress.current
        return int(progress.processed) + int(progress.processed < progress.started)

    def sized_epoch(self, loader: object) -> bool:
        trainer = self._fitting(loader, failing=True)
        return trainer is not None and _members_sized(trainer)

    def counts_run_outs(self, loader: object) -> bool:
        """``"max_size_cycle"`` over several unsized train loaders, without reloading."""
        trainer = self._fitting(loader)
        if trainer is None or trainer.reload_dataloaders_every_n_epochs:
            return False
        several = len(train_loaders(trainer)) > 1
        return bool(self.cycles(loader)) and several and not _members_sized(trainer)

    def sets_eval_epoch(self, loader: object, epoch: int) -> bool:
        """Whether an evaluation sets its fit epoch count ``epoch`` on ``loader``, no train
        loader (``_set_sampler_epoch``, also as ``_process_dataloader`` readies a loader not
        yet in the loop's ``_combined_loader``)."""
        trainer: Any = self._driver()
        if trainer is None or self.evaluating() is None:
            return False
        if epoch != trainer.fit_loop.epoch_progress.current.processed:
            return False  # the user's own epoch
        trains = train_loaders(trainer)
        return not any(
            dl is loader or getattr(dl, "batch_sampler", None) is loader for dl in trains
        )

    def fit_seed(self, loader: object, seed: int, *, drawn: bool) -> int | None:
        """Under ``reload_dataloaders_every_n_epochs``, the seed of ``loader``'s place among
        the fit's train loaders: each reload would draw another from torch's global RNG,
        which a resumed fit has moved otherwise."""
        trainer = self._fitting(loader)
        if trainer is None or not trainer.reload_dataloaders_every_n_epochs:
            return None
        place = next((i for i, dl in enumerate(train_loaders(trainer)) if dl is loader), None)
        if place is None:  # driven through its batch sampler: no loader of its own to reseed
            return None
        seeds = _FIT_SEEDS.setdefault(trainer, {})
        if not drawn:  # the user's, or a loaded state's
            seeds[place] = seed
        return seeds.setdefault(place, seed)

    def skipped_state(self, loader: object) -> dict[str, Any] | None:
        """``loader``'s part of ``fit_loop._combined_loader_states_to_load`` that
        ``setup_data`` left unloaded (an epoch-end checkpoint, in the restored fit's first
        epoch); reloading every n > 1 epochs is refused (a resume reloads at other epochs)."""
        trainer = self._fitting(loader)
        every = 0 if trainer is None else trainer.reload_dataloaders_every_n_epochs
        if every > 1:
            raise StateMismatchError(
                f"ResumableDataLoader: a stream with steps_per_epoch cannot resume exactly "
                f"under reload_dataloaders_every_n_epochs={every}; reload it every epoch (1) "
                "or never (0)."
            )
        if trainer is None or every:
            return None
        loop = trainer.fit_loop
        states = loop._combined_loader_states_to_load
        if loop.restarting or not loop._loaded_from_state_dict or not states:
            return None
        stateful = [dl for dl in train_loaders(trainer) if _stateful(dl)]
        if not any(dl is loader for dl in stateful):
            return None
        if len(stateful) != len(states):  # Lightning raises a RuntimeError mid-epoch
            raise StateMismatchError(
                f"ResumableDataLoader: the checkpoint holds {len(states)} train loader states, "
                f"this fit has {len(stateful)} train loaders with state_dict(); resume with "
                "the train loaders that saved it."
            )
        state = states[next(i for i, dl in enumerate(stateful) if dl is loader)]
        return state if isinstance(state, dict) else None

    def epoch_meant(self, loader: object, epoch: int) -> int | None:
        """``epoch_progress.current.completed`` when ``epoch`` is the loop's ``processed``."""
        trainer = self._fitting(loader)
        if trainer is None:
            return None
        progress = trainer.fit_loop.epoch_progress.current
        if epoch != progress.processed:
            return None  # not the fit loop's own call (e.g. the user's, in a hook)
        return int(progress.completed)


def _failing(trainer: Any) -> bool:
    """Interrupted, and the teardown that drops the fit loop's data fetcher not yet done."""
    loop = getattr(trainer, "fit_loop", None)
    return (
        trainer.state.status == "interrupted" and getattr(loop, "_data_fetcher", None) is not None
    )


# The keys every loaderkit loader state has (a plan's and a stream's).
_LOADERKIT_STATE = frozenset({"checksum", "epoch", "steps_done", "topology", "version"})


def _fit_progress(checkpoint: dict[str, Any]) -> tuple[Any, Any, Any, list[Any]] | None:
    """The fit loop's state, epoch and batch progress and loaderkit loader states in
    ``checkpoint``; None where it holds none of ours."""
    fit = checkpoint.get("loops", {}).get("fit_loop", {})
    epoch = fit.get("epoch_progress", {}).get("current", {})
    batch = fit.get("epoch_loop.batch_progress", {}).get("current", {})
    states = fit.get("state_dict", {}).get("combined_loader", [])
    ours = [s for s in states if isinstance(s, dict) and set(s) >= _LOADERKIT_STATE]
    return (fit, epoch, batch, ours) if ours and epoch and batch else None


def refuse_restarted_epoch(checkpoint: dict[str, Any]) -> None:
    """Refuse a fit checkpoint with loaderkit loader states whose ``epoch_progress`` reads as
    finished while a batch was training (a fit resumed from an epoch's last batch counts its
    next epochs one short): Lightning would start that epoch over, not load the states."""
    progress = _fit_progress(checkpoint)
    if progress is None:
        return
    _, epoch, batch, ours = progress
    # A loader inside the epoch the loop counts as done (an epoch ended early, or by a stream's
    # StopIteration in training_step, leaves a batch uncompleted too: its loader is behind).
    inside = any(s["epoch"] >= epoch["processed"] for s in ours)
    if inside and epoch["ready"] == epoch["processed"] and batch["completed"] < batch["ready"]:
        raise StateMismatchError(
            f"this checkpoint's epoch progress says epoch {epoch['processed'] - 1} ended while "
            f"batch {batch['ready'] - 1} of the next one was training (Lightning counts one "
            "epoch short in a fit resumed from an epoch's last-batch checkpoint), so the fit "
            "would train that epoch's batches again. Resume from a checkpoint saved before that "
            "resume."
        )


def early_stop(checkpoint: dict[str, Any]) -> str | None:
    """Why a fit that stopped early (max_steps, max_time, should_stop) and saved
    ``checkpoint`` would not train the rest of its epoch, else None: Lightning counts that
    epoch processed and starts the next (:func:`refuse_early_stop` refuses it)."""
    progress = _fit_progress(checkpoint)
    if progress is None:
        return None
    fit, epoch, batch, ours = progress
    # An epoch that ran out beside an unsized loader has is_last_batch False too, but one of
    # its loaders handed out one more batch than was trained; a shorter one may have cycled.
    done = batch["completed"]
    last = [s["steps_done"] for s in ours if s["epoch"] == epoch["processed"] - 1]
    stopped = (
        done == batch["ready"]
        and fit["epoch_loop.batch_progress"].get("is_last_batch") is False
        and done in last
        and max(last) <= done
    )
    if epoch["ready"] != epoch["processed"] or not stopped:
        return None
    return (
        f"this checkpoint's fit stopped early in epoch {epoch['processed'] - 1} (max_steps, "
        "max_time or trainer.should_stop), and Lightning resumes it at the next epoch, so "
        "the rest of that epoch would never train. Resume from a step checkpoint "
        "(ModelCheckpoint(every_n_train_steps=...)) saved before the stop."
    )


def refuse_early_stop(trainer: Any, why: str) -> None:
    """Refuse a fit resumed from an early stop (``why``, from :func:`early_stop`),
    unless its train loaders can end an epoch as it reads: several, one without a length
    (``min_size`` running out of an unsized loader leaves ``is_last_batch`` False too)."""
    loaders = train_loaders(trainer)
    if len(loaders) > 1 and any(sized_len(dl) is None for dl in loaders):
        return
    raise StateMismatchError(why)


def _stateful(loader: Any) -> bool:
    """What Lightning's ``CombinedLoader`` saves a state of (its ``_Stateful`` protocol)."""
    return all(callable(getattr(loader, m, None)) for m in ("state_dict", "load_state_dict"))


def unwrapped(loader: Any) -> Any:
    """The loader a :class:`~loaderkit.DevicePrefetcher` wraps (Lightning holds the
    prefetcher), else ``loader``."""
    return loader.iterable if isinstance(loader, DevicePrefetcher) else loader


def _members_sized(trainer: Any) -> bool:
    """Whether every train loader has a length (the combined loader's is the
    ``limit_train_batches`` under one, whatever its members end at)."""
    combined = trainer.fit_loop._combined_loader
    return combined is not None and all(sized_len(dl) is not None for dl in combined.flattened)


def train_loaders(trainer: Any) -> list[Any]:
    """The train loaders of the running fit (empty before they are set up)."""
    combined = trainer.fit_loop._combined_loader
    return [] if combined is None else [unwrapped(dl) for dl in combined.flattened]


def held_loaders(trainer: Any) -> list[Any]:
    """Every loader the Trainer's loops hold: train, validation (the fit's and
    ``validate``'s), test and predict."""
    fit = trainer.fit_loop
    loops = [fit, fit.epoch_loop.val_loop, trainer.validate_loop, trainer.test_loop]
    combined = [loop._combined_loader for loop in [*loops, trainer.predict_loop]]
    return [unwrapped(dl) for c in combined if c is not None for dl in c.flattened]


def resize_train_epoch(trainer: Any, managed: Callable[[Any], bool]) -> None:
    """Redo what ``FitLoop.setup_data`` derived from the train loaders' lengths, with the
    ``managed`` loaders' ``len()`` now."""
    loop = trainer.fit_loop
    combined = loop._combined_loader
    if combined is None:
        return
    combined.limits = [
        _parse_num_batches(RunningStage.TRAINING, len(dl), trainer.limit_train_batches)
        if managed(unwrapped(dl))
        else limit
        for dl, limit in zip(combined.flattened, combined.limits or [], strict=False)
    ]
    # The live iterator copied the limits when it was created; it answers len().
    if combined._iterator is not None:
        combined._iterator.limits = combined.limits
    length = sized_len(combined)
    if length is None:
        return
    loop.max_batches = length
    # After an end-of-epoch restore, _TrainingEpochLoop.reset starts the next epoch afresh
    # only if the batches counted reach the epoch's length.
    epoch_loop = loop.epoch_loop
    progress = epoch_loop.batch_progress
    if epoch_loop.restarted_on_train_batch_end and progress.is_last_batch:
        progress.current.completed = max(progress.current.completed, length - 1)
    fetcher = loop._data_fetcher
    if fetcher is not None:
        fetcher.length = length
        fetcher.done = fetcher.fetched >= length
    # As in FitLoop.setup_data: the validation batch of a fractional interval.
    interval = trainer.val_check_interval
    if (
        isinstance(interval, float)
        and getattr(trainer, "_val_check_time_interval", None) is None
        and trainer.val_check_batch not in (None, float("inf"))
    ):
        trainer.val_check_batch = max(1, int(length * interval))
