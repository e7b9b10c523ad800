"""Adamax: Adam with the infinity norm."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._adam_moments import AdamOptions, in_inherited_order
from ._hyper import Rate, host_numbers, quotient
from ._registry import register_state
from ._schedules.slot import LearningRate, SlotState

__all__ = ["Adamax", "AdamaxState"]


@register_state
class AdamaxState(NamedTuple):
    """The state of `Adamax`.

    `AdamState`'s `step`, `exp_avg` and `schedule` (the same meaning), and:

    Attributes:
        exp_inf: The exponentially weighted infinity norm of the gradients,
            in place of `exp_avg_sq`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adamax(betas=(0.5, 0.5), eps=0.0)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = ParamDict(w=torch.tensor([2.0, -3.0]))
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.exp_avg["w"], state.exp_inf["w"]
        (tensor([ 1.0000, -1.5000]), tensor([2., 3.]))
    """

    step: Tensor
    exp_avg: ParamDict
    exp_inf: ParamDict
    schedule: SlotState = ()


@attrs.frozen(kw_only=True, eq=False, field_transformer=in_inherited_order)
class Adamax(AdamOptions[AdamaxState]):
    """Adamax, the functional `torch.optim.Adamax`: Adam with the infinity norm.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adamax`, so a
    run gives the same parameters. The second moment is replaced by an
    exponentially weighted infinity norm, `max(beta2 * exp_inf, |g| + eps)`,
    whose decay is the second beta. Its options are `Adam`'s without
    `amsgrad` and `decoupled_weight_decay` (same meaning and checks): the
    weight decay is an L2 penalty added to the gradient.

    Example:
        >>> from paramdict import ParamDict, optim
        >>> opt = optim.Adamax(lr=0.1)
        >>> params = ParamDict(w=torch.tensor([1.0, -1.0]))
        >>> state = opt.init(params)
        >>> for g in ([1.0, -1.0], [4.0, 0.5]):
        ...     params, state = opt.step(params, {"w": torch.tensor(g)}, state)
        >>> state.exp_inf["w"]  # max(beta2 * exp_inf, |g| + eps)
        tensor([4.0000, 0.9990])
    """

    state_type: ClassVar[type[AdamaxState]] = AdamaxState
    lazy_copies: ClassVar[bool] = True

    lr: LearningRate = 2e-3

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdamaxState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        beta1, beta2 = self.cycled("betas", state)
        state.exp_avg.lerp_(grads, 1 - beta1)
        norm = grads.abs().add_(self.eps)
        state.exp_inf.mul_(beta2).maximum_(norm)
        host = (
            None
            if isinstance(lr, Tensor)
            else host_numbers(self.differentiable, step, lr, beta1)
        )
        if host is not None:
            t, rate, b1 = host
            step_size: float | Tensor | ParamDict = -(rate / (1 - b1**t))
        else:
            step_size = quotient(lr, 1 - beta1**step, negated=True)
        params.addcdiv_(state.exp_avg, state.exp_inf, value=step_size)
