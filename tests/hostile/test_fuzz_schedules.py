"""Fuzzing the schedules, `ReduceLROnPlateau` and `WeightAverage`.

Each schedule's constructor meets hostile options (accepted where torch's
scheduler accepts them, else refused by name); `step` meets hostile states (each
field of `ScheduleState`, the state as a dict, another kind of state) and epochs,
and an accepted step gives the rate torch's scheduler gives, exactly;
`ReduceLROnPlateau.step` meets hostile metrics and plateau states;
`load_torch_scheduler_state_dict` meets torch's own state dicts with one entry
made hostile, and what it loads steps on as torch's scheduler does after
`load_state_dict`. `WeightAverage`'s constructor, `init` and `update` meet hostile
values and states, and `update` gives torch's averaging formula (see `fuzz.py`
for what every refusal must be).
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from _optim_fuzz import constructor_args, replaced
from fuzz import (
    FUZZ,
    OMIT,
    Arg,
    Built,
    Entry,
    Value,
    base,
    check_entry,
    constant,
    paramdict_values,
    self_values,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.optim import lr_scheduler

from paramdict import optim

F64 = torch.float64
LR = 0.1


@dataclass(frozen=True)
class Schedule:
    """A schedule: its class, options, and torch's scheduler built alike."""

    name: str
    cls: type[Any]
    options: dict[str, Any]
    theirs: Callable[[torch.optim.Optimizer], Any]

    def make(self) -> Any:
        """Return the configured schedule."""
        return self.cls(**self.options)


def _sgd() -> torch.optim.SGD:
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)


SCHEDULES = [
    Schedule(
        "StepLR",
        optim.StepLR,
        {"step_size": 1, "gamma": 0.5},
        lambda o: lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
    ),
    Schedule(
        "MultiStepLR",
        optim.MultiStepLR,
        {"milestones": (1, 3), "gamma": 0.5},
        lambda o: lr_scheduler.MultiStepLR(o, milestones=[1, 3], gamma=0.5),
    ),
    Schedule(
        "ExponentialLR",
        optim.ExponentialLR,
        {"gamma": 0.9},
        lambda o: lr_scheduler.ExponentialLR(o, gamma=0.9),
    ),
    Schedule(
        "CosineAnnealingLR",
        optim.CosineAnnealingLR,
        {"T_max": 4, "eta_min": 0.01},
        lambda o: lr_scheduler.CosineAnnealingLR(o, T_max=4, eta_min=0.01),
    ),
    Schedule(
        "LinearLR",
        optim.LinearLR,
        {"start_factor": 0.5, "total_iters": 3},
        lambda o: lr_scheduler.LinearLR(o, start_factor=0.5, total_iters=3),
    ),
    Schedule(
        "ConstantLR",
        optim.ConstantLR,
        {"factor": 0.5, "total_iters": 1},
        lambda o: lr_scheduler.ConstantLR(o, factor=0.5, total_iters=1),
    ),
    Schedule(
        "PolynomialLR",
        optim.PolynomialLR,
        {"total_iters": 4, "power": 2.0},
        lambda o: lr_scheduler.PolynomialLR(o, total_iters=4, power=2.0),
    ),
    Schedule(
        "OneCycleLR",
        optim.OneCycleLR,
        {"max_lr": 1.0, "total_steps": 10},
        lambda o: lr_scheduler.OneCycleLR(o, max_lr=1.0, total_steps=10),
    ),
    Schedule(
        "CyclicLR",
        optim.CyclicLR,
        {"base_lr": 0.05, "max_lr": 0.5, "step_size_up": 2},
        lambda o: lr_scheduler.CyclicLR(o, base_lr=0.05, max_lr=0.5, step_size_up=2),
    ),
    Schedule(
        "CosineAnnealingWarmRestarts",
        optim.CosineAnnealingWarmRestarts,
        {"T_0": 2, "eta_min": 0.01},
        lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=2, eta_min=0.01),
    ),
    Schedule(
        "ChainedScheduler",
        optim.ChainedScheduler,
        {"schedulers": (optim.ConstantLR(), optim.ExponentialLR(gamma=0.9))},
        lambda o: lr_scheduler.ChainedScheduler(
            [lr_scheduler.ConstantLR(o), lr_scheduler.ExponentialLR(o, gamma=0.9)]
        ),
    ),
    Schedule(
        "SequentialLR",
        optim.SequentialLR,
        {
            "schedulers": (
                optim.LinearLR(start_factor=0.5, total_iters=2),
                optim.ExponentialLR(gamma=0.9),
            ),
            "milestones": (1,),
        },
        lambda o: lr_scheduler.SequentialLR(
            o,
            [
                lr_scheduler.LinearLR(o, start_factor=0.5, total_iters=2),
                lr_scheduler.ExponentialLR(o, gamma=0.9),
            ],
            milestones=[1],
        ),
    ),
]


def _constructor(s: Schedule) -> Entry:
    """`Cls(**options)`: accepted where torch's scheduler is, or refused by name."""
    takes = set(inspect.signature(getattr(lr_scheduler, s.name)).parameters)
    given_options = {"base_lr": LR, **s.options}
    if s.name == "CyclicLR":
        given_options = dict(s.options)

    def build(**options: Any) -> None:
        s.cls(**options)

    def reference(**options: Any) -> None:
        mine = {k: v for k, v in options.items() if k in takes}
        mine = {k: list(v) if k == "milestones" else v for k, v in mine.items()}
        getattr(lr_scheduler, s.name)(_sgd(), **mine)

    # (torch's composed schedulers take scheduler objects: `step` compares them.)
    composed = s.name in ("ChainedScheduler", "SequentialLR")
    return Entry(
        f"{s.name}(...)",
        build,
        constructor_args(s.cls, given_options),
        reference=None if composed else reference,
    )


_BAD_NUMBER_TENSORS: tuple[tuple[str, Callable[[], Any]], ...] = (
    ("None", lambda: None),
    ("'0.1'", lambda: "0.1"),
    ("a float", lambda: 0.1),
    ("nan", lambda: torch.tensor(math.nan, dtype=F64)),
    ("-1", lambda: torch.tensor(-1.0, dtype=F64)),
    ("meta", lambda: torch.zeros((), dtype=F64, device="meta")),
    ("a vector", lambda: torch.zeros(2, dtype=F64)),
    ("complex", lambda: torch.zeros((), dtype=torch.complex128)),
    ("int64", lambda: torch.tensor(1)),
    ("sparse", lambda: torch.zeros(2, dtype=F64).to_sparse()),
)


def _called(make: Callable[[], Any]) -> Callable[[Built], Any]:
    return lambda b: make()


def _field_values(
    init: Callable[[Built], Any], fields: tuple[str, ...], *, counts: tuple[str, ...]
) -> list[Value]:
    """A state from `init` with one field replaced by each hostile kind."""
    out: list[Value] = []
    for field in fields:
        for label, make in _BAD_NUMBER_TENSORS:
            if field == "best" and label == "-1":
                continue  # the best metric so far may be any number
            out.append(
                Value(
                    f"{field}={label}",
                    replaced(init, field, _called(make)),
                    (f"`{field}`",),
                )
            )
        if field in counts:
            out.append(
                Value(
                    f"{field}=1.5",
                    replaced(init, field, lambda b: torch.tensor(1.5, dtype=F64)),
                    (f"`{field}`",),
                )
            )
    return out


def _whole_state_values(init: Callable[[Built], Any], other: Any) -> list[Value]:
    return [
        Value("state=None", lambda b: None, ("state",)),
        Value("state=dict", lambda b: init(b)._asdict(), ("state", "dict")),
        Value("state=tuple", lambda b: tuple(init(b)), ("state", "tuple")),
        Value("state=another kind", lambda b: other, ("state", "State")),
    ]


def _schedule_state(s: Schedule) -> Arg:
    def init(b: Built) -> Any:
        return b["schedule"].init(LR)

    hostile = _field_values(
        init, ("last_epoch", "base_lr", "lr"), counts=("last_epoch",)
    )
    hostile += _whole_state_values(init, optim.ReduceLROnPlateau().init(LR))
    if s.name in ("ChainedScheduler", "SequentialLR"):
        hostile.append(
            Value(
                "children=dicts",
                lambda b: init(b)._replace(
                    children=tuple(c._asdict() for c in init(b).children)
                ),
                ("`children`", "children"),
            )
        )
    return Arg("state", (Value("init", init),), tuple(hostile))


def _rate(state: Any) -> dict[str, float]:
    return {"lr": float(state.lr)}


def _schedule_step(s: Schedule) -> Entry:
    """`schedule.step(state[, epoch])`: torch's rate after one step, or a refusal."""

    def call(schedule: Any, state: Any, epoch: Any = OMIT) -> dict[str, float]:
        new = schedule.step(state) if epoch is OMIT else schedule.step(state, epoch)
        return _rate(new)

    def reference(schedule: Any, state: Any, epoch: Any = OMIT) -> dict[str, float]:
        del schedule, state
        o = _sgd()
        theirs = s.theirs(o)
        o.step()
        theirs.step() if epoch is OMIT else theirs.step(epoch)
        return {"lr": o.param_groups[0]["lr"]}

    epochs = Arg(
        "epoch",
        (Value("epoch left out", constant(OMIT)),),
        tuple(
            Value(f"epoch={label}", constant(v), ("epoch",))
            for label, v in (
                ("'1'", "1"),
                ("nan", math.nan),
                ("inf", math.inf),
                ("1j", 1j),
                ("a meta tensor", torch.tensor(1.0, device="meta")),
            )
        ),
    )
    return Entry(
        f"{s.name}.step",
        call,
        (
            Arg("schedule", (Value(s.name, lambda b: s.make()),)),
            _schedule_state(s),
            epochs,
        ),
        reference=reference,
    )


# ---------------------------------------------------------------- the plateau


def _whole(value: Any) -> int:
    """A saved count as torch keeps it: a whole number >= 0, or an error."""
    number = float(value)
    if not (number >= 0 and number == int(number)):
        msg = f"not a count: {number}"
        raise ValueError(msg)
    return int(number)


def _plateau() -> Any:
    return optim.ReduceLROnPlateau(patience=0, factor=0.5)


def _plateau_step() -> Entry:
    def init(b: Built) -> Any:
        return b["schedule"].init(LR)

    def seen(b: Built) -> Any:  # after a first metric: `best` is a number
        return b["schedule"].step(init(b), 2.0)

    fields = ("last_epoch", "lr", "best", "num_bad_epochs", "cooldown_counter")
    counts = ("last_epoch", "num_bad_epochs", "cooldown_counter")
    state = Arg(
        "state",
        (Value("init", init), Value("after one metric", seen)),
        (
            *_field_values(seen, fields, counts=counts),
            *_whole_state_values(seen, optim.StepLR(step_size=1).init(LR)),
        ),
    )
    metrics = Arg(
        "metrics",
        tuple(
            Value(f"metrics={label}", constant(v))
            for label, v in (
                ("1.0", 1.0),
                ("3", 3),
                ("a tensor", torch.tensor(1.0)),
                ("numpy", np.float64(3.0)),
                ("nan", math.nan),
            )
        ),
        tuple(
            Value(f"metrics={label}", constant(v), ("metrics",))
            for label, v in (
                ("None", None),
                ("'1'", "1"),
                ("1j", 1j),
                ("a meta tensor", torch.tensor(1.0, device="meta")),
                ("a vector", torch.ones(2)),
                ("a ParamDict", base()),
            )
        ),
    )

    def call(schedule: Any, state: Any, metrics: Any) -> dict[str, float]:
        return _rate(schedule.step(state, metrics))

    def reference(schedule: Any, state: Any, metrics: Any) -> dict[str, float]:
        del schedule
        o = _sgd()
        theirs = lr_scheduler.ReduceLROnPlateau(o, patience=0, factor=0.5)
        # torch's scheduler, placed where `state` is (its attributes, as its
        # `load_state_dict` sets them): an unreadable field fails here.
        o.param_groups[0]["lr"] = float(state.lr)
        theirs.last_epoch = _whole(state.last_epoch)
        theirs.best = float(state.best)
        theirs.num_bad_epochs = _whole(state.num_bad_epochs)
        theirs.cooldown_counter = _whole(state.cooldown_counter)
        theirs.step(metrics)
        return {"lr": o.param_groups[0]["lr"]}

    return Entry(
        "ReduceLROnPlateau.step",
        call,
        (Arg("schedule", (Value("plateau", lambda b: _plateau()),)), state, metrics),
        reference=reference,
    )


# ---------------------------------------------------------------- torch's state dicts


def _torch_scheduler_dict(s: Schedule, steps: int = 2) -> dict[str, Any]:
    o = _sgd()
    theirs = s.theirs(o)
    for _ in range(steps):
        o.step()
        theirs.step()
    saved: dict[str, Any] = theirs.state_dict()
    return saved


def _load_scheduler(s: Schedule) -> Entry:
    """`load_torch_scheduler_state_dict`, then one step: torch's rate, or a refusal."""

    def good(b: Built) -> dict[str, Any]:
        return _torch_scheduler_dict(s)

    def changed(key: str, value: Any) -> Callable[[Built], Any]:
        def build(b: Built) -> dict[str, Any]:
            sd = good(b)
            if value is _DELETE:
                del sd[key]
            else:
                sd[key] = value
            return sd

        return build

    bad = [
        ("last_epoch", "'three'", "three"),
        ("last_epoch", "nan", math.nan),
        ("last_epoch", "-5", -5),
        ("last_epoch", "None", None),
        ("last_epoch", "1.5", 1.5),
        ("last_epoch", "missing", _DELETE),
        ("base_lrs", "None", None),
        ("base_lrs", "[]", []),
        ("base_lrs", "['x']", ["x"]),
        ("base_lrs", "[nan]", [math.nan]),
        ("base_lrs", "[-1.0]", [-1.0]),
        ("_last_lr", "['x']", ["x"]),
    ]
    hostile = [
        Value(f"{key}={label}", changed(key, value), (f"'{key}'", f"`{key}`", key))
        for key, label, value in bad
    ]
    hostile += [
        Value("state_dict=None", lambda b: None, ("state_dict", "mapping")),
        Value("state_dict=list", lambda b: list(good(b).items()), ("state_dict",)),
    ]

    def call(schedule: Any, sd: Any) -> dict[str, float]:
        loaded = optim.load_torch_scheduler_state_dict(schedule, sd)
        return _rate(schedule.step(loaded))

    def reference(schedule: Any, sd: Any) -> dict[str, float]:
        del schedule
        o = _sgd()
        theirs = s.theirs(o)
        theirs.load_state_dict(copy.deepcopy(sd))
        o.param_groups[0]["lr"] = theirs.get_last_lr()[0]
        o.step()
        theirs.step()
        return {"lr": o.param_groups[0]["lr"]}

    return Entry(
        f"load_torch_scheduler_state_dict[{s.name}]",
        call,
        (
            Arg("schedule", (Value(s.name, lambda b: s.make()),)),
            Arg("state_dict", (Value("torch's", good),), tuple(hostile)),
        ),
        errors=(TypeError, ValueError, KeyError),
        reference=reference,
    )


class _Delete:
    def __repr__(self) -> str:
        return "DELETE"


_DELETE: Any = _Delete()


# ---------------------------------------------------------------- WeightAverage


def _average_constructor() -> Entry:
    def build(**options: Any) -> None:
        optim.WeightAverage(**options)

    return Entry(
        "WeightAverage(...)",
        build,
        constructor_args(optim.WeightAverage, {"kind": "ema", "decay": 0.9}),
    )


def _averages() -> Arg:
    return Arg(
        "average",
        (
            Value("ema", lambda b: optim.WeightAverage(kind="ema", decay=0.9)),
            Value("swa", lambda b: optim.WeightAverage(kind="swa")),
        ),
    )


def _averaged_state() -> Arg:
    def init(b: Built) -> Any:
        return b["average"].init(base())

    def once(b: Built) -> Any:
        return b["average"].update(init(b), base(shift=0.5))

    counts: list[tuple[str, Callable[[], Any]]] = [
        ("None", lambda: None),
        ("'1'", lambda: "1"),
        ("-1", lambda: torch.tensor(-1)),
        ("nan", lambda: torch.tensor(math.nan)),
        ("1.5", lambda: torch.tensor(1.5)),
        ("meta", lambda: torch.zeros((), dtype=torch.long, device="meta")),
        ("a vector", lambda: torch.zeros(2, dtype=torch.long)),
        ("an int", lambda: 1),
    ]
    _, bad_averaged = paramdict_values(
        "averaged", lambda b: once(b).averaged, mapping_ok=False
    )
    hostile = [
        *(
            Value(
                f"n_averaged={label}",
                replaced(once, "n_averaged", _called(make)),
                ("`n_averaged`",),
            )
            for label, make in counts
        ),
        *(
            Value(
                f"averaged: {v.label}",
                replaced(once, "averaged", v.build),
                (*v.blame, "`averaged`"),
            )
            for v in bad_averaged
        ),
        Value("state=None", lambda b: None, ("state",)),
        Value("state=dict", lambda b: once(b)._asdict(), ("state", "dict")),
        Value("state=tuple", lambda b: tuple(once(b)), ("state", "tuple")),
    ]
    return Arg("state", (Value("init", init), Value("after one", once)), tuple(hostile))


def _average_reference(average: Any, state: Any, values: Any) -> dict[str, Tensor]:
    """The averages of `swa_utils.get_ema_avg_fn` and `get_swa_avg_fn`, by hand.

    As `AveragedModel.update_parameters` applies them: the first update copies
    the values into the average's dtype; later ones compute torch's formula on
    the values as given (promoting) and copy the result back.
    """
    n = int(state.n_averaged)
    out = {}
    for k, value in values.items():
        avg = state.averaged[k]
        raw = value.detach()
        v = raw.to(avg.dtype)  # (torch's average holds the model's dtypes)
        floating = avg.is_floating_point() or avg.is_complex()
        if n == 0:
            new = v.clone()
        elif average.kind == "ema" and floating:
            new = avg.lerp(v, 1 - average.decay)
        elif average.kind == "ema":  # integers: torch's formula, promoting
            new = avg * average.decay + raw * (1 - average.decay)
        else:
            new = avg + (raw - avg) / (n + 1)
        out[k] = new.to(avg.dtype)
    return out


def _average_update() -> Entry:
    def call(average: Any, state: Any, values: Any) -> dict[str, Tensor]:
        return dict(average.update(state, values).averaged)

    values_valid, values_hostile = paramdict_values(
        "values", lambda b: base(shift=0.25)
    )
    return Entry(
        "WeightAverage.update",
        call,
        (_averages(), _averaged_state(), Arg("values", values_valid, values_hostile)),
        reference=_average_reference,
    )


def _average_init() -> Entry:
    valid, hostile = self_values(base, grad=lambda: base(requires_grad=True))
    return Entry(
        "WeightAverage.init",
        lambda a, v: a.init(v) and None,
        (_averages(), Arg("values", valid, hostile)),
    )


ENTRIES = {
    "constructor": [_constructor(s) for s in SCHEDULES],
    "step": [_schedule_step(s) for s in SCHEDULES],
    "plateau": [_plateau_step()],
    "load_torch_scheduler_state_dict": [
        _load_scheduler(s)
        for s in SCHEDULES
        if s.name not in ("ChainedScheduler", "SequentialLR")
    ],
    "WeightAverage": [_average_constructor(), _average_init(), _average_update()],
}

SCHEDULE_FUZZ = settings(FUZZ, max_examples=2 * FUZZ.max_examples)


@pytest.mark.parametrize("kind", list(ENTRIES))
@SCHEDULE_FUZZ
@given(data=st.data())
def test_fuzz_schedules(kind: str, data: st.DataObject) -> None:
    """Hostile options, states, metrics and dicts: torch's rate or a clear error."""
    entry = data.draw(st.sampled_from(ENTRIES[kind]), label="entry")
    check_entry(entry, data)
