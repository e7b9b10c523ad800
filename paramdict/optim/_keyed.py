"""Keyed plumbing the optimizers share: aligned gradients, subsets, leaf flags.

These are the few steps an optimizer takes that are about keys and autograd flags
rather than arithmetic; the arithmetic itself is ParamDict's own vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from torch import Tensor

from .._paramdict import ParamDict

__all__ = ["aligned_grads", "check_real", "requires_grad_like", "subset"]

P = TypeVar("P", bound=ParamDict)


def aligned_grads(params: ParamDict, grads: Mapping[str, Tensor], /) -> ParamDict:
    """Return `grads` as a ParamDict in `params`' key order.

    A ParamDict that already has `params`' keys in the same order is returned as
    it is; anything else is reordered (no tensor is copied).

    Raises:
        ValueError: If the keys differ; the message names them.
        TypeError: If a value is not a tensor.
    """
    if isinstance(grads, ParamDict) and tuple(grads) == tuple(params):
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
    new.filter(lambda key, _: old[key].requires_grad).requires_grad_()
    return new


def check_real(params: ParamDict, /) -> None:
    """Raise unless every value is a real floating-point tensor.

    Raises:
        TypeError: Naming the entries that are complex or not floating point.
    """
    bad = sorted(
        k for k, v in params.items() if not v.is_floating_point() or v.is_complex()
    )
    if bad:
        msg = (
            f"The optimizers update real floating-point tensors; {bad!r} are not. "
            "Leave them out with `.exclude(...)` or convert them with `.to(dtype)`."
        )
        raise TypeError(msg)
