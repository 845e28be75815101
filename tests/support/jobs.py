"""Several training jobs in one launch: the ranks start (and import torch) once.

``python tests/support/jobs.py SPEC.json``: ``SPEC`` is ``{"out": DIR, "jobs":
[{"name": N, "module": M, "args": [...]}, ...]}``. Each rank runs the jobs in
order, each as ``M.main(args)`` (a script's entry point: ``lightning_job``,
``datamodule_ddp``, ...), in one process group: the first job's Trainer or
Fabric starts rank 1 by re-running this command line, and the later ones find
the group already there. After each job every rank writes
``DIR/job-{N}-rank{R}.json``: ``{"rc": exit status}`` or ``{"error": trace}``.
An unexpected error stops the launch: the ranks may be out of step after it.

On the test side, :func:`run_jobs` launches and returns a :class:`Jobs`, whose
``rc(name)`` fails the calling test (with the log) when that job did not finish
on every rank, so each job's test fails on its own.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()


def job(name: str, module: str, *args: Any) -> dict[str, Any]:
    """One job of a launch: ``module.main([str(a) for a in args])``."""
    return {"name": name, "module": module, "args": [str(a) for a in args]}


@dataclass
class Jobs:
    """What one launch of :func:`run_jobs` left: per job and rank, its exit status."""

    out: Path
    log: Path
    world_size: int
    failure: str | None  # why the launch itself failed (a hang), or None

    def ok(self, name: str, rc: int = 0) -> bool:
        """Whether the job ended with exit status ``rc`` on every rank (never raises)."""
        try:
            return self.rc(name) == rc
        except AssertionError:
            return False

    def rc(self, name: str) -> int:
        """The job's exit status, the same on every rank; fails the test otherwise."""
        got = []
        for rank in range(self.world_size):
            path = self.out / f"job-{name}-rank{rank}.json"
            status = json.loads(path.read_text()) if path.exists() else {"error": "did not run"}
            if "rc" not in status:
                why = self.failure or _tail(self.log)
                raise AssertionError(f"job {name!r} on rank {rank}: {status['error']}\n{why}")
            got.append(status["rc"])
        assert len(set(got)) == 1, f"job {name!r}: exit status per rank {got}\n{_tail(self.log)}"
        return int(got[0])


def run_jobs(out: Path, jobs: list[dict[str, Any]], phase: str, world_size: int = 2) -> Jobs:
    """Run ``jobs`` in one launch (2 ranks unless ``world_size``); see the module docstring."""
    from tests.support.helpers import run_script

    out.mkdir(parents=True, exist_ok=True)
    spec, log = out / "jobs.json", out / "jobs.log"
    spec.write_text(json.dumps({"out": str(out), "jobs": jobs}))
    failure = None
    try:
        run_script(SCRIPT, [str(spec)], log, phase=phase)
    except AssertionError as exc:  # a hang: the jobs that finished still count
        failure = str(exc)
    return Jobs(out, log, world_size, failure)


def _tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


def main() -> int:
    from tests.support.helpers import mark_phase

    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(spec["out"])
    for entry in spec["jobs"]:
        rank = os.environ.get("LOCAL_RANK", "0")  # set for rank 0 once rank 1 is started
        mark_phase(f"rank {rank}: job {entry['name']}")
        try:
            run = importlib.import_module(entry["module"]).main
            status: dict[str, Any] = {"rc": run(entry["args"])}
        except Exception:
            status = {"error": traceback.format_exc()}
        rank = os.environ.get("LOCAL_RANK", "0")
        (out / f"job-{entry['name']}-rank{rank}.json").write_text(json.dumps(status))
        if "error" in status:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
