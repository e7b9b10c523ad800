"""Copies made by the first write: the containers an out-of-place step writes into.

An optimizer's `step` leaves the tensors it is handed unchanged, yet its rule writes
in place (`m.lerp_(g, 0.1)`). Copying every tensor first costs a pass over memory
and a kernel (one `clone` per tensor where autograd records). Instead `step` can
hand the rule containers marked `_pending`: the first in-place
method called on such a container runs the out-of-place foreach kernel on the
sources (`torch._foreach_lerp` for `lerp_`), which computes what the in-place one
would write, and the container holds the results from then on. The same kernel on
the same values: the same bytes, without the copy. What was never written is copied
at the end (`owned`), so nothing returned shares memory with what was given.

Only ParamDict's in-place methods know the difference: a rule that writes into a
tensor it took out of such a container (`p["w"].add_(1)`) would write into the
source, so an optimizer says that its rule does not (`Optimizer.lazy_copies`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import Tensor

from ._foreach import copy_

if TYPE_CHECKING:
    from ._container import _Container

__all__ = ["OUT_OF_PLACE", "lazy", "mixed", "owned", "pending", "rebind"]

C = TypeVar("C", bound="_Container")


OUT_OF_PLACE: dict[Callable[..., Any], Callable[..., Any]] = {
    torch._foreach_add_: torch._foreach_add,
    torch._foreach_sub_: torch._foreach_sub,
    torch._foreach_mul_: torch._foreach_mul,
    torch._foreach_div_: torch._foreach_div,
    torch._foreach_pow_: torch._foreach_pow,
    torch._foreach_lerp_: torch._foreach_lerp,
    torch._foreach_addcmul_: torch._foreach_addcmul,
    torch._foreach_addcdiv_: torch._foreach_addcdiv,
    torch._foreach_maximum_: torch._foreach_maximum,
    torch._foreach_minimum_: torch._foreach_minimum,
    torch._foreach_clamp_min_: torch._foreach_clamp_min,
    torch._foreach_clamp_max_: torch._foreach_clamp_max,
    torch._foreach_sqrt_: torch._foreach_sqrt,
    torch._foreach_neg_: torch._foreach_neg,
    torch._foreach_abs_: torch._foreach_abs,
    torch._foreach_sign_: torch._foreach_sign,
    torch._foreach_reciprocal_: torch._foreach_reciprocal,
    torch._foreach_exp_: torch._foreach_exp,
    torch._foreach_log_: torch._foreach_log,
}
"""Each in-place foreach kernel's out-of-place twin (`zero_` and `copy_` have none)."""


def lazy(container: C, *, exact: bool = False) -> C:
    """A new container of `container`'s type, keys and tensors, held as sources.

    `exact`: its entries differ in dtype or some are 0-dim, so the dtype of
    each result of a first write is checked (not the first one's alone).
    """
    twin = container._derive(container._vals)
    twin._pending = 2 if exact else 1
    return twin


def mixed(container: Any) -> bool:
    """Whether `container`'s entries differ in dtype or some are 0-dim."""
    vals: list[Tensor] = container._vals
    return len({v.dtype for v in vals}) > 1 or any(v.dim() == 0 for v in vals)


def pending(container: Any) -> bool:
    """Whether `container` (a ParamDict) still holds its sources."""
    return bool(container._pending)


def rebind(container: Any, values: list[Tensor]) -> None:
    """Make `container` hold `values` (new tensors of its keys), as if written.

    The one place a ParamDict's tensors are replaced: its value list and its
    mapping both, so every way of reading it sees the new tensors.
    """
    container._vals = values
    container._pending = 0
    dict.update(container, zip(container._keys, values))  # pyright: ignore[reportUnknownMemberType]  # dict's own, as `_Container._from_parts` writes it


def owned(containers: Sequence[Any], sources: Sequence[Sequence[Tensor]]) -> None:
    """Copy every entry of `containers` that still holds its source.

    `sources[i]` is the value list `containers[i]` was handed: an entry whose
    tensor is still that object was never written, and gets a copy. One
    `torch._foreach_copy_` for all of them (a `clone` each where autograd
    records).
    """
    stale = [
        [i for i, (v, s) in enumerate(zip(c._vals, given)) if v is s]
        if any(map(operator.is_, c._vals, given))
        else []
        for c, given in zip(containers, sources)
    ]
    olds = [c._vals[i] for c, found in zip(containers, stale) for i in found]
    if not olds:
        return
    if torch.is_grad_enabled() and any(t.requires_grad for t in olds):
        news = [t.clone() for t in olds]
    else:
        news = [torch.empty_like(t) for t in olds]
        copy_(news, olds)
    made = iter(news)
    for container, found in zip(containers, stale):
        if found:
            values = list(container._vals)
            for i in found:
                values[i] = next(made)
            rebind(container, values)
