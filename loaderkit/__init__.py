"""loaderkit: the data layer for PyTorch Lightning training.

The names that need Lightning load on first access: ``import loaderkit`` imports no Lightning.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from loaderkit.collate import PadCollate, PaddedBatch
from loaderkit.data.hf import HFDataset
from loaderkit.data.jsonl import JsonlReader
from loaderkit.data.lengths import compute_lengths
from loaderkit.data.memory import ArrayDataset, TensorDataset
from loaderkit.data.mixing import MixedDataset
from loaderkit.data.parquet import ParquetReader
from loaderkit.data.readers import OpenShard, ShardReader, TokenReader
from loaderkit.data.remote import RemoteCache
from loaderkit.data.sharded import ShardedDataset
from loaderkit.data.streaming import IterableReader, StreamingShardedDataset, StreamReader
from loaderkit.data.writer import write_shards
from loaderkit.env import WorkerEnv, detect
from loaderkit.errors import (
    CollateError,
    LoaderkitError,
    MissingDependencyError,
    MissingShardError,
    ReaderSettingError,
    ShardChangedError,
    ShardError,
    ShardReadError,
    StateMismatchError,
    WorkerError,
    WorkerStartError,
)
from loaderkit.loader.resumable import ResumableDataLoader
from loaderkit.plan.bucket import BucketOptions, BucketPlan
from loaderkit.plan.mix import MixBucketPlan, MixPlan, mix_allotments
from loaderkit.plan.sample import Plan, PositionMap, SamplePlan, Schedule
from loaderkit.plan.samplers import BucketBatchSampler, PlanBatchSampler, check_resumable_sampler
from loaderkit.plan.shard import BatchMix, ShardPlan, batch_mix
from loaderkit.plan.shard_bucket import ShardBucketPlan
from loaderkit.seeding import (
    derive_seed,
    sample_generator,
    sample_numpy_rng,
    sample_seed,
    seed_global_rngs,
    seeded_sample,
    worker_init_fn,
    worker_seed,
)
from loaderkit.transfer import (
    DevicePrefetcher,
    move_to_device,
    non_blocking_for,
    pin_batch,
    resolve_pin_memory,
    select_device,
    should_pin_memory,
)
from loaderkit.types import Stateful

if TYPE_CHECKING:  # the type checker sees them; at run time __getattr__ loads them
    from loaderkit.lightning import (
        ArrayDataModule,
        AttachLoaders,
        DataWaitMonitor,
        ElasticResume,
        ImageFolderDataModule,
        LoaderDataModule,
        MixedDataModule,
        SequenceDataModule,
        ShardedDataModule,
        TensorDataModule,
        attach_host,
    )

if not TYPE_CHECKING:  # for the type checker the names are the imports above; typos stay errors

    def __getattr__(name: str) -> Any:  # PEP 562
        if name in _LIGHTNING_NAMES:
            import loaderkit.lightning

            value = getattr(loaderkit.lightning, name)
            globals()[name] = value
            return value
        raise AttributeError(f"module 'loaderkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LIGHTNING_NAMES)


# LightningCLI finds classes by short name only among those already imported.
if "lightning.pytorch" in sys.modules:
    import loaderkit.lightning  # noqa: F401

# The one version source: pyproject.toml reads it (setuptools dynamic version).
__version__ = "0.2.0"

__all__ = [
    "ArrayDataModule",
    "ArrayDataset",
    "AttachLoaders",
    "BatchMix",
    "BucketBatchSampler",
    "BucketOptions",
    "BucketPlan",
    "CollateError",
    "DataWaitMonitor",
    "DevicePrefetcher",
    "ElasticResume",
    "HFDataset",
    "ImageFolderDataModule",
    "IterableReader",
    "JsonlReader",
    "LoaderDataModule",
    "LoaderkitError",
    "MissingDependencyError",
    "MissingShardError",
    "MixBucketPlan",
    "MixPlan",
    "MixedDataModule",
    "MixedDataset",
    "OpenShard",
    "PadCollate",
    "PaddedBatch",
    "ParquetReader",
    "Plan",
    "PlanBatchSampler",
    "PositionMap",
    "ReaderSettingError",
    "RemoteCache",
    "ResumableDataLoader",
    "SamplePlan",
    "Schedule",
    "SequenceDataModule",
    "ShardBucketPlan",
    "ShardChangedError",
    "ShardError",
    "ShardPlan",
    "ShardReadError",
    "ShardReader",
    "ShardedDataModule",
    "ShardedDataset",
    "StateMismatchError",
    "Stateful",
    "StreamReader",
    "StreamingShardedDataset",
    "TensorDataModule",
    "TensorDataset",
    "TokenReader",
    "WorkerEnv",
    "WorkerError",
    "WorkerStartError",
    "attach_host",
    "batch_mix",
    "check_resumable_sampler",
    "compute_lengths",
    "derive_seed",
    "detect",
    "mix_allotments",
    "move_to_device",
    "non_blocking_for",
    "pin_batch",
    "resolve_pin_memory",
    "sample_generator",
    "sample_numpy_rng",
    "sample_seed",
    "seed_global_rngs",
    "seeded_sample",
    "select_device",
    "should_pin_memory",
    "worker_init_fn",
    "worker_seed",
    "write_shards",
]
_LIGHTNING_NAMES = frozenset(__all__) - globals().keys()  # the names imported lazily
