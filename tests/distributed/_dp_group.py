"""2 Lightning DDP ranks over gloo under a strategy whose data-parallel group has 1 rank.

A job of ``test_trainer_ddp.py`` (``main([OUT])``, or ``python _dp_group.py OUT``). The
strategy is a ``DDPStrategy`` whose ``distributed_sampler_kwargs`` name one
data-parallel replica (as ``ModelParallelStrategy`` does for tensor-parallel
peers, which needs CUDA), so both processes must train on the same batches.
``OUT user-split``: plain DDP with ``use_distributed_sampler=False`` instead, so each
rank reads all of its own loader.
Each rank writes ``OUT/records-rank{R}.jsonl``. Lightning's launcher re-runs
this command line for rank 1, which is why it is a script.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.strategies import DDPStrategy

from tests.support.helpers import IdDataModule, IdModule, PhaseLog, trainer_kwargs

SIZE, BATCH, EPOCHS = 32, 4, 2


class OneDataParallelRank(DDPStrategy):
    """DDP over every process, but one data-parallel replica: all processes are its peers."""

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": 1, "rank": 0}


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    args = sys.argv[1:] if argv is None else argv
    out, user_split = Path(args[0]), args[1:] == ["user-split"]
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    model = IdModule(records_path=str(out / f"records-rank{rank}.jsonl"))
    trainer = L.Trainer(
        **trainer_kwargs(
            max_epochs=EPOCHS,
            devices=2,
            strategy=(DDPStrategy if user_split else OneDataParallelRank)(
                process_group_backend="gloo"
            ),
            use_distributed_sampler=not user_split,
            callbacks=[PhaseLog()],
        )
    )
    trainer.fit(model, datamodule=IdDataModule(size=SIZE, batch_size=BATCH))
    return 0


if __name__ == "__main__":
    sys.exit(main())
