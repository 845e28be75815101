"""The front end builds one engine and then only delegates (issue 23: one engine interface)."""

from __future__ import annotations

import ast
from pathlib import Path

import loaderkit.loader as loader_pkg

LOADER = Path(loader_pkg.__file__).parent
ENGINES = ("_planned.py", "_stream.py", "_iterable.py", "_worker_stream.py")


def _tree(name: str) -> ast.Module:
    return ast.parse((LOADER / name).read_text())


def test_the_front_end_never_branches_on_the_engine_after_building_it() -> None:
    (cls,) = [
        node
        for node in _tree("resumable.py").body
        if isinstance(node, ast.ClassDef) and node.name == "ResumableDataLoader"
    ]
    calls = [
        node.func.id
        for node in ast.walk(cls)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    ]
    names = {node.attr for node in ast.walk(cls) if isinstance(node, ast.Attribute)}
    assert "isinstance" not in calls
    assert not names & {"_stream", "_iterable", "kind"}


def test_engines_never_touch_the_front_ends_private_members() -> None:
    for name in ENGINES:
        tree = _tree(name)
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "loaderkit.loader.resumable" not in imported, name
        reached = [
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and isinstance(node.value, ast.Attribute | ast.Name)
            and (getattr(node.value, "attr", None) or getattr(node.value, "id", None)) == "loader"
        ]
        assert reached == [], (name, reached)
