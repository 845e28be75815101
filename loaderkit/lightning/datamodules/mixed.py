"""``MixedDataModule``: several sources mixed by weight, one resumable train loader."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from loaderkit.data.hf import HFDataset
from loaderkit.data.mixing import MixedDataset
from loaderkit.data.parquet import ParquetReader
from loaderkit.data.readers import ShardReader
from loaderkit.lightning.datamodules._args import MAX_OPEN_DEFAULT, make_reader, remote_cache
from loaderkit.lightning.datamodules._util import is_hf_dataset, is_remote_shards, shard_list
from loaderkit.lightning.datamodules.sharded import _ShardSources

__all__ = ["MixedDataModule"]

Sources = Mapping[str, Any] | Sequence[Any]
Weights = Mapping[str, float] | Sequence[float]


class MixedDataModule(_ShardSources):
    """Sources mixed by ``weights`` (or ``repeat``) into one train split, resumable exactly.

    Each epoch draws ``per_epoch[s]`` samples from source ``s``, interleaved at random
    (:class:`~loaderkit.MixedDataset`), each sample once per source-epoch. A source is
    shards (as ``ShardedDataModule`` takes them, one ``reader`` for all), an ``.arrow``
    file, a ``datasets.Dataset`` or any map-style dataset; they share batches, so
    their samples need the same fields and dtypes. Val and test data are read whole,
    in order.

    Args:
        sources: The train sources, a dict by name (the names key ``weights``,
            ``repeat`` and the report) or a list (named by their data where they have
            it, else by position; ``weights`` then a list).
        weights: Each source's share of an epoch (any positive scale).
        repeat: Instead of ``weights``: passes over each source per epoch.
        epoch_size: Samples per epoch with ``weights`` (default: the sources' total).
        val: Val data: one source, or several laid end to end; ``test`` likewise.
        reader: The reader of path sources (as ``ShardedDataModule``'s).
        columns: For Parquet, Arrow and ``datasets`` sources: the columns to read.
        seq_len: Tokens per sample (``reader="tokens"``).
        targets: Add the next token to each sample (``seq_len + 1`` tokens).
        eos: Instead of ``seq_len``: one sample per document ending in this token.
        dtype: Token dtype, e.g. ``"uint16"`` (required for ``.bin`` shards).
        max_open_shards: Shards each process keeps open, per sharded source.
        max_tokens: Token budget per train batch (rows x padded length); ``batch_size``
            is then the eval splits' only.
        length_key: The field or column whose length is a sample's token count.
        bucket_window: With ``max_tokens``: samples per length-sorted window.
        oversize: With ``max_tokens``: a sample over the budget, ``"error"`` or ``"skip"``.
        pad_value: Pad value of variable-length samples (default 0; in-memory sources are
            padded only when it or ``pad_to_multiple_of`` is given, or under ``max_tokens``;
            else stacked).
        pad_to_multiple_of: Round their padded length up to a multiple of this.
        collate: The loaders' ``collate_fn`` instead of the default above (it pads: pass
            ``pad_value`` and ``pad_to_multiple_of`` to it, not here).
        storage_options: For sources at URLs: the fsspec filesystem's options.
        cache_dir: For sources at URLs: the local cache directory.
        **kwargs: The loader policy of :class:`~loaderkit.lightning.datamodules.LoaderDataModule`
            (not ``val_fraction``).

    Example:
        >>> import torch
        >>> from loaderkit import MixedDataModule, TensorDataset
        >>> web, books = TensorDataset(torch.arange(100)), TensorDataset(torch.arange(100, 110))
        >>> dm = MixedDataModule({"web": web, "books": books}, weights={"web": 3, "books": 1},
        ...                      epoch_size=40, batch_size=8, seed=0)
        >>> drawn = torch.cat([b[0] for b in dm.train_dataloader()])
        >>> len(drawn), int((drawn >= 100).sum())  # 10 of 40 from books: every book once
        (40, 10)
        >>> dm.describe()["mix"]["sources"]["web"]["per_epoch"]
        30
    """

    oversize: Literal["error", "skip"]

    def __init__(
        self,
        sources: Sources,
        weights: Weights | None = None,
        *,
        repeat: Weights | None = None,
        epoch_size: int | None = None,
        val: Any = None,
        test: Any = None,
        reader: Literal["tokens", "jsonl", "parquet"] | ShardReader = "tokens",
        columns: list[str] | None = None,
        seq_len: int | None = None,
        targets: bool = False,
        eos: int | None = None,
        dtype: str | None = None,
        max_open_shards: int | None = MAX_OPEN_DEFAULT,
        max_tokens: int | None = None,
        length_key: str = "input_ids",
        bucket_window: int | None = None,
        oversize: Literal["error", "skip"] = "error",
        pad_value: int | float | None = None,
        pad_to_multiple_of: int | None = None,
        collate: Callable[[list[Any]], Any] | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        named = isinstance(reader, str)  # a setting; a reader object is data hparams cannot hold
        # A list of paths is a setting here too (a source is never a sample): hparams keep it.
        splits = (("sources", sources), ("val", val), ("test", test))
        paths = {k for k, v in splits if isinstance(v, list | tuple) and all(map(_is_path, v))}
        data = {k: v for k, v in splits if k not in paths}
        reader_arg = None if named else reader
        self.set_data_args(
            **data, reader=reader_arg, collate=collate, storage_options=storage_options
        )
        super().__init__(**kwargs)
        owner = type(self).__name__
        self._check(
            "val=...",
            length_key=length_key,
            max_open_shards=max_open_shards,
            max_tokens=max_tokens,
            bucket_window=bucket_window,
            oversize=oversize,
            pad_to_multiple_of=pad_to_multiple_of,
            collate=collate,
        )
        self.splits: dict[str, tuple[list[str], list[Any], bool]] = {
            "train": _named(owner, "sources", sources)
        }
        for split, value in (("val", val), ("test", test)):
            if value is not None:
                self.splits[split] = _named(owner, split, value, single_ok=True)
        self.weights, self.repeat, self.epoch_size = weights, repeat, epoch_size
        items = [s for _, found, _ in self.splits.values() for s in found]
        self.columns = columns
        options = {"seq_len": seq_len, "eos": eos, "dtype": dtype, "targets": targets}
        urls = any(_is_path(s) and is_remote_shards(s) for s in items)
        self.remote = remote_cache(owner, "sources at URLs", urls, storage_options, cache_dir)
        self.reader = self._reader(reader, items, options)
        self._only_shards = all(_is_path(s) for s in self.splits["train"][1])
        # In-memory samples' shapes are unknown here: padded where a pad setting asks for it.
        asked = pad_value is not None or pad_to_multiple_of is not None
        objects = asked and any(not (_is_path(s) or _is_table(s)) for s in items)
        varying = any(_is_table(s) for s in items) or max_tokens is not None or objects
        tables = isinstance(self.reader, ParquetReader)
        keyed = True if all(_is_table(s) or (_is_path(s) and tables) for s in items) else None
        self._set_collate(0 if pad_value is None else pad_value, varying, collate, keyed=keyed)

    def _reader(self, reader: Any, items: list[Any], options: dict[str, Any]) -> ShardReader | None:
        """The one reader of the path sources (None without any)."""
        owner = type(self).__name__
        if reader != "parquet" and all(not _is_path(s) or _is_table(s) for s in items):
            extra = [k for k, v in options.items() if v is not None and v is not False]
            if extra:
                raise ValueError(
                    f"{owner}: {', '.join(extra)} apply to shard sources given by path, but no "
                    "source is one; drop them."
                )
            return None
        return make_reader(
            owner, reader, columns=self.columns, length_key=self.length_key, **options
        )

    def _source(self, item: Any) -> Any:
        """The map-style dataset of one source."""
        if _is_table(item):
            return HFDataset(item, self.columns, length_column=self.length_key)
        return self._shard_dataset(item) if _is_path(item) else item

    def build_datasets(self, stage: str) -> Mapping[str, Any]:
        """The train :class:`~loaderkit.MixedDataset`; val/test laid end to end."""
        out: dict[str, Any] = {}
        for split, (names, items, named) in self.splits.items():
            if split in self._datasets:
                continue
            datasets = [self._source(item) for item in items]
            given: Any = dict(zip(names, datasets, strict=True)) if named else datasets
            if split == "train":
                out[split] = MixedDataset(
                    given, weights=self.weights, repeat=self.repeat, epoch_size=self.epoch_size
                )
            elif len(datasets) == 1 and not named:
                out[split] = datasets[0]
            else:  # named, as sources of one size alike are refused unnamed (read once here)
                out[split] = MixedDataset(dict(zip(names, datasets, strict=True)))
        return out

    def batch_sampler(self, split: str, dataset: Any, batch_size: int) -> Any | None:
        """Under ``max_tokens``, the mix's token-budget train plan; else None (the base's)."""
        if split == "train" and self.max_tokens is not None:
            return self._budget(dataset, oversize=self.oversize)
        return None

    def _measure(self, source: Any) -> np.ndarray:
        """Each train sample's tokens, sources in order."""
        measure = super()._measure
        parts = [measure(part) for part in source.sources]
        return np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1) for p in parts])

    def resume_info(self, world_size: int | None = None) -> tuple[bool, str]:
        """As the base; the source-epochs resume with the mix's plan."""
        ok, reason = super().resume_info(world_size)
        if ok:
            reason += (
                "; the position is in the mix's plan (a pure function of seed, epoch and "
                "position), so each source's source-epochs resume with it"
            )
        return ok, reason


def _is_table(item: Any) -> bool:
    """A ``datasets.Dataset`` or the path of one ``.arrow`` file."""
    return is_hf_dataset(item) or (isinstance(item, str) and item.endswith(".arrow"))


def _is_path(item: Any) -> bool:
    """A source given by path or URL (a str/PathLike, or a list or tuple of them: shard files)."""
    if isinstance(item, list | tuple) and item:
        return all(isinstance(p, str | os.PathLike) for p in item)
    return isinstance(item, str | os.PathLike)


def _named(
    owner: str, name: str, value: Any, *, single_ok: bool = False
) -> tuple[list[str], list[Any], bool]:
    """``(names, sources, named)`` of ``value``: a dict by name, a list, or (val/test) one
    source; path sources checked now."""
    if isinstance(value, Mapping):
        names, items, named = [str(k) for k in value], list(value.values()), True
    elif single_ok and not isinstance(value, list | tuple):
        names, items, named = ["0"], [value], False
    elif isinstance(value, list | tuple):
        names, items, named = [str(i) for i in range(len(value))], list(value), False
    else:
        raise TypeError(
            f"{owner}: {name} must be a dict of sources by name or a list of sources, got "
            f"{type(value).__name__}; pass e.g. {{'web': 'shards/web', 'books': 'shards/books'}}."
        )
    if not items:
        raise ValueError(f"{owner}: {name} is empty; pass at least one source.")
    checked = []
    for key, item in zip(names, items, strict=True):
        if is_hf_dataset(item):
            checked.append(item)
        elif _is_path(item):
            where = f"{name}[{key!r}]" if len(items) > 1 or named else name
            shards = shard_list(owner, where, item)
            # One .arrow file is a datasets table (HFDataset), not a shard.
            arrow = isinstance(shards, list) and len(shards) == 1 and shards[0].endswith(".arrow")
            checked.append(shards[0] if arrow else shards)
        elif hasattr(item, "__len__") and hasattr(item, "__getitem__"):
            checked.append(item)
        else:
            raise TypeError(
                f"{owner}: {name} source {key!r} must be shards (a folder, file or URL, or a "
                "list of them), an .arrow file, a datasets.Dataset or a map-style dataset "
                f"(len() and [i]), got {type(item).__name__}."
            )
    return names, checked, named
