"""Where ResumableDataLoader kept torch's DataLoader contract only loosely (issue 21).

Measured on 84cc6ec: an error in one batch ended the epoch and could not be
caught as the dataset's own exception type; assigning ``dataset``/``batch_size``/
``sampler``/``drop_last`` after construction was silently ignored; a
half-consumed iterator left at interpreter exit printed tracebacks; string keys
as a sampler were a raw ``int()`` error; the worker-count warning printed twice
per epoch and the pin_memory warning named a loaderkit line; a batch of nested
tensors crashed the worker transport; ``batch_size=None`` with a sampler of
index lists was a bare ``TypeError``.
"""

from __future__ import annotations

import functools
import re
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, TensorDataset

from loaderkit import (
    IterableReader,
    PlanBatchSampler,
    ResumableDataLoader,
    SamplePlan,
    StreamingShardedDataset,
    WorkerError,
)
from loaderkit.env import cpu_budget
from tests.support.helpers import REPO_ROOT, run_script


# ----------------------------------------------- point 10: an error in one batch
class MissingKey(Dataset[int]):
    """Ten samples; sample 3 raises KeyError (a record missing from its store)."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> int:
        if index == 3:
            raise KeyError(f"record {index}")
        return index


def catching_loop(loader: Any) -> tuple[list[Any], list[BaseException]]:
    """What a loop that catches ``KeyError`` and asks again sees, in order."""
    seen: list[Any] = []
    errors: list[BaseException] = []
    it = iter(loader)
    while True:
        try:
            seen.append(next(it).tolist())
        except StopIteration:
            return seen, errors
        except KeyError as error:
            seen.append("KeyError")
            errors.append(error)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_a_batch_is_the_datasets_type_and_the_epoch_goes_on(
    num_workers: int,
) -> None:
    want = [[0, 1], "KeyError", [4, 5], [6, 7], [8, 9]]
    assert catching_loop(DataLoader(MissingKey(), batch_size=2, num_workers=num_workers))[0] == want
    loader = ResumableDataLoader(MissingKey(), batch_size=2, num_workers=num_workers)
    seen, errors = catching_loop(loader)
    assert seen == want
    (error,) = errors
    assert isinstance(error, WorkerError) and error.index == 3
    assert re.search(r"sample index 3\b.*KeyError", str(error))
    # The original traceback: chained in-process, as text from a worker (as torch sends it).
    if num_workers == 0:
        assert isinstance(error.__cause__, KeyError)
        frames = traceback.extract_tb(error.__cause__.__traceback__)
        assert frames[-1].name == "__getitem__"
    else:
        assert "Original Traceback" in str(error)
        assert 'raise KeyError(f"record {index}")' in str(error)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_batch_that_failed_counts_as_handed_out(num_workers: int) -> None:
    loader = ResumableDataLoader(MissingKey(), batch_size=2, num_workers=num_workers, seed=0)
    it = iter(loader)
    next(it)
    with pytest.raises(KeyError, match="record 3"):
        next(it)
    state = loader.state_dict()
    del it
    resumed = ResumableDataLoader(MissingKey(), batch_size=2, num_workers=num_workers, seed=0)
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == [[4, 5], [6, 7], [8, 9]]


def _missing_three(sample: int) -> int:
    if sample == 3:
        raise KeyError(f"record {sample}")
    return sample


def _read_range(shard: tuple[int, int]) -> Any:
    yield from range(*shard)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_error_in_a_streams_transform_is_raised_and_its_epoch_goes_on(
    num_workers: int,
) -> None:
    # Was: the transform's raise closed the slot's generator, so the epoch ended there (a
    # catching loop lost the 6 samples after it) and a state saved then retried the batch.
    def loader() -> ResumableDataLoader:
        dataset = StreamingShardedDataset(
            [(0, 5), (5, 10)], IterableReader(_read_range), transform=_missing_three
        )
        return ResumableDataLoader(
            dataset, batch_size=2, num_workers=num_workers, seed=0, shuffle=False
        )

    first = loader()
    seen, errors = catching_loop(first)
    ids = [i for batch in seen if batch != "KeyError" for i in batch]
    (error,) = errors
    assert isinstance(error, WorkerError) and "sample 3 of shard" in str(error)
    assert len(set(ids)) == len(ids) == 8 and 3 not in ids  # only the failed batch is missing
    at = seen.index("KeyError")
    # A state saved just after the error goes on after the failed batch, as map-style does.
    second = loader()
    it = iter(second)
    for _ in range(at):
        next(it)
    with pytest.raises(KeyError, match="record 3"):
        next(it)
    state = second.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == seen[at + 1 :]


# -------------------------------------- point 12: attributes fixed after construction
@pytest.mark.parametrize(
    "name", ["dataset", "batch_size", "sampler", "batch_sampler", "drop_last", "persistent_workers"]
)
def test_assigning_what_the_plan_was_built_from_is_refused(name: str) -> None:
    loader = ResumableDataLoader(list(range(8)), batch_size=2)
    torch_loader = DataLoader(list(range(8)), batch_size=2)
    with pytest.raises(ValueError, match="should not be set after DataLoader is initialized"):
        setattr(torch_loader, name, {})
    before = getattr(loader, name)
    with pytest.raises(
        ValueError,
        match=f"{name} cannot be set after the loader is built, got {name}=.*build a new "
        f"ResumableDataLoader with {name}= passed to the constructor",
    ):
        setattr(loader, name, {})
    assert getattr(loader, name) is before


def times_100(batch: list[int]) -> torch.Tensor:
    return torch.tensor(batch) * 100


ASSIGNED = {
    "collate_fn": times_100,
    "timeout": 5,
    "generator": torch.Generator(),
    "multiprocessing_context": "spawn",
    "prefetch_factor": 4,
    "pin_memory": True,
    "num_workers": 1,
    "pin_memory_device": "cuda",
    "in_order": False,
}


@pytest.mark.parametrize("name", sorted(ASSIGNED))
def test_assigning_what_the_workers_were_built_from_is_refused(name: str) -> None:
    # Accepted and then ignored (torch honours a new collate_fn at the next iter()).
    value = ASSIGNED[name]
    if name == "collate_fn":
        torch_loader = DataLoader(list(range(8)), batch_size=2)
        torch_loader.collate_fn = value
        assert next(iter(torch_loader)).tolist() == [0, 100]
    loader = ResumableDataLoader(list(range(8)), batch_size=2, num_workers=2)
    before = getattr(loader, name)
    with pytest.raises(
        ValueError,
        match=f"{name} cannot be set after the loader is built, got {name}=.*build a new "
        f"ResumableDataLoader with {name}= passed to the constructor",
    ):
        setattr(loader, name, value)
    assert getattr(loader, name) is before
    assert next(iter(loader)).tolist() == [0, 1]


# ------------------------------------- point 13: a half-consumed iterator at exit
HALF_CONSUMED = """
import sys
import torch
from torch.utils.data import IterableDataset
from loaderkit import ResumableDataLoader

class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(1000))

kind = sys.argv[1]
data = Stream() if kind == "iterable" else list(range(1000))
extra = {"persistent_workers": True} if kind == "persistent" else {}
loader = ResumableDataLoader(data, batch_size=4, num_workers=2, **extra)
it = iter(loader)
print(next(it).tolist(), flush=True)
"""


def docs_block(marker: str) -> str:
    text = (REPO_ROOT / "docs" / "guide" / "streams.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    (block,) = [b for b in blocks if marker in b]
    return block


@pytest.mark.parametrize("kind", ["map", "iterable", "persistent", "docs-stream"])
def test_workers_left_at_interpreter_exit_shut_down_quietly(kind: str, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    if kind == "docs-stream":
        # The streams guide's example leaves its first iterator half-consumed.
        script.write_text(docs_block("StreamingShardedDataset(root, IterableReader"))
    else:
        script.write_text(HALF_CONSUMED)
    log = tmp_path / "log.txt"
    rc = run_script(script, [kind], log, timeout=300, phase=f"exit with {kind} workers")
    output = log.read_text()
    assert rc == 0, output
    assert "Traceback" not in output and "Exception ignored" not in output, output


# ------------------------------------------------ point 14: keys that are not indices
def test_string_keys_as_a_sampler_are_refused_by_name_with_the_fix() -> None:
    data = {"a": 1, "b": 2, "c": 3}
    assert [b.tolist() for b in DataLoader(data, batch_size=2, sampler=["c", "a", "b"])] == [
        [3, 1],
        [2],
    ]
    with pytest.raises(
        TypeError,
        match=r"sampler=list yielded 'c' \(str\), not an integer index.*"
        r"data = \[dataset\[k\] for k in keys\]",
    ):
        ResumableDataLoader(data, batch_size=2, sampler=["c", "a", "b"])
    # The fix it names gives torch's batches.
    keys = ["c", "a", "b"]
    fixed = ResumableDataLoader([data[k] for k in keys], batch_size=2)
    assert [b.tolist() for b in fixed] == [[3, 1], [2]]


def test_index_lists_as_an_unbatched_sampler_are_refused_by_name_with_the_fix() -> None:
    data = TensorDataset(torch.arange(10) * 10)
    theirs = list(DataLoader(data, batch_size=None, sampler=[[0, 1, 2], [3, 4]]))
    assert [b[0].tolist() for b in theirs] == [[0, 10, 20], [30, 40]]
    with pytest.raises(
        TypeError,
        match=r"yielded \[0, 1, 2\] \(list\), not an integer index.*__getitems__\(indices\)",
    ):
        ResumableDataLoader(data, batch_size=None, sampler=[[0, 1, 2], [3, 4]])
    # A batch sampler given as sampler= (hunter 301: the fix named no batch_sampler=).
    for sampler in (
        BatchSampler(range(10), 4, False),
        PlanBatchSampler(SamplePlan(num_samples=10, batch_size=4)),
    ):
        with pytest.raises(TypeError, match=r"yields batches of indices .* as batch_sampler="):
            ResumableDataLoader(data, batch_size=None, sampler=sampler)


# ------------------------------------------------------------- point 15: warnings
def test_the_worker_count_warning_is_said_once_at_the_callers_line() -> None:
    too_many = cpu_budget() + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = ResumableDataLoader(list(range(8)), batch_size=4, num_workers=too_many)
        for _ in range(2):
            assert len(list(loader)) == 2
    about_workers = [w for w in caught if "worker" in str(w.message)]
    assert len(about_workers) == 1, [str(w.message) for w in about_workers]
    (warning,) = about_workers
    assert warning.filename == __file__
    assert f"num_workers={too_many} is more than the {cpu_budget()} CPU cores" in str(
        warning.message
    )


def test_the_pin_memory_warning_names_the_callers_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda check_available=False: None
    )
    with pytest.warns(UserWarning, match="pin_memory=True has no effect") as caught:
        ResumableDataLoader(list(range(8)), batch_size=4, pin_memory=True)
    assert [w.filename for w in caught] == [__file__]


# ---------------------------------------------- crashes where torch works: nested
def nested_batch(samples: list[int]) -> torch.Tensor:
    return torch.nested.nested_tensor([torch.arange(float(i + 1)) for i in samples])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_a_batch_of_nested_tensors_crosses_from_workers_by_torchs_path() -> None:
    kwargs: dict[str, Any] = {"batch_size": 2, "num_workers": 2, "collate_fn": nested_batch}
    theirs = list(DataLoader(list(range(6)), **kwargs))
    loader = ResumableDataLoader(list(range(6)), **kwargs)
    ours = list(loader)
    assert [[t.tolist() for t in b.unbind()] for b in ours] == [
        [t.tolist() for t in b.unbind()] for b in theirs
    ]
    assert loader.describe()["transport"]["torch_path_reasons"] == {"a nested tensor": 3}


def _touch(folder: str, worker_id: int) -> None:
    Path(folder, f"worker{worker_id}").touch()


def test_a_worker_init_fn_assigned_later_runs_in_the_workers(tmp_path: Path) -> None:
    # Lightning's seed_everything(workers=True) assigns loader.worker_init_fn before the
    # first epoch: refusing it broke such scripts; ignoring it would drop their seeding.
    loader = ResumableDataLoader(list(range(4)), batch_size=2, num_workers=1)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]  # workers started already
    assert not list(tmp_path.iterdir())
    loader.worker_init_fn = functools.partial(_touch, str(tmp_path))
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert [p.name for p in tmp_path.iterdir()] == ["worker0"]
    with pytest.raises(TypeError, match=r"worker_init_fn must be callable or None, got 3"):
        loader.worker_init_fn = 3


def test_a_worker_init_fn_for_running_persistent_workers_restarts_them(tmp_path: Path) -> None:
    # Lightning's seed_everything(workers=True) assigns it to a loader iterated before (a
    # peek at one batch): refusing it stopped the fit (hunter 294).
    loader = ResumableDataLoader(
        list(range(4)), batch_size=2, num_workers=1, persistent_workers=True
    )
    first, later = tmp_path / "first", tmp_path / "later"
    first.mkdir(), later.mkdir()
    loader.worker_init_fn = functools.partial(_touch, str(first))  # before: taken
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    running = iter(loader)
    assert next(running).tolist() == [0, 1]
    loader.worker_init_fn = functools.partial(_touch, str(later))
    with pytest.raises(RuntimeError, match="close"):
        next(running)  # its workers were stopped: refused, never a batch lost
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert [p.name for p in first.iterdir()] == [p.name for p in later.iterdir()] == ["worker0"]
