"""Adamax: Adam with the infinity norm."""

from __future__ import annotations

from typing import ClassVar

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._adam_moments import AdamOptions, in_inherited_order
from ._hyper import Rate, quotient
from ._schedules.slot import LearningRate
from ._states import AdamaxState

__all__ = ["Adamax", "AdamaxState"]


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
        host = None if isinstance(lr, Tensor) else self.host_numbers(step, lr, beta1)
        if host is not None:
            t, rate, b1 = host
            step_size: float | Tensor | ParamDict = -(rate / (1 - b1**t))
        else:
            step_size = quotient(lr, 1 - beta1**step, negated=True)
        params.addcdiv_(state.exp_avg, state.exp_inf, value=step_size)
