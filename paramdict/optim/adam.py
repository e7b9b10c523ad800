"""Adam and AdamW: adaptive moment estimation, with L2 or decoupled weight decay."""

from __future__ import annotations

from typing import NamedTuple, TypeVar

import attrs
from torch import Tensor

from .._paramdict import ParamDict
from ._hyper import (
    Rate,
    add_ratio,
    add_scaled,
    check_betas,
    check_non_negative,
    check_rate,
    check_rate_keys,
    compute_dtype,
    decay_factor,
    is_zero,
    new_counter,
    operand,
    quotient,
)
from ._keyed import check_real
from ._protocol import Optimizer, register_state

__all__ = ["Adam", "AdamState", "AdamW"]

P = TypeVar("P", bound=ParamDict)


@register_state
class AdamState(NamedTuple):
    """The state of `Adam` and `AdamW`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        exp_avg: The running average of the gradients, keyed like the parameters.
        exp_avg_sq: The running average of the squared gradients.
        max_exp_avg_sq: The running maximum of `exp_avg_sq` (AMSGrad); empty
            unless `amsgrad=True`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adam(betas=(0.5, 0.5))
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = ParamDict(w=torch.tensor([2.0, 2.0]))
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.exp_avg["w"], state.exp_avg_sq["w"]
        (tensor([1., 1.]), tensor([2., 2.]))
    """

    step: Tensor
    exp_avg: ParamDict
    exp_avg_sq: ParamDict
    max_exp_avg_sq: ParamDict


def _init(opt: Adam | AdamW, params: ParamDict) -> AdamState:
    check_real(params)
    check_rate_keys(params, "lr", opt.lr)
    check_rate_keys(params, "weight_decay", opt.weight_decay)
    return AdamState(
        new_counter(params),
        params.zeros_like(),
        params.zeros_like(),
        params.zeros_like() if opt.amsgrad else ParamDict(),
    )


def _update(
    opt: Adam | AdamW,
    params: P,
    grads: ParamDict,
    state: AdamState,
    *,
    decoupled: bool,
) -> tuple[P, AdamState]:
    beta1, beta2 = opt.betas
    lr = opt.lr
    step = state.step + 1
    dtype = compute_dtype(params)
    if opt.maximize:
        grads = grads.neg()
    if not is_zero(opt.weight_decay):
        if decoupled:
            factor = decay_factor(lr, opt.weight_decay)
            if not isinstance(factor, ParamDict):
                factor = operand(factor, dtype, step)
            params = params.mul(factor)
        else:
            grads = add_scaled(grads, params, opt.weight_decay)
    exp_avg = state.exp_avg.lerp(grads, 1 - beta1)
    exp_avg_sq = state.exp_avg_sq.mul(operand(beta2, dtype, step))
    exp_avg_sq = exp_avg_sq.addcmul(grads, grads, value=1 - beta2)
    max_exp_avg_sq = state.max_exp_avg_sq
    second = exp_avg_sq
    if opt.amsgrad:
        max_exp_avg_sq = max_exp_avg_sq.maximum(exp_avg_sq)
        second = max_exp_avg_sq
    # Bias corrections in double precision from the step tensor: the numbers
    # torch.optim computes with Python floats, without reading the step on the host.
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step).sqrt()
    step_size = -quotient(lr, bias_correction1)
    if isinstance(step_size, Tensor):
        step_size = operand(step_size, dtype, step)
    denom = second.sqrt().div(operand(bias_correction2_sqrt, dtype, step))
    denom = denom.add(operand(opt.eps, dtype, step))
    # `p + (step_size * m) / denom`: the same rounding as torch's
    # `addcdiv(m, denom, value=step_size)`, with `step_size` a tensor.
    new_params = add_ratio(params, exp_avg.mul(step_size), denom)
    return new_params, AdamState(step, exp_avg, exp_avg_sq, max_exp_avg_sq)


@attrs.frozen(kw_only=True, eq=False)
class Adam(Optimizer[AdamState]):
    """Adam, the functional `torch.optim.Adam`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adam`, so a run
    gives the same parameters. The bias corrections are computed in double
    precision from a step-count tensor, so nothing is read back to the host and
    `torch.compile` does not specialize on the step.

    The attributes below are the constructor's keyword arguments. Configurations
    are immutable and compared by identity (hyperparameters may be tensors).

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`) or a ParamDict of per-key values.
        betas: Coefficients of the running averages of the gradient and its
            square, each in [0, 1).
        eps: Term added to the denominator for numerical stability.
        weight_decay: Weight decay: added to the gradient as an L2 penalty, or
            applied to the parameters with `decoupled_weight_decay=True`; a
            number, a 0-dim tensor or a ParamDict of per-key values.
        amsgrad: Use the running maximum of the second moment (AMSGrad).
        maximize: Maximize the objective instead of minimizing it.
        decoupled_weight_decay: Decay the parameters directly (then this is
            `AdamW`).
        differentiable: Keep the autograd graph through `step` (see `step`).

    Raises:
        ValueError: If `lr`, `eps` or `weight_decay` is negative or a beta is
            outside [0, 1); the message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> opt = optim.Adam(lr=0.1)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([0.9000, 2.1000])
    """

    lr: Rate = attrs.field(default=1e-3, validator=check_rate)
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), validator=check_betas
    )
    eps: float = attrs.field(default=1e-8, validator=check_non_negative)
    weight_decay: Rate = attrs.field(default=0.0, validator=check_rate)
    amsgrad: bool = False
    maximize: bool = False
    decoupled_weight_decay: bool = False
    differentiable: bool = False

    def init(self, params: ParamDict, /) -> AdamState:
        """Return the first state: step 0 and zero moments.

        Args:
            params: The parameters to optimize; unchanged.

        Returns:
            An `AdamState`; `max_exp_avg_sq` is empty unless `amsgrad=True`.

        Raises:
            TypeError: If a value is not a real floating-point tensor.
            ValueError: If a per-key rate has other keys than `params`.

        Example:
            >>> from paramdict import optim
            >>> state = optim.Adam().init(ParamDict(w=torch.ones(2)))
            >>> state.step, state.exp_avg["w"], len(state.max_exp_avg_sq)
            (tensor(0., dtype=torch.float64), tensor([0., 0.]), 0)
        """
        return _init(self, params)

    def _update(
        self, params: P, grads: ParamDict, state: AdamState, /
    ) -> tuple[P, AdamState]:
        return _update(
            self, params, grads, state, decoupled=self.decoupled_weight_decay
        )


@attrs.frozen(kw_only=True, eq=False)
class AdamW(Optimizer[AdamState]):
    """AdamW, the functional `torch.optim.AdamW`: Adam with decoupled weight decay.

    The parameters are multiplied by `1 - lr * weight_decay` before the Adam
    update, as in `torch.optim.AdamW`; everything else is `Adam`. The attributes
    below are the constructor's keyword arguments.

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`) or a ParamDict of per-key values.
        betas: Coefficients of the running averages, each in [0, 1).
        eps: Term added to the denominator for numerical stability.
        weight_decay: Decoupled weight decay: a number, a 0-dim tensor or a
            ParamDict of per-key values (e.g. zero for biases).
        amsgrad: Use the running maximum of the second moment (AMSGrad).
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step` (see `step`).

    Raises:
        ValueError: If `lr`, `eps` or `weight_decay` is negative or a beta is
            outside [0, 1); the message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0]))
        >>> opt = optim.AdamW(lr=0.1, weight_decay=0.5)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([0.0])}, state)
        >>> params["w"]
        tensor([0.9500])
    """

    lr: Rate = attrs.field(default=1e-3, validator=check_rate)
    betas: tuple[float, float] = attrs.field(
        default=(0.9, 0.999), validator=check_betas
    )
    eps: float = attrs.field(default=1e-8, validator=check_non_negative)
    weight_decay: Rate = attrs.field(default=1e-2, validator=check_rate)
    amsgrad: bool = False
    maximize: bool = False
    differentiable: bool = False

    def init(self, params: ParamDict, /) -> AdamState:
        """Return the first state: step 0 and zero moments.

        Args:
            params: The parameters to optimize; unchanged.

        Returns:
            An `AdamState`; `max_exp_avg_sq` is empty unless `amsgrad=True`.

        Raises:
            TypeError: If a value is not a real floating-point tensor.
            ValueError: If a per-key rate has other keys than `params`.

        Example:
            >>> from paramdict import optim
            >>> state = optim.AdamW(amsgrad=True).init(ParamDict(w=torch.ones(2)))
            >>> state.max_exp_avg_sq["w"]
            tensor([0., 0.])
        """
        return _init(self, params)

    def _update(
        self, params: P, grads: ParamDict, state: AdamState, /
    ) -> tuple[P, AdamState]:
        return _update(self, params, grads, state, decoupled=True)
