"""Keyed plumbing the optimizers share: aligned gradients, subsets, leaf flags.

These are the few steps an optimizer takes that are about keys and autograd flags
rather than arithmetic; the arithmetic itself is ParamDict's own vocabulary.
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (ParamDict's and torch's package-internal helpers)
import operator
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import TypeVar, cast

import torch
from torch import Tensor

from .._paramdict import ParamDict
from ._repeat import kept, kept_alike, known_entries

__all__ = [
    "aligned_grads",
    "check_grads",
    "check_keyed",
    "check_real",
    "finished",
    "requires_grad_like",
    "subset",
]

P = TypeVar("P", bound=ParamDict)

_size = Tensor.size
_dtype = cast("Callable[[Tensor], torch.dtype]", operator.attrgetter("dtype"))
_device = cast("Callable[[Tensor], torch.device]", operator.attrgetter("device"))
_layout = cast("Callable[[Tensor], torch.layout]", operator.attrgetter("layout"))


def aligned_grads(params: ParamDict, grads: Mapping[str, Tensor], /) -> ParamDict:
    """Return `grads` as a ParamDict in `params`' key order.

    A ParamDict that already has `params`' keys in the same order is returned as
    it is; anything else is reordered (no tensor is copied).

    Raises:
        ValueError: If the keys differ; the message names them.
        TypeError: If a value is not a tensor.
    """
    if isinstance(grads, ParamDict) and (
        grads._keys is params._keys or grads._keys == params._keys
    ):
        return grads
    values = params._aligned(grads, what="`step` (params and grads)")
    return ParamDict(zip(params, values))


def subset(params: P, keys: Iterable[str], /) -> P:
    """Return the entries of `params` under exactly `keys`, in that order.

    Unlike `select`, keys are not patterns, so any character in them is literal.
    """
    return type(params)((k, params[k]) for k in keys)


def requires_grad_like(new: P, old: ParamDict, /) -> P:
    """Mark each fresh value of `new` as requiring grad where `old`'s value did.

    `new` holds tensors made under `torch.no_grad()`, leaves with no history, so
    setting the flag on them in place changes nothing anyone else holds.

    Returns:
        `new` itself.
    """
    olds = old._vals if new._keys == old._keys else [old[k] for k in new._keys]
    for value, was in zip(new._vals, olds):
        if was.requires_grad:
            value.requires_grad_()
    return new


def check_real(params: ParamDict, /) -> None:
    """Raise unless every value is a real floating-point tensor.

    Raises:
        TypeError: Naming the entries that are complex or not floating point.
    """
    if all(d.is_floating_point for d in {v.dtype for v in params.values()}):
        return  # complex dtypes are not `is_floating_point`; one set per call
    bad = sorted(
        k for k, v in params.items() if not v.is_floating_point() or v.is_complex()
    )
    if bad:
        msg = (
            f"The optimizers update real floating-point tensors; {bad!r} are not. "
            "Leave them out with `.exclude(...)` or convert them with `.to(dtype)`."
        )
        raise TypeError(msg)


def _mismatch(params: ParamDict, other: ParamDict) -> tuple[list[str], list[str]]:
    """Return the keys whose shapes differ, and those whose dtype or device do."""
    shapes: list[str] = []
    kinds: list[str] = []
    for key, p in params.items():
        o = other[key]
        if o.shape != p.shape:
            shapes.append(key)
        elif o.dtype != p.dtype or o.device != p.device or o.layout != torch.strided:
            kinds.append(key)
    return sorted(shapes), sorted(kinds)


def _describe(params: ParamDict, other: ParamDict, keys: list[str]) -> str:
    return ", ".join(
        f"{k!r}: {tuple(other[k].shape)} {other[k].dtype} {other[k].layout} on "
        f"{other[k].device} for {tuple(params[k].shape)} {params[k].dtype} on "
        f"{params[k].device}"
        for k in keys
    )


def check_keyed(params: ParamDict, other: ParamDict, /, *, what: str) -> None:
    """Raise unless each entry of `other` has its parameter's shape and dtype.

    `other` has `params`' keys (checked before). An update never changes a
    parameter's shape or dtype, as `torch.optim` never does; a gradient or
    buffer that would broadcast or promote it is refused instead.

    Raises:
        ValueError: Naming the entries whose shape, dtype, device or layout
            (sparse) differs from the parameter's.
    """
    if _alike(params, other._vals):
        return
    shapes, kinds = _mismatch(params, other)
    bad = shapes or kinds
    msg = (
        f"{what} must match the parameters entry by entry (shape, dtype, device, "
        f"dense layout); {bad!r} do not ({_describe(params, other, bad)}). An "
        "optimizer step never changes a parameter's shape or dtype: convert them "
        "first, e.g. `grads.to(dtype)`, or build the state with `init`."
    )
    raise ValueError(msg)


def _alike(params: ParamDict, values: list[Tensor]) -> bool:
    """Whether `values` match `params`' entries in order: shape, dtype, device.

    And are dense (strided). A `map` per property over all entries, against
    the parameters' lists as `step_` read them already where it did
    (`_repeat.known_entries`): then about half the time of comparing entry by
    entry (Adam's gradients at 160 x 64).
    """
    return kept_alike(params, values, "alike", partial(_compared, params, values))


def _compared(params: ParamDict, values: list[Tensor]) -> bool:
    """`_alike`, read afresh."""
    pvals = params._vals
    if torch.compiler.is_compiling():  # entry by entry: dynamo traces no attrgetter
        return [v.shape for v in values] == [p.shape for p in pvals] and all(
            v.dtype == p.dtype and v.device == p.device and v.layout == torch.strided
            for v, p in zip(values, pvals)
        )
    entries = known_entries(params)
    return (
        list(map(_size, values))
        == (list(map(_size, pvals)) if entries is None else entries.sizes)
        and list(map(_dtype, values))
        == (list(map(_dtype, pvals)) if entries is None else entries.dtypes)
        and list(map(_device, values))
        == (list(map(_device, pvals)) if entries is None else entries.devices)
        and list(map(_layout, values)).count(torch.strided) == len(values)
    )


def check_grads(params: ParamDict, grads: ParamDict, /) -> ParamDict:
    """Raise unless each gradient has its parameter's shape, dtype and device.

    The parameters themselves must be real floating-point tensors (`check_real`):
    an integer parameter is refused by key, not by a kernel's message.

    Returns:
        `grads`, or where one has the negative bit set (a view of negated
        memory, as the imaginary part of a conjugated complex tensor) a copy
        of it with the bit resolved: torch's foreach kernels that write
        (the fused ones, `step_`'s) refuse such an operand.
    """
    kept(params, None, "real", partial(check_real, params))
    check_keyed(params, grads, what="The gradients")
    values = grads._vals
    if torch.compiler.is_compiling() or kept_alike(
        params, values, "not negated", partial(_not_negated, values)
    ):
        return grads
    return grads._derive([g.resolve_neg() for g in values])


def _not_negated(values: list[Tensor]) -> bool:
    return not any(map(Tensor.is_neg, values))


def finished(new: ParamDict, old: P, dtype: torch.dtype | None, /) -> P:
    """Return `new` as `old`'s type, each entry in its parameter's dtype.

    When the parameters share float32 or float64 (`dtype`), every scalar was
    already of that dtype and nothing can have been promoted; otherwise a 0-dim
    half-precision entry may have met a double-precision scalar, and is cast
    back, as `torch.optim` writes its results into the parameter.
    """
    if dtype is not None and type(new) is type(old):
        return new  # pyright: ignore[reportReturnType]  # `type(new) is type(old)`
    values = [
        v if v.dtype == o.dtype else v.to(o.dtype) for v, o in zip(new._vals, old._vals)
    ]
    return old._derive(values)
