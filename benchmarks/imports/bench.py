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

Worker first batch (issue 12, point 5): in a fresh interpreter, the time from
``iter(loader)`` to the first batch with ``num_workers=2`` under the ``spawn``
and ``forkserver`` start methods (each worker imports what unpickling the
loader's work needs: loaderkit, not Lightning), ``ResumableDataLoader`` against
``DataLoader`` over a list of ints, ``--first-batch-repeats`` rounds, shuffled.

Run: ``python benchmarks/imports/bench.py`` (3-5 minutes on 2 cores: 8 rounds of
~14 s, then the first-batch rounds; ``--repeats 1 --first-batch-repeats 1``,
what ``loaderkit bench --quick`` passes, about a minute).
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


_FIRST_BATCH = """
import sys, time
kind, ctx = sys.argv[1], sys.argv[2]
data = list(range(4096))
if kind == "ResumableDataLoader":
    from loaderkit import ResumableDataLoader
    loader = ResumableDataLoader(
        data, batch_size=64, num_workers=2, multiprocessing_context=ctx, seed=0
    )
else:
    from torch.utils.data import DataLoader
    loader = DataLoader(data, batch_size=64, num_workers=2, multiprocessing_context=ctx)
start = time.perf_counter()
it = iter(loader)
next(it)
print(time.perf_counter() - start)
print("lightning" in sys.modules)
"""


def first_batch(kind: str, ctx: str) -> tuple[float, bool]:
    """Seconds from ``iter()`` to the first batch in a fresh interpreter, and whether
    Lightning got imported there."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_BATCH, kind, ctx],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    seconds, lightning = out.stdout.strip().splitlines()[-2:]
    return float(seconds), lightning == "True"


def first_batches(repeats: int, rng: random.Random) -> list[Ratio]:
    runs = [(k, c) for c in ("spawn", "forkserver") for k in ("ResumableDataLoader", "DataLoader")]
    times: dict[tuple[str, str], list[float]] = {run: [] for run in runs}
    lightning = False
    for _ in range(repeats):
        rng.shuffle(runs)
        for kind, ctx in runs:
            seconds, imported = first_batch(kind, ctx)
            times[kind, ctx].append(seconds)
            lightning |= imported and kind == "ResumableDataLoader"
    print("\n| start method | loader | first batch, median s | best s |")
    print("|---|---|---:|---:|")
    ratios = []
    for ctx in ("spawn", "forkserver"):
        for kind in ("ResumableDataLoader", "DataLoader"):
            t = times[kind, ctx]
            print(f"| {ctx} | {kind} | {statistics.median(t):.2f} | {min(t):.2f} |")
        ratio = statistics.median(times["ResumableDataLoader", ctx]) / statistics.median(
            times["DataLoader", ctx]
        )
        ratios.append(
            Ratio(
                f"worker first batch, {ctx}: ResumableDataLoader / DataLoader",
                ratio,
                higher_is_better=False,
            )
        )
    print(f"\n'lightning' imported by a ResumableDataLoader run: {lightning}")
    return ratios


def lightning_free() -> bool:
    """Whether ``import loaderkit`` leaves Lightning unimported."""
    code = "import sys, loaderkit; print('lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "False"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds (default 7)")
    parser.add_argument("--seed", type=int, default=0, help="shuffles the order of each round")
    parser.add_argument(
        "--first-batch-repeats", type=int, default=3, help="worker first-batch rounds (0: skip)"
    )
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
    if args.first_batch_repeats > 0:
        extra = first_batches(args.first_batch_repeats, rng)
        for r in extra:
            print(f"{r.name}: {r.format()}")
        ratios += extra
    if not free:
        raise SystemExit("import loaderkit imported lightning")
    report(ratios)


if __name__ == "__main__":
    main()
