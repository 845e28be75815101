"""The main job (``loaderkit demo``) trains, interrupts, resumes exactly and reports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loaderkit.lightning.demo import DemoConfig, StdlibBytes, run_demo
from loaderkit.plan.samplers import BucketBatchSampler


def test_stdlib_blocks_are_variable_length_and_stable() -> None:
    a, b = StdlibBytes(300, max_len=65), StdlibBytes(300, max_len=65)
    lengths = {len(s) for s in a.samples}
    assert a.samples == b.samples
    assert len(a) == 300 and min(lengths) >= 16 and max(lengths) <= 65 and len(lengths) > 20
    sample = a[0]
    assert sample["input_ids"].dtype.is_floating_point is False
    assert sample["labels"][:-1].tolist() == sample["input_ids"][1:].tolist()


def test_stdlib_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_samples must be >= 1, got 0"):
        StdlibBytes(0)
    with pytest.raises(ValueError, match="min_len <= max_len, got 40 and 20"):
        StdlibBytes(10, min_len=40, max_len=20)


def test_demo_resumes_exactly(tmp_path: Path) -> None:
    mine = tmp_path / "checkpoints" / "my-model.ckpt"  # the user's: the demo removed it
    mine.parent.mkdir()
    mine.write_text("keep")
    config = DemoConfig(
        max_samples=160,
        max_len=64,
        batch_size=16,
        num_workers=0,
        progress_bar=False,
        workdir=tmp_path,
    )
    result = run_demo(config)
    assert result.resume_exact and result.repeated == 0 and result.skipped == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints"]  # its own: gone
    assert mine.read_text() == "keep"
    # The demo trains on token-budget buckets: batch counts come from the bucketing plan.
    lengths = [len(s) - 1 for s in StdlibBytes(160, max_len=65).samples]
    plan = BucketBatchSampler(lengths, max_tokens=16 * 64, seed=0).plan
    g0, g1 = plan.epoch_length(0), plan.epoch_length(1)
    assert result.samples == 2 * 160 and result.steps == g0 + g1 < 20
    assert result.interrupted_at == g0 + g1 // 2
    assert result.max_tokens == 16 * 64 and result.batch_size == 16
    assert 0.0 <= result.padded_fraction < result.padded_fraction_random / 2
    summary = result.summary()
    assert "sample stream exact" in summary and "samples/s" in summary
    assert "with random batches of 16 ->" in summary and "with length buckets" in summary


@pytest.mark.slow
def test_cli_demo_runs_as_a_user_would(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "loaderkit.cli.commands",
        "demo",
        "--max-samples",
        "96",
        "--max-len",
        "48",
        "--batch-size",
        "16",
        "--max-tokens",
        "600",
        "--num-workers",
        "2",
        "--no-progress-bar",
        "--workdir",
        str(tmp_path),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaderkit demo summary" in done.stdout
    assert "sample stream exact" in done.stdout
    assert "max_tokens=600" in done.stdout


def test_cli_rejects_bad_arguments_with_one_line(capsys: pytest.CaptureFixture) -> None:
    from loaderkit.cli.commands import main

    for value, said in (("0", "must be >= 1, got 0"), ("abc", "got 'abc'")):
        with pytest.raises(SystemExit) as info:
            main(["demo", "--max-samples", value])
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert f"argument --max-samples: {said}; pass a positive integer" in err, err


def test_a_last_epoch_too_short_to_interrupt_names_the_flags(tmp_path: Path) -> None:
    # It trained the whole run, then said "the demo's interruption did not happen" (hunter 293).
    config = DemoConfig(max_samples=20, num_workers=0, progress_bar=False, workdir=tmp_path)
    with pytest.raises(ValueError, match=r"last epoch has 1 batch.*--max-samples"):
        run_demo(config)
    short = DemoConfig(max_len=10, num_workers=0, progress_bar=False, workdir=tmp_path)
    with pytest.raises(ValueError, match=r"--max-len must be >= 15, got 10"):  # was min_len=
        run_demo(short)
    tight = DemoConfig(max_len=16, max_tokens=4, num_workers=0, workdir=tmp_path)
    with pytest.raises(ValueError, match=r"--max-tokens must be >= --max-len \(16\).*got 4"):
        run_demo(tight)  # it told oversize=, which the command has no flag for (hunter 314)
