"""Everything of loaderkit that needs Lightning: callbacks, ``attach_host`` and DataModules
(:mod:`loaderkit` re-exports them lazily, so ``import loaderkit`` stays free of Lightning)."""

from loaderkit.lightning import datamodules
from loaderkit.lightning.callbacks import AttachLoaders, ElasticResume, attach_host
from loaderkit.lightning.datamodules import *  # noqa: F403  (the names in its __all__)
from loaderkit.lightning.telemetry import DataWaitMonitor

__all__ = ["AttachLoaders", "DataWaitMonitor", "ElasticResume", "attach_host", *datamodules.__all__]
