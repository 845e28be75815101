"""Every read of Lightning's internals, in one module (private).

loaderkit's loaders live inside Lightning's loops, and four facts about a run
are only to be had from Lightning itself. This module is the one place that
reads them; ``tests/lightning/test_adapter.py`` pins each internal it touches
(one test per internal, run against the pinned Lightning and the oldest one
``pyproject.toml`` declares), so a Lightning release that moves one fails
there, by name, instead of making a loader silently wrong.

What the loader learns, and from which internal:

- **The epoch**: Lightning's fit loop calls ``set_epoch(e)`` on
  ``loader.sampler`` and ``loader.batch_sampler.sampler`` at every epoch start
  (``lightning.fabric.utilities.data._set_sampler_epoch``, called from
  ``FitLoop``); the loader's sampler views take it (``loader/_views.py``). No
  code here: the contract is pinned by a test.
- **The data-parallel rank and size** (:class:`LightningHost`, registered with
  :mod:`loaderkit._callers` on import): the ``Trainer`` or ``Fabric`` whose
  run is on the call stack (a frame of a Lightning module whose ``self`` is
  the Trainer, one of its loops (``_Loop.trainer``) or the Fabric), and its
  ``strategy.distributed_sampler_kwargs`` (``num_replicas``, ``rank``).
  Lightning's DDP, FSDP, DeepSpeed and ``ModelParallelStrategy`` (and custom
  strategies) answer with the data-parallel group, which under tensor or
  model parallelism is not the global process group. Whether Lightning's
  loop is the caller at all is read off the stack too (frames of
  ``lightning.pytorch.loops``).
- **The batches Lightning's fetcher holds** (:func:`held_batches`,
  :meth:`LightningHost.held_batches` for a loader whose state is taken while a
  Trainer on the stack trains on it):
  ``trainer.fit_loop._data_fetcher.batches``, the batches the fetcher took
  from a loader ahead of training (one, for a loader without a length).
- **The batches Lightning counts as done in the epoch**
  (:meth:`LightningHost.batches_done`):
  ``fit_loop.epoch_loop.batch_progress.current.completed`` when the loader
  draws its epoch's first batch (the loop's ``on_run_start`` creates the
  iterator after ``reset()`` settled the count). The loader compares it with
  its own position: they differ when a checkpoint is restored in a way
  Lightning counts differently (an end-of-epoch checkpoint resumed on fewer
  ranks without :class:`~loaderkit.ElasticResume`), and Lightning would end
  the epoch early, silently skipping its last batches.
- **Whether the fit loop restarts an epoch mid-way**
  (:meth:`LightningHost.restarting_mid_epoch`): ``fit_loop.restarted_mid_epoch``
  and ``fit_loop.epoch_progress.current`` (``processed < started``: not moved
  on past a finished epoch) when the loop calls ``set_epoch(current_epoch)`` on
  a train loader. Restored
  from a mid-epoch checkpoint, the loop replays the epoch start's
  ``set_epoch``; a loader that ``CombinedLoader("max_size_cycle")`` re-iterated
  (cycled) into its own later epoch must keep its loaded position then, as the
  uninterrupted run did (it never heard that call again within the epoch).
- **The epoch length** (:func:`resize_train_epoch`): Lightning reads the
  train loaders' lengths once per ``fit``, into ``fit_loop._combined_loader``
  (``limits``, and its live ``_iterator``'s copy), ``fit_loop.max_batches``,
  the fetcher's ``length``/``done``/``fetched`` and ``trainer.val_check_batch``
  (with ``_parse_num_batches`` applying ``limit_train_batches``). Redone from
  the loaders' current lengths after a restore and at each epoch start. After
  a restore from an end-of-epoch checkpoint, also the training epoch loop's
  ``batch_progress`` (``restarted_on_train_batch_end``, ``is_last_batch``,
  ``current.completed``), which decides whether the next epoch starts afresh.

Why read internals at all: Lightning has no public way to ask for the
data-parallel group of the running strategy from inside a loader, nor to say
that an epoch's length changed; its own ``DistributedSampler`` injection is
the only consumer of ``distributed_sampler_kwargs``, and a loaderkit loader
must not be re-split by it (it splits across ranks itself).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

from lightning.fabric import Fabric
from lightning.fabric.utilities.data import sized_len
from lightning.pytorch import Trainer
from lightning.pytorch.loops.loop import _Loop
from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
from lightning.pytorch.trainer.states import RunningStage

from loaderkit._callers import register
from loaderkit.errors import LoaderkitError

__all__ = [
    "LOOP_MODULES",
    "LightningHost",
    "data_parallel_of",
    "data_parallel_size",
    "driver_on_stack",
    "held_batches",
    "resize_train_epoch",
    "train_loaders",
]

# Where Lightning's training loops live (the standalone ``pytorch_lightning`` too).
LOOP_MODULES = ("lightning.pytorch.loops", "pytorch_lightning.loops")
# Modules whose frames may hold the Trainer, a loop or the Fabric as ``self``.
_HOST_MODULES = (
    "lightning.pytorch.",
    "lightning.fabric.",
    "pytorch_lightning.",
    "lightning_fabric.",
)


def _host_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(Trainer and Fabric classes, loop classes), the standalone packages' where loaded."""
    drivers: list[type] = [Trainer, Fabric]
    loops: list[type] = [_Loop]
    standalone = sys.modules.get("pytorch_lightning")
    if standalone is not None and hasattr(standalone, "Trainer"):
        drivers.append(standalone.Trainer)
        loop_module = sys.modules.get("pytorch_lightning.loops.loop")
        if loop_module is not None:
            loops.append(loop_module._Loop)
    fabric = sys.modules.get("lightning_fabric")
    if fabric is not None and hasattr(fabric, "Fabric"):
        drivers.append(fabric.Fabric)
    return tuple(drivers), tuple(loops)


def driver_on_stack(depth: int = 1) -> Any | None:
    """The innermost ``Trainer`` or ``Fabric`` whose code is on the call stack, or None.

    Found as the ``self`` of a frame in a Lightning module: the Trainer's own
    methods, one of its loops (``_Loop.trainer``), or the Fabric's (a function
    run by ``fabric.launch(fn)`` sits under ``Fabric._wrap_with_setup``).
    """
    drivers, loops = _host_types()
    frame = sys._getframe(depth + 1)
    while frame is not None:
        code = frame.f_code
        if (
            code.co_argcount
            and code.co_varnames[0] == "self"
            and frame.f_globals.get("__name__", "").startswith(_HOST_MODULES)
        ):
            owner = frame.f_locals.get("self")
            if isinstance(owner, loops):
                return owner.trainer  # type: ignore[attr-defined]
            if isinstance(owner, drivers):
                return owner
        frame = frame.f_back  # type: ignore[assignment]
    return None


def data_parallel_of(driver: Any) -> tuple[int, int] | None:
    """``(rank, world_size)`` of ``driver``'s data-parallel group, from its strategy's
    ``distributed_sampler_kwargs``; None for a strategy without one (a single device).

    Raises:
        LoaderkitError: the strategy answers without ``rank`` and ``num_replicas``.
    """
    kwargs = getattr(driver.strategy, "distributed_sampler_kwargs", None)
    if kwargs is None:
        return None
    try:
        rank, world_size = int(kwargs["rank"]), int(kwargs["num_replicas"])
    except (KeyError, TypeError, ValueError) as exc:
        raise LoaderkitError(
            f"{type(driver.strategy).__name__}.distributed_sampler_kwargs is {kwargs!r}, "
            "without the int 'rank' and 'num_replicas' loaderkit reads the data-parallel "
            "group from; a loader cannot tell which batches this process must get. Pass "
            "rank= and world_size= (the data-parallel rank and size) to the loader, or "
            "return both keys from the strategy."
        ) from exc
    return rank, world_size


def data_parallel_size(trainer: Any) -> int:
    """The number of data-parallel ranks of ``trainer`` (1 on a single device)."""
    topology = data_parallel_of(trainer)
    return 1 if topology is None else topology[1]


class LightningHost:
    """The :class:`~loaderkit._callers.HostAdapter` for Lightning's Trainer and Fabric."""

    def loop_is_calling(self) -> bool:
        """Whether a frame of Lightning's training loops is on the call stack."""
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_globals.get("__name__", "").startswith(LOOP_MODULES):
                return True
            frame = frame.f_back  # type: ignore[assignment]
        return False

    def data_parallel(self) -> tuple[int, int] | None:
        """The data-parallel ``(rank, world_size)`` of the run driving the caller, if any."""
        driver = driver_on_stack(depth=2)
        return None if driver is None else data_parallel_of(driver)

    def held_batches(self, loader: object) -> int | None:
        """The batches the fit loop's fetcher took from ``loader`` and holds untrained,
        when a Trainer on the stack trains on it; else None."""
        trainer: Any = driver_on_stack(depth=2)
        if trainer is None or not hasattr(trainer, "fit_loop"):
            return None
        if not any(dl is loader for dl in train_loaders(trainer)):
            return None
        return held_batches(trainer)()

    def batches_done(self, loader: object) -> int | None:
        """The batches of the current epoch Lightning's fit loop counts as done, when a
        Trainer is training with ``loader`` as its only train loader; else None."""
        trainer: Any = driver_on_stack(depth=2)
        if trainer is None or not hasattr(trainer, "fit_loop"):
            return None  # Fabric, or no run: the caller's loop keeps its own count
        if not trainer.training:
            return None
        loaders = train_loaders(trainer)
        if len(loaders) != 1 or loaders[0] is not loader:
            return None  # combined loaders cycle or stop at their own lengths
        return int(trainer.fit_loop.epoch_loop.batch_progress.current.completed)

    def restarting_mid_epoch(self, loader: object) -> bool | None:
        """Whether the fit loop setting train loader ``loader``'s epoch restarts that epoch
        from a mid-epoch checkpoint (``fit_loop.restarted_mid_epoch``); None when no
        Trainer on the stack trains on ``loader``."""
        trainer: Any = driver_on_stack(depth=2)
        if trainer is None or not hasattr(trainer, "fit_loop"):
            return None
        if not any(dl is loader for dl in train_loaders(trainer)):
            return None
        loop = trainer.fit_loop
        # Restored after an epoch's last batch, the loop is "restarted mid-epoch" too, but
        # its reset() has moved on to the next epoch (processed caught up with started):
        # that set_epoch starts an epoch, as in the uninterrupted run.
        progress = loop.epoch_progress.current
        return bool(loop.restarted_mid_epoch and progress.processed < progress.started)

    def epoch_meant(self, loader: object, epoch: int) -> int | None:
        """The epoch the fit loop trains when it sets train loader ``loader``'s epoch.

        The fit loop passes ``epoch_progress.current.processed`` and trains
        ``current_epoch`` (``.completed``). They are equal at every epoch start
        except after a restart from the checkpoint written when ``max_steps``
        stopped an epoch part-way: that epoch counts as processed but not
        completed, so the loop goes on with its remaining batches as
        ``current_epoch`` while setting samplers to the next epoch, and stays
        one ahead for the rest of the run. Following ``current_epoch`` keeps the
        resumed run's data the uninterrupted run's. None when no Trainer on the
        stack trains on ``loader``, or ``epoch`` is not the fit loop's value.
        """
        trainer: Any = driver_on_stack(depth=2)
        if trainer is None or not hasattr(trainer, "fit_loop"):
            return None
        if not any(dl is loader for dl in train_loaders(trainer)):
            return None
        progress = trainer.fit_loop.epoch_progress.current
        if epoch != progress.processed:
            return None  # not the fit loop's own call (e.g. the user's, in a hook)
        return int(progress.completed)


def train_loaders(trainer: Any) -> list[Any]:
    """The train loaders of the running fit (empty before they are set up)."""
    combined = trainer.fit_loop._combined_loader
    return [] if combined is None else list(combined.flattened)


def held_batches(trainer: Any) -> Callable[[], int]:
    """A count of the batches Lightning's train fetcher took but has not trained on yet.

    Weakly bound: a loader holding it must not keep the trainer alive.
    """
    ref = weakref.ref(trainer.fit_loop)

    def count() -> int:
        loop = ref()
        fetcher = None if loop is None else loop._data_fetcher
        return len(getattr(fetcher, "batches", ()) or ())

    return count


def resize_train_epoch(trainer: Any, managed: Callable[[Any], bool]) -> None:
    """Make Lightning's epoch as long as the train loaders' ``len()`` says now.

    Lightning reads the lengths once per ``fit`` (before it restores a
    checkpoint); this redoes what ``FitLoop.setup_data`` derived from them:
    the per-loader limits (``limit_train_batches`` applied), the epoch's batch
    count in the loop and its fetcher, and the batch a fractional
    ``val_check_interval`` validates at.

    Args:
        trainer: The running Trainer.
        managed: Which loaders' lengths to re-read (the others keep their limit).
    """
    loop = trainer.fit_loop
    combined = loop._combined_loader
    if combined is None:
        return
    combined.limits = [
        _parse_num_batches(RunningStage.TRAINING, len(dl), trainer.limit_train_batches)
        if managed(dl)
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
    # Restored from a checkpoint saved after the last batch of an epoch, Lightning starts
    # the next epoch afresh only if the batches it counted reach the epoch's length
    # (_TrainingEpochLoop.reset). Under fewer ranks the length grew, so it would count
    # the saved epoch's batches as done in the next one and end that one early: make
    # its own end-of-epoch test hold (it then resets the count itself).
    epoch_loop = loop.epoch_loop
    progress = epoch_loop.batch_progress
    if epoch_loop.restarted_on_train_batch_end and progress.is_last_batch:
        progress.current.completed = max(progress.current.completed, length - 1)
    fetcher = loop._data_fetcher
    if fetcher is not None:
        fetcher.length = length
        fetcher.done = fetcher.fetched >= length
    # Lightning derives the validation batch from the first length it read, as in
    # FitLoop.setup_data: redo it, or a longer or shorter epoch validates mid-epoch or never.
    interval = trainer.val_check_interval
    if (
        isinstance(interval, float)
        and getattr(trainer, "_val_check_time_interval", None) is None
        and trainer.val_check_batch not in (None, float("inf"))
    ):
        trainer.val_check_batch = max(1, int(length * interval))


register(LightningHost())
