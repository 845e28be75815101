"""Writing a file so readers see the old one or the new one, never half of it (private)."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "temp_path"]


def temp_path(target: Path) -> Path:
    """A unique, hidden temporary path next to ``target`` (unique per thread and machine)."""
    tag = f"{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(6)}"
    return target.with_name(f".{target.name}.{tag}.tmp")


def atomic_write(
    target: Path, write: Callable[[IO[bytes]], object], *, exclusive: bool = False
) -> bool:
    """Write ``target`` through a unique temporary file, then rename it into place.

    Args:
        target: The file to write.
        write: Writes the content to the open (binary) temporary file.
        exclusive: Only create ``target`` if it does not exist yet (a hard link); when
            another writer got there first, its file stays.

    Returns:
        Whether this call's content is now at ``target``.

    Raises:
        OSError: the temporary file could not be written or moved (it is removed).
    """
    tmp = temp_path(target)
    try:
        with open(tmp, "wb") as f:
            write(f)
        if exclusive:
            try:
                os.link(tmp, target)
            except FileExistsError:
                return False
            except OSError:  # no hard links here (some network and FUSE filesystems)
                if target.exists():
                    return False
                os.replace(tmp, target)
            return True
        os.replace(tmp, target)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
