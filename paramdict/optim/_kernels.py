"""The kernel vocabulary every update rule is written in, in three implementations.

A rule (`Optimizer.update`) never calls ParamDict arithmetic or torch directly for
the work on its buffers: it calls a small vocabulary on an `ops` object (`lerp`,
`mul`, `decay`, `addcmul`, `addcdiv`, `sqrt`, `sign`, `maximum`, `add_scaled`,
`clamp`, `masked_fill`, ...), so the same rule runs in every mode:

- `Kernels` (functional): out of place, the mode of a default `step` (run under
  `torch.no_grad()`); `addcdiv` is one fused foreach call.
- `RecordedKernels` (differentiable; `_kernels_recorded.py`): out of place, with
  every operation one that autograd can differentiate for any mix of entry
  shapes (`addcdiv` becomes a multiplication, a division and an addition that
  round the same way).
- `InPlaceKernels` (`_kernels_inplace.py`): writes each result into its first
  operand when the rule owns that operand (the parameters, the state's buffers,
  or anything the rule made), and runs out of place otherwise (the gradients are
  never written). This is the base of an in-place `step_`; its results are
  bitwise those of `Kernels`.

Every rate argument accepts a number, a 0-dim tensor or a ParamDict of per-key
values, so no rule branches on the type of `lr`. Scalars are passed to torch the
way `torch.optim` passes them, which keeps its rounding.

The one rule for authors: an operation may consume its first operand. Write
`x = ops.op(x, ...)` when `x`'s old value is no longer needed, and pass
`ops.borrowed(x)` as the first operand when it still is (free in every mode).
`InPlaceKernels` checks it: a consumed ParamDict given as a first operand again
raises instead of reading the value written into it.
"""

from __future__ import annotations

# pyright: reportPrivateImportUsage=false, reportPrivateUsage=false
# (torch's in-place foreach kernels have private names only; `_aligned` is
# ParamDict's own package-internal alignment)
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
from torch import Tensor

from .._paramdict import ParamDict
from ._hyper import Rate, compute_dtype, decay_factor, is_zero
from ._kernels_pointwise import P, PointwiseKernels
from ._matrix import newton_schulz

__all__ = ["Kernels", "P"]


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


class Kernels(PointwiseKernels):
    """The functional kernel vocabulary: every operation returns new ParamDicts.

    Built for one step from the parameters (`Kernels.for_params`), it knows the
    dtype they share, so that scalars take torch's fastest path with torch's
    rounding. Every method leaves its arguments unchanged.

    Args:
        dtype: The dtype every entry shares when it is float32 or float64, else
            `None` (scalars are then passed as they are).
        device: The device of the entries (for scalar operands).

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> ops = optim.Kernels.for_params(p)
        >>> ops.lerp(p, p.zeros_like(), 0.5)["w"], p["w"]
        (tensor([0.5000, 1.0000]), tensor([1., 2.]))
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
            A kernel set of this class.

        Example:
            >>> from paramdict import optim
            >>> ops = optim.Kernels.for_params(ParamDict(w=torch.ones(2)))
            >>> ops.dtype, ops.device
            (torch.float32, device(type='cpu'))
        """
        first = next(iter(params.values()), None)
        device = first.device if first is not None else torch.device("cpu")
        return cls(compute_dtype(params), device)

    def scalar(self, value: float | Tensor, /) -> Any:
        """Return `value` as the scalar operand for entries of the shared dtype.

        Args:
            value: A number or a 0-dim tensor.

        Returns:
            A 0-dim tensor of the shared dtype (float32 or float64), else `value`.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.scalar(0.5)
            tensor(0.5000)
        """
        if self.dtype is None:
            return value  # half precision or mixed dtypes: torch's own promotion
        if isinstance(value, Tensor):
            value = value.to(self.dtype)
            return _computed_once(value) if torch.compiler.is_compiling() else value
        return torch.full((), value, dtype=self.dtype, device=self.device)

    def borrowed(self, x: P, /) -> P:
        """Return `x` for use as a first operand whose old value is still needed.

        Args:
            x: The ParamDict to borrow.

        Returns:
            `x` (the in-place kernels return a view they never write into).

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.borrowed(p) is p
            True
        """
        return x

    def subset(self, x: P, keys: tuple[str, ...], /) -> P:
        """Return the entries of `x` under `keys` (literal keys, in that order).

        Args:
            x: The ParamDict.
            keys: The keys to keep.

        Returns:
            A ParamDict of `x`'s type.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> list(ops.subset(p, ("w",)))
            ['w']
        """
        return type(x)((k, x[k]) for k in keys)

    def neg(self, x: P, /) -> P:
        """Return `-x`.

        Args:
            x: The operand.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.neg(p)["w"]
            tensor([-1., -4.])
        """
        return x.neg()

    def mul(self, x: P, rate: Rate, /) -> P:
        """Return `x * rate`.

        Args:
            x: The operand.
            rate: A number, a 0-dim tensor or a per-key ParamDict.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.mul(p, 0.5)["w"]
            tensor([0.5000, 2.0000])
        """
        if isinstance(rate, ParamDict):
            return x.mul(rate)
        return x.mul(self.scalar(rate))

    def decay(self, x: P, lr: Rate, weight_decay: Rate, /) -> P:
        """Return `x * (1 - lr * weight_decay)`: decoupled weight decay (AdamW).

        Args:
            x: The parameters.
            lr: The learning rate, in any form.
            weight_decay: The weight decay, in any form.

        Returns:
            `x` itself when `weight_decay` is the number zero (no work), else a
            new ParamDict. With two numbers the factor is the Python float
            `torch.optim` computes.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.decay(p, 0.5, 0.5)["w"]
            tensor([0.7500, 3.0000])
        """
        if is_zero(weight_decay):
            return x
        return self.mul(x, decay_factor(lr, weight_decay))

    def div(self, x: P, value: float | Tensor | ParamDict, /) -> P:
        """Return `x / value` for a scalar `value` or a ParamDict of divisors.

        Args:
            x: The operand.
            value: A number, a 0-dim tensor, or a ParamDict (entry by entry).

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.div(p, 2.0)["w"]
            tensor([0.5000, 2.0000])
        """
        if isinstance(value, ParamDict):
            return x.div(value)
        return x.div(self.scalar(value))

    def add(self, x: P, value: float | Tensor, /) -> P:
        """Return `x + value` for a scalar `value` (such as `eps`).

        Args:
            x: The operand.
            value: A number or a 0-dim tensor.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.add(p, 1.0)["w"]
            tensor([2., 5.])
        """
        return x.add(self.scalar(value))

    def add_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        """Return `x + rate * y`; a number `rate` is one fused foreach call.

        Args:
            x: The operand.
            y: The ParamDict to add, scaled.
            rate: A number, a 0-dim tensor or a per-key ParamDict.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> g = ParamDict(w=torch.tensor([2.0, 2.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.add_scaled(p, g, 0.5)["w"]
            tensor([2., 5.])
        """
        if isinstance(rate, ParamDict):
            return x.add(y.mul(rate))
        return x.add(y, alpha=rate)

    def sub_scaled(self, x: P, y: ParamDict, rate: Rate, /) -> P:
        """Return `x - rate * y`; a number `rate` is one fused foreach call.

        Args:
            x: The operand.
            y: The ParamDict to subtract, scaled.
            rate: A number, a 0-dim tensor or a per-key ParamDict.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> g = ParamDict(w=torch.tensor([2.0, 2.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.sub_scaled(p, g, 0.5)["w"]
            tensor([0., 3.])
        """
        if isinstance(rate, ParamDict):
            return x.sub(y.mul(rate))
        return x.sub(y, alpha=rate)

    def lerp(self, x: P, end: ParamDict, weight: float | Tensor, /) -> P:
        """Return `x + weight * (end - x)`.

        Args:
            x: The start.
            end: The end.
            weight: The interpolation weight: a number or a 0-dim tensor (a
                momentum a schedule cycles).

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> g = ParamDict(w=torch.tensor([2.0, 2.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.lerp(p, g, 0.5)["w"]
            tensor([1.5000, 3.0000])
        """
        return x.lerp(end, weight)

    def addcmul(self, x: P, a: ParamDict, b: ParamDict, value: float = 1, /) -> P:
        """Return `x + value * a * b`.

        Args:
            x: The operand.
            a: The first factor.
            b: The second factor.
            value: The scale, a number.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> g = ParamDict(w=torch.tensor([2.0, 2.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.addcmul(p, g, g, 0.5)["w"]
            tensor([3., 6.])
        """
        return x.addcmul(a, b, value=value)

    def addcdiv(self, x: P, a: ParamDict, b: ParamDict, value: Rate = 1, /) -> P:
        """Return `x + value * a / b`, rounded as `torch.optim` rounds it.

        Args:
            x: The operand.
            a: The numerator.
            b: The denominator.
            value: The scale. A number goes to `addcdiv` as its scalar; a tensor
                or per-key value multiplies `a` first, as `torch.optim` does with
                a tensor rate.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> g = ParamDict(w=torch.tensor([2.0, 2.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.addcdiv(p, g, g, 0.5)["w"]
            tensor([1.5000, 4.5000])
        """
        if isinstance(value, (Tensor, ParamDict)):
            # `Kernels.mul`, not `self.mul`: `a` is read, never consumed.
            return x.addcdiv(Kernels.mul(self, a, value), b)
        return x.addcdiv(a, b, value=value)

    def sub_scaled_by_key(
        self, x: P, y: ParamDict, rates: Mapping[str, float | Tensor], /
    ) -> P:
        """Return `x - rates[k] * y` entry by entry, one rate per key.

        For rates that differ by key but come from numbers (Muon's learning
        rate adjusted to each matrix's shape): a number is `torch.add`'s `alpha`,
        the one rounding torch.optim takes. A 0-dim tensor is read as the number
        torch.optim reads (`.item()`) in this mode; the recorded mode keeps it a
        tensor, differentiably. Any other tensor multiplies `y` first.

        Args:
            x: The operand.
            y: The ParamDict to subtract, scaled; its keys are `x`'s.
            rates: One rate per key of `x`.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]), b=torch.tensor([2.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> new = ops.sub_scaled_by_key(p, p, {"w": 0.5, "b": 0.25})
            >>> new["w"], new["b"]
            (tensor([0.5000, 2.0000]), tensor([1.5000]))
        """
        return x._derive([self._sub_scaled(v, y[k], rates[k]) for k, v in x.items()])

    def _sub_scaled(self, x: Tensor, y: Tensor, rate: float | Tensor) -> Tensor:
        if (
            isinstance(rate, Tensor)
            and rate.dim() == 0
            and not torch.compiler.is_compiling()
            and not torch._C._functorch.is_functorch_wrapped_tensor(rate)
        ):
            # torch.optim's `_to_scalar`; compiled or under vmap: a tensor.
            rate = rate.item()
        if isinstance(rate, Tensor):
            return torch.sub(x, y * rate.to(x.dtype))
        return torch.add(x, y.to(x.dtype), alpha=-rate)

    def apply(self, x: P, fn: Callable[..., Tensor], /, *others: ParamDict) -> P:
        """Return `fn(x[k], *(o[k] for o in others))` for each key `k` of `x`.

        For per-entry work with no foreach kernel (reductions along a dimension,
        matrix products: Adafactor's factored second moment). `fn` must not
        write into its arguments; when `x` is written in place (owned by the
        in-place kernels) `fn` must keep each entry's shape and dtype.

        Args:
            x: The first operand; its keys are the result's.
            fn: A function of one tensor per operand.
            others: Further operands with `x`'s keys.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([[3.0, 4.0]]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.apply(p, lambda v: v.norm(dim=-1, keepdim=True))["w"]
            tensor([[5.]])
        """
        return x._derive([fn(v, *(other[k] for other in others)) for k, v in x.items()])

    def orthogonalize(
        self, x: P, coefficients: tuple[float, float, float], steps: int, eps: float, /
    ) -> P:
        """Return each matrix of `x` orthogonalized by Newton-Schulz iterations.

        Muon's update direction, entry by entry as torch.optim computes it: in
        bfloat16, the matrix (transposed when it has more rows than columns)
        divided by its Frobenius norm (at least `eps`), then `steps` iterations
        of `X <- a X + (b A + c A A) X` with `A = X X^T` and `(a, b, c) =
        coefficients`. Each result is cast back to its entry's dtype (exactly).

        Args:
            x: ParamDict of 2-D entries.
            coefficients: The polynomial's `(a, b, c)`.
            steps: The number of iterations.
            eps: The least norm divided by.

        Returns:
            A new ParamDict of `x`'s dtypes.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.eye(2) * 3.0)
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.orthogonalize(p, (2.0, -1.5, 0.5), 5, 1e-7)["w"]
            tensor([[1., 0.],
                    [0., 1.]])
        """
        return x._derive(
            [newton_schulz(v, coefficients, steps, eps) for v in x.values()]
        )
