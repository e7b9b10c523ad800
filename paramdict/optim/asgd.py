"""ASGD: averaged stochastic gradient descent, with a decaying step size."""

from __future__ import annotations

from typing import ClassVar, cast

import attrs
import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._fields import shared_last
from ._hyper import (
    Rate,
    check_number,
    check_rate_keys,
    host_numbers,
    quotient,
    state_scalar_dtype,
)
from ._schedules.slot import LearningRate
from ._state_check import check_scalar
from ._states import ASGDState
from ._torch_optimizer import TorchOptimizer

__all__ = ["ASGD", "ASGDState"]


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
    lazy_copies: ClassVar[bool] = True
    own_fields: ClassVar[tuple[str, ...]] = ("eta",)  # a rate's form: `check_state`

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
        lr = self._first_rate(counter)
        eta = lr if isinstance(lr, ParamDict) else counter.new_full((), 0).add(lr)
        return ASGDState(
            counter,
            eta.to(dtype),
            counter.new_ones((), dtype=dtype),
            params.zeros_like(),
        )

    @override
    def check_state(self, params: ParamDict, state: ASGDState, /) -> None:
        """Also check `eta`: a 0-dim tensor, or per-key values for `params`' keys."""
        super().check_state(params, state)
        eta: object = state.eta
        if isinstance(eta, ParamDict):
            check_rate_keys(params, "eta", eta)
        elif not (isinstance(eta, Tensor) and eta.dim() == 0):
            msg = (
                "The state's `eta` must be a 0-dim tensor (or per-key values, "
                f"for a per-key `lr`), got {type(eta).__name__}. Use the state "
                "from this optimizer's `init` (or a checkpoint of it)."
            )
            raise TypeError(msg)
        else:
            check_scalar(params, "eta", eta)

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: ASGDState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        lambd = self.lambd
        eta: float | Tensor | ParamDict = state.eta.to(step.dtype)
        if isinstance(eta, Tensor):
            host = host_numbers(self.differentiable, eta)
            if host is not None:
                eta = host[0]
        if self.capturable and isinstance(eta, Tensor):
            # On the device: `1 - lambd * eta` in one kernel (a host scalar 1).
            decay = torch.add(torch.tensor(1.0, dtype=eta.dtype), eta, alpha=-lambd)
            params.mul_(decay).sub_(grads, alpha=eta)
        else:
            params.mul_(1 - eta * lambd).sub_(grads, alpha=eta)
        host_mu = host_numbers(self.differentiable, state.mu)
        if host_mu is None and self.capturable:
            # torch's capturable step: the average moves by `mu` always (at
            # `mu == 1` onto the parameters, to within a rounding).
            state.ax.add_(params.sub(state.ax).mul_(state.mu))
        elif host_mu is None:  # traced: both, then a selection
            mu = state.mu
            moved = state.ax.add(params.sub(state.ax).mul_(mu))
            state.ax.copy_(moved.where(ParamDict.fromkeys(moved, mu != 1), params))
        elif host_mu[0] != 1:
            state.ax.add_(params.sub(state.ax).mul_(host_mu[0]))
        else:
            state.ax.copy_(params)
        dtype = state.mu.dtype
        new_eta = _eta(lr, lambd, self.alpha, step).to(dtype)
        new_mu = torch.clamp(step - self.t0, min=1).reciprocal().to(dtype)
        if isinstance(state.eta, ParamDict):
            state.eta.copy_(cast(ParamDict, new_eta))
            state.mu.copy_(new_mu)
        elif (
            state.mu.is_cpu
            or torch.compiler.is_compiling()
            or torch._C._functorch.is_functorch_wrapped_tensor(state.mu)  # vmap
        ):
            state.eta.copy_(cast(Tensor, new_eta))
            state.mu.copy_(new_mu)
        else:  # on a device: both in one kernel (torch's `_foreach_copy_` of them)
            torch._foreach_copy_([state.eta, state.mu], [cast(Tensor, new_eta), new_mu])
