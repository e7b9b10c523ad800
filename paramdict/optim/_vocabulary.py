"""The kernel vocabulary every update rule is written in, and its functional kernels.

A rule (`TorchOptimizer.math`) never calls ParamDict arithmetic or torch directly
for the work on its buffers: it calls the operations of `KernelVocabulary` on an
`ops` object, so the same rule runs in every mode:

- `Kernels` (here, functional): out of place, the mode of a default `step` (run
  under `torch.no_grad()`); `addcdiv` is one fused foreach call.
- `RecordedKernels` (differentiable; `_vocabulary_recorded.py`): out of place, with
  every operation one that autograd can differentiate for any mix of entry
  shapes.
- `InPlaceKernels` (`_vocabulary_inplace.py`): writes each result into its first
  operand when the rule owns that operand, the base of an in-place `step_`;
  bitwise `Kernels`.
"""

from __future__ import annotations

# pyright: reportPrivateImportUsage=false, reportPrivateUsage=false
# (`is_functorch_wrapped_tensor` has a private name only; `_derive` is
# ParamDict's own package-internal constructor)
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._hyper import Rate, compute_dtype, decay_factor, is_zero
from ._matrix import newton_schulz

__all__ = ["KernelVocabulary", "Kernels", "P"]

P = TypeVar("P", bound=ParamDict)


class KernelVocabulary(Protocol):
    """The operations a rule computes with, whichever kernels run them.

    `x` is a ParamDict (the result has its type and keys); other ParamDict
    operands are aligned to `x`'s keys. A *rate* is a number, a 0-dim tensor or
    a per-key ParamDict (any shape that broadcasts to the entry), so no rule
    branches on the type of `lr`; numbers are passed to torch as `torch.optim`
    passes them, which keeps its rounding.

    | operation | result |
    | --- | --- |
    | `scalar(value)` | `value`, a 0-dim tensor of the shared dtype |
    | `item(value)` | a 0-dim tensor's number where the step can read it |
    | `borrowed(x)` | `x`, still readable after the operation it is given to |
    | `subset(x, keys)` | the entries under `keys`, in that order |
    | `copy(x, source)` | `source`'s values, as a new ParamDict or in `x` |
    | `neg`, `sqrt`, `sign`, `abs`, `reciprocal` `(x)` | elementwise |
    | `mul(x, rate)` | `x * rate` |
    | `div(x, value)`, `add(x, value)` | `x / value`, `x + value` |
    | `decay(x, lr, weight_decay)` | `x * (1 - lr * weight_decay)` |
    | `add_scaled(x, y, rate)` | `x + rate * y` |
    | `sub_scaled(x, y, rate)` | `x - rate * y` |
    | `lerp(x, end, weight)` | `x + weight * (end - x)` |
    | `addcmul(x, a, b, value)` | `x + value * a * b` |
    | `addcdiv(x, a, b, value)` | `x + value * a / b` |
    | `maximum(x, other)` | the elementwise maximum |
    | `clamp(x, min, max)` | `x` within `[min, max]` (numbers) |
    | `eq(x, value)` | the boolean mask `x == value` |
    | `masked_fill(x, mask, value)` | `x` with `value` where `mask` holds |
    | `where(condition, x, other)` | `x` if the 0-dim bool holds, else `other` |
    | `sub_scaled_by_key(x, y, rates)` | `x - rates[k] * y`, key by key |
    | `apply(x, fn, *others)` | `fn(x[k], *(o[k] for o in others))`, key by key |
    | `orthogonalize(x, coefficients, steps, eps)` | Muon's Newton-Schulz update |

    `div` takes a ParamDict divisor too; `add`, `lerp`'s weight and `addcmul`'s
    value are scalars. A number rate is one fused call where torch has one, and
    `decay` by the number zero returns `x` itself. A tensor `addcdiv` value
    multiplies `a` first, as `torch.optim` does. `sub_scaled_by_key` reads a
    0-dim tensor rate as `torch.optim` does (`.item()`) outside autograd and
    tracing. `apply` is for work with no foreach kernel (reductions, matrix
    products); its `fn` writes into nothing, and keeps each entry's shape and
    dtype where `x` is written in place. `orthogonalize` runs in bfloat16, as
    `torch.optim.Muon`. `item` reads the number on the host (`.item()`, as
    `torch.optim` reads its step-dependent scalars) in an eager step outside
    autograd, so that a rule can branch on it; compiled, under a `torch.func`
    transform or recorded, it returns the tensor, and the rule selects with
    `where` instead.

    The one rule for authors: an operation may consume its first operand. Write
    `x = ops.op(x, ...)` when `x`'s old value is no longer needed, and pass
    `ops.borrowed(x)` as the first operand when it still is (free in every
    mode). `InPlaceKernels` checks it: a consumed ParamDict given as a first
    operand again raises instead of reading the value written into it.

    Example:
        An Adagrad step from a zero sum, in the vocabulary:

        >>> from paramdict import optim
        >>> p, g = ParamDict(w=torch.tensor([1.0, 4.0])), ParamDict(w=torch.ones(2))
        >>> ops = optim.Kernels.for_params(p)
        >>> total = ops.addcmul(p.zeros_like(), g, g)
        >>> std = ops.add(ops.sqrt(ops.borrowed(total)), 1e-10)
        >>> ops.addcdiv(p, g, std, -0.5)["w"], total["w"]
        (tensor([0.5000, 3.5000]), tensor([1., 1.]))
    """

    __slots__ = ()

    def scalar(self, value: float | Tensor, /) -> Any:
        """Return `value` as the scalar operand for entries of the shared dtype."""
        ...

    def item(self, value: Tensor, /) -> float | Tensor:
        """Return the 0-dim `value`'s number where the step reads it, else `value`."""
        ...

    def borrowed(self, x: P, /) -> P:
        """Return `x` for a first operand whose old value is still needed."""
        ...

    def copy(self, x: P, source: ParamDict, /) -> P:
        """Return `source`'s values in new tensors, or written into `x`."""
        ...

    def subset(self, x: P, keys: tuple[str, ...], /) -> P:
        """Return the entries of `x` under `keys`."""
        ...

    def neg(self, x: P, /) -> P:
        """Return `-x`."""
        ...

    def sqrt(self, x: P, /) -> P:
        """Return the square root of `x`."""
        ...

    def sign(self, x: P, /) -> P:
        """Return the sign of `x`."""
        ...

    def abs(self, x: P, /) -> P:
        """Return `|x|`."""
        ...

    def reciprocal(self, x: P, /) -> P:
        """Return `1 / x` (`torch.reciprocal`, as torch computes `number / tensor`)."""
        ...

    def mul(self, x: P, rate: Rate, /) -> P:
        """Return `x * rate`."""
        ...

    def div(self, x: P, value: float | Tensor | ParamDict, /) -> P:
        """Return `x / value`."""
        ...

    def add(self, x: P, value: float | Tensor, /) -> P:
        """Return `x + value` for a scalar `value` (such as `eps`)."""
        ...

    def decay(self, x: P, lr: Rate, weight_decay: Rate, /) -> P:
        """Return `x * (1 - lr * weight_decay)`: decoupled weight decay (AdamW)."""
        ...

    def add_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        """Return `x + rate * y`."""
        ...

    def sub_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        """Return `x - rate * y`."""
        ...

    def lerp(self, x: P, end: ParamDict, weight: float | Tensor, /) -> P:
        """Return `x + weight * (end - x)`."""
        ...

    def addcmul(self, x: P, a: ParamDict, b: ParamDict, value: float = 1, /) -> P:
        """Return `x + value * a * b`."""
        ...

    def addcdiv(self, x: P, a: ParamDict, b: ParamDict, value: Rate = 1, /) -> P:
        """Return `x + value * a / b`, rounded as `torch.optim` rounds it."""
        ...

    def maximum(self, x: P, other: ParamDict, /) -> P:
        """Return the elementwise maximum of `x` and `other`."""
        ...

    def clamp(self, x: P, min: float, max: float, /) -> P:  # torch's names
        """Return `x` clamped to `[min, max]`."""
        ...

    def eq(self, x: ParamDict, value: float, /) -> ParamDict:
        """Return the boolean mask `x == value`."""
        ...

    def masked_fill(self, x: P, mask: ParamDict, value: float, /) -> P:
        """Return `x` with `value` where the boolean `mask` holds."""
        ...

    def where(self, condition: Tensor, x: P, other: ParamDict, /) -> P:
        """Return `x` where the 0-dim bool `condition` holds, else `other`."""
        ...

    def sub_scaled_by_key(
        self, x: P, y: ParamDict, rates: Mapping[str, float | Tensor], /
    ) -> P:
        """Return `x - rates[k] * y` entry by entry, one rate per key."""
        ...

    def apply(self, x: P, fn: Callable[..., Tensor], /, *others: ParamDict) -> P:
        """Return `fn(x[k], *(o[k] for o in others))` for each key `k` of `x`."""
        ...

    def orthogonalize(
        self, x: P, coefficients: tuple[float, float, float], steps: int, eps: float, /
    ) -> P:
        """Return each matrix of `x` orthogonalized by Newton-Schulz iterations."""
        ...


def _computed_once(value: Tensor) -> Tensor:
    """Return `value` (0-dim) such that the compiler computes it once per step.

    Inductor inlines a 0-dim expression into every loop that reads it and
    recomputes it at each vectorized iteration: the bias corrections' `pow` and
    `sqrt` of the step then cost more than the update itself (a compiled Adam
    step took 2.9x torch's fused kernel at 20M parameters). A reduction is
    computed into a buffer before the loops run; the maximum of two copies of
    `value` is `value` exactly (signed zeros and NaN included).
    """
    return value.reshape(1).expand(2).amax()


def _hoisted(value: Any) -> Any:
    """`value`, computed once per step if it is a 0-dim tensor and traced.

    For the tensor operands that reach a kernel other than through
    `Kernels.scalar` (a `where` condition, an `alpha`, a `lerp` weight).
    """
    if isinstance(value, Tensor) and value.dim() == 0 and torch.compiler.is_compiling():
        return _computed_once(value)
    return value


class Kernels(KernelVocabulary):
    """The functional kernels: every operation returns new ParamDicts.

    The operations are `KernelVocabulary`'s (its table). Built for one step from
    the parameters (`Kernels.for_params`), it knows the dtype they share, so
    that scalars take torch's fastest path with torch's rounding. Every method
    leaves its arguments unchanged.

    Args:
        dtype: The dtype every entry shares when it is float32 or float64, else
            `None` (scalars are then passed as they are).
        device: The device of the entries (for scalar operands).

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> ops = optim.Kernels.for_params(p)
        >>> ops.lerp(p, p.zeros_like(), 0.5)["w"], p["w"], ops.scalar(0.5)
        (tensor([0.5000, 1.0000]), tensor([1., 2.]), tensor(0.5000))
    """

    __slots__ = ("device", "dtype")
    dtype: torch.dtype | None
    """The dtype rates are computed in (`None` where the entries' dtypes differ)."""
    device: torch.device
    """The device of the entries."""

    def __init__(self, dtype: torch.dtype | None, device: torch.device) -> None:
        self.dtype = dtype
        self.device = device

    @classmethod
    def for_params(cls, params: ParamDict, /) -> Kernels:
        """Return kernels for one step on `params` (their shared dtype and device).

        Args:
            params: The parameters of the step.

        Returns:
            Kernels of this class for them.

        Example:
            >>> from paramdict import optim
            >>> ops = optim.Kernels.for_params(ParamDict(w=torch.ones(2)))
            >>> ops.dtype, ops.device
            (torch.float32, device(type='cpu'))
        """
        first = params._vals[0] if params else None
        device = first.device if first is not None else torch.device("cpu")
        return cls(compute_dtype(params), device)

    @override
    def scalar(self, value: float | Tensor, /) -> Any:
        if self.dtype is None:
            return value  # half precision or mixed dtypes: torch's own promotion
        if isinstance(value, Tensor):
            value = value.to(self.dtype)
            return _computed_once(value) if torch.compiler.is_compiling() else value
        if self.device.type != "cpu" and not torch.compiler.is_compiling():
            # On an accelerator a number is an argument of the kernel (rounded to
            # the entries' dtype there, as a 0-dim tensor of it would be): a
            # tensor would cost a launch to fill and, in `add`, a host read.
            return value
        return torch.full((), value, dtype=self.dtype, device=self.device)

    @override
    def item(self, value: Tensor, /) -> float | Tensor:
        if torch.compiler.is_compiling() or (
            torch._C._functorch.is_functorch_wrapped_tensor(value)
        ):
            return value
        return value.item()

    @override
    def borrowed(self, x: P, /) -> P:
        return x

    @override
    def copy(self, x: P, source: ParamDict, /) -> P:
        return x._derive([v.clone() for v in x._aligned(source, what="`copy`")])

    @override
    def subset(self, x: P, keys: tuple[str, ...], /) -> P:
        return type(x)((k, x[k]) for k in keys)

    @override
    def neg(self, x: P, /) -> P:
        return x.neg()

    @override
    def sqrt(self, x: P, /) -> P:
        return x.sqrt()

    @override
    def sign(self, x: P, /) -> P:
        return x.sign()

    @override
    def abs(self, x: P, /) -> P:
        return x.abs()

    @override
    def reciprocal(self, x: P, /) -> P:
        return x.reciprocal()

    @override
    def mul(self, x: P, rate: Rate, /) -> P:
        if isinstance(rate, ParamDict):
            return x.mul(rate)
        return x.mul(self.scalar(rate))

    @override
    def div(self, x: P, value: float | Tensor | ParamDict, /) -> P:
        if isinstance(value, ParamDict):
            return x.div(value)
        return x.div(self.scalar(value))

    @override
    def add(self, x: P, value: float | Tensor, /) -> P:
        return x.add(self.scalar(value))

    @override
    def decay(self, x: P, lr: Rate, weight_decay: Rate, /) -> P:
        if is_zero(weight_decay):
            return x
        # With two numbers the factor is the Python float `torch.optim` computes.
        return self.mul(x, decay_factor(lr, weight_decay))

    @override
    def add_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        if isinstance(rate, ParamDict):
            return x.add(y.mul(rate))
        return x.add(y, alpha=_hoisted(rate))

    @override
    def sub_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        if isinstance(rate, ParamDict):
            return x.sub(y.mul(rate))
        return x.sub(y, alpha=_hoisted(rate))

    @override
    def lerp(self, x: P, end: ParamDict, weight: float | Tensor, /) -> P:
        return x.lerp(end, _hoisted(weight))

    @override
    def addcmul(self, x: P, a: ParamDict, b: ParamDict, value: float = 1, /) -> P:
        return x.addcmul(a, b, value=value)

    @override
    def addcdiv(self, x: P, a: ParamDict, b: ParamDict, value: Rate = 1, /) -> P:
        if isinstance(value, (Tensor, ParamDict)):
            # `Kernels.mul`, not `self.mul`: `a` is read, never consumed.
            return x.addcdiv(Kernels.mul(self, a, value), b)
        return x.addcdiv(a, b, value=value)

    @override
    def maximum(self, x: P, other: ParamDict, /) -> P:
        return x.maximum(other)

    @override
    def clamp(self, x: P, min: float, max: float, /) -> P:  # torch's names
        return x.clamp(min, max)

    @override
    def eq(self, x: ParamDict, value: float, /) -> ParamDict:
        return x.map(lambda v: v.eq(value))

    @override
    def masked_fill(self, x: P, mask: ParamDict, value: float, /) -> P:
        return x.map(lambda v, m: v.masked_fill(m, value), mask)

    @override
    def where(self, condition: Tensor, x: P, other: ParamDict, /) -> P:
        return x.where(ParamDict.fromkeys(x, _hoisted(condition)), other)

    @override
    def sub_scaled_by_key(
        self, x: P, y: ParamDict, rates: Mapping[str, float | Tensor], /
    ) -> P:
        return x._derive([self._sub_scaled(v, y[k], rates[k]) for k, v in x.items()])

    def _sub_scaled(self, x: Tensor, y: Tensor, rate: float | Tensor) -> Tensor:
        if isinstance(rate, Tensor) and rate.dim() == 0:
            rate = self.item(rate)  # torch.optim's `_to_scalar`
        if isinstance(rate, Tensor):
            return torch.sub(x, y * rate.to(x.dtype))
        # `to` only where needed: a call per entry, even when it returns `y`.
        return torch.add(x, y if y.dtype == x.dtype else y.to(x.dtype), alpha=-rate)

    @override
    def apply(self, x: P, fn: Callable[..., Tensor], /, *others: ParamDict) -> P:
        return x._derive([fn(v, *(other[k] for other in others)) for k, v in x.items()])

    @override
    def orthogonalize(
        self, x: P, coefficients: tuple[float, float, float], steps: int, eps: float, /
    ) -> P:
        return x._derive(
            [newton_schulz(v, coefficients, steps, eps) for v in x.values()]
        )
