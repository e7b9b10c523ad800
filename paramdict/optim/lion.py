"""Lion: the sign of an interpolated momentum (Chen et al., 2023)."""

from __future__ import annotations

from typing import ClassVar

import attrs
from torch import Tensor
from typing_extensions import override

# The public names only (`paramdict.optim.*`), from the modules defining them.
from .._paramdict import ParamDict
from . import fields
from ._hyper import Rate
from ._schedules.slot import LearningRate
from ._states import LionState
from ._torch_optimizer import TorchOptimizer

__all__ = ["Lion", "LionState"]


@attrs.frozen(kw_only=True, eq=False, field_transformer=fields.shared_last)
class Lion(TorchOptimizer[LionState]):
    """Lion: a step of `lr` along the sign of an interpolated momentum.

    The arithmetic of the paper (Chen et al., 2023, "Symbolic Discovery of
    Optimization Algorithms"), with decoupled weight decay:
    `p *= 1 - lr * weight_decay`, `p -= lr * sign(lerp(m, g, 1 - beta1))`,
    `m = lerp(m, g, 1 - beta2)`. torch has no Lion; the names and defaults are
    the paper's (a learning rate 3-10x smaller than AdamW's, a weight decay as
    much larger).

    Attributes:
        lr: The learning rate: a number, a 0-dim tensor, a per-key ParamDict, or
            a schedule.
        betas: The interpolation weights of the update and of the running average.
        weight_decay: The decoupled weight decay, in any of the forms of `lr`.
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Lion(lr=0.1)
        >>> params = ParamDict(w=torch.tensor([1.0, -1.0]))
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([3.0, -3.0])}, state)
        >>> params["w"]
        tensor([ 0.9000, -0.9000])
    """

    state_type: ClassVar[type[LionState]] = LionState
    lazy_copies: ClassVar[bool] = True
    decoupled_decay: ClassVar[bool] = True

    lr: LearningRate = 1e-4
    betas: tuple[float, float] = fields.betas((0.9, 0.99))
    weight_decay: Rate = 0.0

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: LionState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        beta1, beta2 = self.cycled("betas", state)
        update = state.exp_avg.lerp(grads, 1 - beta1).sign_()
        params.sub_(update, alpha=lr)
        state.exp_avg.lerp_(grads, 1 - beta2)
