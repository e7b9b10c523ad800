"""RAdam: Adam with a rectified variance."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._adam_moments import moments
from ._base import TorchOptimizer
from ._fields import betas, flag, non_negative, shared_last
from ._hyper import (
    Rate,
)
from ._kernels import Kernels
from ._protocol import register_state
from ._scheduled import LearningRate, SlotState

__all__ = ["RAdam", "RAdamState"]


@register_state
class RAdamState(NamedTuple):
    """The state of `RAdam`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        exp_avg: The running average of the gradients, keyed like the parameters.
        exp_avg_sq: The running average of the squared gradients.
        schedule: The state of the `lr` schedule; `()` when `lr` is a rate.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.RAdam(betas=(0.5, 0.5))
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> _, state = opt.step(params, params.full_like(2.0), opt.init(params))
        >>> state.exp_avg["w"], state.exp_avg_sq["w"]
        (tensor([1., 1.]), tensor([2., 2.]))
    """

    step: Tensor
    exp_avg: ParamDict
    exp_avg_sq: ParamDict
    schedule: SlotState = ()


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class RAdam(TorchOptimizer[RAdamState]):
    """RAdam, the functional `torch.optim.RAdam`: Adam with a rectified variance.

    Same hyperparameters, defaults and arithmetic as `torch.optim.RAdam`, so a
    run gives the same parameters. While the variance estimate is unreliable
    (the approximated moving-average length `rho_t` is at most 5) the step is
    the bias-corrected momentum alone; after that it is rectified Adam. Its
    options are `Adam`'s without `amsgrad` (same meaning and checks).

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> opt = optim.RAdam(lr=0.1)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([0.7000, 2.3000])
    """

    state_type: ClassVar[type[RAdamState]] = RAdamState

    lr: LearningRate = 1e-3
    betas: tuple[float, float] = betas((0.9, 0.999))
    eps: float = non_negative(1e-8)
    weight_decay: Rate = 0.0
    decoupled_weight_decay: bool = flag()

    def init_state(self, params: ParamDict, /) -> RAdamState:
        """Return the first state: step 0 and zero moments.

        Args:
            params: The parameters to optimize (checked by `init`); unchanged.

        Returns:
            A `RAdamState`.

        Example:
            >>> from paramdict import optim
            >>> optim.RAdam().init(ParamDict(w=torch.ones(2))).exp_avg_sq["w"]
            tensor([0., 0.])
        """
        return RAdamState(
            self.counter(params), params.zeros_like(), params.zeros_like()
        )

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        buffers: RAdamState,
        step: Tensor,
        lr: Rate,
        ops: Kernels,
        /,
    ) -> tuple[ParamDict, tuple[ParamDict, ParamDict]]:
        beta1, beta2 = self.cycled("betas", buffers)
        exp_avg, exp_avg_sq = moments(
            (beta1, beta2), buffers.exp_avg, buffers.exp_avg_sq, grads, ops
        )
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        # The length of the approximated moving average, and its maximum.
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
        rectified = rho_t > 5.0
        # Where `rho_t <= 5` the rectification is undefined: 1 keeps it finite
        # (and its gradient zero) in the branch that is not taken.
        rect = torch.where(
            rectified,
            (rho_t - 4)
            * (rho_t - 2)
            * rho_inf
            / ((rho_inf - 4) * (rho_inf - 2) * rho_t),
            1.0,
        ).sqrt()
        # torch's `exp_avg / bias_correction1 * lr [* adaptive_lr * rect]`.
        momentum = ops.mul(ops.div(ops.borrowed(exp_avg), bias_correction1), lr)
        adaptive = ops.add(ops.sqrt(ops.borrowed(exp_avg_sq)), self.eps)
        # `bias_correction2 ** 0.5 / t` is `reciprocal(t) * bias_correction2 ** 0.5`.
        adaptive = ops.mul(ops.reciprocal(adaptive), bias_correction2.sqrt())
        full = ops.mul(ops.mul(ops.borrowed(momentum), adaptive), rect)
        update = ops.where(rectified, full, momentum)
        new_params = ops.sub_scaled(params, update, 1)
        return new_params, (exp_avg, exp_avg_sq)
