"""The piece the Adam family shares: the running moments of the gradient."""

from __future__ import annotations

from torch import Tensor

from .._paramdict import ParamDict
from ._kernels import Kernels

__all__ = ["moments"]


def moments(
    betas: tuple[float | Tensor, float],
    exp_avg: ParamDict,
    exp_avg_sq: ParamDict,
    grads: ParamDict,
    ops: Kernels,
) -> tuple[ParamDict, ParamDict]:
    """Return the updated running averages of the gradient and its square."""
    beta1, beta2 = betas
    exp_avg = ops.lerp(exp_avg, grads, 1 - beta1)
    exp_avg_sq = ops.mul(exp_avg_sq, beta2)
    exp_avg_sq = ops.addcmul(exp_avg_sq, grads, grads, 1 - beta2)
    return exp_avg, exp_avg_sq
