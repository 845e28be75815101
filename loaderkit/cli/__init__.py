"""The ``loaderkit`` command line: ``demo``, ``inspect`` and ``bench``."""

from loaderkit.cli.commands import main

__all__ = ["main"]
