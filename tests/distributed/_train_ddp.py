"""The DDP training script of tests/distributed/test_ddp_resume.py.

``python tests/distributed/_train_ddp.py --out DIR --devices 2 ...``: the
options are those of ``tests/support/lightning_job.py``. Lightning's DDP launcher
re-runs this same command line for rank 1, which is why it is a script.
"""

from __future__ import annotations

import sys

from tests.support.lightning_job import main

if __name__ == "__main__":
    sys.exit(main())
