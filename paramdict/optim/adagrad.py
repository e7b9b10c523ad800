"""Adagrad: per-coordinate steps scaled by the accumulated squared gradients."""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import attrs
from torch import Tensor

from .._paramdict import ParamDict
from ._hyper import (
    Rate,
    add_ratio,
    add_scaled,
    check_non_negative,
    check_rate,
    check_rate_keys,
    compute_dtype,
    is_zero,
    new_counter,
    operand,
    quotient,
)
from ._keyed import check_real
from ._protocol import Optimizer, register_state

__all__ = ["Adagrad", "AdagradState"]

P = TypeVar("P", bound=ParamDict)


@register_state
class AdagradState(NamedTuple):
    """The state of `Adagrad`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        sum: The accumulated squared gradients, keyed like the parameters.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adagrad()
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = ParamDict(w=torch.tensor([2.0, 3.0]))
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.sum["w"]
        tensor([4., 9.])
    """

    step: Tensor
    sum: ParamDict


@attrs.frozen(kw_only=True, eq=False)
class Adagrad(Optimizer[AdagradState]):
    """Adagrad, the functional `torch.optim.Adagrad`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adagrad`, so a
    run gives the same parameters. The decayed learning rate
    `lr / (1 + (step - 1) * lr_decay)` is computed in double precision from a
    step-count tensor. The attributes below are the constructor's keyword
    arguments.

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`) or a ParamDict of per-key values.
        lr_decay: Learning-rate decay per step.
        weight_decay: L2 penalty added to the gradient; a number, a 0-dim tensor
            or a ParamDict of per-key values.
        initial_accumulator_value: Starting value of the accumulated squares.
        eps: Term added to the denominator for numerical stability.
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step` (see `step`).

    Raises:
        ValueError: If a hyperparameter is negative; the message names it.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0]))
        >>> opt = optim.Adagrad(lr=0.5)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([2.0])}, state)
        >>> params["w"]
        tensor([0.5000])
    """

    lr: Rate = attrs.field(default=1e-2, validator=check_rate)
    lr_decay: float = attrs.field(default=0.0, validator=check_non_negative)
    weight_decay: Rate = attrs.field(default=0.0, validator=check_rate)
    initial_accumulator_value: float = attrs.field(
        default=0.0, validator=check_non_negative
    )
    eps: float = attrs.field(default=1e-10, validator=check_non_negative)
    maximize: bool = False
    differentiable: bool = False

    def init(self, params: ParamDict, /) -> AdagradState:
        """Return the first state: step 0, sums at `initial_accumulator_value`.

        Args:
            params: The parameters to optimize; unchanged.

        Returns:
            An `AdagradState`.

        Raises:
            TypeError: If a value is not a real floating-point tensor.
            ValueError: If a per-key rate has other keys than `params`.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.Adagrad(initial_accumulator_value=0.1)
            >>> opt.init(ParamDict(w=torch.ones(2))).sum["w"]
            tensor([0.1000, 0.1000])
        """
        check_real(params)
        check_rate_keys(params, "lr", self.lr)
        check_rate_keys(params, "weight_decay", self.weight_decay)
        return AdagradState(
            new_counter(params), params.full_like(self.initial_accumulator_value)
        )

    def _update(
        self, params: P, grads: ParamDict, state: AdagradState, /
    ) -> tuple[P, AdagradState]:
        step = state.step + 1
        if self.maximize:
            grads = grads.neg()
        if not is_zero(self.weight_decay):
            grads = add_scaled(grads, params, self.weight_decay)
        dtype = compute_dtype(params)
        minus_clr = -quotient(self.lr, 1 + (step - 1) * self.lr_decay)
        if isinstance(minus_clr, Tensor):
            minus_clr = operand(minus_clr, dtype, step)
        total = state.sum.addcmul(grads, grads)
        std = total.sqrt().add(operand(self.eps, dtype, step))
        # `p + (-clr * g) / std`, torch's rounding with the rate as a tensor.
        new_params = add_ratio(params, grads.mul(minus_clr), std)
        return new_params, AdagradState(step, total)
