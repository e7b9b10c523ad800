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
from ._kernels import Kernels
from ._protocol import register_state
from ._scheduled import LearningRate, SlotState

__all__ = ["RMSprop", "RMSpropState"]


@register_state
class RMSpropState(NamedTuple):
    """The state of `RMSprop`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        square_avg: The running average of the squared gradients.
        momentum_buffer: The momentum buffer; empty when `momentum == 0`.
        grad_avg: The running average of the gradients; empty unless `centered`.
        schedule: The state of the `lr` schedule; `()` when `lr` is a rate.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.RMSprop(alpha=0.5)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = ParamDict(w=torch.tensor([2.0, 2.0]))
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.square_avg["w"]
        tensor([2., 2.])
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
    keyword arguments.

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`), a ParamDict of per-key values, or a
            schedule such as `optim.CosineAnnealingLR(base_lr=0.1, T_max=100)`.
        alpha: Smoothing constant of the running averages, in [0, 1].
        eps: Term added to the denominator for numerical stability.
        weight_decay: L2 penalty added to the gradient; a number, a 0-dim tensor
            or a ParamDict of per-key values.
        momentum: Momentum factor.
        centered: Normalize by an estimate of the gradient's variance instead of
            its second moment.
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step` (see `step`).

    Raises:
        ValueError: If a hyperparameter is negative or `alpha` is above 1; the
            message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
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

    def init_state(self, params: ParamDict, /) -> RMSpropState:
        """Return the first state: step 0 and zero averages.

        Args:
            params: The parameters to optimize (checked by `init`); unchanged.

        Returns:
            An `RMSpropState`; buffers for options that are off are empty.

        Example:
            >>> from paramdict import optim
            >>> state = optim.RMSprop(centered=True).init(ParamDict(w=torch.ones(2)))
            >>> state.square_avg["w"], state.grad_avg["w"], len(state.momentum_buffer)
            (tensor([0., 0.]), tensor([0., 0.]), 0)
        """
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
