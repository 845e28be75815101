"""Compressed shards and content hashes (private; docs/design.md, compressed shards)."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from loaderkit._atomic import atomic_write, temp_path
from loaderkit.data.readers import DTYPE_SUFFIX
from loaderkit.errors import ShardChangedError, ShardError, require

ZSTD_SUFFIX = ".zst"
COMPRESSIONS = ("zstd",)
# hashlib's, and xxhash's (faster than disk; in the [zstd] extra).
HASHES = ("sha256", "blake2b", "xxh64", "xxh3_64", "xxh3_128")
_CHUNK = 1 << 20
DEFAULT_LEVEL = 3


def unlink(paths: Iterable[Path]) -> None:
    """Remove each of ``paths`` that exists."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _zstd() -> Any:
    return require("zstandard", "zstd-compressed shards need", "zstd")


def _new_hasher(algo: str) -> Any:
    if algo.startswith("xxh"):
        need = f"hash={algo!r} needs"
        return getattr(require("xxhash", need, "zstd", ", or pass hash='sha256'"), algo)()
    return hashlib.new(algo)


def is_compressed(name: str) -> bool:
    """Whether a shard file of this name is zstd-compressed (``.zst``)."""
    return name.endswith(ZSTD_SUFFIX)


def decoded_name(name: str) -> str:
    """The plain name of a compressed shard (``a.bin.zst`` -> ``a.bin``)."""
    return name[: -len(ZSTD_SUFFIX)] if is_compressed(name) else name


def with_compressed(suffixes: tuple[str, ...]) -> tuple[str, ...]:
    """A reader's suffixes and their compressed forms."""
    return (*suffixes, *(s + ZSTD_SUFFIX for s in suffixes))


def check_compression(compression: Any, level: Any, owner: str) -> tuple[str | None, int]:
    """``compression`` and ``level`` checked: ``(None | "zstd", level)``."""
    if compression is not None and compression not in COMPRESSIONS:
        raise ValueError(
            f"{owner}: compression must be None or one of {list(COMPRESSIONS)}, got "
            f"{compression!r}; pass compression='zstd' or leave it out."
        )
    if compression == "zstd":
        _zstd()  # missing: refused before a folder or a writer is made
    if level is None:
        return compression, DEFAULT_LEVEL
    if compression is None:
        raise ValueError(
            f"{owner}: level={level!r} is the zstd level, but compression is None; pass "
            "compression='zstd' with it, or leave level out."
        )
    if not isinstance(level, int) or isinstance(level, bool) or not -7 <= level <= 22:
        raise ValueError(
            f"{owner}: level must be an int in [-7, 22] (zstd's levels), got {level!r}; "
            "pass e.g. 3."
        )
    return compression, level


def check_hash(algo: Any, owner: str) -> str | None:
    """``hash`` checked: None or one of :data:`HASHES` (its library importable)."""
    if algo is None:
        return None
    if algo not in HASHES:
        raise ValueError(
            f"{owner}: hash must be None or one of {list(HASHES)}, got {algo!r}; pass "
            "hash='sha256' (or 'xxh3_64', faster) or leave it out."
        )
    _new_hasher(algo)
    return str(algo)


def file_digest(path: Path, algo: str) -> str:
    """``<algo>:<hex>`` of the file's bytes, read in chunks."""
    h = _new_hasher(algo)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return f"{algo}:{h.hexdigest()}"


def compress_file(src: Path, dst: Path, level: int) -> None:
    """Compress ``src`` into ``dst`` (streaming; ``dst`` appears complete or not at all)."""
    zstd = _zstd()
    size = src.stat().st_size
    # The frame's checksum fails a corrupted shard's decode even without a content hash.
    cctx = zstd.ZstdCompressor(level=level, write_checksum=True)
    with open(src, "rb") as f:
        atomic_write(
            dst,
            lambda out: cctx.copy_stream(f, out, size=size, read_size=_CHUNK, write_size=_CHUNK),
        )


class DigestMismatch(ShardChangedError):
    """A file's bytes do not hash to the digest in the shard index: it changed since it was
    written (so ``on_error="skip"`` raises it too)."""


def digest_error(path: Any, expected: str, actual: str, fix: str) -> DigestMismatch:
    """The error for a file whose bytes do not hash to the index's digest."""
    return DigestMismatch(
        f"shard {str(path)!r} fails its content hash: the index says {expected}, the file "
        f"hashes to {actual}; {fix}",
        path=path,
    )


def verify(path: Path, expected: str, *, name: Any = None, marker: Path | None = None) -> None:
    """Check ``path`` against ``expected`` (``<algo>:<hex>``) unless its ``marker`` vouches for
    it (written when it matches); :class:`DigestMismatch` names ``name`` (default: the path)."""
    marker = path.with_name(f".{path.name}.lkverified") if marker is None else marker
    st = path.stat()
    stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ino}:{st.st_ctime_ns}:{expected}"
    with contextlib.suppress(OSError):
        if marker.read_text() == stamp:
            return
    actual = file_digest(path, expected.split(":", 1)[0])
    if actual != expected:
        fix = "restore the file, or rewrite the shards with write_shards."
        raise digest_error(path if name is None else name, expected, actual, fix)
    with contextlib.suppress(OSError):
        marker.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(marker, lambda f: f.write(stamp.encode()))


def verify_local(path: Path, expected: str, cache_root: Path) -> None:
    """:func:`verify` a local shard, its marker in ``cache_root`` (its folder may be read-only)."""
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    verify(path, expected, marker=cache_root / "verified" / key)


def _frames_end(f: Any, pos: int, zstd: Any) -> int:
    """Where the zstd frame at ``pos`` ends (-1: the file ends inside it)."""
    f.seek(pos)
    head = f.read(18)  # the longest frame header
    try:
        checksum = zstd.get_frame_parameters(head).has_checksum
        pos += zstd.frame_header_size(head)
    except zstd.ZstdError:
        return -1
    while True:
        f.seek(pos)
        raw = f.read(3)
        if len(raw) < 3:
            return -1
        block = int.from_bytes(raw, "little")
        kind = (block >> 1) & 3  # raw, RLE (one byte repeated), compressed, reserved
        if kind == 3:
            return -1
        pos += 3 + (1 if kind == 1 else block >> 3)
        if block & 1:  # the frame's last block
            return pos + 4 * checksum


def _complete(src: Path) -> bool:
    """Whether ``src`` is whole zstd frames up to its last byte (a cut stream decodes quietly)."""
    zstd = _zstd()
    size, pos, frames = src.stat().st_size, 0, 0
    with open(src, "rb") as f:
        while 0 <= pos < size:
            f.seek(pos)
            magic = f.read(8)
            if magic[:4] == zstd.FRAME_HEADER:
                pos = _frames_end(f, pos, zstd)
                frames += 1
            elif len(magic) == 8 and int.from_bytes(magic[:4], "little") >> 4 == 0x184D2A5:
                pos += 8 + int.from_bytes(magic[4:], "little")  # a skippable frame
            else:
                return False
    return pos == size and frames > 0


def _decompress(src: Path, dst: Path) -> None:
    zstd = _zstd()
    tmp = temp_path(dst)
    try:
        if not _complete(src):
            raise zstd.ZstdError("the file ends inside a frame, or holds none")
        with open(src, "rb") as f, open(tmp, "wb") as out:
            zstd.ZstdDecompressor().copy_stream(f, out, read_size=_CHUNK, write_size=_CHUNK)
        os.replace(tmp, dst)
    except zstd.ZstdError as exc:
        raise ShardError(
            f"shard {str(src)!r} is not a readable zstd stream ({exc}): it is corrupt or "
            "truncated; rewrite it (and delete the shard index).",
            path=src,
        ) from exc
    finally:
        unlink([tmp])


def _decoded_marker(target: Path) -> Path:
    return target.with_name(f".{target.name}.lkdecoded")


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def decoded_intact(target: Path) -> bool:
    """Whether the decoded copy ``target`` has the size and mtime its marker recorded."""
    try:
        return _decoded_marker(target).read_text() == _stamp(target)
    except OSError:
        return False


def decode_into(src: Path, folder: Path, *, check: Callable[[Path], None] | None = None) -> Path:
    """The decoded copy of ``src`` in ``folder``, made once per machine after ``check(src)``."""
    target = folder / decoded_name(src.name)
    if decoded_intact(target):
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f".{target.name}.lkdecode.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if decoded_intact(target):
            return target
        # Left by a killed decode, and the damaged copy (readers holding it keep their bytes).
        unlink([*folder.glob(f".{target.name}.*.tmp"), target])
        if check is not None:
            check(src)
        # Sidecars of the shard (a.bin.zst.lkdtype) or, compressed outside loaderkit, of its
        # plain name (a.bin.lkdtype): without its dtype header, a.bin is read in any dtype.
        near = src.parent.glob(glob.escape(target.name) + "*")
        # Not an offsets sidecar: counted again beside the copy (the source's may be stale,
        # and a copy landing in its shard's mtime tick would pass as stamped).
        sides = [s for s in near if s.name.endswith(DTYPE_SUFFIX)]
        # The shard's own sidecars are copied last, so they win over the plain name's.
        for side in sorted(sides, key=lambda s: s.name.startswith(src.name)):
            stem = src.name if side.name.startswith(src.name) else target.name
            plain = folder / (target.name + side.name[len(stem) :])
            if plain.resolve() != side.resolve():
                tmp = temp_path(plain)
                shutil.copyfile(side, tmp)
                os.replace(tmp, plain)
        _decompress(src, target)
        stamp = _stamp(target)
        atomic_write(_decoded_marker(target), lambda f: f.write(stamp.encode()))
        return target
    finally:
        os.close(fd)


def decoded_local(path: Path) -> Path:
    """The decoded copy of the local compressed shard ``path`` in the default cache."""
    return decode_into(path, local_decode_dir(path, default_cache_root()))


def local_decode_dir(path: Path, root: Path, digest: str | None = None) -> Path:
    """``<root>/decoded/<key>``, keyed by the shard's and its headers' stat and ``digest``."""
    st = path.stat()
    headers = []
    for name in (decoded_name(path.name), path.name):  # the headers decode_into copies
        with contextlib.suppress(FileNotFoundError):
            hs = path.with_name(name + DTYPE_SUFFIX).stat()
            headers.append(f"{name}:{hs.st_size}:{hs.st_mtime_ns}")
    blob = (
        f"{path.resolve()}\n{st.st_size}\n{st.st_mtime_ns}\n{st.st_ino}\n{st.st_ctime_ns}\n"
        f"{digest or ''}\n{';'.join(headers)}"
    ).encode()
    return root / "decoded" / hashlib.sha256(blob).hexdigest()[:24]


def default_cache_root() -> Path:
    """The cache directory: ``$LOADERKIT_CACHE_DIR``, else ``~/.cache/loaderkit/shards``."""
    env = os.environ.get("LOADERKIT_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "loaderkit" / "shards"
