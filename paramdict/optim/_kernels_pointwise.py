"""The elementwise part of the kernel vocabulary: `sqrt`, `sign`, `clamp`, `where`...

Operations that read only their operands (no rate, no shared dtype): each
returns a new ParamDict. `Kernels` builds on this class; `InPlaceKernels`
overrides what it writes in place.
"""

from __future__ import annotations

from typing import TypeVar

from torch import Tensor

from .._paramdict import ParamDict

__all__ = ["P", "PointwiseKernels"]

P = TypeVar("P", bound=ParamDict)


class PointwiseKernels:
    """The elementwise kernels of `Kernels` (see there)."""

    __slots__ = ()

    def sqrt(self, x: P, /) -> P:
        """Return the square root of `x`.

        Args:
            x: The operand.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.sqrt(p)["w"]
            tensor([1., 2.])
        """
        return x.sqrt()

    def sign(self, x: P, /) -> P:
        """Return the sign of `x` (-1, 0 or 1).

        Args:
            x: The operand.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.sign(ops.neg(p))["w"]
            tensor([-1., -1.])
        """
        return x.sign()

    def maximum(self, x: P, other: ParamDict, /) -> P:
        """Return the elementwise maximum of `x` and `other`.

        Args:
            x: The operand.
            other: The other ParamDict.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> g = ParamDict(w=torch.tensor([2.0, 2.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.maximum(p, g)["w"]
            tensor([2., 4.])
        """
        return x.maximum(other)

    def abs(self, x: P, /) -> P:
        """Return the absolute value of `x`.

        Args:
            x: The operand.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([-1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.abs(p)["w"]
            tensor([1., 4.])
        """
        return x.abs()

    def reciprocal(self, x: P, /) -> P:
        """Return `1 / x` (`torch.reciprocal`, as torch computes `number / tensor`).

        Args:
            x: The operand.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([2.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.reciprocal(p)["w"]
            tensor([0.5000, 0.2500])
        """
        return x.reciprocal()

    def clamp(self, x: P, min: float, max: float, /) -> P:  # torch's names
        """Return `x` clamped to `[min, max]` (`min <= max`).

        Args:
            x: The operand.
            min: The lower bound, a number.
            max: The upper bound, a number.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([-1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.clamp(p, 0.0, 2.0)["w"]
            tensor([0., 2.])
        """
        return x.clamp(min, max)

    def eq(self, x: ParamDict, value: float, /) -> ParamDict:
        """Return the boolean mask `x == value`.

        Args:
            x: The operand.
            value: A number.

        Returns:
            A new ParamDict of boolean tensors.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([0.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.eq(p, 0.0)["w"]
            tensor([ True, False])
        """
        return x.map(lambda v: v.eq(value))

    def masked_fill(self, x: P, mask: ParamDict, value: float, /) -> P:
        """Return `x` with `value` where the boolean `mask` holds.

        Args:
            x: The operand.
            mask: Boolean tensors with `x`'s keys and shapes.
            value: The number to fill in.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([-1.0, 4.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.masked_fill(p, ops.eq(p, -1.0), 0.0)["w"]
            tensor([0., 4.])
        """
        return x.map(lambda v, m: v.masked_fill(m, value), mask)

    def where(self, condition: Tensor, x: P, other: ParamDict, /) -> P:
        """Return `x` where the 0-dim bool `condition` holds, else `other`.

        Args:
            condition: A 0-dim bool tensor (such as `step > 1`).
            x: Taken where `condition` holds.
            other: Taken elsewhere.

        Returns:
            A new ParamDict.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
            >>> g = ParamDict(w=torch.tensor([2.0, 2.0]))
            >>> ops = optim.Kernels.for_params(p)
            >>> ops.where(torch.tensor(False), p, g)["w"]
            tensor([2., 2.])
        """
        return x.where(ParamDict.fromkeys(x, condition), other)
