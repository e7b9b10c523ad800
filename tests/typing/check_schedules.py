"""Never run: mypy checks the types of schedules, averaging and accumulation."""

from __future__ import annotations

from typing import TypeAlias

import torch
from torch import Tensor, nn
from typing_extensions import assert_type

from paramdict import ParamDict, optim

Children: TypeAlias = "tuple[optim.ScheduleState | optim.PlateauState, ...]"


class MyParams(ParamDict):
    __slots__ = ()


def check_schedules(t: Tensor) -> None:
    schedules: list[optim.LRSchedule] = [
        optim.LambdaLR(lr_lambda=lambda e: 0.9**e),
        optim.MultiplicativeLR(lr_lambda=lambda e: 0.9),
        optim.StepLR(step_size=3),
        optim.MultiStepLR(milestones=[3, 5]),
        optim.ConstantLR(),
        optim.LinearLR(),
        optim.ExponentialLR(gamma=0.9),
        optim.PolynomialLR(),
        optim.CosineAnnealingLR(T_max=10),
        optim.CosineAnnealingWarmRestarts(T_0=10),
        optim.CyclicLR(base_lr=0.01, max_lr=0.1),
        optim.OneCycleLR(max_lr=0.1, total_steps=10),
        optim.SequentialLR(
            schedulers=[optim.ConstantLR(), optim.StepLR(step_size=2)], milestones=[5]
        ),
        optim.ChainedScheduler(schedulers=[optim.ConstantLR()]),
    ]
    for schedule in schedules:
        state = schedule.init(0.1)
        assert_type(state, optim.ScheduleState)
        assert_type(schedule.init(t), optim.ScheduleState)
        assert_type(schedule.step(state), optim.ScheduleState)
        assert_type(state.lr, Tensor)
        assert_type(state.momentum, Tensor | None)
        assert_type(state.children, Children)
        assert_type(schedule.cycles_momentum, bool)
        assert_type(schedule.takes_metric, bool)
    plateau = optim.ReduceLROnPlateau(mode="max")
    assert_type(plateau.cycles_momentum, bool)
    assert_type(plateau.takes_metric, bool)
    p_state = plateau.init(0.1)
    assert_type(p_state, optim.PlateauState)
    assert_type(plateau.step(p_state, 1.0), optim.PlateauState)
    assert_type(plateau.step(p_state, t), optim.PlateauState)
    assert_type(p_state.best, Tensor)
    assert_type(optim.OneCycleLR(max_lr=0.1, total_steps=3).steps, int)


def check_averaging(p: ParamDict, m: nn.Module) -> None:
    ema = optim.WeightAverage.ema(0.99)
    assert_type(ema, optim.WeightAverage)
    assert_type(optim.WeightAverage.swa(), optim.WeightAverage)
    state = ema.init(p)
    assert_type(state, optim.AveragedState)
    assert_type(ema.update(state, p), optim.AveragedState)
    assert_type(ema.update(state, {"w": torch.zeros(1)}), optim.AveragedState)
    assert_type(state.averaged, ParamDict)
    assert_type(optim.update_bn(p, m, [torch.zeros(1)]), ParamDict)


def check_accumulation(p: ParamDict) -> None:
    opt = optim.MultiSteps(optim.Adam(), every_k=4)
    assert_type(opt, optim.MultiSteps)
    state = opt.init(p)
    assert_type(state, optim.MultiStepsState)
    new, state = opt.step(p, p, state)
    assert_type(new, ParamDict)
    assert_type(state, optim.MultiStepsState)
    assert_type(opt.differentiable, bool)
    assert_type(
        optim.MultiSteps(optim.SGD(), every_k=2, reduction="sum"), optim.MultiSteps
    )


def check_integration(p: MyParams, t: Tensor) -> None:
    adam = optim.Adam(lr=optim.CosineAnnealingLR(base_lr=0.1, T_max=10))
    assert_type(adam, optim.Adam)
    assert_type(optim.SGD(lr=optim.StepLR(base_lr=t, step_size=2)), optim.SGD)
    assert_type(
        optim.AdamW(lr=optim.OneCycleLR(max_lr=0.1, total_steps=9)), optim.AdamW
    )
    assert_type(
        optim.RMSprop(lr=optim.ExponentialLR(base_lr=0.1, gamma=0.9)), optim.RMSprop
    )
    assert_type(optim.Adagrad(lr=optim.LinearLR(base_lr=0.1)), optim.Adagrad)
    state = adam.init(p)
    assert_type(state, optim.AdamState)
    assert_type(state.schedule, optim.ScheduleState | optim.PlateauState | tuple[()])
    new, state = adam.step(p, p, state)
    assert_type(new, MyParams)
    assert_type(state, optim.AdamState)
    assert_type(adam.takes_metric, bool)
    assert_type(adam.rate("lr", state.step, state), float | Tensor | ParamDict)
    assert_type(
        adam.next_schedule(state), optim.ScheduleState | optim.PlateauState | tuple[()]
    )
    sgd = optim.SGD(lr=optim.ReduceLROnPlateau(base_lr=0.1), momentum=0.9)
    s_state = sgd.init(p)
    assert_type(sgd.step_schedule(s_state, 0.5), optim.SGDState)
    assert_type(sgd.step_schedule(s_state, t), optim.SGDState)
    groups = optim.ParamGroups(
        {"b": optim.SGD(lr=optim.ReduceLROnPlateau(base_lr=0.1))}, default=sgd
    )
    g_state = groups.init(p)
    assert_type(groups.step_schedule(g_state, 1.0), tuple[optim.SGDState, ...])
    acc = optim.MultiSteps(sgd, every_k=2)
    assert_type(acc.step_schedule(acc.init(p), 1.0), optim.MultiStepsState)
    clip = optim.ClipGradNorm(sgd, max_norm=1.0)
    assert_type(clip.step_schedule(clip.init(p), 1.0), optim.SGDState)
    assert_type(optim.StepLR(base_lr=0.1, step_size=2).init(), optim.ScheduleState)
    assert_type(optim.StepLR(step_size=2).base_lr, float | Tensor | None)
    assert_type(optim.ReduceLROnPlateau(base_lr=0.1).init(), optim.PlateauState)
