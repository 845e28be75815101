"""Everything of loaderkit that needs Lightning: callbacks, ``attach_host`` and DataModules.

The only package of loaderkit that imports ``lightning``; its internals are read
in :mod:`loaderkit.lightning._adapter` alone. :mod:`loaderkit` re-exports these
names lazily, on first access, so ``import loaderkit`` stays free of Lightning.
"""

from loaderkit.lightning import datamodules
from loaderkit.lightning.callbacks import AttachLoaders, ElasticResume, attach_host
from loaderkit.lightning.datamodules import *  # noqa: F403  (the names in its __all__)
from loaderkit.lightning.telemetry import DataWaitMonitor

__all__ = ["AttachLoaders", "DataWaitMonitor", "ElasticResume", "attach_host", *datamodules.__all__]
