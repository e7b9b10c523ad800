"""Hand-built states that `init` would never make: refused by name, nothing written.

A state can be built by hand, edited, or saved for other parameters: a matrix
rule handed entries that are not matrices or have no elements, a moment buffer
replaced by a 0-dim tensor (which would broadcast into every element), a
schedule state whose base rate is `None`. Each is refused when the optimizer is
bound (by `bind`, `step` or `step_`), before anything is written, and the same
holds for the checkpoints such a state would come from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import pytest
import torch
from _unchanged import Case, check, unique_ids
from torch import nn

from paramdict import ParamDict, optim


def _f64(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64)


def _call(method: str) -> Callable[..., Any]:
    """Return a call of `method` (`bind`, `step`, `step_`) on its operands."""

    def call(opt: Any, params: ParamDict, grads: ParamDict, state: Any) -> Any:
        if method == "bind":
            return opt.bind(params, state)
        return getattr(opt, method)(params, grads, state)

    return call


_HAND_BUILT: list[tuple[str, Callable[[], tuple[Any, ...]], str]] = [
    (
        "muon-3x0",
        lambda: (
            optim.Muon(lr=0.1),
            ParamDict(v=torch.ones(2, 2), w=torch.zeros(3, 0)),
            optim.MuonState(
                _f64(0), ParamDict(v=torch.ones(2, 2), w=torch.zeros(3, 0))
            ),
        ),
        r"Muon cannot orthogonalize empty matrices; \['w'\]",
    ),
    (
        "muon-vector",
        lambda: (
            optim.Muon(lr=0.1),
            ParamDict(v=torch.ones(2, 2), w=torch.ones(3)),
            optim.MuonState(_f64(2), ParamDict(v=torch.ones(2, 2), w=torch.ones(3))),
        ),
        r"Muon updates 2-D entries \(matrices\) only; \['w'\] are not 2-D",
    ),
    (
        "muon-3-dim",
        lambda: (
            optim.Muon(lr=0.1),
            ParamDict(w=torch.ones(2, 2, 2)),
            optim.MuonState(_f64(0), ParamDict(w=torch.ones(2, 2, 2))),
        ),
        r"\['w'\] are not 2-D \('w': \(2, 2, 2\)\)",
    ),
    (
        "muon-flat-buffer",
        lambda: (
            optim.Muon(lr=0.1),
            ParamDict(w=torch.ones(3, 2)),
            optim.MuonState(_f64(0), ParamDict(w=torch.ones(6))),
        ),
        r"`momentum_buffer` must match the parameters entry by entry.*\['w'\]",
    ),
    (
        "adafactor-0x3",
        lambda: (
            optim.Adafactor(lr=0.1),
            ParamDict(b=torch.ones(3), w=torch.zeros(0, 3)),
            optim.AdafactorState(
                _f64(0),
                ParamDict(w=torch.zeros(0, 1)),
                ParamDict(w=torch.zeros(1, 3)),
                ParamDict(b=torch.zeros(3)),
            ),
        ),
        r"`Adafactor` cannot update entries without elements; \['w'\]",
    ),
]


def _hand_built_cases() -> list[Case]:
    cases = []
    for name, make, match in _HAND_BUILT:
        for method in ("bind", "step", "step_"):

            def build(make: Any = make) -> tuple[Any, ...]:
                opt, params, state = make()
                return opt, params, params.ones_like(), state

            cases.append(
                Case(f"{name}-{method}", build, _call(method), ValueError, match)
            )
    return unique_ids(cases)


@pytest.mark.parametrize("case", [c.param() for c in _hand_built_cases()])
def test_matrix_rules_refuse_hand_built_states(case: Case) -> None:
    """Muon and Adafactor refuse entries they cannot update at bind time, unwritten."""
    check(case)


_ZERO_DIM: list[tuple[str, Callable[[], optim.Optimizer[Any]], str]] = [
    ("adam-foreach", lambda: optim.Adam(lr=0.1, fused=False), "exp_avg"),
    ("adam-fused", lambda: optim.Adam(lr=0.1), "exp_avg_sq"),
    ("sgd", lambda: optim.SGD(lr=0.1, momentum=0.9), "momentum_buffer"),
    ("nadam", lambda: optim.NAdam(lr=0.1), "exp_avg"),
    ("asgd", lambda: optim.ASGD(lr=0.1), "ax"),
    ("rmsprop", lambda: optim.RMSprop(lr=0.1, momentum=0.9), "momentum_buffer"),
    ("adagrad", lambda: optim.Adagrad(lr=0.1), "sum"),
]


def _zero_dim_cases() -> list[Case]:
    cases = []
    for name, make, field in _ZERO_DIM:
        for method in ("bind", "step", "step_"):

            def build(make: Any = make, field: str = field) -> tuple[Any, ...]:
                opt = make()
                params = ParamDict(w=torch.ones(2, 3), b=torch.ones(3))
                state = opt.init(params)
                buffer = getattr(state, field)
                bad = ParamDict(dict(buffer) | {"w": torch.tensor(0.5)})
                return opt, params, params.ones_like(), state._replace(**{field: bad})

            match = rf"`{field}` must match the parameters.*\['w'\]"
            cases.append(
                Case(f"{name}-{method}", build, _call(method), ValueError, match)
            )
    return unique_ids(cases)


@pytest.mark.parametrize("case", [c.param() for c in _zero_dim_cases()])
def test_zero_dim_moment_buffer_is_refused(case: Case) -> None:
    """A 0-dim tensor where a moment buffer entry was is refused, not broadcast."""
    check(case)


_TORCH: dict[str, tuple[Callable[..., torch.optim.Optimizer], Any, str]] = {
    "adam-foreach": (
        lambda p: torch.optim.Adam(p, lr=0.1, foreach=True),
        lambda: optim.Adam(lr=0.1, fused=False),
        "exp_avg",
    ),
    "sgd": (
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        lambda: optim.SGD(lr=0.1, momentum=0.9),
        "momentum_buffer",
    ),
    "nadam": (
        lambda p: torch.optim.NAdam(p, lr=0.1),
        lambda: optim.NAdam(lr=0.1),
        "exp_avg",
    ),
    "asgd": (lambda p: torch.optim.ASGD(p, lr=0.1), lambda: optim.ASGD(lr=0.1), "ax"),
}


@pytest.mark.parametrize("name", list(_TORCH))
def test_zero_dim_buffer_in_a_checkpoint_is_refused(name: str) -> None:
    """A torch checkpoint whose buffer became 0-dim is refused by name, unwritten."""
    make_torch, make_ours, field = _TORCH[name]

    def build() -> tuple[Any, ...]:
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        theirs = make_torch(list(model.parameters()))
        model(torch.ones(4, 3)).sum().backward()
        theirs.step()
        saved = theirs.state_dict()
        saved["state"][0][field] = torch.tensor(0.5)
        return saved, ParamDict.from_module(model).detach()

    def call(saved: Any, params: ParamDict) -> Any:
        return optim.load_torch_state_dict(
            make_ours(), saved, params, [["weight", "bias"]]
        )

    match = rf"`{field}` of 'weight' has shape \(\) and paramdict's \(2, 3\)"
    check(Case(name, build, call, ValueError, match))


def _scheduled() -> tuple[Any, ...]:
    opt = optim.SGD(lr=optim.StepLR(base_lr=0.1, step_size=2), momentum=0.9)
    params = ParamDict(w=torch.ones(2, 3), b=torch.ones(3))
    state = opt.init(params)
    slot: Any = state.schedule  # a ScheduleState, tampered with on purpose
    bad = state._replace(schedule=slot._replace(base_lr=None))
    return opt, params, params.ones_like(), bad


@pytest.mark.parametrize("method", ["bind", "step", "step_"])
def test_schedule_state_without_base_rate_is_refused(method: str) -> None:
    """A schedule state whose `base_lr` is None is refused by name, unwritten."""
    match = r"wrong kind in `schedule\.base_lr`"
    check(Case(method, _scheduled, _call(method), TypeError, match))


def test_schedule_step_refuses_a_state_without_base_rate() -> None:
    """`schedule.step` refuses a state whose `base_lr` is None, naming it."""
    schedule = optim.StepLR(base_lr=0.1, step_size=2)

    def build() -> tuple[Any, ...]:
        first: Any = schedule.init()  # tampered with on purpose
        return (first._replace(base_lr=None),)

    check(Case("step", build, schedule.step, TypeError, r"wrong kind in `base_lr`"))


@pytest.mark.parametrize(
    ("make", "value"),
    [
        (lambda g: optim.ExponentialLR(base_lr=0.1, gamma=g), -0.5),
        (lambda g: optim.ExponentialLR(base_lr=0.1, gamma=g), float("nan")),
        (lambda g: optim.StepLR(base_lr=0.1, step_size=2, gamma=g), -0.1),
        (lambda g: optim.MultiStepLR(base_lr=0.1, milestones=[1], gamma=g), 1e400),
    ],
    ids=["exponential-negative", "exponential-nan", "step-negative", "multi-step-inf"],
)
def test_negative_or_non_finite_gamma_is_refused(
    make: Callable[[float], Any], value: float
) -> None:
    """A decay factor below 0 or not finite is refused when the schedule is built.

    torch takes it: a negative `gamma` makes every other rate negative, which a
    schedule state refuses once it holds one (and an optimizer would step uphill).
    """
    with pytest.raises(ValueError, match=r"`gamma` must be a finite number at least 0"):
        make(value)


@pytest.mark.parametrize(
    ("metric", "error", "match"),
    [
        (lambda: torch.tensor(1.0, device="meta"), ValueError, "on the meta device"),
        (lambda: torch.tensor(1.0 + 1j), TypeError, "complex"),
        (lambda: "low", TypeError, "must be a number, got str"),
    ],
    ids=["meta", "complex", "string"],
)
def test_plateau_metric_without_a_real_value_is_refused(
    metric: Callable[[], Any], error: type[Exception], match: str
) -> None:
    """A metric on the meta device, complex or not a number is refused by name."""
    opt = optim.SGD(lr=optim.ReduceLROnPlateau(base_lr=0.1), momentum=0.9)

    def build() -> tuple[Any, ...]:
        return opt.init(ParamDict(w=torch.ones(2))), metric()

    check(
        Case("step_schedule", build, opt.step_schedule, error, rf"`metrics`.*{match}")
    )


_AVERAGES: list[tuple[str, Callable[[Any], tuple[Any, Any]], type[Exception], str]] = [
    (
        "values-meta",
        lambda s: (s, {"w": torch.empty(2, 3, device="meta"), "b": torch.ones(3)}),
        ValueError,
        r"meta device hold no data to average: \['w'\]",
    ),
    (
        "values-none",
        lambda s: (s, {"w": None, "b": torch.ones(3)}),
        TypeError,
        r"dense tensors; \['w'\] are not \('w': NoneType\)",
    ),
    (
        "values-numbers",
        lambda s: (s, {"w": torch.ones(2, 3), "b": 1.0}),
        TypeError,
        r"\['b'\] are not \('b': float\)",
    ),
    (
        "values-sparse",
        lambda s: (s, {"w": torch.ones(2, 3).to_sparse(), "b": torch.ones(3)}),
        TypeError,
        r"dense tensors; \['w'\]",
    ),
    (
        "count-meta",
        lambda s: (
            s._replace(n_averaged=torch.zeros((), dtype=torch.long, device="meta")),
            {"w": torch.ones(2, 3), "b": torch.ones(3)},
        ),
        ValueError,
        r"`n_averaged` is on the meta device",
    ),
    (
        "averaged-a-dict",
        lambda s: (
            s._replace(averaged=dict(s.averaged)),
            {"w": torch.ones(2, 3), "b": torch.ones(3)},
        ),
        TypeError,
        r"The state's `averaged` must be a ParamDict, got dict",
    ),
    (
        "state-a-dict",
        lambda s: (s._asdict(), {"w": torch.ones(2, 3), "b": torch.ones(3)}),
        TypeError,
        r"`state` must be an AveragedState, got dict",
    ),
]


@pytest.mark.parametrize("kind", ["ema", "swa"])
@pytest.mark.parametrize(
    ("name", "edit", "error", "match"), _AVERAGES, ids=[a[0] for a in _AVERAGES]
)
def test_weight_average_refuses_values_without_data(
    kind: Literal["ema", "swa"],
    name: str,
    edit: Callable[[Any], tuple[Any, Any]],
    error: type[Exception],
    match: str,
) -> None:
    """`WeightAverage.update` refuses values or states it cannot average, unchanged."""
    average = optim.WeightAverage(kind=kind, decay=0.5)

    def build() -> tuple[Any, ...]:
        state = average.init(ParamDict(w=torch.zeros(2, 3), b=torch.zeros(3)))
        return edit(
            average.update(state, ParamDict(w=torch.ones(2, 3), b=torch.ones(3)))
        )

    check(Case(name, build, average.update, error, match))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_sgd_refuses_a_dampening_that_is_not_finite(value: float) -> None:
    """`SGD(dampening=nan)` (or infinite) is refused when built, naming it."""
    with pytest.raises(ValueError, match=r"`dampening` must be finite"):
        optim.SGD(lr=0.1, momentum=0.9, dampening=value)


def test_param_groups_refuses_a_list() -> None:
    """`ParamGroups([...])` is refused with the mapping form to write instead."""
    pairs: Any = [("*.bias", optim.SGD(lr=0.1))]
    with pytest.raises(TypeError, match=r"`groups` must be a mapping.*got list"):
        optim.ParamGroups(pairs, default=optim.SGD(lr=0.01))
