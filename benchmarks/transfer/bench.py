"""Host-to-device transfer: pinned vs pageable copies, and plain ``.to()`` vs DevicePrefetcher.

Run from the repository root (loaderkit installed, or ``PYTHONPATH=.``)::

    python benchmarks/transfer/bench.py

With CUDA it prints two markdown tables: H2D copy throughput (GB/s, timed
with CUDA events) for pageable and pinned host tensors, blocking and
non_blocking, with the pinned/pageable ratio; then a training-loop
comparison (a fake compute step of GPU matmuls per batch) of plain
``.to(device)`` against :class:`loaderkit.DevicePrefetcher`, in batches/s.
Without CUDA it says so and measures only the CPU pass-through overhead of
the prefetcher against a plain loop. Exits 0 either way.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable

import torch

from loaderkit import ResumableDataLoader, TensorDataset
from loaderkit.cli.bench import Ratio, report
from loaderkit.transfer import DevicePrefetcher

MIB = 1024 * 1024


def h2d_gbps(src: torch.Tensor, dst: torch.Tensor, *, non_blocking: bool, repeats: int) -> float:
    """Copy ``src`` into ``dst`` ``repeats`` times; GB/s from CUDA events."""
    dst.copy_(src, non_blocking=non_blocking)  # warm-up
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=non_blocking)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1000
    return src.numel() * src.element_size() * repeats / seconds / 1e9


def copy_table(sizes_mib: list[int], device: torch.device) -> list[Ratio]:
    ratios = []
    print("## H2D copy throughput (GB/s, CUDA events)\n")
    print(
        "| size | pageable blocking | pageable non_blocking | pinned blocking "
        "| pinned non_blocking | pinned/pageable |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for size in sizes_mib:
        pageable = torch.randint(0, 255, (size * MIB,), dtype=torch.uint8)
        pinned = pageable.pin_memory()
        dst = torch.empty_like(pageable, device=device)
        repeats = max(4, 2048 // size)
        row = [
            h2d_gbps(pageable, dst, non_blocking=False, repeats=repeats),
            h2d_gbps(pageable, dst, non_blocking=True, repeats=repeats),
            h2d_gbps(pinned, dst, non_blocking=False, repeats=repeats),
            h2d_gbps(pinned, dst, non_blocking=True, repeats=repeats),
        ]
        ratio = max(row[2:]) / max(row[:2])
        cells = " | ".join(f"{v:.1f}" for v in row)
        print(f"| {size} MiB | {cells} | {ratio:.2f}x |")
        ratios.append(Ratio(f"H2D pinned / pageable, {size} MiB", ratio))
        del pageable, pinned, dst
    print()
    return ratios


def timed_loop(
    batches: Iterable[torch.Tensor], step: Callable[[torch.Tensor], object], sync: bool
) -> float:
    """Seconds to run ``step`` over every batch (synchronising CUDA around it)."""
    if sync:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    if sync:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def best_of(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


def cuda_loop_table(args: argparse.Namespace, device: torch.device) -> list[Ratio]:
    numel = args.batch_mib * MIB // 4
    pageable = [torch.randn(numel) for _ in range(args.batches)]
    pinned = [b.pin_memory() for b in pageable]
    weight = torch.randn(args.matmul_size, args.matmul_size, device=device) / args.matmul_size
    rows_per_batch = 64
    dataset = TensorDataset(torch.cat(pageable).view(args.batches * rows_per_batch, -1))
    loader = ResumableDataLoader(
        dataset,
        batch_size=rows_per_batch,
        num_workers=args.loader_workers,
        persistent_workers=True,
        pin_memory=True,
    )
    # The same data through torch's DataLoader: per-sample fetch, default_collate, its pin thread.
    torch_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(dataset.tensors[0]),
        batch_size=rows_per_batch,
        num_workers=args.loader_workers,
        persistent_workers=args.loader_workers > 0,
        pin_memory=True,
    )

    def compute(batch: torch.Tensor) -> None:
        work = weight
        for _ in range(args.matmuls):
            work = work @ weight
        work.add_(batch.sum())

    rows = {
        "plain .to(device), pageable": lambda: timed_loop(
            pageable, lambda b: compute(b.to(device)), sync=True
        ),
        "plain .to(device, non_blocking), pinned": lambda: timed_loop(
            pinned, lambda b: compute(b.to(device, non_blocking=True)), sync=True
        ),
        "DevicePrefetcher, pageable (pins itself)": lambda: timed_loop(
            DevicePrefetcher(pageable, device), compute, sync=True
        ),
        "DevicePrefetcher, pinned (loader pinned)": lambda: timed_loop(
            DevicePrefetcher(pinned, device), compute, sync=True
        ),
        # The whole path a user runs: a pinning loader (batched gather in workers) feeding it.
        f"loader (pinning, {args.loader_workers} workers) + DevicePrefetcher": lambda: timed_loop(
            DevicePrefetcher(loader, device), lambda b: compute(b[0]), sync=True
        ),
        f"torch DataLoader (pin_memory, {args.loader_workers} workers) + DevicePrefetcher": (
            lambda: timed_loop(
                DevicePrefetcher(torch_loader, device), lambda b: compute(b[0]), sync=True
            )
        ),
    }
    compute_only = best_of(
        args.repeats, lambda: timed_loop(pinned, lambda b: compute(weight), True)
    )
    print(
        f"## Loop: {args.batches} batches of {args.batch_mib} MiB, "
        f"{args.matmuls} matmuls of {args.matmul_size}^2 per batch\n"
    )
    print(f"compute alone: {args.batches / compute_only:.1f} batches/s\n")
    # Data wait: the share of a step spent on anything but the compute it would take alone.
    print("| loop | batches/s | vs plain pageable | data wait, % of step |")
    print("|---|---:|---:|---:|")
    baseline = None
    ratios = []
    for i, (name, run) in enumerate(rows.items()):
        seconds = best_of(args.repeats, run)
        rate = args.batches / seconds
        baseline = baseline or rate
        wait = max(0.0, 1 - compute_only / seconds) * 100
        print(f"| {name} | {rate:.1f} | {rate / baseline:.2f}x | {wait:.1f} |")
        if i:
            ratios.append(Ratio(f"loop: {name} / plain pageable", rate / baseline))
    print()
    return ratios


def cpu_overhead_table(args: argparse.Namespace) -> list[Ratio]:
    batches = [torch.randn(64, 64) for _ in range(args.cpu_batches)]
    cpu = torch.device("cpu")

    def step(batch: torch.Tensor) -> object:
        return batch.sum()

    loops: dict[str, Callable[[], Iterable[torch.Tensor]]] = {
        "plain loop": lambda: batches,
        "plain loop + .to(cpu)": lambda: (b.to(cpu) for b in batches),
        "DevicePrefetcher(cpu)": lambda: DevicePrefetcher(batches, cpu),
    }
    n = args.cpu_batches
    print(f"## CPU pass-through overhead ({n} batches of 64x64, step = batch.sum())\n")
    print("| loop | batches/s | vs plain loop | overhead (us/batch) |")
    print("|---|---:|---:|---:|")
    # Interleaved repeats, best of each: the loops share any drift of a busy machine.
    best = dict.fromkeys(loops, float("inf"))
    for _ in range(args.repeats):
        for name, make in loops.items():
            best[name] = min(best[name], timed_loop(make(), step, sync=False))
    baseline = best["plain loop"]
    for name, seconds in best.items():
        print(
            f"| {name} | {n / seconds:,.0f} | {baseline / seconds:.2f}x "
            f"| {(seconds - baseline) / n * 1e6:+.2f} |"
        )
    print()
    name = "CPU: DevicePrefetcher(cpu) / plain loop"
    return [Ratio(name, baseline / best["DevicePrefetcher(cpu)"])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 256])
    parser.add_argument("--batches", type=int, default=40, help="batches in the CUDA loop")
    parser.add_argument("--batch-mib", type=int, default=16, help="size of one CUDA-loop batch")
    parser.add_argument("--matmuls", type=int, default=6, help="matmuls per batch (fake step)")
    parser.add_argument("--matmul-size", type=int, default=2048)
    parser.add_argument("--loader-workers", type=int, default=2, help="workers of the loader row")
    parser.add_argument("--cpu-batches", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5, help="best of this many runs")
    args = parser.parse_args(argv)

    print(f"torch {torch.__version__}")
    ratios = []
    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        print(f"device: {torch.cuda.get_device_name(device)}\n")
        ratios += copy_table(args.sizes_mib, device)
        ratios += cuda_loop_table(args, device)
    else:
        print("CUDA is not available: skipping the H2D copy and CUDA prefetch benchmarks.\n")
    ratios += cpu_overhead_table(args)
    report(ratios)  # for `loaderkit bench`; a no-op otherwise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
