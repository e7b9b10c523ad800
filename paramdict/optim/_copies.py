"""The tensors an out-of-place step writes into: copies made first, or by writes.

`step` must leave what it is handed unchanged, and its rule writes in place.
`copied` copies every tensor first (one `torch._foreach_copy_`); `lazily_copied`
hands the rule containers that each become a copy by their first in-place write
(`paramdict._fresh`), which saves the copy's pass over memory (and autograd's
`clone` per tensor), for optimizers whose rules write through ParamDict's in-place
methods only (`Optimizer._copies_lazily`).
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (ParamDict's package-internal storage)
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
from torch import Tensor
from torch.utils import _pytree as pytree

from .._foreach import copy_, holds_dtensors
from .._fresh import lazy, owned
from .._paramdict import ParamDict
from ._validate import rebuilt, state_tensors

__all__ = ["copied", "lazily_copied"]

S = TypeVar("S")
P = TypeVar("P", bound=ParamDict)


def copied(params: P, state: S, *, recorded: bool) -> tuple[P, S]:
    """Return new parameters and state holding copies of the tensors of both.

    One `_foreach_copy_` for all of them (a clone each where autograd records:
    `recorded`). Dense tensors keep their strides; others become contiguous.
    """
    made = _copies([*params._vals, *state_tensors(state)], recorded=recorded)
    n = len(params._vals)
    return params._derive(made[:n]), cast(S, rebuilt(state, iter(made[n:])))


def _copies(sources: list[Tensor], *, recorded: bool) -> list[Tensor]:
    """Copies of `sources`: one `_foreach_copy_`, or a `clone` each (see `copied`)."""
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
    """`copied`, with each ParamDict copied by its first in-place write.

    The state's other tensors (counters, a schedule's numbers) are copied now.
    `exact`: the parameters' dtypes differ or some are 0-dim (`_fresh.mixed`).
    Returns the new parameters and state, and the function to call once the
    step has run: it copies every entry that was not written.
    """
    containers: list[ParamDict] = []
    bare: list[Tensor] = []

    def gather(node: Any) -> None:
        if isinstance(node, ParamDict):
            containers.append(node)
        elif isinstance(node, Tensor):
            bare.append(node)
        elif isinstance(node, tuple):
            for field in cast("tuple[object, ...]", node):
                gather(field)
        elif node is not None and not isinstance(node, (int, float, str)):
            bare.extend(t for t in pytree.tree_leaves(node) if isinstance(t, Tensor))

    gather(state)
    made = iter(_copies(bare, recorded=recorded))
    twins = [lazy(c, exact=exact) for c in containers]
    lazies = iter(twins)

    def remade(node: Any) -> Any:
        if isinstance(node, ParamDict):
            return next(lazies)
        if isinstance(node, Tensor):
            return next(made)
        if isinstance(node, tuple):
            given = cast("tuple[object, ...]", node)
            fields: list[object] = [remade(field) for field in given]
            build = cast("Callable[..., object]", type(given))
            return build(*fields) if hasattr(given, "_fields") else build(fields)
        if node is None or isinstance(node, (int, float, str)):
            return node
        leaves, spec = pytree.tree_flatten(node)
        return pytree.tree_unflatten(
            [next(made) if isinstance(x, Tensor) else x for x in leaves], spec
        )

    new_state = cast(S, remade(state))
    new_params = lazy(params, exact=exact)
    written = [new_params, *twins]
    given = [params._vals, *[c._vals for c in containers]]

    def finish() -> None:
        owned(written, given)

    return new_params, new_state, finish
