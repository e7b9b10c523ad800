"""A user's optimizer as docs/optim.md writes it (Lion), for mypy and pyright."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import attrs
import torch
from torch import Tensor
from typing_extensions import assert_type

from paramdict import ParamDict, optim


@optim.register_state
class LionState(NamedTuple):
    """Lion's state: the step count and the running average of the gradients."""

    step: Tensor
    exp_avg: ParamDict
    schedule: optim.SlotState = ()


@attrs.frozen(kw_only=True, eq=False)
class Lion(optim.TorchOptimizer[LionState]):
    """Lion (Chen et al., 2023): the sign of an interpolated momentum."""

    state_type: ClassVar[type[LionState]] = LionState
    decoupled_decay: ClassVar[bool] = True

    lr: optim.LearningRate = 1e-4
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: optim.Rate = 0.0

    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: LionState,
        step: Tensor,
        lr: optim.Rate,
        /,
    ) -> None:
        """Write one Lion step into the parameters and the running average."""
        beta1, beta2 = self.cycled("betas", state)
        update = state.exp_avg.lerp(grads, 1 - beta1).sign_()
        params.sub_(update, alpha=lr)
        state.exp_avg.lerp_(grads, 1 - beta2)


class Weights(ParamDict):
    """A user's ParamDict subclass."""

    __slots__ = ()


opt = Lion(lr=1e-3, weight_decay=0.1)
params = Weights(w=torch.ones(3))
state = opt.init(params)
assert_type(state, LionState)
new, state = opt.step(params, params.ones_like(), state)
assert_type(new, Weights)
assert_type(state, LionState)
new, state = opt.step_(new, params.ones_like(), state)
assert_type(new, Weights)
bound = opt.bind(new, state)
assert_type(bound, optim.Bound[LionState])
assert_type(bound.step_(params.ones_like()), LionState)
assert_type(opt.differentiable, bool)
assert_type(optim.Lion().lr, optim.LearningRate)
