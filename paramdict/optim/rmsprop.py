"""RMSprop: gradients scaled by a running root mean square, centered or not."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, NamedTuple

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._base import TorchOptimizer
from ._fields import flag, fraction, non_negative, shared_last
from ._hyper import Rate
from ._protocol import register_state
from ._schedules.slot import LearningRate, SlotState
from ._vocabulary import Kernels

__all__ = ["RMSprop", "RMSpropState"]


@register_state
class RMSpropState(NamedTuple):
    """The state of `RMSprop`; `step` and `schedule` are as in `TorchOptimizer`.

    Attributes:
        square_avg: The running average of the squared gradients.
        momentum_buffer: The momentum buffer; empty when `momentum == 0`.
        grad_avg: The running average of the gradients; empty unless `centered`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.RMSprop(alpha=0.5, centered=True)
        >>> grads = ParamDict(w=torch.ones(2))
        >>> state = opt.step(grads, grads * 2, opt.init(grads))[1]
        >>> state.square_avg["w"], state.grad_avg["w"], len(state.momentum_buffer)
        (tensor([2., 2.]), tensor([1., 1.]), 0)
    """

    step: Tensor
    square_avg: ParamDict
    momentum_buffer: ParamDict
    grad_avg: ParamDict
    schedule: SlotState = ()


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
        buffers: RMSpropState,
        step: Tensor,
        lr: Rate,
        ops: Kernels,
        /,
    ) -> tuple[ParamDict, tuple[ParamDict, ParamDict, ParamDict]]:
        alpha = self.alpha
        momentum = self.cycled("momentum", buffers)
        square_avg = ops.mul(buffers.square_avg, alpha)
        square_avg = ops.addcmul(square_avg, grads, grads, 1 - alpha)
        grad_avg = buffers.grad_avg
        if self.centered:
            grad_avg = ops.lerp(grad_avg, grads, 1 - alpha)
            variance = ops.addcmul(ops.borrowed(square_avg), grad_avg, grad_avg, -1)
            avg = ops.sqrt(variance)
        else:
            avg = ops.sqrt(ops.borrowed(square_avg))
        avg = ops.add(avg, self.eps)
        buffer = buffers.momentum_buffer
        if self.momentum > 0:
            buffer = ops.addcdiv(ops.mul(buffer, momentum), grads, avg)
            new_params = ops.sub_scaled(params, buffer, lr)
        else:
            new_params = ops.addcdiv(params, grads, avg, -lr)
        return new_params, (square_avg, buffer, grad_avg)
