"""``num_workers="auto"`` vs fixed worker counts: epoch time where workers hurt and where they help.

Two workloads, each with a simulated model step (the host sleeping ``--step-ms``
per batch, as a GPU step leaves the host waiting):

- tensors: a torch ``TensorDataset`` (per-sample ``__getitem__``, in memory):
  handing batches between processes costs more than slicing them, so the
  best count is 0;
- png: PNG images decoded with torchvision and flipped at random (decode-bound):
  workers hide the decoding, so the best count is >= 1.

For each, the epoch time with ``num_workers`` 0, ``--workers`` and ``"auto"``
(best of ``--repeats``, each a fresh loader: ``auto`` measures and decides
inside the timed epoch, as it would in a run). Ratios: ``auto`` vs the best
fixed count (goal >= 0.9x: it pays for its measuring batches only) and vs the
default 0 workers.

Run: ``python benchmarks/autoworkers/bench.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import io
import time
from typing import Any

import torch
import torch.utils.data
from PIL import Image
from torch.utils.data import Dataset

from loaderkit import ResumableDataLoader
from loaderkit.cli.bench import Ratio, report


class Pngs(Dataset[Any]):
    """PNG bytes decoded per sample, randomly flipped: a decode-bound image dataset."""

    def __init__(self, n: int, side: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.blobs = []
        for _ in range(n):
            pixels = torch.randint(0, 256, (side, side, 3), dtype=torch.uint8, generator=gen)
            buf = io.BytesIO()
            Image.fromarray(pixels.numpy()).save(buf, format="PNG")
            self.blobs.append(buf.getvalue())

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> torch.Tensor:
        from torchvision.io import decode_png

        image = decode_png(torch.frombuffer(bytearray(self.blobs[i]), dtype=torch.uint8))
        return image.flip(-1) if torch.rand(()) < 0.5 else image


def epoch_s(dataset: Any, workers: int | str, batch_size: int, step_s: float) -> tuple[float, Any]:
    loader = ResumableDataLoader(
        dataset, batch_size=batch_size, shuffle=True, seed=0, num_workers=workers
    )
    start = time.perf_counter()
    for _ in loader:
        if step_s:
            time.sleep(step_s)
    elapsed = time.perf_counter() - start
    auto = loader.describe().get("auto_workers")
    return elapsed, auto


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensor-samples", type=int, default=50_000)
    parser.add_argument("--png-samples", type=int, default=1500)
    parser.add_argument("--png-side", type=int, default=128)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    workloads = {
        "tensors": (
            torch.utils.data.TensorDataset(
                torch.randn(args.tensor_samples, 64), torch.arange(args.tensor_samples)
            ),
            256,
        ),
        "png": (Pngs(args.png_samples, args.png_side), 32),
    }
    step_s = args.step_ms / 1e3
    print(
        f"autoworkers bench: epoch seconds (best of {args.repeats}), model step "
        f"{args.step_ms} ms per batch (host sleep), num_workers 0 / {args.workers} / 'auto'"
    )
    ratios = []
    for name, (dataset, batch_size) in workloads.items():
        times: dict[Any, float] = {}
        chose: Any = None
        for workers in (0, args.workers, "auto"):
            best = float("inf")
            for _ in range(args.repeats):
                seconds, auto = epoch_s(dataset, workers, batch_size, step_s)
                if seconds < best:
                    best, chose = seconds, auto if auto is not None else chose
            times[workers] = best
        fixed_best = min(times[0], times[args.workers])
        print(
            f"  {name:8s} 0: {times[0]:.2f} s   {args.workers}: {times[args.workers]:.2f} s   "
            f"auto: {times['auto']:.2f} s -> {chose['workers']} worker(s): {chose['reason']}"
        )
        ratios += [
            Ratio(f"auto / best fixed num_workers, {name}", fixed_best / times["auto"], 0.9),
            Ratio(f"auto / num_workers=0, {name}", times[0] / times["auto"], None),
        ]
        if name == "png":
            # Issue 12: decode-bound loading scales >= 1.7x from 0 to 2 workers.
            ratios.append(
                Ratio(
                    f"num_workers={args.workers} / num_workers=0, png (decode-bound)",
                    times[0] / times[args.workers],
                    1.7,
                )
            )
    for r in ratios:
        goal = "" if r.goal is None else f"  (goal >= {r.goal}x: {'met' if r.met else 'missed'})"
        print(f"  {r.name}: {r.value:.2f}x{goal}")
    report(ratios)


if __name__ == "__main__":
    main()
