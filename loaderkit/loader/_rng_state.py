"""The global RNGs' states, JSON-safe, in an iterable stream's record (private)."""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch

from loaderkit.errors import StateMismatchError


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def rng_state() -> dict[str, Any]:
    """This process's global RNG states (torch's CPU, numpy's, :mod:`random`'s), JSON-safe."""
    numpy_state: Any = np.random.get_state(legacy=False)
    if numpy_state["bit_generator"] == "MT19937":  # numpy's default: keys, pos, gauss cache
        mt, has_gauss, gauss = numpy_state["state"], numpy_state["has_gauss"], numpy_state["gauss"]
        numpy_entry: Any = [_b64(mt["key"].tobytes()), int(mt["pos"]), int(has_gauss), float(gauss)]
    else:  # another bit generator (np.random.set_bit_generator): its own state
        numpy_entry = _json_safe(numpy_state)
    py_version, py_words, py_gauss = random.getstate()
    return {
        "torch": _b64(torch.get_rng_state().numpy().tobytes()),
        "numpy": numpy_entry,
        "random": [py_version, _b64(np.asarray(py_words, dtype=np.uint32).tobytes()), py_gauss],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    saved = state["numpy"]
    kind = saved["bit_generator"] if isinstance(saved, dict) else "MT19937"
    here = np.random.get_state(legacy=False)["bit_generator"]
    if kind != here:
        raise StateMismatchError(
            f"the saved state holds numpy's global RNG as a {kind}, this worker's is a {here}; "
            "resume with the worker_init_fn (np.random.set_bit_generator) of the saving run."
        )
    torch.set_rng_state(torch.frombuffer(bytearray(_unb64(state["torch"])), dtype=torch.uint8))
    if isinstance(saved, dict):
        np.random.set_state(_from_json_safe(saved))
    else:
        keys, pos, has_gauss, gauss = saved
        np.random.set_state(
            ("MT19937", np.frombuffer(_unb64(keys), dtype=np.uint32), pos, has_gauss, gauss)
        )
    version, words, py_gauss = state["random"]
    py_words = tuple(int(w) for w in np.frombuffer(_unb64(words), dtype=np.uint32))
    random.setstate((version, py_words, py_gauss))


def _json_safe(value: Any) -> Any:
    """A bit generator's state with its arrays (Philox's key, counter) as base64 text."""
    if isinstance(value, dict):
        return {key: _json_safe(v) for key, v in value.items()}
    if isinstance(value, np.ndarray):
        return {"ndarray": _b64(value.tobytes()), "dtype": value.dtype.str, "shape": value.shape}
    return value.item() if isinstance(value, np.generic) else value  # numpy scalars: Python's


def _from_json_safe(value: Any) -> Any:
    if isinstance(value, dict) and "ndarray" in value:
        raw = np.frombuffer(_unb64(value["ndarray"]), dtype=value["dtype"])
        return raw.reshape(value["shape"]).copy()
    if isinstance(value, dict):
        return {key: _from_json_safe(v) for key, v in value.items()}
    return value
