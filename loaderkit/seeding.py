"""Seeding as a pure function: every seed is :func:`derive_seed` of the user's seed and keys.

Workers get :func:`worker_seed`; sample ``index`` of ``epoch`` gets a 64-bit key
(:func:`sample_seed`) that seeds the global generators while it loads
(:func:`seeded_sample`, :class:`SampleSeeder`), the same for any ``num_workers``.

Example:
    >>> with seeded_sample(42, epoch=0, index=7):
    ...     a = torch.rand(2)
    >>> with seeded_sample(42, epoch=0, index=7):
    ...     b = torch.rand(2)
    >>> torch.equal(a, b)
    True
"""

from __future__ import annotations

import functools
import hashlib
import random
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import ConcatDataset, Subset, TensorDataset

from loaderkit._checks import check_int
from loaderkit._tags import SeedTag, StreamTag
from loaderkit.env import detect, topology_known
from loaderkit.errors import LoaderkitError

__all__ = [
    "derive_seed",
    "sample_generator",
    "sample_numpy_rng",
    "sample_seed",
    "seed_global_rngs",
    "seeded_sample",
    "worker_init_fn",
    "worker_seed",
]

M64 = (1 << 64) - 1
M32 = 0xFFFF_FFFF
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2**64 / golden ratio, odd
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
MT_N = 624  # words in a Mersenne Twister state
_SEED_LIMIT = 2**128  # SeedSequence's own entropy size (see _seed_sequence)
_KEY_LIMIT = 2**64  # epochs and indices: the per-sample key mixes them modulo 2**64
_SMALL_KEY = 2**31
_BIG_INT_HEADER = 0x8000_0000
_STR_HEADER = 0xC000_0000


def mix64(z: int) -> int:
    """The splitmix64 finaliser: a bijection of ``[0, 2**64)``."""
    z = ((z ^ (z >> 30)) * _MIX1) & M64
    z = ((z ^ (z >> 27)) * _MIX2) & M64
    return z ^ (z >> 31)


def mix64_array(z: np.ndarray) -> np.ndarray:
    """:func:`mix64` of every element of a ``uint64`` array, in place (returned)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(_MIX1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_MIX2)
    z ^= z >> np.uint64(31)
    return z


def _check(owner: str, name: str, value: object, limit: int | None = _KEY_LIMIT) -> int:
    fix = f"pass a non-negative int such as {name}=0"
    return check_int(name, value, owner=owner, fix=fix, limit=limit, numpy_ok=True)


@functools.lru_cache(maxsize=256)
def _str_words(key: str) -> tuple[int, ...]:
    # blake2b, never hash(): hash() of a str changes with PYTHONHASHSEED.
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, person=b"loaderkit").digest()
    value = int.from_bytes(digest, "little")
    return (_STR_HEADER | 2, value & M32, value >> 32)


def _key_words(func: str, position: int, key: object) -> tuple[int, ...]:
    # Prefix-free: a small int is one word; else a header word (bit 30: str) and the payload.
    if isinstance(key, str):
        return _str_words(key)
    if isinstance(key, np.integer):
        key = int(key)
    if not isinstance(key, int) or isinstance(key, bool):
        raise TypeError(
            f"{func}: keys[{position}] must be a non-negative int or a str, got {key!r} "
            f"({type(key).__name__}); convert it first, e.g. int(x) or str(x)."
        )
    if key < 0:
        raise ValueError(
            f"{func}: keys[{position}] must be a non-negative int or a str, got {key}; pass e.g. 0."
        )
    if key < _SMALL_KEY:
        return (key,)
    n_words = (key.bit_length() + 31) // 32
    return (_BIG_INT_HEADER | n_words, *((key >> (32 * i)) & M32 for i in range(n_words)))


def _seed_sequence(func: str, seed: object, keys: tuple[object, ...]) -> np.random.SeedSequence:
    # SeedSequence pads entropy shorter than 4 words when a spawn_key follows, so
    # bounding the seed to 128 bits keeps (seed, keys) -> words injective.
    seed = _check(func, "seed", seed, _SEED_LIMIT)
    words: list[int] = []
    for position, key in enumerate(keys):
        words.extend(_key_words(func, position, key))
    return np.random.SeedSequence(seed, spawn_key=tuple(words))


def _seed_from(sequence: np.random.SeedSequence) -> int:
    return int(sequence.generate_state(1, np.uint64)[0]) >> 1


def derive_seed(seed: int, *keys: int | str) -> int:
    """A seed in ``[0, 2**63)`` from ``seed`` (an int in ``[0, 2**128)``) and ``keys``
    (non-negative ints or strs), the same across processes, platforms and hash seeds.

    Example:
        >>> derive_seed(0, "worker", 0, 1) != derive_seed(0, "worker", 1, 0)
        True
    """
    return _seed_from(_seed_sequence("derive_seed", seed, keys))


def worker_seed(seed: int, rank: int, worker_id: int) -> int:
    """``derive_seed(seed, "worker", rank, worker_id)``: the seed of a DataLoader worker."""
    rank = _check("worker_seed", "rank", rank, None)
    worker_id = _check("worker_seed", "worker_id", worker_id, None)
    return _seed_from(_seed_sequence("worker_seed", seed, (SeedTag.WORKER, rank, worker_id)))


@functools.lru_cache(maxsize=64)
def _sample_base(seed: int) -> int:
    return derive_seed(seed, SeedTag.SAMPLE)


def _epoch_key(func: str, seed: object, epoch: object) -> int:
    seed = _check(func, "seed", seed, _SEED_LIMIT)
    epoch = _check(func, "epoch", epoch)
    return mix64((_sample_base(seed) + (epoch + 1) * GOLDEN) & M64)


def _sample_key(func: str, seed: int, epoch: int, index: int) -> int:
    e = _epoch_key(func, seed, epoch)
    return mix64((e + (_check(func, "index", index) + 1) * GOLDEN) & M64)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The 64-bit key of sample ``index`` in ``epoch`` that per-sample randomness is seeded from.

    With ``G = 0x9E3779B97F4A7C15``, modulo ``2**64`` (part of the checkpoint format):
    ``e = mix64(derive_seed(seed, "sample") + (epoch + 1) * G)``,
    ``key = mix64(e + (index + 1) * G)``; ``seed`` in ``[0, 2**128)``, ``epoch`` and
    ``index`` in ``[0, 2**64)``. Distinct indices get distinct keys.

    Example:
        >>> sample_seed(0, 0, 0) != sample_seed(0, 0, 1) != sample_seed(0, 1, 0)
        True
    """
    return _sample_key("sample_seed", seed, epoch, index)


def sample_keys(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """:func:`sample_seed` of every index in ``indices``, as ``uint64``."""
    e = _epoch_key("sample_keys", seed, epoch)
    keys = np.asarray(indices).astype(np.uint64)  # a copy: mixed in place below
    keys += np.uint64(1)
    keys *= np.uint64(GOLDEN)
    keys += np.uint64(e)
    return mix64_array(keys)


def sample_stream_keys(keys: np.ndarray, tag: int) -> np.ndarray:
    """``mix64(key ^ tag)``: each sample key's stream for one generator (a ``StreamTag``)."""
    return mix64_array(keys ^ np.uint64(tag))


def _stream_key(func: str, seed: int, epoch: int, index: int, tag: int) -> np.ndarray:
    key = np.array([_sample_key(func, seed, epoch, index)], dtype=np.uint64)
    return sample_stream_keys(key, tag)


def mt_words(keys: np.ndarray) -> np.ndarray:
    """The MT19937 state ``(len(keys), 624)`` of each key: words ``2j``, ``2j + 1`` are the
    halves of ``mix64(key + (j + 1) * GOLDEN)``; word 0 is ``0x80000000`` (MT reads its top bit)."""
    steps = np.arange(1, MT_N // 2 + 1, dtype=np.uint64) * np.uint64(GOLDEN)
    z = mix64_array(np.add.outer(keys.astype(np.uint64), steps))
    words = np.stack([z & np.uint64(M32), z >> np.uint64(32)], axis=-1)
    words = words.reshape(len(keys), MT_N).astype(np.uint32)
    words[:, 0] = 0x8000_0000
    return words


@functools.lru_cache(maxsize=1)
def _torch_template() -> np.ndarray:
    # torch's CPU state after manual_seed(1), layout checked (ATen's CPUGeneratorImplStateLegacy:
    # u64 seed @0, int left @8, int seeded @12, u64 next @16, u64 state[624] @24,
    # normal-sample caches @5016..5056).
    state = torch.Generator().manual_seed(1).get_state().numpy().copy()
    words = [1]
    for i in range(1, 3):  # MT's init_genrand(1)
        words.append((1812433253 * (words[-1] ^ (words[-1] >> 30)) + i) & M32)
    view = state.view(np.uint64) if state.size == 5056 else None
    if (
        view is None
        or not np.little_endian
        or state[8:16].view(np.int32).tolist() != [1, 1]
        or view[[0, 2, 3, 4, 5]].tolist() != [1, 0, *words]
    ):
        raise LoaderkitError(
            f"sample_generator: torch {torch.__version__}'s CPU generator state has a layout "
            "loaderkit does not know; use sample_numpy_rng, or report the torch version."
        )
    state[5040:] = 0  # no cached normal samples
    return state


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A fresh CPU :class:`torch.Generator` for sample ``index`` of ``epoch``, keyed by 64 bits.

    Pass it explicitly (``torch.rand(..., generator=g)``); it touches no global state
    and differs from the global generator inside :func:`seeded_sample`.

    Example:
        >>> a = torch.rand(2, generator=sample_generator(1, 2, 3))
        >>> torch.equal(a, torch.rand(2, generator=sample_generator(1, 2, 3)))
        True
    """
    key = _stream_key("sample_generator", seed, epoch, index, StreamTag.TORCH)
    state = _torch_template().copy()
    view = state.view(np.uint64)
    view[0] = key[0]  # what initial_seed() reports
    view[3 : 3 + MT_N] = mt_words(key)[0]
    return torch.Generator().set_state(torch.from_numpy(state))


def sample_numpy_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """A fresh PCG64 :class:`numpy.random.Generator` for sample ``index`` in ``epoch`` (64-bit key).

    Example:
        >>> x = sample_numpy_rng(1, 2, 3).random()
        >>> x == sample_numpy_rng(1, 2, 3).random()
        True
    """
    key = _stream_key("sample_numpy_rng", seed, epoch, index, StreamTag.NUMPY)
    return np.random.Generator(np.random.PCG64(int(key[0])))


def seed_global_rngs(seed: int) -> None:
    """Seed :mod:`random`, numpy's global ``RandomState`` (``seed % 2**32``) and torch's
    generators (CPU and accelerators) with ``seed``, an int in ``[0, 2**64)``."""
    seed = _check("seed_global_rngs", "seed", seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _init_worker(
    worker_id: int,
    *,
    seed: int,
    rank: int | None,
    user_fn: Callable[[int], Any] | None,
    per_iterator: bool = True,
) -> None:
    # Module-level (not a closure): worker_init_fn's partial pickles under spawn.
    if rank is None:  # a forked worker still sees its parent's group
        rank = detect().rank
    info = torch.utils.data.get_worker_info()
    if per_iterator and info is not None:
        # torch gives worker i the seed base + i, base drawn anew for each iterator.
        base = (info.seed - info.id) % 2**64
        seed_global_rngs(derive_seed(seed, SeedTag.WORKER, rank, worker_id, base))
    else:
        seed_global_rngs(worker_seed(seed, rank, worker_id))
    if user_fn is not None:
        user_fn(worker_id)


def worker_init_fn(
    seed: int, *, rank: int | None = None, user_fn: Callable[[int], Any] | None = None
) -> functools.partial[None]:
    """A picklable DataLoader ``worker_init_fn``: seeds worker ``worker_id``'s global generators
    from ``derive_seed(seed, "worker", rank, worker_id, base)`` (``base``: torch's per-iterator
    base seed), then calls ``user_fn(worker_id)``. ``rank=None`` reads the rank from
    ``torch.distributed`` (where no group exists yet, as each worker starts: a forked worker
    sees its parent's group, a spawned one none, so pass ``rank=`` there).

    Example:
        >>> loader = torch.utils.data.DataLoader(
        ...     range(8), num_workers=2, worker_init_fn=worker_init_fn(42, rank=0)
        ... )
    """
    seed = _check("worker_init_fn", "seed", seed, _SEED_LIMIT)
    if rank is None and topology_known():  # the host's data-parallel rank, else the group's
        rank = detect().rank
    # Else read as each worker starts: built before init_process_group, every rank's forked
    # workers would otherwise be seeded as rank 0's.
    rank = None if rank is None else _check("worker_init_fn", "rank", rank, None)
    if user_fn is not None and not callable(user_fn):
        raise TypeError(
            f"worker_init_fn: user_fn must be callable as user_fn(worker_id), got {user_fn!r} "
            f"({type(user_fn).__name__}); pass a function or None."
        )
    return functools.partial(_init_worker, seed=seed, rank=rank, user_fn=user_fn)


def epoch_worker_init_fn(
    seed: int, rank: int, user_fn: Callable[[int], Any] | None
) -> functools.partial[None]:
    """The engines' ``worker_init_fn``: ``seed`` keys the epoch, torch's base seed is ignored."""
    return functools.partial(
        _init_worker, seed=seed, rank=rank, user_fn=user_fn, per_iterator=False
    )


# The fixed state an unseeded generator is parked in; a sample that draws from it moves it.
_SENTINEL = mix64(0x5E17_1E15_A5EE_D000)


class _Rng(Protocol):
    lazy_ok: bool

    @property
    def seed(self) -> Callable[[int], Any]: ...

    def seeds(self, keys: np.ndarray) -> list[int]: ...
    def save(self) -> Any: ...
    def restore(self, saved: Any) -> None: ...
    def park(self) -> None: ...
    def moved(self) -> bool: ...


class _TorchRng:
    """``torch.default_generator``, seeded with the sample's key."""

    lazy_ok = False  # torch.initial_seed() reads the seed without drawing: seeded for every sample

    def __init__(self) -> None:
        self.generator = torch.default_generator
        self.seed = self.generator.manual_seed  # not torch.manual_seed: it seeds CUDA too
        self._parked = torch.Generator().manual_seed(_SENTINEL).get_state()

    def seeds(self, keys: np.ndarray) -> list[int]:
        return keys.tolist()

    def save(self) -> torch.Tensor:
        return self.generator.get_state()

    def restore(self, saved: torch.Tensor) -> None:
        self.generator.set_state(saved)

    def park(self) -> None:
        self.generator.manual_seed(_SENTINEL)

    def moved(self) -> bool:
        return not torch.equal(self.generator.get_state(), self._parked)


class _NumpyRng:
    """numpy's global ``RandomState``, seeded with 32 bits of its stream key."""

    def __init__(self) -> None:
        self.lazy_ok = True  # known at save(): parked only while an MT19937
        self.seed = np.random.seed
        parked = np.random.RandomState(_SENTINEL & M32).get_state(legacy=False)
        self._parked = parked["state"]["key"]

    def seeds(self, keys: np.ndarray) -> list[int]:
        return (sample_stream_keys(keys, StreamTag.NUMPY) & np.uint64(M32)).tolist()

    def save(self) -> dict[str, Any]:
        state = np.random.get_state(legacy=False)
        self.lazy_ok = state["bit_generator"] == "MT19937"
        if self.lazy_ok:  # set_state copies a list of ints much faster than an array
            state["state"]["key"] = state["state"]["key"].tolist()
        return state

    def restore(self, saved: dict[str, Any]) -> None:
        np.random.set_state(saved)

    def park(self) -> None:
        np.random.seed(_SENTINEL & M32)

    def moved(self) -> bool:
        state = np.random.get_state(legacy=False)
        return bool(
            state["bit_generator"] != "MT19937"
            or state["state"]["pos"] != MT_N
            or state["has_gauss"]
            or not np.array_equal(state["state"]["key"], self._parked)
        )


def numpy_bit_generator() -> type:
    """The class of numpy's global bit generator (``MT19937`` unless the user set another)."""
    get = getattr(np.random.mtrand, "get_bit_generator", None)  # numpy >= 1.25
    return np.random.MT19937 if get is None else type(get())


def take_bit_generator(made: type) -> None:
    """Give this (worker) process numpy's global bit generator ``made`` (a class): the same
    ``np.random.seed(k)`` draws other numbers under another one."""
    if numpy_bit_generator() is not made:
        with suppress(TypeError):  # one that needs arguments: refused after
            np.random.mtrand.set_bit_generator(made())


def check_bit_generator(made: type) -> None:
    """Refuse a worker whose numpy bit generator is not the main process's ``made``."""
    here = numpy_bit_generator()
    if here is not made:
        raise ValueError(
            f"numpy's global bit generator is {here.__name__} in a worker but {made.__name__} in "
            "the main process (set by worker_init_fn, or one a worker cannot make), so a "
            "sample's numpy draws would depend on num_workers; set one that takes no arguments, "
            "in the main process only."
        )


class _PythonRng:
    """Python's :mod:`random`, seeded with its 64-bit stream key."""

    lazy_ok = True

    def __init__(self) -> None:
        self.seed = random.seed
        self._parked = random.Random(_SENTINEL).getstate()

    def seeds(self, keys: np.ndarray) -> list[int]:
        return sample_stream_keys(keys, StreamTag.RANDOM).tolist()

    def save(self) -> tuple[Any, ...]:
        return random.getstate()

    def restore(self, saved: tuple[Any, ...]) -> None:
        random.setstate(saved)

    def park(self) -> None:
        random.setstate(self._parked)

    def moved(self) -> bool:
        return random.getstate() != self._parked


@functools.lru_cache(maxsize=1)
def global_rngs() -> tuple[_Rng, _Rng, _Rng]:
    """torch's, numpy's and Python's global generators, in this order (one per process)."""
    return _TorchRng(), _NumpyRng(), _PythonRng()


@contextmanager
def _put_back() -> Iterator[tuple[_Rng, _Rng, _Rng]]:
    """:func:`global_rngs`, put back on exit in the states they had on entry."""
    rngs = global_rngs()
    saved = [rng.save() for rng in rngs]
    try:
        yield rngs
    finally:
        for rng, state in zip(rngs, saved, strict=True):
            rng.restore(state)


@contextmanager
def rngs_put_back() -> Iterator[None]:
    """The global RNGs as the block found them (CUDA's too where it runs)."""
    with _put_back():
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        try:
            yield
        finally:
            if cuda is not None:
                torch.cuda.set_rng_state_all(cuda)


def seeded_sample(seed: int, epoch: int, index: int) -> AbstractContextManager[int]:
    """Seed torch's, numpy's and Python's global CPU generators for one sample; restore on exit.

    torch gets :func:`sample_seed` (``torch.initial_seed()`` returns it), numpy and
    :mod:`random` their own streams of it. Not thread-safe.

    Yields the sample seed.

    Example:
        >>> with seeded_sample(42, epoch=0, index=3) as s:
        ...     torch.initial_seed() == s == sample_seed(42, 0, 3)
        True
    """
    return _seeded(_sample_key("seeded_sample", seed, epoch, index))


def batch_seed(seed: int, epoch: int, keys: np.ndarray) -> int:
    """The seed of a batch read whole: a digest of its samples' ``keys`` (indices, or the
    keys seeding in their place), so the same for any num_workers and after a resume."""
    digest = hashlib.blake2b(sample_keys(seed, epoch, keys).tobytes(), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def seeded_batch(seed: int, epoch: int, keys: np.ndarray) -> AbstractContextManager[int]:
    """:func:`seeded_sample` for a batch read whole (a user's ``get_batch``): :func:`batch_seed`."""
    return _seeded(batch_seed(seed, epoch, keys))


@contextmanager
def _seeded(value: int) -> Iterator[int]:
    with _put_back() as rngs:
        keys = np.array([value], dtype=np.uint64)
        for rng in rngs:
            rng.seed(rng.seeds(keys)[0])
        yield value


_KEPT = (
    "per-sample seeding: a batch drew from numpy's or Python's global generator when first read "
    "(parked at a fixed state) and not when read again under each sample's seed, so the dataset "
    "may keep that fixed draw (a cached crop). If it keeps what it draws, pass "
    "per_sample_seeding=True; a draw that shapes no sample (retry jitter) is harmless."
)


class SampleSeeder:
    """Loads a batch's samples, each under the global generators seeded for it, and puts the
    caller's states back. torch's is seeded for every sample; with ``lazy=True`` numpy's and
    Python's only once a sample drew from them (the first batch seeds and watches all; later
    ones park the unused, and load again if a sample moved one)."""

    __slots__ = ("in_use", "lazy", "probed", "warned")

    def __init__(self, *, lazy: bool) -> None:
        self.lazy = lazy
        self.in_use = [not lazy] * 3  # global_rngs() order; torch's is seeded regardless
        self.probed = not lazy
        self.warned = False

    def load(
        self,
        seed: int,
        epoch: int,
        indices: list[int],
        getitem: Callable[[int], Any],
        out: list[Any],
        seed_keys: list[int] | None = None,
    ) -> list[Any]:
        """``out`` filled with ``getitem(i)`` per index, seeded by ``(seed, epoch, i)`` or by
        ``seed_keys``; if ``getitem`` raises, ``out`` holds the samples before it."""
        with _put_back() as rngs:
            keys = sample_keys(seed, epoch, np.asarray(indices if seed_keys is None else seed_keys))
            if not self.probed:
                return self._probe(rngs, keys, indices, getitem, out)
            moved: list[int] = []
            while True:
                seeded, parked = [], []
                for slot, rng in enumerate(rngs):
                    if self.in_use[slot] or not rng.lazy_ok:
                        seeded.append((rng.seed, rng.seeds(keys)))
                    else:
                        rng.park()
                        parked.append(slot)
                out.clear()
                if moved:
                    self._read_again(rngs, moved, seeded, indices, getitem, out)
                else:
                    for pos, index in enumerate(indices):
                        for seed_one, seeds in seeded:
                            seed_one(seeds[pos])
                        out.append(getitem(index))
                moved = [slot for slot in parked if rngs[slot].moved()]
                if not moved:
                    return out
                for slot in moved:  # a sample drew from it unseeded: load the batch again
                    self.in_use[slot] = True

    def _read_again(
        self,
        rngs: tuple[_Rng, ...],
        moved: list[int],
        seeded: list[tuple[Callable[[int], Any], list[int]]],
        indices: list[int],
        getitem: Callable[[int], Any],
        out: list[Any],
    ) -> None:
        """The batch read again seeded; warned (once) where the generators it first drew from
        parked are not drawn from now: the dataset may have kept that fixed draw."""
        drew = False
        for pos, index in enumerate(indices):
            for seed_one, seeds in seeded:
                seed_one(seeds[pos])
            marks = [rngs[slot].save() for slot in moved]
            out.append(getitem(index))
            drew = drew or any(rngs[s].save() != m for s, m in zip(moved, marks, strict=True))
        if not drew and not self.warned:
            self.warned = True
            warnings.warn(_KEPT, RuntimeWarning, stacklevel=4)

    def _probe(
        self,
        rngs: tuple[_Rng, ...],
        keys: np.ndarray,
        indices: list[int],
        getitem: Callable[[int], Any],
        out: list[Any],
    ) -> list[Any]:
        """Load with every generator seeded per sample, and mark those a sample drew from:
        no sample is read under a parked state (a dataset may keep what it drew)."""
        seeds = [rng.seeds(keys) for rng in rngs]
        watched = [slot for slot, rng in enumerate(rngs) if rng.lazy_ok and not self.in_use[slot]]
        out.clear()
        for pos, index in enumerate(indices):
            for rng, slot_seeds in zip(rngs, seeds, strict=True):
                rng.seed(slot_seeds[pos])
            marks = [(slot, rngs[slot].save()) for slot in watched]
            out.append(getitem(index))
            for slot, mark in marks:
                self.in_use[slot] = self.in_use[slot] or rngs[slot].save() != mark
        self.probed = True
        return out

    def read_parked(self, read: Callable[[], Any], torch_seed: int) -> tuple[Any, bool | None]:
        """``read()`` with torch's generator seeded with ``torch_seed`` (what
        ``torch.initial_seed()`` reads) and the others parked, and whether it drew from any
        (None when one cannot be parked)."""
        with _put_back() as rngs:  # numpy's save() decides its lazy_ok
            if not all(rng.lazy_ok for rng in rngs[1:]):
                return None, None
            torch_rng = torch.default_generator
            seeded = torch_rng.manual_seed(torch_seed).get_state()
            for rng in rngs[1:]:
                rng.park()
            result = read()
            moved = not torch.equal(torch_rng.get_state(), seeded)
            return result, moved or any(rng.moved() for rng in rngs[1:])


_NO_RANDOMNESS = (list, tuple, range, dict, np.ndarray, torch.Tensor, TensorDataset)


def read_set_on_instance(dataset: Any) -> bool:
    """Whether ``dataset`` has a ``__getitems__`` set on the instance, which torch's fetcher
    calls (``dataset[i]`` reads the class's ``__getitem__``, whatever the instance holds)."""
    return "__getitems__" in getattr(dataset, "__dict__", {})


def torchs_own_reads(cls: type) -> bool:
    """Whether ``cls``'s reads are torch's or builtin (not patched onto a torch class)."""
    if cls.__module__ != Subset.__module__:
        return True
    reads = [getattr(cls, name, None) for name in ("__getitem__", "__getitems__")]
    return all(f is None or getattr(f, "__module__", None) == Subset.__module__ for f in reads)


def draws_nothing(dataset: Any) -> bool:
    """Whether ``dataset[i]`` cannot draw: an exact container, array, tensor or torch
    ``TensorDataset``, or a torch ``Subset``/``ConcatDataset`` of them."""
    if read_set_on_instance(dataset) or not torchs_own_reads(type(dataset)):
        return False
    if type(dataset) is Subset:
        return type(dataset.indices) in _NO_RANDOMNESS and draws_nothing(dataset.dataset)
    if type(dataset) is ConcatDataset:
        return all(draws_nothing(part) for part in dataset.datasets)
    return type(dataset) in _NO_RANDOMNESS
