"""Writing a file so readers see the old one or the new one, never half of it (private)."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO


def temp_path(target: Path) -> Path:
    """A unique, hidden temporary path next to ``target``."""
    tag = f"{os.getpid()}-{threading.get_ident()}-{secrets.token_hex(6)}"
    return target.with_name(f".{target.name}.{tag}.tmp")


def atomic_write(
    target: Path, write: Callable[[IO[bytes]], object], *, exclusive: bool = False
) -> bool:
    """Write ``target`` through a temporary file ``write`` fills, then rename it into place;
    whether this call's content is now there. ``exclusive``: keep another writer's file."""
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
