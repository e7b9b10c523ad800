"""`as_torch_optimizer`: torch.optim's trajectories, bit for bit, in torch's loop.

Each test trains two copies of one float32 model, one with a paramdict optimizer
behind the adapter and one with torch.optim's class of the same name, in the same
loop (`zero_grad`, `backward`, `step`, a scheduler's `step`), and compares the
parameters bit for bit. The adapter runs torch's fused kernel where its group
shows `fused=True` (compared with torch's `fused=True`) and the foreach rule
otherwise (compared with torch's default, the for-loop on the CPU).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.optim import lr_scheduler as tls

from paramdict import optim

STEPS = 12

# name -> (ours, theirs, options); each also runs with `fused=False` where it has
# a fused kernel (the foreach rule, against torch's default).
OPTIMIZERS: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "Adam": (optim.Adam, torch.optim.Adam, {"lr": 0.01, "weight_decay": 0.1}),
    "AdamW": (optim.AdamW, torch.optim.AdamW, {"lr": 0.01, "amsgrad": True}),
    "SGD momentum": (
        optim.SGD,
        torch.optim.SGD,
        {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
    ),
    "SGD nesterov": (
        optim.SGD,
        torch.optim.SGD,
        {"lr": 0.05, "momentum": 0.9, "nesterov": True},
    ),
    "RMSprop": (
        optim.RMSprop,
        torch.optim.RMSprop,
        {"lr": 0.01, "momentum": 0.5, "centered": True},
    ),
    "Adagrad": (optim.Adagrad, torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01}),
}
FUSABLE = ("Adam", "AdamW", "SGD momentum", "SGD nesterov", "Adagrad")


def _cycles(opt: torch.optim.Optimizer) -> bool:
    return "momentum" in opt.defaults or "betas" in opt.defaults


# Each of torch's schedulers that applies, built on an optimizer; `metric` marks
# the one that steps with a metric.
Make = Callable[[torch.optim.Optimizer], Any]
SCHEDULERS: dict[str, Make] = {
    "LambdaLR": lambda o: tls.LambdaLR(o, lambda e: 0.9**e),
    "MultiplicativeLR": lambda o: tls.MultiplicativeLR(o, lambda e: 0.95),
    "StepLR": lambda o: tls.StepLR(o, step_size=3, gamma=0.5),
    "MultiStepLR": lambda o: tls.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.3),
    "ConstantLR": lambda o: tls.ConstantLR(o, factor=0.5, total_iters=4),
    "LinearLR": lambda o: tls.LinearLR(o, start_factor=0.2, total_iters=6),
    "ExponentialLR": lambda o: tls.ExponentialLR(o, gamma=0.9),
    "SequentialLR": lambda o: tls.SequentialLR(
        o,
        [
            tls.LinearLR(o, start_factor=0.1, total_iters=3),
            tls.CosineAnnealingLR(o, T_max=10),
        ],
        milestones=[3],
    ),
    "PolynomialLR": lambda o: tls.PolynomialLR(o, total_iters=10, power=2.0),
    "CosineAnnealingLR": lambda o: tls.CosineAnnealingLR(o, T_max=7, eta_min=1e-4),
    "ChainedScheduler": lambda o: tls.ChainedScheduler(
        [
            tls.ConstantLR(o, factor=0.5, total_iters=3),
            tls.ExponentialLR(o, gamma=0.9),
        ],
        optimizer=o,
    ),
    "ReduceLROnPlateau": lambda o: tls.ReduceLROnPlateau(o, patience=1, factor=0.5),
    "CyclicLR": lambda o: tls.CyclicLR(
        o, base_lr=0.001, max_lr=0.02, step_size_up=3, cycle_momentum=_cycles(o)
    ),
    "OneCycleLR": lambda o: tls.OneCycleLR(
        o, max_lr=0.02, total_steps=STEPS + 1, cycle_momentum=_cycles(o)
    ),
    "CosineAnnealingWarmRestarts": lambda o: tls.CosineAnnealingWarmRestarts(
        o, T_0=3, T_mult=2
    ),
}


def model(seed: int = 0) -> nn.Sequential:
    """A small float32 MLP."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


def data(step: int) -> tuple[Tensor, Tensor]:
    """The batch of step `step`."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 5, generator=g), torch.randn(16, 3, generator=g)


def pair(
    name: str, *, fused: bool, **extra: Any
) -> tuple[nn.Sequential, optim.TorchAdapter, nn.Sequential, torch.optim.Optimizer]:
    """Twin models: one behind the adapter, one with torch.optim's class."""
    ours, theirs, options = OPTIMIZERS[name]
    options = {**options, **extra}
    flag: dict[str, Any] = {} if fused else {"fused": False}
    if name not in FUSABLE:
        flag = {}
    net, twin = model(), model()
    adapter = optim.as_torch_optimizer(ours(**options, **flag), net)
    torch_flag = {"fused": True} if fused else {}
    reference = theirs(twin.parameters(), **options, **torch_flag)
    assert adapter.param_groups[0].get("fused") is (True if fused else None)
    return net, adapter, twin, reference


def train_step(
    net: nn.Module, opt: torch.optim.Optimizer, step: int, sched: Any = None
) -> Tensor:
    """One step of the loop: zero_grad, backward, step, the scheduler's step."""
    x, y = data(step)
    opt.zero_grad()
    loss = F.mse_loss(net(x), y)
    torch.autograd.backward(loss)
    opt.step()
    if isinstance(sched, tls.ReduceLROnPlateau):
        sched.step(1.0)  # a metric that never improves
    elif sched is not None:
        sched.step()
    return loss.detach()


def assert_same(net: nn.Module, twin: nn.Module) -> None:
    """The two models' parameters are bit for bit equal."""
    for (name, p), q in zip(net.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)


def _paths() -> Iterator[Any]:
    for name in OPTIMIZERS:
        yield pytest.param(name, False, id=f"{name}-foreach")
        if name in FUSABLE:
            yield pytest.param(name, True, id=f"{name}-fused")


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
@pytest.mark.parametrize(("name", "fused"), list(_paths()))
def test_trajectory_under_each_scheduler_equals_torch_bitwise(
    name: str, fused: bool, scheduler: str
) -> None:
    """12 steps with one of torch's schedulers: torch.optim's parameters exactly."""
    net, adapter, twin, reference = pair(name, fused=fused)
    ours, theirs = SCHEDULERS[scheduler](adapter), SCHEDULERS[scheduler](reference)
    for step in range(STEPS):
        train_step(net, adapter, step, ours)
        train_step(twin, reference, step, theirs)
        assert_same(net, twin)
        assert adapter.param_groups[0]["lr"] == reference.param_groups[0]["lr"]


@pytest.mark.parametrize(("name", "fused"), list(_paths()))
def test_grad_scaler_finds_the_grads_and_skips_inf_steps(
    name: str, fused: bool
) -> None:
    """`GradScaler("cpu")` unscales the adapter's grads and skips a step with an inf."""
    net, adapter, twin, reference = pair(name, fused=fused)
    scalers = [
        torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        for _ in range(2)
    ]
    for step in range(8):
        x, y = data(step)
        for module, opt, scaler in (
            (net, adapter, scalers[0]),
            (twin, reference, scalers[1]),
        ):
            opt.zero_grad()
            torch.autograd.backward(scaler.scale(F.mse_loss(module(x), y)))
            if step == 3:  # an overflow: the step is skipped and the scale backs off
                first = next(iter(module.parameters()))
                assert first.grad is not None
                first.grad[0, 0] = float("inf")
            before = [p.detach().clone() for p in module.parameters()]
            scaler.step(opt)
            scaler.update()
            after = list(module.parameters())
            skipped = all(torch.equal(a, b) for a, b in zip(before, after))
            assert skipped is (step == 3)
        assert_same(net, twin)
        assert scalers[0].get_scale() == scalers[1].get_scale()
    counts = {int(s["step"]) for s in adapter.state.values() if "step" in s}
    assert counts <= {7}  # eight calls, one skipped (SGD keeps no count in torch)


@settings(max_examples=15, deadline=None)
@given(
    writes=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "lr": st.floats(0.0, 0.1),
                "weight_decay": st.floats(0.0, 0.2),
                "momentum": st.floats(0.05, 0.95),
                "beta1": st.floats(0.0, 0.95),
                "eps": st.floats(1e-9, 1e-3),
            },
        ),
        min_size=1,
        max_size=6,
    ),
    name=st.sampled_from(list(OPTIMIZERS)),
    fused=st.booleans(),
)
def test_settings_written_between_steps_take_effect_as_in_torch(
    writes: list[dict[str, float]], name: str, fused: bool
) -> None:
    """Any settings written into the group before a step: torch's result, bitwise.

    The rates and the momentum are set on the bound optimizer (no new binding);
    the other settings rebuild it. Either way the next step is torch.optim's.
    """
    fused = fused and name in FUSABLE
    net, adapter, twin, reference = pair(name, fused=fused)
    for step, written in enumerate(writes):
        for opt in (adapter, reference):
            group = opt.param_groups[0]
            for key, value in written.items():
                if key == "beta1":
                    if "betas" in group:
                        group["betas"] = (value, group["betas"][1])
                elif key in group:
                    group[key] = value
        train_step(net, adapter, step)
        train_step(twin, reference, step)
        assert_same(net, twin)


def test_a_written_rate_needs_no_new_binding() -> None:
    """A scheduler's `lr` and cycled betas reach the bound step; nothing rebinds."""
    net, adapter, twin, reference = pair("AdamW", fused=True)
    ours, theirs = (
        SCHEDULERS["OneCycleLR"](adapter),
        SCHEDULERS["OneCycleLR"](reference),
    )
    train_step(net, adapter, 0, ours)
    train_step(twin, reference, 0, theirs)
    member = adapter._groups[0].member  # pyright: ignore[reportPrivateUsage]
    bound = getattr(member, "_last")  # noqa: B009 (a slot the optimizer keeps)
    used: list[tuple[float, tuple[float, float]]] = []
    for step in range(1, 6):
        group = reference.param_groups[0]
        used.append((group["lr"], group["betas"]))
        train_step(net, adapter, step, ours)
        train_step(twin, reference, step, theirs)
    assert adapter._groups[0].member is member  # pyright: ignore[reportPrivateUsage]
    assert getattr(member, "_last") is bound  # noqa: B009
    assert (member.lr, getattr(member, "betas")) == used[-1]  # noqa: B009  # the last step's, as written
    assert len(set(used)) == len(used)  # each step had its own
    assert_same(net, twin)


def test_a_module_with_frozen_parameters_trains_as_torch() -> None:
    """Parameters without a `.grad` are skipped, as torch skips them."""
    net, adapter, twin, reference = pair("Adam", fused=True)
    for module in (net, twin):
        module[0].requires_grad_(False)
    frozen = [p.detach().clone() for p in net[0].parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(4):
            train_step(net, adapter, step)
            train_step(twin, reference, step)
    assert_same(net, twin)
    assert all(torch.equal(a, b) for a, b in zip(frozen, net[0].parameters()))
