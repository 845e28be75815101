"""Seeding as a pure function: derived seeds, worker init, per-sample randomness.

Every seed loaderkit uses is :func:`derive_seed` of the user's seed and a few
keys, so it is the same in every process, run, platform and start method, and
independent of Python's hash randomisation. Two key layouts are used, each
starting with a string tag so the two families never collide:

- DataLoader workers: ``derive_seed(seed, "worker", rank, worker_id)``
  (:func:`worker_seed`, used by :func:`worker_init_fn`).
- Samples: ``derive_seed(seed, "sample", epoch, index)`` (:func:`sample_seed`,
  used by :func:`sample_generator`, :func:`sample_numpy_rng` and
  :func:`seeded_sample`).

Randomness inside a sample should be keyed by the sample, not by the worker
that happens to load it: then a run gives bit-identical batches with 0 or 8
workers and after a resume. Worker seeds only make the worker-level streams
reproducible (and distinct across ranks and workers).

Example:
    >>> derive_seed(42, "sample", 0, 7) == sample_seed(42, 0, 7)
    True
    >>> with seeded_sample(42, epoch=0, index=7):
    ...     a = torch.rand(2)
    >>> with seeded_sample(42, epoch=0, index=7):
    ...     b = torch.rand(2)
    >>> torch.equal(a, b)
    True
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from loaderkit._checks import check_int
from loaderkit._tags import SeedTag

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

_SEED_LIMIT = 2**128  # SeedSequence's own entropy size; see _seed_sequence for why it is a bound
_TORCH_SEED_LIMIT = 2**64
_SMALL_KEY = 2**31
_BIG_INT_HEADER = 0x8000_0000
_STR_HEADER = 0xC000_0000


@functools.lru_cache(maxsize=256)
def _str_words(key: str) -> tuple[int, ...]:
    # blake2b, never hash(): hash() of a str changes with PYTHONHASHSEED.
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, person=b"loaderkit").digest()
    value = int.from_bytes(digest, "little")
    return (_STR_HEADER | 2, value & 0xFFFF_FFFF, value >> 32)


def _key_words(func: str, position: int, key: object) -> tuple[int, ...]:
    """Encode one key as uint32 words, prefix-free so distinct key tuples never collide.

    A small int is one word with the top bit clear; anything else is a header
    word (top bit set, bit 30 tells str from int, low bits count the payload
    words) followed by the payload.
    """
    if isinstance(key, str):
        return _str_words(key)
    if not isinstance(key, int) or isinstance(key, bool):
        raise TypeError(
            f"{func}: keys[{position}] must be a non-negative int or a str, got {key!r} "
            f"({type(key).__name__}); convert it first, e.g. int(x) or str(x)."
        )
    if key < 0:
        raise ValueError(
            f"{func}: keys[{position}] must be a non-negative int or a str, got {key}; "
            "pass a non-negative value (e.g. an index or an epoch number)."
        )
    if key < _SMALL_KEY:
        return (key,)
    n_words = (key.bit_length() + 31) // 32
    return (_BIG_INT_HEADER | n_words, *((key >> (32 * i)) & 0xFFFF_FFFF for i in range(n_words)))


def _seed_sequence(func: str, seed: object, keys: tuple[object, ...]) -> np.random.SeedSequence:
    # SeedSequence pads entropy shorter than 4 words when a spawn_key follows, so
    # bounding the seed to 128 bits keeps (seed, keys) -> words injective.
    seed = check_int(
        "seed",
        seed,
        owner=func,
        fix="pass a non-negative Python int such as seed=0",
        limit=_SEED_LIMIT,
    )
    words: list[int] = []
    for position, key in enumerate(keys):
        words.extend(_key_words(func, position, key))
    return np.random.SeedSequence(seed, spawn_key=tuple(words))


def _seed_from(sequence: np.random.SeedSequence) -> int:
    return int(sequence.generate_state(1, np.uint64)[0]) >> 1


def derive_seed(seed: int, *keys: int | str) -> int:
    """Derive a child seed from ``seed`` and a tuple of keys.

    Stable across processes, runs, platforms and ``PYTHONHASHSEED``: built on
    :class:`numpy.random.SeedSequence`, with strings mapped through blake2b.
    Every key (and its position) changes the result.

    Args:
        seed: The user's seed, an int in ``[0, 2**128)``.
        *keys: Non-negative ints or strings, e.g. ``"sample", epoch, index``.

    Returns:
        An int in ``[0, 2**63)``: valid for :func:`torch.manual_seed`, for
        :class:`torch.Generator`, for :mod:`random`, and (``% 2**32``) for
        ``numpy.random.seed``.

    Raises:
        TypeError: ``seed`` is not an int (bools are rejected) or a key is
            neither an int nor a str.
        ValueError: ``seed`` or an int key is negative, or ``seed >= 2**128``.

    Example:
        >>> derive_seed(0, "worker", 0, 1) != derive_seed(0, "worker", 1, 0)
        True
    """
    return _seed_from(_seed_sequence("derive_seed", seed, keys))


def worker_seed(seed: int, rank: int, worker_id: int) -> int:
    """The seed of DataLoader worker ``worker_id`` on ``rank``.

    Equal to ``derive_seed(seed, "worker", rank, worker_id)``.
    """
    check_int(
        "rank", rank, owner="worker_seed", fix="pass a non-negative Python int such as rank=0"
    )
    check_int(
        "worker_id",
        worker_id,
        owner="worker_seed",
        fix="pass a non-negative Python int such as worker_id=0",
    )
    return _seed_from(_seed_sequence("worker_seed", seed, (SeedTag.WORKER, rank, worker_id)))


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of sample ``index`` in ``epoch``: ``derive_seed(seed, "sample", epoch, index)``.

    Independent of the worker, rank or process that loads the sample.
    """
    check_int(
        "epoch", epoch, owner="sample_seed", fix="pass a non-negative Python int such as epoch=0"
    )
    check_int(
        "index", index, owner="sample_seed", fix="pass a non-negative Python int such as index=0"
    )
    return _seed_from(_seed_sequence("sample_seed", seed, (SeedTag.SAMPLE, epoch, index)))


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A fresh CPU :class:`torch.Generator` seeded with :func:`sample_seed`.

    Pass it explicitly to ``torch.rand(..., generator=g)`` or to transforms
    that accept one; it touches no global state.
    """
    generator = torch.Generator()
    generator.manual_seed(sample_seed(seed, epoch, index))
    return generator


def sample_numpy_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """A fresh :class:`numpy.random.Generator` for sample ``index`` in ``epoch``.

    Seeded from the same SeedSequence as :func:`sample_seed` (its full 128-bit
    pool, not the 63-bit int), so it is stable across processes and runs.
    """
    check_int(
        "epoch",
        epoch,
        owner="sample_numpy_rng",
        fix="pass a non-negative Python int such as epoch=0",
    )
    check_int(
        "index",
        index,
        owner="sample_numpy_rng",
        fix="pass a non-negative Python int such as index=0",
    )
    sequence = _seed_sequence("sample_numpy_rng", seed, (SeedTag.SAMPLE, epoch, index))
    return np.random.Generator(np.random.PCG64(sequence))


def seed_global_rngs(seed: int) -> None:
    """Seed :mod:`random`, numpy's global ``RandomState`` and torch's generators.

    ``torch.manual_seed`` seeds the CPU generator and those of every
    accelerator. numpy's legacy seeding takes 32 bits, so it gets
    ``seed % 2**32``.

    Args:
        seed: An int in ``[0, 2**64)`` (the range torch accepts).
    """
    check_int(
        "seed",
        seed,
        owner="seed_global_rngs",
        fix="pass a non-negative Python int such as seed=0",
        limit=_TORCH_SEED_LIMIT,
    )
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _init_worker(
    worker_id: int,
    *,
    seed: int,
    rank: int,
    user_fn: Callable[[int], Any] | None,
    per_iterator: bool = True,
) -> None:
    # Module-level (not a closure) so the partial built by worker_init_fn
    # pickles by reference under the spawn and forkserver start methods.
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
    """Build a DataLoader ``worker_init_fn`` seeding each worker from ``seed``, its rank and id.

    In worker ``worker_id`` it seeds :mod:`random`, numpy's global state and
    torch from ``derive_seed(seed, "worker", rank, worker_id, base)``, where
    ``base`` is the base seed torch draws for each new iterator (each epoch)
    from the DataLoader's ``generator`` (else torch's global generator). So
    every epoch's workers draw new streams, distinct across ranks and workers,
    and a run is reproducible when that generator is seeded (e.g.
    ``torch.manual_seed`` or ``DataLoader(generator=...)``). Then it calls
    ``user_fn(worker_id)`` if given. The result is a :func:`functools.partial`
    of a module-level function, so it pickles under every start method
    (``user_fn`` must pickle too when workers are spawned).

    Worker streams still depend on which worker loads a sample, so they
    change with ``num_workers``; key randomness by the sample instead
    (:func:`seeded_sample`, :func:`sample_generator`; ``ResumableDataLoader``
    does this for you).

    Args:
        seed: The run's seed, an int in ``[0, 2**128)``.
        rank: The data-parallel rank. ``None`` reads it from
            ``torch.distributed`` *now*, in the calling process (workers
            cannot see the process group); call this after the process
            group is initialised, or pass it explicitly.
        user_fn: The user's own ``worker_init_fn``, called after seeding.

    Example:
        >>> loader = torch.utils.data.DataLoader(
        ...     range(8), num_workers=2, worker_init_fn=worker_init_fn(42, rank=0)
        ... )
    """
    check_int(
        "seed",
        seed,
        owner="worker_init_fn",
        fix="pass a non-negative Python int such as seed=0",
        limit=_SEED_LIMIT,
    )
    if rank is None:
        from loaderkit.env import detect

        rank = detect().rank
    check_int(
        "rank", rank, owner="worker_init_fn", fix="pass a non-negative Python int such as rank=0"
    )
    if user_fn is not None and not callable(user_fn):
        raise TypeError(
            f"worker_init_fn: user_fn must be callable as user_fn(worker_id), got {user_fn!r} "
            f"({type(user_fn).__name__}); pass a function or None."
        )
    return functools.partial(_init_worker, seed=seed, rank=rank, user_fn=user_fn)


def epoch_worker_init_fn(
    seed: int, rank: int, user_fn: Callable[[int], Any] | None
) -> functools.partial[None]:
    """loaderkit's own engines' ``worker_init_fn``: ``seed`` already keys the epoch.

    Their DataLoader's base seed comes from a generator rebuilt with the
    loader, so it differs between an uninterrupted and a resumed run; mixing
    it in would make worker streams differ after a resume.
    """
    return functools.partial(
        _init_worker, seed=seed, rank=rank, user_fn=user_fn, per_iterator=False
    )


# numpy's global RandomState: get_state()/set_state() copy the 624-word
# Mersenne Twister key through a Python-level loop (~60 us each). The fast
# path copies the raw C state (uint32 key[624]; int pos) through numpy's
# public ctypes interface, checked once against get_state() before use. The
# legacy Gaussian cache is not reachable that way, so it is probed: draw one
# standard normal; if the MT words did not move, the draw was the cached value.
_MT_KEY_BYTES = 624 * 4
_MT_STATE_BYTES = _MT_KEY_BYTES + ctypes.sizeof(ctypes.c_int)
_fast_numpy_ok: bool | None = None


def _global_mt() -> Any:
    """The global RandomState's bit generator if it is an MT19937, else None."""
    bitgen = getattr(np.random.mtrand._rand, "_bit_generator", None)
    return bitgen if type(bitgen) is np.random.MT19937 else None


def _fast_numpy_usable(bitgen: Any) -> bool:
    global _fast_numpy_ok
    if _fast_numpy_ok is None:
        raw = ctypes.string_at(bitgen.ctypes.state_address, _MT_STATE_BYTES)
        _, key, pos, _, _ = np.random.get_state(legacy=True)
        _fast_numpy_ok = raw[:_MT_KEY_BYTES] == np.asarray(
            key, dtype=np.uint32
        ).tobytes() and pos == int.from_bytes(raw[_MT_KEY_BYTES:], sys.byteorder, signed=True)
    return _fast_numpy_ok


def _save_numpy() -> tuple[Any, ...]:
    bitgen = _global_mt()
    if bitgen is None or not _fast_numpy_usable(bitgen):
        return (None, np.random.get_state(legacy=False))
    address = bitgen.ctypes.state_address
    raw = ctypes.string_at(address, _MT_STATE_BYTES)
    probe = np.random.standard_normal()
    cached = ctypes.string_at(address, _MT_STATE_BYTES) == raw
    return (bitgen, raw, probe if cached else None)


def _restore_numpy(saved: tuple[Any, ...]) -> None:
    bitgen = saved[0]
    if bitgen is None:
        np.random.set_state(saved[1])
        return
    _, raw, gauss = saved
    if gauss is None:
        np.random.seed(0)  # clears the Gaussian cache; the MT words are overwritten next
        ctypes.memmove(bitgen.ctypes.state_address, raw, _MT_STATE_BYTES)
    else:  # rare: the caller left half of a Gaussian pair cached
        key = np.frombuffer(raw, dtype=np.uint32, count=624)
        pos = int.from_bytes(raw[_MT_KEY_BYTES:], sys.byteorder, signed=True)
        np.random.set_state(("MT19937", key, pos, 1, gauss))


@contextmanager
def seeded_sample(seed: int, epoch: int, index: int) -> Iterator[int]:
    """Seed the global RNGs for loading one sample, then restore them.

    Inside the block, torch's default CPU generator, numpy's global
    ``RandomState`` and :mod:`random` are seeded from :func:`sample_seed`
    ``(seed, epoch, index)``, so transforms that draw from global RNGs (e.g.
    torchvision's) give the same result for the same sample whichever worker
    or process loads it. On exit the previous states are restored, so loading
    in the main process does not perturb the model's RNG (e.g. dropout).

    Accelerator generators (CUDA, ...) are neither seeded nor touched: only
    ``torch.default_generator`` is. Not thread-safe (global state): use it in
    the process that loads the sample, one sample at a time.

    Cost: about 55 us per sample (measured on an idle 2-core x86 VM, torch
    2.14, numpy 2.4): SeedSequence ~19 us, :mod:`random`'s
    getstate/seed/setstate ~24 us, numpy ~8 us (its state is copied raw
    instead of ~120 us through get_state/set_state), torch ~4 us. Negligible
    next to decoding an image; noticeable only for samples that load in a few
    microseconds.

    Args:
        seed: The run's seed.
        epoch: The epoch the sample is loaded in.
        index: The sample's dataset index.

    Yields:
        The sample seed, for seeding anything else (e.g. a library RNG).

    Example:
        >>> with seeded_sample(42, epoch=0, index=3) as s:
        ...     x = torch.rand(1)
        >>> s == sample_seed(42, 0, 3)
        True
    """
    value = sample_seed(seed, epoch, index)
    generator = torch.default_generator
    torch_state = generator.get_state()
    python_state = random.getstate()
    numpy_state = _save_numpy()
    try:
        generator.manual_seed(value)
        random.seed(value)
        np.random.seed(value % 2**32)
        yield value
    finally:
        generator.set_state(torch_state)
        random.setstate(python_state)
        _restore_numpy(numpy_state)
