"""A stream loader's state saved by rank 0 alone, under real 2-process gloo (issue 11, failure 7).

Measured before: ``state_dict()`` gathered every rank's cursors with
``all_gather_object``, so a plain loop saving on rank 0 only
(``if rank == 0: torch.save(loader.state_dict(), path)``) hung. Now it reads
the peers' cursors from the process group's store; rank 1 never calls it.
The oracle: for each rank, the first k batches plus the batches resumed from
rank 0's step-k state equal the uninterrupted run, for k inside epoch 0, at
its end and inside epoch 1, with ``num_workers`` 0 (and the last k with 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.distributed._stream_rank0 import RESUME_AT, SAVE_AT, TOTAL
from tests.support.helpers import log_tail, run_script

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

SCRIPT = Path(__file__).resolve().parent / "_stream_rank0.py"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("stream_rank0")
    log = out / "run.log"
    rc = run_script(SCRIPT, [str(out)], log, phase="2 gloo ranks, stream state saved by rank 0")
    assert rc == 0, f"exit status {rc}; log:\n{log_tail(log)}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("num_workers", ["0", "2"])
def test_rank0_alone_saves_and_every_rank_resumes_exactly(
    results: list[dict[str, Any]], num_workers: str
) -> None:
    assert [len(r[num_workers]["full"]) for r in results] == [TOTAL, TOTAL]
    assert sorted(map(int, results[0][num_workers]["state_dict_s"])) == list(SAVE_AT)
    assert results[1][num_workers]["state_dict_s"] == {}  # rank 1 never called it
    for rank in range(2):
        full = results[rank][num_workers]["full"]
        for k in RESUME_AT[int(num_workers)]:
            resumed = results[rank][num_workers]["resumed"][str(k)]
            assert full[:k] + resumed == full, f"rank {rank} resumed from rank 0's step {k}"
    # Two ranks, two streams: no sample twice in an epoch across ranks.
    epoch0 = [i for r in results for b in r[num_workers]["full"][: TOTAL // 2] for i in b]
    assert len(epoch0) == len(set(epoch0))
