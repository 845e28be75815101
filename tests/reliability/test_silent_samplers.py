"""User samplers' own generators and self-splitting samplers (issue 21, second review).

Each test is a case measured on 84cc6ec (or the review's main) returning other
data than the user asked for with no error, or an error naming the wrong cause.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, WeightedRandomSampler

from loaderkit import ResumableDataLoader
from loaderkit.errors import StateMismatchError
from loaderkit.plan._cursor import seal

DATA = list(range(12))


def ids_of(batches: Any) -> list[list[int]]:
    return [[int(i) for i in batch] for batch in batches]


def _reseeded_run(
    *, draw_between: bool, reseed_after_build: bool, stop_at: int | None = None, state: Any = None
) -> tuple[list[list[int]], Any]:
    """A script: a RandomSampler's generator seeded after the loader was built (or
    drawn from by the loop between epochs); two epochs, or the rest after a resume."""
    g = torch.Generator() if reseed_after_build else torch.Generator().manual_seed(0)
    loader = ResumableDataLoader(DATA, batch_size=3, sampler=RandomSampler(DATA, generator=g))
    if reseed_after_build:
        g.manual_seed(5)
    if state is not None:
        loader.load_state_dict(state)
    out: list[list[int]] = []
    for _ in range(2 - (state["epoch"] if state is not None else 0)):
        for batch in loader:
            out.append([int(i) for i in batch])
            if stop_at is not None and len(out) == stop_at:
                return out, loader.state_dict()
        if draw_between:
            torch.rand(1, generator=g)  # the loop draws from the sampler's generator
    return out, None


def _loaded_state(state: Any, reseed_after_build: bool) -> Any:
    g = torch.Generator() if reseed_after_build else torch.Generator().manual_seed(0)
    loader = ResumableDataLoader(DATA, batch_size=3, sampler=RandomSampler(DATA, generator=g))
    loader.load_state_dict(state)
    return loader.state_dict()


@pytest.mark.parametrize("stop_at", [2, 5])
@pytest.mark.parametrize(
    ("draw_between", "reseed_after_build"), [(False, True), (True, False)], ids=["reseed", "draw"]
)
def test_reseeded_generator_resumes_exactly(
    draw_between: bool, reseed_after_build: bool, stop_at: int
) -> None:
    # 84cc6ec: the resumed epoch was listed from the generator's current state or from
    # (seed, epoch) by this process's history: samples repeated and missing.
    kw = {"draw_between": draw_between, "reseed_after_build": reseed_after_build}
    full, _ = _reseeded_run(**kw)
    head, state = _reseeded_run(**kw, stop_at=stop_at)
    rest, _ = _reseeded_run(**kw, state=state)
    assert head + rest == full
    # A state saved right after the load, before the epoch is listed again, too.
    rest_again, _ = _reseeded_run(**kw, state=_loaded_state(state, reseed_after_build))
    assert head + rest_again == full
    resumed_epoch = (head + rest)[4:] if stop_at == 5 else (head + rest)[:4]
    epoch = [i for batch in resumed_epoch for i in batch]
    assert sorted(epoch) == DATA


def _reseeding(epochs: range, loader: Any, g: torch.Generator, set_epoch: bool) -> Any:
    out = []
    for epoch in epochs:
        g.manual_seed(100 + epoch)  # the user's reseed before each epoch
        if set_epoch:
            loader.set_epoch(epoch)
        out.append(ids_of(loader))
    return out


def test_a_state_saved_before_a_reseeded_epoch_is_listed_resumes_its_order() -> None:
    # Hunter 244: a state at position 0 of an epoch not listed yet resumed it keyed to (seed,
    # epoch) or the build-time state, not the user's reseed (another permutation than torch's).
    def make() -> tuple[torch.Generator, ResumableDataLoader]:
        g = torch.Generator().manual_seed(0)
        return g, ResumableDataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, generator=g))

    g, torch_loader = make()
    torch_loader = DataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, generator=g))
    full = _reseeding(range(2), torch_loader, g, False)
    g, cut = make()
    g.manual_seed(100)
    state = cut.state_dict()  # epoch 0, before its first batch
    g, resumed = make()
    resumed.load_state_dict(state)
    assert _reseeding(range(2), resumed, g, False) == full
    g, cut = make()
    head = _reseeding(range(1), cut, g, True)
    g.manual_seed(101)
    cut.set_epoch(1)
    state = cut.state_dict()  # epoch 1, before its first batch
    g, resumed = make()
    resumed.load_state_dict(state)
    assert head + _reseeding(range(1, 2), resumed, g, True) == full


def test_a_reseed_after_loading_a_state_at_an_epochs_start_decides_it() -> None:
    # Review 249: a state at position 0 pinned its epoch to (seed, epoch), so the loop's
    # reseed after load_state_dict (as torch, a reseed before the epoch begins) was ignored.
    def make() -> tuple[torch.Generator, ResumableDataLoader]:
        g = torch.Generator().manual_seed(0)
        return g, ResumableDataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, generator=g))

    def loop(g: torch.Generator, loader: Any, epochs: range, state: Any = None) -> Any:
        out = []
        for epoch in epochs:
            loader.set_epoch(epoch)
            if state is not None:
                loader.load_state_dict(state)
                state = None
            g.manual_seed(100 + epoch)
            out.append(ids_of(loader))
        return out

    g, whole = make()
    full = loop(g, whole, range(2))
    _, cut = make()
    g, resumed = make()
    assert loop(g, resumed, range(2), cut.state_dict()) == full
    g, cut = make()
    head = loop(g, cut, range(1))
    cut.set_epoch(1)
    g, resumed = make()
    assert head + loop(g, resumed, range(1, 2), cut.state_dict()) == full


def test_a_generator_restored_before_the_load_is_kept() -> None:
    # Review 249: relisting an ended epoch on load put back the generator the user had
    # restored (and drew from since) before load_state_dict; that relisting was taken back.
    def make() -> tuple[torch.Generator, ResumableDataLoader]:
        g = torch.Generator().manual_seed(0)
        return g, ResumableDataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, generator=g))

    def epoch(g: torch.Generator, loader: Any) -> Any:
        torch.rand(1, generator=g)
        out = ids_of(loader)
        torch.rand(1, generator=g)
        return out

    g, whole = make()
    full = [epoch(g, whole) for _ in range(3)]
    g, cut = make()
    head = [epoch(g, cut)]
    saved, state = g.get_state(), cut.state_dict()
    g, resumed = make()
    g.set_state(saved)
    resumed.load_state_dict(state)
    assert head + [epoch(g, resumed) for _ in range(2)] == full


@pytest.mark.parametrize("where", ["epoch end", "mid-epoch"])
@pytest.mark.parametrize("user", ["draws each step", "draws between epochs", "reseeds to one seed"])
def test_the_samplers_generator_resumes_where_the_saved_run_left_it(where: str, user: str) -> None:
    # The state did not carry the user's generator: a resume from an epoch's end listed the
    # next epoch from the generator as built (epoch 2 was epoch 0's order; a reseed to one
    # seed went unseen), and a mid-epoch one put it back where the listing had left it
    # (the user's draws since were drawn again, and the next epoch differed).
    def make() -> tuple[torch.Generator, ResumableDataLoader]:
        g = torch.Generator().manual_seed(7)
        return g, ResumableDataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, generator=g))

    def run(g: torch.Generator, loader: Any, epochs: int, stop: int | None = None) -> list[Any]:
        out: list[Any] = []
        for _ in range(epochs):
            if user == "reseeds to one seed":
                g.manual_seed(7)
            for batch in loader:
                noise = torch.rand(1, generator=g) if user == "draws each step" else None
                out.append((ids_of([batch]), noise))
                if len(out) == stop:
                    return out
            if user == "draws between epochs":
                torch.rand(1, generator=g)
        return out

    g, whole = make()
    full = run(g, whole, 3)
    g, cut = make()
    stop = 3 if where == "epoch end" else 4
    head = run(g, cut, 2, stop=stop)
    state = cut.state_dict()
    g, resumed = make()
    resumed.load_state_dict(state)
    rest: list[Any] = []
    if where == "mid-epoch":
        for batch in resumed:  # the rest of epoch 1, then the loop's own epoch end
            noise = torch.rand(1, generator=g) if user == "draws each step" else None
            rest.append((ids_of([batch]), noise))
    if user == "draws between epochs":  # the loop's own epoch end, after the saved batch
        torch.rand(1, generator=g)
    rest += run(g, resumed, 1 if where == "mid-epoch" else 2)
    assert [(i, None if n is None else n.item()) for i, n in head + rest] == [
        (i, None if n is None else n.item()) for i, n in full
    ]


@pytest.mark.parametrize("save", ["before the first batch", "after set_epoch(1)"])
@pytest.mark.parametrize("reseed", [False, True], ids=["draws", "reseeds after the load"])
def test_a_state_at_an_epochs_start_lists_it_as_the_saved_run_would(
    save: str, reseed: bool
) -> None:
    # Review 258: held there, the generator did not move with the epoch's listing (other
    # draws and a later epoch's order); a reseed after the load was overridden by the
    # generator state the epoch would have been listed from.
    def make() -> tuple[torch.Generator, ResumableDataLoader]:
        g = torch.Generator().manual_seed(7)
        return g, ResumableDataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, generator=g))

    def epoch(g: torch.Generator, loader: Any, e: int) -> list[Any]:
        if reseed:
            g.manual_seed(100 + e)
        return [(ids_of([b]), torch.rand(1, generator=g).item()) for b in loader]

    g, whole = make()
    full = [epoch(g, whole, e) for e in range(3)]
    g, cut = make()
    first = 0 if save == "before the first batch" else 1
    head = [epoch(g, cut, 0)] if first else []
    if first:
        cut.set_epoch(1)
    state = cut.state_dict()
    g, resumed = make()
    resumed.load_state_dict(state)
    assert head + [epoch(g, resumed, e) for e in range(first, 3)] == full


@pytest.mark.parametrize("how", ["listed early, then drawn", "drawn, handed on"])
def test_a_state_at_an_epochs_start_after_the_generator_moved_lists_it_from_there(how: str) -> None:
    # Review 260: the state kept the listing (or the state before the draw) it was saved
    # with, so the resumed epoch came from a generator the user had moved on from.
    def make() -> tuple[torch.Generator, ResumableDataLoader]:
        g = torch.Generator().manual_seed(7)
        return g, ResumableDataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, generator=g))

    def run(cut: bool) -> list[Any]:
        g, loader = make()
        out: list[Any] = ids_of(loader)
        g.manual_seed(100)
        loader.set_epoch(1)
        if how == "listed early, then drawn":
            list(loader.batch_sampler)  # epoch 1 listed before it begins
        elif cut:
            state = loader.state_dict()
            g, loader = make()
            loader.load_state_dict(state)
        torch.rand(1, generator=g)
        if cut:
            state = loader.state_dict()
            g, loader = make()
            loader.load_state_dict(state)
        return [*out, *ids_of(loader), torch.rand(1, generator=g).item(), *ids_of(loader)]

    assert run(cut=True) == run(cut=False)


def test_a_state_with_generator_states_that_are_not_is_refused_by_name() -> None:
    g = torch.Generator().manual_seed(7)
    loader = ResumableDataLoader(DATA, batch_size=4, sampler=RandomSampler(DATA, generator=g))
    next(iter(loader))
    torch.rand(1, generator=g)
    state = loader.state_dict()
    state["plan"] = {**state["plan"], "generator_now": state["plan"]["generator_now"][:-8]}
    with pytest.raises(StateMismatchError, match=r"'generator_now'.*not a CPU torch.Generator"):
        loader.load_state_dict(seal(state))


def test_reseed_to_the_same_value_each_epoch_lists_one_order_as_torch() -> None:
    # Was a known difference: the lent generator left the user's where it was, so a reseed
    # to the same state was not seen and epochs differed. The user's now advances as torch's.
    g = torch.Generator()
    loader = ResumableDataLoader(DATA, batch_size=12, sampler=RandomSampler(DATA, generator=g))
    orders = []
    for _ in range(3):
        g.manual_seed(0)
        orders.append(ids_of(loader)[0])
    assert orders == [list(torch.randperm(12, generator=torch.Generator().manual_seed(0)))] * 3


class FixedOrder(RandomSampler):
    """The documented way to the same shuffled order every epoch."""

    def set_epoch(self, epoch: int) -> None:
        assert self.generator is not None
        self.generator.manual_seed(0)


def test_set_epoch_that_reseeds_gives_one_order_every_epoch() -> None:
    sampler = FixedOrder(DATA, generator=torch.Generator())
    loader = ResumableDataLoader(DATA, batch_size=12, sampler=sampler)
    orders = [ids_of(loader)[0] for _ in range(3)]
    assert orders == [list(torch.randperm(12, generator=torch.Generator().manual_seed(0)))] * 3


def _wrapper(inner: Any, rank: int) -> Any:
    pytest.importorskip("lightning")
    from lightning.fabric.utilities.distributed import DistributedSamplerWrapper

    return DistributedSamplerWrapper(inner, num_replicas=2, rank=rank, shuffle=True, seed=0)


@pytest.mark.parametrize("kind", ["random", "weighted"])
@pytest.mark.parametrize("rank", [0, 1])
def test_wrapper_inner_generator_seed_is_torchs_epoch_0(kind: str, rank: int) -> None:
    # 84cc6ec: the wrapper has no `generator`, so the inner sampler's seed was ignored
    # (seeds 3 and 4 gave the same order, neither torch's).
    def inner(seed: int) -> Any:
        g = torch.Generator().manual_seed(seed)
        if kind == "random":
            return RandomSampler(DATA, generator=g)
        return WeightedRandomSampler([1.0] * 12, 12, generator=g)

    orders = {}
    for seed in (3, 4):
        torch_sampler = _wrapper(inner(seed), rank)
        torch_sampler.set_epoch(0)
        expected = ids_of(DataLoader(DATA, batch_size=2, sampler=torch_sampler))
        got = ids_of(ResumableDataLoader(DATA, batch_size=2, sampler=_wrapper(inner(seed), rank)))
        assert got == expected
        orders[seed] = got
    assert orders[3] != orders[4]


@pytest.mark.parametrize("kind", ["random", "weighted"])
def test_wrapper_inner_generator_seed_keys_every_epoch(kind: str) -> None:
    # 0ad19c7: epochs >= 1 were keyed to the wrapper's seed alone: inner seeds 3 and 4 gave one
    # order there. Each seed's run also resumes inside epoch 1 exactly.
    def loader(seed: int) -> ResumableDataLoader:
        g = torch.Generator().manual_seed(seed)
        inner: Any = RandomSampler(DATA, generator=g)
        if kind == "weighted":
            inner = WeightedRandomSampler([1.0] * 12, 12, generator=g)
        return ResumableDataLoader(DATA, batch_size=2, sampler=_wrapper(inner, 0))

    runs = {}
    for seed in (3, 4):
        whole = loader(seed)
        runs[seed] = [ids_of(whole) for _ in range(3)]
        cut = loader(seed)
        before = ids_of(cut)
        it = iter(cut)
        before += [[int(i) for i in next(it)]]
        resumed = loader(seed)
        resumed.load_state_dict(cut.state_dict())
        assert [*before, *ids_of(resumed)] == [*runs[seed][0], *runs[seed][1]]
    for epoch in (1, 2):
        assert runs[3][epoch] != runs[4][epoch], f"epoch {epoch}"


def test_wrapper_loaders_rebuilt_over_one_inner_sampler_resume_exactly() -> None:
    # Review 245: a loader built after another had drawn from the inner generator keyed its
    # later epochs to a digest of the moved state; a resumed process keyed them to the seed.
    def loader_over(inner: Any, epoch: int) -> ResumableDataLoader:
        sampler = _wrapper(inner, 0)
        sampler.set_epoch(epoch)
        return ResumableDataLoader(DATA, batch_size=2, sampler=sampler)

    def inner() -> Any:
        return RandomSampler(DATA, generator=torch.Generator().manual_seed(3))

    kept = inner()
    full = [ids_of(loader_over(kept, epoch)) for epoch in range(3)]
    kept = inner()
    ids_of(loader_over(kept, 0))
    cut = loader_over(kept, 1)
    head = [[int(i) for i in next(iter(cut))]]
    resumed = loader_over(inner(), 1)  # a new process: the generator as seeded
    resumed.load_state_dict(cut.state_dict())
    assert head + ids_of(resumed) == full[1]
    assert ids_of(loader_over(inner(), 0)) == full[0]


def test_a_wrapped_generator_seeded_after_the_loader_was_built_keys_every_epoch() -> None:
    # Review 246: epochs >= 1 were keyed to the seed the generator had when the loader was
    # built: seeds 7 and 8 given after it gave one order there, builds 3 and 4 two.
    def epochs(build: int, seed: int) -> list[Any]:
        g = torch.Generator().manual_seed(build)
        loader = ResumableDataLoader(
            DATA, batch_size=2, sampler=_wrapper(RandomSampler(DATA, generator=g), 0)
        )
        g.manual_seed(seed)
        return [ids_of(loader) for _ in range(3)]

    seven, eight, other_build = epochs(3, 7), epochs(3, 8), epochs(4, 7)
    assert all(seven[e] != eight[e] for e in range(3))
    assert seven == other_build


def test_a_wrapper_state_of_another_inner_seed_is_refused() -> None:
    # Review 245: a state saved inside epoch 0 with inner seed 3 went on with seed 4's order
    # (samples 2 and 11 twice, 4 and 9 never).
    def loader(seed: int) -> ResumableDataLoader:
        inner = RandomSampler(DATA, generator=torch.Generator().manual_seed(seed))
        return ResumableDataLoader(DATA, batch_size=2, sampler=_wrapper(inner, 0))

    cut = loader(3)
    next(iter(cut))
    with pytest.raises(StateMismatchError, match=r"seeded 3 .* and 4 here.*manual_seed\(3\)"):
        loader(4).load_state_dict(cut.state_dict())


def test_other_weights_error_names_the_sampler_and_causes() -> None:
    # 84cc6ec: "torch or loaderkit version changed?" for a sampler built with other weights.
    loader = ResumableDataLoader(
        DATA, batch_size=2, seed=0, sampler=WeightedRandomSampler([1.0] * 12, 12)
    )
    next(iter(loader))
    state = loader.state_dict()
    other = ResumableDataLoader(
        DATA, batch_size=2, seed=0, sampler=WeightedRandomSampler([1.0] * 6 + [2.0] * 6, 12)
    )
    with pytest.raises(
        StateMismatchError,
        match=r"sampler=WeightedRandomSampler lists another order.*other weights or indices.*"
        r"another world size.*another torch version",
    ):
        other.load_state_dict(state)


def test_a_sampler_rebuilt_with_its_weights_of_the_saved_epoch_resumes_it() -> None:
    # Hunter 341: weights mined between epochs, rebuilt as they were at a checkpoint inside
    # epoch 1, were refused by epoch 0's order; that epoch's own order is what is checked.
    weights = [torch.ones(12, dtype=torch.double), torch.tensor([5.0] * 2 + [1.0] * 10)]

    def loader(w: torch.Tensor) -> ResumableDataLoader:
        g = torch.Generator().manual_seed(1)
        return ResumableDataLoader(
            DATA, batch_size=3, sampler=WeightedRandomSampler(w, 12, generator=g)
        )

    run = loader(weights[0])
    list(run)
    run.sampler.weights = weights[1]
    it = iter(run)
    next(it)
    state = run.state_dict()
    rest = [b.tolist() for b in it]
    resumed = loader(weights[1])
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == rest
    other = loader(torch.tensor([1.0] * 10 + [5.0] * 2))  # not that epoch's weights
    with pytest.raises(StateMismatchError, match="lists epoch 1 otherwise than the run"):
        other.load_state_dict(state)


class Contiguous(DistributedSampler):
    """Splits ranks itself: contiguous blocks of one shuffled order, padded."""

    def __iter__(self) -> Any:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.dataset), generator=g).tolist()  # type: ignore[arg-type]
        order += order[: self.total_size - len(order)]
        return iter(order[self.rank * self.num_samples : (self.rank + 1) * self.num_samples])


def _contiguous_state(size: int, drop_last: bool = False) -> tuple[list[int], Any]:
    data = list(range(size))
    sampler = Contiguous(data, num_replicas=2, rank=0, seed=0, drop_last=drop_last)
    loader = ResumableDataLoader(data, batch_size=2, sampler=sampler)
    next(iter(loader))
    return data, loader.state_dict()


def test_self_splitting_sampler_on_another_world_size_names_the_world_size() -> None:
    # 84cc6ec: an order_check mismatch blamed the torch and loaderkit versions.
    data, state = _contiguous_state(24)
    sampler = Contiguous(data, num_replicas=3, rank=0, seed=0)
    with pytest.raises(
        StateMismatchError,
        match=r"DistributedSampler subclass lists another order.*another world size",
    ):
        ResumableDataLoader(data, batch_size=2, sampler=sampler).load_state_dict(state)
    # Saved inside epoch 1, that epoch's order is checked (review 343: it blamed weights).
    loader = ResumableDataLoader(data, batch_size=2, sampler=Contiguous(data, 2, 0, seed=0))
    list(loader)
    next(iter(loader))
    sampler = Contiguous(data, num_replicas=3, rank=0, seed=0)
    with pytest.raises(
        StateMismatchError, match=r"sampler=Contiguous lists epoch 1 .*another world size"
    ):
        ResumableDataLoader(data, batch_size=2, sampler=sampler).load_state_dict(
            loader.state_dict()
        )


def test_padding_error_does_not_tell_a_drop_last_false_user_to_pass_it() -> None:
    # 84cc6ec: "build the sampler with drop_last=False" to a sampler built with it.
    data, state = _contiguous_state(20)
    sampler = Contiguous(data, num_replicas=3, rank=0, seed=0)
    with pytest.raises(StateMismatchError, match=r"splits ranks itself") as caught:
        ResumableDataLoader(data, batch_size=2, sampler=sampler).load_state_dict(state)
    assert "drop_last=False" not in str(caught.value)
    assert "Resume on the saved world size of 2" in str(caught.value)


def test_trimmed_distributed_sampler_on_another_world_size_names_drop_last_true() -> None:
    data = list(range(20))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, drop_last=True)
    loader = ResumableDataLoader(data, batch_size=2, sampler=sampler)
    next(iter(loader))
    state = loader.state_dict()
    other = DistributedSampler(data, num_replicas=3, rank=0, drop_last=True)
    with pytest.raises(
        StateMismatchError,
        match=r"DistributedSampler\(drop_last=True\) order has 20 entries under the saved world "
        r"size of 2 and 18.*build the sampler with drop_last=False",
    ):
        ResumableDataLoader(data, batch_size=2, sampler=other).load_state_dict(state)
