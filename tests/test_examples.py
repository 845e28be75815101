"""The runnable examples in ``examples/`` work, run as a user runs them (short settings)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.helpers import REPO_ROOT, log_tail, run_script

EXAMPLES = REPO_ROOT / "examples"


def _run(tmp_path: Path, script: str, *args: str, name: str = "log") -> tuple[int, str]:
    log = tmp_path / f"{name}.txt"
    rc = run_script(EXAMPLES / script, list(args), log, phase=f"example {script}")
    return rc, log.read_text(errors="replace")


def test_train_text_trains_then_resumes_from_last(tmp_path: Path) -> None:
    common = ["--max-samples", "200", "--max-len", "48", "--max-tokens", "512"]
    common += ["--num-workers", "0", "--ckpt-every", "3", "--no-progress-bar"]
    common += ["--workdir", str(tmp_path / "run")]
    rc, out = _run(tmp_path, "train_text.py", *common, "--max-steps", "6", name="first")
    assert rc == 0, out[-3000:]
    assert re.search(r"train_text: 6 steps in total, \d+ samples this run; padding", out), out
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()

    rc, out = _run(
        tmp_path, "train_text.py", *common, "--max-steps", "9", "--resume", "last", name="resumed"
    )
    assert rc == 0, out[-3000:]
    assert "resumed from" in out and "9 steps in total" in out, out[-3000:]


def test_train_text_resume_without_checkpoint_is_one_line(tmp_path: Path) -> None:
    rc, out = _run(tmp_path, "train_text.py", "--resume", "last", "--workdir", str(tmp_path))
    assert rc == 1
    assert "no checkpoint at" in out and "run once without --resume first" in out


def test_train_vision_writes_pngs_and_trains(tmp_path: Path) -> None:
    data = tmp_path / "digits"
    args = ["--data-dir", str(data), "--max-steps", "4", "--epochs", "1", "--no-progress-bar"]
    rc, out = _run(tmp_path, "train_vision.py", *args)
    assert rc == 0, out[-3000:]
    assert sorted(p.name for p in (data / "train").iterdir()) == [str(d) for d in range(10)]
    pngs = list(data.glob("*/*/*.png"))
    assert len(pngs) == 1797  # every scikit-learn digit, once
    assert "first batch with num_workers=0 vs 2: identical" in out, out[-3000:]
    assert re.search(r"train_vision: 4 steps, val accuracy [\d.]+% on \d+ held-out", out), out


def test_resume_mid_epoch_after_sigkill_is_exact(tmp_path: Path) -> None:
    # 96 samples / 8 = 12 steps per epoch; the default kill is at step 18, mid 2nd epoch.
    args = ["--samples", "96", "--workdir", str(tmp_path / "run")]
    log = tmp_path / "log.txt"
    rc = run_script(EXAMPLES / "resume_mid_epoch.py", args, log, phase="example resume")
    out = log.read_text(errors="replace")
    assert rc == 0, log_tail(log)
    assert "SIGKILL after the step-18 checkpoint" in out
    assert "killed at step 18 of 24 (epoch 1, mid-epoch)" in out
    assert "sample stream   exact" in out and "augmentation    identical" in out


def test_resume_mid_epoch_rejects_a_kill_step_past_the_run(tmp_path: Path) -> None:
    args = ["--samples", "16", "--kill-at", "99", "--workdir", str(tmp_path)]
    rc, out = _run(tmp_path, "resume_mid_epoch.py", *args)
    assert rc == 1 and "--kill-at must be in 1..3" in out and "got 99" in out


def test_resume_mid_epoch_classes_pickle_for_spawned_workers() -> None:
    """Loader workers started with spawn (macOS/Windows) unpickle the dataset by name: the
    example's classes must live at module level, not inside a function."""
    import importlib.util
    import pickle
    import sys

    spec = importlib.util.spec_from_file_location(
        "resume_mid_epoch", EXAMPLES / "resume_mid_epoch.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as spawn's re-import of the script provides it
    try:
        spec.loader.exec_module(module)
        for name in ("NoisyIds", "Data", "Model"):
            assert "<locals>" not in getattr(module, name).__qualname__, name
        dataset = pickle.loads(pickle.dumps(module.NoisyIds(5)))
        assert len(dataset) == 5 and dataset[3]["id"] == 3
        data = module.Data(5, batch_size=2)
        data.setup("fit")
        assert len(pickle.loads(pickle.dumps(data.train_dataset))) == 5
    finally:
        del sys.modules[spec.name]
