"""Seeding as a pure function: derived seeds, worker init, per-sample randomness.

Every seed loaderkit uses is :func:`derive_seed` of the user's seed and a few
keys, so it is the same in every process, run, platform and start method, and
independent of Python's hash randomisation. Two key layouts are used, each
starting with a string tag so the two families never collide:

- DataLoader workers: ``derive_seed(seed, "worker", rank, worker_id)``
  (:func:`worker_seed`, used by :func:`worker_init_fn`).
- Samples: a 64-bit key per ``(seed, epoch, index)`` (:func:`sample_seed`:
  ``derive_seed(seed, "sample")`` once, then splitmix64 integer mixing, so a
  key costs well under a microsecond), from which each global generator gets
  a full 64-bit-keyed state (:func:`seeded_sample`, :func:`sample_generator`,
  :func:`sample_numpy_rng`, and :class:`SampleSeeder` in the loaders).

Randomness inside a sample should be keyed by the sample, not by the worker
that happens to load it: then a run gives bit-identical batches with 0 or 8
workers and after a resume. Worker seeds only make the worker-level streams
reproducible (and distinct across ranks and workers).

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from loaderkit._checks import check_int
from loaderkit._global_rngs import GOLDEN, M64, global_rngs, mix64, mix64_array
from loaderkit._tags import SeedTag, StreamTag

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
_KEY_LIMIT = 2**64  # epochs and indices: the per-sample key mixes them modulo 2**64
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


def _position(func: str, name: str, value: object) -> int:
    return check_int(
        name,
        value,
        0,
        owner=func,
        fix=f"pass a non-negative Python int such as {name}=0",
        limit=_KEY_LIMIT,
    )


@functools.lru_cache(maxsize=64)
def _sample_base(seed: int) -> int:
    # The one SeedSequence per seed (~20 us, cached); the per-sample part is integer mixing.
    return derive_seed(seed, SeedTag.SAMPLE)


def _epoch_key(func: str, seed: object, epoch: object) -> int:
    seed = check_int(
        "seed",
        seed,
        owner=func,
        fix="pass a non-negative Python int such as seed=0",
        limit=_SEED_LIMIT,
    )
    epoch = _position(func, "epoch", epoch)
    return mix64((_sample_base(seed) + (epoch + 1) * GOLDEN) & M64)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The 64-bit key of sample ``index`` in ``epoch``: what per-sample randomness is seeded from.

    Independent of the worker, rank or process that loads the sample. The
    derivation (pinned by tests; part of the checkpoint format):

    - ``base = derive_seed(seed, "sample")``, once per seed;
    - ``e = mix64(base + (epoch + 1) * G)``, once per epoch;
    - ``key = mix64(e + (index + 1) * G)``,

    all modulo ``2**64``, where ``G = 0x9E3779B97F4A7C15`` and ``mix64`` is
    the splitmix64 finaliser (a bijection of 64-bit ints). So the keys of one
    epoch are splitmix64's outputs from state ``e``: distinct for distinct
    indices (a bijection of ``index``), and a key costs a few integer
    operations (vectorised per batch by the loaders) instead of a SeedSequence.

    Args:
        seed: The run's seed, an int in ``[0, 2**128)``.
        epoch: The epoch, an int in ``[0, 2**64)``.
        index: The sample's dataset index, an int in ``[0, 2**64)``.

    Returns:
        An int in ``[0, 2**64)``.

    Example:
        >>> sample_seed(0, 0, 0) != sample_seed(0, 0, 1) != sample_seed(0, 1, 0)
        True
    """
    e = _epoch_key("sample_seed", seed, epoch)
    index = _position("sample_seed", "index", index)
    return mix64((e + (index + 1) * GOLDEN) & M64)


def sample_keys(seed: int, epoch: int, indices: np.ndarray) -> np.ndarray:
    """:func:`sample_seed` of every index in ``indices`` (non-negative ints), as ``uint64``.

    Example:
        >>> int(sample_keys(3, 1, np.array([5]))[0]) == sample_seed(3, 1, 5)
        True
    """
    e = _epoch_key("sample_keys", seed, epoch)
    keys = np.asarray(indices).astype(np.uint64)  # a copy: mixed in place below
    keys += np.uint64(1)
    keys *= np.uint64(GOLDEN)
    keys += np.uint64(e)
    return mix64_array(keys)


def sample_stream_keys(keys: np.ndarray, tag: int) -> np.ndarray:
    """The stream key of one generator (a :class:`~loaderkit._tags.StreamTag`) per sample key:
    ``mix64(key ^ tag)``. Each generator's 624-word state is
    :func:`loaderkit._global_rngs.mt_words` of it (Python's random: the same words)."""
    return mix64_array(keys ^ np.uint64(tag))


def _stream_keys(seed: int, epoch: int, index: int, tag: int) -> np.ndarray:
    key = np.array([sample_seed(seed, epoch, index)], dtype=np.uint64)
    return sample_stream_keys(key, tag)


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A fresh CPU :class:`torch.Generator` in the state sample ``index`` of ``epoch`` gets.

    The same state :func:`seeded_sample` gives ``torch.default_generator``
    (64 bits of key; ``manual_seed`` would keep only 32). Pass it explicitly
    to ``torch.rand(..., generator=g)`` or to transforms that accept one; it
    touches no global state.

    Example:
        >>> with seeded_sample(1, 2, 3):
        ...     a = torch.rand(2)
        >>> torch.equal(a, torch.rand(2, generator=sample_generator(1, 2, 3)))
        True
    """
    torch_rng = global_rngs()[0]
    prepared = torch_rng.prepare(_stream_keys(seed, epoch, index, StreamTag.TORCH))
    generator = torch.Generator()
    generator.set_state(torch.from_numpy(prepared.rows[0]))
    return generator


def sample_numpy_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """A fresh :class:`numpy.random.Generator` for sample ``index`` in ``epoch``.

    A PCG64 seeded with the sample's numpy stream key (64 bits, through
    numpy's SeedSequence), so it is stable across processes and runs. Not the
    stream of the global ``np.random`` inside :func:`seeded_sample` (that one
    is a legacy MT19937).
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
    key = int(_stream_keys(seed, epoch, index, StreamTag.NUMPY)[0])
    return np.random.Generator(np.random.PCG64(key))


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


_STREAM_TAGS = (StreamTag.TORCH, StreamTag.NUMPY, StreamTag.RANDOM)  # global_rngs() order


@contextmanager
def seeded_sample(seed: int, epoch: int, index: int) -> Iterator[int]:
    """Seed the global RNGs for loading one sample, then restore them.

    Inside the block, torch's default CPU generator, numpy's global
    ``RandomState`` and :mod:`random` are each in a state derived from the
    64-bit :func:`sample_seed` ``(seed, epoch, index)`` (a stream per
    generator, see :func:`sample_stream_keys`), so transforms that draw from
    global RNGs (e.g. torchvision's) give the same result for the same sample
    whichever worker or process loads it. On exit the previous states are
    restored, so loading in the main process does not perturb the model's RNG
    (e.g. dropout).

    Accelerator generators (CUDA, ...) are neither seeded nor touched: only
    ``torch.default_generator`` is. Not thread-safe (global state): use it in
    the process that loads the sample, one sample at a time.

    Cost: about 15 us per call (measured on a 2-core x86 VM): the keyed states
    of three generators plus saving and restoring the caller's. The loaders
    do not call this per sample: they save and restore once per batch, derive
    the keys of a batch at once, and seed only the generators the dataset
    draws from (:class:`SampleSeeder`), about 1-2 us per sample and generator.

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
    rngs = global_rngs()
    saved = [rng.save() for rng in rngs]
    try:
        key = np.array([value], dtype=np.uint64)
        for rng, tag in zip(rngs, _STREAM_TAGS, strict=True):
            rng.install(rng.prepare(sample_stream_keys(key, tag)), 0)
        yield value
    finally:
        for rng, state in zip(rngs, saved, strict=True):
            rng.restore(state)


class SampleSeeder:
    """Loads a batch's samples one by one, each under its keyed global RNG states.

    What :class:`~loaderkit.ResumableDataLoader` runs per batch (one per
    loader and process; it travels to worker processes with the fetcher).
    The caller's states are saved before the batch and restored after it,
    once (the main process's own code, e.g. dropout, never sees the samples'
    draws). The batch's keys are derived at once (:func:`sample_keys`).

    Lazy (the default of the loaders): torch's generator is seeded for every
    sample, since a sample can read its seed without drawing
    (``torch.initial_seed()``, to seed a generator of its own). numpy's and
    Python's, whose seeds cannot be read, are seeded only once the dataset is
    seen drawing from them: until then each is *parked* in a fixed sentinel
    state for the batch. If a parked generator moved by the end of the batch,
    some sample drew from it: it is marked in use (seeded for every sample from
    then on) and the batch is loaded again, which is exact since a sample's
    output depends only on its index and its keyed states. So the result is the
    one of seeding every generator for every sample, except for a sample that
    draws from numpy's or Python's generator and restores its state before
    returning (``get_state``/``set_state``): that is not seen as use, and the
    sample sees the sentinel state. ``lazy=False`` seeds all three generators
    for every sample (``per_sample_seeding=True``).

    Args:
        lazy: Seed only the generators seen in use (see above).
    """

    __slots__ = ("in_use", "lazy")

    def __init__(self, *, lazy: bool) -> None:
        self.lazy = lazy
        # torch, numpy, random (global_rngs() order): seeded per sample when True (torch's
        # always is: it cannot be parked, GlobalRng.lazy_ok).
        self.in_use = [not lazy] * 3

    def __getstate__(self) -> tuple[bool, list[bool]]:
        return self.lazy, self.in_use

    def __setstate__(self, state: tuple[bool, list[bool]]) -> None:
        self.lazy, self.in_use = state

    def load(
        self,
        seed: int,
        epoch: int,
        indices: list[int],
        getitem: Callable[[int], Any],
        out: list[Any],
        seed_keys: list[int] | None = None,
    ) -> list[Any]:
        """``out`` filled with ``getitem(i)`` for each of ``indices``, each sample under the
        states keyed by ``(seed, epoch, i)`` (or ``seed_keys``, one per index, where a
        plan keys repeated draws of an index apart); returns ``out``.

        If ``getitem`` raises, ``out`` holds the samples before the failing one
        (``indices[len(out)]`` failed) and the caller's states are restored.
        """
        rngs = global_rngs()
        keys: np.ndarray | None = None
        saved = [rng.save() for rng in rngs]
        try:
            while True:
                seeded = []
                parked = []
                for slot, rng in enumerate(rngs):
                    if self.in_use[slot] or not rng.lazy_ok:
                        if keys is None:
                            keyed = indices if seed_keys is None else seed_keys
                            keys = sample_keys(seed, epoch, np.asarray(keyed))
                        stream = sample_stream_keys(keys, _STREAM_TAGS[slot])
                        seeded.append((rng.install, rng.prepare(stream, reuse=True)))
                    else:
                        rng.park()
                        parked.append(slot)
                out.clear()
                if len(seeded) == 1:  # torch's alone: the common case
                    append = out.append
                    install, prepared = seeded[0]
                    for pos, index in enumerate(indices):
                        install(prepared, pos)
                        append(getitem(index))
                else:
                    append = out.append
                    for pos, index in enumerate(indices):
                        for install, prepared in seeded:
                            install(prepared, pos)
                        append(getitem(index))
                moved = [slot for slot in parked if rngs[slot].moved()]
                if not moved:
                    return out
                for slot in moved:  # a sample drew from it unseeded: load the batch again
                    self.in_use[slot] = True
        finally:
            for rng, state in zip(rngs, saved, strict=True):
                rng.restore(state)

    def read_parked(self, read: Callable[[], Any]) -> tuple[Any, bool | None]:
        """``read()`` with every global generator parked in a sentinel state; whether
        it drew from any (None where one cannot be parked: then unknown).

        A batch read that drew from none is a function of its indices alone, so it
        is exact on any worker and after a resume without per-sample seeds. (A read
        of ``torch.initial_seed()`` without drawing is not seen: it sees the sentinel.)
        """
        rngs = global_rngs()
        saved = [rng.save() for rng in rngs]
        try:
            if not all(rng.lazy_ok for rng in rngs if rng.name != "torch"):
                return None, None
            torch.default_generator.manual_seed(_TORCH_PARK_SEED)
            torch_parked = torch.default_generator.get_state()
            for rng in rngs:
                if rng.name != "torch":
                    rng.park()
            result = read()
            moved = any(rng.moved() for rng in rngs if rng.name != "torch")
            moved = moved or not torch.equal(torch.default_generator.get_state(), torch_parked)
            return result, moved
        finally:
            for rng, state in zip(rngs, saved, strict=True):
                rng.restore(state)


# torch's generator for a parked batch read (no sample's key: those are 64-bit states).
_TORCH_PARK_SEED = 0x5A4D_9A2E_D0C7_1E55
