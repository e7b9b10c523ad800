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


@attrs.frozen(kw_only=True, eq=False)
class Lion(optim.TorchOptimizer[LionState]):
    """Lion (Chen et al., 2023): the sign of an interpolated momentum."""

    state_type: ClassVar[type[LionState]] = LionState

    lr: optim.LearningRate = 1e-4
    betas: tuple[float, float] = (0.9, 0.99)
    weight_decay: optim.Rate = 0.0
    maximize: bool = False
    differentiable: bool = False

    def init_state(self, params: ParamDict, /) -> LionState:
        """Return step 0 and a zero running average."""
        return LionState(self.counter(params), params.zeros_like())

    def update(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: LionState,
        ops: optim.Kernels,
        /,
    ) -> tuple[ParamDict, LionState]:
        """Return the parameters and state after one Lion step."""
        beta1, beta2 = self.betas
        step = self.next_step(state)
        lr = self.rate("lr", step)
        if self.maximize:
            grads = ops.neg(grads)
        params = ops.decay(params, lr, self.rate("weight_decay", step))
        update = ops.lerp(ops.borrowed(state.exp_avg), grads, 1 - beta1)
        params = ops.sub_scaled(params, ops.sign(update), lr)
        exp_avg = ops.lerp(state.exp_avg, grads, 1 - beta2)
        return params, LionState(step, exp_avg)


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
assert_type(opt.differentiable, bool)
