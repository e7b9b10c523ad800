"""Adamax: Adam with the infinity norm."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._base import TorchOptimizer
from ._fields import betas, non_negative, shared_last
from ._hyper import (
    Rate,
    quotient,
)
from ._kernels import Kernels
from ._protocol import register_state
from ._scheduled import LearningRate, SlotState

__all__ = ["Adamax", "AdamaxState"]


@register_state
class AdamaxState(NamedTuple):
    """The state of `Adamax`.

    Attributes:
        step: The number of steps taken, a 0-dim tensor.
        exp_avg: The running average of the gradients, keyed like the parameters.
        exp_inf: The exponentially weighted infinity norm of the gradients.
        schedule: The state of the `lr` schedule; `()` when `lr` is a rate.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adamax(betas=(0.5, 0.5), eps=0.0)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = ParamDict(w=torch.tensor([2.0, -3.0]))
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.exp_avg["w"], state.exp_inf["w"]
        (tensor([ 1.0000, -1.5000]), tensor([2., 3.]))
    """

    step: Tensor
    exp_avg: ParamDict
    exp_inf: ParamDict
    schedule: SlotState = ()


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class Adamax(TorchOptimizer[AdamaxState]):
    """Adamax, the functional `torch.optim.Adamax`: Adam with the infinity norm.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adamax`, so a
    run gives the same parameters. The second moment is replaced by an
    exponentially weighted infinity norm, `max(beta2 * exp_inf, |g| + eps)`,
    whose decay is the second beta. Its options are `Adam`'s without
    `amsgrad` and `decoupled_weight_decay` (same meaning and checks): the
    weight decay is an L2 penalty added to the gradient.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> opt = optim.Adamax(lr=0.1)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([0.9000, 2.1000])
    """

    state_type: ClassVar[type[AdamaxState]] = AdamaxState

    lr: LearningRate = 2e-3
    betas: tuple[float, float] = betas((0.9, 0.999))
    eps: float = non_negative(1e-8)
    weight_decay: Rate = 0.0

    def init_state(self, params: ParamDict, /) -> AdamaxState:
        """Return the first state: step 0, zero average and norm.

        Args:
            params: The parameters to optimize (checked by `init`); unchanged.

        Returns:
            An `AdamaxState`.

        Example:
            >>> from paramdict import optim
            >>> optim.Adamax().init(ParamDict(w=torch.ones(2))).exp_inf["w"]
            tensor([0., 0.])
        """
        return AdamaxState(
            self.counter(params), params.zeros_like(), params.zeros_like()
        )

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        buffers: AdamaxState,
        step: Tensor,
        lr: Rate,
        ops: Kernels,
        /,
    ) -> tuple[ParamDict, tuple[ParamDict, ParamDict]]:
        beta1, beta2 = self.cycled("betas", buffers)
        exp_avg = ops.lerp(buffers.exp_avg, grads, 1 - beta1)
        norm = ops.add(ops.abs(grads), self.eps)
        exp_inf = ops.maximum(ops.mul(buffers.exp_inf, beta2), norm)
        clr = quotient(lr, 1 - beta1**step)
        new_params = ops.addcdiv(params, exp_avg, exp_inf, -clr)
        return new_params, (exp_avg, exp_inf)
