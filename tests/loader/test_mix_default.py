"""A MixedDataset given to ResumableDataLoader without a batch sampler is drawn by its weights."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    TensorDataset,
    random_split,
)

from loaderkit import (
    MixedDataset,
    PadCollate,
    PlanBatchSampler,
    ResumableDataLoader,
    SamplePlan,
    WorkerError,
    compute_lengths,
)
from loaderkit.data._reads import READ_UNDER
from loaderkit.loader._fetch import index_subset
from tests.support.helpers import PassThrough


def _mix() -> MixedDataset:
    return MixedDataset(
        {"a": TensorDataset(torch.arange(100)), "b": TensorDataset(torch.arange(1000, 1010))},
        weights=[1, 1],
    )


def _ids(loader: ResumableDataLoader) -> list[int]:
    return [int(i) for batch in loader for i in batch[0]]


def test_a_mix_without_a_batch_sampler_draws_by_its_weights() -> None:
    mix = _mix()
    loader = ResumableDataLoader(mix, batch_size=10, shuffle=True, seed=3)
    ids = _ids(loader)
    # The weights upsample b (10 samples) to its share of the epoch, as the mix's sampler does.
    assert sum(i >= 1000 for i in ids) == mix.per_epoch[1] > 10
    assert ids == _ids(ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(10, seed=3)))
    assert loader.describe()["mix"]["applied"] is True


def test_a_mix_drawn_by_default_resumes_exactly_with_a_drawn_seed() -> None:
    torch.manual_seed(0)
    mix = _mix()
    first = ResumableDataLoader(mix, batch_size=8, shuffle=True)
    it = iter(first)
    head = [int(i) for _ in range(3) for i in next(it)[0]]
    state = first.state_dict()
    rest = [int(i) for batch in it for i in batch[0]]
    resumed = ResumableDataLoader(mix, batch_size=8, shuffle=True)  # draws another seed
    resumed.load_state_dict(state)  # and adopts the saved one
    assert head + _ids(resumed) == head + rest
    assert resumed.seed == first.seed


def test_a_sampler_that_would_ignore_a_mixs_weights_is_refused() -> None:
    mix = _mix()
    plain = PlanBatchSampler(SamplePlan(num_samples=len(mix), batch_size=10))
    # A SequentialSampler too: DataLoader would read each sample once (hunter 275).
    batched = BatchSampler(SequentialSampler(mix), 10, False)
    for args in (
        {"sampler": RandomSampler(mix)},
        {"batch_sampler": plain},
        {"sampler": SequentialSampler(mix)},
        {"batch_sampler": batched},
    ):
        with pytest.raises(ValueError, match="MixedDataset's weights would be ignored"):
            ResumableDataLoader(mix, batch_size=10 if "sampler" in args else 1, **args)
    unweighted = MixedDataset([TensorDataset(torch.arange(3)), TensorDataset(torch.arange(5))])
    kept = ResumableDataLoader(unweighted, batch_size=4, sampler=SequentialSampler(unweighted))
    assert len(_ids(kept)) == 8


def test_a_weighted_mix_inside_a_subset_or_concat_is_refused() -> None:
    mix = _mix()
    for wrapped in (
        Subset(mix, range(len(mix))),
        ConcatDataset([mix]),
        random_split(mix, [1.0])[0],
        index_subset(mix, np.arange(len(mix))),  # a DataModule's split, a rank's part
    ):
        with pytest.raises(ValueError, match=r"holding a weighted MixedDataset.*pass the Mix"):
            ResumableDataLoader(wrapped, batch_size=10, shuffle=True)
    laid = MixedDataset([TensorDataset(torch.arange(6)), TensorDataset(torch.arange(10, 13))])
    assert len(_ids(ResumableDataLoader(Subset(laid, range(9)), batch_size=4))) == 9


class _Augment(PassThrough):
    """A user's transform over a dataset it holds as an attribute."""


def test_a_weighted_mix_inside_a_users_wrapper_is_refused() -> None:
    # Hunt 371: read as a plain dataset, the mix gave its 110 samples once each, not its
    # 40 weighted draws.
    for wrapped in (_Augment(_mix()), _Augment(_Augment(_mix())), _Augment([_mix()])):
        with pytest.raises(ValueError, match=r"Augment holding a weighted MixedDataset"):
            ResumableDataLoader(wrapped, batch_size=10, shuffle=True)
    mix = _mix()  # read by the mix's own plan, the wrapper keeps the weights (review 372)
    own = ResumableDataLoader(_Augment(mix), batch_sampler=mix.batch_sampler(10, seed=0))
    assert _ids(own) == _ids(ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(10, seed=0)))
    laid = MixedDataset([TensorDataset(torch.arange(6)), TensorDataset(torch.arange(10, 13))])
    assert len(_ids(ResumableDataLoader(_Augment(laid), batch_size=4))) == 9


class _ByMethod(torch.utils.data.Dataset[object]):
    """A transform holding only the mix's bound __getitem__, out of a walk of its attributes."""

    def __init__(self, mix: MixedDataset, depth: int) -> None:
        self.read, self.size = mix.__getitem__, len(mix)
        for _ in range(depth):  # or a mix deeper than any walk looks
            self.read = functools.partial(lambda read, i: read(i), self.read)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> object:
        return self.read(i)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_weighted_mix_read_out_of_sight_under_another_plan_is_refused(num_workers: int) -> None:
    # Hunt 374: a mix reached through a bound method, a partial or five wrappers was not found
    # by the build's walk, and the loader read its 110 samples once each (weights lost).
    for hidden in (_ByMethod(_mix(), 0), _ByMethod(_mix(), 6)):
        loader = ResumableDataLoader(hidden, batch_size=10, shuffle=True, num_workers=num_workers)
        with pytest.raises(WorkerError, match=r"a weighted mix read by index \d+ outside its own"):
            next(iter(loader))
    mix = _mix()  # read by its own plan, it keeps the weights; outside a loader, it reads
    own = ResumableDataLoader(_ByMethod(mix, 6), batch_sampler=mix.batch_sampler(10, seed=0))
    assert _ids(own) == _ids(ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(10, seed=0)))


class _Feed(torch.utils.data.IterableDataset[object]):
    """A user's stream reading the mix by index through a closure."""

    def __init__(self, mix: MixedDataset) -> None:
        self.read, self.size = mix.__getitem__, len(mix)

    def __iter__(self) -> Any:
        return (self.read(i) for i in range(self.size))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_weighted_mix_read_by_index_outside_a_loaderkit_plan_is_refused(
    num_workers: int,
) -> None:
    # A weighted mix read by torch's DataLoader or a user's stream gave its 110 samples once
    # each, not its weighted draws (the weights silently lost).
    mix = _mix()
    readers = [
        torch.utils.data.DataLoader(mix, batch_size=10, shuffle=True, num_workers=num_workers),
        torch.utils.data.DataLoader(mix, batch_sampler=mix.batch_sampler(10, seed=0)),
        ResumableDataLoader(_Feed(mix), batch_size=10, num_workers=num_workers),
    ]
    for reader in readers:
        with pytest.raises((ValueError, WorkerError), match=r"outside its own plan"):
            next(iter(reader))
    with pytest.raises(ValueError, match=r"read by index 3 outside its own plan.*mix.locate"):
        mix[3]
    source, j = mix.locate(103)  # one sample, by the way the message names
    assert int(mix.sources[source][j][0]) == 1003
    laid = MixedDataset([TensorDataset(torch.arange(6)), TensorDataset(torch.arange(10, 13))])
    read = torch.utils.data.DataLoader(laid, batch_size=4, num_workers=num_workers)
    assert sorted(int(i) for b in read for i in b[0]) == [0, 1, 2, 3, 4, 5, 10, 11, 12]


class _Ids(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, values: torch.Tensor) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"v": self.values[i]}


def test_a_wrapper_of_a_mix_gets_the_mixed_batch_checks() -> None:
    # Hunt 374: through a transform, int64 ids beside float32 values were rounded to float32
    # (2**40 + 1 read as 2**40) with no error; the mix read directly refused the batch.
    ids, vals = _Ids(torch.arange(8) + 2**40 + 1), _Ids(torch.arange(8, dtype=torch.float32))
    mix = MixedDataset({"ids": ids, "vals": vals}, weights=[1, 1])
    for read in (mix, _Augment(mix)):
        loader = ResumableDataLoader(read, batch_sampler=mix.batch_sampler(16, seed=0))
        with pytest.raises(WorkerError, match=r"field 'v' is a torch.(float32|int64) tensor in"):
            next(iter(loader))


def test_a_mix_without_weights_is_read_once_in_order() -> None:
    laid = MixedDataset([TensorDataset(torch.arange(6)), TensorDataset(torch.arange(10, 13))])
    assert _ids(ResumableDataLoader(laid, batch_size=4)) == [0, 1, 2, 3, 4, 5, 10, 11, 12]


class _Listed(torch.utils.data.Dataset[dict[str, object]]):
    """Rows as JSONL gives them: Python lists."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, object]:
        return {"label": i}


class _Tensored(_Listed):
    """The same rows as Parquet gives them: tensors."""

    def __getitem__(self, i: int) -> dict[str, object]:
        return {"label": torch.tensor(i)}


def test_a_collate_failing_on_a_batch_of_two_sources_names_them() -> None:
    # The error said only "fix collate_fn" for a JSONL source beside a Parquet one (hunter 273).
    mix = MixedDataset({"j": _Listed(), "p": _Tensored()}, weights=[1, 1])
    loader = ResumableDataLoader(mix, batch_size=16, shuffle=True, seed=0, collate_fn=PadCollate())
    with pytest.raises(WorkerError, match=r"The batch mixes sources \['j', 'p'\]"):
        next(iter(loader))


class _Extra(_Tensored):
    """Rows with a field the other source lacks."""

    def __getitem__(self, i: int) -> dict[str, object]:
        return {"label": torch.tensor(i), "extra": torch.tensor(-i)}


@pytest.mark.parametrize("seed", range(4))
def test_default_collate_refuses_every_batch_of_two_sources_it_would_merge_wrongly(
    seed: int,
) -> None:
    # Hunter 328: default_collate rounded a JSONL int beside a Parquet float64 (or refused,
    # by which source came first), and dropped a field the first sample lacked.
    for other, match in (
        (_Listed(), r"field 'label' is a torch.int64 tensor in source 'p' and a Python int in "),
        (_Extra(), r"source '[pe]' gives fields \[.*\], source '[pe]' \[.*\], so default_collate"),
    ):
        mix = MixedDataset({"p": _Tensored(), "e": other}, weights=[1, 1])
        loader = ResumableDataLoader(mix, batch_size=4, shuffle=True, seed=seed)
        planned, it = list(loader.batch_sampler), iter(loader)
        assert any(len(set(mix.source_of(b).tolist())) > 1 for b in planned)
        for indices in planned:  # an error is raised in its batch's place; the epoch goes on
            if len(set(mix.source_of(indices).tolist())) > 1:
                with pytest.raises(WorkerError, match=match):
                    next(it)
            else:
                assert len(next(it)["label"]) == 4


class _Rows(torch.utils.data.Dataset[object]):
    def __init__(self, make: Any) -> None:
        self.make = make

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> object:
        return self.make(i)


def _nested_tensor(i: int) -> object:
    return {"x": {"v": torch.tensor(i)}}


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (
            lambda i: {"x": {"v": i, "w": i}},
            r"source '[po]' gives fields \[.*\], source '[po]' \[.*\], so default",
        ),
        (lambda i: {"x": {"v": np.int64(i)}}, r"field 'v' is a torch.int64 tensor .*numpy int64"),
        (
            lambda i: (i,),
            r"the sample is a (tuple|dict) in source '[op]' and a (dict|tuple) in source",
        ),
    ],
)
def test_nested_fields_numpy_numbers_and_sample_types_are_checked_too(
    other: Any, match: str
) -> None:
    # Review 331: only top-level fields and Python numbers were compared; a tuple beside a dict
    # failed inside the check with an AttributeError.
    mix = MixedDataset({"p": _Rows(_nested_tensor), "o": _Rows(other)}, weights=[1, 1])
    loader = ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(16, seed=0))
    with pytest.raises(WorkerError, match=match):
        next(iter(loader))


def test_a_split_of_a_mix_is_checked_as_the_mix() -> None:
    # Review 331: a Subset (or a DataModule's val_fraction split) of a mix was not checked.
    mix = MixedDataset({"p": _Rows(_nested_tensor), "o": _Rows(lambda i: {"x": {"v": i}})})
    with pytest.raises(WorkerError, match=r"field 'v' is a torch.int64 tensor .*Python int"):
        list(ResumableDataLoader(Subset(mix, [0, 1, 8, 9]), batch_size=4))


_ID = 2**40 + 1  # float32 holds 2**40 + 1, + 3, + 5 ... all as 2**40


@pytest.mark.parametrize(
    ("first", "other", "kinds"),
    [
        (lambda i: i + 0.5, lambda i: 16777217 + i, "Python (float|int)"),
        (lambda i: i + 0.5, np.float32, "(Python float|numpy float32)"),
        (lambda i: i + 0.5, bool, "Python (float|bool)"),
        (lambda i: _ID + 2 * i, np.float32, "(Python int|numpy float32)"),
        (lambda i: np.int64(_ID + 2 * i), np.float32, "numpy (int64|float32)"),
        (
            lambda i: torch.tensor(_ID + 2 * i),
            lambda i: torch.tensor(i / 2),
            "torch.(int64|float32)",
        ),
    ],
)
def test_numbers_of_two_sources_that_default_collate_would_round_are_refused(
    first: Any, other: Any, kinds: str
) -> None:
    # Review 331 and 335: default_collate made a Python float beside an int float64 when the
    # float came first and float32 otherwise (16777217 read as 16777216), and int64 ids beside
    # float32 values float32 in any order (2**40 + 1, + 3 and + 5 all read as 2**40).
    f, o = _Rows(lambda i: {"y": first(i)}), _Rows(lambda i: {"y": other(i)})
    for mix in (MixedDataset({"f": f, "o": o}), MixedDataset({"o": o, "f": f})):
        match = (
            rf"'y' is a {kinds} .*in source '[fo]' and a {kinds} .*, which default_collate rounds"
        )
        with pytest.raises(WorkerError, match=match):
            next(iter(ResumableDataLoader(mix, batch_size=16)))
        assert len(next(iter(ResumableDataLoader(mix, batch_size=8)))["y"]) == 8  # one source


@pytest.mark.parametrize(
    ("first", "other", "dtype"),
    [
        (lambda i: i + 0.5, np.float64, torch.float64),
        (lambda i: i, np.int32, torch.int64),
        (lambda i: i, bool, torch.int64),
    ],
)
def test_numbers_of_two_sources_that_default_collate_holds_exactly_are_read(
    first: Any, other: Any, dtype: torch.dtype
) -> None:
    # Review 335: a Python float beside a numpy float64 was refused, though float64 either way.
    mix = MixedDataset(
        {"f": _Rows(lambda i: {"y": first(i)}), "o": _Rows(lambda i: {"y": other(i)})}
    )
    assert next(iter(ResumableDataLoader(mix, batch_size=16)))["y"].dtype == dtype


class _Threaded(PassThrough):
    """A wrapper reading its batch with a thread pool (remote sources read concurrently)."""

    def __getitems__(self, indices: list[int]) -> list[object]:
        with ThreadPoolExecutor(2) as pool:
            return list(pool.map(self.__getitem__, indices))


def test_a_weighted_mix_is_read_under_its_plan_by_compute_lengths_not_from_threads() -> None:
    # Review 382: compute_lengths (the documented bucketing hook) read the mix outside any
    # loader. Review 385: a plan shared by the process let torch's DataLoader read the mix in
    # another thread while a loader fetched; a thread the user's read starts has none.
    mix = _mix()
    threaded = ResumableDataLoader(_Threaded(mix), batch_sampler=mix.batch_sampler(10, seed=0))
    with pytest.raises(WorkerError, match=r"outside its own plan \(or in a thread of your own\)"):
        next(iter(threaded))
    lengths = compute_lengths(mix, lambda s: int(s[0]) % 7 + 1, progress=False)
    assert lengths.tolist() == [i % 7 + 1 for i in [*range(100), *range(1000, 1010)]]
    with pytest.raises(ValueError, match=r"outside its own plan"):
        mix[0]  # the plan is set back after


def test_a_plan_set_in_one_thread_lets_no_other_thread_read() -> None:
    # Review 385: a plan shared by the process let torch's DataLoader read the mix in another
    # thread (110 samples, weights lost) while a loader fetched, and two loaders in two
    # threads reset each other's plan (both refused).
    mix = _mix()
    token = READ_UNDER.set(mix._plan_key)
    try:
        assert int(mix[3][0]) == 3  # under its own plan, in this thread
        with ThreadPoolExecutor(1) as pool, pytest.raises(ValueError, match="outside its own"):
            pool.submit(mix.__getitem__, 3).result()
    finally:
        READ_UNDER.reset(token)
