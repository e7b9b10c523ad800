"""The kernel vocabulary every update rule is written in, in three implementations.

A rule (`Optimizer.update`) never calls ParamDict arithmetic or torch directly for
the work on its buffers: it calls a small vocabulary on an `ops` object (`lerp`,
`mul`, `decay`, `addcmul`, `addcdiv`, `sqrt`, `sign`, `maximum`, `add_scaled`,
...), so the same rule runs in every mode:

- `Kernels` (functional): out of place, the mode of a default `step` (run under
  `torch.no_grad()`); `addcdiv` is one fused foreach call.
- `RecordedKernels` (differentiable): out of place, with every operation one that
  autograd can differentiate for any mix of entry shapes (`addcdiv` becomes a
  multiplication, a division and an addition that round the same way).
- `InPlaceKernels`: writes each result into its first operand when the rule owns
  that operand (the parameters, the state's buffers, or anything the rule made),
  and runs out of place otherwise (the gradients are never written). This is the
  base of an in-place `step_`; its results are bitwise those of `Kernels`.

Every rate argument accepts a number, a 0-dim tensor or a ParamDict of per-key
values, so no rule branches on the type of `lr`. Scalars are passed to torch the
way `torch.optim` passes them, which keeps its rounding.

The one rule for authors: an operation may consume its first operand. Write
`x = ops.op(x, ...)` when `x`'s old value is no longer needed, and pass
`ops.borrowed(x)` as the first operand when it still is (free in every mode).
"""

from __future__ import annotations

# pyright: reportPrivateImportUsage=false, reportPrivateUsage=false
# (torch's in-place foreach kernels have private names only; `_aligned` is
# ParamDict's own package-internal alignment)
from typing import Any, TypeVar

import torch
from torch import Tensor

from .._paramdict import ParamDict
from ._hyper import Rate, compute_dtype, decay_factor, is_zero

__all__ = ["InPlaceKernels", "Kernels", "RecordedKernels"]

P = TypeVar("P", bound=ParamDict)


class Kernels:
    """The functional kernel vocabulary: every operation returns new ParamDicts.

    Built for one step from the parameters (`Kernels.for_params`), it knows the
    dtype they share, so that scalars take torch's fastest path with torch's
    rounding. Every method leaves its arguments unchanged.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> ops = optim.Kernels.for_params(p)
        >>> ops.lerp(p, p.zeros_like(), 0.5)["w"], p["w"]
        (tensor([0.5000, 1.0000]), tensor([1., 2.]))
    """

    __slots__ = ("device", "dtype")

    def __init__(self, dtype: torch.dtype | None, device: torch.device) -> None:
        self.dtype = dtype
        self.device = device

    @classmethod
    def for_params(cls, params: ParamDict, /) -> Kernels:
        """Return kernels for one step on `params` (their shared dtype and device).

        Args:
            params: The parameters of the step.

        Returns:
            A kernel set of this class.
        """
        first = next(iter(params.values()), None)
        device = first.device if first is not None else torch.device("cpu")
        return cls(compute_dtype(params), device)

    def scalar(self, value: float | Tensor, /) -> Any:
        """Return `value` as the scalar operand for entries of the shared dtype."""
        if self.dtype is None:
            return value  # half precision or mixed dtypes: torch's own promotion
        if isinstance(value, Tensor):
            return value.to(self.dtype)
        return torch.full((), value, dtype=self.dtype, device=self.device)

    def borrowed(self, x: P, /) -> P:
        """Return `x` for use as a first operand whose old value is still needed."""
        return x

    def subset(self, x: P, keys: tuple[str, ...], /) -> P:
        """Return the entries of `x` under `keys` (literal keys, in that order)."""
        return type(x)((k, x[k]) for k in keys)

    def neg(self, x: P, /) -> P:
        """Return `-x`."""
        return x.neg()

    def mul(self, x: P, rate: Rate, /) -> P:
        """Return `x * rate`."""
        if isinstance(rate, ParamDict):
            return x.mul(rate)
        return x.mul(self.scalar(rate))

    def decay(self, x: P, lr: Rate, weight_decay: Rate, /) -> P:
        """Return `x * (1 - lr * weight_decay)`: decoupled weight decay (AdamW).

        `x` itself when `weight_decay` is the number zero; with two numbers the
        factor is the Python float `torch.optim` computes.
        """
        if is_zero(weight_decay):
            return x
        return self.mul(x, decay_factor(lr, weight_decay))

    def div(self, x: P, value: float | Tensor, /) -> P:
        """Return `x / value` for a scalar `value`."""
        return x.div(self.scalar(value))

    def add(self, x: P, value: float | Tensor, /) -> P:
        """Return `x + value` for a scalar `value` (such as `eps`)."""
        return x.add(self.scalar(value))

    def add_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        """Return `x + rate * y`; a number `rate` is one fused foreach call."""
        if isinstance(rate, ParamDict):
            return x.add(y.mul(rate))
        return x.add(y, alpha=rate)

    def sub_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        """Return `x - rate * y`; a number `rate` is one fused foreach call."""
        if isinstance(rate, ParamDict):
            return x.sub(y.mul(rate))
        return x.sub(y, alpha=rate)

    def lerp(self, x: P, end: ParamDict, weight: float, /) -> P:
        """Return `x + weight * (end - x)`."""
        return x.lerp(end, weight)

    def addcmul(self, x: P, a: ParamDict, b: ParamDict, value: float = 1, /) -> P:
        """Return `x + value * a * b`."""
        return x.addcmul(a, b, value=value)

    def addcdiv(self, x: P, a: ParamDict, b: ParamDict, value: Rate = 1, /) -> P:
        """Return `x + value * a / b`, rounded as `torch.optim` rounds it.

        A number `value` goes to `addcdiv` as its scalar; a tensor or per-key
        value multiplies `a` first, as `torch.optim` does with a tensor rate.
        """
        if isinstance(value, (Tensor, ParamDict)):
            return x.addcdiv(self.mul(a, value), b)
        return x.addcdiv(a, b, value=value)

    def sqrt(self, x: P, /) -> P:
        """Return the square root of `x`."""
        return x.sqrt()

    def sign(self, x: P, /) -> P:
        """Return the sign of `x` (-1, 0 or 1)."""
        return x.sign()

    def maximum(self, x: P, other: ParamDict, /) -> P:
        """Return the elementwise maximum of `x` and `other`."""
        return x.maximum(other)

    def where(self, condition: Tensor, x: P, other: ParamDict, /) -> P:
        """Return `x` where the 0-dim bool `condition` holds, else `other`."""
        return x.where(ParamDict.fromkeys(x, condition), other)


class RecordedKernels(Kernels):
    """The differentiable vocabulary: out of place, recorded by autograd.

    The same results as `Kernels`, with `addcdiv` as a multiplication, a division
    and an addition, which round the same way: torch's foreach `addcdiv` cannot
    yet backpropagate into the divisor for every mix of entry shapes.
    """

    __slots__ = ()

    def addcdiv(self, x: P, a: ParamDict, b: ParamDict, value: Rate = 1, /) -> P:
        """Return `x + value * a / b`, as three differentiable operations."""
        if isinstance(value, (Tensor, ParamDict)):
            a = self.mul(a, value)
        elif value != 1:
            a = a.mul(value)
        return x.add(a.div(b))


def _values(x: ParamDict) -> list[Tensor]:
    return list(x.values())


class InPlaceKernels(Kernels):
    """The in-place vocabulary: results are written into owned first operands.

    `own(...)` names the ParamDicts whose tensors may be overwritten (the
    parameters and the state's buffers); everything an operation makes out of
    place is owned too. An operation whose first operand is owned writes into it
    and returns it; any other runs out of place. Results are bitwise those of
    `Kernels`. Runs under `torch.no_grad()` only.
    """

    __slots__ = ("_owned",)

    def __init__(self, dtype: torch.dtype | None, device: torch.device) -> None:
        super().__init__(dtype, device)
        # id -> object, so an id is never reused while this step runs.
        self._owned: dict[int, ParamDict] = {}

    def own(self, *values: object) -> None:
        """Allow writing into the tensors of each ParamDict among `values`."""
        for value in values:
            if isinstance(value, ParamDict):
                self._owned[id(value)] = value

    def _mine(self, x: ParamDict) -> bool:
        return id(x) in self._owned

    def _made(self, x: P) -> P:
        self._owned[id(x)] = x
        return x

    def _copied(self, x: P, result: ParamDict) -> P:
        torch._foreach_copy_(_values(x), _values(result))
        return x

    def borrowed(self, x: P, /) -> P:
        """Return a view of `x` that operations do not write into."""
        return type(x)(x)

    def subset(self, x: P, keys: tuple[str, ...], /) -> P:
        """Return the entries under `keys`, owned when `x` is."""
        out = super().subset(x, keys)
        return self._made(out) if self._mine(x) else out

    def neg(self, x: P, /) -> P:
        """Negate `x` in place when owned."""
        if not self._mine(x):
            return self._made(super().neg(x))
        torch._foreach_neg_(_values(x))
        return x

    def mul(self, x: P, rate: Rate, /) -> P:
        """Multiply `x` by `rate` in place when owned."""
        if not self._mine(x):
            return self._made(super().mul(x, rate))
        if isinstance(rate, ParamDict):
            return self._copied(x, super().mul(x, rate))
        torch._foreach_mul_(_values(x), self.scalar(rate))
        return x

    def div(self, x: P, value: float | Tensor, /) -> P:
        """Divide `x` by a scalar in place when owned."""
        if not self._mine(x):
            return self._made(super().div(x, value))
        torch._foreach_div_(_values(x), self.scalar(value))
        return x

    def add(self, x: P, value: float | Tensor, /) -> P:
        """Add a scalar to `x` in place when owned."""
        if not self._mine(x):
            return self._made(super().add(x, value))
        torch._foreach_add_(_values(x), self.scalar(value))
        return x

    def add_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        """Add `rate * y` to `x` in place when owned."""
        if not self._mine(x):
            return self._made(super().add_scaled(x, y, rate))
        if isinstance(rate, (Tensor, ParamDict)):
            return self._copied(x, super().add_scaled(x, y, rate))
        torch._foreach_add_(_values(x), x._aligned(y, what="`add_scaled`"), alpha=rate)
        return x

    def sub_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        """Subtract `rate * y` from `x` in place when owned."""
        if not self._mine(x):
            return self._made(super().sub_scaled(x, y, rate))
        if isinstance(rate, (Tensor, ParamDict)):
            return self._copied(x, super().sub_scaled(x, y, rate))
        ys = x._aligned(y, what="`sub_scaled`")
        torch._foreach_add_(_values(x), ys, alpha=-rate)
        return x

    def lerp(self, x: P, end: ParamDict, weight: float, /) -> P:
        """Move `x` toward `end` in place when owned."""
        if not self._mine(x):
            return self._made(super().lerp(x, end, weight))
        torch._foreach_lerp_(_values(x), x._aligned(end, what="`lerp`"), weight)
        return x

    def addcmul(self, x: P, a: ParamDict, b: ParamDict, value: float = 1, /) -> P:
        """Add `value * a * b` to `x` in place when owned."""
        if not self._mine(x):
            return self._made(super().addcmul(x, a, b, value))
        what = "`addcmul`"
        torch._foreach_addcmul_(
            _values(x), x._aligned(a, what=what), x._aligned(b, what=what), value
        )
        return x

    def addcdiv(self, x: P, a: ParamDict, b: ParamDict, value: Rate = 1, /) -> P:
        """Add `value * a / b` to `x` in place when owned."""
        if not self._mine(x):
            return self._made(super().addcdiv(x, a, b, value))
        if isinstance(value, (Tensor, ParamDict)):
            a = Kernels.mul(self, a, value)
            value = 1
        what = "`addcdiv`"
        torch._foreach_addcdiv_(
            _values(x), x._aligned(a, what=what), x._aligned(b, what=what), value
        )
        return x

    def sqrt(self, x: P, /) -> P:
        """Take the square root of `x` in place when owned."""
        if not self._mine(x):
            return self._made(super().sqrt(x))
        torch._foreach_sqrt_(_values(x))
        return x

    def sign(self, x: P, /) -> P:
        """Take the sign of `x` in place when owned."""
        if not self._mine(x):
            return self._made(super().sign(x))
        torch._foreach_sign_(_values(x))
        return x

    def maximum(self, x: P, other: ParamDict, /) -> P:
        """Raise `x` to `other` elementwise, in place when owned."""
        if not self._mine(x):
            return self._made(super().maximum(x, other))
        return self._copied(x, super().maximum(x, other))

    def where(self, condition: Tensor, x: P, other: ParamDict, /) -> P:
        """Keep `x` where `condition` holds, else take `other`, in place if owned."""
        if not self._mine(x):
            return self._made(super().where(condition, x, other))
        return self._copied(x, super().where(condition, x, other))
