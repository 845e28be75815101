"""The DataModules' one argument check: :func:`check_settings`, one rule per setting name.

Example:
    >>> class Module:
    ...     pass
    >>> m = Module()
    >>> check_settings(m, batch_size=8, max_tokens=4096, oversize="skip")
    >>> m.batch_size, m.max_tokens, m.oversize
    (8, 4096, 'skip')
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loaderkit._checks import check_bool, check_choice, check_fraction, check_int
from loaderkit.collate import PadCollate
from loaderkit.data.jsonl import JsonlReader
from loaderkit.data.parquet import ParquetReader
from loaderkit.data.readers import ShardReader, TokenReader
from loaderkit.data.remote import RemoteCache

MAX_OPEN_DEFAULT = 128  # ShardedDataset's default

# name: (minimum, the fix, whether None is allowed)
_INTS: dict[str, tuple[int, str, bool]] = {
    "batch_size": (1, "pass the samples per batch, e.g. batch_size=32", False),
    "eval_batch_size": (1, "or leave it None for batch_size", True),
    "num_workers": (0, "use 0 to load in-process, or 'auto'", False),
    "seed": (0, "pass a non-negative int such as seed=0", False),
    "max_tokens": (1, "pass the token budget per batch, e.g. 8192, or None", True),
    "pad_to_multiple_of": (1, "pass e.g. 8, or None", True),
    "window": (1, "pass samples per window, e.g. 8192", True),
    "bucket_window": (1, "pass samples per length-sorted window, or None", True),
    "mix_shards": (1, "pass the shards a batch draws from, e.g. 8, or 1", False),
    "max_open_shards": (1, "or None to keep all open", True),
    "image_size": (1, "pass e.g. 224", False),
    "steps_per_epoch": (1, "pass e.g. steps_per_epoch=1000, or None", True),
    "samples_per_epoch": (1, "pass e.g. samples_per_epoch=1000, or None", True),
}
_BOOLS = {"persistent_workers", "shuffle", "drop_last", "bucket", "streaming", "targets", "mmap"}
_CHOICES = {"oversize": ("error", "skip"), "on_error": ("raise", "skip")}


def _checked(owner: str, name: str, value: Any) -> Any:
    """``value`` of setting ``name``, checked by its rule."""
    if name in _INTS:
        minimum, fix, optional = _INTS[name]
        if (value is None and optional) or (
            name == "num_workers" and isinstance(value, str) and value == "auto"
        ):
            return value
        return check_int(name, value, minimum, owner=owner, fix=fix, numpy_ok=True)
    if name in _BOOLS:
        return check_bool(name, value, owner=owner)
    if name in _CHOICES:
        return check_choice(name, value, _CHOICES[name], owner=owner)
    if name == "val_fraction":
        return check_fraction(name, value, owner=owner)
    if name == "pin_memory" and not (
        isinstance(value, bool) or (isinstance(value, str) and value == "auto")
    ):
        raise ValueError(
            f"{owner}: pin_memory must be True, False or 'auto', got {value!r}; pass one of these."
        )
    if name == "length_key" and not isinstance(value, str):
        raise TypeError(
            f"{owner}: length_key must be a str, got {value!r}; pass e.g. length_key='input_ids'."
        )
    if name == "collate" and value is not None and not callable(value):
        raise TypeError(f"{owner}: collate must be a callable or None, got {type(value).__name__}.")
    if name == "pad_value":
        PadCollate(value)  # refuses a pad value no dtype can hold
    elif name not in ("pin_memory", "length_key", "collate"):
        raise KeyError(f"{owner}: no rule for setting {name!r}")
    return value


def check_settings(module: Any, **settings: Any) -> None:
    """Check every setting by its rule (and the rules between them); set them on ``module``.

    A setting that would have no effect with the others is refused, never ignored.
    """
    owner = type(module).__name__
    for name, value in settings.items():
        setattr(module, name, _checked(owner, name, value))
    if settings.get("persistent_workers") and settings.get("num_workers") == 0:
        raise ValueError(
            f"{owner}: persistent_workers=True needs num_workers >= 1, got num_workers=0; "
            "set num_workers or persistent_workers=False."
        )
    if settings.get("max_tokens", 0) is None:
        for name, default in (("bucket_window", None), ("oversize", "error")):
            if settings.get(name, default) != default:
                raise ValueError(
                    f"{owner}: {name}={settings[name]!r} applies with max_tokens only; pass "
                    f"max_tokens or drop {name}."
                )
        window = settings.get("window")
        if settings.get("bucket") is False and window is not None:
            raise ValueError(
                f"{owner}: window={window!r} applies with bucket=True or max_tokens only; pass "
                "bucket=True or drop window."
            )


def check_fits(module: Any, lengths: np.ndarray) -> None:
    """Refuse train samples over ``module.max_tokens`` under ``oversize="error"``, in the
    module's own terms (the plan's message names its sampler and options)."""
    step, oversize = module.pad_to_multiple_of or 1, getattr(module, "oversize", None)
    if module.max_tokens is None or oversize == "skip" or not lengths.size:
        return
    fits = module.max_tokens // step * step
    longest = int(lengths.argmax())
    if lengths[longest] > fits:
        skip = "" if oversize is None else ", or pass oversize='skip'"
        limit = f"max_tokens={module.max_tokens}"
        if fits != module.max_tokens:
            limit = f"the {fits} a row holds under {limit} and pad_to_multiple_of={step}"
        raise ValueError(
            f"{type(module).__name__}: train sample {longest} has {int(lengths[longest])} tokens, "
            f"above {limit} ({int((lengths > fits).sum())} sample(s) are); raise max_tokens "
            f"to >= {-(-int(lengths[longest]) // step) * step}{skip}."
        )


def remote_cache(
    owner: str, what: str, urls: bool, storage_options: Any, cache_dir: Any
) -> RemoteCache | None:
    """The cache of data at URLs (``urls``), or None; ``what`` names the data for the error."""
    if (storage_options is not None or cache_dir is not None) and not urls:
        raise ValueError(
            f"{owner}: storage_options and cache_dir are for {what}, but none is given; drop them."
        )
    return RemoteCache(cache_dir=cache_dir, storage_options=storage_options) if urls else None


def collate_of(reader: ShardReader | None, pad: PadCollate, varying: bool) -> PadCollate | None:
    """``pad`` where samples vary in length (documents, JSON lines, Parquet rows, or
    ``varying``), else None: fixed-length token samples stack."""
    documents = isinstance(reader, TokenReader) and reader.eos is not None
    return pad if varying or documents or isinstance(reader, JsonlReader | ParquetReader) else None


def make_reader(
    owner: str,
    reader: Any,
    *,
    columns: list[str] | None,
    length_key: str,
    seq_len: int | None,
    targets: bool,
    eos: int | None,
    dtype: str | None,
) -> ShardReader:
    """The reader named by ``reader`` (or ``reader`` itself, a ShardReader), options checked."""
    check_bool("targets", targets, owner=owner)
    given = {"seq_len": seq_len, "eos": eos, "dtype": dtype, "targets": targets or None}
    extra = [k for k, v in given.items() if v is not None]
    if not isinstance(reader, str):
        if not all(callable(getattr(reader, a, None)) for a in ("spec", "count", "open")):
            raise TypeError(
                f"{owner}: reader must be 'tokens', 'jsonl', 'parquet' or a ShardReader, got "
                f"{type(reader).__name__}."
            )
        if extra:
            raise ValueError(
                f"{owner}: the token options {', '.join(extra)} are reader='tokens' settings, "
                f"but reader is a {type(reader).__name__}; set them on it and drop them here."
            )
        return reader
    check_choice("reader", reader, ("tokens", "jsonl", "parquet"), owner=owner)
    if reader != "tokens" and extra:
        raise ValueError(
            f"{owner}: the token options {', '.join(extra)} need reader='tokens', got "
            f"reader={reader!r}; drop them."
        )
    if reader == "parquet":
        return ParquetReader(columns, length_column=length_key)
    if reader == "jsonl":
        return JsonlReader()
    if (seq_len is None) == (eos is None):
        raise ValueError(
            f"{owner}: reader='tokens' needs exactly one of seq_len and eos, got "
            f"seq_len={seq_len!r}, eos={eos!r}; pass e.g. seq_len=1024."
        )
    if seq_len is not None:
        check_int("seq_len", seq_len, 1, owner=owner, fix="pass e.g. 1024", numpy_ok=True)
    if eos is not None:
        fix = "pass the end-of-document token id"
        check_int("eos", eos, 0, owner=owner, fix=fix, numpy_ok=True)
    if dtype is not None:
        try:
            kind = np.dtype(dtype).kind
        except TypeError as exc:
            raise ValueError(
                f"{owner}: dtype={dtype!r} is not a numpy dtype ({exc}); pass e.g. 'uint16'."
            ) from exc
        if kind not in "iu":
            raise ValueError(
                f"{owner}: dtype must be an integer dtype, got {dtype!r}; pass e.g. 'uint16'."
            )
    return TokenReader(seq_len, targets=targets, eos=eos, dtype=dtype)
