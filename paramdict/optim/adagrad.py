"""Adagrad: per-coordinate steps scaled by the accumulated squared gradients."""

from __future__ import annotations

from typing import ClassVar

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._fields import fused_option, non_negative, shared_last
from ._fused import FusedPlan, adagrad_kernel, fused_plan
from ._hyper import Rate, quotient
from ._schedules.slot import LearningRate
from ._states import AdagradState
from ._torch_optimizer import TorchOptimizer

__all__ = ["Adagrad", "AdagradState"]


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class Adagrad(TorchOptimizer[AdagradState]):
    """Adagrad, the functional `torch.optim.Adagrad`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adagrad`, so a
    run gives the same parameters. The decayed learning rate
    `lr / (1 + (step - 1) * lr_decay)` is computed in double precision from a
    step-count tensor. The attributes below are the constructor's keyword
    arguments, with `maximize` and `differentiable` (see `TorchOptimizer`).

    Attributes:
        lr: The learning rate, in any of its forms (a schedule too).
        lr_decay: Learning-rate decay per step.
        weight_decay: The L2 penalty added to the gradient, in any rate form.
        initial_accumulator_value: Starting value of the accumulated squares.
        eps: Term added to the denominator for numerical stability.
        fused: The kernels of an eager step: `None` (torch's fused kernel
            on the CPU where the step allows it, the foreach rule on an
            accelerator), `False` (the foreach rule) or `True` (the fused
            kernel, else a refusal); see `TorchOptimizer`.

    Raises:
        ValueError: If a hyperparameter is negative; the message names it.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> from paramdict import optim
        >>> params = ParamDict(w=torch.tensor([1.0]))
        >>> opt = optim.Adagrad(lr=0.5)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([2.0])}, state)
        >>> params["w"]
        tensor([0.5000])
    """

    state_type: ClassVar[type[AdagradState]] = AdagradState
    lazy_copies: ClassVar[bool] = True

    lr: LearningRate = 1e-2
    lr_decay: float = non_negative(0.0)
    weight_decay: Rate = 0.0
    initial_accumulator_value: float = non_negative(0.0)
    eps: float = non_negative(1e-10)
    fused: bool | None = fused_option()

    @override
    def init_state(self, params: ParamDict, /) -> AdagradState:
        """Return the first state: step 0, sums at `initial_accumulator_value`."""
        return AdagradState(
            self.counter(params), params.full_like(self.initial_accumulator_value)
        )

    @override
    def _fused_plan(
        self, params: ParamDict, state: AdagradState
    ) -> FusedPlan[AdagradState] | None:
        kernel = adagrad_kernel(self)
        return fused_plan(self, params, state, ("sum",), kernel, cpu_only=True)

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdagradState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        minus_clr = quotient(lr, 1 + (step - 1) * self.lr_decay, negated=True)
        total = state.sum.addcmul_(grads, grads)
        std = total.sqrt()  # kept for the backward pass when recorded
        std = std.add(self.eps) if self.differentiable else std.add_(self.eps)
        params.addcdiv_(grads, std, value=minus_clr)
