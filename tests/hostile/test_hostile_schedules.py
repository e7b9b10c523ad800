"""Hostile input to the schedules: a clear error naming the field, nothing changed.

Base rates the optimizer itself refuses (negative, NaN, infinite), settings no int64
holds, tampered or foreign schedule states (stepped on their own, or inside an
optimizer's state with `step` and `step_`, after a `weights_only=True` reload), and
`OneCycleLR` stepped past `total_steps` are refused; metrics that torch's
`float(metrics)` reads (numpy scalars) are accepted as torch accepts them.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import pytest
import torch
from _unchanged import Case, check, unique_ids

from paramdict import ParamDict, optim

F64 = torch.float64


def _params() -> ParamDict:
    return ParamDict(w=torch.tensor([1.0, -2.0, 3.0]), b=torch.tensor([0.5, 0.25]))


def _grads() -> ParamDict:
    return ParamDict(w=torch.tensor([0.1, 0.2, -0.3]), b=torch.tensor([1.0, -1.0]))


def _reloaded(state: Any) -> Any:
    """Return `state` after a round trip through `torch.save`/`torch.load`."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _unbased() -> dict[str, Callable[..., Any]]:
    """Builders of schedules that take a base rate, by name, given `base_lr=`."""
    return {
        "StepLR": lambda **kw: optim.StepLR(step_size=2, **kw),
        "ExponentialLR": lambda **kw: optim.ExponentialLR(gamma=0.9, **kw),
        "CosineAnnealingLR": lambda **kw: optim.CosineAnnealingLR(T_max=4, **kw),
        "LambdaLR": lambda **kw: optim.LambdaLR(lr_lambda=lambda e: 0.5, **kw),
        "WarmRestarts": lambda **kw: optim.CosineAnnealingWarmRestarts(T_0=2, **kw),
        "SequentialLR": lambda **kw: optim.SequentialLR(
            schedulers=[optim.LinearLR(), optim.ExponentialLR(gamma=0.9)],
            milestones=[2],
            **kw,
        ),
        "ChainedScheduler": lambda **kw: optim.ChainedScheduler(
            schedulers=[optim.ConstantLR(), optim.ExponentialLR(gamma=0.9)], **kw
        ),
        "ReduceLROnPlateau": lambda **kw: optim.ReduceLROnPlateau(**kw),
    }


_BAD_RATES: list[tuple[str, Callable[[], float | torch.Tensor], str]] = [
    ("negative", lambda: -0.1, "-0.1"),
    ("nan", lambda: math.nan, "nan"),
    ("inf", lambda: math.inf, "inf"),
    ("negative-tensor", lambda: torch.tensor(-0.5), "-0.5"),
    ("nan-tensor", lambda: torch.tensor(math.nan, dtype=F64), "nan"),
]


def _built(rate: Callable[[], object]) -> Callable[[], tuple[Any, ...]]:
    return lambda: (rate(),)


def _with_base(make: Callable[..., Any]) -> Callable[[Any], Any]:
    return lambda lr: make(base_lr=lr)


def _with_init(make: Callable[..., Any]) -> Callable[[Any], Any]:
    return lambda lr: make().init(lr)


def _rate_cases() -> list[Case]:
    cases: list[Case] = []
    for rate_id, rate, shown in _BAD_RATES:
        for name, make in _unbased().items():
            cases.append(
                Case(
                    f"{name}-base_lr-{rate_id}",
                    _built(rate),
                    _with_base(make),
                    ValueError,
                    rf"`base_lr` must be finite and at least 0, got {shown}",
                )
            )
            cases.append(
                Case(
                    f"{name}-init-{rate_id}",
                    _built(rate),
                    _with_init(make),
                    ValueError,
                    rf"`base_lr` must be finite and at least 0, got {shown}",
                )
            )
        for field, make_cyclic in [
            ("base_lr", lambda v: optim.CyclicLR(base_lr=v, max_lr=1.0)),
            ("max_lr", lambda v: optim.CyclicLR(base_lr=0.1, max_lr=v)),
            (
                "base_momentum",
                lambda v: optim.CyclicLR(base_lr=0.1, max_lr=1, base_momentum=v),
            ),
            ("max_lr", lambda v: optim.OneCycleLR(max_lr=v, total_steps=4)),
            (
                "max_momentum",
                lambda v: optim.OneCycleLR(max_lr=1.0, total_steps=4, max_momentum=v),
            ),
        ]:
            if isinstance(rate(), torch.Tensor):
                continue  # torch takes these as numbers only
            cases.append(
                Case(
                    f"cyclic-{field}-{rate_id}-{len(cases)}",
                    _built(rate),
                    make_cyclic,
                    ValueError,
                    rf"`{field}` must be finite and at least 0, got {shown}",
                )
            )
    return unique_ids(cases)


@pytest.mark.parametrize("case", [c.param() for c in _rate_cases()])
def test_base_rate_the_optimizer_refuses_is_refused(case: Case) -> None:
    """A negative, NaN or infinite base rate is refused, naming the field."""
    check(case)


def test_scheduled_rate_refused_as_the_optimizer_refuses() -> None:
    """`Adam(lr=StepLR(base_lr=-0.1))` is refused as `Adam(lr=-0.1)` is."""
    with pytest.raises(ValueError, match="lr"):
        optim.Adam(lr=-0.1)
    with pytest.raises(ValueError, match=r"`base_lr` must be finite and at least 0"):
        optim.Adam(lr=optim.StepLR(base_lr=-0.1, step_size=1))


_HUGE = 2**63
_SETTINGS: list[tuple[str, Callable[[int], object]]] = [
    ("step_size", lambda n: optim.StepLR(step_size=n)),
    ("milestones", lambda n: optim.MultiStepLR(milestones=[1, n])),
    ("total_iters", lambda n: optim.ConstantLR(total_iters=n)),
    ("total_iters", lambda n: optim.LinearLR(total_iters=n)),
    ("total_iters", lambda n: optim.PolynomialLR(total_iters=n)),
    ("T_max", lambda n: optim.CosineAnnealingLR(T_max=n)),
    ("T_0", lambda n: optim.CosineAnnealingWarmRestarts(T_0=n)),
    ("T_mult", lambda n: optim.CosineAnnealingWarmRestarts(T_0=2, T_mult=n)),
    ("step_size_up", lambda n: optim.CyclicLR(base_lr=0.1, max_lr=1, step_size_up=n)),
    (
        "step_size_down",
        lambda n: optim.CyclicLR(base_lr=0.1, max_lr=1, step_size_down=n),
    ),
    ("total_steps", lambda n: optim.OneCycleLR(max_lr=1.0, total_steps=n)),
    ("epochs", lambda n: optim.OneCycleLR(max_lr=1.0, epochs=n, steps_per_epoch=2)),
    ("patience", lambda n: optim.ReduceLROnPlateau(patience=n)),
    ("cooldown", lambda n: optim.ReduceLROnPlateau(cooldown=n)),
    (
        "milestones",
        lambda n: optim.SequentialLR(
            schedulers=[optim.ConstantLR(), optim.ConstantLR()], milestones=[n]
        ),
    ),
]


@pytest.mark.parametrize(("field", "make"), _SETTINGS)
def test_integer_settings_above_int64_refused(
    field: str, make: Callable[[int], object]
) -> None:
    """An integer setting above 2**63 - 1 is refused when built, naming it."""
    make(_HUGE - 1)  # the largest int64 is taken
    with pytest.raises(ValueError, match=rf"`{field}(\[\d\])?`.*{_HUGE}"):
        make(_HUGE)


# ---------------------------------------------------------------- tampered states


def _stepped_state(schedule: Any, steps: int = 3) -> Any:
    state = schedule.init(0.1)
    for i in range(steps):
        if isinstance(schedule, optim.ReduceLROnPlateau):
            state = schedule.step(state, 1.0 + i)
        else:
            state = schedule.step(state)
    return state


def _schedules() -> dict[str, Callable[[], Any]]:
    return {
        "StepLR": lambda: optim.StepLR(base_lr=0.1, step_size=2),
        "WarmRestarts": lambda: optim.CosineAnnealingWarmRestarts(base_lr=0.1, T_0=2),
        "SequentialLR": lambda: _unbased()["SequentialLR"](base_lr=0.1),
        "OneCycleLR": lambda: optim.OneCycleLR(max_lr=0.1, total_steps=20),
        "Plateau": lambda: optim.ReduceLROnPlateau(base_lr=0.1),
    }


def _t(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=F64)


# (schedule, path to the field, tampered value, the field's name in the message)
_TAMPERED: list[tuple[str, tuple[Any, ...], Callable[[], Any], str]] = [
    ("StepLR", ("lr",), lambda: _t(-0.1), "lr"),
    ("StepLR", ("lr",), lambda: _t(math.nan), "lr"),
    ("StepLR", ("lr",), lambda: _t(math.inf), "lr"),
    ("StepLR", ("last_epoch",), lambda: _t(-1.0), "last_epoch"),
    ("StepLR", ("last_epoch",), lambda: _t(math.nan), "last_epoch"),
    ("StepLR", ("base_lr",), lambda: _t(-1.0), "base_lr"),
    ("WarmRestarts", ("counters", 0), lambda: _t(math.nan), "counters[0]"),
    ("WarmRestarts", ("counters", 1), lambda: _t(-2.0), "counters[1]"),
    ("SequentialLR", ("children", 1, "lr"), lambda: _t(-1.0), "children[1].lr"),
    (
        "SequentialLR",
        ("children", 0, "last_epoch"),
        lambda: _t(-5.0),
        "children[0].last_epoch",
    ),
    ("OneCycleLR", ("momentum",), lambda: _t(math.nan), "momentum"),
    ("OneCycleLR", ("last_epoch",), lambda: _t(-3.0), "last_epoch"),
    ("Plateau", ("num_bad_epochs",), lambda: _t(-100.0), "num_bad_epochs"),
    ("Plateau", ("cooldown_counter",), lambda: _t(-1.0), "cooldown_counter"),
    ("Plateau", ("best",), lambda: _t(math.nan), "best"),
    ("Plateau", ("lr",), lambda: _t(math.nan), "lr"),
    ("Plateau", ("last_epoch",), lambda: _t(-1.0), "last_epoch"),
]


def _replace(state: Any, path: tuple[Any, ...], value: Any) -> Any:
    head, *rest = path
    if isinstance(head, int):
        items = list(state)
        items[head] = _replace(items[head], tuple(rest), value) if rest else value
        return tuple(items)
    inner = getattr(state, head)
    return state._replace(
        **{head: _replace(inner, tuple(rest), value) if rest else value}
    )


def _tampered_cases() -> list[Case]:
    cases: list[Case] = []
    for i, (name, path, value, field) in enumerate(_TAMPERED):
        make = _schedules()[name]
        match = rf"invalid values in `{re.escape(field)}`"

        def alone(make: Any = make, path: Any = path, value: Any = value) -> Any:
            schedule = make()
            return (schedule, _replace(_stepped_state(schedule), path, value()))

        def step_alone(schedule: Any, state: Any) -> Any:
            if isinstance(schedule, optim.ReduceLROnPlateau):
                return schedule.step(state, 1.0)
            return schedule.step(state)

        cases.append(
            Case(f"{i}-{name}-{field}-alone", alone, step_alone, ValueError, match)
        )
        for method in ("step", "step_"):

            def held(make: Any = make, path: Any = path, value: Any = value) -> Any:
                opt = optim.SGD(lr=make(), momentum=0.9)
                params = _params()
                state = opt.init(params)
                slot = _replace(state.schedule, path, value())
                return (opt, params, _grads(), _reloaded(state._replace(schedule=slot)))

            cases.append(
                Case(
                    f"{i}-{name}-{field}-{method}",
                    held,
                    lambda opt, p, g, s, method=method: getattr(opt, method)(p, g, s),
                    ValueError,
                    "`SGD`'s state holds invalid values in "
                    + re.escape(f"`schedule.{field}`"),
                )
            )
    return unique_ids(cases)


@pytest.mark.parametrize("case", [c.param() for c in _tampered_cases()])
def test_tampered_schedule_state_refused(case: Case) -> None:
    """A tampered schedule state is refused naming the field; nothing changes."""
    check(case)


def test_plateau_metric_on_tampered_state_refused() -> None:
    """`step_schedule` refuses a plateau state with `num_bad_epochs=-100`."""
    opt = optim.SGD(lr=optim.ReduceLROnPlateau(base_lr=0.1))
    state = opt.init(_params())
    slot = cast(Any, state.schedule)._replace(num_bad_epochs=_t(-100.0))
    check(
        Case(
            "step_schedule",
            lambda: (opt, state._replace(schedule=slot)),
            lambda o, s: o.step_schedule(s, 1.0),
            ValueError,
            r"`schedule\.num_bad_epochs`",
        )
    )


_FOREIGN: list[tuple[str, Callable[[], Any], Callable[[], Any], type[Exception]]] = [
    ("StepLR-plateau", _schedules()["StepLR"], _schedules()["Plateau"], ValueError),
    ("plateau-StepLR", _schedules()["Plateau"], _schedules()["StepLR"], ValueError),
    (
        "WarmRestarts-StepLR",
        _schedules()["WarmRestarts"],
        _schedules()["StepLR"],
        ValueError,
    ),
    (
        "SequentialLR-StepLR",
        _schedules()["SequentialLR"],
        _schedules()["StepLR"],
        ValueError,
    ),
    (
        "OneCycleLR-StepLR",
        _schedules()["OneCycleLR"],
        _schedules()["StepLR"],
        ValueError,
    ),
    ("StepLR-tuple", _schedules()["StepLR"], lambda: None, TypeError),
]


@pytest.mark.parametrize(
    ("owner", "other", "error"),
    [pytest.param(a, b, e, id=i) for i, a, b, e in _FOREIGN],
)
def test_state_of_another_schedule_refused(
    owner: Callable[[], Any], other: Callable[[], Any], error: type[Exception]
) -> None:
    """A schedule stepped with another schedule's state says so; nothing changes."""
    schedule = owner()
    source = other()
    foreign = (_t(1.0), _t(2.0)) if source is None else _stepped_state(source)

    def call(state: Any) -> Any:
        if isinstance(schedule, optim.ReduceLROnPlateau):
            return schedule.step(state, 1.0)
        return schedule.step(state)

    check(Case("foreign", lambda: (foreign,), call, error, r"takes a state of this"))


@pytest.mark.parametrize(
    "value",
    [torch.tensor([0.1], dtype=F64), torch.tensor(1), torch.tensor(0.1)],
    ids=["vector", "int64", "float32"],
)
@pytest.mark.parametrize("method", ["step", "step_", "alone"])
def test_schedule_state_of_wrong_kind_refused(value: torch.Tensor, method: str) -> None:
    """A schedule `lr` of the wrong shape or dtype is a TypeError naming it."""
    opt = optim.SGD(lr=optim.StepLR(base_lr=0.1, step_size=2))
    state = opt.init(_params())
    slot = cast(Any, state.schedule)._replace(lr=value.clone())
    if method == "alone":
        if value.dtype == torch.float32:
            return  # a schedule on its own computes in the dtype it is given
        case = Case(
            method,
            lambda: (slot,),
            cast(Any, opt.lr).step,
            TypeError,
            r"The state of this `StepLR` holds values of the wrong kind in `lr`",
        )
    else:
        case = Case(
            method,
            lambda: (_params(), _grads(), state._replace(schedule=slot)),
            getattr(opt, method),
            TypeError,
            r"`SGD`'s state holds .*`schedule\.lr`",
        )
    check(case)


# ---------------------------------------------------------------- OneCycleLR's end


def test_one_cycle_past_total_steps_raises_like_torch() -> None:
    """Stepping past `total_steps` raises at the step torch raises, on its own."""
    w = torch.nn.Parameter(torch.ones(1))
    torch_opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    torch_sched = torch.optim.lr_scheduler.OneCycleLR(torch_opt, 0.1, total_steps=3)
    schedule = optim.OneCycleLR(max_lr=0.1, total_steps=3)
    state = schedule.init()
    for _ in range(3):
        torch_opt.step()
        torch_sched.step()
        state = schedule.step(state)
        assert float(state.lr) == torch_sched.get_last_lr()[0]
    torch_opt.step()
    with pytest.raises(ValueError, match="Tried to step 4 times"):
        torch_sched.step()
    check(
        Case(
            "alone",
            lambda: (state,),
            schedule.step,
            ValueError,
            r"Tried to step 4 times\. The specified number of total steps is 3\.",
        )
    )


@pytest.mark.parametrize("method", ["step", "step_"])
def test_one_cycle_as_lr_past_total_steps_raises(method: str) -> None:
    """An optimizer whose `lr` is a `OneCycleLR` refuses the step past its end."""
    opt = optim.SGD(lr=optim.OneCycleLR(max_lr=0.1, total_steps=3), momentum=0.9)
    params, state = _params(), opt.init(_params())
    for _ in range(3):
        params, state = getattr(opt, method)(params, _grads(), state)
    check(
        Case(
            method,
            lambda: (params, _grads(), state),
            getattr(opt, method),
            ValueError,
            r"Tried to step 4 times.*`total_steps`",
        )
    )


# ---------------------------------------------------------------- metrics


@pytest.mark.parametrize(
    "make",
    [np.float64, np.float32, np.int64, np.float16, lambda v: np.array(v)],
    ids=["float64", "float32", "int64", "float16", "0-dim array"],
)
def test_plateau_reads_numpy_metrics_as_torch(make: Callable[[float], Any]) -> None:
    """`ReduceLROnPlateau` takes numpy scalars as torch's `float(metrics)` does."""
    w = torch.nn.Parameter(torch.ones(1))
    torch_opt = torch.optim.SGD([w], lr=1.0)
    torch_sched = torch.optim.lr_scheduler.ReduceLROnPlateau(torch_opt, patience=1)
    schedule = optim.ReduceLROnPlateau(base_lr=1.0, patience=1)
    state = schedule.init()
    for metric in (3.0, 2.0, 2.0, 2.0, 5.0, 1.0, 1.0, 1.0):
        torch_sched.step(make(metric))
        state = schedule.step(state, make(metric))
        assert float(state.lr) == torch_opt.param_groups[0]["lr"]
        assert float(state.best) == torch_sched.best
        assert float(state.num_bad_epochs) == torch_sched.num_bad_epochs


@pytest.mark.parametrize(
    ("metric", "error", "match"),
    [
        (np.array([1.0, 2.0]), ValueError, r"`metrics` must be one number"),
        (object(), TypeError, r"`metrics` must be a number, got object"),
        (None, TypeError, r"`metrics` must be a number, got NoneType"),
        (torch.ones(2), ValueError, r"`metrics` must be one number"),
    ],
    ids=["array", "object", "none", "tensor"],
)
def test_plateau_refuses_metrics_float_cannot_read(
    metric: object, error: type[Exception], match: str
) -> None:
    """A metric that is not one number is refused; the state is unchanged."""
    schedule = optim.ReduceLROnPlateau(base_lr=1.0)
    check(
        Case(
            "metric",
            lambda: (schedule.init(),),
            lambda s: schedule.step(s, cast(Any, metric)),
            error,
            match,
        )
    )
