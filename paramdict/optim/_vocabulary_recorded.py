"""The recorded (differentiable) implementation of the kernel vocabulary.

See `_vocabulary.py` for the vocabulary and its functional implementation.
"""

from __future__ import annotations

from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._hyper import Rate
from ._vocabulary import Kernels, P

__all__ = ["RecordedKernels"]


class RecordedKernels(Kernels):
    """The differentiable vocabulary: out of place, recorded by autograd.

    The same results as `Kernels`, with `addcdiv` as a multiplication, a division
    and an addition, which round the same way: torch's foreach `addcdiv` cannot
    yet backpropagate into the divisor for every mix of entry shapes.

    Args:
        dtype: As for `Kernels`.
        device: As for `Kernels`.

    Example:
        >>> from paramdict import optim
        >>> lr = torch.tensor(0.5, requires_grad=True)
        >>> p = ParamDict(w=torch.tensor([1.0, 4.0]))
        >>> ops = optim.RecordedKernels.for_params(p)
        >>> new = ops.addcdiv(p, p, p.full_like(2.0), lr)
        >>> new["w"].grad_fn is not None
        True
    """

    __slots__ = ()

    @override
    def addcdiv(self, x: P, a: ParamDict, b: ParamDict, value: Rate = 1, /) -> P:
        if isinstance(value, (Tensor, ParamDict)):
            a = self.mul(a, value)
        elif value != 1:
            a = a.mul(value)
        return x.add(a.div(b))

    @override
    def item(self, value: Tensor, /) -> float | Tensor:
        return value  # recorded: a tensor stays one, differentiably
