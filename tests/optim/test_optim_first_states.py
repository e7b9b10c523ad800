"""What each optimizer's own `init_state` and `check_state` give, and schedule flags.

The base classes document these methods; these tests pin what is particular to
each optimizer and schedule.
"""

from __future__ import annotations

import pytest
import torch

from paramdict import ParamDict, optim
from paramdict.optim._adam_moments import AdamOptions
from paramdict.optim._hyper import host_numbers

F64 = torch.float64


def _ones(*shape: int) -> ParamDict:
    return ParamDict(w=torch.ones(*shape))


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_adam_family_shares_its_options() -> None:
    opt = optim.Adamax()
    assert isinstance(opt, AdamOptions)
    assert (opt.betas, opt.eps) == ((0.9, 0.999), 1e-08)


def test_host_numbers_reads_cpu_numbers_and_keeps_a_grad_leaf_a_tensor() -> None:
    assert host_numbers(False, torch.tensor(3.0, dtype=F64), 0.1) == (3.0, 0.1)
    leaf = torch.tensor(0.1, requires_grad=True)
    assert host_numbers(True, torch.tensor(3.0), leaf) is None
    read = host_numbers(False, torch.tensor(3.0), leaf)
    assert read == (3.0, torch.tensor(0.1).item())


def test_adam_starts_at_zero_without_amsgrad_buffers() -> None:
    state = optim.Adam().init(_ones(2))
    _same(state.step, torch.tensor(0.0, dtype=F64))
    _same(state.exp_avg["w"], torch.zeros(2))
    assert len(state.max_exp_avg_sq) == 0


def test_lion_and_sgd_start_with_zero_momentum() -> None:
    _same(optim.Lion().init(_ones(2)).exp_avg["w"], torch.zeros(2))
    sgd = optim.SGD(lr=0.1, momentum=0.9)
    _same(sgd.init(_ones(2)).momentum_buffer["w"], torch.zeros(2))


def test_nadam_starts_its_momentum_product_at_one() -> None:
    state = optim.NAdam().init(_ones(2))
    _same(state.mu_product, torch.tensor(1.0))
    _same(state.exp_avg["w"], torch.zeros(2))


def test_schedule_free_starts_z_at_the_parameters() -> None:
    state = optim.ScheduleFreeAdamW().init(_ones(2))
    _same(state.z["w"], torch.ones(2))
    _same(state.lr_max, torch.tensor(0.0, dtype=F64))


def test_soap_starts_with_zero_eigenbases() -> None:
    state = optim.SOAP().init(_ones(3, 2))
    _same(state.q[0]["w"], torch.zeros(3, 3))


def test_soap_refuses_a_state_built_for_a_larger_max_precond_dim() -> None:
    params = _ones(3, 2)
    state = optim.SOAP().init(params)
    with pytest.raises(ValueError, match="The state's `gg` does not fit"):
        optim.SOAP(max_precond_dim=2).check_state(params, state)


def test_asgd_refuses_another_optimizers_state_by_name() -> None:
    params = _ones(2)
    with pytest.raises(TypeError, match=r"`ASGD` needs a `ASGDState`.*SGDState"):
        optim.ASGD().check_state(params, optim.SGD().init(params))  # type: ignore[arg-type]


def test_the_schedules_that_cycle_momentum_or_take_a_metric_say_so() -> None:
    assert optim.CyclicLR(base_lr=0.01, max_lr=0.1).cycles_momentum
    assert optim.OneCycleLR(max_lr=0.1, total_steps=10).cycles_momentum
    assert optim.ReduceLROnPlateau().takes_metric
    assert not optim.StepLR(step_size=2).cycles_momentum
    assert not optim.StepLR(step_size=2).takes_metric


def test_one_cycle_starts_its_momentum_at_max_momentum() -> None:
    schedule = optim.OneCycleLR(max_lr=1.0, total_steps=10)
    momentum = schedule.step(schedule.init(0.0)).momentum
    assert momentum is not None
    assert round(float(momentum), 6) == 0.9
