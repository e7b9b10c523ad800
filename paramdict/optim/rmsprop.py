"""RMSprop: gradients scaled by a running root mean square, centered or not."""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import attrs
from torch import Tensor

from .._paramdict import ParamDict
from ._hyper import (
    Rate,
    add_ratio,
    add_scaled,
    check_fraction,
    check_non_negative,
    check_rate,
    check_rate_keys,
    compute_dtype,
    is_zero,
    new_counter,
    operand,
    sub_scaled,
)
from ._keyed import check_real
from ._protocol import Optimizer, register_state

__all__ = ["RMSprop", "RMSpropState"]

P = TypeVar("P", bound=ParamDict)


@register_state
class RMSpropState(NamedTuple):
    """The state of `RMSprop`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        square_avg: The running average of the squared gradients.
        momentum_buffer: The momentum buffer; empty when `momentum == 0`.
        grad_avg: The running average of the gradients; empty unless `centered`.

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


@attrs.frozen(kw_only=True, eq=False)
class RMSprop(Optimizer[RMSpropState]):
    """RMSprop, the functional `torch.optim.RMSprop`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.RMSprop`, so a
    run gives the same parameters. The attributes below are the constructor's
    keyword arguments.

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`) or a ParamDict of per-key values.
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

    lr: Rate = attrs.field(default=1e-2, validator=check_rate)
    alpha: float = attrs.field(default=0.99, validator=check_fraction)
    eps: float = attrs.field(default=1e-8, validator=check_non_negative)
    weight_decay: Rate = attrs.field(default=0.0, validator=check_rate)
    momentum: float = attrs.field(default=0.0, validator=check_non_negative)
    centered: bool = False
    maximize: bool = False
    differentiable: bool = False

    def init(self, params: ParamDict, /) -> RMSpropState:
        """Return the first state: step 0 and zero averages.

        Args:
            params: The parameters to optimize; unchanged.

        Returns:
            An `RMSpropState`; buffers for options that are off are empty.

        Raises:
            TypeError: If a value is not a real floating-point tensor.
            ValueError: If a per-key rate has other keys than `params`.

        Example:
            >>> from paramdict import optim
            >>> state = optim.RMSprop(centered=True).init(ParamDict(w=torch.ones(2)))
            >>> state.square_avg["w"], state.grad_avg["w"], len(state.momentum_buffer)
            (tensor([0., 0.]), tensor([0., 0.]), 0)
        """
        check_real(params)
        check_rate_keys(params, "lr", self.lr)
        check_rate_keys(params, "weight_decay", self.weight_decay)
        return RMSpropState(
            new_counter(params),
            params.zeros_like(),
            params.zeros_like() if self.momentum > 0 else ParamDict(),
            params.zeros_like() if self.centered else ParamDict(),
        )

    def _update(
        self, params: P, grads: ParamDict, state: RMSpropState, /
    ) -> tuple[P, RMSpropState]:
        alpha = self.alpha
        if self.maximize:
            grads = grads.neg()
        if not is_zero(self.weight_decay):
            grads = add_scaled(grads, params, self.weight_decay)
        dtype = compute_dtype(params)
        square_avg = state.square_avg.mul(operand(alpha, dtype, state.step))
        square_avg = square_avg.addcmul(grads, grads, value=1 - alpha)
        grad_avg = state.grad_avg
        if self.centered:
            grad_avg = grad_avg.lerp(grads, 1 - alpha)
            variance = square_avg.addcmul(grad_avg, grad_avg, value=-1)
            avg = variance.sqrt()
        else:
            avg = square_avg.sqrt()
        avg = avg.add(operand(self.eps, dtype, state.step))
        buffer = state.momentum_buffer
        if self.momentum > 0:
            momentum = operand(self.momentum, dtype, state.step)
            buffer = add_ratio(buffer.mul(momentum), grads, avg)
            new_params = sub_scaled(params, buffer, self.lr)
        elif isinstance(self.lr, ParamDict):
            new_params = add_ratio(params, grads.mul(-self.lr), avg)
        elif isinstance(self.lr, Tensor):
            minus_lr = operand(-self.lr, dtype, state.step)
            new_params = add_ratio(params, grads.mul(minus_lr), avg)
        else:
            new_params = add_ratio(params, grads, avg, value=-self.lr)
        new_state = RMSpropState(state.step + 1, square_avg, buffer, grad_avg)
        return new_params, new_state
