"""The plain-loop scenarios of ``test_gloo_loops.py`` on 2 gloo ranks, in one launch.

``python _gloo_loops.py OUT`` spawns the 2 ranks once (each imports torch
once); each rank runs the scenarios in turn, each in a process group of its
own (a fresh key-value store) and with the environment it started with, and
each writes ``OUT/<scenario>/rank<r>.json`` (see the scenario's module).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.distributed import _agree_per_loader, _disagree, _stream_rank0, _topology
from tests.support.helpers import spawn_gloo_ranks

SCENARIOS = {
    "agree_per_loader": _agree_per_loader.run,
    "disagree": _disagree.run,
    "stream_rank0": _stream_rank0.run,
    "topology": _topology.run,
}


def run(rank: int, world: int, ports: list[int], out: str) -> None:
    for (name, scenario), port in zip(SCENARIOS.items(), ports, strict=True):
        folder = Path(out, name)
        folder.mkdir(parents=True, exist_ok=True)
        saved = dict(os.environ)
        try:
            scenario(rank, world, port, str(folder))
        finally:
            os.environ.clear()
            os.environ.update(saved)


if __name__ == "__main__":
    spawn_gloo_ranks(run, sys.argv[1], num_ports=len(SCENARIOS))
