"""RMSprop: gradients scaled by a running root mean square, centered or not."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._fields import flag, fraction, non_negative, shared_last
from ._hyper import Rate
from ._schedules.slot import LearningRate
from ._states import RMSpropState
from ._torch_optimizer import TorchOptimizer

__all__ = ["RMSprop", "RMSpropState"]


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class RMSprop(TorchOptimizer[RMSpropState]):
    """RMSprop, the functional `torch.optim.RMSprop`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.RMSprop`, so a
    run gives the same parameters. The attributes below are the constructor's
    keyword arguments, with `maximize` and `differentiable` (see
    `TorchOptimizer`).

    Attributes:
        lr: The learning rate, in any of its forms (a schedule too).
        alpha: Smoothing constant of the running averages, in [0, 1].
        eps: Term added to the denominator for numerical stability.
        weight_decay: The L2 penalty added to the gradient, in any rate form.
        momentum: Momentum factor.
        centered: Normalize by an estimate of the gradient's variance instead of
            its second moment.

    Raises:
        ValueError: If a hyperparameter is negative or `alpha` is above 1; the
            message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> from paramdict import optim
        >>> params = ParamDict(w=torch.tensor([1.0]))
        >>> opt = optim.RMSprop(lr=0.01, alpha=0.75)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([2.0])}, state)
        >>> params["w"]
        tensor([0.9800])
    """

    state_type: ClassVar[type[RMSpropState]] = RMSpropState
    lazy_copies: ClassVar[bool] = True
    buffer_options: ClassVar[Mapping[str, str]] = {
        "momentum_buffer": "momentum > 0",
        "grad_avg": "centered=True",
    }

    lr: LearningRate = 1e-2
    alpha: float = fraction(0.99)
    eps: float = non_negative(1e-8)
    weight_decay: Rate = 0.0
    momentum: float = non_negative(0.0)
    centered: bool = flag()

    @override
    def init_state(self, params: ParamDict, /) -> RMSpropState:
        """Return the first state: step 0 and zero averages."""
        return RMSpropState(
            self.counter(params),
            params.zeros_like(),
            params.zeros_like() if self.momentum > 0 else ParamDict(),
            params.zeros_like() if self.centered else ParamDict(),
        )

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: RMSpropState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        alpha = self.alpha
        square_avg = state.square_avg.mul_(alpha).addcmul_(
            grads, grads, value=1 - alpha
        )
        if self.centered:
            grad_avg = state.grad_avg.lerp_(grads, 1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
        else:
            avg = square_avg.sqrt()
        # Recorded, the square root's result is saved: added to out of place.
        avg = avg.add(self.eps) if self.differentiable else avg.add_(self.eps)
        if self.momentum > 0:
            momentum = self.cycled("momentum", state)
            buffer = state.momentum_buffer.mul_(momentum).addcdiv_(grads, avg)
            params.sub_(buffer, alpha=lr)
        else:
            params.addcdiv_(grads, avg, value=-lr)
