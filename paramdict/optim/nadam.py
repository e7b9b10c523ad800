"""NAdam: Adam with Nesterov momentum."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._adam_moments import AdamOptions, in_inherited_order, moments
from ._fields import flag, non_negative
from ._hyper import Rate, host_numbers, product, quotient, state_scalar_dtype
from ._protocol import register_state
from ._schedules.slot import LearningRate, SlotState
from ._vocabulary import Kernels

__all__ = ["NAdam", "NAdamState"]


@register_state
class NAdamState(NamedTuple):
    """The state of `NAdam`.

    `AdamState`'s fields (the same meaning) without `max_exp_avg_sq`, and:

    Attributes:
        mu_product: The product of the momentum coefficients so far, a 0-dim
            tensor in torch.optim's dtype for it (float32 unless the default
            dtype is float64).

    Example:
        >>> from paramdict import optim
        >>> opt = optim.NAdam()
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> _, state = opt.step(params, params.ones_like(), opt.init(params))
        >>> state.mu_product
        tensor(0.4501)
    """

    step: Tensor
    mu_product: Tensor
    exp_avg: ParamDict
    exp_avg_sq: ParamDict
    schedule: SlotState = ()


def _momentum(beta1: float | Tensor, step: Tensor, momentum_decay: float) -> Tensor:
    """Return NAdam's momentum coefficient `mu` for `step`, in double precision."""
    return beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))


@attrs.frozen(kw_only=True, eq=False, field_transformer=in_inherited_order)
class NAdam(AdamOptions[NAdamState]):
    """NAdam, the functional `torch.optim.NAdam`: Adam with Nesterov momentum.

    Same hyperparameters, defaults and arithmetic as `torch.optim.NAdam`, so a
    run gives the same parameters. The momentum schedule
    `mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))` is computed in
    double precision from the step-count tensor, and `mu_product` is kept in
    torch.optim's dtype for it, so the rounding is torch's. Its options are
    `Adam`'s (without `amsgrad`), same meaning and checks, plus one:

    Attributes:
        momentum_decay: The decay of the momentum schedule, `>= 0`.

    Example:
        >>> from paramdict import ParamDict, optim
        >>> opt, params = optim.NAdam(lr=0.1), ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> _ = opt.step_(params, {"w": torch.tensor([3.0, -3.0])}, opt.init(params))
        >>> params["w"]  # written in place
        tensor([0.8944, 2.1056])
    """

    state_type: ClassVar[type[NAdamState]] = NAdamState

    lr: LearningRate = 2e-3
    momentum_decay: float = non_negative(4e-3)
    decoupled_weight_decay: bool = flag()

    def init_state(self, params: ParamDict, /) -> NAdamState:
        """Return the first state: step 0, `mu_product` 1 and zero moments.

        Args:
            params: The parameters to optimize (checked by `init`); unchanged.

        Returns:
            A `NAdamState`.

        Example:
            >>> from paramdict import optim
            >>> state = optim.NAdam().init(ParamDict(w=torch.ones(2)))
            >>> state.mu_product, state.exp_avg["w"]
            (tensor(1.), tensor([0., 0.]))
        """
        counter = self.counter(params)
        mu_product = torch.ones(
            (), dtype=state_scalar_dtype(counter.device), device=counter.device
        )
        return NAdamState(counter, mu_product, params.zeros_like(), params.zeros_like())

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        buffers: NAdamState,
        step: Tensor,
        lr: Rate,
        ops: Kernels,
        /,
    ) -> tuple[ParamDict, tuple[Tensor, ParamDict, ParamDict]]:
        beta1, beta2 = self.cycled("betas", buffers)
        # A tensor `lr` stays a tensor in torch (its dtype rounds the step sizes).
        host = (
            None
            if isinstance(lr, Tensor)
            else host_numbers(self.differentiable, step, lr, beta1, beta2)
        )
        if host is not None:
            t, rate, b1, b2 = host
            return self._on_host(params, grads, buffers, (t, rate, b1, b2), ops)
        mu = _momentum(beta1, step, self.momentum_decay)
        mu_next = _momentum(beta1, step + 1, self.momentum_decay)
        # torch multiplies its stored `mu_product` in place, in that tensor's dtype.
        mu_product = buffers.mu_product * mu.to(buffers.mu_product.dtype)
        exp_avg, exp_avg_sq = moments(
            (beta1, beta2), buffers.exp_avg, buffers.exp_avg_sq, grads, ops
        )
        bias_correction2 = 1 - beta2**step
        denom = ops.sqrt(ops.div(ops.borrowed(exp_avg_sq), bias_correction2))
        denom = ops.add(denom, self.eps)
        # The two step sizes, from the stored product read at double precision.
        product_now = mu_product.to(step.dtype)
        grad_size = quotient(product(lr, -(1.0 - mu)), 1.0 - product_now)
        avg_size = quotient(product(lr, -mu_next), 1.0 - product_now * mu_next)
        new_params = ops.addcdiv(params, grads, denom, grad_size)
        new_params = ops.addcdiv(new_params, exp_avg, denom, avg_size)
        return new_params, (mu_product, exp_avg, exp_avg_sq)

    def _on_host(
        self,
        params: ParamDict,
        grads: ParamDict,
        buffers: NAdamState,
        numbers: tuple[float, float, float, float],
        ops: Kernels,
    ) -> tuple[ParamDict, tuple[Tensor, ParamDict, ParamDict]]:
        """`math` with `(step, lr, beta1, beta2)` as Python floats (`host_numbers`).

        torch's arithmetic, number for number: the momentum schedule and the
        step sizes are Python floats, and both step sizes reach `addcdiv` as
        numbers (a tensor there multiplies its operand in a pass of its own).
        """
        step, lr, beta1, beta2 = numbers
        decay = self.momentum_decay
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * decay)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * decay)))
        mu_product = buffers.mu_product * mu  # in its dtype, as torch's `*=`
        exp_avg, exp_avg_sq = moments(
            (beta1, beta2), buffers.exp_avg, buffers.exp_avg_sq, grads, ops
        )
        denom = ops.sqrt(ops.div(ops.borrowed(exp_avg_sq), 1 - beta2**step))
        denom = ops.add(denom, self.eps)
        product_now = mu_product.item()
        grad_size = -lr * (1.0 - mu) / (1.0 - product_now)
        avg_size = (-lr * mu_next) / (1.0 - product_now * mu_next)
        new_params = ops.addcdiv(params, grads, denom, grad_size)
        new_params = ops.addcdiv(new_params, exp_avg, denom, avg_size)
        return new_params, (mu_product, exp_avg, exp_avg_sq)
