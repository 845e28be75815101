"""What write_shards' resume digest costs: 200 MB of uint16 tokens in 8 raw shards, into
the page cache (the worst case: no disk to wait for).

Usage: python benchmarks/writers/resume_digest.py TREE RESUME  (TREE: a loaderkit checkout,
RESUME: 1 or 0); prints the best of 5 writes in seconds. Run two trees alternately.
"""

import shutil
import sys
import tempfile
import time

import numpy as np


def main() -> None:
    tree, resume = sys.argv[1], sys.argv[2] == "1"
    sys.path.insert(0, tree)
    import loaderkit as lk

    assert lk.__file__ is not None and lk.__file__.startswith(tree), lk.__file__
    rng = np.random.default_rng(0)
    data = [rng.integers(0, 60000, 12_500_000).astype(np.uint16) for _ in range(8)]
    reader = lk.TokenReader(seq_len=2048)
    times = []
    for _ in range(5):
        folder = tempfile.mkdtemp()
        start = time.perf_counter()
        lk.write_shards(folder, data, reader, progress=False, suffix=".bin", resume=resume)
        times.append(time.perf_counter() - start)
        shutil.rmtree(folder)
    print(f"{min(times):.3f}")


if __name__ == "__main__":
    main()
