"""``SequenceDataModule``: variable-length samples, padded, optionally bucketed by length."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NoReturn

import numpy as np
import torch

from loaderkit._checks import check_path
from loaderkit.collate import PadCollate
from loaderkit.data._fs import is_url
from loaderkit.data.hf import HFDataset
from loaderkit.data.lengths import check_undrawn
from loaderkit.data.parquet import ParquetReader
from loaderkit.data.sharded import ShardedDataset
from loaderkit.lightning.datamodules._args import check_fits, check_settings, remote_cache
from loaderkit.lightning.datamodules._util import is_hf_dataset
from loaderkit.lightning.datamodules.base import LoaderDataModule, loading_checkpoint
from loaderkit.loader._fetch import split_source
from loaderkit.plan.samplers import BucketBatchSampler
from loaderkit.seeding import rngs_put_back

__all__ = ["SequenceDataModule"]

Samples = str | Sequence[Any]
PadValue = int | float | dict[str, float]


class SequenceDataModule(LoaderDataModule):
    """Variable-length samples, padded by :class:`~loaderkit.PadCollate`, bucketed on request.

    A sample is a 1-D sequence (tensor, array or list of numbers), or a dict whose
    ``length_key`` field is one; batches are a :class:`~loaderkit.PaddedBatch`, or a
    dict with ``"lengths"`` and ``"attention_mask"`` added. Under ``max_tokens`` epochs
    differ in length: :class:`loaderkit.ElasticResume` has Lightning re-read it.

    Args:
        train: The train samples, or the path of a ``.jsonl`` (one sample per line),
            ``.parquet`` (or its URL) or ``.arrow`` file, a list of ``.parquet`` paths
            (one dataset), or a ``datasets.Dataset``.
        val: The val split, the same way (or use ``val_fraction``); ``test`` and
            ``predict`` likewise.
        length_key: The field of dict samples whose length counts (and is padded).
        bucket: Batch samples of similar length together (:class:`~loaderkit.BucketBatchSampler`).
        max_tokens: Token budget per train batch (rows vary; ``batch_size`` is then the
            eval splits' only); implies ``bucket``.
        pad_to_multiple_of: Round each batch's padded length up to a multiple of this.
        pad_value: The pad value, or one per dict key.
        window: With ``bucket``: samples per length-sorted window (see ``BucketBatchSampler``).
        oversize: With ``max_tokens``: a sample over the budget, ``"error"`` or ``"skip"``.
        columns: For Parquet, Arrow and ``datasets`` sources: the columns to read.
        storage_options: For a Parquet URL: the fsspec filesystem's options.
        cache_dir: For a Parquet URL: the local cache directory.
        **kwargs: The loader policy of :class:`~loaderkit.lightning.datamodules.LoaderDataModule`.

    Example:
        >>> import torch
        >>> from loaderkit import SequenceDataModule
        >>> g = torch.Generator().manual_seed(0)
        >>> lengths = torch.randint(1, 64, (200,), generator=g)
        >>> seqs = [torch.ones(int(n), dtype=torch.long) for n in lengths]
        >>> dm = SequenceDataModule(seqs, max_tokens=256, seed=0)
        >>> dm.setup("fit")
        >>> batch = next(iter(dm.train_dataloader()))
        >>> batch.values.numel() <= 256, round(dm.describe()["padding_fraction"], 3)
        (True, 0.046)
        >>> round(SequenceDataModule(seqs, batch_size=32).describe()["padding_fraction"], 3)
        0.495
    """

    max_tokens: int | None
    pad_to_multiple_of: int | None
    window: int | None
    oversize: Literal["error", "skip"]
    length_key: str
    bucket: bool
    pad_value: Any  # PadCollate's Mapping[Hashable, ...] is invariant in its key type

    def __init__(
        self,
        train: Samples | None = None,
        val: Samples | None = None,
        test: Samples | None = None,
        predict: Samples | None = None,
        *,
        length_key: str = "input_ids",
        bucket: bool = False,
        max_tokens: int | None = None,
        pad_to_multiple_of: int | None = None,
        pad_value: PadValue = 0,
        window: int | None = None,
        oversize: Literal["error", "skip"] = "error",
        columns: list[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        splits = {"train": train, "val": val, "test": test, "predict": predict}
        self.set_data_args(**splits, storage_options=storage_options)
        super().__init__(**kwargs)
        owner = type(self).__name__
        check_settings(
            self,
            length_key=length_key,
            bucket=bucket,
            max_tokens=max_tokens,
            pad_to_multiple_of=pad_to_multiple_of,
            window=window,
            oversize=oversize,
            pad_value=pad_value,
        )
        self.bucket = bucket or max_tokens is not None
        self._sources = {k: _source(owner, k, v) for k, v in splits.items() if v is not None}
        if not loading_checkpoint(self):
            self.refuse_no_data()
        self._lengths: dict[str, np.ndarray] = {}
        self._measured: dict[str, Any] = {}  # per split, the object its lengths are of
        self._keyed: bool | None = None
        # (tokens, label, ...) samples: field 0 is measured and padded (a namedtuple's by name).
        self._tuples: int | str | None = None
        if columns is not None:
            if not any(is_hf_dataset(s) or _is_table_path(s) for s in self._sources.values()):
                raise ValueError(
                    f"{owner}: columns={columns!r} applies to Parquet, Arrow and datasets "
                    "sources only; drop it."
                )
            if length_key not in columns:
                raise ValueError(
                    f"{owner}: columns={columns!r} leaves out length_key={length_key!r}; add "
                    "it to columns."
                )
        self.columns = columns
        self.reader = ParquetReader(columns, length_column=length_key)
        urls = any(is_url(p) for s in self._sources.values() for p in _table_paths(s))
        self.remote = remote_cache(owner, "a Parquet URL", urls, storage_options, cache_dir)

    def build_datasets(self, stage: str) -> Mapping[str, Any]:
        """Every split, with the length of each sample measured once."""
        out: dict[str, Any] = {}
        for split, source in self._sources.items():
            if split in self._datasets:  # built by an earlier stage's setup
                continue
            table = self._table(split, source)
            if table is not None:  # lengths from the length column alone
                self._keyed = True
                self._lengths[split] = table.lengths()
                self._measured[split] = table
                out[split] = table
                continue
            samples: Sequence[Any] = (
                _read_jsonl(type(self).__name__, source) if isinstance(source, str) else source
            )
            with rngs_put_back():
                self._lengths[split] = self._measure(split, samples)
            out[split] = self._measured[split] = samples
        return out

    def _table(self, split: str, source: Any) -> HFDataset | ShardedDataset | None:
        """The dataset of a Parquet, Arrow or ``datasets`` source; None for the others."""
        table = is_hf_dataset(source) or (isinstance(source, str) and source.endswith(".arrow"))
        if not (table or _is_table_path(source)):
            return None
        if self._keyed is False:  # tables hold dict samples
            self._mixed_kinds(split)
        if table:
            return HFDataset(source, self.columns, length_column=self.length_key)
        paths = _table_paths(source)
        remote = self.remote if any(is_url(p) for p in paths) else None
        return ShardedDataset(paths, self.reader, remote=remote)

    def refuse_no_data(self) -> None:
        if not self._sources:
            raise ValueError(
                f"{type(self).__name__}: no data; pass train= (samples or a .jsonl, .parquet "
                "or .arrow path), val=, test= or predict=."
            )

    def _measure(self, split: str, samples: Sequence[Any]) -> np.ndarray:
        owner = type(self).__name__
        first = samples[0]
        keyed = isinstance(first, Mapping)
        tuples = (
            (getattr(type(first), "_fields", ()) or (0,))[0] if isinstance(first, tuple) else None
        )
        # One collate for every split: its length field follows the samples' kind.
        if self._keyed is not None and (keyed, tuples) != (self._keyed, self._tuples):
            self._mixed_kinds(split)
        self._keyed, self._tuples = keyed, tuples
        lengths = np.empty(len(samples), dtype=np.int64)

        def length(i: int, sample: Any) -> int:
            seq = sample
            if keyed:
                if not isinstance(sample, Mapping) or self.length_key not in sample:
                    raise ValueError(
                        f"{owner}: {split} sample {i} has no {self.length_key!r} field; set "
                        "length_key= to the sequence field."
                    )
                seq = sample[self.length_key]
            elif isinstance(sample, tuple):  # (tokens, label, ...): field 0, as collate_fn pads
                seq = sample[0] if sample else None
            if isinstance(seq, (torch.Tensor, np.ndarray)) and seq.ndim >= 1:
                return int(seq.shape[0])
            if isinstance(seq, (list, tuple)):
                return len(seq)
            if isinstance(sample, tuple):
                name = (getattr(type(sample), "_fields", ()) or ("0",))[0]
                what = f"first field ({name!r}, the one padded and measured) is of type "
                raise TypeError(
                    f"{owner}: {split} sample {i}'s "
                    + (what + type(seq).__name__ if sample else "tuple is empty")
                    + "; put the sequence first in each tuple, or pass dicts and length_key=."
                )
            raise TypeError(
                f"{owner}: {split} sample {i} is a {type(seq).__name__}; pass 1-D tensors, "
                "numpy arrays or lists of numbers."
            )

        # As the loader reads them: a list subclass by index (its __getitem__, never its
        # __iter__); anything else iterated (faster). What is not a plain list or tuple may draw:
        # buckets need lengths that do not follow the draws (as compute_lengths checks).
        plain = type(samples) in (list, tuple)
        own = isinstance(samples, list | tuple) and not plain
        reads = (samples[i] for i in range(len(samples))) if own else iter(samples)
        for i, sample in enumerate(reads):
            lengths[i] = length(i, sample)
        if self.bucket and not plain:
            read = lambda rows: [samples[i] for i in rows]  # noqa: E731
            fix = "crop after the batch is made, or pass bucket=False without max_tokens."
            check_undrawn(read, lambda s: length(0, s), lengths, owner, fix)
        return lengths

    def _mixed_kinds(self, split: str) -> NoReturn:
        raise TypeError(
            f"{type(self).__name__}: {split} samples are not of the other splits' kind (dict, "
            "tuple, namedtuple of the same first field, or bare); give every split the same kind."
        )

    def setup(self, stage: str) -> None:
        """As the base, with the lengths split too."""
        super().setup(stage)
        for split, measured in list(self._measured.items()):
            source = split_source(self._datasets.get(split, measured))
            if source is not measured:  # a subclass's build_datasets wrapped or filtered it
                self._measured[split] = source
                with rngs_put_back():
                    self._lengths[split] = self._measure(split, source)
        if self.split is not None and "val" not in self._lengths:
            full = self._lengths["train"]
            self._lengths["train"], self._lengths["val"] = full[self.split[0]], full[self.split[1]]

    def collate_fn(self, split: str) -> Callable[[list[Any]], Any]:
        """A :class:`~loaderkit.PadCollate` with this module's padding."""
        length_field = self.length_key if self._keyed else self._tuples
        pad_value = self.pad_value
        data = self._datasets.get(split) if split == "predict" else None
        if isinstance(pad_value, Mapping) and data is not None and len(data):
            # Unlabelled samples: the pad values of fields they lack (labels) go.
            first = data[0]
            if isinstance(first, Mapping):
                pad_value = {k: v for k, v in pad_value.items() if k in first}
        return PadCollate(
            pad_value, pad_to_multiple_of=self.pad_to_multiple_of, length_field=length_field
        )

    def batch_sampler(self, split: str, dataset: Any, batch_size: int) -> Any | None:
        """A :class:`~loaderkit.BucketBatchSampler` when bucketing (not for predict: its
        outputs are in the samples' order), else None."""
        if not self.bucket or split == "predict":
            return None
        train = split == "train"
        budget = self.max_tokens if train else None
        if train:
            check_fits(self, self._lengths["train"])  # the split's index, on every rank
        return BucketBatchSampler(
            self._lengths_of(split, dataset),
            batch_size=None if budget is not None else batch_size,
            max_tokens=budget,
            pad_to_multiple_of=self.pad_to_multiple_of,
            seed=self.seed,
            shuffle=self._shuffles(split),
            window=self.window,
            drop_last=self.drop_last and train,
            oversize=self.oversize if budget is not None else "error",  # eval: no budget
        )

    def eval_batches_by_rank(self) -> bool:
        return self.bucket

    def _lengths_of(self, split: str, dataset: Any) -> np.ndarray:
        rows = getattr(dataset, "seed_rows", None)  # a rank's part (LoaderDataModule._rank_part)
        return self._lengths[split] if rows is None else self._lengths[split][rows]

    def padding_fraction(self, split: str) -> float | None:
        """Padded tokens / all tokens over epoch 0 of ``split`` on one rank."""
        if split not in self._lengths:
            return None
        loader = self.loader(split, num_workers=0)
        lengths, plan = self._lengths_of(split, loader.dataset), loader.plan
        multiple = self.pad_to_multiple_of or 1
        real = padded = 0
        sched = plan.schedule(0, start=0, rank=0, world_size=1)
        for step in range(sched.num_steps):
            rows = lengths[sched.indices(step).numpy()]
            longest = -(-int(rows.max()) // multiple) * multiple
            real += int(rows.sum())
            padded += longest * len(rows)
        return 1.0 - real / padded if padded else 0.0


def _source(owner: str, split: str, source: Any) -> Any:
    if is_hf_dataset(source):
        return source
    if is_url(source):
        if not str(source).endswith(ParquetReader.suffixes):
            raise ValueError(
                f"{owner}: {split}={source!r} is a URL; URLs must name a Parquet file, "
                "download other formats first."
            )
        return str(source)
    if isinstance(source, (str, os.PathLike)):
        suffixes = (".jsonl", ".arrow", *ParquetReader.suffixes)
        return check_path(split, source, suffixes, owner=owner)
    if isinstance(source, Sequence) and not isinstance(source, (bytes, str)):
        if not len(source):
            raise ValueError(f"{owner}: {split} is empty; pass at least one sample.")
        if all(isinstance(s, (str, os.PathLike)) for s in source):  # paths: never samples
            paths = _Parquet(_source(owner, f"{split}[{i}]", s) for i, s in enumerate(source))
            if not all(p.endswith(ParquetReader.suffixes) for p in paths):
                raise ValueError(
                    f"{owner}: {split} is a list of paths that are not all Parquet files; pass "
                    "one .jsonl or .arrow path, or join the Arrow datasets first."
                )
            return paths
        return source
    fix = ""
    if isinstance(source, Mapping) and source:  # a DatasetDict: one split is a Dataset
        fix = f"; pass one split, e.g. {split}=data[{next(iter(source))!r}]"
    raise TypeError(
        f"{owner}: {split} must be a list of samples, a .jsonl, .parquet or .arrow path, or "
        f"a datasets.Dataset, got {type(source).__name__}{fix}."
    )


class _Parquet(tuple[str, ...]):
    """A split's list of Parquet paths (a plain tuple is samples)."""


def _is_table_path(source: Any) -> bool:
    if isinstance(source, _Parquet):
        return True
    return isinstance(source, str) and source.endswith((".arrow", *ParquetReader.suffixes))


def _table_paths(source: Any) -> list[str]:
    """The Parquet paths or URLs of a table source (none for the others)."""
    if isinstance(source, _Parquet):
        return list(source)
    return [source] if _is_table_path(source) else []


def _read_jsonl(owner: str, path: str) -> list[Any]:
    samples = []
    with open(path, encoding="utf-8-sig") as f:  # a BOM, as JsonlReader reads it
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                sample = json.loads(line)
            except ValueError as exc:
                raise ValueError(
                    f"{owner}: {path!r} line {number} is not valid JSON ({exc}); fix the line."
                ) from exc
            if not isinstance(sample, (list, dict)):
                raise ValueError(
                    f"{owner}: {path!r} line {number} is a {type(sample).__name__}; write a "
                    "JSON list of numbers or an object per line."
                )
            samples.append(sample)
    if not samples:
        raise ValueError(f"{owner}: {path!r} holds no samples; write one JSON value per line.")
    return samples
