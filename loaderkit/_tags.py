"""The one registry of the tags that separate loaderkit's seed families (private).

The values are part of the checkpoint format: never change one, add a new tag.
"""

from __future__ import annotations

from typing import Any, Final


class _Tags:
    @classmethod
    def all(cls) -> dict[str, Any]:
        """Every tag by its name."""
        return {k: v for k, v in vars(cls).items() if k.isupper()}


class SeedTag(_Tags):
    ORDER: Final = "order"  # SamplePlan's permutation of an epoch
    SHARDS: Final = "shards"  # ShardPlan: the shard order
    WINDOW: Final = "window"  # ShardPlan: the shuffle windows inside shards
    BUCKET_ORDER: Final = "bucket-order"  # bucketing: the order before windows are sorted
    BUCKET_BATCHES: Final = "bucket-batches"  # bucketing: the batch order
    MIX_ORDER: Final = "mix-order"  # mixing: the epoch's interleave of the sources
    MIX_SOURCE: Final = "mix-source"  # mixing: each source's permutation per source-epoch
    SAMPLER: Final = "sampler"  # the generator given to a user's torch sampler per epoch
    STREAM_SHARDS: Final = "stream-shards"  # streams: the shard order of one pass
    SAMPLE: Final = "sample"  # per-sample randomness (seeding.sample_seed)
    WORKER: Final = "worker"  # one worker process's global RNGs (seeding.worker_seed)
    WORKERS: Final = "workers"  # an epoch's worker_init_fn seed (restarts never replay)
    BASE: Final = "base"  # the generator torch draws its workers' base seed from
    VAL_SPLIT: Final = "val_split"  # a DataModule's seeded train/val split


class StreamTag(_Tags):
    """The integer tags XORed into a sample's key per generator (seeding.sample_stream_keys)."""

    TORCH: Final = 0x7430_7263_6800_0001
    NUMPY: Final = 0x6E75_6D70_7900_0002
    RANDOM: Final = 0x7261_6E64_6F6D_0003
