"""The ``loaderkit`` command line.

``loaderkit demo`` runs the main job (see :mod:`loaderkit.demo`). Errors are
one readable line plus the fix; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``loaderkit`` command."""
    parser = argparse.ArgumentParser(prog="loaderkit", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a byte-level LM on the stdlib, interrupt, resume")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``loaderkit`` console script; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "demo":
            from loaderkit.demo import DemoConfig, run_demo

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
    except (ValueError, TypeError, OSError) as exc:
        if args.debug:
            raise
        print(
            f"loaderkit {args.command}: error: {exc} (run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
