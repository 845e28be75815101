"""A batch of a :class:`~loaderkit.MixedDataset` under the default collate: refused where its
sources' samples would be merged wrongly (docs/guide/mixing.md)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from loaderkit.data._arrow import exact_dtype, promoted
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
    elif all(isinstance(v, torch.Tensor) or _number(v) for v in column):
        _check_dtypes(field, column, names)


def _check_dtypes(field: Any, column: list[Any], names: list[str]) -> None:
    """Refuse numbers (or tensors) of two sources that ``default_collate`` rounds: to a dtype
    that cannot hold both (int64 ids beside float32 values), or by which comes first (a Python
    float makes float64 first, float32 after an int)."""
    firsts: dict[tuple[torch.dtype, bool, str], int] = {}  # (dtype, Python float, source)
    for i, (v, name) in enumerate(zip(column, names, strict=True)):
        firsts.setdefault((_dtype(v), type(v) is float, name), i)
    kinds = list(firsts.items())
    for (a, i), (b, j) in ((x, y) for n, x in enumerate(kinds) for y in kinds[n + 1 :]):
        if a[2] == b[2] or a[0] == b[0]:
            continue
        exact = exact_dtype(a[0], b[0])
        if a[1] or b[1] or exact is None or promoted(a[0], b[0]) != exact:
            raise CollateError(
                f"MixedDataset: {field} is a {_kind(column[i])} in source {names[i]!r} and a "
                f"{_kind(column[j])} in source {names[j]!r}, which default_collate rounds; give "
                "both sources one type, or pass a collate_fn."
            )


def _dtype(value: Any) -> torch.dtype:
    """The dtype ``default_collate`` gives ``value`` alone (a Python float: float64)."""
    if isinstance(value, torch.Tensor):
        return value.dtype
    if isinstance(value, bool | int | float):
        return {bool: torch.bool, int: torch.int64}.get(type(value), torch.float64)
    return _numpy_dtype(value.dtype)


@functools.cache
def _numpy_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def _shape(value: Any) -> type:
    """What ``default_collate`` walks into: a dict, a sequence, or a leaf."""
    return dict if isinstance(value, dict) else tuple if isinstance(value, tuple | list) else object


def _kind(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor"
    where = "Python" if type(value).__module__ == "builtins" else "numpy"
    return f"{where} {type(value).__name__}"


def _number(value: Any) -> bool:
    """A Python or numpy number (``default_collate`` makes a tensor of it)."""
    return isinstance(value, int | float | np.number) or (
        isinstance(value, np.ndarray) and value.ndim == 0
    )
