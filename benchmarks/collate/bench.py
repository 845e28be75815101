"""Padding collate throughput: PadCollate vs torch's pad_sequence vs a naive Python loop.

Every competitor gets the same batches (``--batch-size`` samples of int64 token ids) and
pads them to the batch max on the right with 0. What each one computes:

- ``PadCollate (tensors)``: the padded ``(B, T)`` tensor plus int64 lengths and a bool mask.
- ``pad_sequence``: the padded tensor only (less work than PadCollate).
- ``pad_sequence + mask``: the padded tensor, then lengths and ``arange(T) < lengths``, i.e.
  the same outputs as PadCollate: the fair comparison.
- ``PadCollate (lists)``: the same outputs from Python lists of ints.
- ``naive loop (lists)``: the same outputs from Python lists of ints, padding each list with
  ``row + [0] * (T - len(row))`` and converting with ``torch.tensor``.

Length distributions: ``uniform`` draws integers in 16..512; ``lognormal`` draws
``exp(N(mu=5.5, sigma=1.0))`` (median ~245 tokens, long tail) clipped to 16..4096.
A repeat times every competitor once over the same pool of batches, in a shuffled order (so
machine noise and cache state hit all alike); the table shows the median over repeats, after
one warm-up repeat.

Torch runs with one intra-op thread by default (``--threads 1``) because that is what a
DataLoader worker, where a collate_fn runs, sets. On a busy machine more threads can make
torch's parallel fills (pad_sequence's) very slow and noisy; PadCollate's copies are numpy's.

Run: ``python benchmarks/collate/bench.py --repeats 20 --batch-size 64 --seed 0``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

from loaderkit.cli.bench import Ratio, report
from loaderkit.collate import PadCollate

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def draw_lengths(dist: str, batch_size: int, rng: np.random.Generator) -> list[int]:
    if dist == "uniform":
        return rng.integers(16, 513, batch_size).tolist()
    return np.clip(rng.lognormal(5.5, 1.0, batch_size), 16, 4096).astype(int).tolist()


def pad_sequence_only(seqs: list[torch.Tensor]) -> torch.Tensor:
    return pad_sequence(seqs, batch_first=True, padding_value=0)


def pad_sequence_and_mask(seqs: list[torch.Tensor]) -> Outputs:
    padded = pad_sequence(seqs, batch_first=True, padding_value=0)
    lengths = torch.tensor([s.shape[0] for s in seqs])
    return padded, lengths, torch.arange(padded.shape[1]) < lengths[:, None]


def naive_loop(rows: list[list[int]]) -> Outputs:
    width = max(len(r) for r in rows)
    padded = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    lengths = torch.tensor([len(r) for r in rows])
    mask = torch.tensor([[True] * len(r) + [False] * (width - len(r)) for r in rows])
    return padded, lengths, mask


def pad_collate(collate: PadCollate) -> Callable[[list[Any]], Outputs]:
    def run(batch: list[Any]) -> Outputs:
        out = collate(batch)
        return out.values, out.lengths, out.mask

    return run


def check_agree(batch: list[torch.Tensor]) -> None:
    """All competitors must produce identical outputs, or the timings mean nothing."""
    rows = [s.tolist() for s in batch]
    expected = pad_sequence_and_mask(batch)
    collate = pad_collate(PadCollate())
    outputs = [collate(batch), collate(rows), naive_loop(rows), (pad_sequence_only(batch),)]
    for got in outputs:
        if not all(torch.equal(a, b) for a, b in zip(got, expected, strict=False)):
            raise RuntimeError("competitors disagree on the padded batch; fix before timing")


def bench(dist: str, args: argparse.Namespace) -> dict[str, float]:
    rng = np.random.default_rng(args.seed)
    tensors = [
        [
            torch.from_numpy(rng.integers(1, 50_000, n))
            for n in draw_lengths(dist, args.batch_size, rng)
        ]
        for _ in range(args.batches)
    ]
    lists = [[s.tolist() for s in batch] for batch in tensors]
    check_agree(tensors[0])
    collate = pad_collate(PadCollate())
    competitors: dict[str, tuple[Callable[[Any], Any], list[Any]]] = {
        "PadCollate (tensors)": (collate, tensors),
        "pad_sequence": (pad_sequence_only, tensors),
        "pad_sequence + mask": (pad_sequence_and_mask, tensors),
        "PadCollate (lists)": (collate, lists),
        "naive loop (lists)": (naive_loop, lists),
    }
    times: dict[str, list[float]] = {name: [] for name in competitors}
    order = list(competitors)
    for repeat in range(args.repeats + 1):
        # A fresh order each repeat: no competitor always runs on the caches another left.
        rng.shuffle(order)
        for name in order:
            fn, pool = competitors[name]
            start = time.perf_counter()
            for batch in pool:
                fn(batch)
            if repeat:  # repeat 0 is the warm-up
                times[name].append(time.perf_counter() - start)
    tokens = sum(s.numel() for batch in tensors for s in batch)
    return {name: tokens / statistics.median(t) / 1e6 for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats (median taken)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per batch")
    parser.add_argument("--batches", type=int, default=8, help="distinct batches per repeat")
    parser.add_argument("--seed", type=int, default=0, help="seed of the lengths and tokens")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, "
        f"torch {torch.__version__}, numpy {np.__version__}, {torch.get_num_threads()} torch "
        f"threads; batch size {args.batch_size}, {args.batches} batches x {args.repeats} "
        f"repeats, seed {args.seed}; Mtokens/s (real tokens, median), higher is better\n"
    )
    results = {dist: bench(dist, args) for dist in ("uniform", "lognormal")}
    dists = list(results)
    print("| competitor | " + " | ".join(f"{d} Mtok/s" for d in dists) + " |")
    print("|---|" + "---:|" * len(dists))
    for name in results[dists[0]]:
        print(f"| {name} | " + " | ".join(f"{results[d][name]:.1f}" for d in dists) + " |")
    ratios = {
        "PadCollate / pad_sequence": ("PadCollate (tensors)", "pad_sequence"),
        "PadCollate / (pad_sequence + mask)": ("PadCollate (tensors)", "pad_sequence + mask"),
        "PadCollate / naive loop (lists)": ("PadCollate (lists)", "naive loop (lists)"),
    }
    for label, (num, den) in ratios.items():
        cells = " | ".join(f"**{results[d][num] / results[d][den]:.2f}x**" for d in dists)
        print(f"| {label} | {cells} |")
    # For `loaderkit bench` (a no-op otherwise); goal: PadCollate >= 1.0x pad_sequence.
    report(
        [
            Ratio(f"{label}, {d}", results[d][num] / results[d][den], goal=1.0 if i == 0 else None)
            for i, (label, (num, den)) in enumerate(ratios.items())
            for d in dists
        ]
    )


if __name__ == "__main__":
    main()
