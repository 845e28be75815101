"""A parent whose DataLoader workers get stuck, for the parent-death watchdog test.

``python -m tests.reliability._stuck_parent METHOD MODE``: builds a loader with
2 workers started by METHOD (``fork``, ``spawn``, ``forkserver``), whose
samples from index 8 on never finish (MODE ``sleep``: blocked in a sleep;
``busy``: spinning in Python), prints its pid and its workers' pids as one
JSON line, then waits to be killed.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time

from loaderkit import ResumableDataLoader


class Stuck:
    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __len__(self) -> int:
        return 100

    def __getitem__(self, index: int) -> int:
        if index >= 8:
            if self.mode == "busy":
                while True:
                    pass
            time.sleep(3600)
        return index


def main() -> None:
    import os

    method, mode = sys.argv[1], sys.argv[2]
    loader = ResumableDataLoader(
        Stuck(mode), batch_size=4, num_workers=2, multiprocessing_context=method, seed=0
    )
    it = iter(loader)
    next(it), next(it)  # both workers answered; now they are stuck on indices 8..
    pids = [p.pid for p in multiprocessing.active_children()]
    print(json.dumps({"parent": os.getpid(), "children": pids}), flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    from tests.reliability._stuck_parent import main as run  # workers unpickle Stuck by module

    run()
