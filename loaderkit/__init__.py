"""loaderkit: the data layer for PyTorch Lightning training.

Padding collate, a resumable sample plan split across ranks, seeded
per-sample randomness, accelerator-aware transfer, and ready
LightningDataModules. Everything public is
imported here; modules starting with ``_`` are private.
"""

from loaderkit._bucketing import BucketPlan
from loaderkit.callbacks import ElasticResume
from loaderkit.collate import PadCollate, PaddedBatch
from loaderkit.datamodules import (
    ArrayDataModule,
    ImageFolderDataModule,
    LoaderDataModule,
    SequenceDataModule,
    ShardedDataModule,
    TensorDataModule,
)
from loaderkit.datasets import ArrayDataset, TensorDataset
from loaderkit.env import WorkerEnv, detect
from loaderkit.errors import (
    CollateError,
    LoaderkitError,
    MissingDependencyError,
    MissingShardError,
    ShardError,
    StateMismatchError,
    WorkerError,
)
from loaderkit.loader import ResumableDataLoader
from loaderkit.plan import Plan, SamplePlan, Schedule
from loaderkit.samplers import (
    BucketBatchSampler,
    PlanBatchSampler,
    check_resumable_sampler,
    compute_lengths,
)
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
from loaderkit.sharding import (
    IterableReader,
    JsonlReader,
    OpenShard,
    ShardedDataset,
    ShardPlan,
    ShardReader,
    StreamingShardedDataset,
    StreamReader,
    TokenReader,
    write_shards,
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

__version__ = "0.1.0"

__all__ = [
    "ArrayDataModule",
    "ArrayDataset",
    "BucketBatchSampler",
    "BucketPlan",
    "CollateError",
    "DevicePrefetcher",
    "ElasticResume",
    "ImageFolderDataModule",
    "IterableReader",
    "JsonlReader",
    "LoaderDataModule",
    "LoaderkitError",
    "MissingDependencyError",
    "MissingShardError",
    "OpenShard",
    "PadCollate",
    "PaddedBatch",
    "Plan",
    "PlanBatchSampler",
    "ResumableDataLoader",
    "SamplePlan",
    "Schedule",
    "SequenceDataModule",
    "ShardError",
    "ShardPlan",
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
    "check_resumable_sampler",
    "compute_lengths",
    "derive_seed",
    "detect",
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
