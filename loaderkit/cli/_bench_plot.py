"""``loaderkit bench`` output files: ``results.png`` (one panel per bench) and ``results-table.md``.

The table is not called ``results.md``: on a case-insensitive filesystem (the
macOS and Windows default) that name is the curated ``benchmarks/RESULTS.md``,
which a bench run would overwrite.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from loaderkit.cli.bench import BenchResult, Ratio, ratio_table

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["MARKDOWN_NAME", "PLOT_NAME", "write_markdown", "write_plot"]

#: File names ``loaderkit bench`` writes in its output folder.
MARKDOWN_NAME, PLOT_NAME = "results-table.md", "results.png"

_MET, _MISSED, _NO_GOAL = "#2e7d32", "#c62828", "#90a4ae"


def _color(ratio: Ratio) -> str:
    return {True: _MET, False: _MISSED, None: _NO_GOAL}[ratio.met]


def write_plot(results: Sequence[BenchResult], path: Path) -> Path:
    """Draw one horizontal bar panel per bench that reported ratios.

    Bars are the measured figures on a log axis (ratios span 0.01x to 50x),
    green where the goal is met, red where it is missed, grey where the bench
    sets no goal; a black tick on each bar marks its goal, and a dotted line
    marks parity (1x).

    Raises:
        ModuleNotFoundError: matplotlib is missing, with the install command.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed (CI, SSH)
        import matplotlib.pyplot as plt
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "matplotlib is needed to draw benchmarks/results.png: pip install 'loaderkit[bench]' "
            "(or pass --no-plot)"
        ) from exc
    shown = [r for r in results if r.ratios]
    if not shown:
        raise ValueError(
            "no bench reported ratios, so there is nothing to plot; run a bench that prints "
            "ratios, or pass --no-plot"
        )
    heights = [len(r.ratios) + 1.5 for r in shown]
    fig, axes = plt.subplots(
        len(shown),
        1,
        figsize=(12, 0.32 * sum(heights) + 1.0),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for ax, result in zip(axes[:, 0], shown, strict=True):
        _panel(ax, result)
    fig.suptitle(
        "loaderkit benchmarks: green = goal met, red = missed, grey = no goal; | = goal",
        fontsize=10,
    )
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
    ax.barh(ys, values, color=[_color(r) for r in ratios], height=0.6)
    for y, r, v in zip(ys, ratios, values, strict=True):
        label = r.format() + (f"  (goal {r.goal_text()})" if r.goal is not None else "")
        # Right of both the bar and its goal tick, so the text never sits on the tick.
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
    for result in results:
        lines += [
            "",
            f"## {result.name}",
            "",
            f"`{' '.join(result.command)}` ({result.seconds:.1f} s)",
            "",
            ratio_table(result),
            "",
            "<details><summary>full output</summary>",
            "",
            "```",
            result.output.rstrip(),
            "```",
            "",
            "</details>",
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
