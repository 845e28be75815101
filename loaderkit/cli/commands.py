"""The ``loaderkit`` command line: demo, bench and inspect.

``loaderkit demo`` runs the main job (see :mod:`loaderkit.lightning.demo`);
``loaderkit bench`` runs the repository's benchmarks and plots their ratios
(:mod:`loaderkit.cli.bench`); ``loaderkit inspect`` builds a DataModule from a
config or a factory and reports its epoch, padding, worker throughput and
resumability (:mod:`loaderkit.cli.inspect`). Errors are one readable line plus
the fix on stderr (exit code 2); ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}; pass a positive integer")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}; pass 0 or a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``loaderkit`` command."""
    parser = argparse.ArgumentParser(prog="loaderkit", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    # --debug also after the command (`loaderkit inspect x --debug`); SUPPRESS keeps the
    # subcommand's default from overwriting a --debug given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", parents=[common], help="train a byte-level LM on the stdlib, interrupt, resume"
    )
    demo.add_argument("--max-samples", type=_positive, default=3000)
    demo.add_argument("--max-len", type=_positive, default=256)
    demo.add_argument("--batch-size", type=_positive, default=32)
    demo.add_argument(
        "--max-tokens", type=_positive, default=None, help="token budget per batch (rows x length)"
    )
    demo.add_argument("--epochs", type=_positive, default=2)
    demo.add_argument("--num-workers", type=_non_negative, default=2)
    demo.add_argument("--seed", type=_non_negative, default=0)
    demo.add_argument("--workdir", type=Path, default=Path("runs/demo"))
    demo.add_argument("--no-progress-bar", action="store_true")

    bench = sub.add_parser(
        "bench", parents=[common], help="run benchmarks/*/bench.py, plot and tabulate ratios"
    )
    bench.add_argument("--quick", action="store_true", help="small data, few repeats (seconds)")
    bench.add_argument("--only", nargs="+", metavar="NAME", help="run only these benches")
    bench.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for results.png / results-table.md (default: the benchmarks folder for "
        "a full run of every bench, runs/bench for --quick or --only, so a partial or noisy "
        "run never replaces the committed full one)",
    )
    bench.add_argument("--no-plot", action="store_true", help="skip results.png")
    bench.add_argument("--no-progress-bar", action="store_true")

    inspect = sub.add_parser(
        "inspect",
        parents=[common],
        help="report a DataModule's epoch, padding, workers and resumability",
    )
    inspect.add_argument(
        "target",
        metavar="CONFIG_OR_MODULE",
        help="a LightningCLI-style YAML config (data: {class_path, init_args}) or "
        "module.path:factory (a class or a callable returning a DataModule; a file.py works too)",
    )
    inspect.add_argument(
        "--max-workers", type=_non_negative, default=None, help="probe num_workers 0..N"
    )
    inspect.add_argument(
        "--world-size", type=_positive, default=1, help="report batches per rank for W ranks"
    )
    inspect.add_argument("--no-progress-bar", action="store_true")
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from loaderkit.lightning.demo import DemoConfig, run_demo

        result = run_demo(
            DemoConfig(
                max_samples=args.max_samples,
                max_len=args.max_len,
                batch_size=args.batch_size,
                max_tokens=args.max_tokens,
                epochs=args.epochs,
                num_workers=args.num_workers,
                seed=args.seed,
                workdir=args.workdir,
                progress_bar=not args.no_progress_bar,
            )
        )
        print(result.summary())
        return 0 if result.resume_exact else 1
    if args.command == "bench":
        return _bench(args)
    from loaderkit.cli.inspect import inspect_target

    print(
        inspect_target(
            args.target,
            max_workers=args.max_workers,
            world_size=args.world_size,
            progress=not args.no_progress_bar,
        )
    )
    return 0


def bench_output_dir(
    bench_dir: Path, *, quick: bool, only: Sequence[str] | None, out: Path | None
) -> Path:
    """Where ``loaderkit bench`` writes: ``out``, else ``benchmarks/`` for a full run of
    every bench, else ``runs/bench/`` (the committed results are a full run; a quick or
    partial one must not replace them)."""
    if out is not None:
        return out
    return bench_dir.parent / "runs" / "bench" if quick or only else bench_dir


def _bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from loaderkit.cli._bench_plot import MARKDOWN_NAME, PLOT_NAME, write_markdown, write_plot
    from loaderkit.cli.bench import discover, find_benchmarks, ratio_table, run_bench

    bench_dir = find_benchmarks()
    scripts = discover(bench_dir, args.only)
    out = bench_output_dir(bench_dir, quick=args.quick, only=args.only, out=args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    # disable=None: no bar when stderr is not a terminal (logs, pipes, CI).
    bar = tqdm(scripts, desc="bench", unit="bench", disable=True if args.no_progress_bar else None)
    for script in bar:
        bar.set_postfix_str(script.parent.name)
        result = run_bench(script, quick=args.quick)
        results.append(result)
        # tqdm.write keeps the tables above the bar instead of tearing through it.
        tqdm.write(f"\n## {result.name} ({result.seconds:.1f} s)\n\n{ratio_table(result)}")
    written = [write_markdown(results, out / MARKDOWN_NAME, quick=args.quick)]
    if not args.no_plot and any(r.ratios for r in results):
        written.append(write_plot(results, out / PLOT_NAME))
    print(f"\nwrote {', '.join(map(str, written))}")
    failed = [r.name for r in results if not r.ok]
    if failed:
        print(f"loaderkit bench: {', '.join(failed)} failed or reported no ratios", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loaderkit`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt:
        print(f"loaderkit {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # Anything raised is reported as one line: the messages name the parameter
        # and the fix. --debug re-raises for the traceback.
        if args.debug:
            raise
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(
            f"loaderkit {args.command}: error: {message} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
