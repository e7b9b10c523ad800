"""Memory layouts on the fused paths: what torch's fused kernels need, and copies.

torch's fused optimizer kernels (`torch._fused_adam_`, ...) walk the memory of each
parameter, gradient and buffer as one flat run of `numel` elements: they read an
entry's strides from none of them. That is right only when every tensor of an entry
is dense (its elements fill one block of memory, no gaps, no overlaps) and all of
them share one layout, so that the same offset holds the same element everywhere.
`torch.optim` meets this by construction (autograd gives `.grad` the parameter's
layout, and buffers are made with `zeros_like`); here gradients come from anywhere
(`params.grad` through `einsum`, transposes, slices, channels-last convolutions),
so each fused call is planned here first:

- `step_` (in place): each parameter must be dense and each buffer of the state
  must have its parameter's strides (they are written in place); a gradient of
  another layout is copied into its parameter's (read only, one pass for that
  entry alone). Anything else takes the rule, whose foreach kernels follow
  strides.
- `step` (on copies): the copies are made in the layout the kernel needs (the
  parameter's when it is dense, else contiguous), so any layout can be fused.

The checks compare strides (`Tensor.stride`), never copy, on the common path where
every tensor is already laid out alike.
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (ParamDict's package-internal alignment)
from functools import partial
from typing import Any, TypeVar, cast

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .._paramdict import ParamDict
from ._repeat import kept_alike, known_entries

__all__ = ["dense", "fused_copies", "in_place_grads", "not_writable_by_kernel"]

S = TypeVar("S")
P = TypeVar("P", bound=ParamDict)

_stride = Tensor.stride
Strides = tuple[int, ...]
_is_contiguous = Tensor.is_contiguous


def dense(t: Tensor, /) -> bool:
    """Whether `t`'s elements fill one block of its memory, each once (any order).

    A contiguous tensor is; so is a transposed or channels-last one. A slice with
    a step (`base[:, ::2]`) has gaps, an `expand`ed tensor overlaps: neither is.

    Example:
        >>> base = torch.zeros(3, 4)
        >>> dense(base.t()), dense(base[:, ::2]), dense(base[:1].expand(3, 4))
        (True, False, False)
    """
    if _is_contiguous(t) or t.numel() == 0:
        return True
    expected = 1
    for size, stride in sorted(
        ((s, st) for s, st in zip(t.shape, _stride(t)) if s != 1), key=lambda d: d[1]
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def _buffers(params: ParamDict, state: object) -> list[list[Tensor]]:
    """The state's buffers keyed like `params`, each as a list in `params`' order."""
    fields = cast("tuple[object, ...]", state) if isinstance(state, tuple) else ()
    found: list[list[Tensor]] = []
    for field in fields:
        if isinstance(field, ParamDict) and field and field.keys() == params.keys():
            found.append(params._aligned(field, what="The state"))
    return found


def not_writable_by_kernel(params: ParamDict, state: object) -> list[str]:
    """Return the keys a fused kernel cannot update in place, sorted.

    An entry is writable when its parameter is dense and every buffer of the
    state has the parameter's strides.
    """
    values = params._vals
    strides = list(map(_stride, values))
    buffers = _buffers(params, state)
    if all(map(_is_contiguous, values)) and all(
        list(map(_stride, b)) == strides for b in buffers
    ):
        return []
    keys = params._keys
    bad = {keys[i] for i, p in enumerate(values) if not dense(p)}
    for b in buffers:
        bad.update(
            keys[i]
            for i, (t, s) in enumerate(zip(b, strides))
            if _stride(t) != s and t.numel()
        )
    return sorted(bad)


def _like(t: Tensor, layout: Tensor) -> Tensor:
    """`t`, or a copy of it in `layout`'s strides when its own differ."""
    if _stride(t) == _stride(layout):
        return t
    return torch.empty_like(layout).copy_(t)


def in_place_grads(
    params: ParamDict, grads: ParamDict, strides: list[Strides] | None = None
) -> ParamDict:
    """Return `grads` with each entry in its (dense) parameter's layout.

    The common case, every gradient laid out as its parameter, returns `grads`
    itself; otherwise only the entries whose strides differ are copied. `strides`
    are those of `params`' entries when the caller has them already (or
    `step_` read them: `_repeat.known_entries`).
    """
    values = params._vals
    given = params._aligned(grads, what="The gradients")
    if strides is None:
        check = partial(_strided_as, params, given)
        alike = kept_alike(params, given, "strides", check)
    else:
        alike = list(map(_stride, given)) == strides
    if alike:
        return grads
    return params._derive([_like(g, p) for g, p in zip(given, values)])


def _strided_as(params: ParamDict, given: list[Tensor]) -> bool:
    """Whether each of `given` has the strides of its parameter."""
    entries = known_entries(params)
    strides = list(map(_stride, params._vals)) if entries is None else entries.strides
    return list(map(_stride, given)) == strides


def fused_copies(params: P, grads: ParamDict, state: S) -> tuple[P, ParamDict, S]:
    """Return copies of `params` and `state`, and `grads`, laid out for a kernel.

    Each parameter is copied (a dense parameter keeps its strides, any other
    becomes contiguous); each buffer of the state keyed like `params` is copied
    into its parameter copy's layout (all of them in one `_foreach_copy_`), every
    other tensor of the state is cloned, and each gradient whose strides differ
    from its parameter copy's is copied into that layout. The copies hold no
    history. Run it under `torch.no_grad()`.
    """
    values = params._vals
    copies = list(map(torch.empty_like, values))  # a dense layout keeps its strides
    targets, sources = [copies], [values]
    new_params = params._derive(copies)
    if hasattr(state, "_fields") and isinstance(state, tuple):  # a NamedTuple state
        fields = cast("tuple[Any, ...]", state)
        new_state = type(fields)(
            *[_copied_field(params, copies, f, targets, sources) for f in fields]
        )
    else:
        new_state = _clone_all(state)
    # One pass of copies (each into its target's strides) for all aligned tensors.
    torch._foreach_copy_(
        [t for ts in targets for t in ts], [s for ss in sources for s in ss]
    )
    strides = list(map(_stride, copies))
    return new_params, in_place_grads(new_params, grads, strides), cast(S, new_state)


def _copied_field(
    params: ParamDict,
    layouts: list[Tensor],
    field: Any,
    targets: list[list[Tensor]],
    sources: list[list[Tensor]],
) -> Any:
    """`field` with new tensors to be filled from `sources` into `targets`."""
    if isinstance(field, ParamDict) and field and field.keys() == params.keys():
        keys = field._keys
        if keys != params._keys:  # the same keys in another order
            by_key = dict(zip(params._keys, layouts))
            layouts = [by_key[k] for k in keys]
        made = list(map(torch.empty_like, layouts))
        targets.append(made)
        sources.append(list(field._vals))
        return field._derive(made)
    return _clone_all(field)


def _clone_all(leaf: Any) -> Any:
    """`leaf` with every tensor in it cloned: a field, a ParamDict, a schedule."""
    if isinstance(leaf, ParamDict):
        return leaf._derive([t.clone() for t in leaf._vals])
    if isinstance(leaf, Tensor):
        return leaf.clone()
    if hasattr(leaf, "_fields") and isinstance(leaf, tuple):  # a NamedTuple
        fields = cast("tuple[object, ...]", leaf)
        return type(fields)(*[_clone_all(f) for f in fields])
    return pytree.tree_map(_clone_tensor, leaf)  # anything else: generically


def _clone_tensor(leaf: Any) -> Any:
    return leaf.clone() if isinstance(leaf, Tensor) else leaf
