"""RAdam: Adam with a rectified variance."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._adam_moments import AdamOptions, in_inherited_order, moments
from ._fields import flag
from ._hyper import Rate, host_numbers, product, quotient
from ._protocol import register_state
from ._schedules.slot import SlotState
from ._vocabulary import Kernels

__all__ = ["RAdam", "RAdamState"]


@register_state
class RAdamState(NamedTuple):
    """The state of `RAdam`.

    Its fields are `AdamState`'s (the same meaning) without `max_exp_avg_sq`.

    Example:
        >>> from paramdict import optim
        >>> optim.RAdamState._fields
        ('step', 'exp_avg', 'exp_avg_sq', 'schedule')
    """

    step: Tensor
    exp_avg: ParamDict
    exp_avg_sq: ParamDict
    schedule: SlotState = ()


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

    decoupled_weight_decay: bool = flag()

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        buffers: RAdamState,
        step: Tensor,
        lr: Rate,
        ops: Kernels,
        /,
    ) -> tuple[ParamDict, tuple[ParamDict, ParamDict]]:
        beta1, beta2 = self.cycled("betas", buffers)
        exp_avg, exp_avg_sq = moments(
            (beta1, beta2), buffers.exp_avg, buffers.exp_avg_sq, grads, ops
        )
        host = host_numbers(self.differentiable, step, lr, beta1)
        if host is not None:
            # Eager: torch's foreach RAdam reads the step on the host and
            # computes one side, with Python floats: so does this (14 -> 8
            # foreach kernels a step, 5 of them after the moments).
            t, rate, b1 = host
            new_params = _one_side(
                params, exp_avg, exp_avg_sq, t, rate, b1, beta2, self.eps, ops
            )
            return new_params, (exp_avg, exp_avg_sq)
        # Traced (compiled, vmapped), differentiable or with per-key rates: the
        # same arithmetic on 0-dim tensors, both sides, and a `where`.
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
        rectified = rho_t > 5.0
        # Before the rectification `rho_t` is replaced by a value that keeps
        # the untaken side finite (and its gradient zero).
        safe_rho_t = torch.where(rectified, rho_t, rho_inf)
        rect = _rect(safe_rho_t, rho_inf)
        scale = product(
            quotient(product(lr, rect), bias_correction1), -bias_correction2.sqrt()
        )
        early = ops.sub_scaled(
            ops.borrowed(params), exp_avg, quotient(lr, bias_correction1)
        )
        denom = _denominator(exp_avg_sq, scale, self.eps, ops)
        new_params = ops.where(rectified, ops.addcmul(params, denom, exp_avg), early)
        return new_params, (exp_avg, exp_avg_sq)


def _rect(rho_t: Any, rho_inf: float) -> Any:
    """Return the variance rectification for `rho_t` (a float or a tensor) > 4."""
    return (
        (rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)
    ) ** 0.5


def _one_side(
    params: ParamDict,
    exp_avg: ParamDict,
    exp_avg_sq: ParamDict,
    step: float,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    ops: Kernels,
) -> ParamDict:
    """Return the new parameters, the step's side chosen on the host.

    torch's foreach arithmetic: `p += m / ((sqrt(v) + eps) / scale)` with
    `scale = -(sqrt(bc2) * (lr * rect / bc1))`; before the rectification
    (`rho_t <= 5`), `p -= (lr / bc1) * m`.
    """
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    rho_inf = 2 / (1 - beta2) - 1
    rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
    if rho_t <= 5:
        return ops.sub_scaled(params, exp_avg, lr / bias_correction1)
    scale = (
        (bias_correction2**0.5) * (lr * _rect(rho_t, rho_inf) / bias_correction1) * -1
    )
    return ops.addcmul(params, _denominator(exp_avg_sq, scale, eps, ops), exp_avg)


def _denominator(
    exp_avg_sq: ParamDict, scale: float | Tensor | ParamDict, eps: float, ops: Kernels
) -> ParamDict:
    """Return `1 / ((sqrt(v) + eps) / scale)`, the factor of `exp_avg` in the step."""
    denom = ops.add(ops.sqrt(ops.borrowed(exp_avg_sq)), eps)
    return ops.reciprocal(ops.div(denom, scale))
