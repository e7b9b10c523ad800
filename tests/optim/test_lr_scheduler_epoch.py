"""Stepping a schedule to an epoch: `CosineAnnealingWarmRestarts.step(state, epoch)`."""

from __future__ import annotations

import math

import pytest
import torch

from paramdict import optim

EPOCHS: list[float | None] = [None, 0.5, 1.25, 7, None, None, 26, None, 3.3, 0]
EPOCHS += [None, 13.75, 100, None, 2, 2.0, None]


@pytest.mark.parametrize(("t_0", "t_mult"), [(3, 1), (2, 2), (5, 3), (1, 1)])
def test_warm_restarts_step_to_epoch_equals_torch(t_0: int, t_mult: int) -> None:
    """Int and float epochs mixed with plain steps: torch's rates bitwise."""
    w = torch.nn.Parameter(torch.ones(1))
    torch_opt = torch.optim.SGD([w], lr=0.1)
    torch_sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
        torch_opt, T_0=t_0, T_mult=t_mult, eta_min=0.001
    )
    schedule = optim.CosineAnnealingWarmRestarts(
        base_lr=0.1, T_0=t_0, T_mult=t_mult, eta_min=0.001
    )
    state = schedule.init()
    for epoch in EPOCHS:
        torch_opt.step()
        if epoch is None:
            torch_sched.step()
            state = schedule.step(state)
        else:
            torch_sched.step(epoch)
            state = schedule.step(state, epoch)
        assert float(state.lr) == torch_sched.get_last_lr()[0]
        assert float(state.last_epoch) == torch_sched.last_epoch
        assert float(state.counters[0]) == torch_sched.T_cur
        assert float(state.counters[1]) == torch_sched.T_i


def test_fractional_epochs_within_an_epoch_equal_torch() -> None:
    """Torch's documented pattern, `step(epoch + i / iters)`, bitwise."""
    w = torch.nn.Parameter(torch.ones(1))
    torch_opt = torch.optim.SGD([w], lr=1.0)
    torch_sched = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
        torch_opt, T_0=2, T_mult=2
    )
    schedule = optim.CosineAnnealingWarmRestarts(base_lr=1.0, T_0=2, T_mult=2)
    state = schedule.init()
    iters = 7
    for epoch in range(8):
        for i in range(iters):
            torch_opt.step()
            torch_sched.step(epoch + i / iters)
            state = schedule.step(state, epoch + i / iters)
            assert float(state.lr) == torch_sched.get_last_lr()[0]


@pytest.mark.parametrize(
    ("epoch", "error", "match"),
    [
        (-1, ValueError, r"Expected non-negative epoch, but got -1"),
        (math.nan, ValueError, r"Expected non-negative epoch, but got nan"),
        (math.inf, ValueError, r"Expected non-negative epoch, but got inf"),
        ("3", TypeError, r"`epoch` must be a number, got str"),
        (True, TypeError, r"`epoch` must be a number, got bool"),
    ],
)
def test_bad_epoch_refused(epoch: object, error: type[Exception], match: str) -> None:
    """A negative, non-finite or non-number epoch is refused."""
    schedule = optim.CosineAnnealingWarmRestarts(base_lr=0.1, T_0=2)
    state = schedule.init()
    with pytest.raises(error, match=match):
        schedule.step(state, epoch)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "schedule",
    [
        optim.StepLR(base_lr=0.1, step_size=2),
        optim.OneCycleLR(max_lr=0.1, total_steps=10),
        optim.SequentialLR(
            base_lr=0.1,
            schedulers=[optim.ConstantLR(), optim.ExponentialLR(gamma=0.5)],
            milestones=[2],
        ),
    ],
    ids=["StepLR", "OneCycleLR", "SequentialLR"],
)
def test_other_schedules_refuse_an_epoch(schedule: optim.LRSchedule) -> None:
    """Schedules whose `step(epoch)` torch deprecates say to step once per epoch."""
    with pytest.raises(TypeError, match=r"takes no epoch.*step\(state\)"):
        schedule.step(schedule.init(), 3)
