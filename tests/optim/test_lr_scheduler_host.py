"""A schedule's host path (Python floats) gives its tensor path's numbers, bitwise.

An optimizer's eager step advances its schedule with Python floats, branch by
branch, as torch's schedulers do (`LRSchedule._step_on_host`); a traced step
(and `schedule.step`) runs the tensor arithmetic. Both must give the same bits,
step after step, for any settings.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paramdict import ParamDict, optim
from paramdict.optim._schedules.slot import on_host


def _schedules(draw: Any) -> optim.LRSchedule:
    kind = draw(
        st.sampled_from(
            [
                "step",
                "multistep",
                "constant",
                "linear",
                "exponential",
                "polynomial",
                "cosine",
                "restarts",
                "sequential",
                "chained",
            ]
        )
    )
    gamma = draw(st.floats(0.1, 0.99))
    total = draw(st.integers(1, 12))
    factor = draw(st.floats(0.05, 1.0))
    if kind == "step":
        return optim.StepLR(step_size=total, gamma=gamma)
    if kind == "multistep":
        milestones = draw(st.lists(st.integers(0, 20), min_size=1, max_size=4))
        return optim.MultiStepLR(milestones=milestones, gamma=gamma)
    if kind == "constant":
        return optim.ConstantLR(factor=factor, total_iters=total)
    if kind == "linear":
        end = draw(st.floats(0.0, 1.0))
        return optim.LinearLR(start_factor=factor, end_factor=end, total_iters=total)
    if kind == "exponential":
        return optim.ExponentialLR(gamma=gamma)
    if kind == "polynomial":
        power = draw(st.floats(0.1, 3.0))
        return optim.PolynomialLR(total_iters=total, power=power)
    if kind == "cosine":
        return optim.CosineAnnealingLR(T_max=total, eta_min=draw(st.floats(0.0, 1e-3)))
    if kind == "restarts":
        return optim.CosineAnnealingWarmRestarts(
            T_0=total, T_mult=draw(st.integers(1, 3))
        )
    if kind == "sequential":
        return optim.SequentialLR(
            schedulers=[
                optim.LinearLR(start_factor=factor, total_iters=total),
                optim.CosineAnnealingLR(T_max=draw(st.integers(1, 20))),
            ],
            milestones=[total],
        )
    return optim.ChainedScheduler(
        schedulers=[optim.ExponentialLR(gamma=gamma), optim.StepLR(step_size=total)]
    )


def _floats(state: Any) -> list[float]:
    """Every number of a state, in order (tensors read)."""
    out: list[float] = []
    for field in state:
        if isinstance(field, torch.Tensor):
            out.append(field.item())
        elif isinstance(field, tuple):
            for item in field:
                if isinstance(item, torch.Tensor):
                    out.append(item.item())
                elif isinstance(item, (int, float)):
                    out.append(float(item))
                else:
                    out.extend(_floats(item))
        elif isinstance(field, (int, float)):
            out.append(float(field))
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (
        a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    )


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data())
def test_the_host_path_is_the_tensor_path_bitwise(data: st.DataObject) -> None:
    """40 steps on floats equal 40 steps on tensors, every number of the state."""
    schedule = _schedules(data.draw)
    base = data.draw(st.floats(1e-4, 1.0))
    tensors = schedule.init(base)
    floats = on_host(tensors)
    for _ in range(40):
        tensors = schedule.step(tensors)
        floats = schedule._step_on_host(floats)  # pyright: ignore[reportPrivateUsage]
        assert floats is not None
        got, want = _floats(floats), _floats(tensors)
        assert len(got) == len(want)
        assert all(_same(g, w) for g, w in zip(got, want, strict=True)), (got, want)


@pytest.mark.parametrize("method", ["step", "step_"])
def test_an_eager_step_advances_its_schedule_on_the_host(method: str) -> None:
    """An optimizer's eager step gives the state `schedule.step` gives, bitwise."""
    schedule = optim.SequentialLR(
        base_lr=0.1,
        schedulers=[
            optim.LinearLR(start_factor=0.1, total_iters=3),
            optim.CosineAnnealingLR(T_max=10),
        ],
        milestones=[3],
    )
    opt = optim.AdamW(lr=schedule)
    params = ParamDict(w=torch.ones(3))
    state = opt.init(params)
    expected = schedule.init()  # its own tensors: `step_` writes into the state's
    for _ in range(12):
        params, state = getattr(opt, method)(params, params.ones_like(), state)
        expected = schedule.step(expected)
        assert _floats(state.schedule) == _floats(expected)


def test_schedules_without_a_host_path_say_so() -> None:
    """A schedule with no host path returns None, and the tensor path serves."""
    schedule = optim.OneCycleLR(max_lr=0.1, total_steps=10)
    state = on_host(schedule.init())
    assert schedule._step_on_host(state) is None  # pyright: ignore[reportPrivateUsage]
