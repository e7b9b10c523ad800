"""What an in-place step computed before its first write, kept for the writes.

`Optimizer.step_` checks, then commits: inside `planned()` its preparation
`remember`s what it computed, and the step `recall`s it instead of computing it
again.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Generator

import torch

__all__ = ["planned", "recall", "remember"]

_AHEAD: contextvars.ContextVar[dict[int, tuple[object, object]] | None] = (
    contextvars.ContextVar("paramdict_optim_ahead", default=None)
)


def remember(key: object, value: object) -> None:
    """Keep `value`, computed for `key` before an in-place step writes anything.

    `step_` first evaluates everything that can fail (schedule callbacks, the
    choice of kernels and its refusals; `Optimizer._prepare`), then writes. What
    the preparation computed is kept here, by the identity of the object it was
    computed from, for the step to `recall` instead of computing it again. Outside
    a `step_` nothing is kept.
    """
    if torch.compiler.is_compiling():
        return  # a compiled `step_` is traced as one graph: nothing is kept
    ahead = _AHEAD.get()
    if ahead is not None:
        ahead[id(key)] = (key, value)


def recall(key: object) -> tuple[bool, object]:
    """Return `(True, value)` if `remember(key, value)` ran in this `step_`."""
    if torch.compiler.is_compiling():
        return False, None
    ahead = _AHEAD.get()
    if ahead is not None:
        found = ahead.get(id(key))
        if found is not None and found[0] is key:
            return True, found[1]
    return False, None


@contextlib.contextmanager
def planned() -> Generator[None, None, None]:
    """Keep what `remember` is given until the block ends (one `step_`)."""
    token = _AHEAD.set({})
    try:
        yield
    finally:
        _AHEAD.reset(token)
