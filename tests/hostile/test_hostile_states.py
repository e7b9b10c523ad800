"""Hostile optimizer states: tampered or foreign counters are refused, nothing changed.

A checkpoint reloaded with `weights_only=True` can hold any tensor where a counter
was: a negative, fractional or NaN step, another dtype, another device. Every case
steps an optimizer (both `step` and `step_`) with such a state and checks that the
error names the field and that params, grads and state are bit-identical afterwards.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _unchanged import Case, check, unique_ids

from paramdict import ParamDict, optim


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


_STEPS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("negative", lambda: torch.tensor(-1.0, dtype=torch.float64), ValueError, "-1"),
    ("nan", lambda: torch.tensor(math.nan, dtype=torch.float64), ValueError, "nan"),
    ("inf", lambda: torch.tensor(math.inf, dtype=torch.float64), ValueError, "inf"),
    ("fraction", lambda: torch.tensor(1.5, dtype=torch.float64), ValueError, "1.5"),
    ("float32", lambda: torch.tensor(3.0), TypeError, "float32"),
    ("int64", lambda: torch.tensor(3), TypeError, "int64"),
    ("bool", lambda: torch.tensor(True), TypeError, "bool"),
    (
        "meta",
        lambda: torch.zeros((), dtype=torch.float64, device="meta"),
        ValueError,
        "meta",
    ),
    ("vector", lambda: torch.zeros(2, dtype=torch.float64), TypeError, "0-dim"),
    ("int", lambda: 3, TypeError, "0-dim"),
]

_OPTIMIZERS: list[tuple[str, Callable[[], optim.Optimizer[Any]]]] = [
    ("Adam", lambda: optim.Adam(lr=0.1)),
    ("SGD", lambda: optim.SGD(lr=0.1, momentum=0.9)),
    ("RMSprop", lambda: optim.RMSprop(lr=0.1)),
]


def _step_cases() -> list[Case]:
    cases = []
    for opt_name, make in _OPTIMIZERS:
        for step_name, counter, error, value in _STEPS:
            for method in ("step", "step_"):

                def build(make: Any = make, counter: Any = counter) -> Any:
                    opt = make()
                    params = _params()
                    state = _reloaded(opt.init(params))._replace(step=counter())
                    return opt, params, _grads(), state

                def call(opt: Any, p: Any, g: Any, s: Any, m: str = method) -> Any:
                    return getattr(opt, m)(p, g, s)

                cases.append(
                    Case(
                        f"{opt_name}-{step_name}-{method}",
                        build,
                        call,
                        error,
                        rf"`step`(?s:.*){value}",
                    )
                )
    return unique_ids(cases)


@pytest.mark.parametrize("case", [c.param() for c in _step_cases()])
def test_tampered_step_refused(case: Case) -> None:
    """A tampered step counter is refused by name; nothing changes."""
    check(case)


_MINI_STEPS: list[tuple[str, float]] = [("negative", -1.0), ("fraction", 1.5)]


@pytest.mark.parametrize(("name", "value"), _MINI_STEPS)
def test_tampered_mini_step_refused(name: str, value: float) -> None:
    """A negative or fractional `mini_step` is refused by name; nothing changes."""
    opt = optim.MultiSteps(optim.SGD(lr=0.1), every_k=2)

    def build() -> Any:
        params = _params()
        state = opt.init(params)
        bad = state._replace(mini_step=torch.tensor(value, dtype=torch.float64))
        return params, _grads(), bad

    check(Case(name, build, opt.step, ValueError, r"`mini_step`.*whole number"))


def test_multisteps_resumed_with_smaller_every_k_steps() -> None:
    """A state saved with a larger `every_k` steps on the next call, not never."""
    params = _params()
    saved = optim.MultiSteps(optim.SGD(lr=1.0), every_k=8)
    state = saved.init(params)
    for _ in range(5):
        params, state = saved.step(params, _grads(), state)
    assert int(state.mini_step) == 5
    resumed = optim.MultiSteps(optim.SGD(lr=1.0), every_k=4)
    new, state = resumed.step(params, _grads(), _reloaded(state))
    expected = params["w"] - 6 * _grads()["w"] / 4
    torch.testing.assert_close(new["w"], expected)
    assert int(state.mini_step) == 0


@pytest.mark.parametrize("shape", [(3, 0), (0, 3), (0, 0)])
def test_muon_refuses_empty_matrices(shape: tuple[int, int]) -> None:
    """Muon's `init` refuses an empty matrix by key; nothing changes."""
    params = ParamDict(w=torch.ones(2, 2), e=torch.ones(shape))
    check(
        Case(
            str(shape),
            lambda: (params,),
            optim.Muon().init,
            ValueError,
            r"empty matrices; \['e'\]",
        )
    )
