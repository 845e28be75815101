"""The runnable examples in ``examples/`` work, run as a user runs them (short settings).

Each runs in an empty working folder with ``--out`` pointing elsewhere: an example
writes only under its output folder, so the working folder stays empty.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.helpers import REPO_ROOT, run_script

EXAMPLES = REPO_ROOT / "examples"


def _run(tmp_path: Path, script: str, *args: str, name: str = "log") -> tuple[int, str]:
    log = tmp_path / f"{name}.txt"
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    rc = run_script(EXAMPLES / script, list(args), log, phase=f"example {script}", cwd=cwd)
    assert not list(cwd.iterdir()), f"{script} wrote outside --out: {list(cwd.iterdir())}"
    return rc, log.read_text(errors="replace")


@pytest.fixture
def example(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """The example module ``request.param`` (a file stem), imported as spawn would."""
    spec = importlib.util.spec_from_file_location(request.param, EXAMPLES / f"{request.param}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_every_example_writes_under_its_own_out_folder() -> None:
    """Each script names one output folder, runs/<its name>, changed by --out."""
    scripts = sorted(EXAMPLES.glob("*.py"))
    assert len(scripts) >= 6
    for script in scripts:
        text = script.read_text()
        if script.stem == "train_cli":  # LightningCLI: the configs' trainer.default_root_dir
            for config in ("parquet_cli", "mix_cli"):
                yaml = (EXAMPLES / f"{config}.yaml").read_text()
                assert f"default_root_dir: runs/{config}" in yaml, config
            continue
        assert '"--out"' in text, script.name
        assert f'default=Path("runs/{script.stem}")' in text, script.name


def test_train_text_trains_then_resumes_from_last(tmp_path: Path) -> None:
    common = ["--max-samples", "200", "--max-len", "48", "--max-tokens", "512"]
    common += ["--num-workers", "0", "--ckpt-every", "4", "--no-progress-bar"]
    common += ["--out", str(tmp_path / "run")]
    rc, out = _run(tmp_path, "train_text.py", *common, "--max-steps", "6", name="first")
    assert rc == 0, out[-3000:]
    assert re.search(r"train_text: 6 steps in total, \d+ samples this run; padding", out), out
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()

    # last.ckpt is the step-6 end of the run, not the step-4 periodic checkpoint.
    rc, out = _run(
        tmp_path, "train_text.py", *common, "--max-steps", "9", "--resume", "last", name="resumed"
    )
    assert rc == 0, out[-3000:]
    assert "resumed from" in out and "9 steps in total" in out, out[-3000:]
    assert re.search(r"9 steps in total, \d+ samples this run", out), out[-3000:]


@pytest.mark.parametrize("example", ["train_text"], indirect=True)
def test_train_text_after_a_finished_run_has_nothing_left_and_reruns_afresh(
    example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--resume last after a finished run says so (it re-trained the steps after the last
    periodic checkpoint); a second run without --resume starts afresh."""
    common = ["--max-samples", "100", "--max-len", "32", "--max-tokens", "256", "--epochs", "1"]
    common += ["--num-workers", "0", "--ckpt-every", "5", "--no-progress-bar"]
    common += ["--out", str(tmp_path / "run")]
    assert example.main(common) == 0
    first = capsys.readouterr().out
    steps = int(re.search(r"train_text: (\d+) steps in total", first).group(1))  # type: ignore[union-attr]
    assert steps % 5, f"{steps} steps: the run must end between two periodic checkpoints"

    assert example.main([*common, "--resume", "last"]) == 0
    out = capsys.readouterr().out
    assert f"nothing left to train: {tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}" in out, out
    assert f"finished run (step {steps}," in out and "samples this run" not in out, out

    assert example.main(common) == 0  # twice in a row
    out = capsys.readouterr().out
    assert "a new run: removed the previous run's checkpoints" in out, out
    assert f"train_text: {steps} steps in total" in out, out


@pytest.mark.parametrize("example", ["train_text"], indirect=True)
def test_train_text_cut_by_max_steps_in_its_last_epoch_resumes_the_rest(
    example: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # last.ckpt was rewritten at the cut epoch's end, which Lightning restores as done:
    # "nothing left to train", and the epoch's other batches never trained (hunter 293).
    common = ["--max-samples", "100", "--max-len", "32", "--max-tokens", "256", "--epochs", "1"]
    common += ["--num-workers", "0", "--ckpt-every", "50", "--no-progress-bar"]
    assert example.main([*common, "--out", str(tmp_path / "whole")]) == 0
    steps = int(re.search(r"(\d+) steps in total", capsys.readouterr().out).group(1))  # type: ignore[union-attr]
    cut = [*common, "--out", str(tmp_path / "cut")]
    assert example.main([*cut, "--max-steps", "3"]) == 0
    assert example.main([*cut, "--resume", "last"]) == 0
    out = capsys.readouterr().out
    assert f"{steps} steps in total, " in out and "nothing left" not in out, out


def test_train_text_resume_without_checkpoint_is_one_line(tmp_path: Path) -> None:
    rc, out = _run(tmp_path, "train_text.py", "--resume", "last", "--out", str(tmp_path))
    assert rc == 1
    assert "no checkpoint at" in out and "run once without --resume first" in out
    assert "(checkpoints go to --out/checkpoints)" in out


def test_train_vision_writes_pngs_and_trains(tmp_path: Path) -> None:
    data = tmp_path / "run" / "digits"  # the default: under --out
    args = ["--out", str(tmp_path / "run"), "--max-steps", "4", "--epochs", "1"]
    args += ["--no-progress-bar"]
    rc, out = _run(tmp_path, "train_vision.py", *args)
    assert rc == 0, out[-3000:]
    assert sorted(p.name for p in (data / "train").iterdir()) == [str(d) for d in range(10)]
    pngs = list(data.glob("*/*/*.png"))
    assert len(pngs) == 1797  # every scikit-learn digit, once
    assert "first batch with num_workers=0 vs 2: identical" in out, out[-3000:]
    assert re.search(r"train_vision: 4 steps, val accuracy [\d.]+% on \d+ held-out", out), out


def test_resume_mid_epoch_after_sigkill_is_exact(tmp_path: Path) -> None:
    # 96 samples / 8 = 12 steps per epoch; the default kill is at step 18, mid 2nd epoch.
    args = ["--samples", "96", "--out", str(tmp_path / "run")]
    rc, out = _run(tmp_path, "resume_mid_epoch.py", *args)
    assert rc == 0, out[-4000:]
    assert "SIGKILL after the step-18 checkpoint" in out
    assert "killed at step 18 of 24 (epoch 1, mid-epoch)" in out
    assert "sample stream   exact" in out and "augmentation    identical" in out


def test_resume_mid_epoch_rejects_a_kill_step_past_the_run(tmp_path: Path) -> None:
    args = ["--samples", "16", "--kill-at", "99", "--out", str(tmp_path)]
    rc, out = _run(tmp_path, "resume_mid_epoch.py", *args)
    assert rc == 1 and "--kill-at must be in 1..3" in out and "got 99" in out


@pytest.mark.parametrize("example", ["resume_mid_epoch"], indirect=True)
def test_resume_mid_epoch_classes_pickle_for_spawned_workers(example: ModuleType) -> None:
    """Loader workers started with spawn (macOS/Windows) unpickle the dataset by name: the
    example's classes must live at module level, not inside a function."""
    import pickle

    for name in ("NoisyIds", "Data", "Model"):
        assert "<locals>" not in getattr(example, name).__qualname__, name
    dataset = pickle.loads(pickle.dumps(example.NoisyIds(5)))
    assert len(dataset) == 5 and dataset[3]["id"] == 3
    data = example.Data(5, batch_size=2)
    data.setup("fit")
    assert len(pickle.loads(pickle.dumps(data.train_dataset))) == 5


@pytest.mark.parametrize("example", ["train_cli"], indirect=True)
def test_cli_configs_run_twice_and_one_after_the_other(
    example: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two LightningCLI configs from one folder, as documented: mix after parquet
    failed (SaveConfigCallback: config.yaml exists), and both left files in the folder."""
    pytest.importorskip("pyarrow")
    monkeypatch.chdir(tmp_path)
    example.main(["make-data"])
    example.main(["make-mix"])
    quick = ["--trainer.max_steps=10", "--trainer.accelerator=cpu"]  # a step checkpoint
    quick += ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    for config in ("parquet_cli", "mix_cli", "parquet_cli"):
        example.main(["fit", f"--config={EXAMPLES / config}.yaml", *quick])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
    for config in ("parquet_cli", "mix_cli"):
        run = tmp_path / "runs" / config
        assert (run / "config.yaml").is_file() and list(run.glob("data/**/*.parquet")), config
        assert list(run.rglob("*.ckpt")), config
