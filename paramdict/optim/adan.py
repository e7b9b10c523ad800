"""Adan: adaptive Nesterov momentum from averages of gradients and their changes.

Xie et al., 2022, "Adan: Adaptive Nesterov Momentum Algorithm for Faster
Optimizing Deep Models".
"""

from __future__ import annotations

import math
from typing import ClassVar

import attrs
from torch import Tensor
from typing_extensions import override

# The public names only (`paramdict.optim.*`), from the modules defining them.
from .._paramdict import ParamDict
from . import fields
from ._hyper import Rate
from ._schedules.slot import LearningRate
from ._states import AdanState
from ._torch_optimizer import TorchOptimizer

__all__ = ["Adan", "AdanState"]


@attrs.frozen(kw_only=True, eq=False, field_transformer=fields.shared_last)
class Adan(TorchOptimizer[AdanState]):
    """Adan: Adam-like steps along a Nesterov-corrected gradient estimate.

    The paper's Algorithm 1 with bias correction, as the authors' code writes
    it (its betas weigh the old average: the paper's `1 - beta`). With `t` the
    step number, `g` the gradient and `d = g - g_prev` its change (0 at the
    first step):

        m  = b1 * m + (1 - b1) * g
        dm = b2 * dm + (1 - b2) * d
        n  = b3 * n + (1 - b3) * (g + b2 * d) ** 2
        D  = sqrt(n) / sqrt(1 - b3 ** t) + eps
        p  = p - lr / (1 - b1 ** t) * m / D - lr * b2 / (1 - b2 ** t) * dm / D
        p  = p / (1 + lr * weight_decay)                  (proximal decay)

    With `no_prox=True` the decay is AdamW's instead, before the update:
    `p = p * (1 - lr * weight_decay)`. Names and defaults are the authors'
    (`pytorch_optimizer.Adan` calls `no_prox` `weight_decouple`); their
    optional clipping by the global gradient norm is `ClipGradNorm`'s.

    Attributes:
        lr: The learning rate: a number, a 0-dim tensor, a per-key ParamDict,
            or a schedule.
        betas: The decays of the averages of the gradients, of their changes
            and of the squared Nesterov gradients, each in [0, 1).
        eps: Term added to the denominator.
        weight_decay: The weight decay, in any of the forms of `lr`.
        no_prox: Decay as AdamW does (before the update) instead of the
            proximal division after it.
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adan(lr=0.1)
        >>> params = ParamDict(w=torch.tensor([1.0, -1.0]))
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([ 0.9000, -0.9000])
    """

    state_type: ClassVar[type[AdanState]] = AdanState
    decoupled_decay: ClassVar[bool] = True
    decays_in_math: ClassVar[bool] = True  # proximal: after the update
    lazy_copies: ClassVar[bool] = True

    lr: LearningRate = 1e-3
    betas: tuple[float, float, float] = fields.betas((0.98, 0.92, 0.99))
    eps: float = fields.non_negative(1e-8)
    weight_decay: Rate = 0.0
    no_prox: bool = fields.flag()

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdanState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        beta1: float | Tensor = self.cycled("betas", state)[0]
        _, beta2, beta3 = self.betas
        t: float | Tensor = step
        # Python floats where the step and the rate are read for free (eager).
        host = self.host_numbers(step, lr, beta1)
        if host is not None:
            t, lr, beta1 = host
            later: float | Tensor = 1.0 if t > 1 else 0.0
            bias3_sqrt: float | Tensor = math.sqrt(1 - beta3**t)
        else:
            later = (step > 1).to(step.dtype)
            bias3_sqrt = (1 - beta3**step).sqrt()
        # The first step has no previous gradient: its change counts as 0.
        diff = grads.sub(state.prev_grad)
        # `lerp_` rather than the authors' scale-and-add: the same averages to
        # rounding, one pass instead of two (as `pytorch_optimizer` computes them).
        state.exp_avg.lerp_(grads, 1 - beta1)
        state.exp_avg_diff.lerp_(diff, (1 - beta2) * later)
        nesterov = diff.mul_(beta2 * later).add_(grads)
        state.exp_avg_sq.mul_(beta3).addcmul_(nesterov, nesterov, value=1 - beta3)
        denom = state.exp_avg_sq.sqrt()
        # Recorded, the root's result is saved for the backward pass.
        denom = denom.div(bias3_sqrt) if self.differentiable else denom.div_(bias3_sqrt)
        denom.add_(self.eps)
        if self.no_prox:
            self.decay_(params, step, lr)
        params.addcdiv_(state.exp_avg, denom, value=-lr / (1 - beta1**t))
        size = lr * beta2 / (1 - beta2**t)
        params.addcdiv_(state.exp_avg_diff, denom, value=-size)
        weight_decay = self.rate("weight_decay", step)
        if not self.no_prox and not (
            isinstance(weight_decay, float | int) and weight_decay == 0
        ):
            params.div_(1 + lr * weight_decay)
        state.prev_grad.copy_(grads)
