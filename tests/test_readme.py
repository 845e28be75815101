"""Every Python block of README.md runs as written (the README documents only what works)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index: int) -> None:
    namespace: dict[str, object] = {"__name__": "readme"}
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), namespace)
