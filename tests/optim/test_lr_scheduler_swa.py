"""`SWALR` against `torch.optim.swa_utils.SWALR`, side by side, bit for bit."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from paramdict import ParamDict, optim

F64 = torch.float64


@pytest.mark.parametrize("anneal_epochs", [0, 1, 3, 10])
@pytest.mark.parametrize("anneal_strategy", ["cos", "linear"])
@pytest.mark.parametrize("base", [0.1, 1.0, 0.037])
def test_swalr_rates_equal_torch(
    anneal_epochs: int, anneal_strategy: Any, base: float
) -> None:
    """Every rate equals torch's `get_last_lr()` bitwise, through and past annealing."""
    w = torch.nn.Parameter(torch.ones(1))
    torch_opt = torch.optim.SGD([w], lr=base)
    torch_sched = torch.optim.swa_utils.SWALR(
        torch_opt,
        swa_lr=0.05,
        anneal_epochs=anneal_epochs,
        anneal_strategy=anneal_strategy,
    )
    schedule = optim.SWALR(
        swa_lr=0.05, anneal_epochs=anneal_epochs, anneal_strategy=anneal_strategy
    )
    state = schedule.init(base)
    for _ in range(anneal_epochs + 5):
        assert float(state.lr) == torch_sched.get_last_lr()[0]
        torch_opt.step()
        torch_sched.step()
        state = schedule.step(state)


@pytest.mark.parametrize("method", ["step", "step_"])
def test_swalr_as_lr_equals_torch(method: str) -> None:
    """SGD with momentum under `SWALR` gives torch's parameters bitwise.

    `step_` takes torch's fused kernel on the CPU, so it is compared with
    `fused=True`; `step` with torch's default.
    """
    torch.manual_seed(0)
    start = torch.randn(5, dtype=F64)
    grads = [torch.randn(5, dtype=F64) for _ in range(12)]
    w = torch.nn.Parameter(start.clone())
    fused = True if method == "step_" else None
    torch_opt = torch.optim.SGD([w], lr=0.2, momentum=0.9, fused=fused)
    torch_sched = torch.optim.swa_utils.SWALR(torch_opt, swa_lr=0.01, anneal_epochs=5)
    opt = optim.SGD(
        lr=optim.SWALR(base_lr=0.2, swa_lr=0.01, anneal_epochs=5), momentum=0.9
    )
    params = ParamDict(w=start.clone())
    state = opt.init(params)
    for g in grads:
        w.grad = g.clone()
        torch_opt.step()
        torch_sched.step()
        params, state = getattr(opt, method)(params, ParamDict(w=g.clone()), state)
        torch.testing.assert_close(params["w"], w.detach(), rtol=0, atol=0)
        assert opt.last_lr(state) == torch_sched.get_last_lr()


def test_swalr_after_a_cosine_schedule_equals_torch() -> None:
    """SWA's usual rates: a cosine schedule, then `SWALR` from where it left off."""
    w = torch.nn.Parameter(torch.ones(1))
    torch_opt = torch.optim.SGD([w], lr=0.5)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(torch_opt, T_max=10)
    swa = torch.optim.swa_utils.SWALR(torch_opt, swa_lr=0.05, anneal_epochs=3)
    schedule = optim.SequentialLR(
        base_lr=0.5,
        schedulers=[
            optim.CosineAnnealingLR(T_max=10),
            optim.SWALR(swa_lr=0.05, anneal_epochs=3),
        ],
        milestones=[6],
    )
    state = schedule.init()
    torch_rates, rates = [], []
    for epoch in range(12):
        torch_rates.append(torch_opt.param_groups[0]["lr"])
        rates.append(float(state.lr))
        torch_opt.step()
        (cosine if epoch < 5 else swa).step()
        state = schedule.step(state)
    assert rates[:6] == torch_rates[:6]
    assert math.isclose(rates[-1], 0.05)
    assert math.isclose(torch_rates[-1], 0.05)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"swa_lr": -0.1}, ValueError, r"`swa_lr` must be finite and at least 0"),
        ({"swa_lr": math.nan}, ValueError, r"`swa_lr` must be finite"),
        ({"swa_lr": "0.1"}, TypeError, r"`swa_lr` must be a number"),
        ({"swa_lr": 0.1, "anneal_epochs": -1}, ValueError, r"anneal_epochs must be"),
        ({"swa_lr": 0.1, "anneal_epochs": 1.5}, ValueError, r"anneal_epochs must be"),
        ({"swa_lr": 0.1, "anneal_epochs": 2**63}, ValueError, r"`anneal_epochs`"),
        ({"swa_lr": 0.1, "anneal_strategy": "step"}, ValueError, r"anneal_strategy"),
    ],
)
def test_swalr_refuses_what_torch_refuses(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Bad settings are refused when built, naming the argument."""
    with pytest.raises(error, match=match):
        optim.SWALR(**kwargs)
