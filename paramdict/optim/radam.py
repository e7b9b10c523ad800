"""RAdam: Adam with a rectified variance."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._adam_moments import AdamOptions, in_inherited_order, moments_
from ._fields import flag
from ._hyper import Rate, host_numbers, product, quotient
from ._states import RAdamState

__all__ = ["RAdam", "RAdamState"]


@attrs.frozen(kw_only=True, eq=False, field_transformer=in_inherited_order)
class RAdam(AdamOptions[RAdamState]):
    """RAdam, the functional `torch.optim.RAdam`: Adam with a rectified variance.

    Same hyperparameters, defaults and arithmetic as `torch.optim.RAdam`, so a
    run gives the same parameters. While the variance estimate is unreliable
    (the approximated moving-average length `rho_t` is at most 5) the step is
    the bias-corrected momentum alone; after that it is rectified Adam. Its
    options are `Adam`'s without `amsgrad` (same meaning and checks).

    Example:
        >>> from paramdict import ParamDict, optim
        >>> opt = optim.RAdam(lr=0.1)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> new, _ = opt.step(params, params.full_like(3.0), opt.init(params))
        >>> new["w"]  # not yet rectified: `p - lr * g` on the first step
        tensor([0.7000, 1.7000])
    """

    state_type: ClassVar[type[RAdamState]] = RAdamState
    lazy_copies: ClassVar[bool] = True

    decoupled_weight_decay: bool = flag()

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: RAdamState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        beta1, beta2 = self.cycled("betas", state)
        moments_((beta1, beta2), state.exp_avg, state.exp_avg_sq, grads)
        exp_avg, exp_avg_sq = state.exp_avg, state.exp_avg_sq
        host = host_numbers(self.differentiable, step, lr, beta1)
        if host is not None:
            t, rate, b1 = host
            bias_correction1 = 1 - b1**t
            bias_correction2 = 1 - beta2**t
            rho_inf = 2 / (1 - beta2) - 1
            rho_t = rho_inf - 2 * t * beta2**t / bias_correction2
            if self.differentiable:
                # torch's differentiable step: its single-tensor arithmetic.
                moved = exp_avg.div(bias_correction1).mul(rate)
                if rho_t > 5.0:
                    adaptive = exp_avg_sq.sqrt().add(self.eps).reciprocal()
                    adaptive = adaptive.mul(bias_correction2**0.5)
                    moved = moved.mul(adaptive).mul(_rect(rho_t, rho_inf))
                params.add_(moved, alpha=-1.0)
                return
            if rho_t <= 5:
                params.sub_(exp_avg, alpha=rate / bias_correction1)
                return
            scale = (
                bias_correction2**0.5
                * (rate * _rect(rho_t, rho_inf) / bias_correction1)
                * -1
            )
            denom = _denominator(exp_avg_sq, scale, self.eps, self.differentiable)
            params.addcmul_(denom, exp_avg)
            return
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * beta2**step / bias_correction2
        rectified = rho_t > 5.0
        # The host's 0-dim `rho_inf` is read as a scalar operand: no fill kernel.
        safe_rho_t = torch.where(rectified, rho_t, torch.tensor(rho_inf))
        rect = _rect(safe_rho_t, rho_inf)
        scale_t = product(
            quotient(product(lr, rect), bias_correction1), -bias_correction2.sqrt()
        )
        early = params.clone().sub_(exp_avg, alpha=quotient(lr, bias_correction1))
        denom = _denominator(exp_avg_sq, scale_t, self.eps, self.differentiable)
        late = params.clone().addcmul_(denom, exp_avg)
        params.copy_(late.where(ParamDict.fromkeys(late, rectified), early))


def _rect(rho_t: Any, rho_inf: float) -> Any:
    """The variance rectification term of RAdam, for `rho_t > 5`."""
    return (
        (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
    ) ** 0.5


def _denominator(
    exp_avg_sq: ParamDict,
    scale: float | Tensor | ParamDict,
    eps: float,
    recorded: bool,
) -> ParamDict:
    """`scale / (sqrt(exp_avg_sq) + eps)`, as torch; out of place if recorded."""
    if recorded:
        return exp_avg_sq.sqrt().add(eps).div(scale).reciprocal()
    return exp_avg_sq.sqrt().add_(eps).div_(scale).reciprocal_()
