"""Adam and AdamW: adaptive moment estimation with L2 or decoupled weight decay.

NAdam, RAdam and Adamax are in their own modules and importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import ClassVar

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._adam_moments import AdamOptions, in_inherited_order, moments_
from ._fields import flag, fused_option
from ._fused import FusedPlan, adam_kernel, fused_plan
from ._hyper import Rate, compute_dtype, quotient, state_scalar_dtype
from ._states import AdamState
from .adamax import Adamax, AdamaxState
from .nadam import NAdam, NAdamState
from .radam import RAdam, RAdamState

__all__ = [
    "Adam",
    "AdamState",
    "AdamW",
    "Adamax",
    "AdamaxState",
    "NAdam",
    "NAdamState",
    "RAdam",
    "RAdamState",
]


@attrs.frozen(kw_only=True, eq=False, field_transformer=in_inherited_order)
class Adam(AdamOptions[AdamState]):
    """Adam, the functional `torch.optim.Adam`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adam`, so a run
    gives the same parameters. The bias corrections are Python floats where the
    step count is read for free (eager, on the host, a number `lr`), as torch's,
    else double-precision 0-dim tensors (no host read, no recompiling per step).

    The attributes below are the constructor's keyword arguments. Configurations
    are immutable and compared by identity (hyperparameters may be tensors).

    Attributes:
        lr: Learning rate: a number, a 0-dim tensor (learnable with
            `differentiable=True`), a ParamDict of per-key values, or a
            schedule such as `optim.CosineAnnealingLR(base_lr=0.1, T_max=100)`.
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
        fused: The kernels of an eager step: `None` (torch's fused kernel
            on the CPU where the step allows it, the foreach rule on an
            accelerator), `False` (the foreach rule) or `True` (the fused
            kernel, else a refusal); see `TorchOptimizer`.

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

    state_type: ClassVar[type[AdamState]] = AdamState
    lazy_copies: ClassVar[bool] = True
    buffer_options: ClassVar[Mapping[str, str]] = {"max_exp_avg_sq": "amsgrad=True"}

    amsgrad: bool = flag()
    decoupled_weight_decay: bool = flag()
    fused: bool | None = fused_option()

    def init_state(self, params: ParamDict, /) -> AdamState:
        """Return step 0 and zero moments (`max_exp_avg_sq` only with `amsgrad`)."""
        return AdamState(
            self.counter(params),
            params.zeros_like(),
            params.zeros_like(),
            params.zeros_like() if self.amsgrad else ParamDict(),
        )

    @override
    def _fused_plan(
        self, params: ParamDict, state: AdamState
    ) -> FusedPlan[AdamState] | None:
        fields = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")[: 3 if self.amsgrad else 2]
        return fused_plan(self, params, state, fields, adam_kernel(self))

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdamState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        betas = self.cycled("betas", state)
        beta1, beta2 = betas
        moments_(betas, state.exp_avg, state.exp_avg_sq, grads)
        second = state.exp_avg_sq
        if self.amsgrad:
            second = state.max_exp_avg_sq.maximum_(second)
        if (
            self.differentiable
            and not isinstance(lr, ParamDict)
            and compute_dtype(params) != torch.float64
        ):
            # torch's differentiable step: its arithmetic on the step tensor,
            # bit for bit (float32 unless the default dtype is float64). Float64
            # parameters take the default path's float64 numbers instead (a
            # meta-gradient keeps float64's precision; torch's differentiable
            # step rounds its bias corrections to float32 there).
            count = step.to(state_scalar_dtype(step.device))
            step_size_neg = (lr / (1 - beta1**count)).neg()
            denom = second.sqrt().div((1 - beta2**count).sqrt() * step_size_neg)
            denom.add_(self.eps / step_size_neg)
            params.addcdiv_(state.exp_avg, denom)
            return
        # Bias corrections: torch.optim's Python floats where the step can be read
        # for free (eager, on the host); else in double precision from the step
        # tensor, the same numbers. A tensor `lr` stays a tensor, as in torch.
        host = None if isinstance(lr, Tensor) else self.host_numbers(step, lr, *betas)
        bias_correction2_sqrt: float | Tensor
        step_size: float | Tensor | ParamDict
        if host is not None:
            t, rate, b1, b2 = host
            bias_correction2_sqrt = math.sqrt(1 - b2**t)
            step_size = -(rate / (1 - b1**t))
        else:
            bias_correction2_sqrt = (1 - beta2**step).sqrt()
            step_size = quotient(lr, 1 - beta1**step, negated=True)
        denom = second.sqrt()
        # Recorded, the square root's result is saved for the backward pass:
        # divided out of place then, as torch's differentiable Adam does.
        if self.differentiable:
            denom = denom.div(bias_correction2_sqrt)
        else:
            denom.div_(bias_correction2_sqrt)
        denom.add_(self.eps)
        # torch's `addcdiv_(m, denom, value=step_size)`; a tensor `step_size`
        # multiplies `m` first, as torch does with a tensor rate.
        params.addcdiv_(state.exp_avg, denom, value=step_size)


@attrs.frozen(kw_only=True, eq=False, field_transformer=in_inherited_order)
class AdamW(Adam):
    """AdamW, the functional `torch.optim.AdamW`: Adam with decoupled weight decay.

    `Adam` with `decoupled_weight_decay` always on (as `torch.optim.AdamW`
    derives from `torch.optim.Adam`): the parameters are multiplied by
    `1 - lr * weight_decay` before the Adam update. The options are `Adam`'s
    but that one; `weight_decay` defaults to `1e-2` and may be a per-key
    ParamDict (zero for biases, say). See `Adam` for their meaning.

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

    weight_decay: Rate = 1e-2
    decoupled_weight_decay: bool = attrs.field(default=True, init=False, repr=False)
