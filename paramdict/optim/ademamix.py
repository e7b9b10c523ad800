"""AdEMAMix: Adam with a second, slow running average mixed into its update.

Pagliardini et al., 2024, "The AdEMAMix Optimizer: Better, Faster, Older".
"""

from __future__ import annotations

import math
from typing import ClassVar

import attrs
import torch
from torch import Tensor
from typing_extensions import override

# The public names only (`paramdict.optim.*`), from the modules defining them.
from .._paramdict import ParamDict
from . import fields
from ._hyper import Rate, check_optional_number
from ._schedules.slot import LearningRate
from ._states import AdEMAMixState
from ._torch_optimizer import TorchOptimizer

__all__ = ["AdEMAMix", "AdEMAMixState"]


@attrs.frozen(kw_only=True, eq=False, field_transformer=fields.shared_last)
class AdEMAMix(TorchOptimizer[AdEMAMixState]):
    """AdEMAMix: Adam's update plus `alpha` times a slow running average.

    The paper's Algorithm 1 (Pagliardini et al., 2024), with its warm-ups of
    `alpha` and `beta3` and AdamW's decoupled weight decay. With `t` the step
    number and `g` the gradient:

        m1 = beta1 * m1 + (1 - beta1) * g                 (fast, bias-corrected)
        m2 = beta3_t * m2 + (1 - beta3_t) * g             (slow, not corrected)
        v  = beta2 * v + (1 - beta2) * g * g
        p  = p * (1 - lr * weight_decay)
        p  = p - lr * (m1 / (1 - beta1 ** t) + alpha_t * m2)
                    / (sqrt(v) / sqrt(1 - beta2 ** t) + eps)

    Without `t_alpha_beta3`, `alpha_t = alpha` and `beta3_t = beta3`. With it,
    both warm up over that many steps (`alpha_at`, `beta3_at`): `alpha`
    linearly from 0, and `beta3` so that its half-life `ln(0.5) / ln(beta3_t)`
    grows linearly from `beta1`'s to `beta3`'s. The paper recommends a warm-up
    as long as training for a large `beta3`. Names and defaults are the
    authors' code's (`alpha=2`; the paper uses 5 to 10 with `beta3=0.9999`);
    the plain-torch reference in the tests follows it.

    Attributes:
        lr: The learning rate: a number, a 0-dim tensor, a per-key ParamDict,
            or a schedule.
        betas: `beta1` (fast average), `beta2` (squared gradients) and `beta3`
            (slow average), each in [0, 1).
        alpha: The weight of the slow average in the update.
        t_alpha_beta3: The steps over which `alpha` and `beta3` warm up (None:
            none, both at their value from the first step).
        eps: Term added to the denominator.
        weight_decay: The decoupled weight decay, in any of the forms of `lr`.
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.AdEMAMix(lr=0.1, alpha=5.0, t_alpha_beta3=100)
        >>> params = ParamDict(w=torch.tensor([1.0, -1.0]))
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([ 0.9000, -0.9000])
    """

    state_type: ClassVar[type[AdEMAMixState]] = AdEMAMixState
    decoupled_decay: ClassVar[bool] = True
    lazy_copies: ClassVar[bool] = True

    lr: LearningRate = 1e-3
    betas: tuple[float, float, float] = fields.betas((0.9, 0.999, 0.9999))
    alpha: float = fields.non_negative(2.0)
    t_alpha_beta3: float | None = attrs.field(
        default=None,
        validator=check_optional_number(
            lambda t: 0 < t < math.inf, "positive and finite"
        ),
    )
    eps: float = fields.non_negative(1e-8)
    weight_decay: Rate = 0.0

    def alpha_at(self, step: float | Tensor, /) -> float | Tensor:
        """Return the slow average's weight at `step`: `alpha * min(1, step / T)`.

        Args:
            step: The step number (1 for the first step): a number, or a 0-dim
                tensor (then the weight is one too).

        Returns:
            The weight; `alpha` itself without a warm-up (`t_alpha_beta3=None`).

        Example:
            >>> from paramdict import optim
            >>> opt = optim.AdEMAMix(alpha=8.0, t_alpha_beta3=100)
            >>> opt.alpha_at(25), opt.alpha_at(300), opt.alpha_at(torch.tensor(50.0))
            (2.0, 8.0, tensor(4.))
        """
        if self.t_alpha_beta3 is None:
            return self.alpha
        weight = step * self.alpha / self.t_alpha_beta3
        if isinstance(weight, Tensor):
            return torch.clamp(weight, max=self.alpha)
        return min(weight, self.alpha)

    def beta3_at(
        self, step: float | Tensor, beta1: float | Tensor, /
    ) -> float | Tensor:
        """Return the slow average's decay at `step`, warming up from `beta1`.

        Its half-life `ln(0.5) / ln(beta3_t)` is linear in `step`, from
        `beta1`'s at step 0 to `beta3`'s at `t_alpha_beta3`, then stays:
        `beta3_t = min(exp(ln(b1) ln(b3) / ((1 - a) ln(b3) + a ln(b1))), b3)`
        with `a = step / t_alpha_beta3`.

        Args:
            step: The step number (1 for the first step): a number, or a 0-dim
                tensor (then the decay is one too).
            beta1: The fast average's decay (`betas[0]`, or a cycled one).

        Returns:
            The decay; `beta3` itself without a warm-up (`t_alpha_beta3=None`).

        Example:
            >>> from paramdict import optim
            >>> opt = optim.AdEMAMix(betas=(0.9, 0.999, 0.9999), t_alpha_beta3=100)
            >>> half_life = lambda b: math.log(0.5) / math.log(float(b))
            >>> round(half_life(opt.beta3_at(50, 0.9)), 1)
            3468.9
            >>> round((half_life(0.9) + half_life(0.9999)) / 2, 1)
            3468.9
        """
        beta3 = self.betas[2]
        if self.t_alpha_beta3 is None:
            return beta3
        log_beta3 = math.log(beta3)
        a = step / self.t_alpha_beta3
        if isinstance(a, Tensor) or isinstance(beta1, Tensor):
            log1 = torch.log(torch.as_tensor(beta1, dtype=torch.float64))
            power = log1 * log_beta3 / ((1 - a) * log_beta3 + a * log1)
            return torch.clamp(torch.exp(power), max=beta3)
        log_beta1 = math.log(beta1)
        exponent = log_beta1 * log_beta3 / ((1.0 - a) * log_beta3 + a * log_beta1)
        return min(math.exp(exponent), beta3)

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdEMAMixState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        beta1: float | Tensor = self.cycled("betas", state)[0]
        _, beta2, _ = self.betas
        t: float | Tensor = step
        bias2_sqrt: float | Tensor
        # Python floats where the step and the rate are read for free (eager).
        host = self.host_numbers(step, lr, beta1)
        if host is not None:
            t, lr, beta1 = host
            bias2_sqrt = math.sqrt(1 - beta2**t)
        else:
            bias2_sqrt = (1 - beta2**step).sqrt()
        alpha = self.alpha_at(t)
        beta3 = self.beta3_at(t, beta1)
        # `lerp_` rather than the authors' scale-and-add: the same averages to
        # rounding, one pass instead of two (as `pytorch_optimizer` computes them).
        state.exp_avg_fast.lerp_(grads, 1 - beta1)
        state.exp_avg_slow.lerp_(grads, 1 - beta3)
        state.exp_avg_sq.mul_(beta2).addcmul_(grads, grads, value=1 - beta2)
        denom = state.exp_avg_sq.sqrt()
        # Recorded, the root's result is saved for the backward pass.
        denom = denom.div(bias2_sqrt) if self.differentiable else denom.div_(bias2_sqrt)
        denom.add_(self.eps)
        update = state.exp_avg_fast.div(1 - beta1**t)
        update.add_(state.exp_avg_slow, alpha=alpha)
        params.addcdiv_(update, denom, value=-lr)
