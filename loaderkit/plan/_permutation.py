"""A keyed bijection of ``[0, n)`` evaluated at any positions, without materializing it.

Every shuffled order loaderkit keeps: :class:`KeyedPermutation` for one key,
:func:`permute_many` for a size and key per entry. A balanced Feistel network over the
smallest power of four holding ``n`` (splitmix64 round functions), cycle-walking into
``[0, n)``. Changing it needs a new state version; :func:`permutation_digest` pins it.

Example:
    >>> perm = KeyedPermutation(10, key=7)
    >>> sorted(perm.at(np.arange(10)).tolist()) == list(range(10))
    True
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import numpy as np

from loaderkit._checks import check_int
from loaderkit.seeding import GOLDEN, M64, mix64_array

# Luby-Rackoff: 4 rounds give a strong pseudorandom permutation; 6 leave a margin for small n.
ROUNDS = 6
_KEY_LIMIT = 2**64
_MAX_N = 2**63  # entries are returned as int64, the dtype of torch indices
# Round tables: cache-resident groups, a few MiB in all, never pickled; small ones built at
# once, larger ones once as many entries were evaluated as they hold.
_TABLE_WIDTH, _TABLE_LIMIT, _TABLE_EAGER = 1 << 14, 1 << 17, 1 << 11


class KeyedPermutation:
    """A bijection of ``[0, n)`` (``1 <= n < 2**63``) chosen by a key in ``[0, 2**64)``."""

    __slots__ = ("_group", "n")

    def __init__(self, n: int, key: int) -> None:
        self.n = check_int("n", n, 1, owner="KeyedPermutation", limit=_MAX_N)
        key = check_int("key", key, 0, owner="KeyedPermutation", limit=_KEY_LIMIT)
        self._group = GroupedPermutation(np.array([n]), np.array([key], dtype=np.uint64))

    def at(self, positions: np.ndarray) -> np.ndarray:
        """Entries of the permutation at ``positions`` (in ``[0, n)``, not checked), as int64."""
        return self._group.at(None, positions)


class GroupedPermutation:
    """``KeyedPermutation(sizes[g], keys[g])`` for every group ``g``, at ``(group, position)``."""

    __slots__ = ("_half", "_rounds", "_seen", "_sizes", "_tables", "_width")

    def __init__(self, sizes: np.ndarray, keys: np.ndarray) -> None:
        self._sizes = np.asarray(sizes).astype(np.uint64).reshape(-1)
        key = np.asarray(keys).astype(np.uint64).reshape(-1)
        # bit_length(n - 1): how many powers of two are <= n - 1; balanced halves.
        bits = np.maximum(np.searchsorted(_POWERS, self._sizes - np.uint64(1), side="right"), 2)
        self._half = ((bits + 1) // 2).astype(np.uint64)  # domain 4**half
        # Round keys: splitmix64's outputs from state `key` (as seeding.sample_seed does).
        self._rounds = list(mix64_array(key[None, :] + _ROUND_OFFSETS[:, None]))
        self._width = 1 << int(self._half.max())
        self._tables: list[np.ndarray] | None = None
        self._seen = 0  # entries evaluated so far

    def __getstate__(self) -> dict[str, Any]:
        # Rebuilt where used: a plan sent to workers or saved does not carry them.
        return {k: getattr(self, k) for k in self.__slots__} | {"_tables": None, "_seen": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)

    def _round_tables(self) -> list[np.ndarray] | None:
        """Each round's function over every value of a half, per group (None: not yet, or
        too large): for small halves a lookup replaces the splitmix64 finaliser (same values).
        """
        size = self._width * self._sizes.size
        if (
            self._tables is None
            and self._width <= _TABLE_WIDTH
            and (size <= _TABLE_EAGER or self._seen >= size)
            and size <= _TABLE_LIMIT
        ):
            values = np.arange(self._width, dtype=np.uint64)
            shift = (np.uint64(64) - self._half)[:, None]
            self._tables = [
                (mix64_array(values ^ k[:, None]) >> shift).view(np.int64).reshape(-1)
                for k in self._rounds
            ]
        return self._tables

    def _encrypt(self, x: np.ndarray, group: np.ndarray | None) -> np.ndarray:
        """One pass of each entry's Feistel network over ``[0, 4**half)`` (uint64 in and out)."""
        one = group is None  # one group: scalar parameters
        half = self._half[0] if one else self._half[group]
        mask = (np.uint64(1) << half) - np.uint64(1)
        tables = self._round_tables()
        left, right = x >> half, x & mask
        if tables is None:
            shift = np.uint64(64) - half
            for k in self._rounds:
                f = mix64_array(right ^ (k[0] if one else k[group]))
                f >>= shift
                left ^= f
                left, right = right, left
            left <<= half
            left |= right
            return left
        # Halves fit in 32 bits here: int64 throughout, the dtype of table indices.
        base = None if group is None else group * self._width
        left, right = left.view(np.int64), right.view(np.int64)
        for table in tables:
            left ^= table[right if base is None else base + right]
            left, right = right, left
        left <<= np.asarray(half).astype(np.int64)
        left |= right
        return left.view(np.uint64)

    def at(self, group: np.ndarray | None, positions: np.ndarray) -> np.ndarray:
        """Entry ``positions[i]`` (in ``[0, sizes[group[i]])``, not checked) of each group's
        permutation, as int64 shaped like ``positions``; ``group=None``: all in group 0."""
        given = np.asarray(positions)
        x = given.astype(np.uint64).reshape(-1)
        self._seen += x.size
        if group is not None:
            group = np.asarray(group, dtype=np.int64).reshape(-1)  # group * width in int64
        n = self._sizes[0] if group is None else self._sizes[group]
        if group is None and n == 1:
            return np.zeros(given.shape, dtype=np.int64)
        y = self._encrypt(x, group)
        out = np.flatnonzero(y >= n)
        while out.size:  # cycle walking, only over the entries still outside [0, n)
            sub = None if group is None else group[out]
            again = self._encrypt(y[out], sub)
            y[out] = again
            out = out[again >= (n if group is None else n[out])]
        return y.view(np.int64).reshape(given.shape)  # every entry < n <= 2**63


_POWERS = np.uint64(1) << np.arange(64, dtype=np.uint64)
_ROUND_OFFSETS = np.array([(r + 1) * GOLDEN & M64 for r in range(ROUNDS)], dtype=np.uint64)


def permute_many(sizes: np.ndarray, keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``KeyedPermutation(sizes[i], keys[i]).at(positions[i])`` for every ``i`` (unchecked), as
    int64 shaped like ``positions``.

    Example:
        >>> sizes, keys = np.array([10, 10, 3]), np.array([7, 7, 1], dtype=np.uint64)
        >>> got = permute_many(sizes, keys, np.array([4, 5, 2]))
        >>> got.tolist() == [*KeyedPermutation(10, 7).at(np.array([4, 5])).tolist(),
        ...                  *KeyedPermutation(3, 1).at(np.array([2])).tolist()]
        True
    """
    groups = GroupedPermutation(sizes, keys)
    return groups.at(np.arange(np.size(positions)), positions)


@functools.cache
def permutation_digest() -> int:
    """A checksum of a small :class:`KeyedPermutation`, in shuffled plans' states (pins it)."""
    perm = KeyedPermutation(257, key=20240917).at(np.arange(257, dtype=np.uint64))
    return zlib.crc32(perm.tobytes())
