"""``loaderkit bench``: run the repository's benchmarks and collect their ratios.

A bench is ``benchmarks/<name>/bench.py``, a command-line tool that prints its
own tables. To be collected here it also calls :func:`report` with its ratios
(competitor vs loaderkit, or vs a bound, with the goal when there is one);
:func:`report` writes them as JSON to the file named by the environment
variable :data:`REPORT_ENV`, which ``loaderkit bench`` sets for each run and
which is unset when a person runs the bench by hand. Benches run one after
another, never in parallel: they time themselves, and two at once would skew
each other on a small machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "QUICK_ARGS",
    "REPORT_ENV",
    "BenchResult",
    "Ratio",
    "discover",
    "find_benchmarks",
    "ratio_table",
    "report",
    "run_bench",
]

REPORT_ENV = "LOADERKIT_BENCH_JSON"

# Arguments that make each bench finish in seconds (under ``--quick``): fewer
# repeats and smaller data. Ratios are noisier, but every code path still runs.
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
    """One figure a bench reports: a ratio (``unit="x"``), a share (``unit="%"``) or a count
    (any other unit, e.g. ``"shards"``).

    Args:
        name: What is compared, e.g. ``"PadCollate / pad_sequence, uniform"``.
        value: The measured figure.
        goal: The figure to reach, or ``None`` where the bench sets no goal.
        higher_is_better: Whether the goal is a floor (``True``) or a ceiling.
        unit: ``"x"`` for ratios, ``"%"`` for shares, else the unit of a count.
    """

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
        """``value`` (default: this ratio's) with its unit: ``1.39x``, ``0.6%``, ``8.00 shards``."""
        v = self.value if value is None else value
        if self.unit in ("x", "%"):
            return f"{v:.2f}{self.unit}"
        return f"{v:.2f} {self.unit}"

    def goal_text(self) -> str:
        """The goal as ``>= 25.00x`` / ``<= 3.00%``, or an empty string."""
        if self.goal is None:
            return ""
        return f"{'>=' if self.higher_is_better else '<='} {self.format(self.goal)}"


def report(ratios: Sequence[Ratio]) -> None:
    """Hand a bench's ratios to ``loaderkit bench`` (a no-op when run by hand).

    Args:
        ratios: The bench's figures, in the order they should be shown.
    """
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
    """The ``benchmarks/`` folder of the loaderkit checkout at or above ``start``.

    The benches live in the repository, not in the installed package, so the
    search walks up from ``start`` (default: the current directory), then,
    with ``installed_checkout``, tries the checkout this package was installed
    from in editable mode.

    Raises:
        FileNotFoundError: one line naming where it looked and the fix.
    """
    start = (start or Path.cwd()).resolve()
    candidates = [start, *start.parents]
    if installed_checkout:
        candidates.append(Path(__file__).resolve().parent.parent)
    for folder in candidates:
        bench_dir = folder / "benchmarks"
        if any(bench_dir.glob("*/bench.py")):
            return bench_dir
    raise FileNotFoundError(
        f"no benchmarks/<name>/bench.py in {start} or its parents; the benches live in the "
        "loaderkit repository, not the installed package: run `loaderkit bench` from a "
        "clone (git clone ... && cd loaderkit)"
    )


def discover(bench_dir: Path, only: Sequence[str] | None = None) -> list[Path]:
    """The bench scripts to run: all of ``bench_dir``, or those named in ``only``.

    Raises:
        ValueError: a name in ``only`` that is no bench, listing the ones there are.
    """
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
    """Run one bench as a subprocess of this interpreter and collect its ratios.

    The repository root goes first on ``PYTHONPATH`` so the bench measures the
    checkout it sits in, even when another loaderkit is installed.
    """
    name = script.parent.name
    root = script.parent.parent.parent
    args = QUICK_ARGS.get(name, []) if quick else []
    command = [sys.executable, str(script.relative_to(root)), *args]
    with tempfile.TemporaryDirectory(prefix="loaderkit-bench-") as tmp:
        out = Path(tmp) / "ratios.json"
        env = dict(os.environ)
        env[REPORT_ENV] = str(out)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
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
