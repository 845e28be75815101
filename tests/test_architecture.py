"""The package layout holds: layers import downward only, no cycles, Lightning in one place.

Read off the source with ``ast`` (nothing is imported), so a violation fails
here with the offending module and line, not as an obscure import error
somewhere else.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "loaderkit"

# Each layer may import itself and the layers before it, never one after it.
LAYERS = ("base", "plan", "data", "loader", "lightning", "cli")


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported loaderkit module
    line: int
    top_level: bool  # executed at import time (module body or its if-blocks)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str:
    """The loaderkit module a dotted import lands in (a name may be an attribute)."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, with whether it runs when the module is imported."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def walk(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, top))
            inner = top and not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            walk(child, inner)

    walk(tree, True)
    return found


def edges() -> list[Edge]:
    known = modules()
    out = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, top in _imports(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # relative imports are not used; resolve them anyway
                    base = name.split(".")
                    if path.name != "__init__.py":
                        base = base[:-1]
                    base = base[: len(base) - node.level + 1]
                    target_mod = ".".join([*base, node.module] if node.module else base)
                else:
                    target_mod = node.module or ""
                # `from package import name` runs the package's __init__ (a re-export),
                # and the submodule `name` where it is one.
                targets = [target_mod, *(f"{target_mod}.{a.name}" for a in node.names)]
            else:
                targets = [a.name for a in node.names]
            found = {
                _resolve(t, known)
                for t in targets
                if t == "loaderkit" or t.startswith("loaderkit.")
            }
            out += [Edge(name, target, node.lineno, top) for target in sorted(found)]
    return out


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "base"


def test_the_tree_has_one_package_per_concept() -> None:
    packages = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert packages == sorted(LAYERS[1:])


def test_layers_import_downward_only() -> None:
    bad = []
    for e in edges():
        if e.source == "loaderkit":  # the facade re-exports every layer
            continue
        if LAYERS.index(layer(e.target)) > LAYERS.index(layer(e.source)):
            bad.append(f"{e.source}:{e.line} imports {e.target}")
    assert not bad, "a lower layer imports a higher one:\n" + "\n".join(bad)


def test_no_module_imports_the_facade() -> None:
    # `from loaderkit import X` inside the package re-enters __init__ half-built.
    bad = [f"{e.source}:{e.line}" for e in edges() if e.target == "loaderkit" and e.top_level]
    assert not bad


# Cycles still in the tree, each as the set of its modules, with who removes it (none now).
ALLOWED_CYCLES: list[set[str]] = []


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    # Every import counts: module level, TYPE_CHECKING blocks and imports inside
    # functions (a deferred import hides a cycle from the interpreter, not from the
    # reader), and `from package import x` goes through the package's __init__.
    graph: dict[str, set[str]] = {}
    for e in edges():
        if e.source != e.target:
            graph.setdefault(e.source, set()).add(e.target)
    cycles = [c for c in import_cycles(graph) if set(c) not in ALLOWED_CYCLES]
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize(
    "fake",
    [
        # at module level
        [Edge("loaderkit.a", "loaderkit.b", 1, True), Edge("loaderkit.b", "loaderkit.a", 1, True)],
        # through an import inside a function
        [Edge("loaderkit.a", "loaderkit.b", 1, True), Edge("loaderkit.b", "loaderkit.a", 9, False)],
        # through a package's __init__ that re-exports the importer
        [
            Edge("loaderkit.p", "loaderkit.p.m", 1, True),
            Edge("loaderkit.p.m", "loaderkit.p", 1, True),
        ],
    ],
)
def test_cycle_check_finds_a_cycle(monkeypatch: pytest.MonkeyPatch, fake: list[Edge]) -> None:
    # The check above must be able to fail.
    monkeypatch.setattr(sys.modules[__name__], "edges", lambda: fake)
    with pytest.raises(AssertionError, match=r"import cycles: loaderkit\.\w+(\.m)? <-> loaderkit"):
        test_no_import_cycles()


def test_from_package_import_goes_through_its_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "loaderkit"
    (pkg / "p").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "p" / "__init__.py").write_text("from loaderkit.p.m import f\n")
    (pkg / "p" / "m.py").write_text("def f():\n    from loaderkit.p import g\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    assert import_cycles({e.source: {e.target} for e in edges() if e.source != e.target}) == [
        ["loaderkit.p", "loaderkit.p.m"]
    ]


# At most this many modules directly in loaderkit/ (__init__.py included): a newcomer
# reads the top level at a glance; a small private helper lives where it is used.
MAX_TOP_LEVEL = 12
PENDING_TOP_LEVEL: set[str] = set()  # modules being folded away (none now)


def test_few_top_level_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in PENDING_TOP_LEVEL)
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} top-level modules: {top}"


MAX_FUNCTION_LINES = 80
# The loader front end's constructor only builds the spec and the engine (issue 23).
MAX_INIT_LINES = 60


def long_functions(tree: ast.Module, limit: int) -> list[tuple[str, int]]:
    """``(qualname, lines)`` of every function (nested ones too) longer than ``limit`` lines."""
    found = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    assert child.end_lineno is not None
                    lines = child.end_lineno - child.lineno + 1
                    if lines > limit:
                        found.append((name, lines))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


def test_no_long_functions() -> None:
    bad = [
        f"{name}:{qualname} ({lines} lines)"
        for name, path in modules().items()
        for qualname, lines in long_functions(ast.parse(path.read_text()), MAX_FUNCTION_LINES)
    ]
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines: " + ", ".join(bad)


def test_the_loader_constructor_is_short() -> None:
    path = modules()["loaderkit.loader.resumable"]
    long = dict(long_functions(ast.parse(path.read_text()), MAX_INIT_LINES))
    assert "ResumableDataLoader.__init__" not in long, long


def test_the_length_rule_finds_a_long_method() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(80))
    code = f"class A:\n    def f(self):\n{body}\n        def g():\n            pass\n"
    assert long_functions(ast.parse(code), 80) == [("A.f", 83)]


def _lightning_imports(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    lines = []
    for node, _ in _imports(tree):
        names = (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        )
        if any(n.split(".")[0] in ("lightning", "pytorch_lightning") for n in names):
            lines.append(node.lineno)
    # importlib.import_module("lightning...") / __import__("lightning...") count too.
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call) or not call.args:
            continue
        func = call.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        first = call.args[0]
        if (
            called in ("import_module", "__import__")
            and isinstance(first, ast.Constant)
            and str(first.value).split(".")[0] in ("lightning", "pytorch_lightning")
        ):
            lines.append(call.lineno)
    return lines


def test_only_the_lightning_package_imports_lightning() -> None:
    bad = [
        f"{name}:{line}"
        for name, path in modules().items()
        if layer(name) != "lightning"
        for line in _lightning_imports(path)
    ]
    assert not bad, "lightning imported outside loaderkit/lightning/: " + ", ".join(bad)


def _fresh(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    return out.stdout.strip()


def test_import_loaderkit_does_not_import_lightning() -> None:
    code = (
        "import sys, loaderkit\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'lightning_fabric')))\n"
        "loaderkit.TensorDataModule\n"  # the lazy names still resolve, and then load it
        "print('lightning' in sys.modules)"
    )
    assert _fresh(code).splitlines() == ["[]", "True"]


def test_the_lightning_package_imports_lightning() -> None:
    assert _fresh("import sys, loaderkit.lightning; print('lightning' in sys.modules)") == "True"


def test_public_classes_live_in_public_modules() -> None:
    import loaderkit

    bad = []
    for name in loaderkit.__all__:
        obj = getattr(loaderkit, name)
        home = getattr(obj, "__module__", None)
        if home is None or not home.startswith("loaderkit"):
            continue
        if any(part.startswith("_") for part in home.split(".")):
            bad.append(f"{name} ({home})")
    assert not bad, "public names defined in private modules: " + ", ".join(bad)


def _tag_arguments(call: ast.Call) -> list[ast.expr]:
    """The arguments of a seeding call that are keys (where a tag would go)."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name == "derive_seed":  # derive_seed(seed, *keys)
        return list(call.args[1:])
    if name == "_seed_sequence" and len(call.args) == 3:  # (caller's name, seed, keys)
        keys = call.args[2]
        return list(keys.elts) if isinstance(keys, ast.Tuple) else []
    return []


def test_seed_tags_come_from_the_one_registry() -> None:
    from loaderkit._tags import SeedTag

    tags = SeedTag.all()
    assert len(set(tags.values())) == len(tags), "two tags share a value"
    # The values are part of the checkpoint format: they fix every order a saved
    # position refers to. Changing one silently changes every resumed run's order.
    assert tags == {
        "ORDER": "order",
        "SHARDS": "shards",
        "WINDOW": "window",
        "BUCKET_ORDER": "bucket-order",
        "BUCKET_BATCHES": "bucket-batches",
        "MIX_ORDER": "mix-order",
        "MIX_SOURCE": "mix-source",
        "SAMPLER": "sampler",
        "STREAM_SHARDS": "stream-shards",
        "SAMPLE": "sample",
        "WORKER": "worker",
        "WORKERS": "workers",
        "BASE": "base",
        "VAL_SPLIT": "val_split",
    }
    bad = [
        f"{name}:{node.lineno} {arg.value!r}"
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        for arg in _tag_arguments(node)
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    ]
    assert not bad, "seed tags spelled as literals (use loaderkit._tags.SeedTag): " + str(bad)


def test_argument_checks_have_one_home() -> None:
    # The rule messages of the shared checks are written once, in _checks.py.
    phrases = ("must be an int, got", "must be a bool, got")
    bad = [
        f"{name}: {phrase!r}"
        for name, path in modules().items()
        if name != "loaderkit._checks"
        for phrase in phrases
        if phrase in path.read_text()
    ]
    assert not bad, "argument checks written outside loaderkit/_checks.py: " + ", ".join(bad)


def test_no_docstring_points_outside_the_repository() -> None:
    # The design notes live in docs/design.md; nothing may cite the copy outside the repo.
    tests = Path(__file__).resolve().parent
    paths = [*modules().values(), *tests.rglob("*.py")]
    outside = ("../" + "shared", "shared/" + "DESIGN")  # split: this file must not match itself
    bad = [str(p) for p in paths if any(o in p.read_text() for o in outside)]
    assert not bad


def test_no_support_module_shadows_the_standard_library() -> None:
    # Scripts in tests/support run with that folder first on sys.path: a module named
    # like a standard one (http.py) replaced it for torch's own imports in every DDP job.
    names = {p.stem for p in (PACKAGE.parent / "tests" / "support").glob("*.py")}
    assert not names & set(sys.stdlib_module_names), names & set(sys.stdlib_module_names)


# Stack-frame access: how a library finds what it was not handed (docs/design.md, "Simple
# and safe"); loaderkit is handed its host instead (loaderkit/_callers.py).
FRAME_NAMES = {"sys": {"_getframe"}, "inspect": {"currentframe", "stack", "getouterframes"}}
FRAME_ATTRIBUTES = {"f_back", "f_locals", "f_globals"}


def _uses(tree: ast.Module, banned: dict[str, set[str]], attributes: set[str]) -> list[int]:
    """Lines that import a banned module (an empty set bans all of it) or one of its banned
    names, read a banned name off it, or read one of ``attributes`` off anything."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = {a.name.split(".")[0] for a in node.names}
            if any(r in banned and not banned[r] for r in roots):
                lines.add(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module in banned:
            names = banned[node.module]
            if not names or any(a.name in names for a in node.names):
                lines.add(node.lineno)
        elif isinstance(node, ast.Attribute):
            base = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr in attributes or node.attr in banned.get(base or "", set()):
                lines.add(node.lineno)
    return sorted(lines)


def _offenders(banned: dict[str, set[str]], attributes: set[str]) -> list[str]:
    return [
        f"{name}:{line}"
        for name, path in modules().items()
        for line in _uses(ast.parse(path.read_text()), banned, attributes)
    ]


def test_no_module_reads_stack_frames() -> None:
    bad = _offenders(FRAME_NAMES, FRAME_ATTRIBUTES)
    assert not bad, "stack frames read (hand the object over instead): " + ", ".join(bad)


def test_the_frame_rule_finds_frame_access() -> None:
    code = "import sys, inspect\nf = sys._getframe(1)\ng = f.f_back\nh = inspect.currentframe()\n"
    assert _uses(ast.parse(code), FRAME_NAMES, FRAME_ATTRIBUTES) == [2, 3, 4]
    assert _uses(ast.parse("from inspect import stack\n"), FRAME_NAMES, FRAME_ATTRIBUTES) == [1]
    assert _uses(ast.parse("import inspect\ninspect.signature(len)\n"), FRAME_NAMES, set()) == []


def test_no_module_uses_ctypes() -> None:
    # Raw addresses into another library's objects break silently on its next release.
    bad = _offenders({"ctypes": set()}, {"ctypes"})
    assert not bad, "ctypes used (go through the library's own API): " + ", ".join(bad)


def _private_lightning_imports(tree: ast.AST) -> list[int]:
    """Lines importing a private name or module of Lightning (``_x``)."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").split(".")[0] in ("lightning", "pytorch_lightning")
        and (
            any(part.startswith("_") for part in (node.module or "").split("."))
            or any(alias.name.startswith("_") for alias in node.names)
        )
    ]


def test_lightning_internals_are_imported_by_the_adapter_only() -> None:
    bad = [
        f"{name}:{line}"
        for name, path in modules().items()
        if name != "loaderkit.lightning._adapter"
        for line in _private_lightning_imports(ast.parse(path.read_text()))
    ]
    assert not bad, "Lightning's private names imported outside lightning/_adapter.py: " + (
        ", ".join(bad)
    )
    code = "from lightning.pytorch.utilities.model_helpers import _restricted_classmethod\n"
    assert _private_lightning_imports(ast.parse(code)) == [1]
    assert _private_lightning_imports(ast.parse("from lightning.pytorch import Trainer\n")) == []
