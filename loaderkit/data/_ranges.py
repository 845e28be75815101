"""Range reads of remote shards (private): a plain fixed-length token shard opened as
:class:`RangedTokens` reads each batch's bytes from the cache, as the whole-file map would."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from loaderkit.data.readers import (
    TokenReader,
    as_out,
    check_npy_tokens,
    narrows,
    npy_header,
    out_numpy_dtype,
)

HEAD_BYTES = 128  # first bytes fetched to read a .npy header (numpy writes 128 for 1-D)


@dataclass(frozen=True)
class Layout:
    """A token shard's ``offset`` bytes of header, then ``tokens`` tokens of ``dtype``."""

    offset: int
    dtype: np.dtype
    tokens: int


def npy_header_bytes(head: bytes) -> int | None:
    """The length of a ``.npy`` file's header (magic included) from its first 12 bytes."""
    if len(head) < 12 or head[:6] != b"\x93NUMPY":
        return None
    if head[6] == 1:
        return 10 + int.from_bytes(head[8:10], "little")
    return 12 + int.from_bytes(head[8:12], "little")


def npy_layout(head: bytes, url: str, reader: TokenReader) -> Layout | None:
    """The layout of a ``.npy`` token shard from its first bytes ``head``; None if too short."""
    f = io.BytesIO(head)
    try:
        shape, _, dtype = npy_header(f)
    except (ValueError, EOFError, OSError):
        return None  # short or odd header: the whole-file path reads (and checks) it
    check_npy_tokens(url, shape, dtype, reader.dtype)
    return Layout(f.tell(), np.dtype(dtype), int(shape[0]))


def parquet_footer(tail: bytes, size: int) -> bytes | None:
    """A Parquet file's footer from its last bytes (``size``: the file's); None if ``tail``
    is too short."""
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        raise ValueError("the file does not end in the Parquet magic bytes PAR1")
    need = int.from_bytes(tail[-8:-4], "little") + 8
    if need > size - 4:
        raise ValueError(f"its footer claims {need} bytes of a {size}-byte file")
    return None if need > len(tail) else b"PAR1" + tail[-need:]


class _Spans(Protocol):
    def read_spans(self, index: int, starts: np.ndarray, nbytes: int) -> np.ndarray: ...


class RangedTokens:
    """The fixed-length token samples of one remote shard (an OpenShard), read by byte ranges."""

    def __init__(
        self, source: _Spans, index: int, layout: Layout, reader: TokenReader, url: str
    ) -> None:
        assert reader.seq_len is not None
        self.source, self.index, self.layout = source, index, layout
        self.seq_len, self.span = reader.seq_len, reader.seq_len + reader.targets
        self.count = max(layout.tokens - reader.targets, 0) // reader.seq_len
        self.out = out_numpy_dtype(reader, layout.dtype, url)
        self.narrowing = narrows(layout.dtype, self.out)
        self.item, self.stored = layout.dtype.itemsize, layout.dtype

    def __len__(self) -> int:
        return self.count

    def lengths(self) -> np.ndarray:
        """Each sample's tokens: all the same."""
        return np.full(self.count, self.span, dtype=np.int64)

    def _rows(self, indices: Any) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.count):
            raise IndexError(f"sample indices {idx[:8]} out of range for {self.count} samples")
        starts = self.layout.offset + idx * (self.seq_len * self.item)
        raw = self.source.read_spans(self.index, starts, self.span * self.item)
        return raw.view(self.layout.dtype).reshape(len(idx), self.span)

    def read(self, index: int) -> torch.Tensor:
        return torch.from_numpy(as_out(self._rows([index])[0], self.out, self.narrowing))

    def read_batch(self, indices: np.ndarray) -> np.ndarray:
        rows = self._rows(indices)
        return rows if rows.dtype == self.out else as_out(rows, self.out, self.narrowing)
