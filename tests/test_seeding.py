"""Tests for loaderkit.seeding: derived seeds, worker init, per-sample RNGs."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from loaderkit import ResumableDataLoader, seeding
from loaderkit.errors import LoaderkitError
from loaderkit.loader._fetch import index_subset, split_source
from loaderkit.seeding import (
    derive_seed,
    sample_generator,
    sample_numpy_rng,
    sample_seed,
    seed_global_rngs,
    seeded_sample,
    worker_init_fn,
    worker_seed,
)
from tests.support import seeding as helpers

REPO = Path(__file__).resolve().parents[1]

# --- derive_seed ---------------------------------------------------------------------------


def test_derive_seed_is_deterministic_and_in_range() -> None:
    values = [derive_seed(42, "sample", 3, 7) for _ in range(3)]
    assert values[0] == values[1] == values[2]
    assert 0 <= values[0] < 2**63
    torch.manual_seed(values[0])
    np.random.seed(values[0] % 2**32)


def test_derive_seed_golden_value() -> None:
    # Pinned so a change of encoding or of numpy's SeedSequence is noticed:
    # saved seeds must keep meaning the same streams.
    assert derive_seed(0) == 7896617691693857887
    assert derive_seed(42, "sample", 3, 7) == 4569679024457913593


def test_derive_seed_differs_by_each_key_and_by_order() -> None:
    base = derive_seed(1, "a", 2, 3)
    variants = [
        derive_seed(2, "a", 2, 3),
        derive_seed(1, "b", 2, 3),
        derive_seed(1, "a", 9, 3),
        derive_seed(1, "a", 2, 4),
        derive_seed(1, "a", 3, 2),
        derive_seed(1, "a", 2),
        derive_seed(1, "a", 2, 3, 0),
        derive_seed(1),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_derive_seed_encoding_is_prefix_free() -> None:
    # Keys whose raw uint32 words would coincide must still give distinct seeds.
    seeds = {
        derive_seed(1, 2**32 + 5),
        derive_seed(1, 5, 1),
        derive_seed(1, 1, 5),
        derive_seed(1, "5"),
        derive_seed(1, 5),
        derive_seed(2**127, 1),
        derive_seed(0, 0, 0, 0, 2**127 >> 96, 1),
    }
    assert len(seeds) == 7


@given(
    seed=st.integers(min_value=0, max_value=2**128 - 1),
    a=st.integers(min_value=0, max_value=2**70),
    b=st.integers(min_value=0, max_value=2**70),
)
def test_derive_seed_range_and_order_property(seed: int, a: int, b: int) -> None:
    value = derive_seed(seed, a, b)
    assert 0 <= value < 2**63
    if a != b:
        assert value != derive_seed(seed, b, a)


@pytest.mark.slow  # starts a Python process that imports torch (~2-5 s)
def test_derive_seed_matches_subprocess_with_other_hash_seed() -> None:
    code = "from loaderkit.seeding import derive_seed; print(derive_seed(7, 'epoch', 3, 'rank', 1))"
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert int(out.stdout.strip()) == derive_seed(7, "epoch", 3, "rank", 1)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((-1,), ValueError, r"derive_seed: seed must be >= 0, got -1; pass a non-negative"),
        (
            (2**128,),
            ValueError,
            r"seed must be < 2\*\*128, got \d+; pass a value in \[0, 2\*\*128\)",
        ),
        (
            (True,),
            TypeError,
            r"derive_seed: seed must be an int, got True \(bool\); pass a non-negative",
        ),
        ((1.0,), TypeError, r"seed must be an int, got 1\.0 \(float\)"),
        ((1, -3), ValueError, r"keys\[0\] must be a non-negative int or a str, got -3"),
        ((1, 2, 2.5), TypeError, r"keys\[1\] must be a non-negative int or a str.*float"),
        ((1, False), TypeError, r"keys\[0\].*got False \(bool\)"),
    ],
)
def test_derive_seed_rejects_bad_arguments(
    args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        derive_seed(*args)


def test_worker_and_sample_seeds_are_separate_families() -> None:
    assert worker_seed(5, 0, 1) == derive_seed(5, "worker", 0, 1)
    assert sample_seed(5, 0, 1) != derive_seed(5, "sample", 0, 1)  # splitmix keys, not SeedSequence
    assert worker_seed(5, 0, 1) != sample_seed(5, 0, 1)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: worker_seed(1, -1, 0), r"worker_seed: rank must be >= 0, got -1"),
        (lambda: sample_seed(1, 0, -2), r"sample_seed: index must be >= 0, got -2"),
        (
            lambda: sample_seed(1, "0", 2),  # type: ignore[arg-type]
            r"sample_seed: epoch must be an int, got '0' \(str\)",
        ),
        (
            lambda: sample_numpy_rng(1, 0, 1.5),  # type: ignore[arg-type]
            r"sample_numpy_rng: index must be",
        ),
        (lambda: sample_generator(-1, 0, 0), r"sample_generator: seed must be >= 0, got -1"),
        (lambda: seeded_sample(0, 0, -1).__enter__(), r"seeded_sample: index must be >= 0"),
        (lambda: seed_global_rngs(2**64), r"seed_global_rngs: seed must be < 2\*\*64"),
        (lambda: worker_init_fn(-5), r"worker_init_fn: seed must be >= 0, got -5"),
        (lambda: worker_init_fn(1, rank=-1), r"worker_init_fn: rank must be >= 0, got -1"),
        (
            lambda: worker_init_fn(1, rank=0, user_fn=3),  # type: ignore[arg-type]
            r"user_fn must be callable.*got 3",
        ),
    ],
)
def test_bad_arguments_name_the_parameter(call: Any, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        call()


# --- global seeding ---------------------------------------------------------------------


def test_seed_global_rngs_seeds_all_three() -> None:
    seed_global_rngs(123)
    first = (random.random(), np.random.random_sample(), torch.rand(1).item())
    seed_global_rngs(123)
    assert (random.random(), np.random.random_sample(), torch.rand(1).item()) == first
    seed_global_rngs(2**40)  # numpy gets seed % 2**32; no error
    np.random.seed(0)


# --- worker init --------------------------------------------------------------------------


LOADER_SEED = 5  # the DataLoader's own generator: torch draws each iterator's base seed from it


def _base_seed(draw: int = 0) -> int:
    """The base seed torch hands the workers of the ``draw``-th iterator of a loader."""
    gen = torch.Generator().manual_seed(LOADER_SEED)
    for _ in range(draw):
        torch.empty((), dtype=torch.int64).random_(generator=gen)
    return int(torch.empty((), dtype=torch.int64).random_(generator=gen).item())


def _epochs(
    *, seed: int, rank: int, method: str | None, user_fn: Any = None, epochs: int = 1
) -> list[dict[int, list[tuple[float, float, float]]]]:
    loader = DataLoader(
        helpers.RandomDrawDataset(6),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=method,
        worker_init_fn=worker_init_fn(seed, rank=rank, user_fn=user_fn),
        generator=torch.Generator().manual_seed(LOADER_SEED),
    )
    runs = []
    for _ in range(epochs):
        streams: dict[int, list[tuple[float, float, float]]] = {}
        for _index, worker_id, r, n, t, _calls in loader:
            streams.setdefault(int(worker_id), []).append((float(r), float(n), float(t)))
        runs.append(streams)
    return runs


def _worker_streams(
    *, seed: int, rank: int, method: str | None, user_fn: Any = None
) -> dict[int, list[tuple[float, float, float]]]:
    return _epochs(seed=seed, rank=rank, method=method, user_fn=user_fn)[0]


@pytest.fixture(scope="module")
def fork_streams() -> dict[int, list[tuple[float, float, float]]]:
    return _worker_streams(seed=11, rank=0, method="fork")


def test_workers_draw_different_streams(
    fork_streams: dict[int, list[tuple[float, float, float]]],
) -> None:
    assert sorted(fork_streams) == [0, 1]
    assert fork_streams[0] != fork_streams[1]
    for column in range(3):  # random, numpy and torch each differ per worker
        assert fork_streams[0][0][column] != fork_streams[1][0][column]


def test_worker_streams_follow_worker_seed(
    fork_streams: dict[int, list[tuple[float, float, float]]],
) -> None:
    for worker_id, stream in fork_streams.items():
        seed_global_rngs(derive_seed(11, "worker", 0, worker_id, _base_seed()))
        expected = [
            (random.random(), float(np.random.random_sample()), torch.rand(1).item())
            for _ in stream
        ]
        assert stream == expected


def test_each_epoch_draws_new_worker_streams() -> None:
    # A plain DataLoader restarts its workers every epoch; seeding them from the
    # seed alone would replay the same augmentation each epoch.
    first, second = _epochs(seed=11, rank=0, method="fork", epochs=2)
    assert first[0] != second[0] and first[1] != second[1]
    for worker_id, stream in second.items():
        seed_global_rngs(derive_seed(11, "worker", 0, worker_id, _base_seed(draw=1)))
        assert stream[0] == (
            random.random(),
            float(np.random.random_sample()),
            torch.rand(1).item(),
        )


def test_same_seed_same_streams_across_runs(
    fork_streams: dict[int, list[tuple[float, float, float]]],
) -> None:
    assert _worker_streams(seed=11, rank=0, method="fork") == fork_streams


@pytest.mark.slow  # spawned workers import torch and loaderkit (~2-5 s each)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_same_streams_across_start_methods(
    method: str, fork_streams: dict[int, list[tuple[float, float, float]]]
) -> None:
    if method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"start method {method!r} unavailable on this platform")
    assert _worker_streams(seed=11, rank=0, method=method) == fork_streams


def test_rank_enters_the_worker_seed(
    fork_streams: dict[int, list[tuple[float, float, float]]],
) -> None:
    other = _worker_streams(seed=11, rank=1, method="fork")
    assert other[0] != fork_streams[0]
    assert other[1] != fork_streams[1]


def test_user_worker_init_fn_is_called_after_seeding() -> None:
    loader = DataLoader(
        helpers.RandomDrawDataset(4),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="fork",
        worker_init_fn=worker_init_fn(3, rank=0, user_fn=helpers.record_user_call),
    )
    calls = {int(worker_id): tuple(c) for _i, worker_id, *_draws, c in loader}
    assert calls == {0: (0,), 1: (1,)}


def test_worker_init_fn_is_a_picklable_partial() -> None:
    fn = worker_init_fn(3, rank=2, user_fn=helpers.record_user_call)
    clone = pickle.loads(pickle.dumps(fn))
    assert clone.keywords == {"seed": 3, "rank": 2, "user_fn": helpers.record_user_call}
    assert clone.func is seeding._init_worker


def test_worker_init_fn_detects_rank_when_not_given() -> None:
    # Hunter 384: built before init_process_group it kept rank 0, so every rank's forked
    # workers drew alike; without a group the rank is read as each worker starts.
    init = worker_init_fn(3)
    assert init.keywords["rank"] is None
    init(0)
    drawn = torch.rand(1).item()
    seed_global_rngs(worker_seed(3, 0, 0))  # in-process: rank 0, no per-iterator base
    assert drawn == torch.rand(1).item()


def test_worker_init_fn_in_process_seeds_and_calls_user_fn() -> None:
    calls: list[int] = []
    worker_init_fn(9, rank=1, user_fn=calls.append)(4)
    drawn = torch.rand(1).item()
    seed_global_rngs(worker_seed(9, 1, 4))
    assert calls == [4]
    assert drawn == torch.rand(1).item()


# --- per-sample randomness --------------------------------------------------------------


def test_sample_generators_are_keyed_by_sample() -> None:
    a = torch.rand(4, generator=sample_generator(1, 2, 3))
    assert torch.equal(a, torch.rand(4, generator=sample_generator(1, 2, 3)))
    for other in [(0, 2, 3), (1, 1, 3), (1, 2, 4)]:
        assert not torch.equal(a, torch.rand(4, generator=sample_generator(*other)))

    n = sample_numpy_rng(1, 2, 3).random(4)
    assert np.array_equal(n, sample_numpy_rng(1, 2, 3).random(4))
    for other in [(0, 2, 3), (1, 1, 3), (1, 2, 4)]:
        assert not np.array_equal(n, sample_numpy_rng(*other).random(4))


def _draw_globals() -> tuple[float, float, float, float]:
    return (
        random.random(),
        float(np.random.random_sample()),
        float(np.random.standard_normal()),
        torch.rand(1).item(),
    )


def test_seeded_sample_is_keyed_by_sample_not_prior_state() -> None:
    seed_global_rngs(1)
    with seeded_sample(5, 0, 9) as value:
        first = _draw_globals()
    seed_global_rngs(2)
    np.random.standard_normal()  # leave a cached Gaussian: must not leak into the sample
    with seeded_sample(5, 0, 9):
        second = _draw_globals()
    with seeded_sample(5, 0, 10):
        third = _draw_globals()
    assert value == sample_seed(5, 0, 9)
    assert first == second
    assert first != third


@pytest.mark.parametrize("gaussians_before", [0, 1, 2, 3])
def test_seeded_sample_restores_global_state(gaussians_before: int) -> None:
    seed_global_rngs(77)
    for _ in range(gaussians_before):  # odd counts leave numpy's Gaussian cache full
        np.random.standard_normal()
    random.gauss(0, 1)  # likewise for random's cache
    torch_state = torch.get_rng_state()
    random_state = random.getstate()
    numpy_state = np.random.get_state()
    expected = [_draw_globals() for _ in range(3)]
    torch.set_rng_state(torch_state)
    random.setstate(random_state)
    np.random.set_state(numpy_state)

    with seeded_sample(3, 1, 4):
        _draw_globals()
        np.random.standard_normal()
        random.gauss(0, 1)
    assert [_draw_globals() for _ in range(3)] == expected


def test_seeded_sample_restores_on_exception() -> None:
    seed_global_rngs(8)
    expected = _draw_globals()
    seed_global_rngs(8)
    with pytest.raises(RuntimeError, match="boom"), seeded_sample(3, 1, 4):
        _draw_globals()
        raise RuntimeError("boom")
    assert _draw_globals() == expected


def test_seeded_sample_slow_path_for_other_bit_generators() -> None:
    original = np.random.mtrand._rand._bit_generator
    np.random.set_bit_generator(  # type: ignore[attr-defined]
        np.random.PCG64(4)
    )
    try:
        state = np.random.get_state(legacy=False)
        expected = np.random.random_sample(3)
        np.random.set_state(state)
        with seeded_sample(3, 1, 4):
            inside = np.random.random_sample()
        assert np.array_equal(np.random.random_sample(3), expected)
        with seeded_sample(3, 1, 4):
            assert np.random.random_sample() == inside
    finally:
        np.random.set_bit_generator(  # type: ignore[attr-defined]
            original
        )


def test_sample_generator_refuses_an_unknown_torch_state_layout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seeding._torch_template.cache_clear()
    monkeypatch.setattr(seeding.np, "little_endian", False)
    try:
        with pytest.raises(
            LoaderkitError,
            match=r"sample_generator: torch .*'s CPU generator state has a layout loaderkit does "
            r"not know; use sample_numpy_rng",
        ):
            sample_generator(0, 0, 0)
    finally:
        seeding._torch_template.cache_clear()


def test_seeded_sample_does_not_touch_accelerator_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", called.append)
    monkeypatch.setattr(torch.cuda, "manual_seed", called.append)
    with seeded_sample(1, 2, 3):
        pass
    assert called == []


@pytest.fixture(autouse=True)
def _restore_global_rngs() -> Iterator[None]:
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def test_draws_nothing_sees_through_loaderkit_splits() -> None:
    # Was False: a val_fraction split of a list of tensors was seeded per sample (1.7 -> 9 us).
    tensors = [torch.zeros(2), torch.ones(2)]
    assert seeding.draws_nothing(split_source(index_subset(tensors, np.arange(2))))
    twice = index_subset(index_subset(tensors, np.arange(2)), np.arange(1))
    assert seeding.draws_nothing(split_source(twice))

    class Drawing(list):  # type: ignore[type-arg]
        def __getitem__(self, i: Any) -> Any:
            return torch.rand(1)

    assert not seeding.draws_nothing(split_source(index_subset(Drawing(tensors), np.arange(2))))


def test_numpy_ints_are_taken_as_seeds_and_keys() -> None:
    # Hunter 262: Subset(ds, np.arange(...)) hands __getitem__ np.int64 indices, which the
    # documented sample_generator(seed, epoch, index) recipe refused; seed=np.int64 too.
    n = np.int64
    assert sample_generator(n(1), n(0), n(5)).initial_seed() == (
        sample_generator(1, 0, 5).initial_seed()
    )
    assert derive_seed(n(1), "worker", n(0)) == derive_seed(1, "worker", 0)
    assert worker_seed(n(1), n(0), n(2)) == worker_seed(1, 0, 2)
    seed_global_rngs(n(3))
    loader = ResumableDataLoader(list(range(8)), batch_size=2, shuffle=True, seed=n(4))
    assert type(loader.state_dict()["plan"]["seed"]) is int
