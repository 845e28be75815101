"""``loaderkit inspect``: build a DataModule from a config or a factory and report on it.

The target is either a LightningCLI-style YAML config::

    data:
      class_path: loaderkit.lightning.datamodules.TensorDataModule
      init_args: {train: data.pt, batch_size: 64}

(or ``class_path``/``init_args`` at the top level), or ``module.path:name``
(``path/to/file.py:name`` works too), where ``name`` is a DataModule class or
a callable returning a DataModule, called without arguments. The report says
how many samples and batches per rank an epoch has, how much of it is
padding, how many shards a batch draws from (sharded data), how a mix
draws from each of its sources (a MixedDataset), how fast the
train loader runs for each ``num_workers`` and which to use, and whether a
resumed run continues at the exact next sample.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import itertools
import sys
import textwrap
from collections.abc import Sized
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["build_datamodule", "inspect_target", "load_object"]

#: Columns of the report: it reads in a terminal without wrapping.
WIDTH = 100

_FIX_TARGET = (
    "pass a LightningCLI YAML config (data: {class_path: ..., init_args: {...}}) or "
    "module.path:factory, e.g. loaderkit inspect my_project.data:make_datamodule"
)


def load_object(spec: str) -> Any:
    """The object named by ``module.path:attr`` or ``file.py:attr`` (dots in ``attr`` allowed).

    The current directory is importable, as it is for ``python -m``, so a
    project's own modules are found without installing them.

    Raises:
        ValueError: ``spec`` is not of that form.
        ImportError: the module cannot be imported, or lacks the attribute.
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected module.path:name, got {spec!r}; {_FIX_TARGET}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise FileNotFoundError(f"no file {module_name!r} (from {spec!r}); {_FIX_TARGET}")
        module = _load_file(path)
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            raise ImportError(
                f"cannot import {module_name!r} from {spec!r} ({exc}); check the spelling, "
                "and run from the folder that contains it or add that folder to PYTHONPATH"
            ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_"))[:12]
            raise ImportError(
                f"{module_name!r} has no attribute {attr!r}; names there include {names}"
            )
        obj = getattr(obj, part)
    return obj


def _load_file(path: Path) -> ModuleType:
    """The module of the file ``path``, registered without shadowing any other module.

    Registering it under its stem would let ``./yaml.py`` replace the real
    ``yaml`` for the whole process. When the stem imports as this very file (its
    folder is on ``sys.path``), the ordinary import is used, so classes defined
    there pickle by name into workers started with spawn; otherwise the module
    gets a private name of its own.
    """
    stem = path.stem
    if stem.isidentifier():
        try:
            found = importlib.util.find_spec(stem)
        except (ImportError, ValueError):  # ValueError: a module with no __spec__, e.g. __main__
            found = None
        origin = getattr(found, "origin", None)
        if origin and Path(origin).resolve() == path.resolve():
            return importlib.import_module(stem)
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
    base = f"_loaderkit_inspect_{stem if stem.isidentifier() else 'file'}_{digest}"
    name = base
    for n in itertools.count(2):  # the same file loaded again: a fresh module beside the old
        if name not in sys.modules:
            break
        name = f"{base}_{n}"
    loaded = importlib.util.spec_from_file_location(name, path)
    assert loaded is not None and loaded.loader is not None  # a .py file always has both
    module = importlib.util.module_from_spec(loaded)
    # Registered before it runs: dataclasses and pickling look classes up by module name.
    sys.modules[name] = module
    try:
        loaded.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _instantiate(node: Any, where: str) -> Any:
    """Build ``{class_path, init_args}`` nodes (recursively), as LightningCLI does."""
    if isinstance(node, list):
        return [_instantiate(v, f"{where}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if "class_path" not in node:
        return {k: _instantiate(v, f"{where}.{k}") for k, v in node.items()}
    unknown = sorted(set(node) - {"class_path", "init_args"})
    if unknown:
        raise ValueError(
            f"{where}: unexpected keys {unknown} next to class_path; put constructor "
            "arguments under init_args"
        )
    path = node["class_path"]
    if not isinstance(path, str) or "." not in path:
        raise ValueError(
            f"{where}.class_path must be a dotted path such as "
            f"loaderkit.lightning.datamodules.TensorDataModule, got {path!r}"
        )
    module, _, name = path.rpartition(".")
    cls = load_object(f"{module}:{name}")
    args = node.get("init_args") or {}
    if not isinstance(args, dict):
        raise ValueError(
            f"{where}.init_args must be a mapping, got {type(args).__name__}; write "
            "init_args: {name: value, ...}"
        )
    kwargs = {k: _instantiate(v, f"{where}.init_args.{k}") for k, v in args.items()}
    return cls(**kwargs)


def build_datamodule(target: str) -> Any:
    """The DataModule a YAML config or a ``module:factory`` describes.

    Raises:
        FileNotFoundError: the config file is missing.
        ValueError: the target or config is malformed (naming the key).
        TypeError: the result is not a ``LightningDataModule``.
    """
    if target.endswith((".yaml", ".yml")):
        import yaml

        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"no config file {target!r}; {_FIX_TARGET}")
        config = yaml.safe_load(path.read_text()) or {}
        if not isinstance(config, dict):
            raise ValueError(
                f"{target}: expected a mapping at the top, got {type(config).__name__}; write "
                "data: {class_path: loaderkit.lightning.datamodules.X, init_args: {...}}"
            )
        node, where = (config["data"], "data") if "data" in config else (config, target)
        if not isinstance(node, dict) or "class_path" not in node:
            raise ValueError(
                f"{target}: no class_path under 'data' or at the top level; write "
                "data: {class_path: loaderkit.lightning.datamodules.X, init_args: {...}}"
            )
        dm = _instantiate(node, where)
    elif ":" in target:
        obj = load_object(target)
        if not callable(obj):
            raise TypeError(
                f"{target} is a {type(obj).__name__}, not a class or factory; point it at a "
                "LightningDataModule class or a function returning one"
            )
        dm = obj()
    else:
        raise ValueError(f"don't know how to read {target!r}; {_FIX_TARGET}")
    # Here, not above: a mistyped path fails without Lightning's slow import.
    from loaderkit.lightning.datamodules._util import require_datamodule

    return require_datamodule(dm, target)


def _engine_kind(loader: Any) -> str | None:
    """A ResumableDataLoader's ``describe()["engine"]``; None for any other loader."""
    from loaderkit.loader.resumable import ResumableDataLoader

    return loader.describe()["engine"] if isinstance(loader, ResumableDataLoader) else None


def _steps(loader: Any, world_size: int) -> int | None:
    """Batches per rank in epoch 0, or None when the loader cannot know."""
    if _engine_kind(loader) == "stream":
        # A ResumableDataLoader over a StreamingShardedDataset: its plan is a one-sample
        # stand-in, so the epoch comes from the stream's limit (None: one pass).
        from loaderkit.lightning.datamodules._util import stream_epoch_steps

        return stream_epoch_steps(loader, world_size)
    if _engine_kind(loader) == "iterable":
        # An IterableDataset passed directly: DataLoader's length (from len(dataset)), on
        # one process only.
        if world_size != 1:
            return None
        try:
            return len(loader)
        except TypeError:
            return None
    plan = getattr(loader, "plan", None)
    if plan is not None:
        return int(plan.num_steps(0, start=0, world_size=world_size))
    if world_size != 1:
        return None
    try:  # a torch DataLoader over an IterableDataset has __len__ but no length
        return len(loader)
    except TypeError:
        return None


def _probe(
    dm: Any, max_workers: int | None, budget_s: float = 2.0
) -> tuple[dict[int, float], dict[int, float]]:
    """Train samples/s after start-up, and start-up seconds, for ``num_workers`` 0..max.

    Start-up is the time until every worker has handed over its first batch (each
    worker's first batch pays its process start and imports); the rate is timed over
    the batches after that, for an equal share of ``budget_s`` (at least a few
    batches), so a slow start never reads as slow loading.
    """
    from loaderkit.env import cpu_budget

    if max_workers is None:  # the module's default (probe_num_workers)
        max_workers = min(cpu_budget(1), 8)
    rates: dict[int, float] = {}
    startup: dict[int, float] = {}
    for workers in range(max_workers + 1):
        loader = dm.loader("train", num_workers=workers, pin_memory=False)
        startup[workers], rates[workers] = _time_loader(
            loader, first=max(workers, 1), budget_s=budget_s / (max_workers + 1)
        )
    return rates, startup


def _time_loader(loader: Any, *, first: int, budget_s: float) -> tuple[float, float]:
    """Seconds to the first ``first`` batches, then samples/s of the batches after them."""
    import time

    from loaderkit.lightning.datamodules._util import batch_rows

    start = time.perf_counter()
    it = iter(loader)
    try:
        head = list(itertools.islice(it, first))
        ready = time.perf_counter()
        rows = batches = 0
        for batch in it:
            rows += batch_rows(batch)
            batches += 1
            now = time.perf_counter()
            if batches >= 200 or (batches >= 5 and now - ready >= budget_s):
                break
        if batches == 0:  # an epoch of at most `first` batches: start-up is all there is
            return ready - start, sum(map(batch_rows, head)) / max(ready - start, 1e-9)
        return ready - start, rows / max(time.perf_counter() - ready, 1e-9)
    finally:
        close = getattr(it, "close", None)
        if callable(close):
            close()  # stop the workers now, not when the iterator is collected


def _facts(dm: Any, world_size: int, max_workers: int | None) -> dict[str, Any]:
    """The report's figures, from ``describe()`` when the module has it."""
    if hasattr(dm, "describe") and hasattr(dm, "loader"):  # a LoaderDataModule
        facts = dm.describe()
        for split, info in facts["splits"].items():
            loader = dm.loader(split, num_workers=0, pin_memory=False)
            info["batches_per_rank"] = _steps(loader, world_size)
            info["stream"] = _engine_kind(loader) == "stream"
            if info["stream"]:
                from loaderkit.lightning.datamodules._util import stream_refusal

                info["refusal"] = stream_refusal(loader.dataset, loader.batch_size, world_size)
        # Judged for the world size asked about, not the one of this process.
        facts["resumable_exactly"], facts["resumable_reason"] = dm.resume_info(world_size)
        facts.setdefault("mix", None)
        facts["probe"], facts["startup"] = _probe(dm, max_workers)
        best = max(facts["probe"].values())
        # The module's rule (probe_num_workers): workers cost memory and start-up, and a
        # short probe's noise is about 10%.
        facts["best"] = min(w for w, r in facts["probe"].items() if r >= 0.9 * best)
        return facts
    # Any other LightningDataModule: only what its train loader tells.
    dm.setup("fit")
    loader = dm.train_dataloader()
    from loaderkit.loader.resumable import ResumableDataLoader

    dataset = getattr(loader, "dataset", None)
    resumable = isinstance(loader, ResumableDataLoader)
    stream = _engine_kind(loader) == "stream"
    reason = (
        "the train loader is a loaderkit ResumableDataLoader: its position is saved in "
        "the checkpoint"
        if resumable
        else f"train_dataloader() returns a {type(loader).__name__}; a resumed run restarts "
        "or replays the epoch - return a loaderkit.ResumableDataLoader, or build the module "
        "on loaderkit.lightning.datamodules.LoaderDataModule"
    )
    if stream:
        from loaderkit.lightning.datamodules._util import stream_resume_reason

        reason = stream_resume_reason(dataset)
    elif _engine_kind(loader) == "iterable":
        # Says which method resumes it: the dataset's own state, or replay-and-skip.
        reason = (
            f"resume method {loader.describe()['resume']!r}: {loader.describe()['resume_reason']}"
        )
        if world_size > 1:
            resumable = False
            reason = (
                f"an IterableDataset passed directly runs on one process, not {world_size} ranks "
                "(the loader raises): wrap it in StreamingShardedDataset with steps_per_epoch"
            )
    return {
        "datamodule": type(dm).__name__,
        "splits": {
            "train": {
                "samples": len(dataset) if isinstance(dataset, Sized) else None,
                "batches_per_rank": _steps(loader, world_size),
                "stream": stream,
            }
        },
        "padding_fraction": None,
        "shards_per_batch": None,
        "mix": loader.describe().get("mix") if resumable else None,
        "probe": None,
        "best": None,
        "resumable_exactly": resumable,
        "resumable_reason": reason,
    }


def inspect_target(
    target: str, *, max_workers: int | None = None, world_size: int = 1, progress: bool = True
) -> str:
    """Build the DataModule of ``target`` and return the report's lines.

    Args:
        target: A YAML config path or ``module.path:factory``.
        max_workers: Probe ``num_workers`` 0..this (default: the module's choice).
        world_size: Report batches per rank for this many ranks.
        progress: Show a progress bar over the steps (stderr).
    """
    from tqdm import tqdm

    if world_size < 1:
        raise ValueError(f"--world-size must be >= 1, got {world_size}; pass 1 or more")
    # disable=None: no bar when stderr is not a terminal (logs, pipes, CI).
    with tqdm(total=2, desc="inspect", disable=None if progress else True, leave=False) as bar:
        bar.set_postfix_str("building the DataModule")
        dm = build_datamodule(target)
        bar.update()
        bar.set_postfix_str("describing, probing num_workers")
        facts = _facts(dm, world_size, max_workers)
        bar.update()
    return _format(target, facts, world_size)


def _format(target: str, facts: dict[str, Any], world_size: int) -> str:
    def num(value: Any) -> str:
        return "unknown" if value is None else f"{value:,}"

    def batches(info: dict[str, Any]) -> str:
        if info.get("refusal"):
            return f"refused ({info['refusal']})"
        if info["batches_per_rank"] is None and info.get("stream"):
            return "unknown (one pass, length unknown)"
        return num(info["batches_per_rank"])

    lines = [f"loaderkit inspect: {facts['datamodule']} (from {target})"]
    splits = facts["splits"]
    lines.append(
        "  samples          " + ", ".join(f"{s} {num(i['samples'])}" for s, i in splits.items())
    )
    lines.append(
        f"  batches / epoch  per rank at world size {world_size}: "
        + ", ".join(f"{s} {batches(i)}" for s, i in splits.items())
        + " (epoch 0)"
    )
    pad = facts.get("padding_fraction")
    lines.append(
        "  padding          "
        + ("not known for this module" if pad is None else f"{pad:.1%} of train tokens")
    )
    mix = facts.get("shards_per_batch")
    if mix is not None:
        lines.append(
            f"  shards / batch   {mix:.2f} on average, {facts['single_shard_batches']:.1%} of "
            "train batches from a single shard (epoch 0, all ranks)"
        )
    lines.extend(_mix_lines(facts.get("mix")))
    probe = facts.get("probe")
    if probe:
        rates = ", ".join(f"{w}: {r:,.0f}" for w, r in probe.items())
        lines.append(f"  train samples/s  after start-up, by num_workers: {rates}")
        startup = ", ".join(f"{w}: {s:.2f} s" for w, s in facts["startup"].items())
        lines.append(f"  start-up         to every worker's first batch: {startup}")
        lines.append(
            f"  num_workers      suggested {facts['best']} (the fewest within 10% of the best rate)"
            + (
                "; the module's num_workers='auto' chooses in the run from the data wait"
                if facts.get("num_workers") == "auto"
                else ""
            )
        )
        lines.extend(_wait_lines(probe.get(0), splits.get("train", {}), world_size))
    else:
        lines.append(
            "  num_workers      not probed: only loaderkit's DataModules can rebuild their "
            "loader with another num_workers"
        )
    verdict = "yes" if facts["resumable_exactly"] else "NO"
    lines.append(f"  exact resume     {verdict}: {facts['resumable_reason']}")
    return "\n".join(wrapped for line in lines for wrapped in _wrap(line))


def _wrap(line: str) -> list[str]:
    """``line`` cut at words to :data:`WIDTH` columns, continued under its value column."""
    indent = " " * (len(line) - len(line.lstrip(" ")))
    if line.startswith("  ") and len(line) > 19 and line[2:19].endswith("  "):
        indent = " " * 19  # a "  label           value" row: continue under the value
    return textwrap.wrap(
        line,
        WIDTH,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [line]


def _wait_lines(rate: float | None, train: dict[str, Any], world_size: int) -> list[str]:
    """What in-process loading costs a training step: the data wait it would cause."""
    samples, batches = train.get("samples"), train.get("batches_per_rank")
    if not rate or not samples or not batches:
        return []
    per_batch_ms = samples / world_size / batches / rate * 1e3  # the mean batch of a rank
    # A step of s ms waits w/(w+s) for in-process loading of w ms: > 10 % below 9w.
    return [
        f"  data wait        in-process loading takes {per_batch_ms:.2f} ms per train batch: "
        f"a training step shorter than {9 * per_batch_ms:.1f} ms would wait > 10% of its "
        "time for data (DataWaitMonitor measures it in a run; num_workers='auto' acts on it)"
    ]


def _mix_lines(mix: dict[str, Any] | None) -> list[str]:
    """The train split's mix (a MixedDataset): one line per source."""
    if mix is None:
        return []
    lines = [
        f"  mix              {len(mix['sources'])} sources, {mix['epoch_size']:,} train samples "
        f"per epoch (epoch {mix['epoch']})"
        + ("" if mix["applied"] else f"; WEIGHTS NOT APPLIED: {mix['reason']}")
    ]
    width = max(len(name) for name in mix["sources"])
    for name, src in mix["sources"].items():
        first, last = src["source_epochs"]
        span = f"{first}" if first == last else f"{first}-{last}"
        lines.append(
            f"    {name:<{width}}  weight {src['weight']:6.1%}  {src['per_epoch']:,} of "
            f"{src['samples']:,} samples per epoch (x{src['repeat']:.3g}), source-epoch {span}"
        )
    return lines
