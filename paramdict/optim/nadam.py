"""NAdam: Adam with Nesterov momentum."""

from __future__ import annotations

from typing import ClassVar

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._adam_moments import AdamOptions, in_inherited_order, moments_
from ._fields import flag, non_negative
from ._hyper import Rate, product, quotient, state_scalar_dtype
from ._schedules.slot import LearningRate
from ._states import NAdamState

__all__ = ["NAdam", "NAdamState"]


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
    lazy_copies: ClassVar[bool] = True

    lr: LearningRate = 2e-3
    momentum_decay: float = non_negative(4e-3)
    decoupled_weight_decay: bool = flag()

    def init_state(self, params: ParamDict, /) -> NAdamState:
        """Return the first state: step 0, `mu_product` 1 and zero moments."""
        counter = self.counter(params)
        # `new_ones`: on the counter's device, fake and meta counters alike.
        mu_product = counter.new_ones((), dtype=state_scalar_dtype(counter.device))
        return NAdamState(counter, mu_product, params.zeros_like(), params.zeros_like())

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: NAdamState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        betas = self.cycled("betas", state)
        beta1, beta2 = betas
        host = None if isinstance(lr, Tensor) else self.host_numbers(step, lr, *betas)
        moments_(betas, state.exp_avg, state.exp_avg_sq, grads)
        grad_size: float | Tensor | ParamDict
        avg_size: float | Tensor | ParamDict
        if host is not None:
            t, rate, b1, b2 = host
            decay = self.momentum_decay
            mu = b1 * (1.0 - 0.5 * 0.96 ** (t * decay))
            mu_next = b1 * (1.0 - 0.5 * 0.96 ** ((t + 1) * decay))
            state.mu_product.mul_(mu)
            denom = state.exp_avg_sq.div(1 - b2**t).sqrt_()
            denom = denom.add(self.eps) if self.differentiable else denom.add_(self.eps)
            if self.differentiable:
                # torch's differentiable step scales the terms by 0-dim tensors
                # of the product's dtype, whose arithmetic this repeats.
                mu_product = state.mu_product
                grad_factor = (-rate * (1.0 - mu)) / (1.0 - mu_product)
                avg_factor = (-rate * mu_next) / (1.0 - mu_product * mu_next)
                params.addcdiv_(grads.mul(grad_factor), denom)
                params.addcdiv_(state.exp_avg.mul(avg_factor), denom)
                return
            product_now = state.mu_product.item()
            grad_size = -rate * (1.0 - mu) / (1.0 - product_now)
            avg_size = -rate * mu_next / (1.0 - product_now * mu_next)
        else:
            mu_t = _momentum(beta1, step, self.momentum_decay)
            mu_next_t = _momentum(beta1, step + 1, self.momentum_decay)
            state.mu_product.mul_(mu_t.to(state.mu_product.dtype))
            denom = state.exp_avg_sq.div(1 - beta2**step).sqrt_()
            denom = denom.add(self.eps) if self.differentiable else denom.add_(self.eps)
            now = state.mu_product.to(step.dtype)
            # `mu - 1` is `-(1 - mu)` bit for bit, in one operation.
            grad_size = quotient(product(lr, mu_t - 1.0), 1.0 - now)
            avg_size = quotient(product(lr, -mu_next_t), 1.0 - now * mu_next_t)
        params.addcdiv_(grads, denom, value=grad_size)
        params.addcdiv_(state.exp_avg, denom, value=avg_size)
