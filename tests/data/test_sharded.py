"""Planned sharded data: ShardPlan, ShardedDataset, the readers, the index, errors and file opens.

The central property (hypothesis, over random shard sizes with empty shards
and one huge shard, world sizes 1..8 and workers 0..4 before and after a
resume at a random position): the rank x worker slots together see every
sample of the epoch exactly once (plus the documented wrap-around padding, or
minus the dropped tail), and every rank steps the same number of times.

Token shards in these tests encode the sample: every token of global sample
``i`` is ``i`` (``ids()`` reads column 0), so a batch says which samples it holds.
"""

from __future__ import annotations

import doctest
import errno
import importlib
import json
import os
import pickle
import threading
import warnings
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import loaderkit.data._shard_reads
import loaderkit.data.index
import loaderkit.data.jsonl
import loaderkit.data.readers
import loaderkit.data.sharded
import loaderkit.plan.shard
from loaderkit import (
    JsonlReader,
    MixedDataset,
    PadCollate,
    ReaderSettingError,
    ResumableDataLoader,
    ShardPlan,
    StateMismatchError,
    StreamingShardedDataset,
    TokenReader,
    WorkerError,
    write_shards,
)
from loaderkit.data.sharded import ShardedDataset
from loaderkit.errors import MissingShardError, ShardChangedError, ShardError
from loaderkit.plan._cursor import check_state
from tests.support.proptest import examples

SEQ = 4
SIZES = (5, 0, 13, 2, 21, 1, 8)  # 50 samples in 7 uneven shards, one empty


def id_shards(sizes: Sequence[int], seq: int = SEQ) -> list[np.ndarray]:
    """Token arrays where every token of global sample ``i`` is ``i``."""
    out, first = [], 0
    for n in sizes:
        out.append(np.repeat(np.arange(first, first + n), seq).astype(np.uint16))
        first += n
    return out


def ids(batches: Sequence[torch.Tensor]) -> list[int]:
    return [int(i) for b in batches for i in b[:, 0]]


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    return write_shards(tmp_path / "data", id_shards(SIZES), TokenReader(seq_len=SEQ))


def loader(ds: ShardedDataset, num_workers: int = 0, **kwargs: Any) -> ResumableDataLoader:
    sampler_args: dict[str, Any] = {"batch_size": 4, "seed": 3, "window": 6}
    keys = ("batch_size", "seed", "window", "mix_shards", "drop_last", "rank", "world_size")
    for key in (*keys, "shuffle"):
        if key in kwargs:
            sampler_args[key] = kwargs.pop(key)
    return ResumableDataLoader(
        ds, batch_sampler=ds.batch_sampler(**sampler_args), num_workers=num_workers, **kwargs
    )


def test_docstring_examples_run() -> None:
    # The public modules' examples run in tests/test_doctests.py; this one defines no public name.
    result = doctest.testmod(loaderkit.data.index, raise_on_error=False, verbose=False)
    assert result.failed == 0


# --------------------------------------------------------------------- the plan
def laid_out(plan: ShardPlan, epoch: int) -> np.ndarray:
    """The epoch's samples shard after shard, before the window shuffle."""
    return np.concatenate(
        [np.arange(lo, hi) for _, lo, hi in plan.shuffle_blocks(epoch)] or [np.empty(0, int)]
    )


def test_order_is_a_pure_function_of_seed_epoch_sizes_window_and_mix() -> None:
    plan = ShardPlan(shard_sizes=SIZES, batch_size=4, seed=7, window=6)
    e0, e1 = plan.order(0), plan.order(1)
    assert sorted(e0.tolist()) == list(range(50)) and e0.dtype == torch.int64
    assert torch.equal(e0, ShardPlan(shard_sizes=SIZES, batch_size=9, seed=7, window=6).order(0))
    assert torch.equal(plan.order(0), e0) and not torch.equal(e0, e1)
    for other in (
        ShardPlan(shard_sizes=SIZES, batch_size=4, seed=8, window=6),
        ShardPlan(shard_sizes=SIZES, batch_size=4, seed=7, window=5),
        ShardPlan(shard_sizes=SIZES, batch_size=4, seed=7, window=6, mix_shards=3),
        ShardPlan(shard_sizes=(*SIZES[:-2], 8, 1), batch_size=4, seed=7, window=6),
    ):
        assert not torch.equal(other.order(0), e0)


def lane_sequences(plan: ShardPlan, epoch: int) -> list[list[int]]:
    """The order split back into its lanes: position p reads lane p % K, except the last,
    partial round, which reads lanes 0, 1, ... (written out here, not taken from the plan)."""
    order, k = plan.order(epoch).tolist(), len(plan.lanes(epoch))
    full = len(order) // k * k
    lanes: list[list[int]] = [[] for _ in range(k)]
    for p, i in enumerate(order):
        lanes[p % k if p < full else p - full].append(i)
    return lanes


def assert_local(plan: ShardPlan, epoch: int) -> None:
    """The lanes cut the shards, laid out in the epoch's shard order, into K near-equal runs;
    each lane reads its pieces one after another, each window a permutation of its own
    range of its piece."""
    pieces = plan.lanes(epoch)
    n, k = plan.num_samples, len(pieces)
    assert k == (plan.mix_shards if plan.shuffle else 1)
    # Lane-major, the pieces are the laid-out shards, cut only at lane starts.
    flat = [i for lane in pieces for _, lo, hi in lane for i in range(lo, hi)]
    assert flat == laid_out(plan, epoch).tolist()
    sizes = [sum(hi - lo for _, lo, hi in lane) for lane in pieces]
    assert sizes == [n // k + (j < n % k) for j in range(k)]
    ends = np.cumsum(plan.shard_sizes)
    for lane, run in zip(pieces, lane_sequences(plan, epoch), strict=True):
        pos, w = 0, plan.window
        for shard, first, end in lane:
            assert ends[shard] - plan.shard_sizes[shard] <= first < end <= ends[shard]
            part = run[pos : pos + end - first]
            for lo in range(0, len(part), w):
                want = list(range(first + lo, min(first + lo + w, end)))
                assert sorted(part[lo : lo + w]) == want
            pos += end - first
        assert pos == len(run)


def test_shards_are_shuffled_then_read_k_at_a_time_in_bounded_windows() -> None:
    for mix in (1, 2, 3, 8, 60):
        plan = ShardPlan(shard_sizes=SIZES, batch_size=4, seed=1, window=6, mix_shards=mix)
        for epoch in range(4):
            assert_local(plan, epoch)
    plan = ShardPlan(shard_sizes=SIZES, batch_size=4, seed=1, window=6)
    firsts = {tuple(int(s) for s in plan.shard_order(e)) for e in range(6)}
    assert len(firsts) > 1, "shard order must change with the epoch"
    # window=1 and one lane: shards shuffled, samples in file order; shuffle=False: the identity.
    w1 = ShardPlan(shard_sizes=SIZES, batch_size=4, seed=1, window=1, mix_shards=1)
    assert w1.order(2).tolist() == laid_out(w1, 2).tolist()
    assert ShardPlan(shard_sizes=SIZES, batch_size=4, seed=1, mix_shards=1).order(2).tolist() != (
        laid_out(w1, 2).tolist()
    ), "windows must be shuffled"
    for mix in (1, 8):
        ident = ShardPlan(shard_sizes=SIZES, batch_size=4, shuffle=False, mix_shards=mix)
        assert ident.order(3).tolist() == list(range(50))


def test_mix_shards_1_reads_shard_after_shard_window_by_window() -> None:
    """mix_shards=1 is the windowed order of loaderkit 0.1 in structure: the shards in the
    epoch's shard order, each read front to back, each window of a shard a permutation of its
    own range. (Its values changed with state version 5: windows are shuffled by keyed
    permutations now, so 0.1's order is no longer pinned by value; its states are refused by
    version.)"""
    plan = ShardPlan(shard_sizes=SIZES, batch_size=4, seed=7, window=6, mix_shards=1)
    for epoch in range(3):
        order, pos = plan.order(epoch).tolist(), 0
        for _, first, end in plan.shuffle_blocks(epoch):
            for lo in range(first, end, 6):
                hi = min(lo + 6, end)
                assert sorted(order[pos : pos + hi - lo]) == list(range(lo, hi))
                pos += hi - lo
        assert pos == 50


def test_fingerprint_pins_sizes_and_settings_and_a_resume_under_others_is_refused(
    shards: list[Path],
) -> None:
    fp = ShardPlan(shard_sizes=SIZES, batch_size=4, seed=3, window=6).fingerprint()
    assert fp["kind"] == "shards" and fp["num_samples"] == 50 and fp["num_shards"] == 7
    assert fp["window"] == 6 and fp["seed"] == 3 and fp["order_check"] != 0
    assert fp["mix_shards"] == 8
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    run = loader(ds)
    next(iter(run))
    state = run.state_dict()
    with pytest.raises(StateMismatchError, match="window"):
        loader(ds, window=7).load_state_dict(state)
    with pytest.raises(StateMismatchError, match="seed"):
        loader(ds, seed=4).load_state_dict(state)
    with pytest.raises(StateMismatchError, match=r"mix_shards=8.*build it with mix_shards=8"):
        loader(ds, mix_shards=1).load_state_dict(state)
    other = ShardPlan(shard_sizes=(5, 0, 13, 2, 20, 2, 8), batch_size=4, seed=3, window=6)
    with pytest.raises(StateMismatchError, match="shard_sizes_crc32"):
        check_state(state, other.fingerprint(), owner="ResumableDataLoader")


@pytest.mark.parametrize("via", ["batch_sampler", "shuffle", "mixed", "mixed_sampler"])
def test_a_state_over_other_files_or_another_order_of_them_is_refused(
    tmp_path: Path, via: str
) -> None:
    """Equal sizes are not the same data: the indices would name other samples."""
    files = write_shards(tmp_path / "eq", id_shards((4, 4, 4)), TokenReader(seq_len=SEQ))

    def make(paths: list[Path]) -> ResumableDataLoader:
        ds = ShardedDataset(paths, TokenReader(seq_len=SEQ))
        if via.startswith("mixed"):  # the other source in the folder of paths[-1]
            fixed = ShardedDataset([paths[-1].with_name(f.name) for f in files], ds.reader)
            mix = MixedDataset({"shards": ds, "fixed": fixed}, weights=[0.5, 0.5])
            if via == "mixed_sampler":
                return ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(4, seed=3))
            return ResumableDataLoader(mix, batch_size=4, shuffle=True, seed=3)
        if via == "shuffle":
            return ResumableDataLoader(ds, batch_size=4, shuffle=True, seed=3)
        return loader(ds)

    run = make(files)
    next(iter(run))
    state = run.state_dict()
    other = files[0].with_name("other-00000.npy")
    other.write_bytes(files[1].read_bytes())
    for paths in ([files[1], files[0], files[2]], [other, files[1], files[2]]):
        with pytest.raises(StateMismatchError, match=r"shard_names_crc32.*other shard files"):
            make(paths).load_state_dict(state)
    make(files).load_state_dict(state)  # the same files in the same order resume
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in files:
        (moved / path.name).write_bytes(path.read_bytes())
    make([moved / path.name for path in files]).load_state_dict(state)  # a copied folder too


@pytest.mark.parametrize("via", ["shards", "shards_bucket", "mix", "mix_bucket"])
def test_a_samplers_own_state_over_other_files_is_refused(tmp_path: Path, via: str) -> None:
    """Under a plain DataLoader the sampler's state alone records which files it named;
    equal-length samples give the bucket plans' lengths checksum nothing to tell apart."""
    files = write_shards(tmp_path / "eq", id_shards((4, 4, 4)), TokenReader(seq_len=SEQ))

    def make(paths: list[Path]) -> Any:
        ds = ShardedDataset(paths, TokenReader(seq_len=SEQ))
        if via == "shards":
            return ds.batch_sampler(4, seed=3)
        if via == "shards_bucket":
            return ds.bucket_batch_sampler(batch_size=4, seed=3)
        fixed = ShardedDataset(files, TokenReader(seq_len=SEQ))
        mix = MixedDataset({"shards": ds, "fixed": fixed}, weights=[0.5, 0.5])
        if via == "mix":
            return mix.batch_sampler(4, seed=3)
        return mix.bucket_batch_sampler(batch_size=4, seed=3)

    sampler = make(files)
    batches = iter(sampler)
    next(batches)
    state = sampler.state_dict()
    rest = list(batches)
    other = files[0].with_name("other-00000.npy")
    other.write_bytes(files[1].read_bytes())
    for paths in ([files[1], files[0], files[2]], [other, files[1], files[2]]):
        with pytest.raises(StateMismatchError, match=r"shard_names_crc32.*other shard files"):
            make(paths).load_state_dict(state)
    resumed = make(files)
    resumed.load_state_dict(state)  # the same files in the same order resume
    assert rest and list(resumed) == rest


@pytest.mark.parametrize("via", ["loader", "sampler", "subset", "concat", "mixed_subset"])
def test_swapped_subfolders_of_equal_names_are_refused(tmp_path: Path, via: str) -> None:
    """Two corpora written alike (shard-00000.npy in each folder) are told apart by the
    paths below their common folder; a wrapped ShardedDataset is checked too."""
    reader = TokenReader(seq_len=SEQ)
    en = write_shards(tmp_path / "c" / "en", id_shards((4,)), reader)
    de = write_shards(tmp_path / "c" / "de", [a + 1000 for a in id_shards((4,))], reader)
    fixed_paths = write_shards(
        tmp_path / "c" / "fixed", [a + 2000 for a in id_shards((4,))], reader
    )

    def make(paths: list[Path], root: Path = tmp_path / "c") -> Any:
        fixed = [root / "fixed" / p.name for p in fixed_paths]
        ds: Any = ShardedDataset(paths, reader)
        if via == "sampler":
            return ds.bucket_batch_sampler(batch_size=2, seed=3)
        if via == "subset":
            ds = torch.utils.data.Subset(ds, range(len(ds)))
        if via == "concat":
            ds = torch.utils.data.ConcatDataset([ds, ShardedDataset(fixed, reader)])
        if via == "mixed_subset":
            wrapped = torch.utils.data.Subset(ds, range(len(ds)))
            other = ShardedDataset(fixed, reader)
            ds = MixedDataset({"shards": wrapped, "fixed": other}, weights=[0.5, 0.5])
        return ResumableDataLoader(ds, batch_size=2, shuffle=True, seed=3)

    run = make([*en, *de])
    next(iter(run))
    state = run.state_dict()
    with pytest.raises(StateMismatchError, match=r"shard_names_crc32.*other shard files"):
        make([*de, *en]).load_state_dict(state)
    copied = tmp_path / "copy"  # the whole tree moved: the paths below it are the same
    for path in [*en, *de, *fixed_paths]:
        target = copied / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    make([copied / "en" / en[0].name, copied / "de" / de[0].name], copied).load_state_dict(state)


@pytest.mark.parametrize("via", ["concat", "mixed", "mixed_named"])
def test_swapped_sources_of_equal_names_are_refused(tmp_path: Path, via: str) -> None:
    """Two ShardedDatasets over en/ and de/ (written alike) in the other order read other
    samples at every index: the parts' paths are checked below their common folder."""
    reader = TokenReader(seq_len=SEQ)
    en = ShardedDataset(write_shards(tmp_path / "en", id_shards((4,)), reader), reader)
    de = ShardedDataset(
        write_shards(tmp_path / "de", [a + 9 for a in id_shards((4,))], reader), reader
    )

    def make(parts: list[Any]) -> Any:
        ds: Any = torch.utils.data.ConcatDataset(parts)
        if via == "mixed":
            ds = MixedDataset(parts, weights=[0.5, 0.5])
        if via == "mixed_named":
            ds = MixedDataset({"a": parts[0], "b": parts[1]}, weights=[0.5, 0.5])
        return ResumableDataLoader(ds, batch_size=2, shuffle=True, seed=3)

    run = make([en, de])
    next(iter(run))
    state = run.state_dict()
    # A mix names its sources too (by their folders): the first field checked names them.
    other = r"shard_names_crc32.*other shard files|mix_sources_crc32.*other mix sources"
    with pytest.raises(StateMismatchError, match=other):
        make([de, en]).load_state_dict(state)
    make([en, de]).load_state_dict(state)


def test_a_concat_is_checked_by_its_parts_lengths_and_real_paths(tmp_path: Path) -> None:
    """In-memory parts of other lengths around the shards, or a path whose text (through a
    link and ..) names the saved files but opens others, move every index; nested
    ConcatDatasets that read the same are accepted."""
    reader = TokenReader(seq_len=SEQ)
    en = write_shards(tmp_path / "o" / "en", id_shards((4,)), reader)
    de = write_shards(tmp_path / "o" / "de", [a + 9 for a in id_shards((4,))], reader)
    saved = write_shards(tmp_path / "c" / "de", [a + 500 for a in id_shards((4,))], reader)
    (tmp_path / "o" / "sub").mkdir()
    (tmp_path / "c" / "lk").symlink_to(tmp_path / "o" / "sub")
    dodgy = [tmp_path / "c" / "lk" / ".." / "de" / saved[0].name]  # opens o/de's file
    concat = torch.utils.data.ConcatDataset

    def make(*parts: Any) -> Any:
        return ResumableDataLoader(concat(parts), batch_size=2, shuffle=True, seed=3)

    def sd(files: list[Path]) -> ShardedDataset:
        return ShardedDataset(files, reader)

    small, large = torch.zeros(2, SEQ, dtype=torch.int64), torch.ones(6, SEQ, dtype=torch.int64)
    run = make(small, sd(en), large)
    next(iter(run))
    with pytest.raises(StateMismatchError, match=r"shard_names_crc32"):
        make(large, sd(en), small).load_state_dict(run.state_dict())
    run = make(sd(en), sd(saved))
    next(iter(run))
    with pytest.raises(StateMismatchError, match=r"shard_names_crc32"):
        make(sd(en), sd(dodgy)).load_state_dict(run.state_dict())
    run = make(sd(en), sd(de))
    next(iter(run))
    make(concat([sd(en)]), concat([sd(de)])).load_state_dict(run.state_dict())


def test_a_snapshot_of_linked_files_and_its_real_copy_are_the_same_shards(tmp_path: Path) -> None:
    """A Hugging Face snapshot links each file into blobs/<hash>: the file's own link is
    kept, so the snapshot and a copy with the links followed (cp -L) resume alike."""
    reader = TokenReader(seq_len=SEQ)
    written = write_shards(tmp_path / "w", id_shards((4, 4)), reader)
    (tmp_path / "blobs").mkdir()
    for name in ("snap", "real"):
        (tmp_path / name).mkdir()
    for i, path in enumerate(written):
        blob = tmp_path / "blobs" / f"{i}abc"
        blob.write_bytes(path.read_bytes())
        (tmp_path / "snap" / path.name).symlink_to(blob)
        (tmp_path / "real" / path.name).write_bytes(path.read_bytes())
    snap = ShardedDataset([tmp_path / "snap" / p.name for p in written], reader)
    real = ShardedDataset([tmp_path / "real" / p.name for p in written], reader)
    assert snap.names_crc32 == real.names_crc32


def test_lengths_of_a_subclass_changing_its_samples_are_refused(tmp_path: Path) -> None:
    """A subclass's __getitem__ (a prompt added, a truncation) got its shards' lengths, and
    token budgets were exceeded; samples it wraps in a dict keep the shards' lengths."""
    reader = TokenReader(eos=0)
    paths = write_shards(tmp_path, [np.array([5, 5, 5, 0, 7, 0] * 4)], reader)

    class WithPrompt(ShardedDataset):
        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.cat([torch.ones(6, dtype=torch.long), super().__getitem__(index)])

    class Truncated(ShardedDataset):
        def __getitem__(self, index: int) -> torch.Tensor:
            return super().__getitem__(index)[:3]

    class PromptList(ShardedDataset):
        def __getitem__(self, index: int) -> list[int]:  # type: ignore[override]
            return [1] * 6 + super().__getitem__(index).tolist()

    class AsDict(ShardedDataset):
        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"input_ids": super().__getitem__(index)}

    class Pairs(ShardedDataset):
        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            x = super().__getitem__(index)
            return x, x.clone()

    class Stacked(ShardedDataset):
        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.stack([super().__getitem__(index)] * 2)

    assert ShardedDataset(paths, reader).lengths().tolist() == [4, 2] * 4
    with pytest.raises(
        ValueError, match=r"sample 0 has 10 tokens, where its source counts 4. Pass length_fn"
    ):
        WithPrompt(paths, reader).lengths()
    assert WithPrompt(paths, reader).lengths(len).tolist() == [10, 8] * 4
    assert Truncated(paths, reader).lengths().tolist() == [4, 2] * 4  # shorter: budgets hold
    with pytest.raises(ValueError, match=r"sample 0 has 10 tokens, where its source counts 4"):
        PromptList(paths, reader).lengths()
    for kept in (AsDict, Pairs, Stacked):  # a field as long, or not 1-D: the lengths stand
        assert kept(paths, reader).lengths().tolist() == [4, 2] * 4

    class DictWithPrompt(ShardedDataset):  # was not checked: budgets were exceeded
        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            prompt = torch.ones(6, dtype=torch.long)
            return {"input_ids": torch.cat([prompt, super().__getitem__(index)])}

    class PromptPlusTarget(ShardedDataset):  # the source's tokens kept as the target
        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            tokens = super().__getitem__(index)
            return {"input_ids": torch.cat([torch.ones(6, dtype=torch.long), tokens]), "y": tokens}

    class Shifted(ShardedDataset):  # shorter fields: a budget from the source holds
        def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
            tokens = super().__getitem__(index)
            return tokens[:-1], tokens[1:]

    for changed in (DictWithPrompt, PromptPlusTarget):
        with pytest.raises(ValueError, match=r"sample 0 has 10 tokens, where its source counts"):
            changed(paths, reader).lengths()
    assert Shifted(paths, reader).lengths().tolist() == [4, 2] * 4


def test_cached_lengths_are_keyed_by_a_subclass_s_settings(tmp_path: Path) -> None:
    """Lengths cached for a subclass with prefix=0 were read back for prefix=10: a token
    budget from them was exceeded by every batch."""
    reader = TokenReader(eos=0)
    paths = write_shards(tmp_path / "s", [np.array([5, 5, 5, 0, 7, 0] * 4)], reader)

    class Prompted(ShardedDataset):
        def __init__(self, *args: Any, prefix: int = 0, **kwargs: Any) -> None:
            self.prefix = prefix  # set before the base's own fields
            super().__init__(*args, **kwargs)
            self.handle: Any = None

        def __getitem__(self, index: int) -> dict[str, Any]:
            ids = super().__getitem__(index)
            return {"ids": torch.cat([torch.ones(self.prefix, dtype=torch.long), ids])}

    def ntok(sample: dict[str, Any]) -> int:
        return len(sample["ids"])

    cache = tmp_path / "lengths.npy"
    assert Prompted(paths, reader).lengths(ntok, cache=cache).tolist() == [4, 2] * 4
    assert Prompted(paths, reader, prefix=10).lengths(ntok, cache=cache).tolist() == [14, 12] * 4
    written = cache.stat()
    assert Prompted(paths, reader, prefix=10).lengths(ntok, cache=cache).tolist() == [14, 12] * 4
    now = cache.stat()  # the same settings: read from the cache, not written again
    assert (now.st_ino, now.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    unpicklable = Prompted(paths, reader, prefix=1)
    unpicklable.handle = threading.Lock()  # no digest stands for a lock
    with pytest.warns(
        UserWarning, match="a setting of it or its reader does not pickle, so it cannot key"
    ):
        assert unpicklable.lengths(ntok, cache=cache).tolist() == [5, 3] * 4
    assert cache.stat().st_ino == written.st_ino


class Cut(TokenReader):
    """Keeps a document's first ``keep`` tokens; its repr is TokenReader's."""

    def __init__(self, keep: int) -> None:
        super().__init__(eos=0)
        self.keep = keep

    def open(self, path: Path) -> Any:
        rows, keep = super().open(path), self.keep

        class Kept:
            def __len__(self) -> int:
                return len(rows)

            def read(self, index: int) -> Any:
                return rows.read(index)[:keep]

        return Kept()


def test_cached_lengths_see_a_subclass_s_function_edited_slots_and_getitems(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A function held by a subclass was keyed by its name (pickle), so an edit of its code
    read back the lengths of the old one; a setting in __slots__ was not keyed at all; a
    subclass overriding only __getitems__ (what the loader calls) was never measured."""
    reader = TokenReader(eos=0)
    paths = write_shards(tmp_path / "s", [np.array([5, 5, 5, 0, 7, 0] * 4)], reader)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "user_fns.py").write_text("def transform(ids):\n    return ids\n")
    import user_fns  # type: ignore[import-not-found]

    class Mapped(ShardedDataset):
        def __getitem__(self, index: int) -> Any:
            return self.transform(super().__getitem__(index))

    cache = tmp_path / "lengths.npy"
    first = Mapped(paths, reader)
    first.transform = user_fns.transform
    assert first.lengths(len, cache=cache).tolist() == [4, 2] * 4
    (tmp_path / "user_fns.py").write_text("def transform(ids):\n    return [1, *ids.tolist()]\n")
    edited = Mapped(paths, reader)
    edited.transform = importlib.reload(user_fns).transform
    with pytest.warns(UserWarning, match="recomputing the lengths cached"):
        assert edited.lengths(len, cache=cache).tolist() == [5, 3] * 4

    class Slotted(ShardedDataset):
        __slots__ = ("prefix",)

        def __getitem__(self, index: int) -> Any:
            return [1] * self.prefix + super().__getitem__(index).tolist()

    for prefix in (0, 2):
        slotted = Slotted(paths, reader)
        slotted.prefix = prefix
        lengths = slotted.lengths(len, cache=tmp_path / "slots.npy")
        assert lengths.tolist() == [4 + prefix, 2 + prefix] * 4

    class Batched(ShardedDataset):
        def __getitems__(self, indices: Sequence[int]) -> list[Any]:
            return [[1, *s.tolist()] for s in super().__getitems__(indices)]

    with pytest.raises(ValueError, match="sample 0 has 5 tokens, where its source counts 4"):
        Batched(paths, reader).lengths()
    assert Batched(paths, reader).lengths(len).tolist() == [5, 3] * 4  # as the loader reads


def test_cached_lengths_are_keyed_by_the_reader_s_settings(tmp_path: Path) -> None:
    """A reader whose repr leaves out a setting that changes its samples (the cache was keyed
    by the dataset's repr) read back the lengths cached under the other value."""

    paths = write_shards(tmp_path / "s", [np.array([5, 5, 5, 0, 7, 0] * 4)], TokenReader(eos=0))
    cache = tmp_path / "lengths.npy"
    assert repr(Cut(1)) == repr(Cut(3))
    assert ShardedDataset(paths, Cut(3)).lengths(len, cache=cache).tolist() == [3, 2] * 4
    with pytest.warns(UserWarning, match="recomputing the lengths cached"):  # keyed apart
        assert ShardedDataset(paths, Cut(1)).lengths(len, cache=cache).tolist() == [1] * 8


def test_a_subset_of_other_indices_or_relative_paths(tmp_path: Path, monkeypatch: Any) -> None:
    """A Subset's indices are part of what a position names; a path spelled relative (with
    ..) is the same file."""
    reader = TokenReader(seq_len=SEQ)
    paths = write_shards(tmp_path / "c", id_shards((4, 4)), reader)

    def make(rows: list[int], files: list[Path] = paths) -> Any:
        sub = torch.utils.data.Subset(ShardedDataset(files, reader), rows)
        return ResumableDataLoader(sub, batch_size=2, shuffle=True, seed=3)

    run = make([0, 1, 2, 3, 4, 5])
    next(iter(run))
    state = run.state_dict()
    with pytest.raises(StateMismatchError, match=r"shard_names_crc32"):
        make([2, 3, 4, 5, 6, 7]).load_state_dict(state)
    monkeypatch.chdir(tmp_path / "c")
    odd = [Path("..") / "c" / paths[0].name, Path(paths[1].name)]
    make([0, 1, 2, 3, 4, 5], odd).load_state_dict(state)


def test_a_state_saved_before_mixing_is_refused_naming_mix_shards(shards: list[Path]) -> None:
    """A loaderkit 0.1 state has no mix_shards in its plan (and read one shard at a time):
    resuming it under a mixing plan would repeat and skip samples."""
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    run = loader(ds, mix_shards=1)
    next(iter(run))
    from loaderkit.plan._cursor import seal

    state = run.state_dict()
    del state["plan"]["mix_shards"]
    state["plan"]["order_check"] = 829552864  # loaderkit 0.1's checksum of its shard order
    # A real 0.1 state is also refused for its format version (it has no checksum) ...
    old = {k: v for k, v in state.items() if k != "checksum"} | {"version": 1}
    with pytest.raises(StateMismatchError, match=r"field 'version' is 1"):
        loader(ds, mix_shards=8).load_state_dict(old)
    # ... and a current-format state of a plan without mixing names mix_shards.
    seal(state)
    for mix in (1, 8):
        with pytest.raises(
            StateMismatchError,
            match=rf"field 'plan' has no 'mix_shards' \(this loaderkit's plan: mix_shards={mix}\)",
        ):
            loader(ds, mix_shards=mix).load_state_dict(state)


@pytest.mark.parametrize("via", ["batch_sampler", "shuffle"])
def test_a_state_without_shard_names_says_an_older_loaderkit_saved_it(
    shards: list[Path], via: str
) -> None:
    from loaderkit.plan._cursor import seal

    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    make = (
        (lambda: loader(ds))
        if via == "batch_sampler"
        else (lambda: ResumableDataLoader(ds, batch_size=4, shuffle=True, seed=3))
    )
    run = make()
    next(iter(run))
    state = run.state_dict()
    del state["plan"]["shard_names_crc32"]
    with pytest.raises(StateMismatchError, match="older loaderkit or a sampler built by hand"):
        make().load_state_dict(seal(state))


@pytest.mark.parametrize("via", ["shuffle", "subset", "concat", "mix", "mix sampler"])
def test_shards_recut_with_the_same_files_and_total_are_refused(tmp_path: Path, via: str) -> None:
    # Shard 0 and 2 swapped (6 <-> 9 samples): same names, same total. Plans that hold no
    # shard sizes resumed at the saved position in other samples (4 lost, 4 twice).
    from torch.utils.data import ConcatDataset, Subset

    from loaderkit.plan._cursor import seal

    parts = [[{"id": i} for i in range(a, a + n)] for a, n in ((0, 6), (100, 4), (200, 9))]
    write_shards(tmp_path, parts, JsonlReader(), progress=False)

    def make() -> ResumableDataLoader:
        ds = ShardedDataset(tmp_path, JsonlReader())
        if via.startswith("mix"):
            mix = MixedDataset({"s": ds, "t": [{"id": 900}]})
            if via == "mix sampler":
                return ResumableDataLoader(mix, batch_sampler=mix.batch_sampler(4, seed=0))
            return ResumableDataLoader(mix, batch_size=4, seed=0)
        data = {"shuffle": ds, "subset": Subset(ds, range(19)), "concat": ConcatDataset([ds])}
        return ResumableDataLoader(data[via], batch_size=4, shuffle=True, seed=0)

    run = make()
    next(iter(run))
    state = run.state_dict()
    write_shards(tmp_path, parts[::-1], JsonlReader(), progress=False)
    with pytest.raises(StateMismatchError, match="'shard_counts_crc32' differs: the shard files"):
        make().load_state_dict(state)
    older = {**state, "plan": {k: v for k, v in state["plan"].items() if k != "shard_counts_crc32"}}
    make().load_state_dict(seal(older))  # saved before the field: loaded as then
    write_shards(tmp_path, parts, JsonlReader(), progress=False)
    make().load_state_dict(state)  # the same counts again


def test_plan_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="hold no sample"):
        ShardPlan(shard_sizes=(0, 0), batch_size=2)
    with pytest.raises(ValueError, match=r"shard_sizes\[1\] must be an int >= 0"):
        ShardPlan(shard_sizes=(3, -1), batch_size=2)
    with pytest.raises(ValueError, match="window must be >= 1"):
        ShardPlan(shard_sizes=(3,), batch_size=2, window=0)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        ShardPlan(shard_sizes=(3,), batch_size=0)
    with pytest.raises(
        ValueError, match=r"ShardPlan: mix_shards must be >= 1, got 0; pass the shards a batch"
    ):
        ShardPlan(shard_sizes=(3,), batch_size=2, mix_shards=0)
    with pytest.raises(TypeError, match=r"mix_shards must be an int, got 2.0 \(float\)"):
        ShardPlan(shard_sizes=(3,), batch_size=2, mix_shards=2.0)  # type: ignore[arg-type]


SHARD_SIZES = st.lists(st.integers(0, 40), min_size=1, max_size=12).flatmap(
    lambda sizes: st.tuples(st.just(sizes), st.integers(0, len(sizes)), st.integers(0, 1500))
)  # (sizes, where to insert a huge shard, its size; 0 = no huge shard)


def slot_batches(
    plan: ShardPlan, epoch: int, start: int, world_size: int, workers: int
) -> dict[tuple[int, int], list[list[int]]]:
    """Each (rank, worker) slot's batches, dealt as ResumableDataLoader deals them: a rank's
    step ``s`` goes to worker ``s % max(workers, 1)``. Checks equal step counts per rank."""
    slots: dict[tuple[int, int], list[list[int]]] = {}
    counts = set()
    for rank in range(world_size):
        sched = plan.schedule(epoch, start=start, rank=rank, world_size=world_size)
        counts.add(sched.num_steps)
        for step in range(sched.num_steps):
            slot = (rank, step % max(workers, 1))
            slots.setdefault(slot, []).append(sched.indices(step).tolist())
    assert len(counts) == 1, f"ranks step different counts: {counts}"
    assert counts == {plan.num_steps(epoch, start=start, world_size=world_size)}
    return slots


def assert_mixed(plan: ShardPlan, epoch: int, batches: list[list[int]]) -> None:
    """The documented bound on the shards of each batch of consecutive positions: at least
    ceil(min(b, K) / c) of them, c = 1 + (largest shard - 1 + ceil(b / K)) // (N // K)."""
    order = plan.order(epoch).numpy()
    where = np.empty_like(order)
    where[order] = np.arange(order.size)
    ends = np.cumsum(plan.shard_sizes)
    k, base = plan.mix_shards, plan.num_samples // plan.mix_shards
    for batch in batches:
        pos = np.sort(where[batch])
        if pos[-1] - pos[0] != len(batch) - 1:
            continue  # the wrap-around padding of the last step: not consecutive
        b = len(batch)
        c = 1 + (max(plan.shard_sizes) - 1 + -(-b // k)) // base if base else b
        shards = set(np.searchsorted(ends, batch, side="right").tolist())
        assert len(shards) >= -(-min(b, k) // c), (batch, shards, c)


@settings(max_examples=examples(400), deadline=None)
@given(
    shard_spec=SHARD_SIZES,
    batch_size=st.integers(1, 40),
    window=st.integers(1, 64),
    mix_shards=st.integers(1, 12),
    seed=st.integers(0, 2**31),
    drop_last=st.booleans(),
    topo_before=st.tuples(st.integers(1, 8), st.integers(0, 4)),
    topo_after=st.tuples(st.integers(1, 8), st.integers(0, 4)),
    stop_frac=st.floats(0, 1),
    epoch=st.integers(0, 2),
)
def test_every_slot_together_sees_each_sample_once_across_a_resume_with_a_new_topology(
    shard_spec: tuple[list[int], int, int],
    batch_size: int,
    window: int,
    mix_shards: int,
    seed: int,
    drop_last: bool,
    topo_before: tuple[int, int],
    topo_after: tuple[int, int],
    stop_frac: float,
    epoch: int,
) -> None:
    """Over random shard layouts (empty shards, one huge): exactly once across a resume at a
    random position under a new world size and num_workers, equal steps per rank, the
    lanes and windows of the order, and the promised shards per batch, before and after."""
    sizes, at, huge = shard_spec
    sizes = [*sizes[:at], huge, *sizes[at:]] if huge else sizes
    if sum(sizes) == 0:
        sizes = [*sizes, 1]
    plan = ShardPlan(
        shard_sizes=tuple(sizes), batch_size=batch_size, seed=seed, window=window,
        mix_shards=mix_shards, drop_last=drop_last,
    )  # fmt: skip
    n, order = plan.num_samples, plan.order(epoch).tolist()
    assert_local(plan, epoch)
    (ws0, nw0), (ws1, nw1) = topo_before, topo_after
    first = slot_batches(plan, epoch, 0, ws0, nw0)
    assert_mixed(plan, epoch, [b for batches in first.values() for b in batches])
    steps0 = plan.num_steps(epoch, start=0, world_size=ws0)
    # Stop after k consumed steps (all ranks in lockstep), before the last.
    k = min(int(stop_frac * steps0), max(steps0 - 1, 0))
    position = 0
    if k:
        position = plan.schedule(epoch, start=0, rank=0, world_size=ws0).position_after(k - 1)
    seen = [
        i
        for (rank, worker), batches in first.items()
        for j, batch in enumerate(batches)
        if j * max(nw0, 1) + worker < k  # slot's j-th batch is its rank's step j*nw + worker
        for i in batch
    ]
    assert Counter(seen) == Counter(order[:position]), "before the stop: duplicates or losses"
    after = slot_batches(plan, epoch, position, ws1, nw1)
    assert_mixed(plan, epoch, [b for batches in after.values() for b in batches])
    rest = [i for batches in after.values() for batch in batches for i in batch]
    both = Counter(seen + rest)
    if drop_last:
        assert max(both.values(), default=1) == 1, "a duplicate under drop_last"
        lost = n - sum(both.values())
        assert 0 <= lost < ws1 * batch_size, "lost more than the dropped tail"
        assert set(both) == set(order[: n - lost])  # the dropped tail is the order's end
    else:
        assert set(both) == set(range(n)), f"lost {sorted(set(range(n)) - set(both))}"
        extra = both - Counter(range(n))
        assert sum(extra.values()) < ws1  # padding: fewer than one repeat per rank
        assert set(extra) <= set(order[: sum(extra.values())])  # ... from the order's start


def uneven(num_shards: int, mean: int) -> tuple[int, ...]:
    """Shard sizes from 0.75x to 1.25x the mean, as in benchmarks/shards (the issue's layout)."""
    return tuple(int(mean * f) for f in np.linspace(0.75, 1.25, num_shards))


@pytest.mark.parametrize(("mix", "mean", "single"), [(8, 8.0, 0.0), (4, 4.0, 0.0), (1, 1.0, 1.0)])
def test_shards_per_batch_on_sixteen_uneven_shards(mix: int, mean: float, single: float) -> None:
    """The issue's layout: 16 uneven shards (~1,500 samples of 2,048 tokens each), batch 8.
    mix_shards=K puts min(K, 8) shards in every batch; K=1 one, bar the few batches that
    pass from one shard to the next."""
    plan = ShardPlan(shard_sizes=uneven(16, 1526), batch_size=8, seed=0, mix_shards=mix)
    for epoch in range(2):
        got = plan.batch_mix(epoch)
        assert got.batches == -(-plan.num_samples // 8)
        assert got.mean == pytest.approx(mean, abs=0.01) and got.single == pytest.approx(
            single, abs=0.01
        )
    for world_size in (2, 3):
        two = plan.batch_mix(0, world_size=world_size)
        assert two.mean == pytest.approx(mean, abs=0.01) and two.batches >= got.batches


# ------------------------------------------------------------- through the loader
@pytest.mark.parametrize(("nw_before", "nw_after"), [(0, 0), (2, 2), (0, 2)])
def test_resume_oracle_over_two_epochs(shards: list[Path], nw_before: int, nw_after: int) -> None:
    """First k batches + the run resumed at k == the uninterrupted run, k in epoch 0 and 1."""
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    full_run = loader(ds, nw_before)
    full = [ids([b]) for _ in range(2) for b in full_run]
    assert len(full) == 2 * 13  # 50 samples, 4 per batch: 12 full + a tail of 2
    for epoch_ids in (full[:13], full[13:]):
        assert sorted(i for b in epoch_ids for i in b) == list(range(50))
    for k in (5, 13 + 7):
        run, before = loader(ds, nw_before), []
        for _ in range(2):
            for batch in run:
                before.append(ids([batch]))
                if len(before) == k:
                    break
            if len(before) == k:
                break
        state = run.state_dict()
        resumed = loader(ds, nw_after)
        resumed.load_state_dict(state)
        after = [ids([b]) for _ in range(2 - state["epoch"]) for b in resumed]
        assert before + after == full, f"resume at {k} is not exact"


def test_elastic_resume_two_ranks_to_three_with_workers(shards: list[Path]) -> None:
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    ranks = [loader(ds, rank=r, world_size=2, batch_size=3) for r in (0, 1)]
    its = [iter(r) for r in ranks]
    seen = [i for _ in range(3) for it in its for i in ids([next(it)])]
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict() and state["position"] == 18
    after = [loader(ds, 2, rank=r, world_size=3, batch_size=3) for r in range(3)]
    rest = []
    for run in after:
        run.load_state_dict(state)
        rest.append([ids([b]) for b in run])
    assert len({len(r) for r in rest}) == 1, "ranks step different counts after the resume"
    counts = Counter(seen + [i for r in rest for b in r for i in b])
    assert set(counts) == set(range(50)) and sum(counts.values()) - 50 < 3


def test_num_workers_do_not_change_the_batches(shards: list[Path]) -> None:
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    runs = [[b for _ in range(2) for b in loader(ds, nw)] for nw in (0, 2)]
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_drop_last_drops_less_than_a_global_step(shards: list[Path]) -> None:
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    got = ids(list(loader(ds, drop_last=True, rank=0, world_size=1)))
    assert len(got) == 48 and len(set(got)) == 48


# -------------------------------------------------------------------- readers
def test_python_token_ids_past_int64_are_written_exactly(tmp_path: Path) -> None:
    # Hunter 350: numpy reads [2**63 + 1, 1] as float64; they were refused with a fix
    # (astype(np.int64)) that would wrap them.
    reader = TokenReader(seq_len=2, dtype=np.uint64, out_dtype=None)
    (path,) = write_shards(tmp_path / "u", [[2**63 + 1, np.int64(1)]], reader, progress=False)
    assert np.load(path).tolist() == [2**63 + 1, 1] and np.load(path).dtype == np.uint64
    with pytest.raises(ValueError, match=r"\[1, 9223372036854775809\] do not fit int64"):
        TokenReader(seq_len=2).write(tmp_path / "x.npy", [2**63 + 1, 1])
    with pytest.raises(ValueError, match="got dtype float64"):  # floats stay refused
        TokenReader(seq_len=2).write(tmp_path / "x.npy", [1.0, 2])
    for other in ([Decimal("1.5"), 2], np.array([1.5, 2], dtype=object), [None, 5]):
        with pytest.raises(ValueError, match="not 1-D integer token ids"):  # review 353: not cut
            TokenReader(seq_len=2, dtype=np.uint64).write(tmp_path / "x.npy", other)


def test_token_reader_npy_and_bin_fixed_length_and_targets(tmp_path: Path) -> None:
    tokens = [np.arange(10), np.arange(10, 23)]
    for suffix in (".npy", ".bin"):
        reader = TokenReader(seq_len=4, dtype=np.int32)
        paths = write_shards(tmp_path / suffix[1:], tokens, reader, suffix=suffix)
        ds = ShardedDataset(paths, reader)
        assert ds.sizes == (2, 3) and len(ds) == 5
        assert ds[2].tolist() == [10, 11, 12, 13] and ds[2].dtype == torch.int64
        batch = ds.get_batch(np.array([4, 0, 3]))
        assert batch.tolist() == [[18, 19, 20, 21], [0, 1, 2, 3], [14, 15, 16, 17]]
        assert [t.tolist() for t in ds.__getitems__([1, 2])] == [[4, 5, 6, 7], [10, 11, 12, 13]]
        with_targets = TokenReader(seq_len=4, targets=True, dtype=np.int32)
        ds = ShardedDataset(paths, with_targets)
        assert ds.sizes == (2, 3)  # (10 - 1) // 4, (13 - 1) // 4
        assert ds[1].tolist() == [4, 5, 6, 7, 8] and ds[4].tolist() == [18, 19, 20, 21, 22]
    raw = ShardedDataset(paths, TokenReader(seq_len=4, dtype=np.int32, out_dtype=None))
    assert raw.get_batch([0, 1]).dtype == torch.int32


@pytest.mark.parametrize("kind", ["npy", "litgpt"])
def test_a_raw_shard_in_another_format_is_refused(kind: str, tmp_path: Path) -> None:
    # Measured before: read as raw tokens, its header became the first ids of its shard
    # (a .npy: [20115, 19797, 22864, 1, ...]; a litgpt chunk: [18764, 20564, 17483, 339, ...]).
    path = tmp_path / "a.bin"
    with open(path, "wb") as f:
        if kind == "npy":
            np.save(f, np.arange(100, dtype=np.uint16))
        else:  # litgpt's PackedDataset chunk: magic, version, dtype code, chunk size
            f.write(
                b"LITPKDS" + (1).to_bytes(8, "little") + bytes([8]) + (64).to_bytes(8, "little")
            )
            np.arange(64, dtype=np.uint16).tofile(f)
    what = r"a \.npy array; rename it \.npy" if kind == "npy" else r"a litgpt packed chunk"
    with pytest.raises(ShardError, match=rf"raw token shard '.*a\.bin' is {what}"):
        ShardedDataset(tmp_path, TokenReader(seq_len=4, dtype=np.uint16))
    # Raw tokens that only start with such a header (the file is more than it says), and
    # loaderkit's own raw shards (a dtype header beside them), are read whatever they hold.
    with open(path, "ab") as f:
        f.write(b"\0\0")
    assert ShardedDataset(tmp_path, TokenReader(seq_len=4, dtype=np.uint16))[0].numel() == 4
    tokens = np.frombuffer(path.read_bytes()[:64], np.uint16)
    written = write_shards(
        tmp_path / "own", [tokens], TokenReader(seq_len=4, dtype=np.uint16), suffix=".bin"
    )
    assert (
        ShardedDataset(written, TokenReader(seq_len=4, dtype=np.uint16))[0].tolist()
        == tokens[:4].tolist()
    )


def test_token_reader_documents_by_eos_need_a_padding_collate(tmp_path: Path) -> None:
    eos = 0
    docs = [np.array([5, 6, 0, 7, 0, 8, 9, 9]), np.array([3, 0])]
    reader = TokenReader(eos=eos, dtype=np.uint16)
    paths = write_shards(tmp_path, docs, reader)
    ds = ShardedDataset(paths, reader)
    assert ds.sizes == (3, 1)  # a last document without eos is kept
    assert [ds[i].tolist() for i in range(4)] == [[5, 6, 0], [7, 0], [8, 9, 9], [3, 0]]
    assert Path(f"{paths[0]}.eos0.lkoffsets").exists()
    with pytest.raises(Exception, match="PadCollate"):
        ds.get_batch([0, 1])
    run = ResumableDataLoader(
        ds, batch_sampler=ds.batch_sampler(2, seed=0), collate_fn=PadCollate(), num_workers=0
    )
    lengths = sorted(int(n) for batch in run for n in batch.lengths)
    assert lengths == [2, 2, 3, 3]


def test_jsonl_reader_reads_by_line_offset(tmp_path: Path) -> None:
    rows = [[{"i": i, "text": "x" * i} for i in range(a, b)] for a, b in ((0, 3), (3, 3), (3, 7))]
    paths = write_shards(tmp_path, rows, JsonlReader())
    assert Path(f"{paths[0]}.lkoffsets").exists()
    ds = ShardedDataset(tmp_path, JsonlReader())  # a directory: its .jsonl files, sorted
    assert ds.sizes == (3, 0, 4) and ds[5] == {"i": 5, "text": "xxxxx"}
    assert ds.__getitems__([6, 1]) == [{"i": 6, "text": "x" * 6}, {"i": 1, "text": "x"}]
    batch = ds.get_batch([0, 4])  # default_collate over dicts
    assert batch["i"].tolist() == [0, 4] and batch["text"] == ["", "xxxx"]
    # A last line without a newline is a sample too.
    Path(tmp_path / "tail.jsonl").write_text('{"a": 1}\n{"a": 2}')
    assert JsonlReader().count(tmp_path / "tail.jsonl") == 2


class ListReader:
    """A user format: shards are in-memory lists; no read_batch (sample-by-sample path)."""

    suffixes = (".list",)

    def spec(self) -> dict[str, Any]:
        return {"kind": "list"}

    def count(self, shard: list[int]) -> int:
        return len(shard)

    def open(self, shard: list[int]) -> Any:
        class Open:
            def __len__(self) -> int:
                return len(shard)

            def read(self, i: int) -> torch.Tensor:
                return torch.tensor([shard[i]])

        return Open()


def test_a_user_reader_over_objects(tmp_path: Path) -> None:
    ds = ShardedDataset([[10, 11], [], [12, 13, 14]], ListReader())
    assert ds.sizes == (2, 0, 3) and ds.index_path is None
    run = ResumableDataLoader(ds, batch_sampler=ds.batch_sampler(2, seed=1, window=2))
    assert sorted(int(i) for b in run for i in b.view(-1)) == [10, 11, 12, 13, 14]


@pytest.mark.parametrize("count", [-2, 2.0, True])
def test_a_count_over_objects_that_is_not_an_int_ge_0_is_refused(count: Any) -> None:
    class Counted(ListReader):
        def count(self, shard: list[int]) -> Any:
            return count if shard == [12] else np.int64(len(shard))  # numpy ints are fine

    with pytest.raises(TypeError, match=rf"Counted.count\(.*returned {count}; return"):
        ShardedDataset([[10, 11], [12], [13]], Counted())
    assert ShardedDataset([[10, 11], [13]], Counted()).sizes == (2, 1)


def test_a_missing_dependency_while_reading_raises_the_same_from_every_read() -> None:
    from loaderkit import MissingDependencyError

    class NeedsExtra(ListReader):
        def open(self, shard: list[int]) -> Any:
            class Open(list):  # type: ignore[type-arg]
                def read(self, i: int) -> Any:
                    raise MissingDependencyError("needs zstandard; pip install loaderkit[zstd]")

            return Open(shard)

    ds = ShardedDataset([[10, 11], [12]], NeedsExtra())
    for read in (lambda: ds[0], lambda: ds.__getitems__([0, 2]), lambda: ds.get_batch([1])):
        with pytest.raises(MissingDependencyError, match="needs zstandard"):
            read()


# ---------------------------------------------------------------------- index
class CountingReader(TokenReader):
    counted: list[str] = []  # noqa: RUF012 - one log for the test

    def count(self, path: Path) -> int:
        CountingReader.counted.append(Path(path).name)
        return super().count(path)


@pytest.mark.parametrize("index", [False, 5, ["index.json"]])
def test_an_index_that_is_not_a_path_is_refused_before_anything_is_written(
    tmp_path: Path, index: Any
) -> None:
    with pytest.raises(TypeError, match=r"write_shards: index must be a path or URL"):
        write_shards(tmp_path, id_shards((3,)), TokenReader(seq_len=SEQ), index=index)
    assert list(tmp_path.iterdir()) == []
    paths = write_shards(tmp_path, id_shards((3,)), TokenReader(seq_len=SEQ), progress=False)
    with pytest.raises(TypeError, match=r"ShardedDataset: index must be a path or URL"):
        ShardedDataset(paths, TokenReader(seq_len=SEQ), index=index)


class BadCountReader(TokenReader):
    def count(self, path: Path) -> Any:
        return -1 if Path(path).name.startswith("shard-00001") else super().count(path)


def test_a_reader_count_that_is_not_an_int_ge_0_is_refused_naming_the_shard(
    tmp_path: Path,
) -> None:
    paths = write_shards(tmp_path, id_shards((3, 4)), TokenReader(seq_len=SEQ))
    for index in tmp_path.glob("*index*"):
        index.unlink()
    with pytest.raises(TypeError, match=r"BadCountReader.count\(.*shard-00001.*returned -1"):
        ShardedDataset(paths, BadCountReader(seq_len=SEQ))


def test_index_is_written_once_and_reused(tmp_path: Path) -> None:
    CountingReader.counted = []
    reader = CountingReader(seq_len=SEQ)
    paths = write_shards(tmp_path, id_shards((3, 4)), reader)
    assert len(CountingReader.counted) == 2
    ds = ShardedDataset(paths, reader)
    assert ds.sizes == (3, 4) and len(CountingReader.counted) == 2  # read from the index
    doc = json.loads(ds.index_path.read_text())  # type: ignore[union-attr]
    assert doc["reader"]["seq_len"] == SEQ and [r[3] for r in doc["shards"]] == [3, 4]
    # Other reader settings count again into their own index, next to the data.
    other = ShardedDataset(paths, CountingReader(seq_len=2))
    assert other.sizes == (6, 8) and other.index_path != ds.index_path
    assert len(CountingReader.counted) == 4


def test_counted_once_and_cached_when_not_written_by_write_shards(tmp_path: Path) -> None:
    CountingReader.counted = []
    for i, arr in enumerate(id_shards((2, 5))):
        np.save(tmp_path / f"part{i}.npy", arr)
    first = ShardedDataset(tmp_path, CountingReader(seq_len=SEQ))
    second = ShardedDataset(tmp_path, CountingReader(seq_len=SEQ))
    assert first.sizes == second.sizes == (2, 5)
    assert CountingReader.counted == ["part0.npy", "part1.npy"]


def test_a_shard_changed_after_indexing_is_an_error_naming_it(shards: list[Path]) -> None:
    reader = TokenReader(seq_len=SEQ)
    with open(shards[2], "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(ShardError, match=r"shard-00002\.npy.*no longer matches.*size"):
        ShardedDataset(shards, reader)
    shards[2].unlink()
    with pytest.raises(MissingShardError, match=r"shard-00002\.npy.*does not exist"):
        ShardedDataset(shards, reader)
    with pytest.raises(FileNotFoundError):
        ShardedDataset(shards, reader)


def test_a_touched_shard_is_an_error(shards: list[Path]) -> None:
    st_ = shards[4].stat()
    os.utime(shards[4], ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
    with pytest.raises(ShardError, match=r"shard-00004\.npy.*modified"):
        ShardedDataset(shards, TokenReader(seq_len=SEQ))


def test_a_shard_changed_after_the_dataset_was_built_fails_on_open(shards: list[Path]) -> None:
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    np.save(shards[0], np.zeros(4 * 9, np.uint16))
    with pytest.raises(ShardError, match=r"shard-00000\.npy.*changed after it was indexed"):
        ds[0]
    with pytest.raises(WorkerError, match=r"shard-00000\.npy"):
        list(loader(ds, 2, shuffle=False))
    shards[3].unlink()  # samples 18 and 19
    with pytest.raises(MissingShardError, match=r"shard-00003\.npy.*disappeared"):
        ds.get_batch([19])


def test_explicit_index_mismatches_are_named(shards: list[Path], tmp_path: Path) -> None:
    reader = TokenReader(seq_len=SEQ)
    index = tmp_path / "my-index.json"
    ShardedDataset(shards[:3], reader, index=index)
    with pytest.raises(ShardError, match=r"shard-00003\.npy.*is not in the shard index"):
        ShardedDataset(shards[:4], reader, index=index)
    with pytest.raises(ShardError, match=r"also lists .*shard-00002\.npy"):
        ShardedDataset(shards[:2], reader, index=index)
    with pytest.raises(ShardError, match="counted with reader settings"):
        ShardedDataset(shards[:3], TokenReader(seq_len=2), index=index)
    doc = json.loads(index.read_text())
    doc["shards"][0][3] += 1  # hand-edited counts fail the checksum
    index.write_text(json.dumps(doc))
    with pytest.raises(ShardError, match="checksum"):
        ShardedDataset(shards[:3], reader, index=index)
    index.write_text("{not json")
    with pytest.raises(ShardError, match=r"my-index\.json.*unreadable"):
        ShardedDataset(shards[:3], reader, index=index)


# --------------------------------------------------------------------- errors
def test_corrupt_and_truncated_shards_are_named_when_counted(tmp_path: Path) -> None:
    (tmp_path / "bad.npy").write_bytes(b"not an npy file at all" * 10)
    with pytest.raises(ShardError, match=r"bad\.npy.*corrupt or truncated"):
        ShardedDataset([tmp_path / "bad.npy"], TokenReader(seq_len=4))
    np.save(tmp_path / "cut.npy", np.arange(100, dtype=np.uint16))
    data = (tmp_path / "cut.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(data[:-10])
    with pytest.raises(ShardError, match=r"cut\.npy.*corrupt or truncated"):
        ShardedDataset([tmp_path / "cut.npy"], TokenReader(seq_len=4))
    (tmp_path / "odd.bin").write_bytes(b"\0" * 7)
    with pytest.raises(ShardError, match=r"odd\.bin.*not a multiple of the uint16"):
        ShardedDataset([tmp_path / "odd.bin"], TokenReader(seq_len=4, dtype=np.uint16))
    with pytest.raises(ValueError, match=r"odd\.bin.*pass dtype="):
        ShardedDataset([tmp_path / "odd.bin"], TokenReader(seq_len=4))
    np.save(tmp_path / "f.npy", np.zeros((2, 3), np.uint16))
    with pytest.raises(ShardError, match=r"f\.npy.*1-D integer"):
        ShardedDataset([tmp_path / "f.npy"], TokenReader(seq_len=4))
    with pytest.raises(MissingShardError, match=r"nope\.npy"):
        ShardedDataset([tmp_path / "nope.npy"], TokenReader(seq_len=4))


def corrupt_keeping_size_and_mtime(path: Path) -> None:
    st_ = path.stat()
    path.write_bytes(b"\x93GARBAGE" + b"\0" * (st_.st_size - 8))
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_on_error_skip_counts_warns_and_substitutes_the_next_readable_sample(
    shards: list[Path], num_workers: int
) -> None:
    corrupt_keeping_size_and_mtime(shards[4])  # 21 samples, ids 20..40
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    with pytest.raises(WorkerError, match=r"shard-00004\.npy"):
        list(loader(ds, num_workers))
    skipping = ShardedDataset(shards, TokenReader(seq_len=SEQ), on_error="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(loader(skipping, num_workers))
    assert [len(b) for b in batches] == [4] * 12 + [2], "batches must keep their size"
    got = Counter(ids(batches))
    assert skipping.skipped == 21
    assert set(got) == {i for i in range(50) if not 20 <= i < 41}
    # Each of the 21 skipped places went to sample 41, the next readable one after the shard.
    assert got[41] == 22 and sum(got.values()) == 50
    if num_workers == 0:  # worker processes print their warnings to stderr instead
        assert any("shard-00004.npy" in str(w.message) for w in caught)
    again = ShardedDataset(shards, TokenReader(seq_len=SEQ), on_error="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same = list(loader(again, 2 - num_workers))
    assert all(torch.equal(a, b) for a, b in zip(batches, same, strict=True))


class _Tagged(ShardedDataset):
    def __getitem__(self, index: int) -> Any:
        return {**super().__getitem__(index), "tag": 1}


@pytest.mark.parametrize("how", ["subclass", "unbatched"])
def test_skip_applies_to_reads_through_getitem_too(tmp_path: Path, how: str) -> None:
    # Hunter 265: a subclass's __getitem__ reading through the base one, and batch_size=None,
    # raised at the bad line under on_error="skip" (and the message said to pass it).
    path = tmp_path / "a.jsonl"
    path.write_text('{"i": 0}\n{"i": 1}\n{broken\n{"i": 3}\n')
    kind = _Tagged if how == "subclass" else ShardedDataset
    ds = kind([path], JsonlReader(), on_error="skip")
    batched = how == "subclass"
    with pytest.warns(RuntimeWarning, match=r"a\.jsonl"):
        batches = list(
            ResumableDataLoader(ds, batch_size=2 if batched else None, collate_fn=list)
            if batched
            else ResumableDataLoader(ds, batch_size=None)
        )
    got = [int(s["i"]) for b in batches for s in (b if batched else [b])]
    assert got == [0, 1, 3, 3] and ds.skipped == 1
    with pytest.raises(IndexError):
        ds[4]


def test_skip_substitutes_only_the_bad_lines_of_a_jsonl_shard(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"i": 0}\n{"i": 1}\n{broken\n{"i": 3}\n')
    strict = ShardedDataset([path], JsonlReader())
    with pytest.raises(ShardError, match=r"a\.jsonl.*line 3 is not valid JSON"):
        strict.get_batch([0, 2])
    ds = ShardedDataset([path], JsonlReader(), on_error="skip")
    with pytest.warns(RuntimeWarning, match=r"a\.jsonl"):
        assert ds.__getitems__([3, 2, 0]) == [{"i": 3}, {"i": 3}, {"i": 0}]
    assert ds.get_batch([1, 2])["i"].tolist() == [1, 3]
    assert ds.skipped == 2
    bad = tmp_path / "b.jsonl"
    bad.write_text("{broken\n")
    hopeless = ShardedDataset([bad], JsonlReader(), on_error="skip")
    with pytest.warns(RuntimeWarning), pytest.raises(ShardError, match="no readable sample"):
        hopeless.get_batch([0])


def test_a_jsonl_bom_then_a_blank_line_is_no_sample(tmp_path: Path) -> None:
    # The BOM and the blank line were one piece, counted as a sample that failed to read.
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'\xef\xbb\xbf\n{"i": 0}\n{"i": 1}\n')
    reader = JsonlReader()
    assert reader.count(path) == 2
    assert [reader.open(path).read(i) for i in range(2)] == [{"i": 0}, {"i": 1}]


def test_an_older_sidecar_counting_a_blank_line_names_it_and_the_fix(tmp_path: Path) -> None:
    # It named line 3 (not valid JSON: b''), and no index or sidecar to delete.
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"i":0}\n\n{"i":1}\n')
    with open(tmp_path / "a.jsonl.lkoffsets", "wb") as f:
        np.save(f, np.array([0, 8, 9, 17]))  # as an older loaderkit counted it
    stat = path.stat()  # and stamped with the shard's mtime (else it is recounted)
    os.utime(tmp_path / "a.jsonl.lkoffsets", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    handle = JsonlReader().open(path)
    fix = r"line 2 is blank, yet an older loaderkit counted it as a sample; delete the shard "
    with pytest.raises(ShardChangedError, match=fix + r"index and '.*a\.jsonl\.lkoffsets'"):
        handle.read(1)
    assert handle.read(2) == {"i": 1}


def test_a_token_budget_over_a_jsonl_shard_with_a_bad_line(tmp_path: Path) -> None:
    # bucket_batch_sampler(max_tokens=) set a drop flag first, so computing lengths() got
    # fewer samples than it asked for and raised TypeError.
    (tmp_path / "a.jsonl").write_text("[1,2,3]\n{bad\n[4]\n[5,6]\n")
    ds = ShardedDataset(tmp_path, JsonlReader(), on_error="skip")
    with pytest.warns(RuntimeWarning, match=r"a\.jsonl"):
        sampler = ds.bucket_batch_sampler(max_tokens=8, seed=0, rank=0, world_size=1)
    assert sorted(i for b in sampler for i in b) == [0, 1, 2, 3]
    assert ds.lengths().tolist() == [3, 1, 1, 2]  # line 2's place: line 3, its substitute


def test_a_blank_jsonl_line_is_no_sample(tmp_path: Path) -> None:
    # Each blank line was a sample that failed to read mid-epoch (SequenceDataModule and
    # JSON itself skip whitespace).
    (tmp_path / "a.jsonl").write_text('\n {"i": 0}\r\n\n  \t\n{"i": 1}\n\n')
    (tmp_path / "b.jsonl").write_text("\n \n")
    (tmp_path / "c.jsonl").write_text('{"i": 2}')
    ds = ShardedDataset(tmp_path, JsonlReader())
    assert ds.sizes == (2, 0, 1)
    assert [ds[i] for i in range(len(ds))] == [{"i": 0}, {"i": 1}, {"i": 2}]
    (tmp_path / "d.jsonl").write_text('\n{"i": 3}\n\n{broken\n')
    with pytest.raises(ShardError, match=r"d\.jsonl' line 4 is not valid JSON"):
        ShardedDataset([tmp_path / "d.jsonl"], JsonlReader())[1]
    # Behind a BOM the blank line was not counted (hunter 328: line 1 for line 2).
    (tmp_path / "e.jsonl").write_bytes('\ufeff\n{bad}\n{"i": 4}\n'.encode())
    with pytest.raises(ShardError, match=r"e\.jsonl' line 2 is not valid JSON"):
        ShardedDataset([tmp_path / "e.jsonl"], JsonlReader())[0]
    # A form feed is no JSON whitespace: shown, not stripped to b'' (hunter 342).
    (tmp_path / "f.jsonl").write_bytes(b'{"i": 5}\n\x0c\n')
    with pytest.raises(ShardError, match=r"f\.jsonl' line 2 .*: b'\\x0c'; fix the line"):
        ShardedDataset([tmp_path / "f.jsonl"], JsonlReader())[1]


def test_bad_arguments_are_named(shards: list[Path]) -> None:
    with pytest.raises(ValueError, match="exactly one of seq_len"):
        TokenReader()
    with pytest.raises(ValueError, match="on_error must be"):
        ShardedDataset(shards, TokenReader(seq_len=SEQ), on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reader must have"):
        ShardedDataset(shards, object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="listed twice"):
        ShardedDataset([shards[0], shards[0]], TokenReader(seq_len=SEQ))
    with pytest.raises(IndexError, match="out of range"):
        ShardedDataset(shards, TokenReader(seq_len=SEQ))[50]
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    with pytest.raises(TypeError, match="'float' object cannot be interpreted as an integer"):
        ds[1.7]  # type: ignore[index]  # was sample 1
    assert int(ds[np.int64(1)][0]) == int(ds[torch.tensor(1)][0]) == 1


def test_a_link_to_a_shard_in_its_folder_is_refused_not_read_twice(shards: list[Path]) -> None:
    folder = shards[0].parent
    for index in folder.glob(".loaderkit-index-*"):
        index.unlink()  # a folder of shards loaderkit did not write (no index to check against)
    (folder / "shard-99999.npy").symlink_to(shards[0])
    with pytest.raises(ValueError, match="are one file") as err:
        ShardedDataset(folder, TokenReader(seq_len=SEQ))
    assert "shard-99999.npy" in str(err.value)
    with pytest.raises(ValueError, match="are one file"):
        ShardedDataset([folder / "shard-99999.npy", shards[0]], TokenReader(seq_len=SEQ))
    # Links into a content store may share a target (a Hugging Face snapshot's blobs).
    blob = folder.parent / "blobs" / "same"
    blob.parent.mkdir()
    blob.write_bytes(shards[0].read_bytes())
    snapshot = folder.parent / "snapshot"
    snapshot.mkdir()
    for name in ("part-0.npy", "part-1.npy"):
        (snapshot / name).symlink_to(blob)
    one = len(ShardedDataset([shards[0]], TokenReader(seq_len=SEQ)))
    for _ in range(2):  # the second read goes by the index the first wrote: still two shards
        assert ShardedDataset(snapshot, TokenReader(seq_len=SEQ)).sizes == (one, one)
    # An index loaderkit 0.2.0 wrote keyed each link by its target: still read.
    from loaderkit.data import index as index_module

    other = folder.parent / "linked"
    other.mkdir()
    (other / "part-0.npy").symlink_to(shards[0])
    reader = TokenReader(seq_len=SEQ)
    first = ShardedDataset(other, reader)
    doc = json.loads(first.index_path.read_text())  # type: ignore[union-attr]
    rows = [[os.path.relpath(shards[0], other), *row[1:]] for row in doc["shards"]]
    first.index_path.write_text(index_module.index_doc(rows, reader).decode())  # type: ignore[union-attr]
    assert ShardedDataset(other, reader).sizes == (one,)


def test_a_readers_suffixes_given_as_one_str_are_refused(shards: list[Path]) -> None:
    """``suffixes=".npy"`` is not a list of the letters ".", "n", "p", "y" (any file)."""

    class OneStr(TokenReader):
        suffixes = ".npy"  # type: ignore[assignment]

    (shards[0].parent / "notes.txy").write_text("not a shard")
    with pytest.raises(TypeError, match=r"reader.suffixes must be a list of suffixes"):
        ShardedDataset(shards[0].parent, OneStr(seq_len=SEQ))


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_token_the_out_dtype_cannot_hold_or_an_eos_above_the_dtype_is_refused(
    tmp_path: Path, on_error: Any
) -> None:
    """int16 would wrap token 60000 to -5536, and eos=70000 never ends a uint16 document;
    a reader setting is never skipped as a bad shard. Tokens that fit a narrower dtype read."""
    tokens = np.array([1, 60000, 7, 2], np.uint16)
    path = TokenReader(seq_len=2, dtype=np.uint16).write(tmp_path / "a.bin", tokens)
    narrow = ShardedDataset(
        [path], TokenReader(seq_len=2, dtype=np.uint16, out_dtype=torch.int16), on_error=on_error
    )
    assert narrow[1].tolist() == [7, 2]
    for read in (lambda: narrow[0], lambda: narrow.get_batch([0, 1]), lambda: list(loader(narrow))):
        with pytest.raises(ReaderSettingError, match=r"out_dtype int16 cannot hold token 60000"):
            read()
    small = write_shards(tmp_path / "i64", [np.arange(40)], TokenReader(seq_len=4))  # int64
    as_int32 = ShardedDataset(small, TokenReader(seq_len=4, out_dtype=torch.int32))
    assert as_int32.get_batch([9])[0].tolist() == [36, 37, 38, 39]
    with pytest.raises(ReaderSettingError, match=r"eos=70000 is above every uint16 token"):
        ShardedDataset([path], TokenReader(eos=70000, dtype=np.uint16), on_error=on_error)
    assert len(ShardedDataset([path], TokenReader(eos=7, dtype=np.uint16))) == 2


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float64])
def test_a_float_out_dtype_that_rounds_an_int64_token_is_refused(
    tmp_path: Path, out_dtype: torch.dtype
) -> None:
    # Measured before: 2**53 + 1 came back as 2**53 (the check compared through float64,
    # which rounded both sides, and numpy calls int64 -> float64 a safe cast).
    tokens = np.array([2**53 + 1, 3, 5, 7], np.int64)
    reader = TokenReader(seq_len=2, dtype=np.int64, out_dtype=out_dtype)
    ds = ShardedDataset(write_shards(tmp_path, [tokens], reader), reader)
    assert ds[1].tolist() == [5, 7]
    for read in (lambda: ds[0], lambda: ds.get_batch([0, 1]), lambda: list(loader(ds))):
        with pytest.raises(ReaderSettingError, match=rf"cannot hold token {2**53 + 1}"):
            read()


# ----------------------------------------------------------------- file opens
class LoggingReader(TokenReader):
    """Appends ``pid shard`` to a log file on every open, from any process."""

    def __init__(self, log: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.log = str(log)

    def open(self, path: Path) -> Any:
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} {Path(path).name}\n")
        return super().open(path)


def opens(log: Path) -> Counter[tuple[str, str]]:
    return Counter(tuple(line.split()) for line in log.read_text().splitlines())  # type: ignore[misc]


@pytest.mark.parametrize("persistent", [False, True])
def test_each_worker_opens_each_shard_at_most_once(shards: list[Path], persistent: bool) -> None:
    """Non-persistent workers are new processes each epoch: each opens a shard at most once
    per epoch. Persistent workers keep their maps: at most once over both epochs."""
    log = shards[0].parent / "opens.log"
    ds = ShardedDataset(shards, LoggingReader(log, seq_len=SEQ))
    run = loader(ds, 2, persistent_workers=persistent)
    for _ in range(2):
        assert len(ids(list(run))) == 50
    per_process = opens(log)
    assert max(per_process.values()) == 1, per_process
    pids = {pid for pid, _ in per_process}
    assert len(pids) == (2 if persistent else 4)
    # Every non-empty shard was read by some worker in each epoch.
    assert {name for _, name in per_process} == {
        p.name for p, n in zip(shards, SIZES, strict=True) if n
    }


def test_with_a_bounded_cache_each_shard_is_opened_once_per_epoch(tmp_path: Path) -> None:
    """40 shards of 3 samples, batches of 2, one shard at a time: 2 consecutive samples span
    at most k = 2 shards, so 2k - 1 = 3 open shards are enough for one open per shard per
    epoch (the documented bound; the next test shows that fewer reopen shards)."""
    paths = write_shards(tmp_path, id_shards([3] * 40), TokenReader(seq_len=SEQ))
    log = tmp_path / "opens.log"
    ds = ShardedDataset(paths, LoggingReader(log, seq_len=SEQ), max_open_shards=3)
    run = loader(ds, 0, batch_size=2, window=2, mix_shards=1, drop_last=True)
    for _ in range(2):
        assert len(ids(list(run))) == 120
    counts = Counter(name for _, name in opens(log).elements())
    assert set(counts.values()) == {2}, counts  # 2 epochs, once each


@pytest.mark.parametrize(
    ("mix", "batch_size", "cap"),
    [(3, 4, 2 * 4 - 1), (3, 3, 2 * 3 - 1), (3, 2, (3 + 1) * 2), (6, 1, (6 + 1) * 1)],
)
def test_mixing_opens_each_piece_at_most_once_per_epoch_within_the_bound(
    tmp_path: Path, mix: int, batch_size: int, cap: int
) -> None:
    """40 shards of 7 samples read K at a time, the lanes cutting shards into pieces: with
    the documented max_open_shards (2k - 1 for batch_size >= K, (K + 1) k below it; k =
    batch_size here) a process opens each shard at most once per piece and epoch, and no
    fewer than once per epoch. With 1 open shard the same run opens more (the count is real)."""
    paths = write_shards(tmp_path, id_shards([7] * 40), TokenReader(seq_len=SEQ))
    plan = ShardPlan(shard_sizes=(7,) * 40, batch_size=batch_size, seed=3, window=2, mix_shards=mix)
    pieces = Counter(paths[s].name for e in range(2) for lane in plan.lanes(e) for s, _, _ in lane)
    assert max(pieces.values()) > 2, "some shard must be cut into pieces"
    got = {}
    for limit in (cap, 1):
        log = tmp_path / f"opens-{limit}.log"
        ds = ShardedDataset(paths, LoggingReader(log, seq_len=SEQ), max_open_shards=limit)
        run = loader(ds, 0, batch_size=batch_size, window=2, mix_shards=mix, drop_last=True)
        for _ in range(2):
            assert len(set(ids(list(run)))) == 280 // batch_size * batch_size
        got[limit] = Counter(name for _, name in opens(log).elements())
    bounded = got[cap]
    assert all(2 <= bounded[name] <= pieces[name] for name in pieces), (bounded, pieces)
    assert sum(got[1].values()) > sum(pieces.values())


def test_pickling_leaves_the_maps_behind(shards: list[Path]) -> None:
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    ds.get_batch(np.arange(50))
    assert ds.opens == 6 and len(ds._files.open) == 6
    ds.get_batch(np.array([49, 0, 20]))  # across shards: row sources made
    assert ds._sources
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.opens == 0 and not copy._files.open and not copy._sources
    assert torch.equal(copy.get_batch(np.arange(50)), ds.get_batch(np.arange(50)))


@pytest.mark.parametrize("out_dtype", [torch.int64, None])
def test_a_batch_across_shards_is_copied_row_by_row_and_equals_the_samples(
    shards: list[Path], out_dtype: torch.dtype | None
) -> None:
    """Mixed batches hold one or two samples per shard: they are copied row by row into one
    array (no per-shard gather), with the same values, order and dtype as the samples."""
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ, out_dtype=out_dtype))
    batch = [49, 0, 20, 6, 5, 48, 21]  # shards 6, 0, 4, 2, 2, 6, 4
    got = ds.get_batch(np.asarray(batch))
    assert torch.equal(got, torch.stack([ds[i] for i in batch]))
    assert got.dtype == (torch.int64 if out_dtype else torch.uint16)
    assert ids([got]) == batch
    rows = ds._rows_across(batch)
    assert rows is not None and rows.dtype == got.numpy().dtype
    # Shards without rows (documents, JSON lines) are read per shard, as before.
    docs = write_shards(
        shards[0].parent.parent / "docs", [[1, 2, 0, 3, 0], [4, 0]], TokenReader(eos=0)
    )
    doc_ds = ShardedDataset(docs, TokenReader(eos=0))
    assert doc_ds._rows_across([2, 0]) is None
    assert [t.tolist() for t in doc_ds.__getitems__([2, 0, 1])] == [[4, 0], [1, 2, 0], [3, 0]]


def test_a_batch_of_overlapping_rows_copies_the_rows_not_the_shard(tmp_path: Path) -> None:
    # With targets, rows overlap by one token: ndarray.take copied the whole map per batch.
    import tracemalloc

    tokens = np.arange(1 << 20, dtype=np.uint16)
    reader = TokenReader(seq_len=64, targets=True, out_dtype=None)
    handle = reader.open(reader.write(tmp_path / "t.npy", tokens))
    picks = np.array([3, 9000, 17, 16000])
    tracemalloc.start()
    try:
        rows = handle.read_batch(picks)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024  # was ~2 MB: the shard's bytes
    assert rows.tolist() == [tokens[i * 64 : i * 64 + 65].tolist() for i in picks.tolist()]


@pytest.mark.parametrize("targets", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.int64, None, torch.int32, torch.int8])
def test_get_batch_in_one_shard_and_across_equals_the_samples(
    tmp_path: Path, targets: bool, out_dtype: torch.dtype | None
) -> None:
    """get_batch gathers rows from the shards' ``rows`` (one shard, or row by row across
    shards): the samples' values and dtype; a narrowing out_dtype reads per shard, which
    checks each token."""
    reader = TokenReader(seq_len=SEQ, targets=targets, out_dtype=out_dtype)
    ds = ShardedDataset(write_shards(tmp_path, id_shards(SIZES), reader), reader)
    n = len(ds)
    for batch in ([3, 0, 2, 1], [5, n // 2, 6, n - 1, 0], [n - 1, n - 3, n - 2]):
        got = ds.get_batch(np.asarray(batch))
        want = torch.stack([ds[i] for i in batch])
        assert torch.equal(got, want) and got.dtype == want.dtype
    narrowing = out_dtype is torch.int8
    assert all((src.rows is None) == narrowing for src in ds._sources.values())


@pytest.mark.parametrize("batch", [[4095, 0, 4000], [4095, 4096, 8197]], ids=["one", "across"])
@pytest.mark.parametrize("cut", [8, "far"])
def test_a_shard_truncated_between_batches_is_a_shard_error(
    tmp_path: Path, batch: list[int], cut: int | str
) -> None:
    """The files' sizes are taken before the copy (a page past the end: SIGBUS) and after it
    (a cut inside the last page reads zeros): the next batch raises a ShardError naming it."""
    reader = TokenReader(seq_len=SEQ)
    ds = ShardedDataset(write_shards(tmp_path, id_shards((4096,) * 3), reader), reader)
    ds.get_batch(np.asarray(batch))  # 32 KiB shards: row 4095 lies 7 pages past the header
    victim = ds.shards[0]
    os.truncate(victim, 128 if cut == "far" else victim.stat().st_size - cut)
    with pytest.raises(ShardError, match=r"shard-00000.* changed while it was memory-mapped"):
        ds.get_batch(np.asarray(batch))


def test_a_shard_replaced_after_it_was_mapped_keeps_the_guard_of_its_map(
    shards: list[Path],
) -> None:
    # The file at its path is another one now: the batch reads the map as before, sized by
    # the guard's own sizes of each map (an fstat on the map's descriptor), as every shard is.
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ))
    want = torch.stack([ds[i] for i in (0, 49, 20)])  # maps shards 0, 6, 4
    other = shards[0].with_name("other.npy")
    np.save(other, np.full(SIZES[0] * SEQ, 7, dtype=np.uint16))
    os.replace(other, shards[0])
    assert torch.equal(ds.get_batch(np.array([0, 49, 20])), want)
    for shard in (0, 6, 4):
        guard = ds._files.open[shard].guard  # type: ignore[attr-defined]
        assert ds._sources[shard].sizers == guard.sizers


def test_row_sources_are_let_go_with_their_shards(shards: list[Path]) -> None:
    # Each source holds its shard's map: never more than the shards kept open.
    ds = ShardedDataset(shards, TokenReader(seq_len=SEQ), max_open_shards=2)
    for batch in ([0, 49], [20, 6], [48, 0], [20, 21], [49, 5]):
        ds.get_batch(np.asarray(batch))
        ds[30]  # a per-shard read may close one too
        assert set(ds._sources) <= set(ds._files.open), batch
    assert torch.equal(ds.get_batch(np.array([49, 0])), torch.stack([ds[49], ds[0]]))


class _Plus1000ReadOnly:
    """A handle wrapper defining only ``read``; the rest (``read_batch`` too) passed on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self.inner)

    def read(self, i: int) -> torch.Tensor:
        return self.inner.read(i) + 1000


class _Plus1000(_Plus1000ReadOnly):
    """A handle wrapper that passes unknown attributes on (``rows`` included) and reads other
    values."""

    def read_batch(self, idx: np.ndarray) -> np.ndarray:
        return self.inner.read_batch(idx) + 1000


class _Tripled(loaderkit.data.readers._FixedTokens):
    def read(self, index: int) -> torch.Tensor:
        return super().read(index) * 3

    def read_batch(self, indices: np.ndarray) -> np.ndarray:
        return super().read_batch(indices) * 3


class _WrappingReader(TokenReader):
    def open(self, path: Path) -> Any:
        return _Plus1000(super().open(path))


class _PatchingReader(TokenReader):
    def open(self, path: Path) -> Any:
        handle: Any = super().open(path)
        read, read_batch = handle.read, handle.read_batch
        handle.read = lambda i: read(i) * 2
        handle.read_batch = lambda idx: read_batch(idx) * 2
        return handle


class _SubclassingReader(TokenReader):
    def open(self, path: Path) -> Any:
        handle = super().open(path)
        handle.__class__ = _Tripled
        return handle


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "collate", [None, torch.utils.data.default_collate], ids=["none", "default"]
)
@pytest.mark.parametrize("make", [_WrappingReader, _PatchingReader, _SubclassingReader])
def test_get_batch_reads_through_a_reader_s_own_reads(
    tmp_path: Path, make: type[TokenReader], collate: Any, num_workers: int
) -> None:
    # A handle's rows are copied only where they are what its reads return: a wrapper passing
    # rows on, reads set on the instance, or a subclass's reads were bypassed (raw tokens).
    reader = make(seq_len=SEQ)
    ds = ShardedDataset(write_shards(tmp_path, id_shards(SIZES), reader), reader)
    for batch in ([0, 1, 2], [3, 0], [1, 12, 49], [20, 6]):
        want = torch.stack([ds[i] for i in batch])
        assert torch.equal(ds.get_batch(np.asarray(batch)), want), batch
    for mix in (1, 8):  # batches inside one shard, and across shards
        got = loader(ds, num_workers, mix_shards=mix, collate_fn=collate, shuffle=True)
        sampler = ds.batch_sampler(4, seed=3, window=6, mix_shards=mix, shuffle=True)
        for b, indices in zip(got, list(sampler), strict=True):
            assert torch.equal(b, torch.stack([ds[i] for i in indices])), indices


class _TripledReadOnly(loaderkit.data.readers._FixedTokens):
    def read(self, index: int) -> torch.Tensor:
        return super().read(index) * 3


class _DocumentsPlus1000(loaderkit.data.readers._Documents):
    def read(self, index: int) -> torch.Tensor:
        return super().read(index) + 1000


class _ReadOnlySubclassReader(TokenReader):
    def open(self, path: Path) -> Any:
        handle = super().open(path)
        handle.__class__ = _TripledReadOnly if self.seq_len else _DocumentsPlus1000
        return handle


class _ReadOnlyWrappingReader(TokenReader):
    def open(self, path: Path) -> Any:
        return _Plus1000ReadOnly(super().open(path))


def _documents(sizes: Sequence[int]) -> list[np.ndarray]:
    """Document g of the corpus is ``[g + 1, g + 1, 0]`` (eos 0): all of one length."""
    out, first = [], 0
    for n in sizes:
        docs = np.arange(first + 1, first + n + 1)
        out.append(np.stack([docs, docs, np.zeros_like(docs)], axis=1).reshape(-1))
        first += n
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "collate", [None, torch.utils.data.default_collate], ids=["none", "default"]
)
@pytest.mark.parametrize(
    ("make", "kwargs"),
    [
        (_ReadOnlySubclassReader, {"seq_len": SEQ}),
        (_ReadOnlySubclassReader, {"seq_len": SEQ, "targets": True}),
        (_ReadOnlySubclassReader, {"seq_len": SEQ, "out_dtype": None}),
        (_ReadOnlySubclassReader, {"eos": 0}),
        (_ReadOnlyWrappingReader, {"seq_len": SEQ}),
    ],
    ids=["subclass", "subclass-targets", "subclass-stored-dtype", "documents", "wrapper"],
)
def test_a_handle_overriding_only_read_is_read_by_it_in_batches(
    tmp_path: Path, make: type[TokenReader], kwargs: dict[str, Any], collate: Any, num_workers: int
) -> None:
    # The read_batch it inherits (or a wrapper passes on) would read other values than its
    # read: a batch reads such a shard one sample at a time.
    reader = make(**kwargs)
    data = _documents(SIZES) if "eos" in kwargs else id_shards(SIZES)
    ds = ShardedDataset(write_shards(tmp_path, data, reader), reader)
    n = len(ds)
    for batch in ([0, 1, 2], [3, 0], [1, 12, n - 1], [20, 6]):
        want = [ds[i] for i in batch]
        assert torch.equal(ds.get_batch(np.asarray(batch)), torch.stack(want)), batch
        got = ds.__getitems__(batch)
        assert len(got) == len(want) and all(map(torch.equal, got, want)), batch
    for mix in (1, 8):  # batches inside one shard, and across shards
        got_batches = loader(ds, num_workers, mix_shards=mix, collate_fn=collate, shuffle=True)
        sampler = ds.batch_sampler(4, seed=3, window=6, mix_shards=mix, shuffle=True)
        for b, indices in zip(got_batches, list(sampler), strict=True):
            assert torch.equal(b, torch.stack([ds[i] for i in indices])), indices


def test_a_handle_s_own_batched_reads_are_kept() -> None:
    # loaderkit's handles, and a read_batch defined with or below read, are read in batches.
    fixed, docs = loaderkit.data.readers._FixedTokens, loaderkit.data.readers._Documents
    batch_read = loaderkit.data._shard_reads.batch_read
    for cls in (fixed, docs, _Tripled, _RowsOnTheClass, _Negated):
        handle = cls.__new__(cls)
        assert batch_read(handle) == handle.read_batch, cls
    for cls in (_TripledReadOnly, _DocumentsPlus1000):
        assert batch_read(cls.__new__(cls)) is None, cls
    handle = fixed.__new__(fixed)
    handle.read = lambda i: i  # type: ignore[method-assign]
    assert batch_read(handle) is None
    assert batch_read(_Plus1000ReadOnly(None)) is None
    assert batch_read(_Plus1000(None)) is not None


class _RowsOnTheClass:
    """A user's handle whose ``rows`` is a property of its class."""

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens = tokens
        self.dtype = np.dtype(np.int64)

    @property
    def rows(self) -> np.ndarray:
        return self.tokens.reshape(-1, SEQ)

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.rows[i].astype(np.int64))

    def read_batch(self, idx: np.ndarray) -> np.ndarray:
        return self.rows[idx].astype(np.int64)


class _Negated(_RowsOnTheClass):
    def read(self, i: int) -> torch.Tensor:
        return -super().read(i)

    def read_batch(self, idx: np.ndarray) -> np.ndarray:
        return -super().read_batch(idx)


@pytest.mark.parametrize("handle", [_RowsOnTheClass, _Negated])
def test_a_user_handle_s_rows_are_copied_only_where_its_class_reads_them(
    tmp_path: Path, handle: type[_RowsOnTheClass]
) -> None:
    class Reader(TokenReader):
        def open(self, path: Path) -> Any:
            return handle(np.asarray(self.tokens(path)))

    reader = Reader(seq_len=SEQ)
    ds = ShardedDataset(write_shards(tmp_path, id_shards(SIZES), reader), reader)
    for batch in ([0, 1, 2], [1, 12, 49]):
        assert torch.equal(ds.get_batch(np.asarray(batch)), torch.stack([ds[i] for i in batch]))
    assert all((src.rows is None) == (handle is _Negated) for src in ds._sources.values())


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def fd_limit() -> Any:
    """Lowers this process's soft limit of open files (restored after the test)."""
    resource = pytest.importorskip("resource")
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("counts open files in /proc/self/fd")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield lambda n: resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _two_a_shard(tmp_path: Path, n: int, **kwargs: Any) -> ShardedDataset:
    """``n`` shards of samples ``2s, 2s + 1``, every shard kept open."""
    reader = TokenReader(seq_len=SEQ)
    shards = [np.repeat(np.arange(2 * s, 2 * s + 2), SEQ) for s in range(n)]
    return ShardedDataset(
        write_shards(tmp_path, shards, reader), reader, max_open_shards=None, **kwargs
    )


@pytest.mark.parametrize("across", [False, True])
def test_an_open_shard_holds_one_descriptor_a_mapped_file(
    tmp_path: Path, fd_limit: Any, across: bool
) -> None:
    # A second descriptor a shard for its size ran a process out of them part-way (with
    # max_open_shards=None), each failure called a corrupt shard.
    n = 40
    ds = _two_a_shard(tmp_path, n)
    fd_limit(_open_fds() + n + 12)  # one descriptor an open shard, not two
    for s in range(n):
        batch = [2 * s, 2 * s + 1] if not across else [2 * s, 2 * ((s + 1) % n)]
        assert ds.get_batch(np.asarray(batch))[:, 0].tolist() == batch
    assert len(ds._files.open) == n


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_out_of_descriptors_is_said_and_skips_nothing(
    tmp_path: Path, fd_limit: Any, on_error: Any
) -> None:
    n = 40
    ds = _two_a_shard(tmp_path, n, on_error=on_error)
    fd_limit(_open_fds() + 10)
    with pytest.raises(ShardError, match=r"too many open files: .*shard-000.*ulimit -n") as info:
        for s in range(n):
            ds.get_batch(np.asarray([2 * s, 2 * s + 1]))
    assert "corrupt" not in str(info.value) and ds.skipped == 0


@pytest.mark.parametrize("kind", ["npy", "bin", "eos sidecar"])
def test_out_of_descriptors_opening_a_token_shard_is_not_a_corrupt_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    suffix = ".bin" if kind == "bin" else ".npy"
    reader = TokenReader(eos=3) if kind == "eos sidecar" else TokenReader(seq_len=SEQ)
    (path,) = write_shards(tmp_path, [np.arange(8, dtype=np.uint16)], reader, suffix=suffix)
    reader.count(path)
    real = open

    def out_of_files(file: Any, *args: Any, **kwargs: Any) -> Any:
        if kind != "eos sidecar" or str(file).endswith(".lkoffsets"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real(file, *args, **kwargs)

    monkeypatch.setattr(loaderkit.data.readers, "open", out_of_files, raising=False)
    with pytest.raises(ShardError, match=r"too many open files: .* raise `ulimit -n`") as info:
        reader.open(path)
    assert "corrupt" not in str(info.value) and "delete" not in str(info.value)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_out_of_descriptors_opening_a_user_reader_s_shard_is_said(
    tmp_path: Path, on_error: Any
) -> None:
    class Reader(TokenReader):
        def open(self, path: Path) -> Any:
            if path.name.endswith("1.npy"):
                raise OSError(errno.EMFILE, "Too many open files")
            return super().open(path)

    reader = Reader(seq_len=SEQ)
    paths = write_shards(tmp_path, id_shards((4, 4)), reader)
    ds = ShardedDataset(paths, reader, on_error=on_error)
    for read in (lambda: ds.get_batch(np.array([0, 5])), lambda: ds[5]):
        with pytest.raises(ShardError, match=r"too many open files: .* raise `ulimit -n`") as info:
            read()
        assert "corrupt" not in str(info.value) and "rewrite" not in str(info.value)
    assert ds.skipped == 0


def test_a_batch_sizes_the_file_mapped_not_the_one_now_at_its_path(tmp_path: Path) -> None:
    # A file of the same size and mtime renamed over a mapped shard (rsync -a, cp -p) was
    # sized instead of the map: the mapped file cut through another name then read as zeros.
    reader = TokenReader(seq_len=SEQ)
    ds = ShardedDataset(
        write_shards(tmp_path, [np.arange(1, 4097), np.arange(5000, 5400)], reader), reader
    )
    path = ds.shards[0]
    os.link(path, tmp_path / "mapped")
    want = torch.stack([ds[1022], ds[1023]])  # maps shard 0
    st = path.stat()
    np.save(tmp_path / "new.npy", np.load(path) + 7)
    os.utime(tmp_path / "new.npy", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp_path / "new.npy", path)
    assert torch.equal(ds.get_batch(np.array([1022, 1023])), want)  # the map's tokens
    os.truncate(tmp_path / "mapped", st.st_size - 16)
    with pytest.raises(ShardError, match="changed while it was memory-mapped"):
        ds.get_batch(np.array([1022, 1023]))


@pytest.mark.parametrize("out_dtype", [None, torch.int64])
def test_big_endian_npy_shards_read_as_their_values(tmp_path: Path, out_dtype: Any) -> None:
    np.save(tmp_path / "a.npy", np.arange(8, dtype=">u2"))
    np.save(tmp_path / "b.npy", np.arange(8, 16, dtype="<u2"))
    ds = ShardedDataset(tmp_path, TokenReader(seq_len=4, out_dtype=out_dtype))
    assert ds.get_batch([1, 2]).tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
    assert ds[0].tolist() == [0, 1, 2, 3]
    doc = ShardedDataset(tmp_path, TokenReader(eos=3, out_dtype=out_dtype))
    assert [doc[i].tolist() for i in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stream", [False, True])
def test_token_shards_of_two_dtypes_read_alike_for_any_num_workers(
    tmp_path: Path, stream: bool, num_workers: int
) -> None:
    # out_dtype=None keeps each shard's dtype: default_collate promoted [200, 201] + [-300, -301]
    # to int16 in the main process but wrapped -300 to 212 (uint8) in a worker (hunter 181).
    reader = TokenReader(seq_len=2, out_dtype=None)
    parts = [np.array([200, 201], np.uint8), np.array([-300, -301], np.int16)]
    write_shards(tmp_path, parts, reader, progress=False)
    if stream:
        ds: Any = StreamingShardedDataset(tmp_path, reader, shuffle_shards=False, mix_shards=2)
        loader = ResumableDataLoader(ds, batch_size=2, seed=0, num_workers=min(num_workers, 1))
    else:
        ds = ShardedDataset(tmp_path, reader)
        loader = ResumableDataLoader(ds, batch_size=2, shuffle=False, num_workers=num_workers)
    (batch,) = list(loader)
    assert batch.dtype == torch.int16
    assert sorted(batch.tolist()) == [[-300, -301], [200, 201]]


@pytest.mark.parametrize(
    "sample", [{"label": 1, 1: "one"}, {"a": [{"b": 1}, {None: 2}]}, {"x": {True: "yes"}}]
)
def test_jsonl_write_refuses_a_key_json_would_read_back_as_a_str(
    tmp_path: Path, sample: dict[Any, Any]
) -> None:
    # {0: 0.5, "0": 0.7} was read back as {"0": 0.7}; {1: ...} as {"1": ...} (hunter 181).
    with pytest.raises(TypeError, match=r"dict key .* reads back as a str; use str keys"):
        JsonlReader().write(tmp_path / "s.jsonl", [{"ok": [1, 2]}, sample])
    JsonlReader().write(tmp_path / "t.jsonl", [{"ok": [1, (2, 3)], "n": {"m": None}}])


class _Lines(list):  # type: ignore[type-arg]
    def read(self, i: int) -> list[int]:
        return [0] * len(self[i])

    def lengths(self) -> np.ndarray:
        return np.array([len(line) for line in self])  # an empty shard's: float64


class _LinesReader:
    suffixes = (".txt",)

    def spec(self) -> dict[str, str]:
        return {"kind": "lines"}

    def count(self, path: Path) -> int:
        return len(path.read_text().splitlines())

    def open(self, path: Path) -> _Lines:
        return _Lines(path.read_text().splitlines())


def test_a_readers_lengths_with_an_empty_shard_are_ints(tmp_path: Path) -> None:
    # The empty shard's float64 [] made the whole float64, refused (review 367).
    for name, text in (("a", "xx\nyyy\n"), ("b", ""), ("c", "z\n")):
        (tmp_path / f"{name}.txt").write_text(text)
    assert ShardedDataset(tmp_path, _LinesReader()).lengths().tolist() == [2, 3, 1]


class _Prompted:
    """An open shard's wrapper forwarding all but ``read``, which adds 4 tokens."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __len__(self) -> int:
        return len(self._handle)

    def read(self, index: int) -> torch.Tensor:
        return torch.cat([torch.full((4,), 1), self._handle.read(index)])


class _PromptedReader(TokenReader):
    def open(self, path: Any) -> Any:
        return _Prompted(super().open(path))


def test_a_reader_wrapping_its_shards_reads_gives_their_lengths(tmp_path: Path) -> None:
    # The wrapper forwarded lengths() of the shard it wraps: 4 tokens short a sample, so
    # every token-budget batch went over it (hunt 371).
    write_shards(tmp_path, [np.array([5, 5, 0, 5, 0], dtype=np.int32)], TokenReader(eos=0))
    data = ShardedDataset(tmp_path, _PromptedReader(eos=0))
    assert data.lengths().tolist() == [len(data[0]), len(data[1])] == [7, 6]


@pytest.mark.parametrize("listed", [False, True])
def test_a_relative_folder_is_read_where_it_was_built_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listed: bool
) -> None:
    # Hunt 376: the relative path was looked up again at the first read, so after a chdir
    # another run's folder of the same name was read (same sizes and times: silently).
    for run, value in (("a", 1), ("b", 2)):
        shards = [np.full(12, value, dtype=np.int64)] * 2
        write_shards(tmp_path / run / "tok", shards, TokenReader(seq_len=4))
    monkeypatch.chdir(tmp_path / "a")
    given: Any = "tok"
    if listed:
        given = sorted(str(p) for p in Path("tok").glob("*.npy"))
    ds = ShardedDataset(given, TokenReader(seq_len=4))
    monkeypatch.chdir(tmp_path / "b")
    assert all(int(ds[i].max()) == 1 for i in range(len(ds)))
