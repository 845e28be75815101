"""Every name in loaderkit.__all__ imports, and nothing public is left out of it."""

from __future__ import annotations

import importlib
import pkgutil

import loaderkit

# Public modules whose __all__ are helpers of their own layer, not the library's API.
NOT_API = {
    "loaderkit.cli",
    "loaderkit.cli.commands",
    "loaderkit.cli.bench",
    "loaderkit.cli.inspect",
    "loaderkit.lightning.demo",  # the `loaderkit demo` job (examples reuse its model)
}
# Type aliases and constants that document an argument, not entry points.
NOT_API_NAMES = {"Batch", "DeviceLike", "IMAGENET_MEAN", "IMAGENET_STD"}


def public_modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(loaderkit.__path__, "loaderkit."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        names.append(info.name)
    return names


def test_every_name_in_all_imports() -> None:
    assert loaderkit.__all__ == sorted(loaderkit.__all__)
    for name in loaderkit.__all__:
        assert getattr(loaderkit, name) is not None, name


def test_all_lists_every_public_module_name() -> None:
    modules = public_modules()
    # The walk must find the packages' public modules, or this test checks nothing.
    assert {"loaderkit.plan.sample", "loaderkit.data.sharded", "loaderkit.loader.resumable"} <= set(
        modules
    )
    missing = []
    for module_name in modules:
        if module_name in NOT_API:
            continue
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            if name not in loaderkit.__all__ and name not in NOT_API_NAMES:
                missing.append(f"{module_name}.{name}")
    assert not missing, "public names missing from loaderkit.__all__: " + ", ".join(missing)


def test_dir_lists_the_lazy_names() -> None:
    assert set(loaderkit.__all__) <= set(dir(loaderkit))


def test_unknown_attribute_is_an_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        loaderkit.NoSuchThing  # noqa: B018
