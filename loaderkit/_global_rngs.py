"""The global generators a dataset draws from, read and written as raw states (private).

Per-sample seeding gives torch's default CPU generator, numpy's global
``RandomState`` and Python's :mod:`random` a whole state per sample. All three
are MT19937 generators, and seeding them through their own APIs is either
32-bit (``torch.manual_seed`` keeps the low 32 bits of the seed, numpy's
legacy ``seed`` takes 32 bits) or slow (``np.random.seed([lo, hi])`` ~8 us,
``random.seed`` ~4 us, ``random.getstate()``/``setstate()`` ~9 us). So the
624-word state is derived here from a 64-bit key (:func:`mt_words`,
vectorised over a batch) and copied into each generator: torch through
``set_state`` (its documented state layout, checked once per process), numpy
and Python through the raw C state (its layout checked once per process
against the generator's own ``get_state``/``getstate``; where a check fails, the
same state goes through the slow public API, so the values never depend on
the path). Measured on a 2-core x86 VM: ~0.8 us per sample and generator to
derive the words, ~0.5 us to install a state.

numpy's and Python's generators can also be *parked* in a fixed sentinel state
and asked whether anything drew from it since (:meth:`GlobalRng.moved`): what
lazy per-sample seeding builds on (:class:`loaderkit.seeding.SampleSeeder`).
torch's is never parked: a sample can read its seed (``torch.initial_seed()``)
without drawing, so it gets its keyed state for every sample.
"""

from __future__ import annotations

import ctypes
import random
import struct
import sys
from typing import Any, NamedTuple

import numpy as np
import torch

from loaderkit.errors import LoaderkitError

__all__ = ["GlobalRng", "Prepared", "global_rngs", "mix64", "mix64_array", "mt_words"]

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's increment: 2**64 / golden ratio, odd
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
MT_N = 624
_MT_TOP = 0x8000_0000  # MT19937 reads only the top bit of word 0; init_by_array sets it too
# Splitmix64 outputs 1..312 give the 624 32-bit words.
_STEPS = np.arange(1, MT_N // 2 + 1, dtype=np.uint64) * np.uint64(GOLDEN)


def mix64(z: int) -> int:
    """The splitmix64 finaliser: a bijection of ``[0, 2**64)`` that mixes every bit.

    Example:
        >>> mix64(0), mix64(1) != mix64(2)
        (0, True)
    """
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


# mt_words' working array, reused: a fresh one per batch costs more in page faults
# (~6 us per sample on a busy machine) than the hashing itself. Its result is
# copied out before the next call (no caller keeps it).
_WORK = np.empty((0, MT_N // 2), dtype=np.uint64)


def _grown(buffer: np.ndarray, count: int) -> np.ndarray:
    """``buffer``, or a new one of twice its rows (at least ``count``) when it is too short.

    A new array, not ``resize``: views of the old one stay valid."""
    if buffer.shape[0] >= count:
        return buffer
    return np.empty((max(count, 2 * buffer.shape[0]), *buffer.shape[1:]), dtype=buffer.dtype)


def mt_words(keys: np.ndarray) -> np.ndarray:
    """The MT19937 state of each 64-bit stream key: shape ``(len(keys), 624)``, uint32.

    Words ``2j`` and ``2j + 1`` are the low and high halves of splitmix64's
    output ``j + 1`` from state ``key`` (``mix64(key + (j + 1) * GOLDEN)``);
    word 0 is then ``0x80000000``, as after MT's ``init_by_array`` (the
    generator reads only its top bit). Distinct keys give distinct states: word
    pair (1, 2)... is a bijection of the key.

    The result is a view of a reused array: valid until the next call.
    """
    global _WORK
    if _WORK.shape[0] < keys.size:
        _WORK = np.empty((max(keys.size, 2 * _WORK.shape[0]), MT_N // 2), dtype=np.uint64)
    z = _WORK[: keys.size]
    np.add.outer(keys.astype(np.uint64, copy=False), _STEPS, out=z)
    mix64_array(z)
    if sys.byteorder == "little":
        words = z.view(np.uint32)
    else:  # pragma: no cover - no big-endian CI
        words = np.empty((z.shape[0], MT_N), dtype=np.uint32)
        words[:, 0::2] = z & np.uint64(0xFFFF_FFFF)
        words[:, 1::2] = z >> np.uint64(32)
    words[:, 0] = _MT_TOP
    return words


class Prepared(NamedTuple):
    """The keyed states of a batch for one generator: row ``i`` at ``address + i * stride``."""

    rows: Any  # an array of raw states, or (numpy's non-MT19937 path) a list of int keys
    address: int
    stride: int


def _prepared(rows: np.ndarray) -> Prepared:
    # ctypes.data costs ~0.8 us: read it once per batch, not per sample.
    return Prepared(rows, rows.ctypes.data, rows.strides[0])


class GlobalRng:
    """One global generator: keyed states in, parking and saving around a batch.

    Subclasses fill in the raw access. ``prepare`` turns a batch's stream keys
    into states; ``install(prepared, i)`` makes state ``i`` current.
    """

    name = ""

    def prepare(self, keys: np.ndarray, *, reuse: bool = False) -> Prepared:
        """The states of ``keys``; ``reuse``: in this generator's batch buffer (valid
        until the next ``reuse`` call), else in a new array."""
        raise NotImplementedError

    def install(self, prepared: Prepared, i: int) -> None:
        raise NotImplementedError

    def save(self) -> Any:
        raise NotImplementedError

    def restore(self, saved: Any) -> None:
        raise NotImplementedError

    @property
    def lazy_ok(self) -> bool:
        """Whether :meth:`park` and :meth:`moved` work (else the generator is seeded eagerly)."""
        return True

    def park(self) -> None:
        """Put the generator in its sentinel state (a fixed, keyed state)."""
        raise NotImplementedError

    def moved(self) -> bool:
        """Whether the generator left the sentinel state since :meth:`park`."""
        raise NotImplementedError


# Sentinel: the state of this stream key, which no sample's key is (with
# probability 1 - 2**-64) and no ``manual_seed``/``seed`` call produces.
_SENTINEL_KEY = mix64(0x5E17_1E15_A5EE_D000)


# ----------------------------------------------------------------------- torch
# torch's CPU generator state (ATen CPUGeneratorImplStateLegacy, kept stable
# for old checkpoints): u64 the_initial_seed @0, int left @8, int seeded @12,
# u64 next @16, u64 state[624] @24 (32-bit words), doubles normal_x/y/rho
# @5016, int normal_is_valid @5040, float next_float_normal_sample @5048,
# bool its validity @5052: 5056 bytes.
_TORCH_BYTES = 5056
_TORCH_WORDS = slice(3, 3 + MT_N)  # in the state viewed as uint64


class _TorchRng(GlobalRng):
    name = "torch"

    def __init__(self) -> None:
        self.generator = torch.default_generator
        probe = torch.Generator()
        probe.manual_seed(1)
        template = probe.get_state().numpy().copy()
        _check_torch_layout(template)
        template[5040:5056] = 0  # no cached normal samples
        self._template = template
        self._buf = torch.empty(_TORCH_BYTES, dtype=torch.uint8)
        self._buf_ptr = self._buf.data_ptr()
        self._batch = np.empty((0, _TORCH_BYTES), dtype=np.uint8)
        # torch validates the state: fail here, not mid-epoch.
        probe_row = self.prepare(np.array([_SENTINEL_KEY], dtype=np.uint64)).rows[0]
        probe.set_state(torch.from_numpy(probe_row.copy()))
        if probe.get_state().numpy().tobytes() != probe_row.tobytes():
            raise LoaderkitError(
                f"torch {torch.__version__} does not round-trip a CPU generator state; "
                "per-sample seeding cannot set 64-bit states (pass per_sample_seeding=False)."
            )

    @property
    def lazy_ok(self) -> bool:
        """False: a sample can read torch's seed without drawing, so it is never parked."""
        return False

    def prepare(self, keys: np.ndarray, *, reuse: bool = False) -> Prepared:
        if reuse:
            grown = _grown(self._batch, keys.size)
            if grown is not self._batch:
                # Only the seed and the words change between batches: the rest of
                # the template is written once per buffer (~0.5 us per row saved).
                grown[:] = self._template
                self._batch = grown
            rows = self._batch[: keys.size]
        else:
            rows = np.empty((keys.size, _TORCH_BYTES), dtype=np.uint8)
            rows[:] = self._template
        view = rows.view(np.uint64)
        view[:, 0] = keys  # what torch.initial_seed() reports inside the sample
        # copyto: a plain assignment of uint32 into this strided uint64 view is ~5x slower.
        np.copyto(view[:, _TORCH_WORDS], mt_words(keys), casting="safe")
        return _prepared(rows)

    def install(self, prepared: Prepared, i: int) -> None:
        # One reused tensor: set_state copies it. (A row view of a 2-D tensor is
        # read from its storage's start by set_state; torch.from_numpy per row
        # costs ~0.8 us more.)
        ctypes.memmove(self._buf_ptr, prepared.address + i * _TORCH_BYTES, _TORCH_BYTES)
        self.generator.set_state(self._buf)

    def save(self) -> torch.Tensor:
        return self.generator.get_state()

    def restore(self, saved: torch.Tensor) -> None:
        self.generator.set_state(saved)


def _check_torch_layout(state: np.ndarray) -> None:
    """The state of ``manual_seed(1)``, read through the layout above, or an error."""
    words = state.view(np.uint64)
    left, seeded = struct.unpack_from("<ii", state.tobytes(), 8)
    expected = [1]
    for i in range(1, 3):  # MT's init_genrand
        prev = expected[-1]
        expected.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFF_FFFF)
    if not (
        state.size == _TORCH_BYTES
        and sys.byteorder == "little"
        and int(words[0]) == 1
        and (left, seeded) == (1, 1)
        and int(words[2]) == 0
        and [int(w) for w in words[3:6]] == expected
    ):
        raise LoaderkitError(
            f"torch {torch.__version__}: the CPU generator's state layout is not the one "
            "loaderkit writes per-sample states in; pass per_sample_seeding=False (or seed "
            "explicitly with loaderkit.sample_generator) and report the torch version."
        )


# ----------------------------------------------------------------------- numpy
# The global RandomState's MT19937 C state: uint32 key[624]; int pos.
_NP_BYTES = MT_N * 4 + ctypes.sizeof(ctypes.c_int)


# numpy's global RandomState: get_state()/set_state() copy the 624-word
# Mersenne Twister key through a Python-level loop (~60 us each). The fast
# path copies the raw C state (uint32 key[624]; int pos) through numpy's
# public ctypes interface, checked once against get_state() before use. The
# legacy Gaussian cache is not reachable that way, so it is probed: draw one
# standard normal; if the MT words did not move, the draw was the cached value.
_MT_KEY_BYTES = 624 * 4
_MT_STATE_BYTES = _MT_KEY_BYTES + ctypes.sizeof(ctypes.c_int)
fast_numpy_ok: bool | None = None


_ADDRESS: tuple[Any, int] = (None, 0)  # (bit generator, its C state address), cached


def state_address(bitgen: Any) -> int:
    """The C state address of ``bitgen`` (``bitgen.ctypes`` costs ~0.8 us per access).

    The cache holds the bit generator itself, so its identity check is sound."""
    global _ADDRESS
    if _ADDRESS[0] is not bitgen:
        _ADDRESS = (bitgen, bitgen.ctypes.state_address)
    return _ADDRESS[1]


def global_mt() -> Any:
    """The global RandomState's bit generator if it is an MT19937, else None."""
    bitgen = getattr(np.random.mtrand._rand, "_bit_generator", None)
    return bitgen if type(bitgen) is np.random.MT19937 else None


def fast_numpy_usable(bitgen: Any) -> bool:
    global fast_numpy_ok
    if fast_numpy_ok is None:
        raw = ctypes.string_at(state_address(bitgen), _MT_STATE_BYTES)
        _, key, pos, _, _ = np.random.get_state(legacy=True)
        fast_numpy_ok = raw[:_MT_KEY_BYTES] == np.asarray(
            key, dtype=np.uint32
        ).tobytes() and pos == int.from_bytes(raw[_MT_KEY_BYTES:], sys.byteorder, signed=True)
    return fast_numpy_ok


# The legacy Gaussian cache (``int has_gauss; double gauss``) lives in the
# RandomState object itself (its ``aug_bitgen_t``, right after a pointer to the
# object's own ``bitgen_t``, whose first field is the bit generator's state
# address). Found by that pointer chain and checked once per process against
# ``set_state``/``get_state``; where found, saving, restoring and clearing the
# cache is a 16-byte copy instead of a probe draw and ``np.random.seed(0)``
# (~1.5 us each), with the same resulting states.
_AUG_BYTES = 16  # int has_gauss; (padding); double gauss
_GAUSS: tuple[Any, int] = (None, 0)  # (RandomState, its has_gauss address or 0), cached


def _find_gauss(rs: Any, bitgen: Any) -> int:
    size = type(rs).__basicsize__
    base = id(rs)
    raw = ctypes.string_at(base, size)
    words = [struct.unpack_from("=Q", raw, o)[0] for o in range(0, size - 7, 8)]
    target = state_address(bitgen)
    for o, word in enumerate(words):
        if word != target:
            continue
        for a, ptr in enumerate(words):
            if ptr == base + 8 * o and 8 * a + 8 + _AUG_BYTES <= size:
                address = base + 8 * a + 8
                if _gauss_checks(rs, address):
                    return address
    return 0


def _gauss_checks(rs: Any, address: int) -> bool:
    saved = rs.get_state(legacy=False)
    try:
        key = np.arange(MT_N, dtype=np.uint32)
        rs.set_state(("MT19937", key, 5, 1, 0.375))
        if ctypes.string_at(address, 4) != struct.pack("=i", 1):
            return False
        if ctypes.string_at(address + 8, 8) != struct.pack("=d", 0.375):
            return False
        ctypes.memset(address, 0, _AUG_BYTES)
        _, _, _, has_gauss, gauss = rs.get_state(legacy=True)
        return bool(has_gauss == 0 and gauss == 0.0)
    finally:
        rs.set_state(saved)


def gauss_address(bitgen: Any) -> int:
    """The address of the global RandomState's Gaussian cache, or 0 where not found."""
    global _GAUSS
    rs = np.random.mtrand._rand
    if _GAUSS[0] is not rs:
        _GAUSS = (rs, _find_gauss(rs, bitgen) if fast_numpy_usable(bitgen) else 0)
    return _GAUSS[1]


def save_numpy() -> tuple[Any, ...]:
    bitgen = global_mt()
    if bitgen is None or not fast_numpy_usable(bitgen):
        return (None, np.random.get_state(legacy=False))
    address = state_address(bitgen)
    raw = ctypes.string_at(address, _MT_STATE_BYTES)
    aug = gauss_address(bitgen)
    if aug:
        return (bitgen, raw, None, ctypes.string_at(aug, _AUG_BYTES))
    probe = np.random.standard_normal()
    cached = ctypes.string_at(address, _MT_STATE_BYTES) == raw
    return (bitgen, raw, probe if cached else None)


def restore_numpy(saved: tuple[Any, ...]) -> None:
    bitgen = saved[0]
    if bitgen is None:
        np.random.set_state(saved[1])
        return
    _, raw, gauss, *aug = saved
    if aug:
        ctypes.memmove(state_address(bitgen), raw, _MT_STATE_BYTES)
        ctypes.memmove(gauss_address(bitgen), aug[0], _AUG_BYTES)
    elif gauss is None:
        np.random.seed(0)  # clears the Gaussian cache; the MT words are overwritten next
        ctypes.memmove(state_address(bitgen), raw, _MT_STATE_BYTES)
    else:  # rare: the caller left half of a Gaussian pair cached
        key = np.frombuffer(raw, dtype=np.uint32, count=624)
        pos = int.from_bytes(raw[_MT_KEY_BYTES:], sys.byteorder, signed=True)
        np.random.set_state(("MT19937", key, pos, 1, gauss))


class _NumpyRng(GlobalRng):
    """numpy's global ``RandomState``.

    An MT19937 (the default) gets the keyed state: copied raw into its C state
    when that layout checked out, else through ``np.random.set_state`` (the
    same state, ~60 us). Another bit generator (``np.random.set_bit_generator``)
    is seeded with the 64-bit key through ``np.random.seed`` (its own
    SeedSequence). The legacy Gaussian cache (the second normal of a drawn
    pair) lives outside the C state: where its address was found
    (:func:`gauss_address`) it is cleared before each sample by a 16-byte write,
    else ``np.random.seed(0)`` empties it (~1.6 us), done only after a sample
    that drew.
    """

    name = "numpy"

    def __init__(self) -> None:
        self._sentinel: Prepared | None = None
        self._last = -1  # address of the state installed last; -1: none since save()
        self._address = 0  # the global MT19937's C state, read at save()
        self._gauss = 0  # its Gaussian cache (gauss_address), read at save(); 0: not found
        self._batch = np.empty((0, MT_N + 1), dtype=np.uint32)

    @staticmethod
    def _raw() -> Any:
        """The global MT19937 when its raw state can be copied, else None."""
        bitgen = global_mt()
        return bitgen if bitgen is not None and fast_numpy_usable(bitgen) else None

    @property
    def lazy_ok(self) -> bool:
        """Whether :meth:`park` and :meth:`moved` work (the raw state is reachable; known
        since :meth:`save`, which the caller runs first)."""
        return self._address != 0

    def prepare(self, keys: np.ndarray, *, reuse: bool = False) -> Prepared:
        if global_mt() is None:
            return Prepared([int(k) for k in keys], 0, 0)
        if reuse:
            self._batch = _grown(self._batch, keys.size)
            rows = self._batch[: keys.size]
        else:
            rows = np.empty((keys.size, MT_N + 1), dtype=np.uint32)
        rows[:, :MT_N] = mt_words(keys)
        rows[:, MT_N] = MT_N  # pos: the next draw regenerates the block
        return _prepared(rows)

    def install(self, prepared: Prepared, i: int) -> None:
        if not prepared.address:
            np.random.seed(prepared.rows[i])
            return
        address = self._address
        if not address:
            np.random.set_state(("MT19937", prepared.rows[i, :MT_N], MT_N, 0, 0.0))
            return
        if self._gauss:
            ctypes.memset(self._gauss, 0, _AUG_BYTES)  # what np.random.seed(0) does to it
        elif self._last != -1 and ctypes.string_at(address, _NP_BYTES) != ctypes.string_at(
            self._last, _NP_BYTES
        ):
            np.random.seed(0)  # the last sample drew: it may have left a cached Gaussian
        source = prepared.address + i * _NP_BYTES
        ctypes.memmove(address, source, _NP_BYTES)
        self._last = source

    def save(self) -> Any:
        self._last = -1
        bitgen = global_mt()
        if bitgen is not None and fast_numpy_usable(bitgen):
            aug = gauss_address(bitgen)
            if aug:  # the common case, inlined: ~1 us per batch (save_numpy's result)
                address = state_address(bitgen)
                saved = (
                    bitgen,
                    ctypes.string_at(address, _MT_STATE_BYTES),
                    None,
                    ctypes.string_at(aug, _AUG_BYTES),
                )
                ctypes.memset(aug, 0, _AUG_BYTES)
                self._address, self._gauss = address, aug
                return saved
        saved = save_numpy()
        bitgen = self._raw()
        self._address = 0 if bitgen is None else state_address(bitgen)
        self._gauss = 0 if bitgen is None else gauss_address(bitgen)
        if self._gauss:
            ctypes.memset(self._gauss, 0, _AUG_BYTES)
        elif saved[0] is not None:
            np.random.seed(0)  # save_numpy's probe may have left a cached Gaussian
        self._last = -1
        return saved

    def restore(self, saved: Any) -> None:
        self._last = -1
        restore_numpy(saved)

    def park(self) -> None:
        if self._sentinel is None:
            self._sentinel = self.prepare(np.array([_SENTINEL_KEY], dtype=np.uint64))
            self._sentinel_bytes = self._sentinel.rows.tobytes()
        ctypes.memmove(self._address, self._sentinel.address, _NP_BYTES)
        if self._gauss:
            ctypes.memset(self._gauss, 0, _AUG_BYTES)
        # Compared at the next install: a batch that drew while parked may have
        # left a cached Gaussian, which the batch's reload must not see.
        self._last = self._sentinel.address

    def moved(self) -> bool:
        return ctypes.string_at(self._address, _NP_BYTES) != self._sentinel_bytes


# ---------------------------------------------------------------------- random
_PY_VERSION = 3  # random.getstate()'s format version
_PY_BYTES = 4 * (MT_N + 1)  # int index; uint32_t state[624]


class _PythonRng(GlobalRng):
    """Python's :mod:`random` (the instance its module functions are bound to).

    CPython's ``_random.Random`` object holds ``int index; uint32_t state[624]``
    right after the object header; when that layout checks out against
    ``getstate()``, states are copied in and out raw (~0.4 us instead of ~9 us),
    else they go through ``setstate``/``getstate`` (same states, slower).
    """

    name = "random"

    def __init__(self) -> None:
        self.inst: random.Random = random.random.__self__  # type: ignore[attr-defined]
        self._address = self._raw_address()
        self._batch = np.empty((0, MT_N + 1), dtype=np.uint32)
        self._sentinel = self.prepare(np.array([_SENTINEL_KEY], dtype=np.uint64))
        self._sentinel_bytes = self._sentinel.rows.tobytes()
        self._sentinel_state = self._as_state(self._sentinel, 0)

    def _raw_address(self) -> int:
        inst = self.inst
        offset = object.__basicsize__
        if sys.implementation.name != "cpython" or type(inst).__mro__[-2].__basicsize__ < (
            offset + 4 + 4 * MT_N
        ):
            return 0
        saved = inst.getstate()
        try:
            probe = tuple(range(7, 7 + MT_N))
            inst.setstate((_PY_VERSION, (*probe, 5), None))
            raw = ctypes.string_at(id(inst) + offset, 4 + 4 * MT_N)
            ok = raw == struct.pack(f"=i{MT_N}I", 5, *probe)
        finally:
            inst.setstate(saved)
        return id(inst) + offset if ok else 0

    def prepare(self, keys: np.ndarray, *, reuse: bool = False) -> Prepared:
        if reuse:
            self._batch = _grown(self._batch, keys.size)
            rows = self._batch[: keys.size]
        else:
            rows = np.empty((keys.size, MT_N + 1), dtype=np.uint32)
        rows[:, 0] = MT_N  # index: the next draw regenerates the block
        rows[:, 1:] = mt_words(keys)
        return _prepared(rows)

    @staticmethod
    def _as_state(prepared: Prepared, i: int) -> tuple[Any, ...]:
        row = prepared.rows[i].tolist()
        return (_PY_VERSION, (*row[1:], row[0]), None)

    def install(self, prepared: Prepared, i: int) -> None:
        if self._address:
            ctypes.memmove(self._address, prepared.address + i * _PY_BYTES, _PY_BYTES)
            self.inst.gauss_next = None  # type: ignore[attr-defined]
        else:
            self.inst.setstate(self._as_state(prepared, i))

    def save(self) -> Any:
        if self._address:
            return (ctypes.string_at(self._address, _PY_BYTES), self.inst.gauss_next)  # type: ignore[attr-defined]
        return self.inst.getstate()

    def restore(self, saved: Any) -> None:
        if self._address:
            raw, gauss = saved
            ctypes.memmove(self._address, raw, len(raw))
            self.inst.gauss_next = gauss  # type: ignore[attr-defined]
        else:
            self.inst.setstate(saved)

    def park(self) -> None:
        self.install(self._sentinel, 0)

    def moved(self) -> bool:
        if self._address:
            return (
                ctypes.string_at(self._address, _PY_BYTES) != self._sentinel_bytes
                or self.inst.gauss_next is not None  # type: ignore[attr-defined]
            )
        return bool(self.inst.getstate() != self._sentinel_state)


_RNGS: tuple[GlobalRng, ...] | None = None


def global_rngs() -> tuple[GlobalRng, GlobalRng, GlobalRng]:
    """torch's, numpy's and Python's global generators, built once per process."""
    global _RNGS
    if _RNGS is None:
        _RNGS = (_TorchRng(), _NumpyRng(), _PythonRng())
    return _RNGS  # type: ignore[return-value]
