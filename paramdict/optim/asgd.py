"""ASGD: averaged stochastic gradient descent, with a decaying step size."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple, cast

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._base import TorchOptimizer
from ._fields import shared_last
from ._hyper import (
    Rate,
    check_number,
    check_rate_keys,
    quotient,
    state_scalar_dtype,
)
from ._protocol import register_state
from ._schedules.slot import LearningRate, SlotState, initial_rate
from ._vocabulary import Kernels

__all__ = ["ASGD", "ASGDState"]


@register_state
class ASGDState(NamedTuple):
    """The state of `ASGD`: `step`, `eta`, `mu`, `ax` and `schedule`.

    `eta` and `mu` are 0-dim tensors in torch.optim's dtype for them (float32
    unless the default dtype is float64), which keeps its rounding; with a
    per-key learning rate `eta` is a ParamDict of per-key values in that dtype.

    Attributes:
        eta: The step size of the next step.
        mu: The averaging coefficient of the next step.
        ax: The running average of the parameters, keyed like them.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.ASGD(lr=0.5, lambd=0.0)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> _, state = opt.step(params, params.ones_like(), opt.init(params))
        >>> state.eta, state.mu, state.ax["w"]
        (tensor(0.5000), tensor(1.), tensor([0.5000, 1.5000]))
    """

    step: Tensor
    eta: Tensor | ParamDict
    mu: Tensor
    ax: ParamDict
    schedule: SlotState = ()


def _eta(lr: Rate, lambd: float, alpha: float, step: Tensor) -> Tensor | ParamDict:
    """Return `lr / (1 + lambd * lr * step) ** alpha` as torch.optim rounds it."""
    if isinstance(lr, ParamDict):
        return lr.map(lambda r: r / (1 + lambd * r * step.to(r.dtype)) ** alpha)
    if isinstance(lr, Tensor):
        return lr / (1 + lambd * lr * step.to(lr.dtype)) ** alpha
    return quotient(lr, (1 + lambd * lr * step) ** alpha)


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class ASGD(TorchOptimizer[ASGDState]):
    """Averaged SGD, the functional `torch.optim.ASGD`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.ASGD`, so a
    run gives the same parameters. Each step decays the parameters by
    `1 - lambd * eta` and moves them by `-eta * grad`; the step size decays as
    `eta = lr / (1 + lambd * lr * t) ** alpha`, and from step `t0` on the
    state's `ax` averages the parameters (`mu = 1 / max(1, t - t0)`). The
    attributes below are the constructor's keyword arguments, with `maximize`
    and `differentiable` (see `TorchOptimizer`).

    Attributes:
        lr: The learning rate, in any of its forms (a schedule too; a tensor
            is learnable through `eta`).
        lambd: Decay term.
        alpha: Power of the step-size decay.
        t0: The step at which averaging starts.
        weight_decay: The L2 penalty added to the gradient, in any rate form.

    Raises:
        ValueError: If `lr` or `weight_decay` is negative; the message names it.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> from paramdict import optim
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> opt = optim.ASGD(lr=0.1, lambd=0.0)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([0.7000, 2.3000])
    """

    state_type: ClassVar[type[ASGDState]] = ASGDState

    lr: LearningRate = 1e-2
    lambd: float = attrs.field(default=1e-4, validator=check_number)
    alpha: float = attrs.field(default=0.75, validator=check_number)
    t0: float = attrs.field(default=1e6, validator=check_number)
    weight_decay: Rate = 0.0

    @override
    def init_state(self, params: ParamDict, /) -> ASGDState:
        """Return the first state: step 0, `eta = lr`, `mu = 1`, `ax = 0`."""
        counter = self.counter(params)
        dtype = state_scalar_dtype(counter.device)
        first = initial_rate(self.lr, params)
        lr = self.rate("lr", counter + 1) if first is None else first
        eta = lr if isinstance(lr, ParamDict) else counter.new_full((), 0).add(lr)
        return ASGDState(
            counter,
            eta.to(dtype),
            torch.ones((), dtype=dtype, device=counter.device),
            params.zeros_like(),
        )

    def check_state(self, params: ParamDict, state: ASGDState, /) -> None:
        """Raise unless `state` is an `ASGDState` for `params`.

        Args:
            params: The parameters of the step.
            state: The state to check.

        Raises:
            TypeError: If `state` is not an `ASGDState`, or a field is of the
                wrong kind.
            ValueError: If `ax`'s keys, shapes or dtypes are not `params'`, or
                a per-key `eta` has other keys.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.ASGD()
            >>> opt.check_state(ParamDict(w=torch.ones(2)), optim.SGD().init(
            ...     ParamDict(w=torch.ones(2))))
            Traceback (most recent call last):
            ...
            TypeError: `ASGD` needs a `ASGDState` as its state, got SGDState. ...
        """
        given = cast(object, state)  # checked by the base: annotations are promises
        if isinstance(given, ASGDState) and isinstance(given.eta, ParamDict):
            check_rate_keys(params, "eta", given.eta)
            state = given._replace(eta=given.mu)  # the rest as for a number `lr`
        super().check_state(params, state)

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        buffers: ASGDState,
        step: Tensor,
        lr: Rate,
        ops: Kernels,
        /,
    ) -> tuple[ParamDict, tuple[Any, ...]]:  # `eta` and `mu` are scalars, not buffers
        lambd = self.lambd
        # torch reads `eta` and `mu` as numbers (doubles of the stored values);
        # traced or recorded they stay tensors.
        eta: float | Tensor | ParamDict = buffers.eta.to(step.dtype)
        if isinstance(eta, Tensor):
            eta = ops.item(eta)
        params = ops.mul(params, _one_minus(lambd, eta))
        new_params = ops.sub_scaled(params, grads, eta)
        mu = ops.item(buffers.mu)
        if isinstance(mu, Tensor):  # no number to branch on: both sides, selected
            ax = ops.where(
                mu != 1, self._averaged(buffers.ax, new_params, mu, ops), new_params
            )
        elif mu != 1:
            ax = self._averaged(buffers.ax, new_params, mu, ops)
        else:  # the average starts at the parameters
            ax = ops.copy(buffers.ax, new_params)
        new_eta = _eta(lr, lambd, self.alpha, step)
        new_mu = 1 / torch.clamp(step - self.t0, min=1)
        dtype = buffers.mu.dtype
        return new_params, (new_eta.to(dtype), new_mu.to(dtype), ax)

    @staticmethod
    def _averaged(
        ax: ParamDict, params: ParamDict, mu: Rate, ops: Kernels
    ) -> ParamDict:
        """Return `ax + mu * (params - ax)`, rounded as torch.optim's ASGD."""
        moved = ops.mul(ops.sub_scaled(ops.borrowed(params), ax, 1), mu)
        return ops.add_scaled(ax, moved, 1)


def _one_minus(
    lambd: float, eta: float | Tensor | ParamDict
) -> float | Tensor | ParamDict:
    """Return the decay factor `1 - lambd * eta`."""
    if isinstance(eta, ParamDict):
        return eta.map(lambda e: 1 - lambd * e)
    return 1 - lambd * eta
