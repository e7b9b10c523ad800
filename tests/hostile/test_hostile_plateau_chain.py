"""A metric given where no plateau takes it, and a plateau where none is allowed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from paramdict import ParamDict, optim


def test_step_metric_without_a_chained_plateau_is_refused() -> None:
    """`step_metric` on a chain with no `ReduceLROnPlateau` says what moves it."""
    chain = optim.ChainedScheduler(
        base_lr=0.1, schedulers=[optim.StepLR(step_size=2, gamma=0.5)]
    )
    state = chain.init()
    with pytest.raises(ValueError, match="holds none; its schedules advance with"):
        chain.step_metric(state, 1.0)


def test_step_schedule_refuses_a_chain_without_a_plateau() -> None:
    """An optimizer whose chained `lr` takes no metric refuses one, state unchanged."""
    chain = optim.ChainedScheduler(
        base_lr=0.1, schedulers=[optim.ExponentialLR(gamma=0.9)]
    )
    opt = optim.SGD(lr=chain)
    state = opt.init(ParamDict(w=torch.ones(2)))
    before = opt.last_lr(state)[0]
    assert not opt.takes_metric
    with pytest.raises(ValueError, match="or a chain holding one"):
        opt.step_schedule(state, 1.0)
    assert opt.last_lr(state)[0] == before


def test_sequential_refuses_a_plateau_and_points_to_the_chain() -> None:
    """`SequentialLR` cannot pass a metric; the error names `ChainedScheduler`."""
    with pytest.raises(ValueError, match="Chain it with the others in a"):
        optim.SequentialLR(
            base_lr=0.1,
            schedulers=[optim.StepLR(step_size=2), optim.ReduceLROnPlateau()],
            milestones=[2],
        )


def test_bad_metric_through_a_chain_is_refused_with_nothing_changed() -> None:
    """A metric `float` cannot read is refused by the chained plateau."""
    chain = optim.ChainedScheduler(
        base_lr=0.1,
        schedulers=[optim.StepLR(step_size=2), optim.ReduceLROnPlateau()],
    )
    opt = optim.SGD(lr=chain)
    state = opt.init(ParamDict(w=torch.ones(2)))
    assert opt.takes_metric
    loose: Any = opt  # untyped view, to pass a bad metric
    with pytest.raises(TypeError, match="`metrics` must be a number"):
        loose.step_schedule(state, "low")
    with pytest.raises(ValueError, match="must be one number"):
        opt.step_schedule(state, torch.ones(3))
    assert opt.last_lr(state)[0] == pytest.approx(0.1)
