"""Stochastic gradient descent, with momentum and Nesterov momentum."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._fields import flag, fused_option, non_negative, shared_last
from ._fused import FusedPlan, fused_plan, sgd_kernel
from ._hyper import Rate, check_number, is_finite
from ._schedules.slot import LearningRate
from ._states import SGDState
from ._torch_optimizer import TorchOptimizer

__all__ = ["SGD", "SGDState"]


def _check_dampening(instance: object, attribute: Any, value: Any) -> None:
    check_number(instance, attribute, value)
    if not is_finite(attribute.name, value):
        msg = (
            f"`{attribute.name}` must be finite, got {value!r}: the momentum buffer "
            "and every later step would be NaN. Give a number such as 0 or 0.1."
        )
        raise ValueError(msg)


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class SGD(TorchOptimizer[SGDState]):
    """Stochastic gradient descent, the functional `torch.optim.SGD`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.SGD`, so a run
    gives the same parameters. The momentum buffer starts at zero; on the first
    step it becomes the gradient itself (no dampening), as in torch.

    The attributes below are the constructor's keyword arguments. Configurations
    are immutable and compared by identity (hyperparameters may be tensors).

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`, as in Meta-SGD), a ParamDict of per-key
            values (any shape that broadcasts to the entry), or a schedule such
            as `optim.CosineAnnealingLR(base_lr=0.1, T_max=100)`.
        momentum: Momentum factor.
        dampening: Dampening for momentum, a finite number (torch takes any;
            a NaN or infinite one makes every later step NaN).
        weight_decay: L2 penalty added to the gradient; a number, a 0-dim tensor
            or a ParamDict of per-key values.
        nesterov: Use Nesterov momentum (needs `momentum > 0`, `dampening == 0`).
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step` (see `step`).
        fused: The kernels of an eager step: `None` (on the CPU `step_` runs
            torch's fused kernel where the step allows it, without dampening;
            `step`, and both on an accelerator, the foreach rule: torch.optim's
            defaults), `False` (the foreach rule) or `True` (the fused kernel
            in both, else a refusal); see `TorchOptimizer`.

    Raises:
        ValueError: If a rate or `momentum` is negative, `dampening` is not
            finite, or `nesterov` is set without momentum or with dampening;
            the message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> opt = optim.SGD(lr=0.1)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([1.0, 1.0])}, state)
        >>> params["w"]
        tensor([0.9000, 1.9000])
    """

    state_type: ClassVar[type[SGDState]] = SGDState
    lazy_copies: ClassVar[bool] = True
    buffer_options: ClassVar[Mapping[str, str]] = {"momentum_buffer": "momentum != 0"}

    lr: LearningRate = 1e-3
    momentum: float = non_negative(0.0)
    dampening: float = attrs.field(default=0.0, validator=_check_dampening)
    weight_decay: Rate = 0.0
    nesterov: bool = flag()
    fused: bool | None = fused_option()

    def __attrs_post_init__(self) -> None:
        """Validate the options; `nesterov` needs momentum and no dampening."""
        super().__attrs_post_init__()
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            msg = (
                "`nesterov=True` needs `momentum > 0` and `dampening == 0`, got "
                f"momentum={self.momentum!r}, dampening={self.dampening!r}."
            )
            raise ValueError(msg)

    def init_state(self, params: ParamDict, /) -> SGDState:
        """Return step 0 and a zero momentum buffer (empty when `momentum == 0`)."""
        buffer = params.zeros_like() if self.momentum != 0 else ParamDict()
        return SGDState(self.counter(params), buffer)

    copies_fused: ClassVar[bool] = False

    @override
    def _fused_plan(
        self, params: ParamDict, state: SGDState
    ) -> FusedPlan[SGDState] | None:
        if self.momentum != 0 and self.dampening != 0:
            if self.fused:
                msg = (
                    "`SGD(fused=True)` cannot take a step with both `momentum` and "
                    "`dampening`: torch's fused kernel starts a damped buffer "
                    "through a host-side flag. Pass `fused=None` (the foreach "
                    "kernels) or `dampening=0`."
                )
                raise ValueError(msg)
            return None
        fields = ("momentum_buffer",) if self.momentum != 0 else ()
        return fused_plan(self, params, state, fields, sgd_kernel(self))

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: SGDState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        update = grads
        if self.momentum != 0:
            momentum = self.cycled("momentum", state)
            buffer = state.momentum_buffer
            first: bool | None = False
            if self.dampening != 0:
                # torch starts the buffer as a copy of the first gradient.
                host = self.host_numbers(step)
                first = host[0] == 1 if host is not None else None
            if first:
                buffer.copy_(grads)
            elif first is None:  # traced: both, then a selection
                damped = buffer.mul(momentum).add_(grads, alpha=1 - self.dampening)
                buffer.copy_(damped.where(ParamDict.fromkeys(damped, step > 1), grads))
            else:
                buffer.mul_(momentum).add_(grads, alpha=1 - self.dampening)
            update = grads.add(buffer, alpha=momentum) if self.nesterov else buffer
        params.sub_(update, alpha=lr)
