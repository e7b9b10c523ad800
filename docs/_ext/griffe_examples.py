"""Render `Example:` docstring sections as code, for the API reference.

The docstrings follow the house style and head their doctest with
`Example:`. Griffe's Google parser knows only the plural, `Examples:`, as a
section of code; the singular becomes an admonition whose `>>>` lines
Markdown reads as nested quotes. This extension renames the heading before
the docstrings are parsed, so both render the same way.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_HEADING = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename `Example:` section headings to `Examples:` in every docstring."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the docstring of `obj` in place, before it is parsed."""
        if obj.docstring is not None:
            obj.docstring.value = _HEADING.sub(
                r"\1Examples:", obj.docstring.value
            )
