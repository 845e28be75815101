"""mkdocs hooks: repository files that pages show but that live outside ``docs/``.

The benchmark plot stays where ``loaderkit bench`` writes it (``benchmarks/results.png``);
the site gets it as a generated file instead of a copy kept in ``docs/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
# Site path -> repository file.
EXTRA = {"img/results.png": ROOT / "benchmarks" / "results.png"}


def on_files(files: Files, config: Any) -> Files:
    for uri, path in EXTRA.items():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
