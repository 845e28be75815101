"""The ``>>>`` examples the API reference shows run as written.

The API pages are generated from the docstrings of every name in
``loaderkit.__all__``; each module defining one of them is doctested here, in a
fresh working folder that also holds their ``tempfile`` folders (an example may
write files). The per-module test files do not run them again.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import os
from types import ModuleType

import pytest

import loaderkit

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _public_modules() -> dict[str, ModuleType]:
    modules = {}
    for name in loaderkit.__all__:
        module = inspect.getmodule(getattr(loaderkit, name))
        if module is not None and module.__name__.startswith("loaderkit"):
            modules[module.__name__] = module
    return modules


MODULES = _public_modules()
# Private modules whose examples are their contract.
PRIVATE = ("data._code", "lightning._adapter", "lightning.datamodules._args")
MODULES.update({f"loaderkit.{m}": importlib.import_module(f"loaderkit.{m}") for m in PRIVATE})
# Modules whose docstrings must show examples (a module-level example is their contract).
WITH_EXAMPLES = {
    "loaderkit.data.memory",
    "loaderkit.plan.bucket",
    "loaderkit.plan.sample",
    "loaderkit.plan.samplers",
}


def test_every_public_name_has_a_module() -> None:
    assert len(MODULES) >= 20, sorted(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.usefixtures("in_tmp")
def test_docstring_examples_run(name: str) -> None:
    saved = dict(os.environ)
    try:
        result = doctest.testmod(MODULES[name], optionflags=FLAGS, raise_on_error=False)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
    assert result.attempted > 0 or name not in WITH_EXAMPLES, f"{name} lost its examples"
