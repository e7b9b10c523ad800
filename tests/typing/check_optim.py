"""Never run: mypy checks that paramdict.optim keeps precise types."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import assert_type

import paramdict
from paramdict import ParamDict, optim


class MyParams(ParamDict):
    __slots__ = ()


def check_configs(t: Tensor, p: ParamDict) -> None:
    assert_type(optim.SGD(lr=0.1, momentum=0.9, nesterov=True), optim.SGD)
    assert_type(optim.Adam(lr=t, betas=(0.9, 0.99), amsgrad=True), optim.Adam)
    assert_type(optim.AdamW(lr=p, weight_decay=0.0), optim.AdamW)
    assert_type(optim.RMSprop(centered=True, differentiable=True), optim.RMSprop)
    assert_type(optim.Adagrad(lr_decay=0.01), optim.Adagrad)
    assert_type(
        optim.Adam().lr,
        float | Tensor | ParamDict | optim.LRSchedule | optim.ReduceLROnPlateau,
    )
    assert_type(optim.Adam().betas, tuple[float, float])
    assert_type(optim.SGD().differentiable, bool)
    rate: optim.Rate = t
    sgd: optim.Optimizer[optim.SGDState] = optim.SGD(lr=rate)
    assert_type(sgd.init(p), optim.SGDState)
    assert_type(paramdict.optim.Adam(), optim.Adam)


def check_init(p: ParamDict) -> None:
    assert_type(optim.SGD().init(p), optim.SGDState)
    assert_type(optim.Adam().init(p), optim.AdamState)
    assert_type(optim.AdamW().init(p), optim.AdamState)
    assert_type(optim.RMSprop().init(p), optim.RMSpropState)
    assert_type(optim.Adagrad().init(p), optim.AdagradState)


def check_step(p: ParamDict, q: MyParams, g: ParamDict, d: dict[str, Tensor]) -> None:
    adam = optim.Adam()
    assert_type(adam.step(p, g, adam.init(p)), tuple[ParamDict, optim.AdamState])
    assert_type(adam.step(q, d, adam.init(q)), tuple[MyParams, optim.AdamState])
    sgd = optim.SGD()
    assert_type(sgd.step(q, g, sgd.init(q)), tuple[MyParams, optim.SGDState])
    rms = optim.RMSprop()
    assert_type(rms.step(p, g, rms.init(p)), tuple[ParamDict, optim.RMSpropState])
    ada = optim.Adagrad()
    assert_type(ada.step(p, g, ada.init(p)), tuple[ParamDict, optim.AdagradState])


def check_state(s: optim.AdamState, r: optim.RMSpropState) -> None:
    assert_type(s.step, Tensor)
    assert_type(s.exp_avg, ParamDict)
    assert_type(s.exp_avg_sq, ParamDict)
    assert_type(s.max_exp_avg_sq, ParamDict)
    assert_type(s._replace(step=s.step + 1), optim.AdamState)
    assert_type(r.square_avg, ParamDict)
    assert_type(optim.SGDState(torch.zeros(()), ParamDict()).momentum_buffer, ParamDict)
    assert_type(optim.AdagradState(torch.zeros(()), ParamDict()).sum, ParamDict)


def check_combinators(p: ParamDict, q: MyParams, g: ParamDict) -> None:
    groups = optim.ParamGroups(
        {"*.bias": optim.AdamW(weight_decay=0.0), ("a.*", "b.*"): optim.Adam()},
        default=optim.AdamW(),
    )
    assert_type(groups, optim.ParamGroups[optim.AdamState])
    assert_type(groups.init(p), tuple[optim.AdamState, ...])
    assert_type(
        groups.step(q, g, groups.init(q)), tuple[MyParams, tuple[optim.AdamState, ...]]
    )
    clipped = optim.ClipGradNorm(optim.SGD(), max_norm=1.0)
    assert_type(clipped, optim.ClipGradNorm[optim.SGDState])
    assert_type(clipped.init(p), optim.SGDState)
    assert_type(clipped.step(p, g, clipped.init(p)), tuple[ParamDict, optim.SGDState])
    mixed: optim.ParamGroups[Any] = optim.ParamGroups(
        {"w": optim.SGD()}, default=optim.Adagrad()
    )
    assert_type(mixed.init(p), tuple[Any, ...])


def check_step_module(m: nn.Module, x: Tensor) -> None:
    opt = optim.Adam()
    state = opt.init(ParamDict.from_module(m))
    assert_type(
        opt.step_module(m, lambda: m(x).sum(), state), tuple[Tensor, optim.AdamState]
    )
