"""loaderkit vs its peers on one token corpus: read speed, and the first batch after a resume.

Data (issue 12): ``--tokens`` uint16 tokens (default 50M) in ``--shards`` (16)
uneven shards (0.75x-1.25x the mean), samples of ``--seq-len`` (2048) tokens,
batches of ``--batch-size`` (8), shuffled, int64 batches out. Each loader reads
the corpus in its own format, written once before timing:

- (lk) loaderkit: ``write_shards`` + ``TokenReader`` (``.npy`` shards),
  ``ShardedDataset.batch_sampler`` (the shard plan, ``mix_shards=8``) through
  ``ResumableDataLoader`` (workers hand batches over through shared-memory slots).
- (ld) litdata: ``optimize(..., item_loader=TokensLoader())`` chunks,
  ``StreamingDataset(item_loader=TokensLoader(block_size=seq_len), shuffle=True)``
  through ``StreamingDataLoader``.
- (ms) mosaic streaming: ``MDSWriter`` shards of ``ndarray:uint16:<seq_len>``
  samples, ``StreamingDataset(shuffle=True)`` (py1e) through its ``StreamingDataLoader``.
- (td) torch ``DataLoader(shuffle=True)`` over a map-style dataset of the
  loaderkit ``.npy`` shards, memory-mapped (``np.load(mmap_mode="r")``).
- (sd) torchdata ``StatefulDataLoader``: the same dataset and sampler.

The peers' batches are made by one fast collate (``np.stack`` of the rows,
then one ``astype(int64)``), not torch's ``default_collate``: they get the
cheapest batching there is, so the figures compare the readers and loaders.

Read speed: samples/s over ``--batches`` batches of a fresh iterator after its
first batch (start-up untimed, so this is the steady state), median of
``--repeats`` runs, the loaders in a shuffled order in each repeat; at each
``--workers`` count.

Resume: for each loader that saves its position (all but plain ``DataLoader``),
an iterator runs to the middle of the epoch (``--resume-at``, a share of its
batches), its ``state_dict()`` is taken, and a new loader of the same kind is
built; the time from ``load_state_dict`` to the first batch is the figure
(median of ``--resume-repeats``), next to the same loader's first batch with no
resume. "same next batch" says whether the resumed loader's first batch is the
batch the interrupted iterator would have yielded next.

A peer that is not installed (or named in ``--without``, which simulates
that) is skipped with a message: ``loaderkit bench --quick`` runs this bench
where only loaderkit and torch are installed.

Usage: ``python benchmarks/peers/bench.py [--tokens 50000000] [--workers 0 2] [--without litdata]``
"""

from __future__ import annotations

import argparse
import gc
import logging
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import loaderkit
from loaderkit import ResumableDataLoader, ShardedDataset, TokenReader, write_shards
from loaderkit.cli.bench import Ratio, report

PEERS = ("litdata", "mosaic", "torchdata")


def stack_int64(samples: Sequence[Any]) -> torch.Tensor:
    """The peers' collate: rows (arrays, uint16 tensors or mosaic's dicts) -> one int64 batch."""
    if isinstance(samples[0], dict):
        samples = [s["tokens"] for s in samples]
    rows = [s.numpy() if isinstance(s, torch.Tensor) else s for s in samples]
    return torch.from_numpy(np.stack(rows).astype(np.int64))


class MemmapRows(Dataset[np.ndarray]):
    """(td)/(sd): the ``.npy`` shards memory-mapped, one uint16 row of ``seq_len`` per ``[i]``."""

    def __init__(self, paths: Sequence[Path], seq_len: int) -> None:
        self.maps = [np.load(p, mmap_mode="r") for p in paths]
        self.seq_len = seq_len
        self.ends = np.cumsum([len(m) // seq_len for m in self.maps])

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __getitem__(self, index: int) -> np.ndarray:
        shard = int(np.searchsorted(self.ends, index, side="right"))
        row = index - int(self.ends[shard - 1] if shard else 0)
        return self.maps[shard][row * self.seq_len : (row + 1) * self.seq_len]


def litdata_rows(path: str) -> Iterator[torch.Tensor]:
    """litdata ``optimize`` input function: one shard's tokens (TokensLoader concatenates)."""
    yield torch.from_numpy(np.load(path).astype(np.int32))


@dataclass
class Contender:
    """One loader under test: ``make(num_workers)`` builds a fresh loader."""

    key: str
    name: str
    make: Callable[[int], Any]
    resumable: bool
    samples: int
    cleanup: Callable[[], None] = field(default=lambda: None)
    stop: Callable[[Any], None] = field(default=lambda loader: None)

    def drop(self, loader: Any) -> None:
        """Stop what an abandoned iterator of ``loader`` left running."""
        self.stop(loader)
        gc.collect()


def missing(name: str, without: Sequence[str]) -> None:
    """Raise ImportError for a peer named in ``--without`` (the same path as not installed)."""
    if name in without:
        raise ImportError(f"{name} hidden by --without")


def make_loaderkit(paths: list[Path], args: argparse.Namespace) -> Contender:
    ds = ShardedDataset(paths, TokenReader(seq_len=args.seq_len))

    def make(workers: int) -> ResumableDataLoader:
        sampler = ds.batch_sampler(args.batch_size, seed=0)
        return ResumableDataLoader(ds, batch_sampler=sampler, num_workers=workers)

    return Contender("lk", "loaderkit ResumableDataLoader (shard plan)", make, True, len(ds))


def make_torch(paths: list[Path], args: argparse.Namespace, stateful: bool) -> Contender:
    ds = MemmapRows(paths, args.seq_len)
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader_cls: Any = StatefulDataLoader
    else:
        loader_cls = DataLoader

    def make(workers: int) -> Any:
        gen = torch.Generator().manual_seed(0)
        return loader_cls(
            ds,
            batch_size=args.batch_size,
            shuffle=True,
            generator=gen,
            num_workers=workers,
            collate_fn=stack_int64,
        )

    if stateful:
        return Contender("sd", "torchdata StatefulDataLoader", make, True, len(ds))
    return Contender("td", "torch DataLoader", make, False, len(ds))


def make_litdata(paths: list[Path], root: Path, args: argparse.Namespace) -> Contender:
    from litdata import StreamingDataLoader, StreamingDataset, optimize
    from litdata.streaming.item_loader import TokensLoader

    out = root / "litdata"
    start = time.perf_counter()
    method = multiprocessing.get_start_method(allow_none=True)
    optimize(
        fn=litdata_rows,
        inputs=[str(p) for p in paths],
        output_dir=str(out),
        chunk_bytes="64MB",
        item_loader=TokensLoader(),
        num_workers=1,
        reorder_files=False,
        verbose=False,
    )
    # optimize() sets the process-wide start method (force=True): put it back, or every
    # later DataLoader here would start its workers under litdata's choice (spawn).
    multiprocessing.set_start_method(method, force=True)
    print(f"litdata optimize: {time.perf_counter() - start:.1f} s")

    def dataset() -> Any:
        return StreamingDataset(
            str(out), item_loader=TokensLoader(block_size=args.seq_len), shuffle=True, seed=0
        )

    def make(workers: int) -> Any:
        return StreamingDataLoader(
            dataset(), batch_size=args.batch_size, num_workers=workers, collate_fn=stack_int64
        )

    n = len(dataset())
    return Contender("ld", "litdata StreamingDataLoader", make, True, n)


def make_mosaic(paths: list[Path], root: Path, args: argparse.Namespace) -> Contender:
    from streaming import MDSWriter, StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    out = root / "mosaic"
    start = time.perf_counter()
    column = f"ndarray:uint16:{args.seq_len}"
    with MDSWriter(out=str(out), columns={"tokens": column}, size_limit=1 << 26) as writer:
        for p in paths:
            tokens = np.load(p, mmap_mode="r")
            rows = len(tokens) // args.seq_len
            for row in np.asarray(tokens[: rows * args.seq_len]).reshape(rows, args.seq_len):
                writer.write({"tokens": row})
    print(f"mosaic MDSWriter: {time.perf_counter() - start:.1f} s")

    def make(workers: int) -> Any:
        gc.collect()  # mosaic refuses a second live dataset on the same local folder
        ds = StreamingDataset(
            local=str(out), shuffle=True, shuffle_seed=0, batch_size=args.batch_size
        )
        return StreamingDataLoader(
            ds, batch_size=args.batch_size, num_workers=workers, collate_fn=stack_int64
        )

    def stop(loader: Any) -> None:
        # An abandoned epoch keeps mosaic's shard threads (in the main process at
        # num_workers=0) walking the epoch; its next __iter__ would exit them.
        ds = loader.dataset
        if hasattr(ds, "_iterator"):
            ds._iterator.exit()
        if hasattr(ds, "_executor"):
            ds._executor.shutdown(wait=True)

    loader = make(0)
    n = len(loader.dataset)
    del loader
    return Contender(
        "ms", "mosaic streaming StreamingDataLoader", make, True, n, clean_stale_shared_memory, stop
    )


def contenders(paths: list[Path], root: Path, args: argparse.Namespace) -> list[Contender]:
    """loaderkit, torch, then each peer that imports (a message for each one that does not)."""
    out = [make_loaderkit(paths, args), make_torch(paths, args, stateful=False)]
    builders: dict[str, Callable[[], Contender]] = {
        "torchdata": lambda: make_torch(paths, args, stateful=True),
        "litdata": lambda: make_litdata(paths, root, args),
        "mosaic": lambda: make_mosaic(paths, root, args),
    }
    for name, build in builders.items():
        try:
            missing(name, args.without)
            out.append(build())
        except ImportError as exc:
            print(f"skipped {name}: not installed ({exc})")
    return out


def read_speed(c: Contender, workers: int, batches: int) -> float:
    """Samples/s over ``batches`` batches after the first (or to the end of the epoch)."""
    loader = c.make(workers)
    it = iter(loader)
    next(it)
    samples = 0
    start = time.perf_counter()
    for i, batch in enumerate(it):
        samples += len(batch)
        if i + 1 >= batches:
            break
    seconds = time.perf_counter() - start
    del it
    c.drop(loader)
    return samples / seconds


def resume_times(
    c: Contender, workers: int, at: float, batch_size: int
) -> tuple[float, float, bool]:
    """(fresh first batch s, resumed first batch s, resumed batch == the next one)."""
    loader = c.make(workers)
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    fresh = time.perf_counter() - start
    for _ in range(max(1, int(at * c.samples) // batch_size) - 1):
        next(it)
    state = loader.state_dict()
    expected = next(it)
    del it
    c.drop(loader)
    del loader
    resumed_loader = c.make(workers)
    start = time.perf_counter()
    resumed_loader.load_state_dict(state)
    it = iter(resumed_loader)
    first = next(it)
    resumed = time.perf_counter() - start
    del it
    c.drop(resumed_loader)
    return fresh, resumed, bool(torch.equal(first, expected))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=50_000_000, help="tokens in all")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--batches", type=int, default=1000, help="batches timed per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--resume-at", type=float, default=0.5, help="share of the epoch")
    parser.add_argument("--resume-repeats", type=int, default=1)
    parser.add_argument(
        "--without", nargs="*", default=[], choices=PEERS, help="act as if not installed"
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)

    print(
        f"torch {torch.__version__}, numpy {np.__version__}, loaderkit {loaderkit.__version__}, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    print("load average at start (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    with tempfile.TemporaryDirectory(prefix="loaderkit-bench-peers-") as tmp:
        root = Path(tmp)
        rng = np.random.default_rng(0)
        mean = args.tokens // args.shards
        lengths = [int(mean * f) for f in np.linspace(0.75, 1.25, args.shards)]
        data = (rng.integers(0, 50257, n, dtype=np.uint16) for n in lengths)
        paths = write_shards(root / "loaderkit", data, TokenReader(seq_len=args.seq_len))
        found = contenders(paths, root, args)
        run(found, args, lengths)
        for c in found:
            c.cleanup()


def run(found: list[Contender], args: argparse.Namespace, lengths: list[int]) -> None:
    """Time every contender, print the tables and the ratios, and report them."""
    print(
        f"\n## peers: {args.shards} shards of {min(lengths):,}..{max(lengths):,} uint16 tokens "
        f"({sum(lengths):,} in all), samples of {args.seq_len} tokens, batch {args.batch_size}, "
        f"shuffled, int64 batches; read speed over {args.batches} batches after the first, "
        f"median of {args.repeats}; resume at {args.resume_at:.0%} of the epoch\n"
    )
    names = {c.key: c.name for c in found}
    rates: dict[tuple[str, int], list[float]] = {}
    order = random.Random(1)
    for workers in args.workers:
        for _ in range(args.repeats):
            keys = list(found)
            order.shuffle(keys)
            for c in keys:
                rate = read_speed(c, workers, args.batches)
                rates.setdefault((c.key, workers), []).append(rate)
    med = {key: statistics.median(r) for key, r in rates.items()}
    resumes: dict[tuple[str, int], tuple[float, float, bool]] = {}
    for workers in args.workers:
        for c in found:
            if not c.resumable:
                continue
            runs = [
                resume_times(c, workers, args.resume_at, args.batch_size)
                for _ in range(args.resume_repeats)
            ]
            resumes[(c.key, workers)] = (
                statistics.median(r[0] for r in runs),
                statistics.median(r[1] for r in runs),
                all(r[2] for r in runs),
            )

    print("| loader | samples in epoch | " + " | ".join(
        f"samples/s, num_workers={w} | loaderkit / it" for w in args.workers) + " |")  # fmt: skip
    print("|---|---:|" + "---:|---:|" * len(args.workers))
    for c in found:
        cells = []
        for w in args.workers:
            rate = med[(c.key, w)]
            cells.append(f"{rate:,.0f} | {med[('lk', w)] / rate:.2f}x")
        print(f"| ({c.key}) {c.name} | {c.samples:,} | " + " | ".join(cells) + " |")

    print("\n| loader | num_workers | first batch, fresh | first batch, resumed | "
          "resumed / fresh | resumed vs loaderkit | same next batch |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|")
    for (key, w), (fresh, resumed, same) in resumes.items():
        vs = resumed / resumes[("lk", w)][1]
        print(
            f"| ({key}) {names[key]} | {w} | {fresh * 1e3:,.1f} ms | {resumed * 1e3:,.1f} ms | "
            f"{resumed / fresh:.2f}x | {vs:.2f}x | {'yes' if same else 'NO'} |"
        )
    for key in (k for k in ("ld", "ms", "sd") if k not in names):
        print(f"({key}) not run: its package is not installed (or hidden by --without)")

    ratios: list[Ratio] = []
    goals = {"ld": 10.0, "td": 10.0}
    for w in args.workers:
        for c in found:
            if c.key == "lk":
                continue
            goal = goals.get(c.key) if w == 2 else None
            ratios.append(
                Ratio(f"loaderkit / {c.name}, samples/s, num_workers={w}", med[("lk", w)]
                      / med[(c.key, w)], goal)
            )  # fmt: skip
    for (key, w), (_, resumed, _) in resumes.items():
        if key != "lk":
            ratios.append(
                Ratio(f"{names[key]} / loaderkit, first batch after a resume, num_workers={w}",
                      resumed / resumes[("lk", w)][1])
            )  # fmt: skip
    print()
    for ratio in ratios:
        verdict = "" if ratio.met is None else (", met" if ratio.met else ", MISSED")
        goal = f" (goal {ratio.goal_text()})" if ratio.goal is not None else ""
        print(f"{ratio.name}: {ratio.format()}{goal}{verdict}")
    report(ratios)


if __name__ == "__main__":
    main()
