"""Every name in loaderkit.__all__ imports, and nothing public is left out of it."""

from __future__ import annotations

import importlib

import loaderkit


def test_every_name_in_all_imports() -> None:
    assert loaderkit.__all__ == sorted(loaderkit.__all__)
    for name in loaderkit.__all__:
        assert getattr(loaderkit, name) is not None, name


def test_all_lists_every_public_module_name() -> None:
    for module_name in (
        "callbacks",
        "collate",
        "datamodules",
        "datasets",
        "errors",
        "loader",
        "plan",
        "samplers",
        "seeding",
        "sharding",
        "transfer",
    ):
        module = importlib.import_module(f"loaderkit.{module_name}")
        for name in getattr(module, "__all__", []):
            assert name in loaderkit.__all__ or name in {"DeviceLike"}, (module_name, name)
