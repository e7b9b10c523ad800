"""Momentum cycled by a schedule inside `SequentialLR`/`ChainedScheduler` is applied.

torch's `CyclicLR` and `OneCycleLR` write the momentum into the optimizer they
share with the other schedulers; the optimizer's momentum is the last one written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as torch_lr

from paramdict import ParamDict, optim

F64 = torch.float64


def momentum(state: Any) -> float:
    """The momentum the schedule in `state` sets."""
    return float(state.schedule.momentum)


CASES: list[tuple[str, Callable[[Any], Any], Callable[[], optim.LRSchedule]]] = [
    (
        "chained-cyclic",
        lambda o: torch_lr.ChainedScheduler(
            [
                torch_lr.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=3),
                torch_lr.ExponentialLR(o, gamma=0.9),
            ]
        ),
        lambda: optim.ChainedScheduler(
            base_lr=0.1,
            schedulers=[
                optim.CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=3),
                optim.ExponentialLR(gamma=0.9),
            ],
        ),
    ),
    (
        "sequential-cyclic-second",
        lambda o: torch_lr.SequentialLR(
            o,
            [
                torch_lr.ConstantLR(o, factor=0.5, total_iters=3),
                torch_lr.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=4),
            ],
            milestones=[4],
        ),
        lambda: optim.SequentialLR(
            base_lr=0.1,
            schedulers=[
                optim.ConstantLR(factor=0.5, total_iters=3),
                optim.CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=4),
            ],
            milestones=[4],
        ),
    ),
]


@pytest.mark.parametrize("method", ["step", "step_"])
@pytest.mark.parametrize(
    ("make_torch", "make_ours"),
    [pytest.param(t, o, id=i) for i, t, o in CASES],
)
def test_nested_cycled_momentum_equals_torch(
    make_torch: Callable[[Any], Any],
    make_ours: Callable[[], optim.LRSchedule],
    method: str,
) -> None:
    """SGD's momentum, rates and parameters equal torch's bitwise for 30 steps."""
    torch.manual_seed(0)
    start = torch.randn(4, dtype=F64)
    grads = [torch.randn(4, dtype=F64) for _ in range(30)]
    w = torch.nn.Parameter(start.clone())
    fused = True if method == "step_" else None  # `step_` takes the fused kernel
    torch_opt = torch.optim.SGD([w], lr=0.1, momentum=0.9, fused=fused)
    torch_sched = make_torch(torch_opt)
    opt = optim.SGD(lr=make_ours(), momentum=0.9)
    params = ParamDict(w=start.clone())
    state = opt.init(params)
    assert momentum(state) == torch_opt.param_groups[0]["momentum"]
    for g in grads:
        w.grad = g.clone()
        torch_opt.step()
        torch_sched.step()
        params, state = getattr(opt, method)(params, ParamDict(w=g.clone()), state)
        assert opt.last_lr(state) == torch_sched.get_last_lr()
        assert momentum(state) == torch_opt.param_groups[0]["momentum"]
        torch.testing.assert_close(params["w"], w.detach(), rtol=0, atol=0)


def test_nested_cycled_momentum_needs_a_momentum() -> None:
    """A composed schedule that cycles the momentum is refused by Adagrad."""
    schedule = CASES[0][2]()
    with pytest.raises(
        ValueError, match=r"`ChainedScheduler` given as `lr` cycles the momentum"
    ):
        optim.Adagrad(lr=schedule)
