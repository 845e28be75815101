"""write_shards' resume key: every reader setting in it, the same in every process.

A resume skips a shard whose done marker holds the call's key: a reader setting the key
misses keeps shards written under another value (a corpus of both), a key that changes
with the process rewrites every shard of a resume.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loaderkit import JsonlReader, ShardedDataset, compute_lengths, write_shards
from loaderkit.data import _code

ROOT = Path(__file__).resolve().parents[2]
SCALE = 10


class ClassScaled(JsonlReader):
    """A setting held on the class."""

    scale = 10

    def write(self, path: Path, samples: Any) -> Path:
        return super().write(path, [v * self.scale for v in samples])


class HelperScaled(JsonlReader):
    """A setting read in a helper method (a module global)."""

    def _one(self, v: int) -> int:
        return v * SCALE

    def write(self, path: Path, samples: Any) -> Path:
        return super().write(path, [self._one(v) for v in samples])


class LockedScaled(JsonlReader):
    """A reader that does not pickle (it holds a lock): its settings cannot be digested."""

    def __init__(self, scale: int) -> None:
        self.scale, self.lock = scale, threading.Lock()

    def write(self, path: Path, samples: Any) -> Path:
        return super().write(path, [v * self.scale for v in samples])


class Keep(JsonlReader):
    """Keeps the fields in ``keys``: a frozenset, pickled in hash-seed order."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = frozenset(keys)

    def write(self, path: Path, samples: Any) -> Path:
        return super().write(path, [{k: s[k] for k in sorted(self.keys)} for s in samples])


def killed_after_two(items: list[Any]) -> Any:
    yield from items[:2]
    raise RuntimeError("killed")


def values(folder: Path) -> list[Any]:
    ds = ShardedDataset(folder, JsonlReader())
    return [ds[i] for i in range(len(ds))]


ITEMS = [[1, 2], [3, 4], [5, 6]]


def resumed(out: Path, first: dict[str, Any], then: Callable[[], dict[str, Any]]) -> list[Any]:
    """The values in ``out`` after a write of ``ITEMS`` stopped after two shards (``first``:
    its ``write_shards`` arguments), then resumed with ``then()``'s."""
    with pytest.raises(RuntimeError, match="killed"):
        write_shards(out, killed_after_two(ITEMS), progress=False, **first)
    write_shards(out, ITEMS, progress=False, **then())
    return values(out)


@pytest.mark.parametrize("where", ["class attribute", "helper method"])
def test_a_resume_with_another_class_level_setting_rewrites_every_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # Was [10, 20, 30, 40, 5000, 6000]: the shards of scale 10 were kept.
    reader = ClassScaled() if where == "class attribute" else HelperScaled()

    def edited() -> dict[str, Any]:
        monkeypatch.setattr(ClassScaled, "scale", 1000)
        monkeypatch.setitem(globals(), "SCALE", 1000)
        return {"reader": reader}

    got = resumed(tmp_path, {"reader": reader}, edited)
    assert got == [1000, 2000, 3000, 4000, 5000, 6000]


def test_a_reader_that_does_not_pickle_is_written_whole_on_resume(tmp_path: Path) -> None:
    # Was [10, 20, 30, 40, 5000, 6000]: no digest of its state, so no change seen.
    got = resumed(tmp_path, {"reader": LockedScaled(10)}, lambda: {"reader": LockedScaled(1000)})
    assert got == [1000, 2000, 3000, 4000, 5000, 6000]


# A reader module of each kind, edited between the two calls: SCALE is 10, then 1000.
EDITED = {
    # Installed (a package's): class_digest leaves its class out, so write's code counts.
    "installed write": """
        class Reader(JsonlReader):
            def write(self, path, samples):
                return super().write(path, [v * SCALE for v in samples])
    """,
    "cached method": """
        class Reader(JsonlReader):
            @functools.cache
            def scale(self):
                return SCALE

            def write(self, path, samples):
                return super().write(path, [v * self.scale() for v in samples])
    """,
    "nested class": """
        class Reader(JsonlReader):
            class Opts:
                scale = SCALE

            def write(self, path, samples):
                return super().write(path, [v * self.Opts.scale for v in samples])
    """,
    "global object": """
        @dataclasses.dataclass
        class Config:
            scale: int

        CONFIG = Config(SCALE)

        class Reader(JsonlReader):
            def write(self, path, samples):
                return super().write(path, [v * CONFIG.scale for v in samples])
    """,
    "global that does not pickle": """
        class Config:
            def __init__(self, scale):
                self.scale, self.lock = scale, threading.Lock()

        CONFIG = Config(SCALE)

        class Reader(JsonlReader):
            def write(self, path, samples):
                return super().write(path, [v * CONFIG.scale for v in samples])
    """,
    # A decorator object holding the setting: update_wrapper sets its __wrapped__.
    "decorator object": """
        class scaled:
            def __init__(self, k):
                self.k = k

            def __call__(self, fn):
                self.fn = fn
                functools.update_wrapper(self, fn)
                return self

            def __get__(self, obj, cls):
                return functools.partial(self.run, obj)

            def run(self, reader, path, samples):
                return self.fn(reader, path, [v * self.k for v in samples])

        class Reader(JsonlReader):
            @scaled(SCALE)
            def write(self, path, samples):
                return super().write(path, samples)
    """,
}
HEADER = "import dataclasses, functools, threading\nfrom loaderkit import JsonlReader\n"


@pytest.mark.parametrize("case", list(EDITED))
def test_a_resume_after_an_edit_of_the_reader_module_rewrites_every_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    # Was [10, 20, 30, 40, 5000, 6000]: the edit was unseen, the shards of 10 were kept
    # (a decorator object's setting since 8ad6ac3: its inner function only was digested).
    edit = edited_module(tmp_path, monkeypatch, case, EDITED[case])
    got = resumed(
        tmp_path / "out", {"reader": edit(10).Reader()}, lambda: {"reader": edit(1000).Reader()}
    )
    assert got == [1000, 2000, 3000, 4000, 5000, 6000]


def edited_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, body: str
) -> Callable[[int], Any]:
    """``edit(scale)`` writes the module ``body`` with SCALE as ``scale`` and (re)loads it."""
    home = tmp_path / ("site-packages" if case == "installed write" else "src")
    home.mkdir(exist_ok=True)
    if case == "installed write":
        monkeypatch.setattr(_code, "_INSTALLED", (*_code._INSTALLED, str(home)))
    monkeypatch.syspath_prepend(str(home))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    name = "edited_" + case.replace(" ", "_")
    source = HEADER + textwrap.dedent(body)

    def edit(scale: int) -> Any:
        (home / f"{name}.py").write_text(source.replace("SCALE", str(scale)))
        if name in sys.modules:
            return importlib.reload(sys.modules[name])
        module = importlib.import_module(name)
        monkeypatch.setitem(sys.modules, name, module)  # removed again after the test
        return module

    return edit


# An fn module edited between two calls: a helper it reaches through an object changes.
EDITED_FN = {
    # A callable object whose __call__ calls self.helper(): __call__ alone was digested.
    "callable object": """
        class Make:
            def __call__(self, item):
                return [self.helper(v) for v in item]

            def helper(self, v):
                return v * SCALE

        FN = Make()
    """,
    # A global instance of a user class: pickle names the class, not its code.
    "global instance": """
        class Tok:
            def encode(self, v):
                return v * SCALE

        TOK = Tok()

        def FN(item):
            return [TOK.encode(v) for v in item]
    """,
    # Steps in a list, and a partial: pickle names their functions, not their code.
    "a list of steps": """
        def scale(v):
            return v * SCALE

        PIPELINE = [scale]

        def FN(item):
            return [PIPELINE[0](v) for v in item]
    """,
    "a list of instances": """
        class Scale:
            def __call__(self, v):
                return v * SCALE

        STEPS = [Scale()]

        def FN(item):
            return [STEPS[0](v) for v in item]
    """,
    "a class's list of steps": """
        def scale(v):
            return v * SCALE

        class Make:
            steps = [scale]

            def __call__(self, item):
                return [self.steps[0](v) for v in item]

        FN = Make()
    """,
    "a partial": """
        def scale(v, by):
            return v * by * SCALE

        STEP = functools.partial(scale, by=1)

        def FN(item):
            return [STEP(v) for v in item]
    """,
}


@pytest.mark.parametrize("case", list(EDITED_FN))
def test_a_resume_after_an_edit_of_a_method_fn_reaches_rewrites_every_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    # Was [10, 20, 30, 40, 5000, 6000]: the helper method's edit was unseen; and
    # compute_lengths' cache kept the old lengths.
    edit = edited_module(tmp_path, monkeypatch, case, EDITED_FN[case])

    def written(scale: int) -> dict[str, Any]:
        return {"reader": JsonlReader(), "fn": edit(scale).FN}

    got = resumed(tmp_path / "out", written(10), lambda: written(1000))
    assert got == [1000, 2000, 3000, 4000, 5000, 6000]


@pytest.mark.parametrize("case", list(EDITED_FN))
def test_compute_lengths_after_an_edit_of_a_method_fn_reaches_recomputes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    # Was [10, 30, 50] again: the cache was keyed without the helper method's code.
    edit = edited_module(tmp_path, monkeypatch, case, EDITED_FN[case])
    module = edit(10)
    items = [[1, 2], [3, 4], [5, 6]]

    def first(item: list[int]) -> int:
        return int(module.FN(item)[0])

    cache = tmp_path / "lengths.npy"
    assert compute_lengths(items, first, cache=cache, progress=False).tolist() == [10, 30, 50]
    module = edit(1000)
    with pytest.warns(UserWarning, match="recomputing"):
        again = compute_lengths(items, first, cache=cache, progress=False)
    assert again.tolist() == [1000, 3000, 5000]


def test_a_resume_after_an_edit_of_a_module_fn_imports_in_its_body_rewrites_every_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Was [10, 20, 30, 40, 5000, 6000] (hunter 181): `from cfg import K` inside fn binds a
    # local, so the edit of cfg.py was unseen; read as a file, imported here or not.
    home = tmp_path / "src"
    home.mkdir()
    monkeypatch.syspath_prepend(str(home))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    (home / "body_import_fn.py").write_text(
        "def FN(item):\n    from body_import_cfg import K\n    return [v * K for v in item]\n"
    )
    module = importlib.import_module("body_import_fn")
    monkeypatch.setitem(sys.modules, "body_import_fn", module)

    def written(scale: int) -> dict[str, Any]:
        (home / "body_import_cfg.py").write_text(f"K = {scale}\n")
        sys.modules.pop("body_import_cfg", None)  # as a new process imports the edited file
        return {"reader": JsonlReader(), "fn": module.FN}

    got = resumed(tmp_path / "out", written(10), lambda: written(1000))
    sys.modules.pop("body_import_cfg", None)
    assert got == [1000, 2000, 3000, 4000, 5000, 6000]


class Make:
    """A callable fn whose state does not pickle (it holds a lambda)."""

    def __init__(self, scale: int) -> None:
        self.scale, self.hook = scale, lambda: None

    def __call__(self, item: list[int]) -> list[int]:
        return [v * self.scale for v in item]


def test_an_fn_whose_state_does_not_pickle_is_written_whole_on_resume(tmp_path: Path) -> None:
    # Was [10, 20, 30, 40, 5000, 6000]: no digest of fn's state, so no change seen.
    def written(scale: int) -> dict[str, Any]:
        return {"reader": JsonlReader(), "fn": Make(scale)}

    got = resumed(tmp_path, written(10), lambda: written(1000))
    assert got == [1000, 2000, 3000, 4000, 5000, 6000]


# Run twice, under two hash seeds: "first" stops after two shards, "second" uses each
# reader on a scratch folder, then resumes and prints the readers whose shard 0 was kept.
SCRIPT = """
import json, sys, importlib.util
from pathlib import Path
import numpy as np
from loaderkit import JsonlReader, ParquetReader, ShardedDataset, TokenReader, write_shards
from tests.data.test_write_resume_key import Keep, killed_after_two

root, phase = Path(sys.argv[1]), sys.argv[2]
rows = [[{"a": i, "b": float(i), "c": "x"}] for i in range(3)]
cases = {
    "token": (TokenReader(seq_len=4, dtype="uint16"), [np.arange(8, dtype=np.uint16)] * 3),
    "jsonl": (JsonlReader(), [[1, 2], [3, 4], [5, 6]]),
    "frozenset": (Keep(["text", "id", "lang", "url"]), [[dict.fromkeys(
        ["text", "id", "lang", "url"], i)] for i in range(3)]),
}
if importlib.util.find_spec("pyarrow"):
    cases["parquet"] = (ParquetReader(), rows)
    cases["parquet columns"] = (ParquetReader(columns=["a", "b"]), rows)
kept = []
for name, (reader, items) in cases.items():
    folder = root / name
    if phase == "first":
        try:
            write_shards(folder, killed_after_two(items), reader, progress=False)
        except RuntimeError:
            pass
        continue
    ShardedDataset(write_shards(root / "used" / name, items, reader, progress=False), reader)[0]
    before = (folder / json.loads(sys.argv[3])[name]).stat().st_mtime_ns
    paths = write_shards(folder, items, reader, progress=False)
    kept += [name] if Path(paths[0]).stat().st_mtime_ns == before else []
print(json.dumps(kept))
"""


def test_a_resume_in_another_process_skips_the_done_shards(tmp_path: Path) -> None:
    # Was: a reader holding a frozenset had another key under another PYTHONHASHSEED,
    # so every resume in a new process rewrote every shard.
    def run(seed: int, *args: str) -> str:
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        command = [sys.executable, "-c", SCRIPT, str(tmp_path), *args]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    run(1, "first")
    first = {
        p.parent.name: p.name
        for p in tmp_path.glob("*/shard-00000.*")
        if not p.name.endswith((".lkoffsets", ".lkdtype"))
    }
    names = ["token", "jsonl", "frozenset"]
    names += ["parquet", "parquet columns"] if importlib.util.find_spec("pyarrow") else []
    assert sorted(first) == sorted(names)
    assert json.loads(run(2, "second", json.dumps(first))) == names


_TABLE = np.arange(10)


def _reads_table(x: int) -> Any:
    return _TABLE[x]


def test_a_compiled_class_counted_as_the_users_still_gives_a_stable_digest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # numpy installed with pip --target (outside site-packages) counts as user code: its C
    # methods did not pickle, so the digest was random each call (a cache never hit).
    from loaderkit.data import _code

    monkeypatch.setattr(_code, "_user_class", lambda cls: cls is not object)
    assert _code.code_digest(_reads_table) == _code.code_digest(_reads_table)


@pytest.mark.parametrize(
    "body",
    [
        "from .cfg import K",
        "from . import cfg\n    K = cfg.K",
        "from {pkg} import cfg\n    K = cfg.K",
    ],
)
def test_an_edit_of_a_module_imported_relatively_in_fn_changes_its_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str
) -> None:
    # Only `import pkg.cfg` was seen; a relative or `from pkg import sub` import was not
    # (review 186).
    name = "relpkg_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name)
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    code = body.format(pkg=name)
    (pkg / "steps.py").write_text(f"def FN(item):\n    {code}\n    return [v * K for v in item]\n")
    (pkg / "cfg.py").write_text("K = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    try:
        steps = importlib.import_module(f"{name}.steps")

        def digest(k: int) -> str | None:
            (pkg / "cfg.py").write_text(f"K = {k}\n")
            return _code.code_digest(steps.FN)

        assert digest(10) != digest(1000)
    finally:
        for module in [m for m in sys.modules if m.startswith(name)]:
            del sys.modules[module]


def test_steps_of_a_dict_in_another_order_are_another_digest() -> None:
    # Sorting a dict's items by key made {"add", "dbl"} and {"dbl", "add"} one digest (review 186).
    def add(v: int) -> int:
        return v + 1

    def dbl(v: int) -> int:
        return v * 2

    def made(steps: dict[str, Callable[[int], int]]) -> Callable[[int], int]:
        def fn(x: int) -> int:
            for step in steps.values():
                x = step(x)
            return x

        return fn

    assert _code.code_digest(made({"add": add, "dbl": dbl})) != _code.code_digest(
        made({"dbl": dbl, "add": add})
    )
