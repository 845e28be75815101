"""Datasets and the readers behind them.

In-memory datasets (:mod:`.memory`), planned sharded datasets
(:mod:`.sharded`), streams over shards or iterables (:mod:`.streaming`), shard
readers (:mod:`.readers`, :mod:`.jsonl`), the shard index and writer
(:mod:`.index`) and per-sample lengths for bucketing (:mod:`.lengths`).

Public names are exported from :mod:`loaderkit`; import them from there.
"""
