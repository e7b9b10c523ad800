"""Calling `torch._foreach_*` kernels, with a per-entry fallback under `vmap`.

torch 2.13 has no vmap batching rules for the foreach kernels, so inside
`torch.func.vmap` (where tensors are batched) a foreach call raises. `call` catches that
and runs the same operation one entry at a time with the matching `torch` function,
which vmap does support. Outside vmap the fallback never runs and costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["call"]

ForeachOp = Callable[..., Sequence[Tensor]]


def _max(x: Tensor, y: Any) -> Tensor:
    return torch.maximum(x, y) if isinstance(y, Tensor) else torch.clamp_min(x, y)


def _min(x: Tensor, y: Any) -> Tensor:
    return torch.minimum(x, y) if isinstance(y, Tensor) else torch.clamp_max(x, y)


def _addcmul(x: Tensor, a: Tensor, b: Tensor, value: Any = 1) -> Tensor:
    return torch.addcmul(x, a, b, value=value)


def _addcdiv(x: Tensor, a: Tensor, b: Tensor, value: Any = 1) -> Tensor:
    return torch.addcdiv(x, a, b, value=value)


def _norm(x: Tensor, order: Any = 2, dtype: Any = None) -> Tensor:
    out: Tensor = torch.linalg.vector_norm(x, order, dtype=dtype)
    return out


_ENTRYWISE: dict[str, Callable[..., Tensor]] = {
    "maximum": _max,
    "minimum": _min,
    "addcmul": _addcmul,
    "addcdiv": _addcdiv,
    "norm": _norm,
}


def _is_batched(args: Sequence[Any]) -> bool:
    for arg in args:
        items = arg if isinstance(arg, (list, tuple)) else (arg,)
        for item in items:
            if isinstance(item, Tensor) and torch._C._functorch.is_batchedtensor(item):
                return True
    return False


def _per_entry(
    op: ForeachOp, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[Tensor]:
    name = op.__name__.removeprefix("_foreach_")
    fn = _ENTRYWISE.get(name) or getattr(torch, name)
    n = next(len(a) for a in args if isinstance(a, (list, tuple)))

    def pick(arg: Any, i: int) -> Any:
        return arg[i] if isinstance(arg, (list, tuple)) else arg

    return [
        fn(*(pick(a, i) for a in args), **{k: pick(v, i) for k, v in kwargs.items()})
        for i in range(n)
    ]


def call(op: ForeachOp, *args: Any, **kwargs: Any) -> list[Tensor]:
    """Run the foreach kernel `op`, or the same operation per entry under vmap.

    Args:
        op: A `torch._foreach_*` function (out of place).
        *args: Its arguments: lists are split per entry, anything else is shared.
        **kwargs: Its keyword arguments, split the same way.

    Returns:
        The results, one tensor per entry.

    Raises:
        RuntimeError: Whatever the kernel raised, when not caused by vmap.
    """
    try:
        return list(op(*args, **kwargs))
    except RuntimeError:
        if not _is_batched([*args, *kwargs.values()]):
            raise
    return _per_entry(op, args, kwargs)
