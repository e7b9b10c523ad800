"""Schedules driving optimizers: torch parity, compile, meta-gradients."""

from __future__ import annotations

import math

import pytest
import torch
from _torch_versions import ONE_GRAPH
from torch._dynamo.testing import CompileCounter
from torch.optim import lr_scheduler as tls

from paramdict import ParamDict, optim


def _problem() -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    init = {
        "w": torch.randn(3, 4, generator=gen, dtype=torch.float64),
        "b": torch.randn(3, generator=gen, dtype=torch.float64),
    }
    x = torch.randn(32, 4, generator=gen, dtype=torch.float64)
    y = torch.randn(32, 3, generator=gen, dtype=torch.float64)
    return init, x, y


def _loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((x @ p["w"].T + p["b"] - y) ** 2).mean()


def test_sgd_with_cosine_schedule_matches_torch() -> None:
    """100 SGD steps with `CosineAnnealingLR` equal torch.optim plus its scheduler."""
    init, x, y = _problem()
    ref = {k: v.clone().requires_grad_() for k, v in init.items()}
    opt = torch.optim.SGD(list(ref.values()), lr=0.1, momentum=0.9)
    sched = tls.CosineAnnealingLR(opt, T_max=30, eta_min=0.001)
    schedule = optim.CosineAnnealingLR(T_max=30, eta_min=0.001)
    s_state = schedule.init(0.1)
    params = ParamDict(init).requires_grad_()
    o_state = optim.SGD(lr=0.1, momentum=0.9).init(params)
    for _ in range(100):
        opt.zero_grad()
        torch.autograd.backward(_loss(ref, x, y))
        opt.step()
        sched.step()
        sgd = optim.SGD(lr=float(s_state.lr), momentum=0.9)
        params, o_state = sgd.step(params, params.grad(_loss(params, x, y)), o_state)
        s_state = schedule.step(s_state)
    for k in init:
        torch.testing.assert_close(params[k], ref[k].detach(), rtol=1e-12, atol=0)


def test_adam_with_one_cycle_and_beta_cycling_matches_torch() -> None:
    """100 Adam steps with `OneCycleLR` (rate and first beta) equal torch's."""
    init, x, y = _problem()
    ref = {k: v.clone().requires_grad_() for k, v in init.items()}
    opt = torch.optim.Adam(list(ref.values()), lr=0.01)
    sched = tls.OneCycleLR(opt, max_lr=0.05, total_steps=100)
    schedule = optim.OneCycleLR(max_lr=0.05, total_steps=100)
    s_state = schedule.init(0.01)
    params = ParamDict(init).requires_grad_()
    o_state = optim.Adam().init(params)
    for i in range(100):
        opt.zero_grad()
        torch.autograd.backward(_loss(ref, x, y))
        opt.step()
        if i < 99:
            sched.step()
        assert s_state.momentum is not None
        adam = optim.Adam(lr=float(s_state.lr), betas=(float(s_state.momentum), 0.999))
        params, o_state = adam.step(params, params.grad(_loss(params, x, y)), o_state)
        if i < 99:
            s_state = schedule.step(s_state)
    for k in init:
        torch.testing.assert_close(params[k], ref[k].detach(), rtol=1e-12, atol=0)


SCHEDULES = [
    optim.CosineAnnealingLR(T_max=10, eta_min=0.01),
    optim.CosineAnnealingWarmRestarts(T_0=3, T_mult=2),
    optim.OneCycleLR(max_lr=0.1, total_steps=100),
    optim.CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=5),
    optim.SequentialLR(
        schedulers=[
            optim.LinearLR(start_factor=0.1, total_iters=5),
            optim.CosineAnnealingLR(T_max=30),
        ],
        milestones=[5],
    ),
    optim.ChainedScheduler(
        schedulers=[optim.ConstantLR(), optim.ExponentialLR(gamma=0.9)]
    ),
    optim.MultiStepLR(milestones=[3, 7, 7]),
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: type(s).__name__)
@ONE_GRAPH
def test_compiled_step_compiles_once(schedule: optim.LRSchedule) -> None:
    """A compiled `step` runs 50 steps from one graph, with eager's values."""
    torch._dynamo.reset()
    counter = CompileCounter()
    step = torch.compile(schedule.step, backend=counter, fullgraph=True)
    compiled = eager = schedule.init(0.1)
    for _ in range(50):
        compiled, eager = step(compiled), schedule.step(eager)
        torch.testing.assert_close(compiled.lr, eager.lr, rtol=0, atol=0)
    assert counter.frame_count == 1


@ONE_GRAPH
def test_plateau_compiles_once() -> None:
    """A compiled `ReduceLROnPlateau.step` does not specialize on the metric."""
    torch._dynamo.reset()
    counter = CompileCounter()
    schedule = optim.ReduceLROnPlateau(patience=1)
    step = torch.compile(schedule.step, backend=counter, fullgraph=True)
    state = schedule.init(0.1)
    for i in range(20):
        state = step(state, torch.tensor(1.0 + (i % 3), dtype=torch.float64))
    assert counter.frame_count == 1


def test_meta_gradient_through_cosine_schedule() -> None:
    """Meta-gradients through 3 SGD steps with a cosine rate match plain torch."""
    init, x, y = _problem()
    base = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    schedule = optim.CosineAnnealingLR(T_max=4, eta_min=0.01)
    params = ParamDict(init).requires_grad_()
    state = schedule.init(base)
    o_state = optim.SGD(lr=0.0).init(params)
    new = params
    for _ in range(3):
        sgd = optim.SGD(lr=state.lr, differentiable=True)
        grads = new.grad(_loss(new, x, y), create_graph=True)
        new, o_state = sgd.step(new, grads, o_state)
        state = schedule.step(state)
    got = torch.autograd.grad(_loss(new, x, y), [base, *params.values()])
    # Reference: plain torch, the rates from the closed form of the cosine.
    ref_base = base.detach().clone().requires_grad_()
    start = {k: v.detach().clone().requires_grad_() for k, v in init.items()}
    p = dict(start)
    for t in range(3):
        lr = 0.01 + (ref_base - 0.01) * (1 + math.cos(math.pi * t / 4)) / 2
        g = torch.autograd.grad(_loss(p, x, y), list(p.values()), create_graph=True)
        p = {k: v - lr * gk for (k, v), gk in zip(p.items(), g, strict=True)}
    expected = torch.autograd.grad(_loss(p, x, y), [ref_base, *start.values()])
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
