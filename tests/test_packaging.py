"""The sdist and wheel build, pass `twine check`, and the wheel runs the README's quick start.

The wheel goes into a fresh venv. Its dependencies (torch, Lightning, ...) are not
downloaded again: a `.pth` file puts this environment's site-packages on the new
venv's path, behind its own, so loaderkit itself is imported from the wheel (checked)
and nothing of this checkout is importable (no PYTHONPATH, another working folder).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import loaderkit

ROOT = Path(__file__).resolve().parent.parent


def _run(*command: str | Path, cwd: Path, timeout: float = 600) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(c) for c in command],
        cwd=cwd,
        env={**env, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build`` of a copy of the package sources: dist/ with an sdist and a wheel."""
    tmp = tmp_path_factory.mktemp("build")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "loaderkit", src / "loaderkit", ignore=skip)
    # --no-isolation: the build backend (setuptools) of this environment, not a download.
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp / "dist", src, cwd=tmp)
    return tmp / "dist"


def test_build_makes_an_sdist_and_a_wheel_that_twine_accepts(dist: Path) -> None:
    version = loaderkit.__version__
    names = sorted(p.name for p in dist.iterdir())
    assert names == [f"loaderkit-{version}-py3-none-any.whl", f"loaderkit-{version}.tar.gz"]
    out = _run(sys.executable, "-m", "twine", "check", "--strict", *dist.iterdir(), cwd=dist)
    assert out.count("PASSED") == 2, out
    with zipfile.ZipFile(next(dist.glob("*.whl"))) as wheel:  # Apache-2.0: its text ships
        assert any(name.endswith("licenses/LICENSE") for name in wheel.namelist())


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_runs_the_quick_start(
    dist: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                     cwd=tmp_path).strip())  # fmt: skip
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = dist.glob("*.whl")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
         wheel, cwd=tmp_path)  # fmt: skip

    work = tmp_path / "work"  # not the checkout: only the installed package is importable
    work.mkdir()
    where = _run(
        python,
        "-c",
        "import importlib.metadata as m, loaderkit; "
        "print(loaderkit.__file__, loaderkit.__version__, m.version('loaderkit'))",
        cwd=work,
    ).split()
    assert Path(where[0]).is_relative_to(site), where
    assert where[1:] == [loaderkit.__version__, loaderkit.__version__]
    assert "inspect" in _run(venv / "bin" / "loaderkit", "--help", cwd=work)  # the entry point

    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", readme, flags=re.DOTALL | re.MULTILINE)
    assert len(blocks) >= 2  # the DataModule quick start and the DataLoader swap
    for i, block in enumerate(blocks):
        (work / f"quick_start_{i}.py").write_text(block)
        _run(python, f"quick_start_{i}.py", cwd=work)
