"""The tensors an out-of-place step writes into: copies made first, or by writes.

`copied` copies every tensor first; `lazily_copied` hands the rule containers
that become copies by their first in-place write (`paramdict._fresh`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar, cast

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
from torch import Tensor

from .._foreach import copy_, holds_dtensors
from .._fresh import lazy, owned
from .._paramdict import ParamDict
from ._validate import rebuilt, state_tensors

__all__ = ["copied", "lazily_copied"]

S = TypeVar("S")
P = TypeVar("P", bound=ParamDict)


def copied(params: P, state: S, *, recorded: bool) -> tuple[P, S]:
    """Return new parameters and state holding copies of the tensors of both."""
    made = _copies([*params._vals, *state_tensors(state)], recorded=recorded)
    n = len(params._vals)
    return params._derive(made[:n]), cast(S, rebuilt(state, iter(made[n:])))


def _copies(sources: list[Tensor], *, recorded: bool) -> list[Tensor]:
    """Copies of `sources`: one `_foreach_copy_`, or a `clone` each."""
    if (
        recorded
        or not sources
        or holds_dtensors(sources)
        or torch.compiler.is_compiling()
        or torch._C._functorch.is_functorch_wrapped_tensor(sources[0])
    ):
        return [t.clone() for t in sources]
    made = [torch.empty_like(t) for t in sources]
    copy_(made, sources)
    return made


def lazily_copied(
    params: P, state: S, *, recorded: bool, exact: bool
) -> tuple[P, S, Callable[[], None]]:
    """`copied`, each ParamDict copied by its first write; and the `finish` to call.

    `exact`: `_fresh.mixed(params)`. `finish` copies every entry not written.
    """
    containers: list[ParamDict] = []
    made = iter(_copies(state_tensors(state, containers), recorded=recorded))
    twins = [lazy(c, exact=exact) for c in containers]
    new_state = cast(S, rebuilt(state, made, iter(twins)))
    new_params = lazy(params, exact=exact)
    given = [params._vals, *[c._vals for c in containers]]
    return new_params, new_state, partial(owned, [new_params, *twins], given)
