"""A batch of a :class:`~loaderkit.MixedDataset` under the default collate: refused where its
sources' samples would be merged wrongly (docs/guide/mixing.md)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from loaderkit.data.mixing import MixedDataset
from loaderkit.errors import CollateError


def mixed_sources(dataset: Any, indices: list[int], samples: list[Any]) -> str:
    """What a failed collate of a batch whose mixed sources' samples differ in type adds."""

    def kinds(sample: Any) -> Any:
        if isinstance(sample, dict):
            return tuple(sorted((str(k), type(v).__name__) for k, v in sample.items()))
        if isinstance(sample, tuple | list):
            return tuple(type(v).__name__ for v in sample)
        return type(sample).__name__

    if not isinstance(dataset, MixedDataset) or len({kinds(s) for s in samples}) < 2:
        return ""
    names = sorted({dataset.names[s] for s in dataset.source_of(indices).tolist()})
    if len(names) < 2:
        return ""
    return f" (The batch mixes sources {names}, whose samples differ in type.)"


def check_mixed_batch(
    mix: MixedDataset, splits: list[Any], indices: list[int], samples: list[Any]
) -> None:
    """Refuse a batch of ``mix`` (read through ``splits``' indices, outermost first) whose
    sources' samples ``default_collate`` would merge wrongly: other sample types or dict keys
    (it keeps the first sample's), or a field that is a tensor in one source and a number in
    another (rounded to the first's dtype, or refused by chance)."""
    for rows in splits:
        indices = [int(rows[i]) for i in indices]
    sources = mix.source_of(indices).tolist()
    if len(set(sources)) > 1:
        _check_fields("the sample", samples, [mix.names[s] for s in sources])


def _check_fields(field: Any, column: list[Any], names: list[str]) -> None:
    """:func:`check_mixed_batch` of one field's values (``names``: each one's source), nested."""
    first = column[0]
    for value, name in zip(column, names, strict=True):
        if _shape(value) != _shape(first):
            raise CollateError(
                f"MixedDataset: {field} is a {type(value).__name__} in source {name!r} and a "
                f"{type(first).__name__} in source {names[0]!r}, which default_collate merges "
                "by the first one; give both sources one type, or pass a collate_fn."
            )
        if isinstance(first, dict) and set(value) != set(first):
            raise CollateError(
                f"MixedDataset: source {name!r} gives fields {sorted(map(str, value))}, source "
                f"{names[0]!r} {sorted(map(str, first))}, so default_collate would drop or "
                "refuse some; read the same fields from every source, or pass a collate_fn."
            )
    if isinstance(first, dict):
        for key in first:
            _check_fields(f"field {key!r}", [v[key] for v in column], names)
    elif isinstance(first, tuple | list) and all(isinstance(v, tuple | list) for v in column):
        for i, values in enumerate(zip(*column, strict=False)):
            _check_fields(f"item {i}", list(values), names)
    elif any(isinstance(v, torch.Tensor) for v in column) and any(map(_number, column)):
        t = next(i for i, v in enumerate(column) if isinstance(v, torch.Tensor))
        n = next(i for i, v in enumerate(column) if _number(v))
        raise CollateError(
            f"MixedDataset: {field} is a {column[t].dtype} tensor in source {names[t]!r} and "
            f"a {_kind(column[n])} in source {names[n]!r}, which default_collate rounds "
            "to one dtype or refuses; give both sources one type, or pass a collate_fn."
        )
    elif all(map(_number, column)):
        _check_floats(field, column, names)


def _check_floats(field: Any, column: list[Any], names: list[str]) -> None:
    """Refuse a Python float beside another number of another source: ``default_collate``
    makes float64 of a batch that begins with the float, float32 (rounding) otherwise."""
    floats = [i for i, v in enumerate(column) if type(v) is float]
    others = [i for i, v in enumerate(column) if type(v) is not float]
    pair = next(((f, o) for f in floats[:1] for o in others if names[o] != names[f]), None)
    pair = pair or next(((f, o) for o in others[:1] for f in floats if names[o] != names[f]), None)
    if pair:
        f, o = pair
        raise CollateError(
            f"MixedDataset: {field} is a Python float in source {names[f]!r} and a "
            f"{_kind(column[o])} in source {names[o]!r}, which default_collate makes float64 "
            "or float32 by which comes first; give both sources one type, or pass a collate_fn."
        )


def _shape(value: Any) -> type:
    """What ``default_collate`` walks into: a dict, a sequence, or a leaf."""
    return dict if isinstance(value, dict) else tuple if isinstance(value, tuple | list) else object


def _kind(value: Any) -> str:
    where = "Python" if type(value).__module__ == "builtins" else "numpy"
    return f"{where} {type(value).__name__}"


def _number(value: Any) -> bool:
    """A Python or numpy number (``default_collate`` makes a tensor of it)."""
    return isinstance(value, int | float | np.number) or (
        isinstance(value, np.ndarray) and value.ndim == 0
    )
