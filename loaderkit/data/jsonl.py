""":class:`JsonlReader`: ``.jsonl`` shards, one sample per line, read by line offset."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from loaderkit.data.readers import (
    MappedFiles,
    OpenShard,
    _map_raw,
    _missing,
    _offsets_path,
    _read_offsets,
    count_cuts,
    cuts,
)
from loaderkit.errors import ShardChangedError, ShardError

__all__ = ["JsonlReader"]


class JsonlReader:
    """``.jsonl`` shards: one JSON value per line, read by line offset without scanning;
    a blank line (JSON whitespace only) is no sample, nor is a leading UTF-8 BOM.

    Counting a shard writes its line offsets to ``<shard>.lkoffsets``; a line that is not
    valid JSON raises :class:`ShardError` (or is skipped under ``on_error="skip"``).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> reader = JsonlReader()
        >>> _ = reader.write(d / "a.jsonl", [{"text": "hi"}, {"text": "there"}])
        >>> reader.count(d / "a.jsonl")
        2
        >>> reader.open(d / "a.jsonl").read(1)
        {'text': 'there'}
    """

    suffixes: tuple[str, ...] = (".jsonl",)

    def __repr__(self) -> str:
        return "JsonlReader()"

    def spec(self) -> dict[str, Any]:
        return {"kind": "jsonl"}

    @staticmethod
    def _bytes(path: Path) -> np.ndarray:
        if not path.exists():
            raise _missing(path)
        if path.stat().st_size == 0:
            return np.empty(0, dtype=np.uint8)
        return _map_raw(path, np.dtype(np.uint8))

    def count(self, path: Path) -> int:
        """Lines in the shard but blank ones; writes the line offsets sidecar."""
        path = Path(path)
        return count_cuts(path, self._bytes(path), ord("\n"), "", join_blank=True, bom=_BOM)

    def open(self, path: Path) -> OpenShard:
        """Memory-map the shard and its line offsets."""
        path = Path(path)
        data = self._bytes(path)
        recount = partial(cuts, data, ord("\n"), join_blank=True, bom=_BOM)
        offsets = _read_offsets(path, "", len(data), recount)
        guard = MappedFiles((path, data), (_offsets_path(path, ""), offsets))
        return _Lines(path, data, offsets, guard)

    def write(self, path: Path, samples: Iterable[Any]) -> Path:
        """Write one JSON line per sample to ``path``."""
        path = Path(path)
        if isinstance(samples, str | bytes | dict):  # iterating would write keys or letters
            raise TypeError(
                f"JsonlReader.write: samples must be an iterable of samples, got one "
                f"{type(samples).__name__}; pass a list of them, e.g. [sample]."
            )
        with open(path, "w", encoding="utf-8") as f:
            for i, sample in enumerate(samples):
                try:
                    line = json.dumps(sample, separators=(",", ":"))
                except (TypeError, ValueError) as exc:
                    raise TypeError(
                        f"JsonlReader.write: sample {i} for {str(path)!r} is not JSON-able "
                        f"({exc}); convert it to dicts, lists, str, numbers, bools and None "
                        "first (e.g. tensor.tolist())."
                    ) from exc
                if "{" in line and (key := _non_str_key(sample)) is not _NO_KEY:
                    raise TypeError(
                        f"JsonlReader.write: sample {i} for {str(path)!r} has the dict key "
                        f"{key!r} ({type(key).__name__}), which JSON reads back as a str; use "
                        "str keys."
                    )
                f.write(line + "\n")
        return path


_BOM = b"\xef\xbb\xbf"  # json.loads reads it at the start of bytes (SequenceDataModule too)
_NO_KEY = object()
_SCALARS = {int, float, str, bool, type(None)}  # a list of them holds no key: not walked


def _non_str_key(value: Any) -> Any:
    """The first dict key in ``value`` that is not a str (JSON writes it as one), else
    ``_NO_KEY``."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return key
            if (found := _non_str_key(item)) is not _NO_KEY:
                return found
    elif isinstance(value, list | tuple) and not set(map(type, value)) <= _SCALARS:
        for item in value:
            if (found := _non_str_key(item)) is not _NO_KEY:
                return found
    return _NO_KEY


class _Lines:
    def __init__(
        self, path: Path, data: np.ndarray, offsets: np.ndarray, guard: MappedFiles
    ) -> None:
        self.path, self.data, self.offsets, self.guard = path, data, offsets, guard

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def read(self, index: int) -> Any:
        self.guard.check()
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        raw = self.data[lo:hi].tobytes()
        self.guard.check()
        try:
            return json.loads(raw)
        except ValueError as exc:
            text = raw[len(_BOM) :] if lo == 0 and raw.startswith(_BOM) else raw
            line = int(np.count_nonzero(self.data[:lo] == ord("\n"))) + 1  # the sample's first
            if not text.strip(b" \t\r\n"):  # counted by an older loaderkit: one sample a line
                side = str(_offsets_path(self.path, ""))
                raise ShardChangedError(
                    f"shard {str(self.path)!r} line {line} is blank, yet an older loaderkit "
                    f"counted it as a sample; delete the shard index and {side!r}.",
                    path=self.path,
                ) from exc
            # The file's line: blank lines joined a sample (count_cuts), so it is not index + 1.
            line += text[: len(text) - len(text.lstrip(b" \t\r\n"))].count(b"\n")
            shown = text.strip(b" \t\r\n")[:80]  # JSON's whitespace: a form feed is shown
            raise ShardError(
                f"shard {str(self.path)!r} line {line} is not valid JSON ({exc}): "
                f"{shown!r}; fix the line, or pass on_error='skip' to drop such samples.",
                path=self.path,
            ) from exc

    def read_batch(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        return [self.read(int(i)) for i in indices]
