"""`last_lr` and `step_count` through every wrapper, against torch's scheduler."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from paramdict import ParamDict, optim


def _params() -> ParamDict:
    return ParamDict(w=torch.ones(2, 2), b=torch.zeros(2))


def _grads(params: ParamDict) -> ParamDict:
    return params.ones_like()


def test_last_lr_and_step_count_follow_torch_through_the_wrappers() -> None:
    """Groups inside clipping inside accumulation report torch's lr and step."""
    params = _params()
    model = [torch.nn.Parameter(params[key].clone()) for key in ("w", "b")]
    torch_groups: list[dict[str, Any]] = [
        {"params": model[:1]},
        {"params": model[1:], "lr": 0.05},
    ]
    ref = torch.optim.AdamW(torch_groups, lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(ref, step_size=2, gamma=0.5)
    groups = optim.ParamGroups(
        {
            lambda name, t: t.dim() >= 2: optim.AdamW(
                lr=optim.StepLR(base_lr=0.1, step_size=2, gamma=0.5)
            )
        },
        default=optim.AdamW(lr=optim.StepLR(base_lr=0.05, step_size=2, gamma=0.5)),
    )
    opt = optim.MultiSteps(optim.ClipGradNorm(groups, max_norm=1.0), every_k=2)
    state = opt.init(params)
    assert opt.last_lr(state) == sched.get_last_lr()
    assert opt.step_count(state) == 0
    for call in range(1, 9):
        params, state = opt.step(params, _grads(params), state)
        if call % 2 == 0:
            for p in model:
                p.grad = torch.ones_like(p)
            torch.nn.utils.clip_grad_norm_(model, 1.0)
            ref.step()
            sched.step()
        assert opt.last_lr(state) == pytest.approx(sched.get_last_lr(), rel=1e-15)
        assert opt.step_count(state) == int(ref.state[model[0]].get("step", 0))
        torch.testing.assert_close(params["w"], model[0].detach())


def test_last_lr_of_a_constant_rate_and_of_per_key_rates() -> None:
    """A number gives one entry; a per-key rate gives one entry per key."""
    params = _params()
    assert optim.SGD(lr=0.25).last_lr(optim.SGD(lr=0.25).init(params)) == [0.25]
    per_key = optim.SGD(lr=ParamDict(w=torch.tensor(0.5), b=torch.tensor(0.125)))
    assert per_key.last_lr(per_key.init(params)) == [0.5, 0.125]


def test_step_count_counts_steps() -> None:
    """Each `step` adds one to the count."""
    params = _params()
    opt = optim.Adam()
    state = opt.init(params)
    for _ in range(3):
        params, state = opt.step(params, _grads(params), state)
    assert opt.step_count(state) == 3
