"""The ``loaderkit`` command line: ``demo``, ``inspect`` and ``bench``.

Lightning is imported only by the subcommands that run a Lightning job, and
only through :mod:`loaderkit.lightning`.
"""

from loaderkit.cli.commands import main

__all__ = ["main"]
