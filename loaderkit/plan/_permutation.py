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

import numpy as np

from loaderkit._checks import check_int
from loaderkit.seeding import GOLDEN, M64, mix64, mix64_array

# Luby-Rackoff: 4 rounds of independent random round functions give a strong
# pseudorandom permutation; 6 leave a margin for the tiny halves of small n.
ROUNDS = 6
_KEY_LIMIT = 2**64
_MAX_N = 2**63  # entries are returned as int64, the dtype of torch indices


class KeyedPermutation:
    """A bijection of ``[0, n)`` chosen by a 64-bit ``key``, evaluated at any positions.

    Args:
        n: Size of the domain (>= 1, < 2**63).
        key: The key (an int in ``[0, 2**64)``); distinct keys give unrelated orders.
    """

    __slots__ = ("_half", "_keys", "_mask", "_shift", "n")

    def __init__(self, n: int, key: int) -> None:
        self.n = check_int("n", n, 1, owner="KeyedPermutation", limit=_MAX_N)
        key = check_int("key", key, 0, owner="KeyedPermutation", limit=_KEY_LIMIT)
        bits = max(2, (n - 1).bit_length())
        self._half = (bits + 1) // 2  # balanced: both halves this wide, domain 4**half
        self._mask = np.uint64((1 << self._half) - 1)
        # The round function keeps the top bits of mix64's output: its best-mixed ones.
        self._shift = np.uint64(64 - self._half)
        # Round keys: splitmix64's outputs from state `key` (as seeding.sample_seed does).
        self._keys = [np.uint64(mix64((key + (r + 1) * GOLDEN) & M64)) for r in range(ROUNDS)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        """One pass of the Feistel network over ``[0, 4**half)`` (uint64 in, uint64 out)."""
        return _feistel(x, np.uint64(self._half), self._mask, self._shift, self._keys)

    def at(self, positions: np.ndarray) -> np.ndarray:
        """Entries of the permutation at ``positions`` (in ``[0, n)``, not checked), as int64."""
        given = np.asarray(positions)
        if self.n == 1:
            return np.zeros(given.shape, dtype=np.int64)
        y = self._encrypt(given.astype(np.uint64).reshape(-1))
        n = np.uint64(self.n)
        out = np.flatnonzero(y >= n)
        while out.size:  # cycle walking, only over the entries still outside [0, n)
            again = self._encrypt(y[out])
            y[out] = again
            out = out[again >= n]
        return y.view(np.int64).reshape(given.shape)  # every entry < n <= 2**63


def _feistel(
    x: np.ndarray,
    half: np.uint64 | np.ndarray,
    mask: np.uint64 | np.ndarray,
    shift: np.uint64 | np.ndarray,
    keys: list[np.uint64] | list[np.ndarray],
) -> np.ndarray:
    """One pass of the Feistel network over ``[0, 4**half)``; parameters are scalars or, one
    permutation per entry, arrays shaped like ``x``."""
    left = x >> half
    right = x & mask
    for k in keys:
        f = mix64_array(right ^ k)
        f >>= shift
        left ^= f
        left, right = right, left
    left <<= half
    left |= right
    return left


_POWERS = np.uint64(1) << np.arange(64, dtype=np.uint64)


def permute_many(sizes: np.ndarray, keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``KeyedPermutation(sizes[i], keys[i]).at(positions[i])`` for every ``i``, vectorized.

    Args:
        sizes: Domain size per entry (ints >= 1).
        keys: Key per entry (uint64, or ints in ``[0, 2**64)``).
        positions: Position per entry, in ``[0, sizes[i])`` (not range-checked).

    Returns:
        int64 array of the entries, shaped like ``positions``.

    Example:
        >>> sizes, keys = np.array([10, 10, 3]), np.array([7, 7, 1], dtype=np.uint64)
        >>> got = permute_many(sizes, keys, np.array([4, 5, 2]))
        >>> got.tolist() == [*KeyedPermutation(10, 7).at(np.array([4, 5])).tolist(),
        ...                  *KeyedPermutation(3, 1).at(np.array([2])).tolist()]
        True
    """
    shape = np.shape(positions)
    x = np.asarray(positions).astype(np.uint64).reshape(-1)
    n = np.asarray(sizes).astype(np.uint64).reshape(-1)
    key = np.asarray(keys).astype(np.uint64).reshape(-1)
    # bit_length(n - 1): how many powers of two are <= n - 1.
    bits = np.maximum(np.searchsorted(_POWERS, n - np.uint64(1), side="right"), 2)
    half = ((bits + 1) // 2).astype(np.uint64)
    mask = (np.uint64(1) << half) - np.uint64(1)
    shift = np.uint64(64) - half
    rounds = [mix64_array(key + np.uint64((r + 1) * GOLDEN & M64)) for r in range(ROUNDS)]
    y = _feistel(x, half, mask, shift, rounds)
    out = np.flatnonzero(y >= n)
    while out.size:  # cycle walking, as KeyedPermutation.at
        again = _feistel(y[out], half[out], mask[out], shift[out], [k[out] for k in rounds])
        y[out] = again
        out = out[again >= n[out]]
    return y.view(np.int64).reshape(shape)


@functools.cache
def permutation_digest() -> int:
    """A checksum of a small :class:`KeyedPermutation`, stored in every shuffled plan's state
    so another order from the same key is refused on resume."""
    perm = KeyedPermutation(257, key=20240917).at(np.arange(257, dtype=np.uint64))
    return zlib.crc32(perm.tobytes())
