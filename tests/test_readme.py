"""Every code block of the README and the docs site runs (they document only what works).

Python blocks run as written, each in a fresh temporary working folder; a block that
appears on several pages (the README's quick starts are also on the site) runs once.
YAML blocks must parse, and the classes they name must import. Shell blocks are
commands for the user (`make test` cannot run inside the suite): each command must
name a Makefile target, a `loaderkit` subcommand or an existing script, and the
example scripts themselves run in tests/test_examples.py.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The README, every page of the site, and the repository files pages include whole
# (pymdownx.snippets: --8<-- "CHANGELOG.md").
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$', flags=re.MULTILINE)
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```\s*$", flags=re.DOTALL | re.MULTILINE)


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    included = [
        ROOT / name for page in pages for name in SNIPPET.findall(page.read_text())
    ]  # fmt: skip
    return pages + sorted(set(included))


def _blocks(language: set[str]) -> dict[str, str]:
    """``{"docs/page.md:LINE": code}`` for each distinct block in one of ``language``."""
    found: dict[str, str] = {}
    for page in _pages():
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) not in language or match.group(2) in found.values():
                continue
            line = text.count("\n", 0, match.start()) + 1
            found[f"{page.relative_to(ROOT)}:{line}"] = match.group(2)
    return found


PYTHON = _blocks({"python"})
YAML = _blocks({"yaml", "yml"})
SHELL = _blocks({"bash", "sh", "shell", "console"})


def test_the_docs_have_blocks_of_each_kind() -> None:
    pages = {where.split(":")[0] for where in PYTHON}
    assert "README.md" in pages and "docs/getting-started.md" in pages
    assert len(PYTHON) >= 30 and YAML and len(SHELL) >= 5


@pytest.mark.parametrize("where", sorted(PYTHON))
@pytest.mark.usefixtures("in_tmp")  # whatever a block writes lands in a fresh folder
def test_python_block_runs(where: str) -> None:
    namespace: dict[str, object] = {"__name__": "docs_block"}
    saved = dict(os.environ)  # a block may set variables (a cache folder): not for later tests
    try:
        exec(compile(PYTHON[where], where, "exec"), namespace)
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize("where", sorted(YAML))
def test_yaml_block_parses_and_names_real_classes(where: str) -> None:
    import yaml

    from loaderkit.cli.inspect import load_object

    text = YAML[where]
    assert isinstance(yaml.safe_load(text), dict), where
    for path in re.findall(r"class_path:\s*([\w.]+)", text):
        module, _, name = path.rpartition(".")
        assert load_object(f"{module}:{name}") is not None, path


def _commands(block: str) -> list[list[str]]:
    commands = []
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith(("git clone", "cd ")):
            commands.append(shlex.split(line.replace("$ ", "", 1)))
    return commands


@pytest.mark.parametrize("where", sorted(SHELL))
def test_shell_block_names_real_commands(where: str) -> None:
    from loaderkit.cli.commands import build_parser

    subcommands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    for words in _commands(SHELL[where]):
        while words and "=" in words[0]:  # VAR=value prefixes
            words = words[1:]
        program, args = words[0], words[1:]
        if program == "make":
            assert set(args) <= targets | {a for a in args if "=" in a}, (where, words)
        elif program == "loaderkit":
            assert args[0] in subcommands, (where, words)
        elif program.endswith("python") and args and args[0].endswith(".py"):
            assert (ROOT / args[0]).is_file(), (where, words)
        elif program == "pip" or program.endswith("python"):
            continue  # installs and `python -m` commands: run by tests/test_packaging.py
        else:
            raise AssertionError(f"{where}: unknown command {words}; add a check for it here")
