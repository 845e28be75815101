"""``loaderkit inspect``: build a DataModule from a config or a factory and report on it.

The target is a LightningCLI-style YAML config (``data: {class_path, init_args}``) or
``module.path:name`` / ``file.py:name`` (a DataModule class or a callable returning one).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import itertools
import sys
import textwrap
from collections.abc import Mapping, Sized
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["build_datamodule", "inspect_target", "load_object"]

WIDTH = 100  # columns of the report
_FIX_TARGET = (
    "pass a LightningCLI YAML config (data: {class_path: ..., init_args: {...}}) or "
    "module.path:factory (or file.py:factory), e.g. loaderkit inspect "
    "my_project.data:make_datamodule"
)
_WRITE_DATA = "write data: {class_path: loaderkit.lightning.datamodules.X, init_args: {...}}"


def load_object(spec: str) -> Any:
    """The object named by ``module.path:attr`` or ``file.py:attr``; the current directory is
    importable, as for ``python -m``.

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
                f"cannot import {module_name!r} from {spec!r} ({exc}); run from its folder or "
                "add that folder to PYTHONPATH"
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
    """The module of the file ``path``: its own import where its stem imports as this file
    (classes pickle by name into spawned workers), else a private name (``./yaml.py`` never
    replaces ``yaml``)."""
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
    sys.modules[name] = module  # before it runs: dataclasses and pickle look it up by name
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
            f"{where}.class_path must be a dotted path, got {path!r}; pass e.g. "
            "loaderkit.lightning.datamodules.TensorDataModule"
        )
    module, _, name = path.rpartition(".")
    cls = load_object(f"{module}:{name}")
    args = node.get("init_args") or {}
    if not isinstance(args, dict):
        raise ValueError(
            f"{where}.init_args must be a mapping, got {type(args).__name__}; write "
            "init_args: {name: value, ...}"
        )
    built = {k: _instantiate(v, f"{where}.init_args.{k}") for k, v in args.items()}
    try:
        return cls(**built)
    except TypeError as exc:
        if "argument" not in str(exc):  # a value's own error names itself
            raise
        # A misspelt argument's error names the base class's __init__, not the config key.
        raise TypeError(f"{where} ({path}): {exc}; check the names in {where}.init_args.") from exc


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
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = "" if mark is None else f" at line {mark.line + 1}"
            what = getattr(exc, "problem", None) or type(exc).__name__
            raise ValueError(f"{target}: not valid YAML{at} ({what}); fix the file.") from exc
        if not isinstance(config, dict):
            raise ValueError(
                f"{target}: expected a mapping at the top, got {type(config).__name__}; "
                + _WRITE_DATA
            )
        node, where = (config["data"], "data") if "data" in config else (config, target)
        if not isinstance(node, dict) or "class_path" not in node:
            raise ValueError(
                f"{target}: no class_path under 'data' or at the top level; {_WRITE_DATA}"
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
    # Here: a mistyped path fails without Lightning's slow import.
    from loaderkit.lightning.datamodules._util import require_datamodule

    return require_datamodule(dm, target)


def _engine_kind(loader: Any) -> str | None:
    from loaderkit.loader.resumable import ResumableDataLoader

    return loader.describe()["engine"] if isinstance(loader, ResumableDataLoader) else None


def _steps(loader: Any, world_size: int) -> int | None:
    """Batches per rank in epoch 0, or None when the loader cannot know."""
    if _engine_kind(loader) == "stream":  # its plan is a one-sample stand-in
        from loaderkit.lightning.datamodules._util import stream_epoch_steps

        return stream_epoch_steps(loader, world_size)
    plan = getattr(loader, "plan", None)
    if plan is not None and _engine_kind(loader) != "iterable":
        return int(plan.num_steps(0, start=0, world_size=world_size))
    if world_size != 1:  # an IterableDataset runs on one process
        return None
    try:  # a torch DataLoader over an IterableDataset has __len__ but no length
        return len(loader)
    except TypeError:
        return None


def _facts(dm: Any, world_size: int, max_workers: int | None) -> dict[str, Any]:
    if not (hasattr(dm, "describe") and hasattr(dm, "loader")):  # not a LoaderDataModule
        return _plain_facts(dm, world_size)
    from loaderkit.env import cpu_budget
    from loaderkit.lightning.datamodules._util import probe_workers, stream_refusal

    facts = dm.describe()
    for split, info in facts["splits"].items():
        loader = dm.loader(split, num_workers=0, pin_memory=False)
        info["batches_per_rank"] = _steps(loader, world_size)
        info["stream"] = _engine_kind(loader) == "stream"
        if info["stream"]:
            nw = dm.num_workers if split == "train" and isinstance(dm.num_workers, int) else 0
            try:  # under the module's own num_workers, as fit builds it
                dm.loader(split, pin_memory=False)
                info["refusal"] = stream_refusal(loader.dataset, loader.batch_size, world_size, nw)
            except ValueError as exc:
                info["refusal"] = str(exc)
    # Judged for the world size asked about, not the one of this process.
    facts["resumable_exactly"], facts["resumable_reason"] = dm.resume_info(world_size)
    if facts.get("shards_per_batch") is not None and world_size != facts["world_size"]:
        plan = dm.loader("train", num_workers=0, pin_memory=False).plan
        mix = plan.batch_mix(0, world_size=world_size)
        facts["shards_per_batch"], facts["single_shard_batches"] = mix.mean, mix.single
    facts.setdefault("mix", None)
    if max_workers is None:  # probe_num_workers' default
        max_workers = min(cpu_budget(1), 8)
    facts["probe"], facts["startup"], facts["best"] = probe_workers(dm, max_workers, 2.0)
    return facts


def _plain_facts(dm: Any, world_size: int) -> dict[str, Any]:
    from loaderkit.lightning.datamodules._util import epoch_samples
    from loaderkit.loader.resumable import ResumableDataLoader

    dm.setup("fit")
    loader = dm.train_dataloader()
    if isinstance(loader, Mapping | list | tuple):  # Lightning combines them: not counted here
        members = list(loader.values() if isinstance(loader, Mapping) else loader)
        every = bool(members) and all(isinstance(m, ResumableDataLoader) for m in members)
        reason = f"train_dataloader() returns a {type(loader).__name__} of {len(members)} "
        reason += "loaders, which Lightning combines: " + (
            "each resumes at its own position" if every else "return a ResumableDataLoader in each"
        )
        unknown = {"samples": None, "batches_per_rank": None, "stream": False}
        return _plain_report(dm, unknown, every, reason, None)
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
        described = loader.describe()  # which method resumes it: the state, or replay
        reason = f"resume method {described['resume']!r}: {described['resume_reason']}"
        if world_size > 1:
            resumable = False
            reason = (
                f"an IterableDataset passed directly runs on one process, not {world_size} ranks "
                "(the loader raises): wrap it in StreamingShardedDataset with steps_per_epoch"
            )
    samples = epoch_samples(loader, dataset) if isinstance(dataset, Sized) else None
    train = {"samples": samples, "batches_per_rank": _steps(loader, world_size), "stream": stream}
    mix = loader.describe().get("mix") if resumable else None
    return _plain_report(dm, train, resumable, reason, mix)


def _plain_report(
    dm: Any, train: dict[str, Any], resumable: bool, reason: str, mix: Any
) -> dict[str, Any]:
    return {
        "datamodule": type(dm).__name__,
        "splits": {"train": train},
        "padding_fraction": None,
        "shards_per_batch": None,
        "mix": mix,
        "probe": None,
        "best": None,
        "resumable_exactly": resumable,
        "resumable_reason": reason,
    }


def inspect_target(
    target: str, *, max_workers: int | None = None, world_size: int = 1, progress: bool = True
) -> str:
    """Build the DataModule of ``target`` and return the report.

    Args:
        target: A YAML config path or ``module.path:factory``.
        max_workers: Probe ``num_workers`` 0..this (default: the module's choice).
        world_size: Report batches per rank for this many ranks.
        progress: Show a progress bar (stderr).
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


def _num(value: Any) -> str:
    return "unknown" if value is None else f"{value:,}"


def _batches(info: dict[str, Any]) -> str:
    if info.get("refusal"):
        return f"refused ({info['refusal']})"
    if info["batches_per_rank"] is None and info.get("stream"):
        return "unknown (one pass, length unknown)"
    return _num(info["batches_per_rank"])


def _format(target: str, facts: dict[str, Any], world_size: int) -> str:
    splits = facts["splits"]
    pad = facts.get("padding_fraction")
    lines = [
        f"loaderkit inspect: {facts['datamodule']} (from {target})",
        "  samples          " + ", ".join(f"{s} {_num(i['samples'])}" for s, i in splits.items()),
        f"  batches / epoch  per rank at world size {world_size}: "
        + ", ".join(f"{s} {_batches(i)}" for s, i in splits.items())
        + " (epoch 0)",
        "  padding          "
        + ("not known for this module" if pad is None else f"{pad:.1%} of train tokens"),
    ]
    mix = facts.get("shards_per_batch")
    if mix is not None:
        lines.append(
            f"  shards / batch   {mix:.2f} on average, {facts['single_shard_batches']:.1%} of "
            "train batches from a single shard (epoch 0, all ranks)"
        )
    lines.extend(_mix_lines(facts.get("mix")))
    lines.extend(_probe_lines(facts, splits.get("train", {}), world_size))
    verdict = "yes" if facts["resumable_exactly"] else "NO"
    lines.append(f"  exact resume     {verdict}: {facts['resumable_reason']}")
    return "\n".join(wrapped for line in lines for wrapped in _wrap(line))


def _probe_lines(facts: dict[str, Any], train: dict[str, Any], world_size: int) -> list[str]:
    probe = facts.get("probe")
    if not probe:
        return [
            "  num_workers      not probed: only loaderkit's DataModules can rebuild their "
            "loader with another num_workers"
        ]
    auto = facts.get("num_workers") == "auto"
    choice = "; the module's num_workers='auto' chooses in the run from the data wait"
    lines = [
        "  train samples/s  after start-up, by num_workers: "
        + ", ".join(f"{w}: {r:,.0f}" for w, r in probe.items()),
        "  start-up         to every worker's first batch: "
        + ", ".join(f"{w}: {s:.2f} s" for w, s in facts["startup"].items()),
        f"  num_workers      suggested {facts['best']} (the fewest within 10% of the best rate)"
        + (choice if auto else ""),
    ]
    samples, batches, rate = train.get("samples"), train.get("batches_per_rank"), probe.get(0)
    if rate and samples and batches:
        per_batch_ms = samples / world_size / batches / rate * 1e3  # the mean batch of a rank
        # A step of s ms waits w / (w + s) for in-process loading of w ms: > 10 % below 9 w.
        lines.append(
            f"  data wait        in-process loading takes {per_batch_ms:.2f} ms per train batch: "
            f"a training step shorter than {9 * per_batch_ms:.1f} ms would wait > 10% of its "
            "time for data (DataWaitMonitor measures it in a run; num_workers='auto' acts on it)"
        )
    return lines


def _wrap(line: str) -> list[str]:
    """``line`` cut at words to :data:`WIDTH` columns, continued under its value column."""
    indent = " " * (len(line) - len(line.lstrip(" ")))
    if line.startswith("  ") and len(line) > 19 and line[2:19].endswith("  "):
        indent = " " * 19  # a "  label           value" row
    wrapped = textwrap.wrap(
        line, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )
    return wrapped or [line]


def _mix_lines(mix: dict[str, Any] | None) -> list[str]:
    """The train split's mix (a MixedDataset): one line per source."""
    if mix is None:
        return []
    lines = [
        f"  mix              {len(mix['sources'])} sources, {mix['epoch_size']:,} train samples "
        f"per epoch (epoch {mix['epoch']})"
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
