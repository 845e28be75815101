"""``loaderkit bench`` and ``loaderkit inspect``, run as a user runs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from loaderkit.cli.bench import QUICK_ARGS, REPORT_ENV, Ratio, discover, find_benchmarks, report
from loaderkit.cli.commands import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def loaderkit(
    *args: str, cwd: Path = REPO_ROOT, timeout: float = 240
) -> subprocess.CompletedProcess:
    """``loaderkit ARGS`` in a fresh interpreter (stdout/stderr captured, no progress bar)."""
    return subprocess.run(
        [sys.executable, "-m", "loaderkit.cli.commands", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"},
    )


# ------------------------------------------------------------------ bench
def test_bench_quick_prints_ratio_tables_and_writes_png_and_md(tmp_path: Path) -> None:
    done = loaderkit("bench", "--quick", "--only", "collate", "transfer", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "## collate" in done.stdout and "## transfer" in done.stdout
    assert "| ratio | value | goal | |" in done.stdout
    assert "| PadCollate / pad_sequence, uniform |" in done.stdout
    assert "CPU: DevicePrefetcher(cpu) / plain loop" in done.stdout
    png = (tmp_path / "results.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert not (tmp_path / "results.md").exists()
    md = (tmp_path / "results-table.md").read_text()
    assert "## collate" in md and "## transfer" in md and ">= 1.00x" in md
    assert "python benchmarks/collate/bench.py --repeats 3" in md  # the quick command, shown
    assert "<details><summary>full output</summary>" in md


def test_bench_outputs_never_clobber_the_curated_results_on_case_insensitive_disks() -> None:
    """macOS and Windows fold case by default: the table written into benchmarks/ by default
    must not be benchmarks/RESULTS.md, the hand-curated results file, under any casing."""
    from loaderkit.cli.bench import MARKDOWN_NAME, PLOT_NAME

    curated = find_benchmarks() / "RESULTS.md"
    assert curated.is_file()  # the file this guards
    for written in (MARKDOWN_NAME, PLOT_NAME):
        assert written.casefold() != curated.name.casefold()


@pytest.mark.parametrize("command", [[], ["demo"], ["bench"], ["inspect"]])
def test_help_is_plain_text(command: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert "usage: loaderkit" in out and "``" not in out and ":mod:" not in out, out


def test_bench_unknown_name_is_one_line_with_the_choices(capsys: pytest.CaptureFixture) -> None:
    assert main(["bench", "--only", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "no bench named 'nope'" in err and "choose from autoworkers, bucketing, collate" in err


def test_find_benchmarks_outside_a_checkout_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no benchmarks/<name>/bench.py in .* run"):
        find_benchmarks(tmp_path, installed_checkout=False)
    assert find_benchmarks(REPO_ROOT / "loaderkit") == REPO_ROOT / "benchmarks"
    # Outside it, the editable checkout's (it looked in loaderkit/benchmarks, never there).
    assert find_benchmarks(tmp_path) == REPO_ROOT / "benchmarks"


def test_every_bench_has_quick_args_and_reports() -> None:
    names = [p.parent.name for p in discover(REPO_ROOT / "benchmarks")]
    assert names and sorted(names) == sorted(QUICK_ARGS)
    for name in names:  # each bench hands its ratios to `loaderkit bench`
        assert "report(" in (REPO_ROOT / "benchmarks" / name / "bench.py").read_text(), name


def test_report_writes_only_under_loaderkit_bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ratios = [Ratio("a / b", 2.0, goal=1.0), Ratio("padded", 4.0, 3.0, False, "%")]
    monkeypatch.delenv(REPORT_ENV, raising=False)
    report(ratios)  # run by hand: nothing written, nothing raised
    out = tmp_path / "r.json"
    monkeypatch.setenv(REPORT_ENV, str(out))
    report(ratios)
    back = [Ratio(**r) for r in json.loads(out.read_text())]
    assert back == ratios
    assert [r.met for r in back] == [True, False]
    assert [r.goal_text() for r in back] == [">= 1.00x", "<= 3.00%"]
    assert Ratio("shards per batch", 8.0, 4.0, unit="shards").goal_text() == ">= 4.00 shards"


# ---------------------------------------------------------------- inspect
def flat(report: str) -> str:
    """The report with its wrapped rows joined (a row continues 19 columns in)."""
    return re.sub(r"\n {19}(?=\S)", " ", report)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's folder: a tensor file, a YAML config and a module with a factory."""
    torch.save((torch.randn(1000, 8), torch.randint(0, 2, (1000,))), tmp_path / "data.pt")
    (tmp_path / "config.yaml").write_text(
        textwrap.dedent(
            """\
            trainer: {max_epochs: 1}
            data:
              class_path: loaderkit.lightning.datamodules.TensorDataModule
              init_args: {train: data.pt, batch_size: 64, val_fraction: 0.1}
            """
        )
    )
    (tmp_path / "mydata.py").write_text(
        textwrap.dedent(
            """\
            import lightning as L
            import torch
            from loaderkit.lightning.datamodules import SequenceDataModule

            def make():
                seqs = [torch.ones(n % 50 + 1, dtype=torch.long) for n in range(400)]
                return SequenceDataModule(seqs, batch_size=16, bucket=True)

            class Plain(L.LightningDataModule):
                def train_dataloader(self):
                    return torch.utils.data.DataLoader(list(range(100)), batch_size=10)

            class Two(L.LightningDataModule):
                def train_dataloader(self):
                    from loaderkit import ResumableDataLoader
                    a, b = list(range(1000)), list(range(300))
                    return {"a": ResumableDataLoader(a, batch_size=10),
                            "b": ResumableDataLoader(b, batch_size=10)}
            """
        )
    )
    return tmp_path


def test_inspect_yaml_config(project: Path) -> None:
    done = loaderkit(
        "inspect", "config.yaml", "--max-workers", "1", "--world-size", "2", cwd=project
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = flat(done.stdout)
    assert "loaderkit inspect: TensorDataModule (from config.yaml)" in out
    assert "samples          train 900, val 100" in out
    assert "per rank at world size 2: train 8, val 1" in out  # ceil(900 / 64 / 2), ceil(100/128)
    assert re.search(r"samples/s  after start-up, by num_workers: 0: [\d,]+, 1: [\d,]+", out), out
    startup = r"start-up         to every worker's first batch: 0: [\d.]+ s, 1: [\d.]+ s"
    assert re.search(startup, out), out
    assert re.search(r"num_workers      suggested [01] ", out), out
    # The probe's in-process rate as the data wait a training step would see.
    assert re.search(
        r"data wait        in-process loading takes [\d.]+ ms per train batch: "
        r"a training step shorter than [\d.]+ ms would wait > 10%",
        out,
    ), out
    assert "exact resume     yes:" in out


def test_inspect_report_fits_a_terminal_and_says_each_row_once(project: Path) -> None:
    """Lines of at most 100 columns (the resume verdict was one 620-character line), and
    the probe's rates once (the module's own probe also logged them)."""
    done = loaderkit("inspect", "mydata:make", "--max-workers", "1", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert max(map(len, lines)) <= 100, "\n".join(x for x in lines if len(x) > 100)
    assert (done.stdout + done.stderr).count("samples/s") == 1, done.stdout + done.stderr
    verdict = next(i for i, line in enumerate(lines) if line.startswith("  exact resume "))
    assert lines[verdict + 1].startswith(" " * 19), lines  # continued under the value column


def test_inspect_times_workers_after_their_start_up() -> None:
    """A loader whose workers take 0.5 s to start but then load at once: the start-up is
    reported apart, and the rate is that of the loading (it was the start-up's, 74/s).
    The one timing of a loader: ``loaderkit inspect`` and ``probe_num_workers`` share it."""
    import time

    from loaderkit.cli import inspect
    from loaderkit.lightning.datamodules import base
    from loaderkit.lightning.datamodules._util import time_loader

    assert not hasattr(inspect, "_time_loader") and not hasattr(base, "time_loader")

    class SlowStart:
        def __iter__(self):
            for i in range(100):
                if i < 2:  # each of 2 workers' first batch pays its process start
                    time.sleep(0.25)
                yield torch.zeros(10, 1)

    startup, rate = time_loader(SlowStart(), first=2, budget_s=0.1)
    assert startup >= 0.5
    assert rate > 1000  # 98 ready batches of 10 rows: no start-up inside the rate


def test_inspect_module_factory(project: Path) -> None:
    done = loaderkit("inspect", "mydata:make", "--max-workers", "0", cwd=project)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SequenceDataModule (from mydata:make)" in done.stdout
    assert "samples          train 400" in done.stdout
    assert "per rank at world size 1: train 25 " in done.stdout  # 400 / 16
    assert re.search(r"padding          \d+\.\d% of train tokens", done.stdout), done.stdout


@pytest.mark.parametrize(
    ("module", "said"),
    [
        ("Plain", ["samples          train 100", "train 10 (epoch 0)", "num_workers      not "
                   "probed", "exact resume     NO: train_dataloader() returns a DataLoader"]),
        # A dict of loaders read as "train 2" batches (its len) and "NO: returns a dict";
        # Lightning combines them, each resuming at its own position (hunter 293).
        ("Two", ["samples          train unknown", "train unknown (epoch 0)",
                 "exact resume     yes: train_dataloader() returns a dict of 2 loaders"]),
    ],
)  # fmt: skip
def test_inspect_a_plain_lightning_module(
    module: str,
    said: list[str],
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    monkeypatch.chdir(project)
    assert main(["inspect", f"mydata.py:{module}", "--no-progress-bar"]) == 0
    out = flat(capsys.readouterr().out)
    assert all(part in out for part in said), out


def test_inspect_counts_the_samples_a_sampler_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # Was: "samples train 100" (the dataset) beside 2 batches of 5.
    (tmp_path / "part.py").write_text(
        textwrap.dedent(
            """\
            import lightning as L, torch
            from torch.utils.data import SubsetRandomSampler
            from loaderkit import ResumableDataLoader, TensorDataset

            class Part(L.LightningDataModule):
                def train_dataloader(self):
                    sampler = SubsetRandomSampler(range(10))
                    data = TensorDataset(torch.arange(100))
                    return ResumableDataLoader(data, batch_size=5, sampler=sampler, seed=0)

            class Buckets(L.LightningDataModule):  # a plan whose positions count batches
                def train_dataloader(self):
                    from loaderkit import BucketBatchSampler
                    sampler = BucketBatchSampler(torch.full((100,), 3), batch_size=5, seed=0)
                    data = TensorDataset(torch.arange(100))
                    return ResumableDataLoader(data, batch_sampler=sampler)
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", "part.py:Part", "--no-progress-bar", "--max-workers", "0"]) == 0
    out = flat(capsys.readouterr().out)
    assert "samples          train 10" in out and "train 2 (epoch 0)" in out
    assert main(["inspect", "part.py:Buckets", "--no-progress-bar", "--max-workers", "0"]) == 0
    out = flat(capsys.readouterr().out)
    assert "samples          train 100" in out and "train 20 (epoch 0)" in out


@pytest.fixture
def stream_project(tmp_path: Path) -> Path:
    """A user's folder with 160 token samples in two shards and streaming DataModules."""
    import numpy as np

    from loaderkit import TokenReader, write_shards

    write_shards(tmp_path / "shards", [np.arange(400), np.arange(240)], TokenReader(seq_len=4))
    (tmp_path / "streams.py").write_text(
        textwrap.dedent(
            """\
            import lightning as L
            from loaderkit import ResumableDataLoader, StreamingShardedDataset, TokenReader
            from loaderkit.lightning.datamodules import ShardedDataModule

            def one_pass():
                return ShardedDataModule("shards", seq_len=4, batch_size=8, streaming=True)

            def limited():
                return ShardedDataModule(
                    "shards", seq_len=4, batch_size=8, streaming=True, samples_per_epoch=160
                )

            def auto_workers():  # refused by train_dataloader(): inspect says so too
                return ShardedDataModule(
                    "shards", seq_len=4, batch_size=8, streaming=True, num_workers="auto"
                )

            def two_steps(num_workers=0):
                return ShardedDataModule(
                    "shards", seq_len=4, batch_size=8, streaming=True, steps_per_epoch=2,
                    num_workers=num_workers,
                )

            def two_steps_three_workers():
                return two_steps(num_workers=3)

            def planned(mix_shards=2):
                return ShardedDataModule("shards", seq_len=4, batch_size=8, mix_shards=mix_shards)

            def one_at_a_time():
                return planned(mix_shards=1)

            class Plain(L.LightningDataModule):
                def train_dataloader(self):
                    reader = TokenReader(seq_len=4)
                    ds = StreamingShardedDataset("shards", reader, steps_per_epoch=20)
                    return ResumableDataLoader(ds, batch_size=8, seed=0)
            """
        )
    )
    return tmp_path


def test_inspect_probes_a_stream_with_no_more_workers_than_steps(
    stream_project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """More workers than steps per epoch is refused at the first batch: the probe stops at
    the steps (it raised at 3 workers), and a module asking for more is reported refused."""
    monkeypatch.chdir(stream_project)
    assert main(["inspect", "streams.py:two_steps", "--max-workers", "3", "--no-progress-bar"]) == 0
    out = flat(capsys.readouterr().out)
    assert "by num_workers: 0:" in out and "2:" in out and " 3:" not in out, out
    target = "streams.py:two_steps_three_workers"
    assert main(["inspect", target, "--max-workers", "0", "--no-progress-bar"]) == 0
    out = flat(capsys.readouterr().out)
    assert "train refused (2 steps per epoch are fewer than num_workers=3" in out, out


@pytest.mark.parametrize(
    ("target", "args", "batches", "elastic"),
    [
        ("streams.py:Plain", [], "train 20 (epoch 0)", False),
        ("streams.py:one_pass", [], "train unknown (one pass, length unknown) (epoch 0)", True),
        ("streams.py:limited", ["--world-size", "2"], "world size 2: train 10 (epoch 0)", False),
        (
            "streams.py:auto_workers",
            [],
            "train refused (ShardedDataModule: num_workers='auto'",
            True,
        ),
    ],
)
def test_inspect_streams_reports_their_epoch_and_resume_topology(
    stream_project: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    target: str,
    args: list[str],
    batches: str,
    elastic: bool,
) -> None:
    """A stream's loader carries a one-sample stand-in plan: the batches come from its
    steps_per_epoch / samples_per_epoch (160 / (2 ranks * 8) = 10), or are unknown."""
    monkeypatch.chdir(stream_project)
    assert main(["inspect", target, "--max-workers", "0", "--no-progress-bar", *args]) == 0
    out = flat(capsys.readouterr().out)
    assert batches in out, out
    assert "samples          train unknown" in out, out
    assert "exact resume     yes: the train loader streams a StreamingShardedDataset" in out
    assert "exact only under the same world size and num_workers" in out
    assert "elastic resume needs sample counts" in out
    assert ("ElasticResume" in out) is elastic  # the installed entry point adds it, or add it


def test_load_object_from_a_file_never_shadows_a_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``loaderkit inspect ./yaml.py:make`` must not replace the real yaml for the process."""
    import yaml

    from loaderkit.cli.inspect import load_object

    (tmp_path / "yaml.py").write_text("def make():\n    return 'mine'\n")
    monkeypatch.chdir(tmp_path)
    names = set()
    for _ in range(2):
        make = load_object("./yaml.py:make")
        assert make() == "mine"
        assert sys.modules["yaml"] is yaml and yaml.safe_load("a: 1") == {"a": 1}
        assert make.__module__.startswith("_loaderkit_inspect_yaml_")
        assert sys.modules[make.__module__].make is make
        names.add(make.__module__)
    assert len(names) == 2  # loaded again: a fresh module beside the first, not over it
    # A file that imports as itself (its folder on sys.path) keeps its name: classes in
    # it pickle by name into workers started with spawn.
    (tmp_path / "lk_inspect_own_name.py").write_text("def make():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lk_inspect_own_name", raising=False)
    own = load_object(f"{tmp_path}/lk_inspect_own_name.py:make")
    assert own.__module__ == "lk_inspect_own_name" and own() == 1
    for name in names:
        del sys.modules[name]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("missing.yaml", "no config file 'missing.yaml'; pass a LightningCLI YAML config"),
        ("no_such_module:make", "cannot import 'no_such_module'"),
        ("mydata:nope", "'mydata' has no attribute 'nope'"),
        ("mydata", "don't know how to read 'mydata'"),
    ],
)
def test_inspect_bad_target_is_one_line_exit_2(
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    target: str,
    message: str,
) -> None:
    monkeypatch.chdir(project)
    assert main(["inspect", target]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("loaderkit inspect: error: ")
    assert message in err and "(run with --debug for the traceback)" in err


def test_inspect_bad_path_as_a_user_sees_it(project: Path) -> None:
    done = loaderkit("inspect", "does/not/exist.yaml", cwd=project)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "no config file 'does/not/exist.yaml'" in done.stderr


def test_debug_shows_the_traceback(project: Path) -> None:
    done = loaderkit("inspect", "mydata:nope", "--debug", cwd=project)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr
    assert "ImportError: 'mydata' has no attribute 'nope'" in done.stderr


def test_config_without_class_path_names_the_key(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    (project / "bad.yaml").write_text("data:\n  init_args: {batch_size: 4}\n")
    monkeypatch.chdir(project)
    with pytest.raises(ValueError, match="no class_path under 'data' or at the top level"):
        main(["--debug", "inspect", "bad.yaml"])


def test_quick_or_partial_bench_runs_never_replace_the_committed_full_run(tmp_path: Path) -> None:
    from loaderkit.cli.commands import bench_output_dir

    bench = tmp_path / "benchmarks"
    assert bench_output_dir(bench, quick=False, only=None, out=None) == bench
    for quick, only in ((True, None), (False, ["collate"]), (True, ["loader"])):
        assert bench_output_dir(bench, quick=quick, only=only, out=None) == (
            tmp_path / "runs" / "bench"
        )
    assert bench_output_dir(bench, quick=True, only=None, out=tmp_path / "x") == tmp_path / "x"


def test_inspect_counts_a_torch_loader_over_an_iterable_as_unknown() -> None:
    """DataLoader has __len__ even when its IterableDataset has no length."""
    from torch.utils.data import DataLoader, IterableDataset

    from loaderkit.cli.inspect import _steps

    class Feed(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(10))

    assert _steps(DataLoader(Feed(), batch_size=4), 1) is None
    assert _steps(DataLoader(list(range(10)), batch_size=4), 1) == 3


@pytest.mark.parametrize(
    ("target", "line"),
    [
        # Shards of 100 and 60 samples, 2 lanes of 80: the larger shard fills a lane and a
        # quarter of the next, so a quarter of the batches of 8 read it in both lanes.
        ("streams.py:planned", "shards / batch   1.75 on average, 25.0% of train batches"),
        # One shard at a time: one batch of the 20 straddles the two shards.
        ("streams.py:one_at_a_time", "shards / batch   1.05 on average, 95.0% of train batches"),
    ],
)
def test_inspect_reports_shards_per_batch_next_to_padding(
    stream_project: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    target: str,
    line: str,
) -> None:
    monkeypatch.chdir(stream_project)
    assert main(["inspect", target, "--max-workers", "0", "--no-progress-bar"]) == 0
    out = flat(capsys.readouterr().out)
    assert "padding          0.0% of train tokens\n  " + line in out, out
    assert "from a single shard (epoch 0, all ranks)" in out
    main(["inspect", "streams.py:limited", "--max-workers", "0", "--no-progress-bar"])
    assert "shards / batch" not in flat(capsys.readouterr().out)  # a stream: not known


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        ("- a\n- b\n", ValueError, r"expected a mapping at the top, got list; write data:"),
        # Hunter 314: neither named the file, the second the module's class nor the key path.
        ("data: [1, 2\n", ValueError, r"bad\.yaml: not valid YAML at line 2 \(expected .*\); fix"),
        (
            "data:\n  class_path: loaderkit.SequenceDataModule\n  init_args: {batch_sizee: 4}\n",
            TypeError,
            r"data \(loaderkit\.SequenceDataModule\): .*'batch_sizee'; check the names in data",
        ),
        (
            "data:\n  class_path: loaderkit.ShardedDataModule\n  init_args: {shard: x}\n",
            TypeError,
            r"data \(loaderkit\.ShardedDataModule\): .*missing .*'shards'; check the names in",
        ),
        (
            "data:\n  class_path: mydata.make\n  init_args: [1, 2]\n",
            ValueError,
            r"init_args must be a mapping, got list; write init_args: \{name: value",
        ),
    ],
)
def test_config_errors_name_the_fix(
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
    config: str,
    error: type[Exception],
    message: str,
) -> None:
    (project / "bad.yaml").write_text(config)
    monkeypatch.chdir(project)
    with pytest.raises(error, match=message):
        main(["--debug", "inspect", "bad.yaml"])


def test_inspect_target_that_is_not_callable_names_the_fix(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "consts.py").write_text("VALUE = 3\n")
    monkeypatch.chdir(project)
    with pytest.raises(TypeError, match=r"consts:VALUE is a int, not a class or factory; point"):
        main(["--debug", "inspect", "consts:VALUE"])


def test_inspect_world_size_and_step_arguments_name_the_fix(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(project)
    with pytest.raises(SystemExit):
        main(["inspect", "config.yaml", "--world-size", "0"])
    assert "must be >= 1, got 0; pass a positive integer" in capsys.readouterr().err


def test_inspect_counts_shards_per_batch_over_the_ranks_asked_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Hunter 337: --world-size 3 printed one rank's shards per batch (2.40, 10.0%), beside
    # batches per rank counted for 3.
    import numpy as np

    from loaderkit import ShardedDataset, TokenReader, write_shards

    sizes = (800, 88, 0, 333)
    shards = [np.arange(n, dtype=np.uint16) for n in sizes]
    write_shards(tmp_path / "npy", shards, TokenReader(seq_len=16), progress=False)
    make = f"def dm():\n    return ShardedDataModule({str(tmp_path / 'npy')!r}, seq_len=16, "
    make += "batch_size=8, num_workers=0, seed=0)\n"
    (tmp_path / "fac.py").write_text("from loaderkit import ShardedDataModule\n" + make)
    args = ["--max-workers", "0", "--world-size", "3", "--no-progress-bar"]
    assert main(["inspect", f"{tmp_path / 'fac.py'}:dm", *args]) == 0
    ds = ShardedDataset(tmp_path / "npy", TokenReader(seq_len=16))
    ends, kinds = np.cumsum(ds.sizes), []
    for rank in range(3):
        for batch in ds.batch_sampler(8, seed=0, rank=rank, world_size=3):
            kinds.append(len(set(np.searchsorted(ends, batch, side="right").tolist())))
    mean, single = sum(kinds) / len(kinds), kinds.count(1) / len(kinds)
    assert f"shards / batch   {mean:.2f} on average, {single:.1%}" in capsys.readouterr().out
