"""The sample plan: which sample goes to which rank, worker and batch.

Everything here is a pure function of a few integers (seed, epoch, sizes,
topology, position), never of process-local history: the sample plan and its
one rank/worker dealing schedule (:mod:`.sample`), the plan over shards
(:mod:`.shard`), weighted mixing (:mod:`.mix`), length-bucketing and token
budgets (:mod:`.bucket`, over shards :mod:`.shard_bucket`), the samplers that
hand a plan to ``torch.utils.data`` (:mod:`.samplers`) and the cursor with its
versioned state format (:mod:`._cursor`).

Public names are exported from :mod:`loaderkit`; import them from there.
"""
