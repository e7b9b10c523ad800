"""A schedule written outside paramdict drives an optimizer by declaring what it is.

The optimizer asks the schedule whether it cycles the momentum, which schedules
it wraps and how one step moves it; no list of known classes decides. Each
reference is torch's SGD with the rate (and momentum) written into its group
before every step, as a torch scheduler does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import pytest
import torch
from torch import Tensor
from torch.optim import lr_scheduler as torch_lr

from paramdict import ParamDict, optim

F64 = torch.float64


@attrs.frozen(kw_only=True, eq=False)
class AlternatingMomentum(optim.LRSchedule):
    """Halve the rate every step; the momentum alternates between `high` and `low`."""

    high: float = 0.9
    low: float = 0.5

    @property
    def cycles_momentum(self) -> bool:
        """This schedule sets the optimizer's momentum."""
        return True

    def _momentum(self, epoch: Tensor) -> Tensor:
        even = torch.remainder(epoch, 2) == 0
        return torch.where(even, epoch.new_full((), self.high), self.low)

    def _initial(self, base: Tensor, current: Tensor) -> optim.ScheduleState:
        zero = torch.zeros_like(base)
        momentum = self._momentum(zero)
        return optim.ScheduleState(zero, base, current.clone(), momentum, (), ())

    def _advance(
        self, state: optim.ScheduleState, current: Tensor
    ) -> optim.ScheduleState:
        epoch = state.last_epoch + 1
        return state._replace(
            last_epoch=epoch, lr=current * 0.5, momentum=self._momentum(epoch)
        )


@attrs.frozen(kw_only=True, eq=False)
class Scaled(optim.LRSchedule):
    """The rate of `schedule` times `factor`: a wrapper around one schedule.

    It sets no base rate of its own (it wraps `CyclicLR`, which sets its own),
    and passes on the momentum the wrapped schedule cycles.
    """

    takes_base: ClassVar[bool] = False

    schedule: optim.LRSchedule
    factor: float

    @property
    def _schedulers(self) -> tuple[optim.LRSchedule, ...]:
        return (self.schedule,)

    def _wrap(self, child: optim.ScheduleState, epoch: Tensor) -> optim.ScheduleState:
        # Copies: no two fields of the state share a tensor.
        momentum = None if child.momentum is None else child.momentum.clone()
        lr = child.lr * self.factor
        return optim.ScheduleState(
            epoch, child.base_lr.clone(), lr, momentum, (), (child,)
        )

    def _initial(self, base: Tensor, current: Tensor) -> optim.ScheduleState:
        child = self.schedule._initial(base, current)
        return self._wrap(child, torch.zeros_like(base))

    def _advance(
        self, state: optim.ScheduleState, current: Tensor
    ) -> optim.ScheduleState:
        child = state.children[0]
        assert isinstance(child, optim.ScheduleState)
        stepped = self.schedule._advance(child, child.lr)
        return self._wrap(stepped, state.last_epoch + 1)


def _alternating_values(steps: int) -> list[tuple[float, float]]:
    return [(0.1 * 0.5**k, 0.9 if k % 2 == 0 else 0.5) for k in range(steps)]


def _scaled_cyclic_values(steps: int) -> list[tuple[float, float]]:
    """The values of torch's `CyclicLR` (rate halved) on an optimizer of its own."""
    holder = torch.optim.SGD([torch.zeros(1, dtype=F64)], lr=0.1, momentum=0.9)
    sched = torch_lr.CyclicLR(holder, base_lr=0.01, max_lr=0.1, step_size_up=3)
    values = []
    for _ in range(steps):
        group = holder.param_groups[0]
        values.append((group["lr"] * 0.5, group["momentum"]))
        holder.step()
        sched.step()
    return values


CASES: list[tuple[str, Callable[[], optim.LRSchedule], Callable[[int], Any]]] = [
    (
        "cycles-momentum",
        lambda: AlternatingMomentum(base_lr=0.1),
        _alternating_values,
    ),
    (
        "wraps-a-schedule",
        lambda: Scaled(
            schedule=optim.CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=3),
            factor=0.5,
        ),
        _scaled_cyclic_values,
    ),
]


@pytest.mark.parametrize("method", ["step", "step_"])
@pytest.mark.parametrize(
    ("make", "values"), [pytest.param(m, v, id=i) for i, m, v in CASES]
)
def test_a_user_schedule_drives_sgd_as_torch(
    make: Callable[[], optim.LRSchedule],
    values: Callable[[int], list[tuple[float, float]]],
    method: str,
) -> None:
    """SGD's rate, momentum and parameters follow the user's schedule, bitwise."""
    steps = 8
    torch.manual_seed(0)
    start = torch.randn(4, dtype=F64)
    grads = [torch.randn(4, dtype=F64) for _ in range(steps)]
    w = torch.nn.Parameter(start.clone())
    torch_opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    schedule = make()
    assert schedule.cycles_momentum
    opt = optim.SGD(lr=schedule, momentum=0.9)
    params = ParamDict(w=start.clone())
    state = opt.init(params)
    for g, (lr, momentum) in zip(grads, values(steps), strict=True):
        assert opt.last_lr(state) == [lr]
        assert isinstance(state.schedule, optim.ScheduleState)
        assert state.schedule.momentum is not None
        assert float(state.schedule.momentum) == momentum
        torch_opt.param_groups[0].update(lr=lr, momentum=momentum)
        w.grad = g.clone()
        torch_opt.step()
        params, state = getattr(opt, method)(params, ParamDict(w=g.clone()), state)
        torch.testing.assert_close(params["w"], w.detach(), rtol=0, atol=0)


def test_a_wrapper_answers_for_what_it_wraps() -> None:
    """A wrapper cycles the momentum when what it wraps does, and not otherwise."""
    cyclic = optim.CyclicLR(base_lr=0.01, max_lr=0.1, cycle_momentum=False)
    assert not Scaled(schedule=cyclic, factor=0.5).cycles_momentum
    still = Scaled(schedule=optim.OneCycleLR(max_lr=0.1, total_steps=5), factor=0.5)
    assert still.cycles_momentum
    with pytest.raises(
        ValueError,
        match=r"`Scaled` given as `lr` cycles the momentum.*cycle_momentum=False",
    ):
        optim.Adagrad(lr=still)


def test_the_schedules_answer_for_themselves() -> None:
    """Each built-in schedule says whether it cycles the momentum or takes a metric."""
    cyclic = optim.CyclicLR(base_lr=0.01, max_lr=0.1)
    plateau = optim.ReduceLROnPlateau()
    step = optim.StepLR(step_size=2)
    assert cyclic.cycles_momentum
    flat = optim.OneCycleLR(max_lr=0.1, total_steps=5, cycle_momentum=False)
    assert not flat.cycles_momentum
    assert not step.cycles_momentum
    assert not plateau.cycles_momentum
    assert plateau.takes_metric
    assert not step.takes_metric
    assert not cyclic.takes_metric
    chained = optim.ChainedScheduler(schedulers=[step, plateau])
    assert chained.takes_metric
    assert not chained.cycles_momentum
    sequential = optim.SequentialLR(schedulers=[step, cyclic], milestones=[3])
    assert sequential.cycles_momentum
    assert not sequential.takes_metric


def test_a_plateau_in_a_nested_chain_moves_with_the_metric() -> None:
    """A chain holding a chain with a plateau takes the metric and moves as torch.

    torch's pattern: `ExponentialLR` and `StepLR` stepped every step and a
    `ReduceLROnPlateau` with the loss, all on one SGD. The plateau is one level
    down here; the rates are torch's, step by step (float64).
    """
    inner = optim.ChainedScheduler(
        schedulers=[
            optim.StepLR(step_size=3, gamma=0.5),
            optim.ReduceLROnPlateau(patience=0),
        ]
    )
    outer = optim.ChainedScheduler(
        base_lr=0.01, schedulers=[optim.ExponentialLR(gamma=0.9), inner]
    )
    assert inner.takes_metric
    assert outer.takes_metric
    opt = optim.SGD(lr=outer)
    params = ParamDict(w=torch.ones(2, dtype=F64))
    state = opt.init(params)
    w = torch.nn.Parameter(torch.ones(2, dtype=F64))
    theirs = torch.optim.SGD([w], lr=0.01)
    exponential = torch_lr.ExponentialLR(theirs, gamma=0.9)
    step_lr = torch_lr.StepLR(theirs, step_size=3, gamma=0.5)
    plateau = torch_lr.ReduceLROnPlateau(theirs, patience=0)
    for loss in (3.0, 2.0, 2.0, 2.5, 1.0, 1.0, 1.0):
        params, state = opt.step(params, params.ones_like(), state)
        w.grad = torch.ones_like(w)
        theirs.step()
        exponential.step()
        step_lr.step()
        state = opt.step_schedule(state, loss)
        plateau.step(loss)
        assert opt.last_lr(state) == [theirs.param_groups[0]["lr"]]
        torch.testing.assert_close(params["w"], w.detach(), rtol=0, atol=0)
