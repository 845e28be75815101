"""How workers start under a process group (issue 11, F8): said once, pickling failures named
with their fixes, and large in-memory tensors shared instead of pickled per worker."""

from __future__ import annotations

import multiprocessing
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, Subset

from loaderkit import ResumableDataLoader, TensorDataset, WorkerStartError
from loaderkit.loader import _workers
from loaderkit.loader._workers import SHARE_MIN_BYTES, share_tensors


@pytest.fixture
def process_group(tmp_path: Path) -> Any:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_the_switch_to_forkserver_is_said_once_with_how_to_choose(
    process_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_workers, "_announced_forkserver", False)
    loader = ResumableDataLoader(list(range(8)), batch_size=2, num_workers=2)
    with pytest.warns(RuntimeWarning, match=r"forkserver.*deadlock.*multiprocessing_context="):
        assert loader._host.pool.context().get_start_method() == "forkserver"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second loader, a second epoch: silent
        ResumableDataLoader(list(range(8)), batch_size=2, num_workers=2)._host.pool.context()
        loader._host.pool.context()
        # the user's explicit choice is never announced
        ResumableDataLoader(
            list(range(8)), batch_size=2, num_workers=2, multiprocessing_context="fork"
        )._host.pool.context()


def test_no_notice_without_a_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_workers, "_announced_forkserver", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ResumableDataLoader([1, 2], num_workers=2)._host.pool.context() is None


def _double(batch: Any) -> Any:
    return batch


def local_objects() -> dict[str, dict[str, Any]]:
    class LocalDataset(Dataset[int]):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, index: int) -> int:
            return index

    return {
        "the dataset": {"dataset": LocalDataset()},
        "collate_fn": {"dataset": list(range(8)), "collate_fn": lambda b: b},
        "worker_init_fn": {"dataset": list(range(8)), "worker_init_fn": lambda w: None},
    }


@pytest.mark.parametrize("what", ["the dataset", "collate_fn", "worker_init_fn"])
def test_an_object_that_does_not_pickle_is_named_with_the_fixes(what: str) -> None:
    kwargs = local_objects()[what]
    dataset = kwargs.pop("dataset")
    before = set(multiprocessing.active_children())
    loader = ResumableDataLoader(
        dataset, batch_size=2, num_workers=2, multiprocessing_context="spawn", **kwargs
    )
    with pytest.raises(
        WorkerStartError,
        match=rf"start by 'spawn' \(multiprocessing_context='spawn'\).*{what} \(local_objects\."
        r"<locals>\..*cannot be pickled.*module level.*multiprocessing_context='fork'.*"
        r"num_workers=0",
    ):
        next(iter(loader))
    assert set(multiprocessing.active_children()) <= before  # no worker was left behind


def test_module_level_objects_pass_the_same_check() -> None:
    loader = ResumableDataLoader(
        list(range(8)),
        batch_size=2,
        num_workers=1,
        collate_fn=_double,
        multiprocessing_context="spawn",
    )
    # Built, not started: building pickles nothing, and these would pickle.
    inner = loader._engine.inner_loader(loader.plan.schedule(0, start=0, rank=0, world_size=1))
    assert _workers._first_unpicklable(inner.dataset, "the dataset") is None


def test_large_tensors_of_tensor_datasets_move_to_shared_memory() -> None:
    rows = SHARE_MIN_BYTES // 4 // 16 + 1
    big, small = torch.randn(rows, 16), torch.arange(4)
    ours = TensorDataset(big, small[:1].expand(rows))
    assert share_tensors(ours) == 1
    assert big.is_shared() and not small.is_shared()  # small ones are not worth an fd
    assert share_tensors(ours) == 0  # already shared
    theirs = torch.utils.data.TensorDataset(torch.randn(rows, 16))
    assert share_tensors(Subset(Subset(theirs, range(5)), range(2))) == 1  # through subsets
    assert theirs.tensors[0].is_shared()
    assert share_tensors(list(range(3))) == 0


def test_pickled_workers_get_shared_tensors_fork_does_not_need_them() -> None:
    rows = SHARE_MIN_BYTES // 4 // 16 + 1
    for method, shared in (("spawn", True), ("fork", False)):
        x = torch.randn(rows, 16)
        expected = x.clone()
        loader = ResumableDataLoader(
            TensorDataset(x), batch_size=4, num_workers=1, multiprocessing_context=method
        )
        loader._engine.inner_loader(loader.plan.schedule(0, start=0, rank=0, world_size=1))
        assert x.is_shared() is shared, method
        assert torch.equal(x, expected)  # moved, values kept


class _Thirds(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        return torch.tensor([i / 3])  # the process's default dtype


def test_a_worker_makes_floats_in_the_main_process_default_dtype() -> None:
    # 0ad19c7: a forkserver worker (loaderkit's choice under DDP) made them float32 while the
    # main process made float64 (hunter 242): values differed with num_workers.
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        batches = [
            next(iter(ResumableDataLoader(_Thirds(), batch_size=4, **kw)))
            for kw in ({}, {"num_workers": 1, "multiprocessing_context": "forkserver"})
        ]
    finally:
        torch.set_default_dtype(before)
    assert [b.dtype for b in batches] == [torch.float64] * 2
    assert torch.equal(*batches)


class _Noisy(Dataset[Any]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        return torch.tensor(np.random.rand())  # keyed per sample: the same for any num_workers


def _pcg64(worker_id: int) -> None:
    np.random.mtrand.set_bit_generator(np.random.PCG64(worker_id))


class _OwnPCG64(np.random.PCG64):
    """A user's bit generator class (review 335: looked up by name, a worker stayed MT19937)."""


@pytest.mark.parametrize("made", [np.random.PCG64, _OwnPCG64])
def test_a_worker_draws_with_the_main_process_numpy_bit_generator(made: type) -> None:
    # Hunter 333: np.random.seed(k) draws other numbers under PCG64 than under MT19937, and a
    # forkserver worker (loaderkit's choice under DDP) started with MT19937 whatever the main
    # process had: a sample's numpy draws differed with num_workers, silently.
    before = np.random.mtrand.get_bit_generator()
    np.random.mtrand.set_bit_generator(made(0))
    try:
        batches = [
            next(iter(ResumableDataLoader(_Noisy(), batch_size=4, seed=3, **kw)))
            for kw in ({}, {"num_workers": 1, "multiprocessing_context": "forkserver"})
        ]
    finally:
        np.random.mtrand.set_bit_generator(before)
    assert torch.equal(*batches)
    with pytest.raises(ValueError, match=r"bit generator is PCG64 in a worker but MT19937 .*main"):
        next(
            iter(ResumableDataLoader(_Noisy(), batch_size=4, num_workers=1, worker_init_fn=_pcg64))
        )
    unkeyed = {"per_sample_seeding": False, "worker_init_fn": _pcg64}  # its draws: the worker's
    assert len(next(iter(ResumableDataLoader(_Noisy(), batch_size=4, num_workers=1, **unkeyed))))


def _noisy_transform(sample: Any) -> float:
    return float(np.random.rand())


def test_stream_workers_and_persistent_workers_follow_numpys_bit_generator(tmp_path: Any) -> None:
    # Review 338: a stream's workers (transform= seeded per sample) no longer took the main
    # process's bit generator under forkserver; persistent workers kept the one they started with
    # when the main process switched between epochs.
    from loaderkit import StreamingShardedDataset, TokenReader, write_shards

    write_shards(tmp_path, [np.arange(8), np.arange(8, 16)], TokenReader(seq_len=2), progress=False)

    def stream(**kw: Any) -> list[float]:
        ds = StreamingShardedDataset(
            tmp_path, TokenReader(seq_len=2), transform=_noisy_transform, shuffle_shards=False
        )
        loader = ResumableDataLoader(ds, batch_size=2, seed=0, per_sample_seeding=True, **kw)
        return sorted(x for b in loader for x in b.tolist())

    kept = np.random.mtrand.get_bit_generator()
    np.random.mtrand.set_bit_generator(np.random.PCG64(0))
    try:
        assert stream() == stream(num_workers=1, multiprocessing_context="forkserver")
    finally:
        np.random.mtrand.set_bit_generator(kept)
    loaders = [
        ResumableDataLoader(_Noisy(), batch_size=4, seed=3, **kw)
        for kw in ({}, {"num_workers": 1, "persistent_workers": True})
    ]
    epochs: list[list[torch.Tensor]] = [[], []]
    try:
        for epoch in range(2):
            if epoch == 1:
                np.random.mtrand.set_bit_generator(np.random.PCG64(0))
            for out, loader in zip(epochs, loaders, strict=True):
                loader.set_epoch(epoch)
                out.append(next(iter(loader)))
    finally:
        np.random.mtrand.set_bit_generator(kept)
    assert all(torch.equal(a, b) for a, b in zip(*epochs, strict=True))
