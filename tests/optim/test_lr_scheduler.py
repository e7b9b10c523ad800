"""Schedules against `torch.optim.lr_scheduler`: 300 steps, bitwise in float64."""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as tls

from paramdict import optim

_loose: Any = optim  # untyped view of the API, to pass bad arguments
STEPS = 300
Builder = Callable[[torch.optim.Optimizer], Any]


def _torch_lrs(
    make: Builder, *, lr: float, betas: bool = False
) -> tuple[list[float], list[float]]:
    param = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    if betas:
        opt: torch.optim.Optimizer = torch.optim.Adam([param], lr=lr)
    else:
        opt = torch.optim.SGD([param], lr=lr, momentum=0.9)
    sched = make(opt)
    key = "betas" if betas else "momentum"

    def momentum() -> float:
        value = opt.param_groups[0][key]
        return float(value[0] if betas else value)

    lrs, moms = [sched.get_last_lr()[0]], [momentum()]
    for _ in range(STEPS):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
        moms.append(momentum())
    return lrs, moms


def _ours(schedule: optim.LRSchedule, lr: float) -> tuple[list[float], list[float]]:
    state = schedule.init(lr)
    states = [state]
    for _ in range(STEPS):
        state = schedule.step(state)
        states.append(state)
    for s in states:
        assert s.lr.dtype == torch.float64
        assert s.lr.dim() == 0
    moms = [float(s.momentum) if s.momentum is not None else math.nan for s in states]
    return [float(s.lr) for s in states], moms


def _same(ours: list[float], theirs: list[float]) -> None:
    diffs = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    assert not diffs, (
        f"first mismatch at step {diffs[0]}: {ours[diffs[0]]!r} vs {theirs[diffs[0]]!r}"
    )


def _lambda_a(e: Any) -> Any:
    return 0.95**e


def _lambda_b(e: Any) -> Any:
    return 1.0 / (e + 1)


def _lambda_c(e: Any) -> Any:
    return 0.99 if e % 3 else 1.01


def _lambda_d(e: Any) -> Any:
    return 0.999


CASES: list[tuple[str, optim.LRSchedule, Builder, float]] = [
    (
        "lambda-pow",
        optim.LambdaLR(lr_lambda=_lambda_a),
        lambda o: tls.LambdaLR(o, _lambda_a),
        0.1,
    ),
    (
        "lambda-inv",
        optim.LambdaLR(lr_lambda=_lambda_b),
        lambda o: tls.LambdaLR(o, _lambda_b),
        0.3,
    ),
    (
        "mult-const",
        optim.MultiplicativeLR(lr_lambda=_lambda_d),
        lambda o: tls.MultiplicativeLR(o, _lambda_d),
        0.1,
    ),
    (
        "mult-branch",
        optim.MultiplicativeLR(lr_lambda=_lambda_c),
        lambda o: tls.MultiplicativeLR(o, _lambda_c),
        0.07,
    ),
    ("step-30", optim.StepLR(step_size=30), lambda o: tls.StepLR(o, 30), 0.1),
    (
        "step-7",
        optim.StepLR(step_size=7, gamma=0.9),
        lambda o: tls.StepLR(o, 7, gamma=0.9),
        0.3,
    ),
    (
        "step-1",
        optim.StepLR(step_size=1, gamma=0.97),
        lambda o: tls.StepLR(o, 1, gamma=0.97),
        1.0,
    ),
    (
        "multistep",
        optim.MultiStepLR(milestones=[30, 80, 200]),
        lambda o: tls.MultiStepLR(o, [30, 80, 200]),
        0.1,
    ),
    (
        "multistep-repeat",
        optim.MultiStepLR(milestones=[50, 5, 50, 299], gamma=0.7),
        lambda o: tls.MultiStepLR(o, [50, 5, 50, 299], gamma=0.7),
        0.3,
    ),
    ("constant", optim.ConstantLR(), lambda o: tls.ConstantLR(o), 0.1),
    (
        "constant-3",
        optim.ConstantLR(factor=0.3, total_iters=17),
        lambda o: tls.ConstantLR(o, factor=0.3, total_iters=17),
        0.7,
    ),
    ("linear", optim.LinearLR(), lambda o: tls.LinearLR(o), 0.1),
    (
        "linear-down",
        optim.LinearLR(start_factor=1.0, end_factor=0.01, total_iters=250),
        lambda o: tls.LinearLR(o, 1.0, 0.01, 250),
        0.3,
    ),
    (
        "linear-up",
        optim.LinearLR(start_factor=0.001, total_iters=123),
        lambda o: tls.LinearLR(o, 0.001, total_iters=123),
        0.05,
    ),
    (
        "exponential",
        optim.ExponentialLR(gamma=0.99),
        lambda o: tls.ExponentialLR(o, 0.99),
        0.1,
    ),
    (
        "exponential-up",
        optim.ExponentialLR(gamma=1.003),
        lambda o: tls.ExponentialLR(o, 1.003),
        0.01,
    ),
    ("poly", optim.PolynomialLR(), lambda o: tls.PolynomialLR(o), 0.1),
    (
        "poly-2",
        optim.PolynomialLR(total_iters=200, power=2.0),
        lambda o: tls.PolynomialLR(o, 200, 2.0),
        0.3,
    ),
    (
        "poly-3",
        optim.PolynomialLR(total_iters=290, power=3.0),
        lambda o: tls.PolynomialLR(o, 290, 3.0),
        0.3,
    ),
    (
        "poly-0.9",
        optim.PolynomialLR(total_iters=299, power=0.9),
        lambda o: tls.PolynomialLR(o, 299, 0.9),
        0.02,
    ),
    (
        "cosine-10",
        optim.CosineAnnealingLR(T_max=10),
        lambda o: tls.CosineAnnealingLR(o, 10),
        0.1,
    ),
    (
        "cosine-7-eta",
        optim.CosineAnnealingLR(T_max=7, eta_min=0.001),
        lambda o: tls.CosineAnnealingLR(o, 7, 0.001),
        0.1,
    ),
    (
        "cosine-300",
        optim.CosineAnnealingLR(T_max=300, eta_min=1e-5),
        lambda o: tls.CosineAnnealingLR(o, 300, 1e-5),
        0.3,
    ),
    (
        "cosine-50",
        optim.CosineAnnealingLR(T_max=50),
        lambda o: tls.CosineAnnealingLR(o, 50),
        1.0,
    ),
    (
        "warm-10",
        optim.CosineAnnealingWarmRestarts(T_0=10),
        lambda o: tls.CosineAnnealingWarmRestarts(o, 10),
        0.1,
    ),
    (
        "warm-3x2",
        optim.CosineAnnealingWarmRestarts(T_0=3, T_mult=2, eta_min=0.01),
        lambda o: tls.CosineAnnealingWarmRestarts(o, 3, 2, 0.01),
        0.3,
    ),
    (
        "warm-7x3",
        optim.CosineAnnealingWarmRestarts(T_0=7, T_mult=3),
        lambda o: tls.CosineAnnealingWarmRestarts(o, 7, 3),
        0.05,
    ),
    (
        "cyclic",
        optim.CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=20),
        lambda o: tls.CyclicLR(o, 0.01, 0.1, step_size_up=20),
        0.1,
    ),
    (
        "cyclic-tri2",
        optim.CyclicLR(
            base_lr=0.001,
            max_lr=0.3,
            step_size_up=13,
            step_size_down=29,
            mode="triangular2",
        ),
        lambda o: tls.CyclicLR(o, 0.001, 0.3, 13, 29, mode="triangular2"),
        0.1,
    ),
    (
        "cyclic-exp",
        optim.CyclicLR(
            base_lr=0.01,
            max_lr=0.2,
            step_size_up=17,
            mode="exp_range",
            gamma=0.995,
            base_momentum=0.7,
            max_momentum=0.95,
        ),
        lambda o: tls.CyclicLR(
            o,
            0.01,
            0.2,
            17,
            mode="exp_range",
            gamma=0.995,
            base_momentum=0.7,
            max_momentum=0.95,
        ),
        0.1,
    ),
    (
        "cyclic-fn",
        optim.CyclicLR(
            base_lr=0.01,
            max_lr=0.1,
            step_size_up=9,
            scale_fn=_lambda_b,
            scale_mode="iterations",
        ),
        lambda o: tls.CyclicLR(
            o, 0.01, 0.1, 9, scale_fn=_lambda_b, scale_mode="iterations"
        ),
        0.1,
    ),
    (
        "onecycle",
        optim.OneCycleLR(max_lr=0.1, total_steps=300),
        lambda o: tls.OneCycleLR(o, 0.1, total_steps=300),
        0.1,
    ),
    (
        "onecycle-linear",
        optim.OneCycleLR(
            max_lr=0.3,
            epochs=10,
            steps_per_epoch=31,
            pct_start=0.25,
            anneal_strategy="linear",
            div_factor=10.0,
        ),
        lambda o: tls.OneCycleLR(
            o,
            0.3,
            epochs=10,
            steps_per_epoch=31,
            pct_start=0.25,
            anneal_strategy="linear",
            div_factor=10.0,
        ),
        0.1,
    ),
    (
        "onecycle-3phase",
        optim.OneCycleLR(
            max_lr=1.0, total_steps=333, three_phase=True, final_div_factor=100.0
        ),
        lambda o: tls.OneCycleLR(
            o, 1.0, total_steps=333, three_phase=True, final_div_factor=100.0
        ),
        0.1,
    ),
    (
        "sequential",
        optim.SequentialLR(
            schedulers=[
                optim.LinearLR(start_factor=0.1, total_iters=10),
                optim.CosineAnnealingLR(T_max=100),
            ],
            milestones=[10],
        ),
        lambda o: tls.SequentialLR(
            o,
            [tls.LinearLR(o, 0.1, total_iters=10), tls.CosineAnnealingLR(o, 100)],
            [10],
        ),
        0.1,
    ),
    (
        "sequential-3",
        optim.SequentialLR(
            schedulers=[
                optim.ConstantLR(factor=0.5, total_iters=5),
                optim.ExponentialLR(gamma=0.98),
                optim.StepLR(step_size=20, gamma=0.5),
            ],
            milestones=[7, 150],
        ),
        lambda o: tls.SequentialLR(
            o,
            [
                tls.ConstantLR(o, 0.5, 5),
                tls.ExponentialLR(o, 0.98),
                tls.StepLR(o, 20, 0.5),
            ],
            [7, 150],
        ),
        0.3,
    ),
    (
        "sequential-warm",
        optim.SequentialLR(
            schedulers=[
                optim.MultiplicativeLR(lr_lambda=_lambda_d),
                optim.CosineAnnealingWarmRestarts(T_0=11, T_mult=2),
                optim.PolynomialLR(total_iters=50, power=2.0),
            ],
            milestones=[33, 120],
        ),
        lambda o: tls.SequentialLR(
            o,
            [
                tls.MultiplicativeLR(o, _lambda_d),
                tls.CosineAnnealingWarmRestarts(o, 11, 2),
                tls.PolynomialLR(o, 50, 2.0),
            ],
            [33, 120],
        ),
        0.2,
    ),
    (
        "chained",
        optim.ChainedScheduler(
            schedulers=[
                optim.ConstantLR(factor=0.1, total_iters=2),
                optim.ExponentialLR(gamma=0.9),
            ]
        ),
        lambda o: tls.ChainedScheduler(
            [tls.ConstantLR(o, 0.1, 2), tls.ExponentialLR(o, 0.9)]
        ),
        1.0,
    ),
    (
        "chained-3",
        optim.ChainedScheduler(
            schedulers=[
                optim.LinearLR(start_factor=0.2, total_iters=20),
                optim.StepLR(step_size=25, gamma=0.8),
                optim.MultiplicativeLR(lr_lambda=_lambda_c),
            ]
        ),
        lambda o: tls.ChainedScheduler(
            [
                tls.LinearLR(o, 0.2, total_iters=20),
                tls.StepLR(o, 25, 0.8),
                tls.MultiplicativeLR(o, _lambda_c),
            ]
        ),
        0.1,
    ),
]


@pytest.mark.parametrize(
    ("schedule", "make", "lr"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_lrs_equal_torch_bitwise(
    schedule: optim.LRSchedule, make: Builder, lr: float
) -> None:
    """The rates over 300 steps equal torch's `get_last_lr()` exactly."""
    ours, _ = _ours(schedule, lr)
    theirs, _ = _torch_lrs(make, lr=lr)
    _same(ours, theirs)


MOMENTUM_CASES = [c for c in CASES if c[0].startswith(("cyclic", "onecycle"))]


@pytest.mark.parametrize(
    ("schedule", "make", "lr"),
    [c[1:] for c in MOMENTUM_CASES],
    ids=[c[0] for c in MOMENTUM_CASES],
)
@pytest.mark.parametrize("betas", [False, True], ids=["momentum", "beta1"])
def test_cycled_momentum_equals_torch(
    schedule: optim.LRSchedule, make: Builder, lr: float, betas: bool
) -> None:
    """`cycle_momentum` gives torch's momentum (SGD) or first beta (Adam) exactly."""
    _, ours = _ours(schedule, lr)
    _, theirs = _torch_lrs(make, lr=lr, betas=betas)
    _same(ours, theirs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"mode": "max", "patience": 3, "factor": 0.5, "cooldown": 2},
        {"threshold_mode": "abs", "threshold": 0.05, "patience": 2, "min_lr": 1e-3},
        {"mode": "max", "threshold_mode": "abs", "patience": 0, "eps": 1e-3},
    ],
)
def test_plateau_equals_torch(kwargs: dict[str, Any]) -> None:
    """`ReduceLROnPlateau` follows torch's rates for the same metrics exactly."""
    gen = torch.Generator().manual_seed(0)
    metrics = (
        torch.rand(STEPS, generator=gen, dtype=torch.float64)
        + torch.linspace(2, 1, STEPS, dtype=torch.float64)
    ).tolist()
    param = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([param], lr=0.1)
    sched = tls.ReduceLROnPlateau(opt, **kwargs)
    schedule = optim.ReduceLROnPlateau(**kwargs)
    state = schedule.init(0.1)
    for i, metric in enumerate(metrics):
        opt.step()
        sched.step(metric)
        state = schedule.step(
            state, torch.tensor(metric, dtype=torch.float64) if i % 2 else metric
        )
        assert float(state.lr) == sched.get_last_lr()[0]
        assert float(state.best) == sched.best
        assert int(state.num_bad_epochs) == sched.num_bad_epochs
        assert int(state.cooldown_counter) == sched.cooldown_counter


def test_state_round_trips_weights_only() -> None:
    """A nested state saves and loads with `torch.load(weights_only=True)`."""
    schedule = optim.SequentialLR(
        schedulers=[
            optim.CyclicLR(base_lr=0.1, max_lr=1.0, step_size_up=3),
            optim.CosineAnnealingWarmRestarts(T_0=3),
        ],
        milestones=[4],
    )
    state = schedule.step(schedule.init(0.1))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert type(loaded) is optim.ScheduleState
    a, b = schedule.step(loaded), schedule.step(state)
    torch.testing.assert_close(a.lr, b.lr, rtol=0, atol=0)
    plateau = optim.ReduceLROnPlateau().init(0.1)
    buffer = io.BytesIO()
    torch.save(plateau, buffer)
    buffer.seek(0)
    assert type(torch.load(buffer, weights_only=True)) is optim.PlateauState


def test_step_is_pure() -> None:
    """`step` returns a new state and leaves the old one as it was."""
    schedule = optim.CosineAnnealingWarmRestarts(T_0=2)
    state = schedule.init(0.5)
    before = [t.clone() for t in (state.last_epoch, state.lr, *state.counters)]
    schedule.step(state)
    after = [state.last_epoch, state.lr, *state.counters]
    for x, y in zip(before, after, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_tensor_base_is_differentiable() -> None:
    """A base rate that requires grad gets the gradient of the scheduled rate."""
    base = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    schedule = optim.CosineAnnealingLR(T_max=10, eta_min=0.01)
    state = schedule.init(base)
    for _ in range(4):
        state = schedule.step(state)
    (grad,) = torch.autograd.grad(state.lr, base)
    expected = (1 + math.cos(math.pi * 4 / 10)) / 2
    torch.testing.assert_close(grad, torch.tensor(expected, dtype=torch.float64))
    assert torch.isfinite(grad)


def test_cos_matches_math_cos() -> None:
    """The schedules' `cos` is `math.cos` bitwise, at the cosine schedules' points.

    Eager `torch.cos` was one ulp off `math.cos` at `pi * 143 / 7` (64.178) on an
    AVX2 CPU, which is why `cos` exists; whether it is depends on the CPU's kernels,
    so only the equality to the reference is asserted.
    """
    from paramdict.optim._schedules.numbers import cos

    points = [math.pi * k / 7 for k in range(200)]
    points += [math.pi * k / 1000 for k in range(2001)]  # T_max=1000, 2 cycles
    for x in points:
        assert float(cos(torch.tensor(x, dtype=torch.float64))) == math.cos(x), x


def test_onecycle_past_total_steps_raises() -> None:
    """Stepping `OneCycleLR` past `total_steps` raises, as torch does."""
    schedule = optim.OneCycleLR(max_lr=0.1, total_steps=2)
    state = schedule.step(schedule.step(schedule.init(0.1)))
    with pytest.raises(ValueError, match="Tried to step 3 times"):
        schedule.step(state)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (
            lambda: _loose.StepLR(step_size=0),
            ValueError,
            "`step_size` must be at least 1",
        ),
        (lambda: _loose.StepLR(step_size=2.5), TypeError, "`step_size` must be an int"),
        (
            lambda: _loose.StepLR(step_size=2, gamma="x"),
            TypeError,
            "`gamma` must be a number",
        ),
        (
            lambda: _loose.MultiStepLR(milestones=[1.5]),
            TypeError,
            "`milestones` must be a sequence of ints",
        ),
        (
            lambda: _loose.MultiStepLR(milestones=3),
            TypeError,
            "`milestones` must be a sequence of ints",
        ),
        (
            lambda: _loose.ConstantLR(factor=1.5),
            ValueError,
            r"`factor` must be in \[0, 1\]",
        ),
        (
            lambda: _loose.LinearLR(start_factor=0.0),
            ValueError,
            r"`start_factor` must be in \(0, 1\]",
        ),
        (
            lambda: _loose.LinearLR(end_factor=2.0),
            ValueError,
            r"`end_factor` must be in \[0, 1\]",
        ),
        (
            lambda: _loose.LinearLR(total_iters=-1),
            ValueError,
            "`total_iters` must be at least 0",
        ),
        (
            lambda: _loose.LambdaLR(lr_lambda=3),
            TypeError,
            "`lr_lambda` should be a function",
        ),
        (
            lambda: _loose.MultiplicativeLR(lr_lambda=None),
            TypeError,
            "`lr_lambda` should be a function",
        ),
        (
            lambda: _loose.PolynomialLR(total_iters=0),
            ValueError,
            "`total_iters` must be at least 1",
        ),
        (
            lambda: _loose.CosineAnnealingLR(T_max=0),
            ValueError,
            "`T_max` must be at least 1",
        ),
        (
            lambda: _loose.CosineAnnealingWarmRestarts(T_0=0),
            ValueError,
            "positive integer `T_0`",
        ),
        (
            lambda: _loose.CosineAnnealingWarmRestarts(T_0=2, T_mult=0),
            ValueError,
            "`T_mult` >= 1",
        ),
        (
            lambda: _loose.CosineAnnealingWarmRestarts(T_0=2, eta_min="0"),
            ValueError,
            "float or int `eta_min`",
        ),
        (
            lambda: _loose.CyclicLR(base_lr=0.1, max_lr=1.0, mode="up"),
            ValueError,
            "`mode` 'up' is unknown",
        ),
        (
            lambda: _loose.CyclicLR(
                base_lr=0.1, max_lr=1.0, scale_mode="x", scale_fn=_lambda_a
            ),
            ValueError,
            "`scale_mode` must be",
        ),
        (
            lambda: _loose.CyclicLR(base_lr=0.1, max_lr=1.0, step_size_up=0),
            ValueError,
            "`step_size_up` must be at least 1",
        ),
        (lambda: _loose.OneCycleLR(max_lr=0.1), ValueError, "either `total_steps`"),
        (
            lambda: _loose.OneCycleLR(max_lr=0.1, total_steps=0),
            ValueError,
            "positive integer `total_steps`",
        ),
        (
            lambda: _loose.OneCycleLR(max_lr=0.1, epochs=0, steps_per_epoch=3),
            ValueError,
            "positive integer `epochs`",
        ),
        (
            lambda: _loose.OneCycleLR(max_lr=0.1, total_steps=5, pct_start=1),
            ValueError,
            "float between 0 and 1 `pct_start`",
        ),
        (
            lambda: _loose.OneCycleLR(max_lr=0.1, total_steps=5, anneal_strategy="exp"),
            ValueError,
            "`anneal_strategy` must be",
        ),
        (
            lambda: _loose.SequentialLR(schedulers=[], milestones=[]),
            ValueError,
            "at least one schedule",
        ),
        (
            lambda: _loose.SequentialLR(
                schedulers=[_loose.StepLR(step_size=1)], milestones=[3]
            ),
            ValueError,
            "one milestone fewer",
        ),
        (
            lambda: _loose.SequentialLR(
                schedulers=[_loose.ReduceLROnPlateau()], milestones=[]
            ),
            ValueError,
            "moves with a metric .* ReduceLROnPlateau that does at index 0",
        ),
        (
            lambda: _loose.SequentialLR(
                schedulers=[
                    _loose.StepLR(step_size=1),
                    _loose.ChainedScheduler(
                        schedulers=[
                            _loose.StepLR(step_size=1),
                            _loose.ReduceLROnPlateau(),
                        ]
                    ),
                ],
                milestones=[2],
            ),
            ValueError,
            "ChainedScheduler that does at index 1",
        ),
        (
            lambda: _loose.ChainedScheduler(schedulers=["x"]),
            TypeError,
            r"`schedulers\[0\]` is a str",
        ),
        (
            lambda: _loose.ReduceLROnPlateau(factor=1.0),
            ValueError,
            r"`factor` should be < 1.0",
        ),
        (
            lambda: _loose.ReduceLROnPlateau(mode="up"),
            ValueError,
            "`mode` 'up' is unknown",
        ),
        (
            lambda: _loose.ReduceLROnPlateau(threshold_mode="x"),
            ValueError,
            "`threshold_mode` 'x' is unknown",
        ),
        (
            lambda: _loose.ExponentialLR(gamma=0.9).init("0.1"),
            TypeError,
            "`base_lr` must be a number",
        ),
        (
            lambda: _loose.ExponentialLR(gamma=0.9).init(torch.ones(2)),
            ValueError,
            "0-dim floating-point",
        ),
        (
            lambda: _loose.ReduceLROnPlateau().step(
                _loose.ReduceLROnPlateau().init(0.1), torch.ones(2)
            ),
            ValueError,
            "one number",
        ),
        (
            lambda: _loose.ReduceLROnPlateau().step(
                _loose.ReduceLROnPlateau().init(0.1), "1"
            ),
            TypeError,
            "`metrics` must be a number",
        ),
    ],
)
def test_bad_arguments_raise(
    build: Callable[[], object], error: type[Exception], match: str
) -> None:
    """Arguments torch rejects are rejected with the same kind of error."""
    with pytest.raises(error, match=match):
        build()
