"""The one registry of the string tags that separate loaderkit's seed families (private).

Every seed loaderkit draws is ``derive_seed(seed, TAG, ...)``: the tag keeps
the families apart (the epoch's order never shares a stream with a worker's
augmentation). Keeping them here makes a collision or a near-duplicate
visible in one screen, and a test refuses a string literal passed to
``derive_seed`` anywhere else.

The values are part of the checkpoint format: they fix every order a saved
position refers to, so an existing value must never change (a new family
gets a new tag).
"""

from __future__ import annotations

from typing import Final

__all__ = ["SeedTag", "StreamTag"]


class SeedTag:
    """The tags, by what they seed."""

    # The sample plan: the epoch's permutation (SamplePlan).
    ORDER: Final = "order"
    # The shard plan: the order shards are read in, and the shuffle window inside them.
    SHARDS: Final = "shards"
    WINDOW: Final = "window"
    # Length bucketing: the order of the sorted windows, and of the batches cut from them.
    BUCKET_ORDER: Final = "bucket-order"
    BUCKET_BATCHES: Final = "bucket-batches"
    # Weighted mixing (plan/mix.py): the epoch's interleave of the sources, and each
    # source's own permutation per source-epoch.
    MIX_ORDER: Final = "mix-order"
    MIX_SOURCE: Final = "mix-source"
    # A user's torch sampler (RandomSampler, ...): the generator loaderkit gives it per epoch.
    SAMPLER: Final = "sampler"
    # Streams: the shard order of one pass.
    STREAM_SHARDS: Final = "stream-shards"
    # Per-sample randomness: sample `index` of `epoch` (seeding.sample_seed).
    SAMPLE: Final = "sample"
    # One worker process's global RNGs (seeding.worker_seed): (rank, worker_id).
    WORKER: Final = "worker"
    # The family of one epoch's worker processes: the seed handed to worker_init_fn,
    # keyed by epoch so restarted workers do not replay the last epoch's streams.
    WORKERS: Final = "workers"
    # The generator torch draws its workers' base seed from (instead of the global RNG).
    BASE: Final = "base"
    # A DataModule's seeded train/val split.
    VAL_SPLIT: Final = "val_split"

    @classmethod
    def all(cls) -> dict[str, str]:
        """Every tag by its name."""
        return {k: v for k, v in vars(cls).items() if k.isupper()}


class StreamTag:
    """The integer tags of the per-sample generator streams (seeding.sample_stream_keys).

    A sample's 64-bit key is XORed with the tag of a generator, then mixed,
    so torch, numpy and :mod:`random` draw unrelated streams for one sample.
    Part of the checkpoint format like :class:`SeedTag`: a change changes
    every resumed run's augmentation.
    """

    TORCH: Final = 0x7430_7263_6800_0001
    NUMPY: Final = 0x6E75_6D70_7900_0002
    RANDOM: Final = 0x7261_6E64_6F6D_0003

    @classmethod
    def all(cls) -> dict[str, int]:
        """Every tag by its name."""
        return {k: v for k, v in vars(cls).items() if k.isupper()}
