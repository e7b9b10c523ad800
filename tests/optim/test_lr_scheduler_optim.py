"""Schedules as the `lr` of optimizers: torch parity, compile, meta-gradients, state."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _torch_versions import ONE_GRAPH
from optim_cases import TABLE, Case
from torch._dynamo.testing import CompileCounter
from torch.optim import lr_scheduler as tls
from torch.utils import _pytree as pytree

from paramdict import ParamDict, optim

F64 = torch.float64


def _problem() -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    init = {
        "w": torch.randn(3, 4, generator=gen, dtype=F64),
        "b": torch.randn(3, generator=gen, dtype=F64),
    }
    x = torch.randn(32, 4, generator=gen, dtype=F64)
    y = torch.randn(32, 3, generator=gen, dtype=F64)
    return init, x, y


def _loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((x @ p["w"].T + p["b"] - y) ** 2).mean()


Pair = tuple[Callable[[torch.optim.Optimizer], Any], optim.LRSchedule]

# (torch scheduler factory, our schedule); the base rate is the optimizer's lr.
CASES: dict[str, Callable[[float], Pair]] = {
    "cosine": lambda lr: (
        lambda o: tls.CosineAnnealingLR(o, T_max=30, eta_min=0.001),
        optim.CosineAnnealingLR(base_lr=lr, T_max=30, eta_min=0.001),
    ),
    "step": lambda lr: (
        lambda o: tls.StepLR(o, step_size=7, gamma=0.5),
        optim.StepLR(base_lr=lr, step_size=7, gamma=0.5),
    ),
    "warm-restarts": lambda lr: (
        lambda o: tls.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2),
        optim.CosineAnnealingWarmRestarts(base_lr=lr, T_0=5, T_mult=2),
    ),
    "warmup-cosine": lambda lr: (
        lambda o: tls.SequentialLR(
            o,
            [
                tls.LinearLR(o, start_factor=0.1, total_iters=5),
                tls.CosineAnnealingLR(o, T_max=95),
            ],
            milestones=[5],
        ),
        optim.SequentialLR(
            base_lr=lr,
            schedulers=[
                optim.LinearLR(start_factor=0.1, total_iters=5),
                optim.CosineAnnealingLR(T_max=95),
            ],
            milestones=[5],
        ),
    ),
    "one-cycle": lambda lr: (
        lambda o: tls.OneCycleLR(o, max_lr=lr * 5, total_steps=101),
        optim.OneCycleLR(max_lr=lr * 5, total_steps=101),
    ),
    "cyclic": lambda lr: (
        lambda o: tls.CyclicLR(o, base_lr=lr / 10, max_lr=lr, step_size_up=7),
        optim.CyclicLR(base_lr=lr / 10, max_lr=lr, step_size_up=7),
    ),
}

OPTIMIZERS: dict[
    str,
    tuple[
        Callable[..., torch.optim.Optimizer], Callable[..., Any], dict[str, Any], float
    ],
] = {
    "sgd": (torch.optim.SGD, optim.SGD, {"momentum": 0.9, "weight_decay": 0.01}, 0.05),
    "sgd-nesterov": (
        torch.optim.SGD,
        optim.SGD,
        {"momentum": 0.9, "nesterov": True},
        0.05,
    ),
    "adam": (torch.optim.Adam, optim.Adam, {"weight_decay": 0.01}, 0.01),
    "adamw-ams": (torch.optim.AdamW, optim.AdamW, {"amsgrad": True}, 0.01),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_scheduled_optimizer_matches_torch(name: str, case: str) -> None:
    """100 steps with a schedule as `lr` equal torch.optim plus its scheduler (1e-12).

    `CyclicLR` and `OneCycleLR` cycle the momentum (SGD) or the first beta (Adam).
    """
    torch_cls, our_cls, kwargs, lr = OPTIMIZERS[name]
    make_sched, schedule = CASES[case](lr)
    init, x, y = _problem()
    ref = {k: v.clone().requires_grad_() for k, v in init.items()}
    opt = torch_cls(list(ref.values()), lr=lr, **kwargs)
    sched = make_sched(opt)
    ours = our_cls(lr=schedule, **kwargs)
    params = ParamDict(init).requires_grad_()
    state = ours.init(params)
    for _ in range(100):
        opt.zero_grad()
        torch.autograd.backward(_loss(ref, x, y))
        opt.step()
        sched.step()
        params, state = ours.step(params, params.grad(_loss(params, x, y)), state)
    assert isinstance(state.schedule, optim.ScheduleState)
    assert float(state.schedule.lr) == sched.get_last_lr()[0]
    for k in init:
        torch.testing.assert_close(params[k], ref[k].detach(), rtol=1e-12, atol=0)


def _table_rows() -> list[Any]:
    """Return `(case, schedule)` for every row of the optimizer table.

    Each row runs with its rich configuration and two schedules; the rows with a
    momentum or `betas` also with the two that cycle it (torch refuses those
    for the others, as we do).
    """
    rows = []
    for case in TABLE:
        ours, _ = case.classes or (case.ours, case.theirs)
        options = {k: v for k, v in case.rich.items() if k != "lr"}
        config = ours(**options)
        cycles = hasattr(config, "betas") or getattr(config, "momentum", 0) > 0
        schedules = ["step", "warmup-cosine"]
        schedules += ["cyclic", "one-cycle"] if cycles else []
        rows += [
            pytest.param(case, schedule, id=f"{case.name}-{schedule}")
            for schedule in schedules
        ]
    return rows


@pytest.mark.parametrize(("case", "schedule"), _table_rows())
def test_every_optimizer_with_a_schedule_matches_torch(
    case: Case, schedule: str
) -> None:
    """Each table row with a schedule equals torch.optim plus its scheduler (1e-12)."""
    ours_cls, theirs_cls = case.classes or (case.ours, case.theirs)
    lr = case.rich.get("lr", 0.01)
    options = {k: v for k, v in case.rich.items() if k != "lr"}
    make_sched, ours_schedule = CASES[schedule](lr)
    init, x, y = _problem()
    if case.matrices_only:  # Muon: the weight matrix alone, in both
        init = {"w": init["w"]}

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        bias = p.get("b", 0.0)
        return ((x @ p["w"].T + bias - y) ** 2).mean()

    ref = {k: v.clone().requires_grad_() for k, v in init.items()}
    opt = theirs_cls(list(ref.values()), lr=lr, **options)
    sched = make_sched(opt)
    ours = ours_cls(lr=ours_schedule, **options)
    params = ParamDict(init).requires_grad_()
    state = ours.init(params)
    for _ in range(100):
        opt.zero_grad()
        torch.autograd.backward(loss(ref))
        opt.step()
        sched.step()
        params, state = ours.step(params, params.grad(loss(params)), state)
    assert isinstance(state.schedule, optim.ScheduleState)
    assert float(state.schedule.lr) == sched.get_last_lr()[0]
    for k in init:
        torch.testing.assert_close(params[k], ref[k].detach(), rtol=1e-12, atol=0)


def test_plateau_through_step_schedule_matches_torch() -> None:
    """`step_schedule(state, metric)` once per epoch equals torch's plateau (1e-12)."""
    init, x, y = _problem()
    ref = {k: v.clone().requires_grad_() for k, v in init.items()}
    opt = torch.optim.SGD(list(ref.values()), lr=0.5, momentum=0.9)
    sched = tls.ReduceLROnPlateau(opt, patience=1, factor=0.5)
    ours = optim.SGD(
        lr=optim.ReduceLROnPlateau(base_lr=0.5, patience=1, factor=0.5), momentum=0.9
    )
    params = ParamDict(init).requires_grad_()
    state = ours.init(params)
    metrics = [1.0, 0.9, 0.9, 0.9, 0.8, 0.8, 0.8, 0.8, 0.7, 0.7] * 2
    for metric in metrics:
        for _ in range(5):
            opt.zero_grad()
            torch.autograd.backward(_loss(ref, x, y))
            opt.step()
            params, state = ours.step(params, params.grad(_loss(params, x, y)), state)
        sched.step(metric)
        state = ours.step_schedule(state, torch.tensor(metric))
    assert isinstance(state.schedule, optim.PlateauState)
    assert float(state.schedule.lr) == sched.get_last_lr()[0] < 0.5
    for k in init:
        torch.testing.assert_close(params[k], ref[k].detach(), rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "schedule",
    [
        optim.CosineAnnealingLR(base_lr=0.1, T_max=10),
        optim.OneCycleLR(max_lr=0.1, total_steps=60),
        optim.SequentialLR(
            base_lr=0.1,
            schedulers=[optim.LinearLR(total_iters=3), optim.ExponentialLR(gamma=0.9)],
            milestones=[3],
        ),
    ],
    ids=lambda s: type(s).__name__,
)
@ONE_GRAPH
def test_compiled_scheduled_step_compiles_once(schedule: optim.LRSchedule) -> None:
    """A compiled Adam step with a schedule runs 50 steps from one frame, as eager."""
    torch._dynamo.reset()
    counter = CompileCounter()
    opt = optim.Adam(lr=schedule)
    step = torch.compile(opt.step, backend=counter, fullgraph=True)
    init, x, y = _problem()
    compiled = eager = ParamDict(init)
    c_state = e_state = opt.init(compiled)
    grad = torch.func.grad(lambda p: _loss(p, x, y))
    for _ in range(50):
        compiled, c_state = step(compiled, ParamDict(grad(dict(compiled))), c_state)
        eager, e_state = opt.step(eager, ParamDict(grad(dict(eager))), e_state)
    assert counter.frame_count == 1
    for k in init:
        torch.testing.assert_close(compiled[k], eager[k], rtol=1e-12, atol=0)
    assert isinstance(c_state.schedule, optim.ScheduleState)
    assert isinstance(e_state.schedule, optim.ScheduleState)
    torch.testing.assert_close(c_state.schedule.lr, e_state.schedule.lr, rtol=0, atol=0)


def test_meta_gradient_through_scheduled_steps() -> None:
    """Meta-gradients through 3 differentiable SGD steps with a cosine `lr` (1e-9)."""
    init, x, y = _problem()
    base = torch.tensor(0.3, dtype=F64, requires_grad=True)
    opt = optim.SGD(
        lr=optim.CosineAnnealingLR(base_lr=base, T_max=4, eta_min=0.01),
        differentiable=True,
    )
    params = ParamDict(init).requires_grad_()
    state = opt.init(params)
    new = params
    for _ in range(3):
        new, state = opt.step(new, new.grad(_loss(new, x, y), create_graph=True), state)
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


def test_state_with_schedule_round_trips_weights_only() -> None:
    """A state holding schedules (nested, plateau) loads with `weights_only=True`."""
    params = ParamDict.from_module(torch.nn.Linear(3, 2))
    opt: optim.ParamGroups[Any] = optim.ParamGroups(
        {"bias": optim.SGD(lr=optim.ReduceLROnPlateau(base_lr=0.1), momentum=0.9)},
        default=optim.AdamW(
            lr=optim.ChainedScheduler(
                base_lr=0.01,
                schedulers=[
                    optim.ConstantLR(),
                    optim.CosineAnnealingWarmRestarts(T_0=3),
                ],
            )
        ),
    )
    state = opt.init(params)
    params, state = opt.step(params, params.ones_like(), state)
    state = opt.step_schedule(state, 1.0)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert type(loaded[1].schedule) is optim.ScheduleState
    assert type(loaded[0].schedule) is optim.PlateauState
    for a, b in zip(
        pytree.tree_leaves(loaded),
        pytree.tree_leaves(state),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    opt.step(params, params.ones_like(), loaded)  # accepted as this optimizer's


def test_param_groups_step_each_schedule() -> None:
    """Each group's schedule advances once per step with its own base rate."""
    params = ParamDict(a=torch.zeros(2, dtype=F64), b=torch.zeros(2, dtype=F64))
    opt = optim.ParamGroups(
        {"a": optim.SGD(lr=optim.ExponentialLR(base_lr=1.0, gamma=0.5))},
        default=optim.SGD(lr=optim.StepLR(base_lr=0.1, step_size=2, gamma=0.1)),
    )
    state = opt.init(params)
    for _ in range(3):
        params, state = opt.step(params, params.ones_like(), state)
    torch.testing.assert_close(params["a"], torch.full((2,), -1.75, dtype=F64))
    torch.testing.assert_close(params["b"], torch.full((2,), -0.21, dtype=F64))
    for sub_state in state:
        slot = sub_state.schedule
        assert isinstance(slot, optim.ScheduleState)
        assert float(slot.last_epoch) == 3.0


def test_multi_steps_advance_the_schedule_per_applied_step() -> None:
    """Under `MultiSteps` the schedule moves once per applied step, not per call."""
    params = ParamDict(w=torch.zeros(2, dtype=F64))
    inner = optim.SGD(lr=optim.ExponentialLR(base_lr=1.0, gamma=0.5))
    opt = optim.ClipGradNorm(optim.MultiSteps(inner, every_k=4), max_norm=100.0)
    state = opt.init(params)
    for _ in range(8):
        params, state = opt.step(params, params.ones_like(), state)
    schedule = state.inner_state.schedule
    assert isinstance(schedule, optim.ScheduleState)
    assert float(schedule.last_epoch) == 2.0
    torch.testing.assert_close(params["w"], torch.full((2,), -1.5, dtype=F64))


def test_clip_grad_norm_with_schedule_matches_torch() -> None:
    """Clipping in front of a scheduled Adam equals torch's clip, step, schedule."""
    init, x, y = _problem()
    ref = {k: v.clone().requires_grad_() for k, v in init.items()}
    opt = torch.optim.Adam(list(ref.values()), lr=0.01)
    sched = tls.CosineAnnealingLR(opt, T_max=20)
    ours = optim.ClipGradNorm(
        optim.Adam(lr=optim.CosineAnnealingLR(base_lr=0.01, T_max=20)), max_norm=0.5
    )
    params = ParamDict(init).requires_grad_()
    state = ours.init(params)
    for _ in range(30):
        opt.zero_grad()
        torch.autograd.backward(_loss(ref, x, y))
        torch.nn.utils.clip_grad_norm_(list(ref.values()), 0.5)
        opt.step()
        sched.step()
        params, state = ours.step(params, params.grad(_loss(params, x, y)), state)
    for k in init:
        torch.testing.assert_close(params[k], ref[k].detach(), rtol=1e-12, atol=0)


# ---------------------------------------------------------------- hostile inputs


def test_per_key_base_rate_is_refused() -> None:
    """A schedule's base rate cannot be a per-key ParamDict; ParamGroups is named."""
    per_key = ParamDict(w=torch.tensor(0.1))
    with pytest.raises(TypeError, match="ParamGroups"):
        optim.CosineAnnealingLR(base_lr=per_key, T_max=3)  # type: ignore[arg-type]


def test_schedule_without_base_rate_is_refused() -> None:
    """An `lr` schedule needs `base_lr`; the message shows how to give it."""
    with pytest.raises(ValueError, match="base_lr="):
        optim.Adam(lr=optim.CosineAnnealingLR(T_max=3))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda s: optim.Adagrad(lr=s), "has neither"),
        (lambda s: optim.SGD(lr=s), "keeps no momentum buffer"),
        (lambda s: optim.RMSprop(lr=s), "keeps no momentum buffer"),
    ],
)
def test_cycle_momentum_without_momentum_is_refused(
    make: Callable[[optim.LRSchedule], object], match: str
) -> None:
    """`cycle_momentum=True` on an optimizer without a momentum is a ValueError."""
    with pytest.raises(ValueError, match=match):
        make(optim.OneCycleLR(max_lr=0.1, total_steps=10))
    make(optim.OneCycleLR(max_lr=0.1, total_steps=10, cycle_momentum=False))


def test_metric_for_a_non_plateau_schedule_is_refused() -> None:
    """`step_schedule` with a schedule that takes no metric raises; state unchanged."""
    params = ParamDict(w=torch.ones(2))
    opts: list[optim.Optimizer[Any]] = [
        optim.Adam(lr=optim.StepLR(base_lr=0.1, step_size=2)),
        optim.Adam(lr=0.1),
        optim.MultiSteps(optim.SGD(lr=0.1), every_k=2),
    ]
    for opt in opts:
        state = opt.init(params)
        before = pytree.tree_leaves(state)
        with pytest.raises(ValueError, match="takes a metric"):
            opt.step_schedule(state, 1.0)
        after = pytree.tree_leaves(state)
        assert all(a is b for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize(
    ("donor", "match"),
    [
        (optim.Adam(lr=0.1), "got no schedule state"),
        (optim.Adam(lr=optim.ReduceLROnPlateau(base_lr=0.1)), "PlateauState"),
        (
            optim.Adam(
                lr=optim.SequentialLR(
                    base_lr=0.1,
                    schedulers=[optim.LinearLR(), optim.StepLR(step_size=2)],
                    milestones=[3],
                )
            ),
            "another shape",
        ),
    ],
)
def test_state_from_another_schedule_is_refused(donor: optim.Adam, match: str) -> None:
    """A state whose schedule slot is not this optimizer's raises, naming the kind."""
    params = ParamDict(w=torch.ones(2))
    opt = optim.Adam(lr=optim.CosineAnnealingWarmRestarts(base_lr=0.1, T_0=3))
    state = donor.init(params)
    with pytest.raises(ValueError, match=match):
        opt.step(params, params.ones_like(), state)
    assert float(state.step) == 0.0
    with pytest.raises(ValueError, match="not a schedule"):
        optim.Adam(lr=0.1).step(params, params.ones_like(), opt.init(params))


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize(
    ("ours", "theirs", "lr"),
    [
        (optim.AdamW, torch.optim.AdamW, 0.01),
        (optim.Adam, torch.optim.Adam, 0.01),
        (optim.Adagrad, torch.optim.Adagrad, 0.1),
        (optim.SGD, torch.optim.SGD, 0.05),
    ],
    ids=["AdamW", "Adam", "Adagrad", "SGD"],
)
def test_warmup_cosine_runs_fused_bitwise_torch(
    ours: Callable[..., Any],
    theirs: Callable[..., torch.optim.Optimizer],
    lr: float,
    in_place: bool,
) -> None:
    """Warm-up + cosine takes torch's fused kernel: bitwise `fused=True` + LambdaLR."""
    extra = {"momentum": 0.9} if ours is optim.SGD else {}
    warmup, total = 5, 30

    def factor(epoch: Any) -> float:
        e = float(epoch)
        if e < warmup:
            return (e + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (e - warmup) / (total - warmup)))

    init, x, y = _problem()
    tensors = {k: v.clone().requires_grad_() for k, v in init.items()}
    opt_t = theirs(list(tensors.values()), lr=lr, fused=True, **extra)
    sched = tls.LambdaLR(opt_t, factor)
    for _ in range(total):
        opt_t.zero_grad()
        torch.autograd.backward(_loss(tensors, x, y))
        opt_t.step()
        sched.step()

    opt = ours(lr=optim.LambdaLR(base_lr=lr, lr_lambda=factor), **extra)
    params = ParamDict(init).clone()
    state = opt.init(params)
    grad = torch.func.grad(lambda p: _loss(p, x, y))
    for _ in range(total):
        grads = ParamDict(grad(dict(params)))
        step = opt.step_ if in_place else opt.step
        params, state = step(params, grads, state)
    # SGD's `step` runs its rule (no faster on copies): equal to rounding there.
    tol = 1e-12 if ours is optim.SGD and not in_place else 0.0
    for k, t in tensors.items():
        torch.testing.assert_close(params[k], t.detach(), rtol=tol, atol=tol)
    assert float(state.schedule.lr) == sched.get_last_lr()[0]
