"""Optional peers: libraries measured when they import, skipped with a note otherwise.

None of them is a dependency of paramdict or of its tests. Each is imported on first
use, by name, so the benchmarks run (and type-check) without them; a peer that fails
to import for any reason is reported as skipped, with the reason, never as an error.
"""

from __future__ import annotations

import functools
import importlib
from importlib import metadata
from typing import Any

__all__ = ["PEERS", "load", "skipped", "versions"]

PEERS = ("tensordict", "torchopt", "higher")
"""The peer libraries, by import name."""


@functools.cache
def _import(name: str) -> tuple[Any, str]:
    try:
        return importlib.import_module(name), ""
    except Exception as err:  # any failure means "not available here"
        return None, f"{type(err).__name__}: {err}"


def load(name: str, /) -> Any:
    """Return the imported peer module, or `None` when it does not import."""
    module, _ = _import(name)
    return module


def skipped(name: str, /, *, what: str) -> str:
    """Return the note for a case that left out the peer `name`.

    Args:
        name: The peer's import name.
        what: The candidates that were left out, in words.

    Returns:
        A sentence naming the peer, the reason and how to install it.
    """
    _, reason = _import(name)
    return (
        f"{what}: skipped, `{name}` does not import ({reason}). Install it with "
        f"`pip install --no-deps {name}` beside this torch to measure it."
    )


def versions() -> dict[str, str | None]:
    """Return each peer's installed version, `None` for those that do not import."""
    found: dict[str, str | None] = {}
    for name in PEERS:
        if load(name) is None:
            found[name] = None
            continue
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = getattr(load(name), "__version__", "unknown")
    return found
