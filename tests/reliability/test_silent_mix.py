"""Silent edges of MixedDataset: a reordered or changed mix, a mix of mixes, shared augmentation.

Each case returned other data than asked for, with no error, on 84cc6ec:
a resume into the same sources in another order was accepted (duplicates),
a source that grew after the mix was built was never read, a mix nested in a
mix drew from the inner sources uniformly, and an upsampled sample's copies
in one epoch got bit-identical augmentation.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import ConcatDataset, Dataset, StackDataset, Subset

from loaderkit import (
    BucketBatchSampler,
    MixedDataset,
    MixPlan,
    ResumableDataLoader,
    ShardedDataset,
    StateMismatchError,
    TokenReader,
    write_shards,
)
from loaderkit.plan._cursor import seal


class Source(Dataset[dict[str, Any]]):
    """Item ``i`` is ``{"id": base + i, "x": torch.rand(2)}``: a random augmentation per read."""

    def __init__(self, size: int, base: int) -> None:
        self.items = list(range(base, base + size))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"id": self.items[index], "x": torch.rand(2)}


def _loader(mix: MixedDataset, *, bucket: bool = False, num_workers: int = 0) -> Any:
    if bucket:
        sampler = mix.bucket_batch_sampler(batch_size=4, lengths=[1] * len(mix), seed=3)
        return ResumableDataLoader(mix, batch_sampler=sampler, num_workers=num_workers)
    sampler = mix.batch_sampler(4, seed=3)
    return ResumableDataLoader(mix, batch_sampler=sampler, num_workers=num_workers)


@pytest.mark.parametrize("bucket", [False, True], ids=["fixed", "bucket"])
def test_a_mix_resumed_with_its_sources_in_another_order_is_refused(bucket: bool) -> None:
    a, b = Source(10, 0), Source(10, 100)
    run = _loader(MixedDataset({"a": a, "b": b}, weights={"a": 1, "b": 1}), bucket=bucket)
    it = iter(run)
    next(it)
    next(it)
    state = run.state_dict()
    swapped = _loader(MixedDataset({"b": b, "a": a}, weights={"b": 1, "a": 1}), bucket=bucket)
    with pytest.raises(
        StateMismatchError,
        match=r"field 'source_names' differs: the mix has other source names than the saved "
        r"run's \(\['a', 'b'\], here \['b', 'a'\]\); build the MixedDataset as it was",
    ):
        swapped.load_state_dict(state)
    same = _loader(MixedDataset({"a": a, "b": b}, weights={"a": 1, "b": 1}), bucket=bucket)
    same.load_state_dict(state)  # the same mix resumes


def test_a_source_that_grew_after_the_mix_was_built_is_refused_at_the_next_epoch() -> None:
    web, books = Source(10, 0), Source(5, 100)
    mix = MixedDataset({"web": web, "books": books})
    loader = _loader(mix)
    assert len([b for b in loader]) == 4  # epoch 0: 15 samples
    web.items.extend(range(10, 15))
    with pytest.raises(
        StateMismatchError,
        match=r"source 'web' has 15 samples now, 10 when the mix was built.*build a new "
        r"MixedDataset and loader",
    ):
        next(iter(loader))


def test_a_mix_of_mixes_is_refused_by_name_with_the_fix() -> None:
    inner = MixedDataset({"a": Source(10, 0), "b": Source(10, 100)}, weights=[1, 1])
    with pytest.raises(
        TypeError,
        match=r"source 'inner' is itself a MixedDataset, whose weights a mix of mixes would "
        r"ignore.*pass its sources to this mix directly",
    ):
        MixedDataset({"inner": inner, "c": Source(4, 200)}, weights=[9, 1])


def _draws(mix: MixedDataset, *, bucket: bool, num_workers: int) -> list[tuple[int, bytes]]:
    out = []
    for batch in _loader(mix, bucket=bucket, num_workers=num_workers):
        for i, x in zip(batch["id"].tolist(), batch["x"], strict=True):
            out.append((i, x.numpy().tobytes()))
    return out


@pytest.mark.parametrize("bucket", [False, True], ids=["fixed", "bucket"])
def test_each_draw_of_an_upsampled_sample_gets_its_own_augmentation(bucket: bool) -> None:
    mix = MixedDataset({"small": Source(4, 0), "big": Source(12, 100)}, repeat=[2.5, 1])
    draws = _draws(mix, bucket=bucket, num_workers=0)
    by_id: dict[int, list[bytes]] = defaultdict(list)
    for i, x in draws:
        by_id[i].append(x)
    repeated = {i: xs for i, xs in by_id.items() if len(xs) > 1}
    assert repeated, "the upsampled source should repeat samples within the epoch"
    for i, xs in repeated.items():
        assert len(set(xs)) == len(xs), f"sample {i}'s {len(xs)} draws share augmentation"
    # Keyed by draw, not by process: the same with workers.
    assert _draws(mix, bucket=bucket, num_workers=2) == draws


def test_per_draw_augmentation_survives_a_resume() -> None:
    mix = MixedDataset({"small": Source(3, 0), "big": Source(9, 100)}, repeat=[3, 1])
    full = [(b["id"].tolist(), b["x"]) for b in _loader(mix)]
    first = _loader(mix)
    it = iter(first)
    before = [next(it) for _ in range(2)]
    resumed = _loader(mix)
    resumed.load_state_dict(first.state_dict())
    got = [(b["id"].tolist(), b["x"]) for b in [*before, *resumed]]
    assert [ids for ids, _ in got] == [ids for ids, _ in full]
    for (_, want), (_, have) in zip(full, got, strict=True):
        assert torch.equal(want, have)


def test_mix_identity_and_draw_key_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match=r"source_names must name each of the 2 sources once"):
        MixPlan(source_sizes=(3, 4), per_epoch=(3, 4), batch_size=2, source_names=["a", "a"])
    with pytest.raises(TypeError, match=r"source_names must be a list of str, one per source"):
        MixPlan(source_sizes=(3, 4), per_epoch=(3, 4), batch_size=2, source_names="ab")
    with pytest.raises(ValueError, match=r"needs seeding keys >= 2\*\*63.*most upsampled"):
        MixPlan(source_sizes=(1, 2**40), per_epoch=(2**40, 1), batch_size=2)
    with pytest.raises(ValueError, match=r"source_sizes and per_epoch go together"):
        BucketBatchSampler([1, 2], batch_size=1, source_names=["a"])


# ------------------------------------------------ sources given as a list (no names)
def _id_shards(folder: Path, first: int) -> ShardedDataset:
    reader = TokenReader(seq_len=2)
    tokens = np.repeat(np.arange(first, first + 10), 2)
    write_shards(folder, [tokens[:8], tokens[8:]], reader)
    return ShardedDataset(folder, reader)


def test_a_list_mix_of_shard_folders_resumed_in_another_order_is_refused(tmp_path: Path) -> None:
    # On the merge of i22, the list's sources were named "0", "1" whatever they held:
    # the reordered resume was accepted, with 4 duplicates in an epoch of 20.
    web, books = _id_shards(tmp_path / "web", 0), _id_shards(tmp_path / "books", 100)

    def run(sources: list[Any]) -> ResumableDataLoader:
        mix = MixedDataset(sources, weights=[1, 1])
        return ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(4, seed=3))

    first = run([web, books])
    it = iter(first)
    next(it)
    state = first.state_dict()
    with pytest.raises(StateMismatchError, match=r"field 'source_names' differs.*books.*web"):
        run([books, web]).load_state_dict(state)
    run([web, books]).load_state_dict(state)  # the same list resumes
    assert MixedDataset([web, books]).names == ["web", "books"]  # the folders' names
    files = ShardedDataset(web.shards, web.reader)  # named by its files
    assert MixedDataset([files, books]).names[0].startswith("web/shard-00000.npy .. ")


def test_a_list_of_sources_a_state_cannot_tell_apart_is_refused_at_construction() -> None:
    a, b = Source(10, 0), Source(10, 100)
    with pytest.raises(
        ValueError,
        match=r"sources\[0\] and sources\[1\] have no name and the same size \(10\), so a "
        r"resume cannot tell them apart.*pass the sources as a dict by name",
    ):
        MixedDataset([a, b], weights=[1, 1])
    # Told apart by size: the state's sizes check their order. Not by weight: swapped with
    # the weights as listed ([1, 3]), the state was alike and the mix 17:3, not 5:15.
    assert MixedDataset([a, Source(12, 100)]).names == ["0", "1"]
    with pytest.raises(ValueError, match=r"have no name and the same size \(10\)"):
        MixedDataset([a, b], weights=[1, 3])
    a._source_name = b._source_name = "web"  # type: ignore[attr-defined]  # one folder twice
    with pytest.raises(ValueError, match=r"have the name 'web' and the same size \(10\)"):
        MixedDataset([a, b], weights=[1, 3])


# ---------------------------------------------------- a mix inside a torch wrapper
@pytest.mark.parametrize("wrap", ["subset", "concat", "subset-of-concat", "stack"])
def test_a_mix_inside_a_torch_wrapper_is_refused_like_a_mix_of_mixes(wrap: str) -> None:
    inner = MixedDataset({"a": Source(90, 0), "b": Source(10, 100)}, weights=[1, 1])
    wrapped: Any = {
        "subset": Subset(inner, range(len(inner))),
        "concat": ConcatDataset([Source(3, 500), inner]),
        "subset-of-concat": Subset(ConcatDataset([inner]), [0, 1]),
        "stack": StackDataset(inner, list(range(len(inner)))),  # hunter 341
    }[wrap]
    with pytest.raises(
        TypeError,
        match=r"source 'inner' holds a MixedDataset \(through a torch Subset, "
        r"ConcatDataset, StackDataset or an attribute\), whose weights a mix of mixes would "
        r"ignore.*pass its "
        r"sources to this mix directly",
    ):
        MixedDataset({"inner": wrapped, "c": Source(100, 200)}, weights=[1, 1])


# ------------------------------------------- a state saved before the mix's identity
def test_a_mix_state_saved_without_the_mix_identity_is_refused_in_two_clear_sentences() -> None:
    mix = MixedDataset({"a": Source(10, 0), "b": Source(10, 100)})
    run = _loader(mix)
    next(iter(run))
    state = run.state_dict()
    for key in ("repeat_seeding", "source_names"):  # what 84cc6ec's mix plans lacked
        del state["plan"][key]
    seal(state)
    with pytest.raises(StateMismatchError) as info:
        _loader(mix).load_state_dict(state)
    message = str(info.value)
    assert re.fullmatch(
        r"ResumableDataLoader\.load_state_dict: field 'plan' has no 'repeat_seeding' or "
        r"'source_names' \(this loaderkit's plan: repeat_seeding='per_draw', source_names="
        r"\['a', 'b'\]\), so the state was saved by an older loaderkit that ordered the samples "
        r"differently\. Finish that run with the loaderkit that saved it, or start without the "
        r"state\.",
        message,
    ), message


def test_an_unweighted_mix_under_a_plain_loader_resumed_reordered_is_refused() -> None:
    # A plain plan's state held only the sample count: {"b", "a"} resumed a state of
    # {"a", "b"}, drawing samples 5 and 102 twice and 2 and 4 never in epoch 0.
    def loader(sources: dict[str, Any]) -> ResumableDataLoader:
        return ResumableDataLoader(MixedDataset(sources), batch_size=4, shuffle=True, seed=0)

    a, b = Source(7, 0), Source(5, 100)
    first = loader({"a": a, "b": b})
    next(iter(first))
    state = first.state_dict()
    for other in ({"b": b, "a": a}, {"x": a, "b": b}):
        with pytest.raises(StateMismatchError, match=r"'mix_sources_crc32' differs"):
            loader(other).load_state_dict(state)
    loader({"a": a, "b": b}).load_state_dict(state)  # the same mix resumes
    older = {**state, "plan": {k: v for k, v in state["plan"].items() if k != "mix_sources_crc32"}}
    loader({"a": a, "b": b}).load_state_dict(seal(older))  # saved before the field: checked without


def test_weights_keyed_like_the_sources_are_taken() -> None:
    # Int keys: the sources were named "0", "1" and the weights refused as unknown [0, 1].
    mix = MixedDataset({0: Source(10, 0), 1: Source(5, 100)}, weights={0: 1, 1: 3}, epoch_size=8)
    assert mix.per_epoch == (2, 6)


@pytest.mark.parametrize("wrap", ["subset", "concat"])
def test_a_reordered_unweighted_mix_inside_a_torch_wrapper_is_refused(wrap: str) -> None:
    # Only a bare mix was checked: through a Subset (a val_fraction split) or a ConcatDataset,
    # the swapped mix resumed (5 samples twice, 5 never).
    def loader(sources: dict[str, Any]) -> ResumableDataLoader:
        mix = MixedDataset(sources)
        ds: Any = (
            Subset(mix, range(12)) if wrap == "subset" else ConcatDataset([mix, Source(4, 500)])
        )
        return ResumableDataLoader(ds, batch_size=4, shuffle=True, seed=0)

    a, b = Source(6, 0), Source(10, 100)
    first = loader({"a": a, "b": b})
    next(iter(first))
    state = first.state_dict()
    with pytest.raises(StateMismatchError, match=r"'mix_sources_crc32' differs"):
        loader({"b": b, "a": a}).load_state_dict(state)
    loader({"a": a, "b": b}).load_state_dict(state)


def test_source_keys_alike_as_str_are_refused() -> None:
    with pytest.raises(ValueError, match=r"source keys \[1, '1'\] name two sources alike"):
        MixedDataset({1: Source(4, 0), "1": Source(4, 100)})


def test_a_mix_across_stores_resumes_after_a_source_moved(tmp_path: Path) -> None:
    # Hunter 318: a local folder beside a URL share no folder, so their whole paths (the
    # local folder's place, the server's port) were compared, and a moved source refused.
    import os
    import shutil

    reader = TokenReader(seq_len=2)
    url = f"memory://across-{os.getpid()}/data"
    write_shards(url, [np.repeat(np.arange(100, 110), 2)], reader, progress=False)
    local = _id_shards(tmp_path / "web", 0)
    moved = tmp_path / "moved" / "web"
    shutil.copytree(tmp_path / "web", moved)

    def run(web: Any, at: str = url) -> ResumableDataLoader:
        mix = MixedDataset({"web": web, "code": ShardedDataset(at, reader)})
        return ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(4, seed=3))

    first = run(local)
    it = iter(first)
    head = [next(it).tolist() for _ in range(2)]
    state = first.state_dict()
    again = run(ShardedDataset(moved, reader))
    again.load_state_dict(state)
    assert head + [b.tolist() for b in again] == [b.tolist() for b in run(local)]
    # Parts are still told apart: another URL folder in the place of one is refused.
    other = f"memory://across-{os.getpid()}/other"
    write_shards(other, [np.repeat(np.arange(100, 110), 2)], reader, progress=False)
    with pytest.raises(StateMismatchError, match="shard_names_crc32"):
        run(local, other).load_state_dict(state)
