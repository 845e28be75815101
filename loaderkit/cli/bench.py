"""``loaderkit bench``: run the repository's benchmarks, collect their ratios, plot them.

A bench is ``benchmarks/<name>/bench.py``, printing its own tables; it hands its ratios
over with :func:`report` (to the file :data:`REPORT_ENV` names). Benches run one at a time.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "MARKDOWN_NAME",
    "PLOT_NAME",
    "QUICK_ARGS",
    "REPORT_ENV",
    "BenchResult",
    "Ratio",
    "discover",
    "find_benchmarks",
    "ratio_table",
    "report",
    "run_bench",
    "write_markdown",
    "write_plot",
]

REPORT_ENV = "LOADERKIT_BENCH_JSON"
# Not results.md: on a case-insensitive disk that is the curated benchmarks/RESULTS.md.
MARKDOWN_NAME, PLOT_NAME = "results-table.md", "results.png"

# Per bench, the arguments of ``--quick``: seconds, noisier ratios, every code path.
QUICK_ARGS: dict[str, list[str]] = {
    name: args.split()
    for name, args in {
        "autoworkers": "--tensor-samples 5000 --png-samples 128 --png-side 64 --repeats 1",
        "bucketing": "--samples 100000 --train-samples 512 --repeats 1 --big 200000",
        "collate": "--repeats 3 --batches 4",
        "compression": "--shards 4 --tokens 500000 --repeats 1",
        "imports": "--repeats 1 --first-batch-repeats 1",
        "loader": "--samples 20000 --workers 0 --repeats 2 --fast-epochs 1 --torch-batches 40 "
        "--state-calls 2000 --state-epochs 2",
        "seeding": "--repeats 1 --seed-batches 2 --samples 5000 --batches 5 --png-samples 256 "
        "--png-batches 2 --workers 0",
        "peers": "--tokens 2000000 --shards 4 --workers 0 --batches 50 --repeats 1",
        "plans": "--samples 1000000 10000000000 --repeats 1 --old-max 1000000 --steady-batches 200",
        "remote": "--shards 4 --tokens 200000 --workers 0 --repeats 1",
        "resume": "--samples 500000 --repeats 2 --stream-samples 200000",
        "shards": "--shards 2 --tokens 1048576 --workers 0 --repeats 2 --mix-tokens 4000000 "
        "--mix-k 1 8 --mix-repeats 2 --budget-docs 20000",
        "transfer": "--sizes-mib 1 16 --batches 10 --cpu-batches 1000 --repeats 2",
        "transport": "--rows 50000 --tokens 4000000 --batches 100 --repeats 1",
        "workers": "--mib 16 --repeats 1",
        "writers": "--tokens 4000000 --shards 4 --repeats 1",
    }.items()
}


@dataclass(frozen=True)
class Ratio:
    """One figure a bench reports: a ratio (``unit="x"``), a share (``"%"``) or a count (its
    unit); ``goal`` is a floor (``higher_is_better``) or a ceiling, or None."""

    name: str
    value: float
    goal: float | None = None
    higher_is_better: bool = True
    unit: str = "x"

    @property
    def met(self) -> bool | None:
        """Whether the goal is met; ``None`` without a goal."""
        if self.goal is None:
            return None
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal

    def format(self, value: float | None = None) -> str:
        """``value`` (default: this one's) with its unit: ``1.39x``, ``0.6%``, ``8.00 shards``."""
        v = self.value if value is None else value
        return f"{v:.2f}{self.unit}" if self.unit in ("x", "%") else f"{v:.2f} {self.unit}"

    def goal_text(self) -> str:
        """The goal as ``>= 25.00x`` / ``<= 3.00%``, or an empty string."""
        if self.goal is None:
            return ""
        return f"{'>=' if self.higher_is_better else '<='} {self.format(self.goal)}"


def report(ratios: Sequence[Ratio]) -> None:
    """Hand a bench's ratios, in display order, to ``loaderkit bench`` (run by hand: no-op)."""
    path = os.environ.get(REPORT_ENV)
    if path:
        Path(path).write_text(json.dumps([asdict(r) for r in ratios], indent=1))


@dataclass
class BenchResult:
    """One bench run: its command, exit status, output and reported ratios."""

    name: str
    command: list[str]
    returncode: int
    seconds: float
    output: str
    ratios: list[Ratio] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The bench exited 0 and reported ratios."""
        return self.returncode == 0 and bool(self.ratios)


def find_benchmarks(start: Path | None = None, *, installed_checkout: bool = True) -> Path:
    """The ``benchmarks/`` folder at or above ``start`` (default: the current directory), else
    (``installed_checkout``) of the editable checkout this package runs from.

    Raises:
        FileNotFoundError: none found (the benches are not in the installed package).
    """
    start = (start or Path.cwd()).resolve()
    candidates = [start, *start.parents]
    if installed_checkout:
        candidates.append(Path(__file__).resolve().parents[2])  # the checkout above loaderkit/
    for folder in candidates:
        bench_dir = folder / "benchmarks"
        if any(bench_dir.glob("*/bench.py")):
            return bench_dir
    raise FileNotFoundError(
        f"no benchmarks/<name>/bench.py in {start} or its parents; run `loaderkit bench` "
        "from a clone of the loaderkit repository"
    )


def discover(bench_dir: Path, only: Sequence[str] | None = None) -> list[Path]:
    """The bench scripts to run: all of ``bench_dir``, or those named in ``only``."""
    found = {p.parent.name: p for p in sorted(bench_dir.glob("*/bench.py"))}
    if not only:
        return list(found.values())
    unknown = [name for name in only if name not in found]
    if unknown:
        raise ValueError(
            f"--only: no bench named {', '.join(map(repr, unknown))} in {bench_dir}; "
            f"choose from {', '.join(found)}"
        )
    return [found[name] for name in dict.fromkeys(only)]


def run_bench(script: Path, *, quick: bool) -> BenchResult:
    """Run one bench in a subprocess (its checkout first on ``PYTHONPATH``), with its ratios."""
    name = script.parent.name
    root = script.parent.parent.parent
    args = QUICK_ARGS.get(name, []) if quick else []
    command = [sys.executable, str(script.relative_to(root)), *args]
    with tempfile.TemporaryDirectory(prefix="loaderkit-bench-") as tmp:
        out = Path(tmp) / "ratios.json"
        path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, REPORT_ENV: str(out), "PYTHONPATH": path}
        env.setdefault("PYTHONWARNINGS", "ignore")
        start = time.perf_counter()
        done = subprocess.run(
            command, cwd=root, env=env, capture_output=True, text=True, check=False
        )
        seconds = time.perf_counter() - start
        ratios = [Ratio(**r) for r in json.loads(out.read_text())] if out.exists() else []
    output = done.stdout + (f"\n[stderr]\n{done.stderr}" if done.returncode else "")
    return BenchResult(name, ["python", *command[1:]], done.returncode, seconds, output, ratios)


def ratio_table(result: BenchResult) -> str:
    """The ratios of one bench as a markdown table (or why there are none)."""
    if result.returncode != 0:
        tail = "\n".join(result.output.strip().splitlines()[-8:])
        return f"`{result.name}` failed (exit code {result.returncode}):\n\n```\n{tail}\n```"
    if not result.ratios:
        return f"`{result.name}` reported no ratios (its bench.py does not call report())."
    lines = ["| ratio | value | goal | |", "|---|---:|---:|---|"]
    for r in result.ratios:
        verdict = {True: "met", False: "**MISSED**", None: ""}[r.met]
        lines.append(f"| {r.name} | {r.format()} | {r.goal_text()} | {verdict} |")
    return "\n".join(lines)


_COLORS = {True: "#2e7d32", False: "#c62828", None: "#90a4ae"}  # goal met, missed, none


def write_plot(results: Sequence[BenchResult], path: Path) -> Path:
    """Draw one bar panel per bench with ratios: green where the goal (a tick) is met, red
    where missed, grey without one.

    Raises:
        ModuleNotFoundError: matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed (CI, SSH)
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "matplotlib is needed for results.png; pip install '.[bench]' or pass --no-plot"
        ) from exc
    shown = [r for r in results if r.ratios]
    if not shown:
        raise ValueError("no bench reported ratios to plot; pass --no-plot")
    heights = [len(r.ratios) + 1.5 for r in shown]
    size = (12, 0.32 * sum(heights) + 1.0)
    ratios = {"height_ratios": heights}
    fig, axes = plt.subplots(len(shown), 1, figsize=size, gridspec_kw=ratios, squeeze=False)
    for ax, result in zip(axes[:, 0], shown, strict=True):
        _panel(ax, result)
    title = "loaderkit benchmarks: green = goal met, red = missed, grey = no goal; | = goal"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _panel(ax: Axes, result: BenchResult) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ratios = result.ratios
    ys = list(range(len(ratios)))[::-1]  # first ratio on top
    values = [max(r.value, 1e-3) for r in ratios]  # a log axis cannot show 0
    ax.barh(ys, values, color=[_COLORS[r.met] for r in ratios], height=0.6)
    for y, r, v in zip(ys, ratios, values, strict=True):
        label = r.format() + (f"  (goal {r.goal_text()})" if r.goal is not None else "")
        # Right of both the bar and its goal tick.
        ax.text(max(v, r.goal or 0) * 1.1, y, label, va="center", fontsize=7)
        if r.goal is not None:
            ax.plot([r.goal, r.goal], [y - 0.4, y + 0.4], color="black", lw=2)
    if all(r.unit == "x" for r in ratios):  # parity means nothing for a share in %
        ax.axvline(1.0, color="black", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    top = max([*values, *(r.goal or 0 for r in ratios)])
    ax.set_xlim(min([*values, 0.5]) / 1.5, top * 8)
    ax.set_yticks(ys, [r.name for r in ratios], fontsize=7)
    ax.set_title(f"{result.name} ({result.seconds:.0f} s)", fontsize=9, loc="left")
    ax.tick_params(axis="x", labelsize=7)


def write_markdown(results: Sequence[BenchResult], path: Path, *, quick: bool) -> Path:
    """Write every bench's ratio table, its command, and its full output (folded)."""
    import torch

    lines = [
        "# loaderkit bench results",
        "",
        f"{platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}"
        + (", CUDA: " + torch.cuda.get_device_name() if torch.cuda.is_available() else ", no CUDA")
        + (" — `--quick`: smaller data, fewer repeats, noisier ratios" if quick else ""),
        "",
        f"Written by `loaderkit bench`; the plot is `{PLOT_NAME}` next to this file.",
    ]
    for r in results:
        lines.append(
            f"\n## {r.name}\n\n`{' '.join(r.command)}` ({r.seconds:.1f} s)\n\n{ratio_table(r)}\n\n"
            f"<details><summary>full output</summary>\n\n```\n{r.output.rstrip()}\n```\n\n"
            "</details>"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
