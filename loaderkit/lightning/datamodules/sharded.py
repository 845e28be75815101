"""``ShardedDataModule``: token, JSON-lines or Parquet shards, planned or streamed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
from lightning.pytorch.utilities import rank_zero_warn

from loaderkit._checks import reads_overridden
from loaderkit.collate import PadCollate
from loaderkit.data.hf import HFDataset
from loaderkit.data.jsonl import JsonlReader
from loaderkit.data.lengths import compute_lengths
from loaderkit.data.parquet import ParquetReader
from loaderkit.data.readers import ShardReader, TokenReader
from loaderkit.data.remote import RemoteCache
from loaderkit.data.sharded import ShardedDataset
from loaderkit.data.streaming import StreamingShardedDataset
from loaderkit.lightning.datamodules._args import (
    MAX_OPEN_DEFAULT,
    check_fits,
    check_settings,
    collate_of,
    make_reader,
    remote_cache,
)
from loaderkit.lightning.datamodules._util import (
    KeyLength,
    Shards,
    is_hf_dataset,
    is_remote_shards,
    shard_files,
    shard_list,
)
from loaderkit.lightning.datamodules.base import LoaderDataModule
from loaderkit.plan.shard import DEFAULT_MIX, DEFAULT_WINDOW

__all__ = ["ShardedDataModule"]


class _PadByKind(PadCollate):
    """``PadCollate`` padding dict samples by ``length_field`` where they hold it (else, unless
    ``required``, by their first varying field) and bare ones as they are: JSON lines and
    in-memory sources say which they hold only when read."""

    def __init__(
        self, pad_value: Any, *, pad_to_multiple_of: int | None, length_field: str, required: bool
    ) -> None:
        super().__init__(
            pad_value, pad_to_multiple_of=pad_to_multiple_of, length_field=length_field
        )
        self._bare = PadCollate(pad_value, pad_to_multiple_of=pad_to_multiple_of)
        self._bare.length_arg = "the module's length_key"  # its samples lack length_field
        self._required = required

    def __call__(self, batch: Any) -> Any:
        bare = batch and not isinstance(batch[0], Mapping)
        if bare or (batch and not self._required and self.length_field not in batch[0]):
            return self._bare(batch)
        return super().__call__(batch)


class _ShardSources(LoaderDataModule):
    """What ShardedDataModule and MixedDataModule share: checks, reader, cache, collate, lengths."""

    reader: ShardReader | None
    remote: RemoteCache | None
    max_open_shards: int | None
    max_tokens: int | None
    length_key: str
    bucket_window: int | None
    pad_to_multiple_of: int | None
    _only_shards = True  # every train source is shards (fixed-length tokens pad nothing)

    def _check(self, val_fix: str, **settings: Any) -> None:
        """Refuse ``val_fraction`` (it would break the plan); check ``settings``."""
        if self.val_fraction:
            raise ValueError(
                f"{type(self).__name__}: val_fraction={self.val_fraction} is not supported; "
                f"pass {val_fix} instead."
            )
        check_settings(self, **settings)

    def setup(self, stage: str) -> None:
        """As the base; warns of val/test data that shares shard files with train."""
        before = set(self._datasets)
        super().setup(stage)
        train = shard_files(self._datasets.get("train"))
        for split in sorted({"val", "test"} & set(self._datasets) - before):
            shared = train & shard_files(self._datasets[split], views=True)
            if shared:
                rank_zero_warn(
                    f"{type(self).__name__}: the {split} data shares {len(shared)} shard files "
                    f"with train (e.g. {min(shared)!r}); its metrics measure samples the model "
                    "trains on. Pass shards that train does not read."
                )

    def _set_collate(
        self, pad_value: Any, varying: bool, collate: Any = None, *, keyed: bool | None = False
    ) -> None:
        """Set the collate (``keyed``: dict samples, padded by ``length_key``; None: as each
        batch's samples are); refuse pad settings that no collate reads."""
        multiple = self.pad_to_multiple_of
        # Dict samples' mask and lengths follow length_key (a budget's must: it sizes by it);
        # where samples lack it and no budget sizes by it, the first field that varies.
        budget = self.max_tokens is not None
        pad: PadCollate = PadCollate(pad_value, pad_to_multiple_of=multiple)
        if keyed is not False:
            key = self.length_key
            pad = _PadByKind(
                pad_value, pad_to_multiple_of=multiple, length_field=key, required=budget
            )
        self._collate = collate if collate is not None else collate_of(self.reader, pad, varying)
        self._length_cache: tuple[Any, np.ndarray] | None = None
        if self._collate is pad:
            return
        fix = "has no effect: these samples are stacked, not padded; drop"
        if collate is not None:
            fix = "has no effect with collate= (your collate pads); set it there and drop"
        # A budget counts pad_to_multiple_of for a collate of the user's; stacked rows keep
        # their length whatever it counts.
        counted = budget and collate is not None
        for name, value, unused in (
            ("pad_value", pad_value, pad_value != 0),
            ("pad_to_multiple_of", multiple, multiple is not None and not counted),
        ):
            if unused:
                raise ValueError(f"{type(self).__name__}: {name}={value!r} {fix} {name}.")

    def _shard_dataset(self, paths: Shards, **extra: Any) -> ShardedDataset:
        """A :class:`~loaderkit.ShardedDataset` of ``paths``, cached where they are URLs."""
        assert self.reader is not None  # __init__ makes one whenever a shard path is given
        remote = self.remote if is_remote_shards(paths) else None
        limit = self.max_open_shards
        return ShardedDataset(paths, self.reader, max_open_shards=limit, remote=remote, **extra)

    def collate_fn(self, split: str) -> Callable[[list[Any]], Any] | None:
        """``collate``, else ``PadCollate`` for variable-length samples, else None (stacked)."""
        return self._collate

    def _budget(self, dataset: Any, **extra: Any) -> Any:
        """``dataset``'s token-budget train batch sampler under this module's settings."""
        settings = {
            name: getattr(self, name)
            for name in ("max_tokens", "pad_to_multiple_of", "seed", "drop_last")
        }
        settings["shuffle"] = self._shuffles("train")
        lengths = self._lengths(dataset)
        check_fits(self, lengths)
        return dataset.bucket_batch_sampler(
            lengths=lengths, window=self.bucket_window, **settings, **extra
        )

    def _lengths(self, dataset: Any) -> np.ndarray:
        """Each train sample's tokens (kept per dataset)."""
        cached = self._length_cache
        if cached is None or cached[0] is not dataset:
            cached = self._length_cache = (dataset, self._measure(dataset))
        return cached[1]

    def _measure(self, source: Any) -> np.ndarray:
        """One source's sample lengths: from offsets or a column where it can, else read."""
        key = KeyLength(self.length_key, owner=type(self).__name__)
        own = reads_overridden(source, "lengths")  # a subclass's
        sharded = isinstance(source, ShardedDataset)
        # A length column other than length_key counts other tokens than the collate pads.
        column = getattr(source.reader if sharded else source, "length_column", self.length_key)
        by_key = own or column != self.length_key
        if sharded and (by_key or isinstance(source.reader, JsonlReader)):
            return source.lengths(key)  # samples: each read once, by length_key
        if sharded or (isinstance(source, HFDataset) and not by_key):
            return source.lengths()  # offsets, a column: no sample is read
        return compute_lengths(source, key)

    def padding_fraction(self, split: str) -> float | None:
        """Under ``max_tokens``, epoch 0's padded fraction; 0 for fixed-length tokens; else None."""
        if split == "train" and self.max_tokens is not None:
            plan: Any = self.loader("train", num_workers=0, pin_memory=False).plan
            real, padded = plan.token_counts(0)
            return 1.0 - real / padded if padded else 0.0
        fixed = isinstance(self.reader, TokenReader) and self.reader.seq_len is not None
        return 0.0 if fixed and self._only_shards else None


class ShardedDataModule(_ShardSources):
    """Token, ``.jsonl`` or Parquet shards (local or URLs), planned across ranks and workers.

    ``reader="tokens"``: ``.npy`` or raw ``.bin`` token ids cut into ``seq_len``-token
    samples (``(B, seq_len)`` int64 batches), or with ``eos`` one sample per document;
    ``"jsonl"``: one JSON value per line; ``"parquet"``: one row a sample.
    Variable-length samples are padded by :class:`~loaderkit.PadCollate`; shards at
    URLs are cached (:class:`~loaderkit.RemoteCache`). A stream resumes exactly under the
    same world size and ``num_workers`` only; token budgets and streams of unknown length
    need :class:`loaderkit.ElasticResume`.

    Args:
        shards: The train shards: a directory, a shard file, a URL, or a non-empty list.
        val_shards: Val shards, the same way (not ``val_fraction``); ``test_shards`` likewise.
        reader: ``"tokens"``, ``"jsonl"``, ``"parquet"``, or a :class:`~loaderkit.ShardReader`.
        columns: With ``reader="parquet"``: the columns to read (default: all).
        seq_len: Tokens per sample (``reader="tokens"``).
        targets: Add the next token to each sample (``seq_len + 1`` tokens).
        eos: Instead of ``seq_len``: one sample per document ending in this token.
        dtype: Token dtype, e.g. ``"uint16"`` (required for ``.bin`` shards).
        window: Samples shuffled together inside a shard.
        mix_shards: Shards read at once, interleaved (see :class:`~loaderkit.ShardPlan`).
        on_error: ``"raise"``, or ``"skip"`` unreadable samples (see ``ShardedDataset``).
        max_open_shards: Shards each process keeps open.
        pad_value: Pad value of variable-length samples.
        pad_to_multiple_of: Round their padded length up to a multiple of this.
        max_tokens: Token budget per train batch (rows x padded length), for documents,
            ``.jsonl`` or Parquet samples; ``batch_size`` is then the eval splits' only.
        length_key: With ``max_tokens``: the field or column whose length counts.
        bucket_window: With ``max_tokens``: samples per length-sorted window.
        streaming: Stream the train shards (:class:`~loaderkit.StreamingShardedDataset`).
        steps_per_epoch: With ``streaming``: batches per rank per epoch.
        samples_per_epoch: With ``streaming``: samples per epoch over all ranks.
        storage_options: For shards at URLs: the fsspec filesystem's options.
        cache_dir: For shards at URLs: the local cache directory.
        **kwargs: The loader policy of :class:`~loaderkit.lightning.datamodules.LoaderDataModule`.

    Example:
        >>> import tempfile
        >>> import numpy as np
        >>> from loaderkit import ShardedDataModule, TokenReader, write_shards
        >>> root = tempfile.mkdtemp()
        >>> _ = write_shards(root, [np.arange(64), np.arange(40)], TokenReader(seq_len=8))
        >>> dm = ShardedDataModule(root, seq_len=8, batch_size=4)
        >>> dm.setup("fit")
        >>> len(dm.train_dataset), next(iter(dm.train_dataloader())).shape
        (13, torch.Size([4, 8]))
    """

    reader: ShardReader
    window: int
    mix_shards: int
    on_error: Literal["raise", "skip"]
    streaming: bool
    steps_per_epoch: int | None
    samples_per_epoch: int | None

    def __init__(
        self,
        shards: Shards,
        val_shards: Shards | None = None,
        test_shards: Shards | None = None,
        *,
        reader: Literal["tokens", "jsonl", "parquet"] | ShardReader = "tokens",
        columns: list[str] | None = None,
        seq_len: int | None = None,
        targets: bool = False,
        eos: int | None = None,
        dtype: str | None = None,
        window: int = DEFAULT_WINDOW,
        mix_shards: int = DEFAULT_MIX,
        on_error: Literal["raise", "skip"] = "raise",
        max_open_shards: int | None = MAX_OPEN_DEFAULT,
        pad_value: int | float = 0,
        pad_to_multiple_of: int | None = None,
        max_tokens: int | None = None,
        length_key: str = "input_ids",
        bucket_window: int | None = None,
        streaming: bool = False,
        steps_per_epoch: int | None = None,
        samples_per_epoch: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        # A reader named by a string is a setting; an object is data hparams cannot hold.
        reader_arg = None if isinstance(reader, str) else reader
        self.set_data_args(reader=reader_arg, storage_options=storage_options)
        super().__init__(**kwargs)
        owner = type(self).__name__
        self._check(
            "val_shards=[...]",
            streaming=streaming,
            steps_per_epoch=steps_per_epoch,
            samples_per_epoch=samples_per_epoch,
            on_error=on_error,
            window=window,
            mix_shards=mix_shards,
            max_tokens=max_tokens,
            length_key=length_key,
            bucket_window=bucket_window,
            max_open_shards=max_open_shards,
            pad_to_multiple_of=pad_to_multiple_of,
        )
        self._check_combinations(reader, columns)
        self.shards = _splits(owner, shards=shards, val_shards=val_shards, test_shards=test_shards)
        urls = any(is_remote_shards(s) for s in self.shards.values())
        self.remote = remote_cache(owner, "shards at URLs", urls, storage_options, cache_dir)
        token: dict[str, Any] = {"seq_len": seq_len, "eos": eos, "dtype": dtype, "targets": targets}
        self.reader = make_reader(owner, reader, columns=columns, length_key=length_key, **token)
        keyed = True if isinstance(self.reader, ParquetReader) else None  # JSON: lists too
        self._set_collate(pad_value, varying=False, keyed=keyed)

    def _check_combinations(self, reader: Any, columns: Any) -> None:
        """Columns are Parquet's, epoch limits a stream's, the planned settings not a stream's."""
        owner = type(self).__name__
        if columns is not None and reader != "parquet":
            raise ValueError(
                f"{owner}: columns={columns!r} applies to reader='parquet' only; drop it or "
                "pass reader='parquet'."
            )
        for name in ("steps_per_epoch", "samples_per_epoch"):
            value = getattr(self, name)
            if value is not None and not self.streaming:
                raise ValueError(
                    f"{owner}: {name}={value!r} only applies with streaming=True; pass "
                    f"streaming=True, or drop {name}."
                )
        if self.steps_per_epoch is not None and self.samples_per_epoch is not None:
            raise ValueError(
                f"{owner}: pass steps_per_epoch or samples_per_epoch, not both (got "
                f"steps_per_epoch={self.steps_per_epoch}, "
                f"samples_per_epoch={self.samples_per_epoch})."
            )
        if not self.streaming:
            return
        if self.on_error != "raise":
            raise ValueError(
                f"{owner}: on_error={self.on_error!r} needs the planned dataset; pass "
                "on_error='raise' or streaming=False."
            )
        planned_only = {
            "window": (self.window, DEFAULT_WINDOW),
            "max_tokens": (self.max_tokens, None),
            "bucket_window": (self.bucket_window, None),
            "max_open_shards": (self.max_open_shards, MAX_OPEN_DEFAULT),
        }
        for name, (given, default) in planned_only.items():
            if given != default:
                raise ValueError(
                    f"{owner}: {name}={given!r} applies to planned shards only; drop {name} or "
                    "use streaming=False."
                )

    def build_datasets(self, stage: str) -> Mapping[str, Any]:
        """A :class:`~loaderkit.ShardedDataset` per split (with ``streaming``: a train stream)."""
        datasets: dict[str, Any] = {}
        for split, paths in self.shards.items():
            if self.streaming and split == "train":
                datasets[split] = StreamingShardedDataset(
                    paths,
                    self.reader,
                    shuffle_shards=self.shuffle,
                    mix_shards=self.mix_shards,
                    remote=self.remote,
                    steps_per_epoch=self.steps_per_epoch,
                    samples_per_epoch=self.samples_per_epoch,
                )
            else:
                datasets[split] = self._shard_dataset(paths, on_error=self.on_error)
        return datasets

    def batch_sampler(self, split: str, dataset: Any, batch_size: int) -> Any:
        """The dataset's own plan (shuffled for train only)."""
        if not callable(getattr(dataset, "batch_sampler", None)):  # a user's wrapper
            raise TypeError(
                f"{type(self).__name__}: the {split} split is a {type(dataset).__name__}, "
                "which has no batch_sampler(); return the ShardedDataset (or a subclass of it "
                "overriding __getitem__) from build_datasets."
            )
        train = split == "train"
        if train and self.max_tokens is not None:
            return self._budget(dataset, shard_window=self.window, mix_shards=self.mix_shards)
        return dataset.batch_sampler(
            batch_size,
            seed=self.seed,
            shuffle=self._shuffles(split),
            window=self.window,
            mix_shards=self.mix_shards,
            drop_last=self.drop_last and train,
        )


def _splits(owner: str, **given: Any) -> dict[str, Shards]:
    """Each split's shard files or URLs."""
    splits = {}
    for split, (name, value) in zip(("train", "val", "test"), given.items(), strict=True):
        if is_hf_dataset(value):
            raise TypeError(
                f"{owner}: {name} is a datasets.Dataset, not shard files; pass it to "
                "SequenceDataModule or MixedDataModule (as loaderkit.HFDataset) instead."
            )
        if value is not None:
            splits[split] = shard_list(owner, name, value)
    return splits
