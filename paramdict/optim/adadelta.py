"""Adadelta: steps scaled by running averages of squared gradients and updates."""

from __future__ import annotations

from typing import ClassVar

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._fields import fraction, non_negative, shared_last
from ._hyper import Rate
from ._schedules.slot import LearningRate
from ._states import AdadeltaState
from ._torch_optimizer import TorchOptimizer

__all__ = ["Adadelta", "AdadeltaState"]


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class Adadelta(TorchOptimizer[AdadeltaState]):
    """Adadelta, the functional `torch.optim.Adadelta`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adadelta`, so
    a run gives the same parameters: the update is the gradient times
    `sqrt(acc_delta + eps) / sqrt(square_avg + eps)`, scaled by `lr`. The
    attributes below are the constructor's keyword arguments, with `maximize` and
    `differentiable` (see `TorchOptimizer`).

    Attributes:
        lr: The coefficient that scales the update, in any rate form (a
            schedule too).
        rho: Smoothing constant of the running averages, in [0, 1].
        eps: Term added inside the square roots for numerical stability.
        weight_decay: The L2 penalty added to the gradient, in any rate form.

    Raises:
        ValueError: If a rate or `eps` is negative or `rho` is outside [0, 1];
            the message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> from paramdict import optim
        >>> params = ParamDict(w=torch.tensor([1.0]))
        >>> opt = optim.Adadelta(rho=0.0, eps=0.0)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([2.0])}, state)
        >>> params["w"], state.acc_delta["w"]
        (tensor([1.]), tensor([0.]))
    """

    state_type: ClassVar[type[AdadeltaState]] = AdadeltaState
    lazy_copies: ClassVar[bool] = True

    lr: LearningRate = 1.0
    rho: float = fraction(0.9)
    eps: float = non_negative(1e-6)
    weight_decay: Rate = 0.0

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdadeltaState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        rho, eps = self.rho, self.eps
        square_avg = state.square_avg.mul_(rho).addcmul_(grads, grads, value=1 - rho)
        std = square_avg.add(eps).sqrt_()
        delta = state.acc_delta.add(eps).sqrt_()
        if self.differentiable:  # its square root is saved for the backward pass
            delta = delta.clone()
        delta.div_(std).mul_(grads)
        state.acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        params.sub_(delta, alpha=lr)
