"""The pieces the Adam family shares: the running moments and the decay prologue."""

from __future__ import annotations

from typing import TypeVar

from torch import Tensor

from .._paramdict import ParamDict
from ._base import HasStep, TorchOptimizer
from ._hyper import Rate
from ._kernels import Kernels

S = TypeVar("S", bound=HasStep)

__all__ = ["decayed", "moments"]


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


def decayed(
    opt: TorchOptimizer[S],
    decoupled: bool,
    params: ParamDict,
    grads: ParamDict,
    step: Tensor,
    lr: Rate,
    ops: Kernels,
) -> tuple[ParamDict, ParamDict]:
    """Return `(params, grads)` after `maximize` and the weight decay.

    Decoupled decay multiplies the parameters by `1 - lr * weight_decay` (`lr`
    as the rule read it, scheduled or not); else the decay is the L2 term of the
    prologue.
    """
    if not decoupled:
        return params, opt.prologue(params, grads, step, ops)
    if opt.maximize:
        grads = ops.neg(grads)
    return ops.decay(params, lr, opt.rate("weight_decay", step)), grads
