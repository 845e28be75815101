"""A griffe extension for the API pages: Sphinx roles in docstrings become Markdown.

loaderkit's docstrings name other objects the Sphinx way (``:class:`~loaderkit.PadCollate```),
which mkdocstrings would print as it stands. A role whose target is a public name of
loaderkit (one on an API page) becomes a cross-reference to it; any other target
(a private module, torch, a method) becomes a code span. An ``Example:`` section is read
as ``Examples:``, so its doctest lines render as code. Only the text shown changes.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

import loaderkit

# A Google-style "Example:" heading is an admonition to griffe; "Examples:" is parsed as code.
EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", flags=re.MULTILINE)
ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|mod|data|exc|obj):`(~?)([^`]+)`")
PUBLIC = frozenset(loaderkit.__all__)


def convert(text: str) -> str:
    """``text`` with Sphinx roles as cross-references or code spans, and examples as code."""

    def replace(match: re.Match[str]) -> str:
        role, short, target = match.groups()
        target = target.strip()
        shown = target.rsplit(".", 1)[-1] if short else target
        name = target.rsplit(".", 1)[-1]
        is_module = role == "mod"
        if not is_module and name in PUBLIC and _is_public_path(target):
            return f"[`{shown}`][loaderkit.{name}]"
        return f"`{shown}`"

    return EXAMPLE.sub(r"\1Examples:", ROLE.sub(replace, text))


def _is_public_path(target: str) -> bool:
    """Whether ``target`` (``Name``, ``loaderkit.Name`` or a module path) is a public name."""
    parts = target.split(".")
    if len(parts) == 1:
        return True
    return parts[0] == "loaderkit" and not any(p.startswith("_") for p in parts)


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring as griffe loads it."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value)
