"""Rules written as `math`: the driver around them, and the consumed-operand check."""

from __future__ import annotations

from typing import Any, ClassVar, cast

import attrs
import pytest
import torch
from torch import Tensor

from paramdict import ParamDict, optim


@attrs.frozen(kw_only=True, eq=False)
class _NoBorrow(optim.Lion):
    """Lion whose rule reads `exp_avg` after consuming it (no `ops.borrowed`)."""

    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        buffers: Any,
        step: Tensor,
        lr: optim.Rate,
        ops: optim.Kernels,
        /,
    ) -> tuple[ParamDict, tuple[ParamDict]]:
        beta1, beta2 = self.betas
        update = ops.lerp(buffers.exp_avg, grads, 1 - beta1)
        params = ops.sub_scaled(params, ops.sign(update), lr)
        return params, (ops.lerp(buffers.exp_avg, grads, 1 - beta2),)


@attrs.frozen(kw_only=True, eq=False)
class _TwoBuffers(optim.Lion):
    """Lion whose rule returns one buffer too many."""

    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        buffers: Any,
        step: Tensor,
        lr: optim.Rate,
        ops: optim.Kernels,
        /,
    ) -> tuple[ParamDict, tuple[ParamDict]]:
        two = (buffers.exp_avg, buffers.exp_avg)
        return params, cast("tuple[ParamDict]", two)


def _setup() -> tuple[ParamDict, ParamDict]:
    params = ParamDict(w=torch.tensor([1.0, -2.0]), b=torch.tensor([0.5]))
    grads = ParamDict(w=torch.tensor([0.3, 0.1]), b=torch.tensor([-1.0]))
    return params, grads


def test_reading_a_consumed_buffer_raises_in_place() -> None:
    """A rule that reads a buffer its earlier operation wrote into fails loudly."""
    params, grads = _setup()
    opt = _NoBorrow(lr=0.1)
    state = opt.init(params)
    state = state._replace(exp_avg=state.exp_avg.full_like(0.5))
    with pytest.raises(ValueError, match=r"consumed .*ops\.borrowed"):
        opt.step_(params, grads, state)


def test_the_borrowing_rule_matches_step_in_place() -> None:
    """Lion's `step_` equals its `step`, buffer included (the borrow is right)."""
    params, grads = _setup()
    opt = optim.Lion(lr=0.1, betas=(0.5, 0.9), weight_decay=0.1)
    state = opt.init(params)
    state = state._replace(exp_avg=state.exp_avg.full_like(0.5))
    expected, expected_state = opt.step(params, grads, state)
    copied = optim.LionState(state.step.clone(), state.exp_avg.clone())
    got, got_state = opt.step_(params.clone(), grads, copied)
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)
        torch.testing.assert_close(
            got_state.exp_avg[key], expected_state.exp_avg[key], rtol=0, atol=0
        )


def test_math_returning_other_buffers_is_refused() -> None:
    """`math` must return one new value per buffer field, named in the message."""
    params, grads = _setup()
    opt = _TwoBuffers()
    with pytest.raises(TypeError, match=r"returned 2 buffers.*\['exp_avg'\]"):
        opt.step(params, grads, opt.init(params))


def test_a_rule_without_math_or_update_says_so() -> None:
    """A `TorchOptimizer` that defines no rule names the two hooks."""

    @attrs.frozen(kw_only=True, eq=False)
    class Bare(optim.TorchOptimizer[optim.LionState]):
        state_type: ClassVar[type[optim.LionState]] = optim.LionState
        lr: optim.LearningRate = 0.1
        weight_decay: optim.Rate = 0.0

        def init_state(self, params: ParamDict, /) -> optim.LionState:
            return optim.LionState(self.counter(params), params.zeros_like())

    params, grads = _setup()
    opt = Bare()
    with pytest.raises(NotImplementedError, match=r"neither `math` nor `update`"):
        opt.step(params, grads, opt.init(params))


def test_lion_step_by_hand() -> None:
    """One Lion step against the paper's arithmetic written in plain torch."""
    p = torch.tensor([1.0, -2.0, 0.25], dtype=torch.float64)
    g = torch.tensor([0.3, 0.1, -0.7], dtype=torch.float64)
    m = torch.tensor([-0.5, 0.2, 0.1], dtype=torch.float64)
    lr, wd, b1, b2 = 0.1, 0.2, 0.8, 0.95
    opt = optim.Lion(lr=lr, betas=(b1, b2), weight_decay=wd, maximize=True)
    state = opt.init(ParamDict(w=p))._replace(exp_avg=ParamDict(w=m))
    new, new_state = opt.step(ParamDict(w=p), ParamDict(w=g), state)
    expected = p * (1 - lr * wd) - lr * torch.lerp(m, -g, 1 - b1).sign()
    torch.testing.assert_close(new["w"], expected)
    torch.testing.assert_close(new_state.exp_avg["w"], torch.lerp(m, -g, 1 - b2))
