"""Sample plans at scale: the first batch after a resume at 90 % of an epoch, and its memory.

For each dataset size (``--samples``, default 10^7, 10^9, 10^10), batch
``--batch-size`` (256) on rank 3 of ``--world-size`` (8), ``shuffle=True``:

- keyed (today's ``SamplePlan``): a fresh plan (no state carried over: what a
  resumed process has) builds the schedule at the 90 % position and takes its
  first batch; the order is a keyed permutation evaluated only at the positions
  dealt (``loaderkit/plan/_permutation.py``).
- randperm (loaderkit before state version 4, inlined here): the epoch's
  whole order, ``torch.randperm(n)`` seeded per epoch, then the batch sliced
  out of it. Run only up to ``--old-max`` samples (default 10^7): at 10^9 the
  order alone is 8 GiB, at 10^10 75 GiB, more than this machine has.

- shards (today's ``ShardPlan``, ``--shards`` equal shards, default 10^5,
  default window and ``mix_shards``): shard order, lanes and windows from
  O(shards) arrays, each window shuffled by its own keyed permutation,
  evaluated only at the positions dealt.
- shards-randperm (``ShardPlan`` before state version 5, inlined here): the
  whole epoch's order, a ``torch.randperm`` per window, then the lanes
  interleaved; up to ``--old-max`` samples.

Each measurement runs in a fresh child process (so nothing is cached, and its
memory is its own): the time from building the plan to holding the first
batch (median of ``--repeats`` children), and the peak resident memory the
step added over the child's resident memory after its imports (``VmHWM`` of
``/proc/self/status``, so torch's own allocations count too).

Also the steady state: the per-batch cost of dealing ``--steady-batches``
consecutive batches from the start of a 10^7 epoch (keyed: positions mapped a
chunk at a time; randperm: slices of the materialized order, after paying for
it; shards: ShardPlan's schedule), and the cost of the whole epoch's order each way.

Goal (issue 12): the first batch after a resume at 90 % of a 10^10-sample
epoch in < 1 s, with memory per rank O(1) in the dataset size.

Run: ``python benchmarks/plans/bench.py`` (about 30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from loaderkit.cli.bench import Ratio, report

CHILD = r"""
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
from loaderkit import SamplePlan, ShardPlan
from loaderkit._tags import SeedTag
from loaderkit.plan.shard import DEFAULT_MIX, DEFAULT_WINDOW
from loaderkit.seeding import derive_seed

def hwm_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

def old_shard_order(sizes, seed, epoch, window, k):
    # ShardPlan.order before state version 5 (loaderkit/plan/shard.py at 77325a9), inlined:
    # torch.randperm of the shards, then of every window, then the lanes interleaved.
    n = sum(sizes)
    g = torch.Generator().manual_seed(derive_seed(seed, SeedTag.SHARDS, epoch))
    shards = torch.randperm(len(sizes), generator=g).numpy()
    sizes = np.asarray(sizes, dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    laid = sizes[shards]
    seq = np.repeat(starts[shards] - (np.cumsum(laid) - laid), laid) + np.arange(n)
    b, x = divmod(n, k)
    lanes = np.arange(k + 1, dtype=np.int64) * b + np.minimum(np.arange(k + 1), x)
    cuts = np.union1d(np.cumsum(laid), lanes)
    pieces = np.diff(cuts[cuts > 0], prepend=0)
    gen = torch.Generator().manual_seed(derive_seed(seed, SeedTag.WINDOW, epoch))
    pos = 0
    for size in pieces.tolist():
        for lo in range(pos, pos + size, window):
            hi = min(lo + window, pos + size)
            seq[lo:hi] = seq[lo:hi][torch.randperm(hi - lo, generator=gen).numpy()]
        pos += size
    p = np.arange(n, dtype=np.int64)
    lane, offset = p % k, p // k
    tail = p >= b * k
    lane[tail] = p[tail] - b * k
    offset[tail] = b
    return torch.from_numpy(seq[lanes[lane] + offset])

kind, n, batch, ws, rank = sys.argv[1], *map(int, sys.argv[2:6])
seed, epoch = 0, 1
start = n * 9 // 10
base = hwm_kib()
t0 = time.perf_counter()
if kind == "keyed":
    plan = SamplePlan(num_samples=n, batch_size=batch, shuffle=True, seed=seed)
    first = plan.schedule(epoch, start=start, rank=rank, world_size=ws).indices(0)
elif kind == "shards":
    num_shards = int(sys.argv[6])
    per, extra = divmod(n, num_shards)
    sizes = tuple(per + (s < extra) for s in range(num_shards))
    plan = ShardPlan(shard_sizes=sizes, batch_size=batch, seed=seed)
    first = plan.schedule(epoch, start=start, rank=rank, world_size=ws).indices(0)
elif kind == "shards-randperm":
    num_shards = int(sys.argv[6])
    per, extra = divmod(n, num_shards)
    sizes = tuple(per + (s < extra) for s in range(num_shards))
    order = old_shard_order(sizes, seed, epoch, DEFAULT_WINDOW, DEFAULT_MIX)
    lo = start + rank * batch
    first = order[lo : lo + batch]
else:
    gen = torch.Generator().manual_seed(derive_seed(seed, SeedTag.ORDER, epoch))
    order = torch.randperm(n, generator=gen)
    lo = start + rank * batch
    first = order[lo : lo + batch]
seconds = time.perf_counter() - t0
assert first.numel() == batch and int(first.min()) >= 0 and int(first.max()) < n
print(json.dumps({"seconds": seconds, "peak_mib": (hwm_kib() - base) / 1024}))
"""

STEADY = r"""
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
from loaderkit import SamplePlan, ShardPlan
from loaderkit._tags import SeedTag
from loaderkit.seeding import derive_seed

n, batch, ws, steps, num_shards = map(int, sys.argv[1:6])
plan = SamplePlan(num_samples=n, batch_size=batch, shuffle=True, seed=0)
out = {}
t0 = time.perf_counter()
sched = plan.schedule(1, start=0, rank=0, world_size=ws)
steps = min(steps, sched.num_steps - 1)  # whole batches only
out["steps"] = steps
for s in range(steps):
    sched.indices(s)
out["keyed_us_per_batch"] = (time.perf_counter() - t0) / steps * 1e6
t0 = time.perf_counter()
for lo in range(0, n, 1 << 16):
    plan.order_at(1, np.arange(lo, min(lo + (1 << 16), n)))
out["keyed_epoch_s"] = time.perf_counter() - t0
t0 = time.perf_counter()
gen = torch.Generator().manual_seed(derive_seed(0, SeedTag.ORDER, 1))
order = torch.randperm(n, generator=gen)
out["randperm_epoch_s"] = time.perf_counter() - t0
np_order = order.numpy()
t0 = time.perf_counter()
for s in range(steps):
    lo = s * ws * batch
    torch.from_numpy(np_order[lo : lo + batch])
out["randperm_us_per_batch"] = (time.perf_counter() - t0) / steps * 1e6
per, extra = divmod(n, num_shards)
shards = ShardPlan(shard_sizes=tuple(per + (s < extra) for s in range(num_shards)),
                   batch_size=batch, seed=0)
t0 = time.perf_counter()
sched = shards.schedule(1, start=0, rank=0, world_size=ws)
for s in range(steps):
    sched.indices(s)
out["shards_us_per_batch"] = (time.perf_counter() - t0) / steps * 1e6
print(json.dumps(out))
"""


def child(code: str, *args: object) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[10**7, 10**9, 10**10])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--rank", type=int, default=3)
    parser.add_argument("--old-max", type=int, default=10**7)
    parser.add_argument("--shards", type=int, default=10**5, help="ShardPlan rows: equal shards")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steady-batches", type=int, default=5000)
    args = parser.parse_args()
    b, ws, rank = args.batch_size, args.world_size, args.rank
    print(
        f"first batch after a resume at 90 % of epoch 1: batch {b}, rank {rank} of {ws}, "
        f"shuffle=True; a fresh process per figure, median of {args.repeats}\n"
    )
    print("| samples | order | first batch (s) | peak memory added (MiB) |")
    print("|---:|---|---:|---:|")
    keyed_at: dict[int, float] = {}
    shards_at: dict[int, float] = {}
    kinds = ("keyed", "randperm", "shards", "shards-randperm")
    for n in args.samples:
        for kind in kinds:
            if kind.endswith("randperm") and n > args.old_max:
                print(f"| {n:.0e} | {kind} | not run | order alone {8 * n / 2**30:.1f} GiB |")
                continue
            extra = (args.shards,) if kind.startswith("shards") else ()
            runs = [child(CHILD, kind, n, b, ws, rank, *extra) for _ in range(args.repeats)]
            sec = statistics.median(r["seconds"] for r in runs)
            peak = max(r["peak_mib"] for r in runs)
            if kind == "keyed":
                keyed_at[n] = sec
            if kind == "shards":
                shards_at[n] = sec
            print(f"| {n:.0e} | {kind} | {sec:.4f} | {peak:.1f} |")
    steady_n = min(10**7, max(args.samples))
    s = child(STEADY, steady_n, b, ws, args.steady_batches, args.shards)
    print(
        f"\nsteady state, {steady_n:.0e} samples, batch {b}, {ws} ranks, "
        f"{int(s['steps'])} consecutive batches of rank 0:"
    )
    print(
        f"  keyed: {s['keyed_us_per_batch']:.1f} us/batch; "
        f"whole epoch's order {s['keyed_epoch_s']:.2f} s (in 64k chunks)"
    )
    print(
        f"  randperm: {s['randperm_us_per_batch']:.1f} us/batch after "
        f"{s['randperm_epoch_s']:.2f} s for the epoch's order"
    )
    print(f"  shards (ShardPlan, keyed windows): {s['shards_us_per_batch']:.1f} us/batch")
    for name, at in (("SamplePlan", keyed_at), ("ShardPlan", shards_at)):
        if 10**10 in at:
            sec = at[10**10]
            verdict = "met" if sec < 1.0 else "missed"
            print(
                f"\ngoal first batch at 90 % of a 10^10 epoch < 1 s, {name}: {sec:.4f} s, {verdict}"
            )
    largest = max(keyed_at)
    report(
        [
            Ratio(
                f"first batch after a 90 % resume, {largest:.0e} samples",
                keyed_at[largest],
                1.0,
                higher_is_better=False,
                unit="s",
            ),
            Ratio(
                f"ShardPlan first batch after a 90 % resume, {largest:.0e} samples",
                shards_at[largest],
                1.0,
                higher_is_better=False,
                unit="s",
            ),
            Ratio(
                "keyed / randperm, us per batch (steady state)",
                s["keyed_us_per_batch"] / s["randperm_us_per_batch"],
            ),
        ]
    )


if __name__ == "__main__":
    main()
