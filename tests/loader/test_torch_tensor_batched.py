"""torch's own ``TensorDataset`` (and ``Subset``/``ConcatDataset`` of it) is read a batch at a
time under ``default_collate``, with exactly the batches per-sample reads give (issue 25).

The reference is ``torch.utils.data.DataLoader`` over the same dataset, fed the order
loaderkit's plan draws: the plan depends only on the dataset's length, so a loader over
``TensorDataset(arange(n))`` with the same arguments says which positions each batch holds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, DataLoader, Subset, TensorDataset, default_collate

from loaderkit import ResumableDataLoader
from tests.support.loops import check_resume_oracle

N = 40


def _base() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, 2, generator=gen).transpose(1, 2)  # not contiguous
    return TensorDataset(x, torch.arange(N), torch.rand(N, generator=gen) > 0.5)


DATASETS: dict[str, Callable[[], Any]] = {
    "tensor": _base,
    "subset-list": lambda: Subset(_base(), [5, 3, 39, 0, *range(10, 30)]),
    "subset-numpy": lambda: Subset(_base(), np.arange(N - 1, 4, -2)),
    "subset-tensor": lambda: Subset(_base(), torch.arange(2, N, dtype=torch.int32)),
    "concat": lambda: ConcatDataset([_base(), Subset(_base(), range(7, 20)), _base()]),
    "subset-of-concat": lambda: Subset(ConcatDataset([_base(), _base()]), range(30, 70)),
}


def _loader(dataset: Any, num_workers: int = 0, **kwargs: Any) -> ResumableDataLoader:
    kwargs.setdefault("batch_size", 6)
    return ResumableDataLoader(dataset, seed=3, num_workers=num_workers, **kwargs)


def _positions(size: int, **kwargs: Any) -> list[int]:
    """The dataset positions loaderkit's plan reads, in order (the same for any dataset)."""
    kwargs.pop("num_workers", None)
    kwargs.pop("collate_fn", None)
    positions = _loader(TensorDataset(torch.arange(size)), **kwargs)
    return [int(i) for b in positions for i in b[0].reshape(-1)]


def _torch_batches(dataset: Any, num_workers: int = 0, **kwargs: Any) -> list[Any]:
    kwargs.setdefault("batch_size", 6)
    order = _positions(len(dataset), **kwargs)
    loader = DataLoader(
        dataset, batch_size=kwargs["batch_size"], sampler=order, num_workers=num_workers
    )
    return list(loader)


def _assert_same(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert type(g) is type(w) is list and len(g) == len(w)
        for a, b in zip(g, w, strict=True):
            assert type(a) is type(b) is torch.Tensor
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            assert torch.equal(a, b)
            assert a.requires_grad == b.requires_grad
            assert type(a.grad_fn) is type(b.grad_fn)


class _Calls:
    call_count = 0


@contextmanager
def _counted_getitem() -> Iterator[_Calls]:
    """Counts the calls of ``TensorDataset.__getitem__`` in this process (a spy that keeps
    torch's name, so loaderkit still takes it for torch's own read)."""
    calls = _Calls()
    original = TensorDataset.__getitem__

    @functools.wraps(original)
    def spy(self: TensorDataset, index: Any) -> Any:
        calls.call_count += 1
        return original(self, index)

    with mock.patch.object(TensorDataset, "__getitem__", spy):
        yield calls


# ------------------------------------------------------------------ the batched path is taken
@pytest.mark.parametrize("kind", sorted(DATASETS))
def test_torch_tensor_dataset_is_gathered_a_batch_at_a_time(kind: str) -> None:
    dataset = DATASETS[kind]()
    want = _torch_batches(dataset, shuffle=True)
    for collate_fn in (None, default_collate):
        with _counted_getitem() as spy:
            got = list(_loader(dataset, shuffle=True, collate_fn=collate_fn))
        assert spy.call_count == 0, f"{kind}: read per sample ({spy.call_count} calls)"
        _assert_same(got, want)


# ---------------------------------------------------- the same batches as torch's DataLoader
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(("shuffle", "drop_last"), [(True, False), (False, True)])
@pytest.mark.parametrize("kind", sorted(DATASETS))
def test_batches_equal_torch_dataloader(
    kind: str, num_workers: int, shuffle: bool, drop_last: bool
) -> None:
    dataset = DATASETS[kind]()
    args = {"shuffle": shuffle, "drop_last": drop_last}
    got = list(_loader(dataset, num_workers, **args))
    _assert_same(got, _torch_batches(dataset, num_workers, **args))
    # ... and as loaderkit's own per-sample read (a collate_fn that is not default_collate
    # itself), down to where the tensors live (shared memory or not).
    per_sample = list(_loader(dataset, num_workers, collate_fn=_collate_again, **args))
    _assert_same(got, per_sample)
    for g, p in zip(got, per_sample, strict=True):
        assert [t.is_shared() for t in g] == [t.is_shared() for t in p]


_collate_again = functools.partial(default_collate)


def _odd_tensors() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return [
        torch.randn(N, 2, 3, 4, generator=gen).contiguous(memory_format=torch.channels_last),
        torch.randint(0, 255, (N, 3, 2), dtype=torch.uint8, generator=gen).permute(0, 2, 1),
        torch.randn(2 * N, 5, generator=gen).to(torch.float16)[::2],
        torch.randn(N, 2, generator=gen, dtype=torch.complex64),
        torch.randn(N, 2, 3, 4, 5, generator=gen),  # 5-d, contiguous
        torch.arange(N, dtype=torch.int32),
    ]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dtypes_strides_and_one_tensor_as_torch(num_workers: int) -> None:
    for dataset in (TensorDataset(*_odd_tensors()), TensorDataset(torch.arange(N) * 2)):
        with _counted_getitem() as spy:
            got = list(_loader(dataset, num_workers, shuffle=True))
        assert spy.call_count == 0 or num_workers > 0  # (workers read in their own process)
        _assert_same(got, _torch_batches(dataset, num_workers, shuffle=True))


@pytest.mark.parametrize(
    "make",
    [
        # A 5-d tensor with a size-1 dimension stacks to strides index_select does not give.
        lambda: TensorDataset(torch.randn(N, 2, 1, 3, 1).permute(0, 2, 1, 4, 3)),
        lambda: TensorDataset(torch.randn(N, 4, 1, 1, 1)),
        lambda: TensorDataset(torch.randn(N, 2, requires_grad=True)),
        # Parts of different dtypes: stacking promotes them, as torch does it.
        lambda: ConcatDataset(
            [TensorDataset(torch.zeros(N, 2)), TensorDataset(torch.ones(N, 2).double())]
        ),
        lambda: Subset(_base(), [-1, -5, 3, *range(10)]),  # negative indices, read as torch does
        lambda: Subset(_base(), [np.int64(3), 4, 5, 6]),  # not plain ints
    ],
)
def test_inputs_not_provably_the_same_are_read_per_sample_exactly(make: Callable[[], Any]) -> None:
    dataset = make()
    with _counted_getitem() as spy:
        got = list(_loader(dataset, shuffle=True))
    assert spy.call_count > 0
    _assert_same(got, _torch_batches(dataset, shuffle=True))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_across_parts_of_two_dtypes_is_promoted_in_workers_too(num_workers: int) -> None:
    # torch's default_collate promotes int16 + int32 in the main process but casts to the
    # first sample's dtype in a worker: 70000 became 4464 with num_workers=2 (hunter 181).
    dataset = ConcatDataset(
        [
            TensorDataset(torch.full((4, 2), -300, dtype=torch.int16)),
            TensorDataset(torch.full((4, 2), 70000, dtype=torch.int32)),
        ]
    )
    (batch,) = _loader(dataset, shuffle=False, batch_size=8, num_workers=num_workers)
    assert batch[0].dtype == torch.int32
    assert batch[0][:, 0].tolist() == [-300] * 4 + [70000] * 4


def test_a_mixed_dtype_concat_batch_within_one_part_is_still_gathered() -> None:
    dataset = ConcatDataset(
        [TensorDataset(torch.zeros(N, 2)), TensorDataset(torch.ones(N, 2).double())]
    )
    with _counted_getitem() as spy:
        got = list(_loader(dataset, shuffle=False, batch_size=8))
    assert spy.call_count == 0  # no batch spans both parts
    _assert_same(got, _torch_batches(dataset, shuffle=False, batch_size=8))


# ------------------------------------------------------- the user's data decides: per sample
class _Doubled(TensorDataset):
    calls = 0

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        type(self).calls += 1
        return tuple(t[index] * 2 for t in self.tensors)


class _Plain(TensorDataset):
    pass


def test_a_subclass_is_read_per_sample() -> None:
    _Doubled.calls = 0
    dataset = _Doubled(torch.arange(N))
    batches = list(_loader(dataset, shuffle=True))
    assert _Doubled.calls == N
    assert sorted(torch.cat([b[0] for b in batches]).tolist()) == list(range(0, 2 * N, 2))
    _Doubled.calls = 0
    list(_loader(Subset(dataset, range(10)), shuffle=True))
    assert _Doubled.calls == 10
    with _counted_getitem() as spy:
        list(_loader(_Plain(torch.arange(N)), shuffle=True))
    assert spy.call_count == N  # a subclass may be given a __getitem__ later: kept per sample


def test_a_read_patched_on_torchs_class_is_called_per_sample() -> None:
    seeds: set[int] = set()

    def hundredfold(self: TensorDataset, index: Any) -> tuple[torch.Tensor, ...]:
        seeds.add(torch.initial_seed())
        return tuple(t[index] * 100 for t in self.tensors)

    with mock.patch.object(TensorDataset, "__getitem__", hundredfold):
        got = list(_loader(TensorDataset(torch.arange(N)), shuffle=True))
    assert sorted(torch.cat([b[0] for b in got]).tolist()) == list(range(0, 100 * N, 100))
    assert len(seeds) == N  # user code: seeded per sample


def test_rows_beyond_replaced_tensors_fail_as_torchs_read_does() -> None:
    dataset = TensorDataset(torch.arange(N))
    batches = iter(_loader(dataset))
    next(batches)
    dataset.tensors = (torch.arange(N // 2),)  # mid-epoch, shorter than the plan
    with pytest.raises(IndexError, match=r"loading sample index 2\d .*out of bounds"):
        list(batches)


class _Doubling:
    def __call__(self, index: int) -> int:
        return index * 2


class _StaticRead(torch.utils.data.Dataset[int]):
    __getitem__ = staticmethod(_Doubling())

    def __len__(self) -> int:
        return 8


class _ObjectRead(torch.utils.data.Dataset[int]):
    __getitem__ = _Doubling()  # a callable object: no method binding

    def __len__(self) -> int:
        return 8


@pytest.mark.parametrize("cls", [_StaticRead, _ObjectRead])
def test_a_getitem_that_is_no_plain_method_reads_as_in_torch(cls: type) -> None:
    want = [b.tolist() for b in DataLoader(cls(), batch_size=4)]
    for num_workers in (0, 2):
        got = [b.tolist() for b in _loader(cls(), num_workers, batch_size=4)]
        assert got == want == [[0, 2, 4, 6], [8, 10, 12, 14]]


def _minus_one(index: int) -> tuple[torch.Tensor, ...]:
    return (torch.tensor(-1),) * 3


@pytest.mark.parametrize("kwargs", [{}, {"per_sample_seeding": True}])
def test_a_getitem_set_on_the_instance_is_not_read_as_in_torch(kwargs: dict[str, Any]) -> None:
    """dataset[i] (and torch's fetcher) reads the class's __getitem__; loaderkit read one set
    on the instance, and yielded other values than torch."""
    dataset = _base()
    dataset.__getitem__ = _minus_one  # type: ignore[method-assign]
    want = [b[1].tolist() for b in DataLoader(dataset, batch_size=4)]
    for num_workers in (0, 2):
        got = [b[1].tolist() for b in _loader(dataset, num_workers, batch_size=4, **kwargs)]
        assert got == want == [list(range(i, i + 4)) for i in range(0, N, 4)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"per_sample_seeding": True},  # as for loaderkit's TensorDataset: seeded, per sample
        {"collate_fn": _collate_again},
        {"batch_size": None},
    ],
)
def test_per_sample_settings_keep_per_sample_reads(kwargs: dict[str, Any]) -> None:
    dataset = _base()
    with _counted_getitem() as spy:
        got = list(_loader(dataset, shuffle=True, **kwargs))
    assert spy.call_count == N
    if "batch_size" in kwargs:
        order = _positions(N, shuffle=True, batch_size=None)
        want = list(DataLoader(dataset, batch_size=None, sampler=order))
        assert all(
            type(g) is list and all(map(torch.equal, g, w)) for g, w in zip(got, want, strict=True)
        )
    else:
        _assert_same(got, _torch_batches(dataset, shuffle=True))


# ------------------------------------------------------------------------------- after a resume
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["tensor", "subset-of-concat"])
def test_resume_is_exact_and_matches_torch(kind: str, num_workers: int) -> None:
    dataset = DATASETS[kind]()

    def make(nw: int) -> ResumableDataLoader:
        return _loader(dataset, nw, shuffle=True)

    check_resume_oracle(make, lambda b: b[1].tolist(), cuts=(2, 9), num_workers=num_workers)
    cut = make(num_workers)
    it = iter(cut)
    for _ in range(3):
        next(it)
    resumed = make(num_workers)
    resumed.load_state_dict(cut.state_dict())
    with _counted_getitem() as spy:
        rest = list(resumed)
    assert spy.call_count == 0 or num_workers > 0  # (workers read in their own process)
    _assert_same(rest, _torch_batches(dataset, num_workers, shuffle=True)[3:])


@pytest.mark.gpu
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pinned_batches_as_torch(num_workers: int) -> None:
    dataset = DATASETS["subset-of-concat"]()
    got = list(_loader(dataset, num_workers, shuffle=True, pin_memory=True))
    order = _positions(len(dataset), shuffle=True)
    want = list(
        DataLoader(dataset, batch_size=6, sampler=order, num_workers=num_workers, pin_memory=True)
    )
    _assert_same(got, want)
    assert all(t.is_pinned() for b in got for t in b)
