"""An old commit of loaderkit against the new tree, side by side in one run.

``--old REV`` is checked out with ``git worktree add --detach`` into a temporary
folder (removed at the end; after a kill, ``git worktree prune`` drops it). The
new side is ``--new`` (a folder, or a revision checked out the same way), by
default the tree this script lives in. Each workload runs in child processes,
old and new alternating (the first of each repeat swaps), each child with
``PYTHONPATH`` set to its tree only, so ``import loaderkit`` picks that version
(the child checks it did). The first round is a warm-up and untimed; the table
shows the medians of the ``--repeats`` rounds after it, with ``new/old``.
Only API that both versions have is used; where they differ, the child asks
the module what it offers (``mix_shards``), never the commit's name. Goals
printed are on new/old: ``mix_shards=1`` >= 1.0x (issue 25, against fc079fa),
the loader rows within 10 % (issue 23, against 84cc6ec). ``--rounds`` prints
every round's figures, to judge the noise; so does the control row every
child adds (torch ``DataLoader`` over torch's ``TensorDataset``: the same code
on both sides). ``--clock cpu`` times the child's CPU time (``process_time``)
instead of wall time: far less skewed by other processes on a shared machine,
and exact for ``--workers 0``, where all the work is in the child.

Not a ``bench.py``: ``loaderkit bench`` runs every ``benchmarks/*/bench.py``
without arguments, and this one needs ``--old`` and a git checkout.

Workloads (``--workload``, one or more):

- ``shards``: the peers corpus (``--tokens`` uint16 tokens, default 50M, in
  ``--shards`` 16 uneven shards, written once with ``np.save``), samples of 2048
  tokens (``--targets``: and the next one), batch 8, shuffled, int64 out:
  ``ShardedDataset(paths, TokenReader, index=<per side>)`` through
  ``ds.batch_sampler`` and ``ResumableDataLoader``; samples/s over
  ``--batches`` batches after the first, with the default plan and with
  ``mix_shards=--mix-shards``; and over a whole first epoch of a new loader,
  first batch included (a version that orders the epoch before its first batch
  pays for it in that batch, one that orders as it goes, later). A side whose
  ``batch_sampler`` has no ``mix_shards`` (before c0bd32b) runs its one plan,
  the windowed order, which is ``mix_shards=1``.
- ``resume``: the same corpus and plan; the time from ``load_state_dict`` to the
  first batch of a new loader over a new dataset (shards not yet opened) at
  ``--resume-at`` (0.9) of the epoch, median of ``--resume-repeats`` per child,
  checked to be the batch the stopped run would have yielded next.
- ``loader``: the rows of ``benchmarks/loader`` that exist in both versions, at
  ``--workers``: ``ResumableDataLoader`` over ``loaderkit.TensorDataset`` (whole
  epochs), over a per-sample map dataset and over torch's ``TensorDataset``
  (``--torch-batches``), and one ``state_dict()`` call mid-epoch.
- ``seeding``: per-sample seeding as in ``benchmarks/seeding`` (the default lazy
  ``SampleSeeder``): CPU us per sample over the bare loop (``process_time``,
  the least of ``--seed-rounds`` per child), for a dataset drawing from no
  generator, or from torch's, numpy's or Python's.

Usage::

    python benchmarks/versions/compare.py --old fc079fa --workload shards --mix-shards 1
    python benchmarks/versions/compare.py --old 84cc6ec --new main --workload loader seeding
    python benchmarks/versions/compare.py --old e090858 --workload resume --tokens 4000000
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
clock = time.perf_counter  # the child's timer: --clock cpu makes it time.process_time
Row = dict[str, Any]  # name, value, unit, higher (is better), goal (for new/old)


def row(name: str, value: float, unit: str, higher: bool, goal: float | None = None) -> Row:
    return {"name": name, "value": value, "unit": unit, "higher": higher, "goal": goal}


# --------------------------------------------------------------- child: workloads
class PerSample(torch.utils.data.Dataset):
    """A user's map dataset: one row per ``__getitem__``."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.x[index]


TorchTensors = torch.utils.data.TensorDataset


def rate(batches: Iterator[Any], limit: int | None, batch_size: int) -> float:
    """Samples/s over up to ``limit`` batches after the first (untimed) one."""
    next(batches)
    count, start = 0, clock()
    for _ in batches:
        count += 1
        if limit is not None and count >= limit:
            break
    return count * batch_size / (clock() - start)


def sharded(args: argparse.Namespace, mix: int | None, notes: list[str]) -> Any:
    """A new ShardedDataset over the corpus and its batch sampler (``mix``: ``mix_shards``)."""
    from loaderkit import ShardedDataset, TokenReader

    paths = sorted(args.data.glob("shard-*.npy"))
    index = args.data / f"index-{args.child[0]}.json"  # each version its own index format
    reader = TokenReader(seq_len=args.seq_len, targets=args.targets)
    ds = ShardedDataset(paths, reader, index=index)
    kw: dict[str, Any] = {"seed": 0}
    # batch_sampler passes plan()'s arguments on (**options) since 59591b8: ask both.
    takes = [f for f in (ds.batch_sampler, getattr(ds, "plan", None)) if f is not None]
    if not any("mix_shards" in inspect.signature(f).parameters for f in takes):
        notes.append("batch_sampler has no mix_shards: its one plan, the windowed order (= 1)")
        if mix not in (None, 1):
            return ds, None
    elif mix is not None:
        kw["mix_shards"] = mix
    return ds, ds.batch_sampler(args.batch_size, **kw)


def shards(args: argparse.Namespace, notes: list[str]) -> list[Row]:
    from loaderkit import ResumableDataLoader

    rows = []
    plans = [("default plan", None)] + [(f"mix_shards={m}", m) for m in [args.mix_shards] if m]
    for label, mix in plans:
        ds, sampler = sharded(args, mix, notes)
        if sampler is None:
            notes.append(f"{label}: not run (no mix_shards)")
            continue
        loader = ResumableDataLoader(ds, batch_sampler=sampler, num_workers=args.workers)
        goal = 1.0 if mix == 1 else None  # issue 25: mix_shards=1 >= 1.0x the turn-2 code
        value = rate(iter(loader), args.batches, args.batch_size)
        rows.append(row(f"shards, {label}, nw={args.workers}", value, "samples/s", True, goal))
        # A whole first epoch of a new loader, its first batch timed too: where a version
        # computes the epoch's order (before the first batch, or as it goes) is then the same.
        ds, sampler = sharded(args, mix, notes)
        loader = ResumableDataLoader(ds, batch_sampler=sampler, num_workers=args.workers)
        start, count = clock(), sum(1 for _ in loader)
        value = count * args.batch_size / (clock() - start)
        name = f"shards, {label}, nw={args.workers}, whole first epoch"
        rows.append(row(name, value, "samples/s", True, goal))
    return rows


def resume(args: argparse.Namespace, notes: list[str]) -> list[Row]:
    from loaderkit import ResumableDataLoader

    def loader() -> Any:
        ds, sampler = sharded(args, args.mix_shards, notes)
        if sampler is None:
            return None
        return ResumableDataLoader(ds, batch_sampler=sampler, num_workers=args.workers)

    first = loader()
    if first is None:
        notes.append(f"resume: not run (no mix_shards={args.mix_shards})")
        return []
    start = clock()
    it = iter(first)
    next(it)
    fresh = clock() - start
    for _ in range(max(1, int(args.resume_at * len(first.dataset)) // args.batch_size) - 1):
        next(it)
    state = first.state_dict()
    expected = next(it)
    del it, first
    times = []
    for _ in range(args.resume_repeats):
        resumed = loader()  # built untimed; its shards are opened by the resume
        start = clock()
        resumed.load_state_dict(state)
        batch = next(iter(resumed))
        times.append(clock() - start)
        if not torch.equal(batch, expected):
            notes.append("resumed first batch is NOT the next batch of the stopped run")
    plan = "default plan" if args.mix_shards is None else f"mix_shards={args.mix_shards}"
    after = f"resume, {plan}: first batch after a resume at {args.resume_at:.0%}"
    return [
        row(f"resume, {plan}: first batch, fresh", fresh * 1e3, "ms", False),
        row(after, statistics.median(times) * 1e3, "ms", False),
    ]


def loader_rows(args: argparse.Namespace, notes: list[str]) -> list[Row]:
    import loaderkit
    from loaderkit import ResumableDataLoader

    x = torch.randn(args.samples, 64, generator=torch.Generator().manual_seed(0))
    bs, nw = 256, args.workers

    def make(ds: Any, workers: int = nw) -> Any:
        return ResumableDataLoader(ds, batch_size=bs, shuffle=True, seed=0, num_workers=workers)

    ours = make(loaderkit.TensorDataset(x))
    epochs = (b for _ in range(args.fast_epochs if nw == 0 else 1) for b in ours)
    rates = {
        "loaderkit.TensorDataset": rate(epochs, None, bs),
        "per-sample map dataset": rate(iter(make(PerSample(x))), args.torch_batches, bs),
        "torch TensorDataset": rate(iter(make(TorchTensors(x))), args.torch_batches, bs),
    }
    rows = [row(f"loader, {k}, nw={nw}", v, "samples/s", True, 0.9) for k, v in rates.items()]
    mid = make(loaderkit.TensorDataset(x), 0)
    it = iter(mid)
    for _ in range(len(mid) // 2):
        next(it)
    start = clock()
    for _ in range(args.state_calls):
        mid.state_dict()
    per = (clock() - start) / args.state_calls * 1e6
    rows.append(row("loader, one state_dict() call mid-epoch, nw=0", per, "us", False, 1.1))
    return rows


DRAWS: dict[str, Callable[[int], Any]] = {
    "none": lambda i: i,
    "torch": lambda i: torch.rand(1),
    "numpy": lambda i: np.random.random_sample(),
    "random": lambda i: random.random(),
}


def cpu_per_sample(run: Callable[[list[int]], Any], batches: list[list[int]]) -> float:
    """CPU us per sample of ``run`` over ``batches`` (CPU time: less skewed by other load)."""
    start = time.process_time()
    for b in batches:
        run(b)
    return (time.process_time() - start) / (len(batches) * len(batches[0])) * 1e6


def seeding(args: argparse.Namespace, notes: list[str]) -> list[Row]:
    from loaderkit.seeding import SampleSeeder

    batches = [list(range(k * 256, (k + 1) * 256)) for k in range(args.seed_batches)]
    rows = []
    for kind, load in DRAWS.items():
        seeder = SampleSeeder(lazy=True)

        def bare(b: list[int], load: Callable[[int], Any] = load) -> Any:
            return [load(i) for i in b]

        def seeded(b: list[int], load: Callable[[int], Any] = load, s: Any = seeder) -> Any:
            return s.load(0, 0, b, load, [])

        seeded(batches[0])  # lazy: the first batch finds the generators in use
        best = {bare: float("inf"), seeded: float("inf")}
        for k in range(args.seed_rounds):
            for run in (bare, seeded) if k % 2 else (seeded, bare):
                best[run] = min(best[run], cpu_per_sample(run, batches))
        extra = best[seeded] - best[bare]
        rows.append(row(f"seeding, CPU over the bare loop, draws from {kind}", extra, "us", False))
    return rows


WORKLOADS: dict[str, Callable[[argparse.Namespace, list[str]], list[Row]]] = {
    "shards": shards,
    "resume": resume,
    "loader": loader_rows,
    "seeding": seeding,
}


def child(args: argparse.Namespace) -> None:
    """Run the workloads in this process and print their rows as one JSON line."""
    import loaderkit

    tree = Path(args.child[1]).resolve()
    if tree not in Path(loaderkit.__file__).resolve().parents:
        raise SystemExit(f"imported {loaderkit.__file__}, not loaderkit from {tree}")
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    notes: list[str] = []
    rows = [r for name in args.workload for r in WORKLOADS[name](args, notes)]
    # The same code on both sides: its new/old shows the noise of the run.
    x = torch.randn(args.samples, 64, generator=torch.Generator().manual_seed(0))
    control = torch.utils.data.DataLoader(TorchTensors(x), 256, shuffle=True)
    value = rate(iter(control), args.torch_batches, 256)
    rows.append(row("(control) torch DataLoader + TensorDataset, nw=0", value, "samples/s", True))
    print(json.dumps({"rows": rows, "notes": notes}))


# ------------------------------------------------------------------- parent
def git(*argv: str, cwd: Path = REPO) -> str:
    done = subprocess.run(["git", *argv], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"git {' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


def checkout(rev: str, folder: Path, added: list[Path]) -> Path:
    git("worktree", "add", "--detach", "--quiet", str(folder), rev)
    added.append(folder)
    return folder


def describe(tree: Path) -> str:
    head = git("log", "-1", "--format=%h %s", cwd=tree).strip()
    dirty = git("status", "--porcelain", "--", "loaderkit", cwd=tree).strip()
    return f"{head[:90]} ({tree}{', + uncommitted changes in loaderkit/' if dirty else ''})"


def write_corpus(args: argparse.Namespace) -> None:
    """The peers corpus as ``.npy`` shards, 0.75x..1.25x the mean (both versions read them)."""
    args.data.mkdir()
    rng = np.random.default_rng(0)
    mean = args.tokens // args.shards
    for i, f in enumerate(np.linspace(0.75, 1.25, args.shards)):
        np.save(args.data / f"shard-{i:05d}.npy", rng.integers(0, 50257, int(mean * f), np.uint16))


def run_child(side: str, tree: Path, args: argparse.Namespace, argv: Sequence[str]) -> dict:
    script = str(Path(__file__).resolve())
    command = [sys.executable, script, *argv, "--child", side, str(tree), "--data", str(args.data)]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, cwd=args.data.parent, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{side} ({tree}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median(values: list[float] | None) -> float | None:
    return None if values is None else statistics.median(values)


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f} {unit}" if unit == "samples/s" else f"{value:,.3f} {unit}"


def table(runs: dict[str, list[dict]], args: argparse.Namespace) -> list[Any]:
    """Print the medians with new/old; return the new/old figures as Ratios."""
    from loaderkit.cli.bench import Ratio

    values: dict[tuple[str, str], list[float]] = {}
    meta: dict[str, Row] = {}
    for side in ("new", "old"):  # rows in the new side's order
        for result in runs[side]:
            for r in result["rows"]:
                values.setdefault((side, r["name"]), []).append(r["value"])
                meta.setdefault(r["name"], r)
    print(
        f"\n| row (median of {args.repeats}, {args.clock} clock) | old | new | new/old | better |"
    )
    print("|---|---:|---:|---:|---|")
    ratios = []
    for name, r in meta.items():
        old, new = (median(values.get((side, name))) for side in ("old", "new"))
        shown = "n/a"
        if old is not None and new is not None and old > 0 and new > 0:
            ratio = Ratio(f"new/old, {name}", new / old, r["goal"], r["higher"])
            verdict = {True: ": met", False: ": MISSED", None: ""}[ratio.met]
            shown = ratio.format() + (f" (goal {ratio.goal_text()}{verdict})" if r["goal"] else "")
            ratios.append(ratio)
        better = "higher" if r["higher"] else "lower"
        print(f"| {name} | {fmt(old, r['unit'])} | {fmt(new, r['unit'])} | {shown} | {better} |")
    for side, results in runs.items():
        for note in dict.fromkeys(n for result in results for n in result["notes"]):
            print(f"note ({side}): {note}")
    for name in meta if args.rounds else ():
        cells = {
            side: ", ".join(f"{v:,.4g}" for v in values.get((side, name), [])) for side in runs
        }
        print(f"rounds, {name}: old {cells['old']}; new {cells['new']}")
    return ratios


def parent(args: argparse.Namespace, argv: Sequence[str]) -> None:
    from loaderkit.cli.bench import report

    print(f"load average at start (1, 5, 15 min): {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
    added: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="loaderkit-versions-") as tmp:
        try:
            trees = {"old": checkout(args.old, Path(tmp) / "old", added)}
            if args.new is None or Path(args.new).is_dir():
                trees["new"] = Path(args.new or REPO).resolve()
            else:
                trees["new"] = checkout(args.new, Path(tmp) / "new", added)
            for side, tree in trees.items():
                print(f"{side}: {describe(tree)}")
            args.data = Path(tmp) / "data"
            if {"shards", "resume"} & set(args.workload):
                write_corpus(args)
            else:
                args.data.mkdir()
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            start = time.perf_counter()
            for repeat in range(args.repeats + 1):  # round 0: warm-up (page cache, index files)
                for side in ("old", "new") if repeat % 2 == 0 else ("new", "old"):
                    result = run_child(side, trees[side], args, argv)
                    if repeat:
                        runs[side].append(result)
            ratios = table(runs, args)
        finally:
            for folder in added:
                git("worktree", "remove", "--force", str(folder))
    loads = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"\n{time.perf_counter() - start:.0f} s; load average at end: {loads}")
    report(ratios)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", help="the old revision (a commit, tag or branch)")
    p.add_argument("--new", help="a folder or revision (default: this script's tree)")
    p.add_argument("--workload", nargs="+", choices=WORKLOADS, default=["shards"])
    p.add_argument("--repeats", type=int, default=5, help="rounds timed after the warm-up")
    p.add_argument("--rounds", action="store_true", help="also print every round's figures")
    p.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="cpu: needs --workers 0"
    )
    p.add_argument("--workers", type=int, default=0, help="num_workers of loaderkit's loaders")
    p.add_argument("--tokens", type=int, default=50_000_000)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--targets", action="store_true", help="TokenReader(targets=True)")
    p.add_argument("--batch-size", type=int, default=8, help="shards and resume")
    p.add_argument("--batches", type=int, default=1000, help="shards: batches timed")
    p.add_argument("--mix-shards", type=int, default=None, help="also this mix_shards")
    p.add_argument("--resume-at", type=float, default=0.9, help="share of the epoch")
    p.add_argument("--resume-repeats", type=int, default=5, help="resumes per child")
    p.add_argument("--samples", type=int, default=200_000, help="loader: rows of 64 floats")
    p.add_argument("--fast-epochs", type=int, default=4)
    p.add_argument("--torch-batches", type=int, default=300)
    p.add_argument("--state-calls", type=int, default=20_000)
    p.add_argument("--seed-batches", type=int, default=40, help="seeding: batches of 256")
    p.add_argument("--seed-rounds", type=int, default=5, help="seeding: timed rounds per child")
    p.add_argument("--child", nargs=2, metavar=("SIDE", "TREE"), help=argparse.SUPPRESS)
    p.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if not args.old:
        p.error("--old REV is required")
    if args.clock == "cpu" and args.workers:
        p.error("--clock cpu times this process only; pass --workers 0 or --clock wall")
    parent(args, argv)


if __name__ == "__main__":
    main()
