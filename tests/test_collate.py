"""Tests of loaderkit.collate: PadCollate against a pad_sequence reference, and its errors."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import functools
import math
import pickle
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence
from torch.utils.data import DataLoader, Dataset, default_collate

from loaderkit import ResumableDataLoader, WorkerError
from loaderkit.collate import PadCollate, PaddedBatch
from loaderkit.errors import CollateError, LoaderkitError
from tests.support.proptest import examples

Pair = namedtuple("Pair", ["tokens", "label"])


@dataclasses.dataclass
class Example:
    tokens: torch.Tensor
    label: int
    derived: int = dataclasses.field(init=False, default=-1)


def reference(
    seqs: list[torch.Tensor], value: float = 0, side: str = "right", size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The obvious implementation: pad_sequence, then widen to ``size``, plus lengths and mask."""
    padded = pad_sequence(seqs, batch_first=True, padding_value=value, padding_side=side)
    lengths = torch.tensor([len(s) for s in seqs])
    width = padded.shape[1] if size is None else size
    out = padded.new_full((len(seqs), width, *padded.shape[2:]), value)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, n in enumerate(lengths.tolist()):
        rows = slice(0, n) if side == "right" else slice(width - n, width)
        out[i, rows] = seqs[i]
        mask[i, rows] = True
    return out, lengths, mask


def seqs_of(lengths: list[int], dtype: torch.dtype = torch.int64, trail: tuple = ()) -> list:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(1, 100, (n, *trail), generator=gen).to(dtype) for n in lengths]


def assert_matches(batch: PaddedBatch, seqs: list[torch.Tensor], **ref: Any) -> None:
    out, lengths, mask = reference(seqs, **ref)
    assert batch.values.dtype == out.dtype
    both_nan = (batch.values != batch.values) & (out != out)  # NaN padding compares unequal
    assert batch.values.shape == out.shape and bool(((batch.values == out) | both_nan).all())
    assert torch.equal(batch.lengths, lengths) and batch.lengths.dtype == torch.int64
    assert torch.equal(batch.mask, mask) and batch.mask.dtype == torch.bool


# --- every input kind --------------------------------------------------------------------


@pytest.mark.parametrize("side", ["right", "left"])
def test_bare_tensors_match_reference(side: str) -> None:
    seqs = seqs_of([3, 5, 1, 4])
    batch = PadCollate(padding_side=side)(seqs)
    assert isinstance(batch, PaddedBatch) and batch.sort_indices is None
    assert_matches(batch, seqs, side=side)


@pytest.mark.parametrize(
    "dtype", [np.int32, np.int64, np.float32, np.uint8, np.bool_, np.uint16, np.uint32, np.uint64]
)
def test_numpy_arrays_keep_their_dtype(dtype: type) -> None:  # uint16+ raised NotImplementedError
    arrays = [np.arange(n).astype(dtype) for n in (2, 4, 3)]
    batch = PadCollate()(arrays)
    assert_matches(batch, [torch.from_numpy(a) for a in arrays])


@pytest.mark.parametrize(
    ("lists", "dtype"),
    [
        ([[1, 2, 3], [4], []], torch.int64),
        ([[1.5, 2.0], [3.25]], torch.get_default_dtype()),
        ([[True, False], [True]], torch.bool),
        ([[1.5, 2], [3.0]], torch.get_default_dtype()),  # ints among floats: a float field
        ([[], []], torch.int64),  # no item to tell: ints, the commoner lists (token ids)
    ],
)
def test_lists_of_numbers(lists: list, dtype: torch.dtype) -> None:
    batch = PadCollate(padding_side="left")(lists)
    assert_matches(batch, [torch.tensor(v, dtype=dtype) for v in lists], side="left")


def test_a_field_empty_in_every_sample_takes_its_pad_values_type() -> None:
    # An all-empty batch carries no dtype: int64 (token ids, labels), unless the field's pad
    # value is a float or bool; f4a665e gave int64 always, a7cd461 float32 always.
    for pad, dtype in [
        (0, torch.int64),
        (-100, torch.int64),
        (0.0, torch.float32),
        (False, torch.bool),
    ]:
        collate = PadCollate(pad_value={"x": pad})
        full = collate([{"x": [pad]}, {"x": []}])["x"]
        empty = collate([{"x": []}, {"x": []}])["x"]
        assert empty.dtype == full.dtype == dtype and empty.shape == (2, 0)


def test_nested_lists_become_tensors() -> None:
    batch = PadCollate()([[[1, 2], [3, 4]], [[5, 6]]])
    assert_matches(batch, [torch.tensor([[1, 2], [3, 4]]), torch.tensor([[5, 6]])])


def test_lists_of_numpy_scalars_keep_their_dtype() -> None:
    batch = PadCollate()([list(np.arange(3, dtype=np.int32)), list(np.arange(1, dtype=np.int32))])
    assert_matches(batch, [torch.arange(3, dtype=torch.int32), torch.arange(1, dtype=torch.int32)])


@pytest.mark.parametrize(
    "dtype",
    [
        *(torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16),
        *(torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.complex64),
    ],
)
def test_dtype_is_preserved(dtype: torch.dtype) -> None:
    seqs = seqs_of([2, 5, 3], dtype)
    assert_matches(PadCollate()(seqs), seqs)


def test_trailing_dims_are_kept() -> None:
    seqs = seqs_of([3, 1, 2], trail=(4, 2))
    assert_matches(PadCollate(padding_side="left")(seqs), seqs, side="left")


@pytest.mark.parametrize("pad_dim", [1, -1])
def test_pad_dim_other_than_the_first(pad_dim: int) -> None:
    seqs = seqs_of([3, 1, 2], trail=(2,))  # (L, 2): pad as (2, L)
    batch = PadCollate(pad_dim=pad_dim, pad_value=-1)([s.T for s in seqs])
    out, lengths, mask = reference(seqs, value=-1)
    assert torch.equal(batch.values, out.transpose(1, 2)) and batch.values.is_contiguous()
    assert torch.equal(batch.lengths, lengths) and torch.equal(batch.mask, mask)


def test_tensors_that_require_grad_keep_autograd() -> None:
    seqs = [torch.ones(n, requires_grad=True) for n in (2, 3)]
    batch = PadCollate()(seqs)
    batch.values.sum().backward()
    assert seqs[0].grad is not None and torch.equal(seqs[0].grad, torch.ones(2))


# --- sizes: pad_to_multiple_of, max_length, truncate -------------------------------------


@pytest.mark.parametrize(("multiple", "width"), [(1, 5), (4, 8), (5, 5), (8, 8)])
def test_pad_to_multiple_of(multiple: int, width: int) -> None:
    seqs = seqs_of([3, 5, 2])
    assert_matches(PadCollate(pad_to_multiple_of=multiple)(seqs), seqs, size=width)


@pytest.mark.parametrize("side", ["right", "left"])
def test_max_length_pads_to_exactly_that(side: str) -> None:
    seqs = seqs_of([3, 5, 2])
    batch = PadCollate(max_length=8, pad_to_multiple_of=4, padding_side=side)(seqs)
    assert_matches(batch, seqs, size=8, side=side)


@pytest.mark.parametrize("kind", ["tensor", "array", "list"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_truncate_keeps_the_chosen_end(kind: str, side: str) -> None:
    full = [torch.arange(1, 7), torch.arange(1, 3)]
    samples: list[Any] = {
        "tensor": full,
        "array": [t.numpy() for t in full],
        "list": [t.tolist() for t in full],
    }[kind]
    batch = PadCollate(max_length=4, truncate=True, truncation_side=side)(samples)
    kept = full[0][:4] if side == "right" else full[0][-4:]
    assert_matches(batch, [kept, full[1]], size=4)


def test_truncate_along_another_dim() -> None:
    samples = [torch.arange(12).reshape(2, 6), torch.arange(4).reshape(2, 2)]
    batch = PadCollate(pad_dim=1, max_length=3, truncate=True)(samples)
    assert torch.equal(batch.values[0], samples[0][:, :3])
    assert batch.lengths.tolist() == [3, 2]


# --- containers: dicts, tuples, namedtuples, dataclasses ---------------------------------


def token_dicts() -> list[dict[str, Any]]:
    return [
        {"input_ids": [5, 6, 7], "labels": torch.tensor([1, 2, 3]), "id": 0, "text": "abc"},
        {"input_ids": [8], "labels": torch.tensor([4]), "id": 1, "text": "d"},
        {"input_ids": [9, 10], "labels": torch.tensor([5, 6]), "id": 2, "text": "ef"},
    ]


def test_dict_per_key_pad_values_and_fallback() -> None:
    batch = PadCollate(pad_value={"labels": -100}, default_pad_value=3)(token_dicts())
    assert list(batch) == ["input_ids", "labels", "id", "text", "lengths", "attention_mask"]
    ids, lengths, mask = reference(
        [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10])], value=3
    )
    assert torch.equal(batch["input_ids"], ids)
    assert batch["labels"].tolist() == [[1, 2, 3], [4, -100, -100], [5, 6, -100]]
    assert torch.equal(batch["lengths"], lengths) and torch.equal(batch["attention_mask"], mask)
    assert torch.equal(batch["id"], torch.tensor([0, 1, 2]))  # default_collate
    assert batch["text"] == ["abc", "d", "ef"]


def test_dict_output_key_names_and_omission() -> None:
    collate = PadCollate(lengths_key="seq_len", mask_key=None)
    batch = collate(token_dicts())
    assert "seq_len" in batch and "attention_mask" not in batch and "lengths" not in batch
    assert "lengths" not in PadCollate(lengths_key=None)(token_dicts())


def test_length_field_picks_the_field() -> None:
    samples = [{"a": torch.ones(2), "b": torch.ones(n)} for n in (4, 1)]
    # Hunter 379: it was the first padded field, b here, but a in a batch where b's lengths
    # were equal (src one batch, tgt the next): two fields of other lengths are refused.
    with pytest.raises(CollateError, match=r"key 'a' and key 'b' differ in length.*'a', 'b'"):
        PadCollate()(samples)
    assert PadCollate(length_field="b")(samples)["lengths"].tolist() == [4, 1]
    assert PadCollate(length_field="a")(samples)["lengths"].tolist() == [2, 2]


def test_equal_shapes_are_stacked_unless_named() -> None:
    samples = [{"image": torch.ones(3, 2), "ids": torch.ones(n)} for n in (2, 4)]
    batch = PadCollate(max_length=6, length_field="ids")(samples)
    assert batch["image"].shape == (2, 3, 2) and batch["ids"].shape == (2, 6)
    same = [{"ids": torch.ones(3), "x": torch.zeros(3)} for _ in range(2)]
    # Which fields max_length applies to is unknown where none varies: refused, not (2, 3).
    with pytest.raises(CollateError, match=r"no field's length varies.*pad_keys=\[\.\.\.\]"):
        PadCollate(max_length=6)(same)
    with pytest.raises(CollateError, match=r"pad_to_multiple_of=8 is unknown"):
        PadCollate(pad_to_multiple_of=8)([(torch.ones(3), 1), (torch.ones(3), 0)])
    assert PadCollate()(same)["ids"].shape == (2, 3)  # no limit: padding would change nothing
    assert PadCollate(max_length=6, pad_keys=["ids"])(same)["ids"].shape == (2, 6)
    assert PadCollate(max_length=6, pad_value={"ids": 0})(same)["ids"].shape == (2, 6)


def test_a_length_limit_gives_every_batch_one_shape() -> None:
    # Was: a batch whose lengths were all equal kept them (5), the next was padded to 8.
    collate = PadCollate(max_length=8, pad_keys=["ids"], length_field="ids")
    ids = torch.ones(5, dtype=torch.long)
    for n in (5, 3):
        # A loss mask and labels beside the ids are padded with them; an image is not.
        same = {"ids": ids, "labels": ids, "img": torch.ones(3, 2), "mask": ids.bool()}
        batch = collate([same, {**same, "ids": ids[:n], "labels": ids[:n], "mask": ids[:n] > 0}])
        shapes = {k: tuple(v.shape) for k, v in batch.items()}
        assert shapes["ids"] == shapes["labels"] == shapes["mask"] == (2, 8)
        assert shapes["img"] == (2, 3, 2)
    listed = PadCollate(max_length=8, pad_keys=["ids"])([{"ids": [1, 2], "y": torch.ones(2)}] * 2)
    assert tuple(listed["y"].shape) == (2, 8)  # aligned with a list field too
    cut = PadCollate(max_length=4, truncate=True, pad_keys=[0])([(torch.ones(5), 1)] * 2)
    assert cut.values[0].shape == (2, 4) and cut.lengths.tolist() == [4, 4]


def test_bool_fields_pad_absent_and_left_truncation_keeps_short_samples() -> None:
    ids = torch.arange(5)
    samples = [{"input_ids": ids[:n], "loss_mask": ids[:n] > 0} for n in (5, 3)]
    batch = PadCollate(pad_value=1, max_length=8)(samples)
    # A bool field not named in pad_value pads with False (was the token pad id 1: True).
    assert not batch["loss_mask"][:, 5:].any() and batch["input_ids"][1, 3:].eq(1).all()
    assert PadCollate(pad_value=True)([ids > 0, ids[:2] > 0]).values[1, 2:].all()  # asked
    # Left truncation of a sample under the limit beside one above it (was a crash).
    cut = PadCollate(max_length=4, truncate=True, truncation_side="left")
    assert cut([torch.arange(3), torch.arange(6)]).values.tolist() == [[0, 1, 2, 0], [2, 3, 4, 5]]


def test_nothing_to_pad_still_returns_lengths_and_mask() -> None:
    batch = PadCollate()([{"x": torch.ones(3), "y": 1}, {"x": torch.ones(3), "y": 2}])
    assert batch["lengths"].tolist() == [3, 3] and batch["attention_mask"].all()
    assert batch["attention_mask"].shape == (2, 3)
    labels = PadCollate()([{"y": torch.tensor(1), "x": torch.ones(2)}] * 2)
    assert labels["lengths"].tolist() == [2, 2]  # a 0-d tensor has no length
    scalars = PadCollate()([{"y": 1}, {"y": 2}])
    assert set(scalars) == {"y"}


def test_plain_tuples_use_positions() -> None:
    batch = PadCollate(pad_value={1: -1}, length_field=1)(
        [(torch.ones(2), [1]), (torch.ones(2), [2, 3])]
    )
    assert isinstance(batch, PaddedBatch) and isinstance(batch.values, tuple)
    assert batch.values[0].shape == (2, 2) and batch.values[1].tolist() == [[1, -1], [2, 3]]
    assert batch.lengths.tolist() == [1, 2]


def test_namedtuples_keep_their_type() -> None:
    batch = PadCollate(padding_side="left")([Pair([1, 2], 0), Pair([3], 1)])
    assert type(batch.values) is Pair
    assert batch.values.tokens.tolist() == [[1, 2], [0, 3]]
    assert batch.values.label.tolist() == [0, 1]
    assert batch.mask.tolist() == [[True, True], [False, True]]


def test_dataclasses_keep_their_type() -> None:
    batch = PadCollate()([Example(torch.ones(3), 0), Example(torch.ones(1), 1)])
    assert type(batch.values) is Example
    assert batch.values.tokens.shape == (2, 3) and batch.values.label.tolist() == [0, 1]
    assert batch.lengths.tolist() == [3, 1]


@dataclasses.dataclass
class Scaled:
    x: torch.Tensor
    n: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.x, self.n = self.x.float() / 255, len(self.x)  # once, in the dataset


def test_a_dataclass_batch_keeps_every_field_and_skips_post_init() -> None:
    """Measured before: the batch was rebuilt with cls(**fields), so __post_init__ scaled it
    again (1.0 -> 0.0039) and init=False fields were dropped or recomputed (n = 2 rows)."""
    batch = PadCollate()([Scaled(torch.tensor([255, 0])), Scaled(torch.tensor([255]))])
    assert batch.values.x.tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert batch.values.n.tolist() == [2, 1]
    first = Scaled(torch.tensor([1]))
    first.note = "one sample's"  # type: ignore[attr-defined]  # not a field: not the batch's
    assert not hasattr(PadCollate()([first, Scaled(torch.tensor([2]))]).values, "note")
    tagged = [Example(torch.ones(2), 0), Example(torch.ones(1), 1)]
    tagged[0].derived, tagged[1].derived = 7, 8  # set per sample; its default is -1
    assert PadCollate()(tagged).values.derived.tolist() == [7, 8]


def test_mapping_key_order_may_differ() -> None:
    batch = PadCollate()([{"a": [1], "b": 0}, {"b": 1, "a": [2, 3]}])
    assert batch["a"].tolist() == [[1, 0], [2, 3]]


# --- sorting -----------------------------------------------------------------------------


def test_sort_by_length_permutation_and_pack_padded_sequence() -> None:
    seqs = seqs_of([2, 5, 3, 5, 1])
    batch = PadCollate(sort_by_length=True)(seqs)
    assert batch.sort_indices.tolist() == [1, 3, 2, 0, 4]  # stable for the two 5s
    for row, i in enumerate(batch.sort_indices.tolist()):
        n = len(seqs[i])
        assert torch.equal(batch.values[row, :n], seqs[i]) and batch.lengths[row] == n
    packed = pack_padded_sequence(batch.values, batch.lengths, batch_first=True)
    unpacked, lengths = pad_packed_sequence(packed, batch_first=True)
    assert torch.equal(unpacked, batch.values) and torch.equal(lengths, batch.lengths)


def test_sort_by_length_in_dicts_moves_every_field() -> None:
    batch = PadCollate(sort_by_length=True)(token_dicts())
    assert batch["sort_indices"].tolist() == [0, 2, 1]
    assert batch["id"].tolist() == [0, 2, 1] and batch["text"] == ["abc", "ef", "d"]
    assert batch["lengths"].tolist() == [3, 2, 1]
    assert "sort_indices" not in PadCollate(sort_by_length=True, sort_indices_key=None)(
        token_dicts()
    )


def test_sort_with_truncation_sorts_by_truncated_length() -> None:
    batch = PadCollate(sort_by_length=True, max_length=2, truncate=True)(seqs_of([1, 3, 2]))
    assert batch.sort_indices.tolist() == [1, 2, 0] and batch.lengths.tolist() == [2, 2, 1]


# --- pickling, DataLoader, doctest -------------------------------------------------------


def test_pickle_round_trip() -> None:
    collate = PadCollate(pad_value={"labels": -100}, max_length=8, sort_by_length=True)
    clone = pickle.loads(pickle.dumps(collate))
    assert repr(clone) == repr(collate) and "max_length=8" in repr(clone)
    a, b = collate(token_dicts()), clone(token_dicts())
    assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "labels", "attention_mask"))


class TokenDataset(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": list(range(1, i + 2)), "label": i}


def test_inside_a_dataloader() -> None:
    loader = DataLoader(TokenDataset(), batch_size=4, collate_fn=PadCollate(), num_workers=0)
    batches = list(loader)
    assert [b["input_ids"].shape for b in batches] == [(4, 4), (4, 8), (2, 10)]
    assert batches[2]["lengths"].tolist() == [9, 10] and batches[2]["label"].tolist() == [8, 9]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_samples_stay_on_the_device() -> None:
    seqs = [s.cuda() for s in seqs_of([3, 1, 2])]
    batch = PadCollate(padding_side="left")(seqs)
    assert batch.values.is_cuda and batch.mask.is_cuda and not batch.lengths.is_cuda
    assert_matches(
        PaddedBatch(*(t.cpu() for t in batch[:3]), None), [s.cpu() for s in seqs], side="left"
    )


# --- property test against the reference -------------------------------------------------


@settings(max_examples=examples(60), deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=6),
    trail=st.sampled_from([(), (2,), (1, 3)]),
    side=st.sampled_from(["right", "left"]),
    multiple=st.sampled_from([None, 1, 3, 8]),
    value=st.sampled_from([0, -1, 7]),
    kind=st.sampled_from(["tensor", "array", "list"]),
)
def test_matches_pad_sequence_reference(
    lengths: list[int], trail: tuple, side: str, multiple: int | None, value: int, kind: str
) -> None:
    seqs = seqs_of(lengths, trail=trail)
    if kind == "list" and trail:
        kind = "tensor"
    samples: list[Any] = {"tensor": seqs, "array": [s.numpy() for s in seqs], "list": []}[kind]
    if kind == "list":
        samples = [s.tolist() for s in seqs]
    batch = PadCollate(pad_value=value, padding_side=side, pad_to_multiple_of=multiple)(samples)
    width = max(lengths)
    size = width if multiple is None else math.ceil(width / multiple) * multiple
    assert_matches(batch, seqs, value=value, side=side, size=size)


# --- bad input: every message names the key / parameter, the sample and the fix ---------


def test_errors_are_loaderkit_value_errors() -> None:
    assert issubclass(CollateError, ValueError) and issubclass(CollateError, LoaderkitError)


def test_empty_batch() -> None:
    with pytest.raises(CollateError, match=r"empty batch \(0 samples\).*batch_size"):
        PadCollate()([])


@pytest.mark.parametrize(
    ("samples", "pattern"),
    [
        (
            [torch.ones(2, dtype=torch.int64), torch.ones(3, dtype=torch.float32)],
            r"samples: sample 1 has dtype torch.float32 but sample 0 has torch.int64; cast",
        ),
        ([np.ones(2, np.int64), np.ones(1, np.float32)], r"samples: sample 1 has dtype float32"),
        ([[1, 2], [3], [1.5]], r"samples: sample 2 has dtype float64 but sample 0 has int64"),
        ([[1, 2], [True]], r"samples: sample 1 has dtype bool"),
        ([[1, 2], [3, 2.5]], r"samples: sample 1 mixes int items"),
    ],
)
def test_mixed_dtypes(samples: list, pattern: str) -> None:
    with pytest.raises(CollateError, match=pattern):
        PadCollate()(samples)


def test_ints_or_floats_of_two_widths_are_widened_exactly() -> None:
    # Hunter 306: a mix of a Parquet source (int64) and an HF one (int32) failed every batch
    # holding both, though the mix accepts the pair as promotable.
    mixed = [{"ids": torch.arange(2, dtype=torch.int32), "uid": torch.tensor(7, dtype=torch.int32)},
             {"ids": torch.arange(3), "uid": torch.tensor(2**40)}]  # fmt: skip
    batch = PadCollate()(mixed)
    assert batch["ids"].dtype == batch["uid"].dtype == torch.int64
    assert batch["ids"].tolist() == [[0, 1, 0], [0, 1, 2]] and batch["uid"][1] == 2**40
    halves = PadCollate()([torch.ones(1, dtype=torch.float16), torch.ones(2)]).values
    assert halves.dtype == torch.float32
    arrays = PadCollate()([np.arange(2, dtype=np.int16), np.arange(1, dtype=np.int32)]).values
    assert arrays.dtype == torch.int32


def test_mixed_dtypes_under_a_dict_key() -> None:
    samples = [{"ids": torch.ones(2, dtype=torch.int64)} for _ in range(3)]
    samples[2]["ids"] = samples[2]["ids"].float()
    with pytest.raises(CollateError, match=r"key 'ids': sample 2 has dtype torch.float32"):
        PadCollate()(samples)


def test_a_field_mixing_tensors_and_ints_names_the_sample() -> None:
    # Two sources of a mix: an HF dataset's tensor ids beside a JSONL source's ints (an
    # AttributeError of int.dtype before).
    samples = [{"id": torch.tensor(7)}, {"id": 3}]
    with pytest.raises(TypeError, match=r"key 'id': sample 1 is a int but sample 0 is a Tensor"):
        PadCollate()(samples)
    with pytest.raises(TypeError, match=r"key 'id': sample 1 is a Tensor but sample 0 is a int"):
        PadCollate()(samples[::-1])  # default_collate made tensor([3, 7]) of it (7.5: floats)


@pytest.mark.parametrize(
    ("meta", "where"),
    [
        (lambda i: {"x": [i, i + 1]}, r"sample 0\['meta'\]\['x'\]"),
        (lambda i: ([i, i + 1], i), r"sample 0\['meta'\]\[0\]"),
        (lambda i: ({"x": [float(i)]}, 0), r"sample 0\['meta'\]\[0\]\['x'\]"),
    ],
)
def test_a_nested_number_list_is_refused_not_transposed(meta: Any, where: str) -> None:
    # {"x": [1, 2]} inside a dict came out [tensor([1, 3]), tensor([2, 4])]: by position, where
    # the same list at the top level is one (B, 2) tensor.
    samples = [{"ids": [1, 2], "meta": meta(1)}, {"ids": [3], "meta": meta(3)}]
    with pytest.raises(CollateError, match=where + r" is a list of numbers.*top-level field"):
        PadCollate(length_field="ids")(samples)


def test_lists_of_records_are_kept_per_sample_and_number_tuples_padded() -> None:
    # Hunter 379: a list of tuples, dicts or bytes was transposed across samples where the
    # counts matched (sample 0's first span read [0, 5]); token ids as a tuple were refused.
    spans = [{"spans": [(0, 1), (2, 3)]}, {"spans": [(5, 6), (7, 8)]}]
    assert PadCollate()(spans)["spans"].tolist() == [[[0, 1], [2, 3]], [[5, 6], [7, 8]]]
    for records in ([{"s": 0}, {"s": 9}], [b"a", b"b"], [("PER", 0)]):
        batch = PadCollate(length_field="ids")(
            [{"ids": [1], "r": records}, {"ids": [2, 3], "r": records[::-1]}]
        )
        assert batch["r"] == [records, records[::-1]]
    with pytest.raises(CollateError, match=r"sample 0\['m'\]\['r'\] is a list of strings"):
        PadCollate(length_field="ids")([{"ids": [1], "m": {"r": [b"a"]}}] * 2)
    ids = PadCollate(length_field="ids")([{"ids": (1, 2, 3)}, {"ids": (4,)}])
    assert ids["ids"].tolist() == [[1, 2, 3], [4, 0, 0]] and ids["lengths"].tolist() == [3, 1]


def test_nested_values_of_different_sizes_name_the_field() -> None:
    samples = [{"a": {"t": [torch.ones(2), torch.ones(3)]}}, {"a": {"t": [torch.ones(1)] * 2}}]
    with pytest.raises(CollateError, match=r"key 'a': its values differ in size.*top-level"):
        PadCollate()(samples)


@pytest.mark.parametrize("second", [["c"], ["c", "d"]])
def test_a_field_of_string_lists_stays_one_list_per_sample(second: list[str]) -> None:
    # default_collate transposed equal ones ([('a', 'c'), ('b', 'd')]) and refused others.
    batch = PadCollate()([{"x": [1, 2], "tags": ["a", "b"]}, {"x": [3], "tags": second}])
    assert batch["tags"] == [["a", "b"], second]
    nested = [{"x": [1], "meta": {"tags": ["a", "b"]}}, {"x": [3], "meta": {"tags": second}}]
    with pytest.raises(CollateError, match=r"sample 0\['meta'\]\['tags'\] is a list of strings"):
        PadCollate()(nested)


def test_nested_float_lists_are_in_the_default_dtype_and_empty_ones_take_the_others() -> None:
    batch = PadCollate()([[[1.5, 2.0]], [[3.0, 4.0], [5.0, 6.0]]])
    assert batch.values.dtype == torch.tensor([[1.5]]).dtype == torch.float32
    for samples in ([[], [np.float32(3)]], [[np.float32(3)], []]):
        got = PadCollate()([{"x": s} for s in samples])["x"]
        assert (
            got.dtype == torch.float32
            and got.tolist() == [[0.0], [3.0]][:: 1 if samples[1] else -1]
        )


def test_equal_nested_values_are_collated_as_default_collate_does() -> None:
    meta = [{"t": torch.ones(2) * i, "n": i, "pair": (i, 0.5), "s": "x"} for i in range(2)]
    batch = PadCollate()([{"ids": [1, 2], "meta": meta[0]}, {"ids": [3], "meta": meta[1]}])
    want = default_collate(meta)
    assert batch["meta"].keys() == want.keys() and batch["meta"]["s"] == want["s"]
    assert all(torch.equal(batch["meta"][k], want[k]) for k in ("t", "n"))
    assert all(map(torch.equal, batch["meta"]["pair"], want["pair"]))


def test_mixed_field_types() -> None:
    with pytest.raises(
        TypeError, match=r"key 'ids': sample 1 is a ndarray but sample 0 is a Tensor"
    ):
        PadCollate()([{"ids": torch.ones(2)}, {"ids": np.ones(3)}])
    with pytest.raises(TypeError, match=r"samples: sample 1 is a list but sample 0 is a Tensor"):
        PadCollate()([torch.ones(2), [1.0]])


@pytest.mark.parametrize(
    ("second", "pattern"),
    [
        (
            torch.ones(4, 2),
            r"key 'x': sample 1 has shape \(4, 2\) but sample 0 has \(3, 3\); only dim 0",
        ),
        (torch.ones(4), r"key 'x': sample 1 has shape \(4,\) but sample 0 has \(3, 3\)"),
    ],
)
def test_different_trailing_dims(second: torch.Tensor, pattern: str) -> None:
    with pytest.raises(CollateError, match=pattern):
        PadCollate()([{"x": torch.ones(3, 3)}, {"x": second}])


def test_different_trailing_dims_in_arrays() -> None:
    with pytest.raises(CollateError, match=r"samples: sample 2 has shape \(1, 5\)"):
        PadCollate()([np.ones((2, 4)), np.ones((3, 4)), np.ones((1, 5))])


def test_missing_and_extra_keys() -> None:
    good = {"ids": [1], "labels": [2]}
    with pytest.raises(
        CollateError, match=r"sample 2 lacks keys \['labels'\] and has extra keys \[\]"
    ):
        PadCollate()([good, good, {"ids": [1]}])
    with pytest.raises(
        CollateError, match=r"sample 1 lacks keys \[\] and has extra keys \['foo'\]"
    ):
        PadCollate()([good, {**good, "foo": 1}])
    with pytest.raises(CollateError, match=r"sample 1 lacks keys \[1\]"):
        PadCollate()([([1], [2]), ([1],)])


def test_mixed_and_unsupported_sample_types() -> None:
    with pytest.raises(TypeError, match=r"sample 1 is a tuple but sample 0 is a dict"):
        PadCollate()([{"a": [1]}, ([1],)])
    with pytest.raises(TypeError, match=r"sample 0 is a int; samples must be tensors"):
        PadCollate()([1, 2])
    with pytest.raises(TypeError, match=r"sample 1 is a Pair but sample 0 is a tuple"):
        PadCollate()([([1], 0), Pair([1], 0)])


@pytest.mark.parametrize(
    ("dtype", "value", "pattern"),
    [
        (
            torch.uint8,
            -100,
            r"pad value -100 is not representable in torch.uint8 \(needs an integer in 0..255\)",
        ),
        (torch.int64, 0.5, r"pad value 0.5 is not representable in torch.int64"),
        (torch.float16, 1e40, r"pad value 1e\+40 is not representable in torch.float16"),
        (
            torch.bfloat16,
            1e40,
            r"pad value 1e\+40 .* torch.bfloat16 \(needs \|value\| <= 3.38953e\+38",
        ),
        (torch.bool, 2, r"pad value 2 is not representable in torch.bool"),
        (torch.int8, 128, r"pad value 128 .* torch.int8 \(needs an integer in -128..127\)"),
    ],
)
def test_pad_value_not_representable(dtype: torch.dtype, value: float, pattern: str) -> None:
    samples = [{"ids": torch.zeros(n, dtype=dtype)} for n in (1, 2)]
    with pytest.raises(CollateError, match=r"key 'ids': " + pattern):
        PadCollate(pad_value={"ids": value})(samples)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 65504.0])
def test_inf_and_nan_pad_floats(value: float) -> None:
    batch = PadCollate(pad_value=value)(
        [torch.ones(1, dtype=torch.float16), torch.ones(2, dtype=torch.float16)]
    )
    assert_matches(
        batch, [torch.ones(1, dtype=torch.float16), torch.ones(2, dtype=torch.float16)], value=value
    )


def test_integral_float_pads_an_int_field() -> None:
    assert PadCollate(pad_value=2.0)([[1], [1, 1]]).values.tolist() == [[1, 2], [1, 1]]


def test_too_long_without_truncate() -> None:
    samples = [{"ids": [1, 2]}, {"ids": [1, 2, 3, 4, 5]}]
    with pytest.raises(
        CollateError,
        match=r"key 'ids': sample 1 has length 5 along dim 0, above max_length=4; "
        r"pass truncate=True",
    ):
        PadCollate(max_length=4)(samples)


@pytest.mark.parametrize(
    "kwargs",
    [{"pad_keys": ["idz"]}, {"pad_value": {"idz": 0}}, {"length_field": "idz"}],
)
def test_unknown_key_named(kwargs: dict[str, Any]) -> None:
    with pytest.raises(
        CollateError,
        match=r"'idz' is named in pad_keys, pad_value or length_field but sample 0 has "
        r"keys \['ids'\]",
    ):
        PadCollate(**kwargs)([{"ids": [1]}])
    with pytest.raises(CollateError, match=r"'idz' .* sample 0 has bare samples"):
        PadCollate(**kwargs)([[1]])


@pytest.mark.parametrize("kwargs", [{"pad_keys": ["text"]}, {"length_field": "text"}])
def test_named_key_that_cannot_be_padded(kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match=r"key 'text': sample 0 holds a str, which cannot be"):
        PadCollate(**kwargs)(token_dicts())


def test_bare_samples_that_cannot_be_padded() -> None:
    with pytest.raises(TypeError, match=r"samples: sample 0 holds a list, which cannot be"):
        PadCollate()([["a", "b"], ["c"]])
    # List samples [x, y] (what default_collate takes): the fix named pad_keys, never passed.
    with pytest.raises(TypeError, match=r"or return a tuple \(or dict\) of fields$"):
        PadCollate()([[torch.ones(3), 1], [torch.ones(2), 0]])


def test_output_key_collides_with_a_sample_key() -> None:
    with pytest.raises(CollateError, match=r"already have a key 'lengths'.*lengths_key"):
        PadCollate()([{"ids": [1], "lengths": 1}])


def test_pad_dim_out_of_range() -> None:
    with pytest.raises(
        CollateError,
        match=r"key 'ids': pad_dim=1 is out of range for sample 0 with 1 dims; "
        r"pass a pad_dim in -1..0",
    ):
        PadCollate(pad_dim=1)([{"ids": torch.ones(2)}, {"ids": torch.ones(3)}])
    with pytest.raises(CollateError, match=r"sample 0 with 0 dims; return 1-d values$"):
        PadCollate()([np.array(1.0), np.array(2.0)])  # the fix said "pad_dim in 0..-1"


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        (
            {"pad_to_multiple_of": 0},
            ValueError,
            r"PadCollate: pad_to_multiple_of must be >= 1, got 0; pass e.g. 8, or None",
        ),
        ({"pad_to_multiple_of": -8}, ValueError, r"pad_to_multiple_of .* got -8"),
        ({"pad_to_multiple_of": 2.5}, TypeError, r"pad_to_multiple_of must be an int, got 2.5"),
        ({"pad_to_multiple_of": True}, TypeError, r"pad_to_multiple_of .* got True \(bool\)"),
        ({"max_length": 0}, ValueError, r"max_length must be >= 1, got 0; pass e.g. 8, or None"),
        (
            {"max_length": 10, "pad_to_multiple_of": 8},
            ValueError,
            r"max_length=10 is not a multiple of pad_to_multiple_of=8",
        ),
        (
            {"padding_side": "center"},
            ValueError,
            r"padding_side must be 'right' or 'left', got 'center'",
        ),
        (
            {"truncation_side": "both"},
            ValueError,
            r"truncation_side must be 'right' or 'left', got 'both'",
        ),
        (
            {"truncate": True},
            ValueError,
            r"truncate=True needs max_length; pass e.g. max_length=512",
        ),
        ({"truncate": 1, "max_length": 4}, TypeError, r"truncate must be a bool, got 1"),
        ({"pad_to_max_length": "no"}, TypeError, r"pad_to_max_length must be a bool"),
        ({"sort_by_length": "yes"}, TypeError, r"sort_by_length must be a bool, got 'yes'"),
        ({"pad_value": "0"}, TypeError, r"pad_value must be a bool, int or float, got '0'"),
        ({"pad_value": {"labels": None}}, TypeError, r"pad_value\['labels'\] must be .* got None"),
        (
            {"pad_value": {}, "default_pad_value": "x"},
            TypeError,
            r"default_pad_value must be .* got 'x'",
        ),
        (
            {"pad_value": 1, "default_pad_value": 2},
            ValueError,
            r"default_pad_value=2 only applies with a mapping pad_value, but pad_value=1",
        ),
        ({"pad_dim": 0.0}, TypeError, r"pad_dim must be an int, got 0.0"),
        ({"pad_keys": "input_ids"}, TypeError, r"pad_keys must be a list of keys, got 'input_ids'"),
        ({"pad_keys": 3}, TypeError, r"pad_keys must be a list of keys, got 3"),
        (
            {"mask_key": "lengths"},
            ValueError,
            r"lengths_key, mask_key and sort_indices_key must differ",
        ),
        ({"lengths_key": 1}, TypeError, r"lengths_key must be a str or None, got 1"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, Any], error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        PadCollate(**kwargs)


def test_empty_pad_value_mapping_uses_the_default() -> None:
    assert PadCollate(pad_value={}, default_pad_value=9)([[1], [1, 1]]).values.tolist() == [
        [1, 9],
        [1, 1],
    ]


class _Frame(list[Any]):
    """A list subclass whose constructor takes more than its items."""

    def __init__(self, items: list[Any], fps: int = 30) -> None:
        super().__init__(items)
        self.fps = fps


class _TwoDtypes(Dataset[Any]):
    """Sample ``i``'s value in uint8 or int16 (``-300 + i``), or beside a Python number."""

    def __init__(self, shape: str) -> None:
        self.shape = shape

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> Any:
        value = np.array([200], np.uint8) if i % 2 == 0 else np.array([-300], np.int16)
        if self.shape == "number beside 0-d arrays":
            return {"score": np.array(i, np.int16) if i % 2 == 0 else 70000 + i}
        if self.shape == "a list beside a list subclass":  # review 190
            return [value] if i % 2 == 0 else _Frame([np.array([70000 + i], np.int32)])
        if self.shape == "a defaultdict":
            sample: Any = collections.defaultdict(list)
            sample["x"] = value if i % 2 == 0 else np.array([70000 + i], np.int32)
            return sample
        if self.shape == "padded beside a nested field":
            return {"ids": np.arange(1 + i), "meta": {"t": value}}
        return Pair(value, i)  # a namedtuple


@pytest.mark.parametrize(
    ("shape", "collate_fn"),
    [
        ("number beside 0-d arrays", None),
        ("a list beside a list subclass", None),
        ("a defaultdict", None),
        ("padded beside a nested field", PadCollate()),
        ("namedtuple", default_collate),
    ],
)
def test_fields_of_two_dtypes_collate_alike_for_any_num_workers(
    shape: str, collate_fn: Any
) -> None:
    # In a worker torch's default_collate cast to the first sample's dtype (int16 -300 read as
    # uint8 212, 70001 as 4465) where the main process promotes (hunter 181, review 186).
    def batch(num_workers: int) -> Any:
        loader = ResumableDataLoader(
            _TwoDtypes(shape),
            batch_size=4,
            shuffle=False,
            num_workers=num_workers,
            collate_fn=collate_fn,
        )
        return next(iter(loader))

    flat = [torch.as_tensor(t) for t in _leaves(batch(0))]
    assert [(t.dtype, t.tolist()) for t in flat] == [
        (t.dtype, t.tolist()) for t in map(torch.as_tensor, _leaves(batch(2)))
    ]
    assert any(-300 in t.reshape(-1).tolist() or 70001 in t.reshape(-1).tolist() for t in flat)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key])]
    if isinstance(value, tuple | list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def test_a_default_length_field_empty_in_every_sample_is_refused_naming_one_that_is_not() -> None:
    # Empty string lists first in the dict were padded as numbers and measured: lengths [0, 0],
    # where batches holding tags measure input_ids. The field to measure is the user's to say.
    samples = [
        {"tags": [], "input_ids": torch.arange(2)},
        {"tags": [], "input_ids": torch.arange(3)},
    ]
    with pytest.raises(CollateError, match=r"key 'tags' and key 'input_ids' differ in length"):
        PadCollate()(samples)
    batch = PadCollate(length_field="input_ids")(samples)
    assert batch["lengths"].tolist() == [2, 3] and batch["attention_mask"].shape == (2, 3)
    assert PadCollate()([{"tags": []}, {"tags": []}])["lengths"].tolist() == [0, 0]


def test_nested_lists_are_typed_as_torch_tensor_types_them() -> None:
    # Boxes from JSON whose first number is an int stayed float64 beside float32 ones.
    boxes = PadCollate()([[[0, 12.5, 30, 40.2]], [[3.5, 1, 2, 3], [1, 2, 3, 4]]])
    assert boxes.values.dtype == torch.float32
    # A list of numpy scalars beside an array: a raw "truth value is ambiguous" error.
    got = PadCollate()([{"x": list(np.arange(3.0))}, {"x": np.arange(2.0)}])["x"]
    assert got.dtype == torch.float64 and got.tolist() == [[0, 1, 2], [0, 1, 0]]


@pytest.mark.parametrize("other", [torch.tensor([3, 4]), np.array([3, 4, 5])])
def test_a_list_beside_a_tensor_or_array_names_the_sample(other: Any) -> None:
    # A raw "Boolean value of Tensor ... is ambiguous" (or numpy's truth value error) before.
    name = type(other).__name__
    with pytest.raises(TypeError, match=rf"key 'ids': sample 1 is a {name} but sample 0 is a list"):
        PadCollate()([{"ids": [1, 2]}, {"ids": other}])


def test_python_ints_beside_numpy_ints_collate_in_either_order() -> None:
    # Hunter 268: list(tokens) + [eos] holds numpy ints and a Python int; with an empty
    # document ([eos] alone) first, the others' numpy items were "not a number".
    doc, empty = [*list(np.array([5, 6])), 2], [2]
    for batch in ([doc, empty], [empty, doc]):
        got = PadCollate()(batch).values.tolist()
        assert sorted(got) == [[2, 0, 0], [5, 6, 2]]
    # Hunter 307: uint16/uint32 tokens first were refused as a "ragged nested list", and
    # numpy floats first collated as float64 beside float32.
    # Review 308: the numpy scalars' own dtype, whatever Python numbers stand beside them.
    for dtype in (np.uint16, np.uint32, np.int32, np.int64):
        want = torch.from_numpy(np.zeros(1, dtype)).dtype
        doc = [*list(np.array([5, 6], dtype=dtype)), 2]
        for batch in ([doc, empty], [empty, doc], [list(np.array([5, 6, 2], dtype)), empty]):
            padded = PadCollate()([{"input_ids": d} for d in batch])["input_ids"]
            assert padded.dtype == want
            assert sorted(padded.tolist()) == [[2, 0, 0], [5, 6, 2]]
    floats = [[np.float32(0.5), 1.0], [2.0]]
    assert PadCollate()(floats).values.dtype == PadCollate()(floats[::-1]).values.dtype
    assert PadCollate()(floats).values.dtype == torch.float32
    big = [[np.uint8(5), 300], [2]]  # 300 does not fit uint8: numpy's wider dtype, exact
    assert PadCollate()(big).values.tolist() == [[5, 300], [2, 0]]


@pytest.mark.parametrize("labels", [[None, None], [1, None]])
def test_a_none_field_is_named_with_its_sample(labels: list[Any]) -> None:
    # Hunter 268: a raw TypeError naming no key, or "values differ in size".
    batch = [{"ids": [1, 2], "label": labels[0]}, {"ids": [3], "label": labels[1]}]
    with pytest.raises(CollateError, match=r"key 'label': sample \d is None; give every sample"):
        PadCollate()(batch)


def test_a_samples_own_attention_mask_is_padded_as_absent() -> None:
    # Hunter 306: tokenizer output ({"input_ids", "attention_mask"}) failed every batch as a
    # key clash with the computed mask; the samples' own one is padded with 0 and kept.
    samples = [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1]},
               {"input_ids": [8], "attention_mask": [1]}]  # fmt: skip
    batch = PadCollate(pad_value=-1)(samples)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, -1, -1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    with pytest.raises(CollateError, match=r"already have a key 'lengths'"):
        PadCollate()([{"input_ids": [1], "lengths": 1}, {"input_ids": [2, 3], "lengths": 2}])


_TENSOR_THEN_INT = [torch.tensor(0), 1, torch.tensor(2), 3]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_tensor_beside_a_number_fails_alike_for_any_num_workers(num_workers: int) -> None:
    # Review 331: in a worker it was "'int' object has no attribute 'numel'" (torch's
    # collate_tensor_fn), in the main process torch.stack's message.
    loader = ResumableDataLoader(_TENSOR_THEN_INT, batch_size=4, num_workers=num_workers)
    with pytest.raises(
        WorkerError, match=r"expected Tensor as element 1 in argument 0, but got int"
    ):
        next(iter(loader))


def test_an_error_under_sort_by_length_names_the_batchs_own_position() -> None:
    # Hunter 332: it counted the sorted rows ("sample 0" for the input's third).
    batch = [torch.ones(2, dtype=torch.long), torch.ones(1, dtype=torch.float32), torch.ones(5)]
    with pytest.raises(CollateError, match=r"sample 2 has length 5 along dim 0, above max_length"):
        PadCollate(max_length=3, sort_by_length=True)(batch)
    mixed = [torch.ones(1, dtype=torch.long), torch.ones(3, dtype=torch.float32)]
    with pytest.raises(CollateError, match=r"sample 1 has dtype torch.float32 but sample 0 has"):
        PadCollate(sort_by_length=True)(mixed)


@pytest.mark.parametrize("sort", [False, True])
def test_a_nested_field_of_other_keys_or_kinds_is_named(sort: bool) -> None:
    # Review 339: default_collate kept sample 0's keys (sample 1's meta["b"] dropped) or raised
    # a bare KeyError by the order; a number beside a list raised a bare TypeError.
    ids = [torch.ones(2, dtype=torch.long), torch.ones(3, dtype=torch.long)]
    metas = [{"a": 1}, {"a": 2, "b": 5}]
    for order in (metas, metas[::-1]):
        batch = [{"ids": t, "meta": m} for t, m in zip(ids, order, strict=True)]
        with pytest.raises(CollateError, match=r"sample 1\['meta'\] has keys \[.*\], sample 0"):
            PadCollate(sort_by_length=sort)(batch)
    mixed = [{"ids": ids[0], "n": 1}, {"ids": ids[1], "n": [1, 2]}]
    with pytest.raises(CollateError, match=r"key 'n': its values are of other kinds.*\(int, list"):
        PadCollate(sort_by_length=sort)(mixed)
    # Hunter 379: one kind default_collate cannot take, or an int past int64, named so.
    sets = [{"ids": ids[0], "s": {1}}, {"ids": ids[1], "s": {2}}]
    with pytest.raises(CollateError, match=r"key 's': default_collate cannot collate its values"):
        PadCollate(sort_by_length=sort)(sets)
    big = [{"ids": ids[0], "h": 2**63 + 1}, {"ids": ids[1], "h": 2}]
    with pytest.raises(CollateError, match=r"key 'h': its values cannot be made a tensor"):
        PadCollate(sort_by_length=sort)(big)


def test_the_default_length_field_does_not_follow_which_field_varies() -> None:
    # Hunter 379: lengths followed src in one batch and tgt in the next (src's lengths equal),
    # so pack_padded_sequence(src, lengths) dropped real tokens; an image's channels became
    # lengths where the ids were equal. Fields of other lengths are refused, not guessed.
    for src in ([5, 3], [4, 4]):
        batch = [
            {"src": torch.ones(n), "tgt": torch.ones(m)} for n, m in zip(src, [3, 1], strict=True)
        ]
        with pytest.raises(CollateError, match=r"key 'src' and key 'tgt' differ in length"):
            PadCollate()(batch)
        assert PadCollate(length_field="src")(batch)["lengths"].tolist() == src
    image = [{"pixels": torch.ones(3, 2, 2), "ids": torch.ones(6)}] * 2
    with pytest.raises(CollateError, match=r"length_field= one of 'pixels', 'ids'"):
        PadCollate()(image)
    same = [{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [3], "labels": [3]}]
    assert PadCollate()(same)["lengths"].tolist() == [2, 1]  # as long in every sample: fine
    empty = PadCollate()([{"input_ids": [], "labels": []}] * 2)  # every candidate empty
    assert empty["lengths"].tolist() == [0, 0] and empty["input_ids"].shape == (2, 0)


@pytest.mark.parametrize("mask_key", [None, "mask"])
def test_the_samples_own_attention_mask_pads_with_0_whatever_mask_key(mask_key: Any) -> None:
    # Hunter 379: renamed or dropped, the output mask no longer matched the field's name, and
    # the samples' own attention_mask was padded with the token pad id (50256: attended).
    samples = [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1]}]
    samples.append({"input_ids": [8], "attention_mask": [1]})
    batch = PadCollate(50256, mask_key=mask_key)(samples)
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 50256, 50256]]


def test_numpy_arrays_torch_cannot_view_collate_in_a_batch_of_equal_shapes() -> None:
    # Hunter 379: reversed views and big-endian arrays were padded, but a batch of equal
    # shapes reached default_collate, which raised on negative strides and byte order.
    for array in (np.arange(3)[::-1], np.arange(3, dtype=">i4")):
        batch = PadCollate(length_field="ids")([{"ids": [1], "x": array}, {"ids": [2], "x": array}])
        assert batch["x"].tolist() == [array.tolist()] * 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_default_collate_refuses_dict_samples_with_other_keys(num_workers: int) -> None:
    # Hunter 379: default_collate keeps sample 0's keys, so 'weight' was dropped silently.
    data = [{"x": torch.tensor(0)}, {"x": torch.tensor(1), "weight": torch.tensor(0.5)}]
    loader = ResumableDataLoader(data, batch_size=2, num_workers=num_workers)
    with pytest.raises(WorkerError, match=r"sample 1 has keys \['weight', 'x'\], sample 0 \['x'\]"):
        next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dicts_nested_in_samples_with_other_keys_are_refused(num_workers: int) -> None:
    # Review 382: only top-level keys were compared; a dict inside a tuple or a dict field
    # still lost a later sample's extra key.
    cases = {
        r"sample 1\[1\] has keys \['extra', 'x'\]": [(1, {"x": 1}), (2, {"x": 2, "extra": 0})],
        r"sample 1\['meta'\] has keys": [{"meta": {"x": 1}}, {"meta": {"x": 2, "extra": 0}}],
        r"sample 1\['meta'\] has keys no dict": [{"meta": {"x": 1}}, {"meta": [2]}],
    }
    for match, data in cases.items():
        loader = ResumableDataLoader(data, batch_size=2, num_workers=num_workers)
        with pytest.raises(WorkerError, match=match):
            next(iter(loader))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_default_collate_refuses_lists_of_numbers_or_strings_inside_samples(
    num_workers: int,
) -> None:
    # Hunter 389: a tokenizer's lists (a `datasets` row without set_format) came out by position:
    # input_ids a list of 4 tensors of 2 samples each, tokens [('[CLS]', '[CLS]'), ...].
    cases = {
        r"sample 0\['input_ids'\] is a list of numbers": {"input_ids": [101, 7, 102]},
        r"sample 0\['tokens'\] is a list of strings": {"x": torch.ones(1), "tokens": ["a", "b"]},
        r"sample 0\[0\] is a list of numbers": ([1, 2, 3], 0),
        r"sample 0\['ids'\] is an empty list": {"ids": []},  # torch: [], no entry per sample
        r"sample 0\['pred'\] is a list of strings": {"pred": ["pos", 0.9]},
        r"sample 0\['meta'\]\['spans'\] is a list of records": {
            "meta": {"spans": [(0, 1), (2, 3)]}
        },
    }
    for match, sample in cases.items():
        loader = ResumableDataLoader([sample] * 2, batch_size=2, num_workers=num_workers)
        with pytest.raises(WorkerError, match=match + ".*loaderkit.PadCollate"):
            next(iter(loader))
    # What torch collates by position on purpose stays so: a sample's fields, a list of crops.
    crops = [{"crops": [torch.full((2,), float(i)), torch.ones(2)]} for i in range(2)]
    batch = next(iter(ResumableDataLoader(crops, batch_size=2, num_workers=num_workers)))
    assert [t.tolist() for t in batch["crops"]] == [[[0.0] * 2, [1.0] * 2], [[1.0] * 2] * 2]
    for rows in ([(1, 2.0), (3, 4.0)], [[1, 2.0], [3, 4.0]]):  # a sample's fields, as torch's
        fields = next(iter(ResumableDataLoader(rows, batch_size=2)))
        assert [t.tolist() for t in fields] == [[1, 3], [2.0, 4.0]]
    views = [{"views": [{"image": torch.full((2,), float(i))}] * 2} for i in range(2)]
    batch = next(iter(ResumableDataLoader(views, batch_size=2, num_workers=num_workers)))
    assert [v["image"].tolist() for v in batch["views"]] == [[[0.0] * 2, [1.0] * 2]] * 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_collate_errors_name_the_field(num_workers: int) -> None:
    # Hunter 389: torch's "stack expects each tensor to be equal size" named no key.
    cases = {
        r"RuntimeError: in field \['input_ids'\]: stack expects": [
            {"input_ids": torch.ones(n), "label": 0} for n in (2, 3)
        ],
        r"TypeError: in field \['label'\]: default_collate: batch must": [
            {"input_ids": torch.ones(2), "label": None}
        ]
        * 2,
        r"RuntimeError: in field \[1\]\['boxes'\]: stack expects": [
            (torch.ones(3), {"boxes": torch.ones(n, 4)}) for n in (1, 2)
        ],
    }
    for match, data in cases.items():
        loader = ResumableDataLoader(data, batch_size=2, num_workers=num_workers)
        with pytest.raises(WorkerError, match=match):
            next(iter(loader))


def test_a_none_in_a_list_and_a_second_dim_that_differs_name_their_fix() -> None:
    # Hunter 389: a tokenizer's word_ids ([None, 0, None]) were told to "return a tensor", and
    # multiple-choice (choices, T) samples to "fix the other dims", not pad_dim=-1.
    for second in ([None, None], [0, None]):
        batch = [{"ids": [1, 2, 3], "word_ids": [None, 0, None]}, {"ids": [1], "word_ids": second}]
        for order in (batch, batch[::-1]):
            with pytest.raises(CollateError, match=r"'word_ids': sample 0 holds None at item"):
                PadCollate(length_field="ids")(order)
    choices = [{"input_ids": torch.ones(2, n, dtype=torch.long)} for n in (3, 5)]
    with pytest.raises(CollateError, match=r"\(2, 5\) but sample 0 has \(2, 3\).*pad_dim=-1"):
        PadCollate()(choices)
    assert PadCollate(pad_dim=-1)(choices)["input_ids"].shape == (2, 2, 5)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_python_ints_beside_floats_are_float64_whichever_comes_first(num_workers: int) -> None:
    # Hunter 391: torch types a batch of Python numbers by its first: 3 beside 0.1 became
    # float32 (16777217 rounded to 16777216), 0.1 beside 3 float64.
    rows = [{"score": 3}, {"score": 0.1}, {"score": 0.1}, {"score": 3}, {"score": 16777217}]
    rows.append({"score": 0.5})
    for collate_fn in (None, PadCollate(length_field="ids")):
        data = [{**r, "ids": [1]} for r in rows] if collate_fn else rows
        loader = ResumableDataLoader(
            data, batch_size=2, num_workers=num_workers, collate_fn=collate_fn
        )
        got = [(b["score"].dtype, b["score"].tolist()) for b in loader]
        want = [[3, 0.1], [0.1, 3], [16777217, 0.5]]
        assert got == [(torch.float64, w) for w in want]
    assert next(iter(ResumableDataLoader([1, 2], batch_size=2))).dtype == torch.int64


def test_padcollate_keeps_word_lists_dates_and_refuses_what_would_change() -> None:
    # Hunter 391: word lists were "a ragged nested list"; a Parquet date column was refused;
    # ["pos", 0.9] was transposed; an int past int64 wrapped to a negative; a big-endian
    # 0-d target came out (B, 1).
    words = [{"ids": [1], "w": [["New", "York"], ["is"]]}, {"ids": [2, 3], "w": [["ok"]]}]
    assert PadCollate()(words)["w"] == [w["w"] for w in words]
    day, price = datetime.date(2020, 1, 1), decimal.Decimal("1.10")
    got = PadCollate()([{"ids": [1], "day": day, "p": price}] * 2)
    assert got["day"] == [day, day] and got["p"] == [price, price]
    with pytest.raises(CollateError, match=r"sample 0\['pred'\] is a list of strings"):
        PadCollate()([{"ids": [1], "pred": ["pos", 0.9]}, {"ids": [2], "pred": ["neg", 0.2]}])
    with pytest.raises(CollateError, match=r"key 'h': holds 18446744073709551615, past int64"):
        PadCollate(length_field="ids")([{"ids": [1], "h": [2**64 - 1, 2**63]}] * 2)
    with pytest.raises(CollateError, match=r"key 'h': holds -9223372036854775809, past int64"):
        PadCollate(length_field="ids")([{"ids": [1], "h": [-(2**63) - 1, 5]}] * 2)
    target = np.array(0.5, dtype=">f4")
    assert PadCollate()([{"ids": [1], "y": target}] * 2)["y"].shape == (2,)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_default_collate_edges_of_review_393(num_workers: int) -> None:
    # A list of 0-d tensors, or a list beside a tensor of its length, came out by position;
    # a numpy int beside a Python float was float32 first; a big-endian array was refused;
    # [tensor, label] in a dict (fields, as torch reads them) was refused by the first rule.
    def first(data: list[Any]) -> Any:
        loader = ResumableDataLoader(data, batch_size=2, num_workers=num_workers)
        return next(iter(loader))

    cases = {
        r"sample 0\['zero_d'\] is a list of numbers": [{"zero_d": list(torch.arange(3))}] * 2,
        r"sample 0\['ids'\] is a list of numbers": [{"ids": [1, 2]}, {"ids": torch.ones(2)}],
        r"sample 1\['p'\] is a Tensor where sample 0 holds a list": [
            {"p": [torch.ones(2), 1]},
            {"p": torch.ones(2, 2)},
        ],
    }
    for match, data in cases.items():
        with pytest.raises(WorkerError, match=match):
            first(data)
    got = first([{"w": np.int64(16777217)}, {"w": 0.5}])["w"]
    assert got.dtype == torch.float64 and got.tolist() == [16777217, 0.5]
    big = first([{"y": np.array([i, 1.0], dtype=">f4")} for i in range(2)])["y"]
    assert big.tolist() == [[0.0, 1.0], [1.0, 1.0]]
    pair = first([{"pair": [torch.ones(2), i]} for i in range(2)])["pair"]
    assert pair[0].shape == (2, 2) and pair[1].tolist() == [0, 1]


def test_padcollate_tells_word_lists_from_number_tuples_at_any_depth() -> None:
    # Review 393: per-token offset tuples were kept as lists (not padded), and word lists
    # whose first inner list was empty were "a ragged nested list".
    offsets = [{"ids": [5, 6], "o": [[(0, 1), (1, 3)]] * 2}, {"ids": [7], "o": [[(0, 2)] * 2]}]
    assert PadCollate()(offsets)["o"].shape == (2, 2, 2, 2)
    words = [{"ids": [1], "w": [[], ["Paris"]]}, {"ids": [2], "w": [["Rome"]]}]
    assert PadCollate()(words)["w"] == [[[], ["Paris"]], [["Rome"]]]
    tags = [{"ids": [1], "t": [[("The", "DT"), ("cat", "NN")], [("sat", "VBD")]]}] * 2
    assert PadCollate()(tags)["t"] == [tags[0]["t"]] * 2
    with pytest.raises(CollateError, match=r"sample 0\['z'\] is a list of numbers"):
        PadCollate()([{"ids": [1], "z": list(torch.arange(2))}] * 2)


class _Graph:
    def __init__(self, n: int) -> None:
        self.n = n


def _collate_graphs(batch: list[_Graph], *, collate_fn_map: Any = None) -> Any:
    return torch.tensor([g.n for g in batch])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_default_collate_keeps_torchs_values_and_extension_point(num_workers: int) -> None:
    # Review 395: complex numbers beside floats lost their imaginary part, numeric strings
    # were parsed as floats, a type registered in torch's default_collate_fn_map (its
    # documented extension point) was refused, np.float32 first made float32.
    from torch.utils.data._utils.collate import default_collate_fn_map

    def first(data: list[Any]) -> Any:
        loader = ResumableDataLoader(data, batch_size=2, num_workers=num_workers)
        return next(iter(loader))

    got = first([{"z": np.complex64(1 + 2j)}, {"z": 0.5}])["z"]
    assert got.is_complex() and got.tolist() == [1 + 2j, 0.5 + 0j]
    with pytest.raises(WorkerError, match=r"in field \['s'\]"):
        first([{"s": 0.5}, {"s": "2.5"}])
    for pair in ([np.float32(0.1), 16777217.0], [16777217.0, np.float32(0.1)]):
        got = first([{"w": w} for w in pair])["w"]
        assert got.dtype == torch.float64 and got[pair.index(16777217.0)] == 16777217
    default_collate_fn_map[_Graph] = _collate_graphs
    try:
        assert first([{"g": _Graph(3)}, {"g": _Graph(4)}])["g"].tolist() == [3, 4]
    finally:
        del default_collate_fn_map[_Graph]


def _half_tensors(batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> Any:
    return torch.stack([t.to(torch.float16) for t in batch])


def _f32(batch: list[float], *, collate_fn_map: Any = None) -> Any:
    return torch.tensor(batch, dtype=torch.float32)


@dataclasses.dataclass
class _Unhashable:  # eq=True: no __hash__
    def __call__(self, batch: list[str], *, collate_fn_map: Any = None) -> list[str]:
        return batch


@pytest.mark.parametrize("num_workers", [0, 2])
def test_handlers_a_user_registered_for_tensors_and_floats_stay_theirs(num_workers: int) -> None:
    # Review 396: loaderkit's own stack (in workers) and number rule replaced the user's
    # handlers for Tensor and float in torch's default_collate_fn_map.
    from torch.utils.data._utils.collate import default_collate_fn_map

    saved = dict(default_collate_fn_map)
    default_collate_fn_map[torch.Tensor], default_collate_fn_map[float] = _half_tensors, _f32
    default_collate_fn_map[str] = _Unhashable()  # review 397: one that does not hash
    try:
        data = [{"x": torch.arange(3.0), "y": 0.5}, {"x": torch.ones(3), "y": 3}]
        got = next(iter(ResumableDataLoader(data, batch_size=2, num_workers=num_workers)))
        assert got["x"].dtype == torch.float16 and got["y"].dtype == torch.float32
        # Review 397: torch's TensorDataset was gathered in one read, past the handler.
        tensors = torch.utils.data.TensorDataset(torch.arange(4.0))
        batch = next(iter(ResumableDataLoader(tensors, batch_size=2, num_workers=num_workers)))
        assert batch[0].dtype == torch.float16
    finally:
        default_collate_fn_map.clear()
        default_collate_fn_map.update(saved)


def test_a_sample_that_is_a_tuple_of_numbers_is_refused_not_read_as_fields() -> None:
    # Hunter 389: (1, 2, 3) token ids came out three fields of shape (2,), with no lengths.
    for batch in ([(1, 2, 3), (4, 5, 6)], [(1, 2, 3), (4, 5)]):
        with pytest.raises(CollateError, match=r"sample 0 is a tuple of numbers.*list or tensor"):
            PadCollate()(batch)


def test_a_tuple_of_numbers_is_padded_in_every_batch() -> None:
    # Review 382: a batch of equally long tuples was transposed by default_collate, another
    # refused (sizes differ): a field's form flipped with the batch.
    collate = PadCollate()
    equal = collate([{"input_ids": (1, 2)}, {"input_ids": (3, 4)}])["input_ids"]
    unequal = collate([{"input_ids": (1, 2, 3)}, {"input_ids": (4,)}])["input_ids"]
    assert equal.tolist() == [[1, 2], [3, 4]] and unequal.tolist() == [[1, 2, 3], [4, 0, 0]]
    point = collections.namedtuple("point", "x y")  # fields by name, as torch collates them
    batch = PadCollate(length_field="ids")([{"ids": [1], "p": point(1, 2)}] * 2)
    assert batch["p"].x.tolist() == [1, 1] and batch["p"].y.tolist() == [2, 2]


def _wrapped_default(batch: list[Any]) -> Any:
    return default_collate(batch)


@pytest.mark.parametrize("collate_fn", [_wrapped_default, functools.partial(default_collate)])
def test_a_collate_fn_calling_default_collate_promotes_in_workers_too(collate_fn: Any) -> None:
    # Hunter 401: uint8 7 beside int16 -300 gave int16 [7, -300] in the main process and
    # uint8 [7, 212] in a worker (torch stacks into storage typed like the first tensor).
    data = [torch.tensor(7, dtype=torch.uint8), torch.tensor(-300, dtype=torch.int16)]
    got = {
        n: next(iter(ResumableDataLoader(data, batch_size=2, num_workers=n, collate_fn=collate_fn)))
        for n in (0, 2)
    }
    assert got[0].dtype == got[2].dtype == torch.int16 and got[2].tolist() == [7, -300]


def test_padcollate_in_a_plain_torch_dataloader_promotes_in_workers() -> None:
    # Review 403: PadCollate's unpadded fields in torch's own DataLoader workers (not
    # loaderkit's) stacked into the first tensor's dtype: int16 -300 beside uint8 became 212.
    data = [
        {"ids": [1, 2], "meta": {"v": torch.tensor(7, dtype=torch.uint8)}},
        {"ids": [3], "meta": {"v": torch.tensor(-300, dtype=torch.int16)}},
    ]
    for workers in (0, 2):
        batch = next(
            iter(DataLoader(data, batch_size=2, num_workers=workers, collate_fn=PadCollate()))
        )
        assert batch["meta"]["v"].dtype == torch.int16 and batch["meta"]["v"].tolist() == [7, -300]
