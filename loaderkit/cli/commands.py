"""The ``loaderkit`` command line: ``demo``, ``bench`` and ``inspect``.

An error is one line with the fix on stderr (exit code 2); ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

DESCRIPTION = "The loaderkit command line: demo, bench and inspect."


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        fix = "a positive integer" if minimum else "0 or a positive integer"
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}; pass {fix}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}; pass {fix}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``loaderkit`` command."""
    positive, non_negative = _count(1), _count(0)
    parser = argparse.ArgumentParser(prog="loaderkit", description=DESCRIPTION)
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    # --debug after the command too; SUPPRESS keeps a --debug given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors"
    )
    common.add_argument("--no-progress-bar", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", parents=[common], help="train a byte-level LM on the stdlib, interrupt, resume"
    )
    demo.add_argument("--max-samples", type=positive, default=3000)
    demo.add_argument("--max-len", type=positive, default=256)
    demo.add_argument("--batch-size", type=positive, default=32)
    demo.add_argument("--max-tokens", type=positive, help="token budget per batch (rows x length)")
    demo.add_argument("--epochs", type=positive, default=2)
    demo.add_argument("--num-workers", type=non_negative, default=2)
    demo.add_argument("--seed", type=non_negative, default=0)
    demo.add_argument("--workdir", type=Path, default=Path("runs/demo"))

    bench = sub.add_parser(
        "bench", parents=[common], help="run benchmarks/*/bench.py, plot and tabulate ratios"
    )
    bench.add_argument("--quick", action="store_true", help="small data, few repeats (seconds)")
    bench.add_argument("--only", nargs="+", metavar="NAME", help="run only these benches")
    bench.add_argument(
        "--out",
        type=Path,
        help="folder for results.png / results-table.md (default: benchmarks/, or runs/bench "
        "for --quick or --only)",
    )
    bench.add_argument("--no-plot", action="store_true", help="skip results.png")

    inspect = sub.add_parser(
        "inspect", parents=[common], help="report a DataModule's epoch, padding, workers, resume"
    )
    inspect.add_argument(
        "target",
        metavar="CONFIG_OR_MODULE",
        help="a LightningCLI-style YAML config (data: {class_path, init_args}) or "
        "module.path:factory (a class or a callable returning a DataModule; or file.py:factory)",
    )
    inspect.add_argument("--max-workers", type=non_negative, help="probe 0..N")
    inspect.add_argument(
        "--world-size", type=positive, default=1, help="report batches per rank for W ranks"
    )
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from loaderkit.lightning.demo import DemoConfig, run_demo

        options = {k: v for k, v in vars(args).items() if k not in ("command", "debug")}
        options["progress_bar"] = not options.pop("no_progress_bar")
        result = run_demo(DemoConfig(**options))
        print(result.summary())
        return 0 if result.resume_exact else 1
    if args.command == "bench":
        return _bench(args)
    from loaderkit.cli.inspect import inspect_target

    options = {"max_workers": args.max_workers, "world_size": args.world_size}
    print(inspect_target(args.target, progress=not args.no_progress_bar, **options))
    return 0


def bench_output_dir(
    bench_dir: Path, *, quick: bool, only: Sequence[str] | None, out: Path | None
) -> Path:
    """``out``, else ``benchmarks/`` for a full run, else ``runs/bench/`` (a quick or partial
    run never replaces the committed results)."""
    if out is not None:
        return out
    return bench_dir.parent / "runs" / "bench" if quick or only else bench_dir


def _bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    import loaderkit.cli.bench as bench

    bench_dir = bench.find_benchmarks()
    scripts = bench.discover(bench_dir, args.only)
    out = bench_output_dir(bench_dir, quick=args.quick, only=args.only, out=args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    # disable=None: no bar when stderr is not a terminal (logs, pipes, CI).
    bar = tqdm(scripts, desc="bench", unit="bench", disable=True if args.no_progress_bar else None)
    for script in bar:
        bar.set_postfix_str(script.parent.name)
        result = bench.run_bench(script, quick=args.quick)
        results.append(result)
        tqdm.write(f"\n## {result.name} ({result.seconds:.1f} s)\n\n{bench.ratio_table(result)}")
    written = [bench.write_markdown(results, out / bench.MARKDOWN_NAME, quick=args.quick)]
    if not args.no_plot and any(r.ratios for r in results):
        written.append(bench.write_plot(results, out / bench.PLOT_NAME))
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
