"""Import mosaic streaming without transformers (bench-only workaround).

mosaicml-streaming imports transformers at package import for its
StreamingDataLoader and text helpers; MDSWriter never uses it. When
transformers is absent, any ``transformers.*`` import gets an empty stub
package whose attributes are placeholder classes. Used only by
benchmarks/writers/bench.py, never by loaderkit.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any


class _Stub(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (dict,), {})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == "transformers" or fullname.startswith("transformers."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def stub_transformers() -> bool:
    """Install the stub if transformers is not importable; whether it was installed."""
    if importlib.util.find_spec("transformers") is not None:
        return False
    sys.meta_path.append(_Finder())
    return True
