"""Import time: ``import loaderkit`` against ``import torch`` (and what Lightning would add).

Why it matters: worker processes started by ``spawn`` or ``forkserver`` import
loaderkit before their first batch, and so does every command-line call. Since
the package was split by concept, ``import loaderkit`` no longer imports
Lightning (only :mod:`loaderkit.lightning` does, and the DataModule names on
``loaderkit`` load it on first access).

Competitors, each timed in a fresh interpreter (``python -c``), from just
before the import statement to just after it:

- ``import torch``: the floor; loaderkit imports torch itself.
- ``import loaderkit``: goal <= 1.3x ``import torch``.
- ``import lightning``: what every worker paid before the split.
- ``import loaderkit.lightning``: the DataModules and callbacks (imports Lightning).

Method: one untimed round warms the file cache, then each repeat runs every
competitor once in a shuffled order (machine noise hits all alike); the table
shows the median and the best over ``--repeats``. The run also checks, in a
fresh interpreter, that ``import loaderkit`` leaves ``lightning`` out of
``sys.modules``.

Run: ``python benchmarks/imports/bench.py`` (2-3 minutes on 2 cores: 8 rounds of
~14 s; ``--repeats 1``, what ``loaderkit bench --quick`` passes, under a minute).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys

from loaderkit.cli.bench import Ratio, report

COMPETITORS = {
    "import torch": "torch",
    "import loaderkit": "loaderkit",
    "import lightning": "lightning",
    "import loaderkit.lightning": "loaderkit.lightning",
}
_TIMER = "import time\nt = time.perf_counter()\nimport {module}\nprint(time.perf_counter() - t)\n"


def time_import(module: str) -> float:
    """Seconds a fresh interpreter spends in ``import module``."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    out = subprocess.run(
        [sys.executable, "-c", _TIMER.format(module=module)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return float(out.stdout.strip().splitlines()[-1])


def lightning_free() -> bool:
    """Whether ``import loaderkit`` leaves Lightning unimported."""
    code = "import sys, loaderkit; print('lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "False"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--seed", type=int, default=0, help="shuffles the order of each round")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")

    import torch

    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"torch {torch.__version__}; {args.repeats} rounds, each competitor in a fresh "
        "interpreter, shuffled order; seconds (lower is better)\n"
    )
    rng = random.Random(args.seed)
    names = list(COMPETITORS)
    for name in names:  # warm the file cache; not timed
        time_import(COMPETITORS[name])
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(args.repeats):
        rng.shuffle(names)
        for name in names:
            times[name].append(time_import(COMPETITORS[name]))

    median = {name: statistics.median(t) for name, t in times.items()}
    torch_s = median["import torch"]
    print("| import | median s | best s | vs import torch |")
    print("|---|---:|---:|---:|")
    for name in COMPETITORS:
        print(
            f"| `{name}` | {median[name]:.2f} | {min(times[name]):.2f} | "
            f"{median[name] / torch_s:.2f}x |"
        )
    free = lightning_free()
    print(f"\n'lightning' in sys.modules after `import loaderkit`: {not free}")
    ratios = [
        Ratio("import loaderkit / import torch", median["import loaderkit"] / torch_s, 1.3, False),
        Ratio(
            "import loaderkit.lightning / import torch",
            median["import loaderkit.lightning"] / torch_s,
            higher_is_better=False,
        ),
        Ratio(
            "import lightning / import torch",
            median["import lightning"] / torch_s,
            higher_is_better=False,
        ),
    ]
    for r in ratios:
        verdict = "" if r.met is None else (" (goal met)" if r.met else " (goal MISSED)")
        goal = f" {r.goal_text()}" if r.goal is not None else ""
        print(f"{r.name}: {r.format()}{goal}{verdict}")
    if not free:
        raise SystemExit("import loaderkit imported lightning")
    report(ratios)


if __name__ == "__main__":
    main()
