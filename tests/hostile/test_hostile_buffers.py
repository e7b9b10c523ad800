"""States from other options: a missing buffer is named with the option needing it.

A state saved by `Adam(amsgrad=False)` has an empty `max_exp_avg_sq`; resumed with
`amsgrad=True` (or an `RMSprop` state resumed with `centered=True` or `momentum>0`,
an `SGD` state with `momentum`) the step is refused before anything is written,
and the error names the buffer, the option that needs it and the fix.
"""

from __future__ import annotations

import io
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


Make = Callable[[], optim.Optimizer[Any]]

# (id, optimizer that saved, optimizer that resumes, buffer, option)
_SWITCHES: list[tuple[str, Make, Make, str, str]] = [
    (
        "Adam-amsgrad",
        lambda: optim.Adam(lr=0.1),
        lambda: optim.Adam(lr=0.1, amsgrad=True),
        "max_exp_avg_sq",
        "amsgrad=True",
    ),
    (
        "AdamW-amsgrad",
        lambda: optim.AdamW(lr=0.1),
        lambda: optim.AdamW(lr=0.1, amsgrad=True),
        "max_exp_avg_sq",
        "amsgrad=True",
    ),
    (
        "RMSprop-centered",
        lambda: optim.RMSprop(lr=0.1),
        lambda: optim.RMSprop(lr=0.1, centered=True),
        "grad_avg",
        "centered=True",
    ),
    (
        "RMSprop-momentum",
        lambda: optim.RMSprop(lr=0.1),
        lambda: optim.RMSprop(lr=0.1, momentum=0.9),
        "momentum_buffer",
        "momentum > 0",
    ),
    (
        "SGD-momentum",
        lambda: optim.SGD(lr=0.1),
        lambda: optim.SGD(lr=0.1, momentum=0.9),
        "momentum_buffer",
        "momentum != 0",
    ),
]

_WRAPPERS: list[tuple[str, Callable[[optim.Optimizer[Any]], optim.Optimizer[Any]]]] = [
    ("plain", lambda opt: opt),
    ("clip", lambda opt: optim.ClipGradNorm(opt, max_norm=1.0)),
    ("groups", lambda opt: optim.ParamGroups({"*": opt})),
]


def _cases() -> list[Case]:
    cases: list[Case] = []
    for name, saver, resumer, buffer, option in _SWITCHES:
        for wrap_name, wrap in _WRAPPERS:
            for method in ("step", "step_"):

                def build(
                    saver: Make = saver, resumer: Make = resumer, wrap: Any = wrap
                ) -> Any:
                    params = _params()
                    state = _reloaded(wrap(saver()).init(params))
                    return wrap(resumer()), params, _grads(), state

                def call(opt: Any, p: Any, g: Any, s: Any, m: str = method) -> Any:
                    return getattr(opt, m)(p, g, s)

                cases.append(
                    Case(
                        f"{name}-{wrap_name}-{method}",
                        build,
                        call,
                        ValueError,
                        rf"`{buffer}` is empty(?s:.*)`{option}` needs it(?s:.*)"
                        rf"`init`(?s:.*)zeros_like",
                    )
                )
    return unique_ids(cases)


@pytest.mark.parametrize("case", [c.param() for c in _cases()])
def test_missing_buffer_named_with_its_option(case: Case) -> None:
    """A buffer the options need but the state lacks is refused; nothing changes."""
    check(case)


def test_state_after_steps_also_refused() -> None:
    """A state that took steps without the buffer is refused the same way."""
    params = _params()
    plain = optim.Adam(lr=0.1)
    state = plain.init(params)
    for _ in range(3):
        params, state = plain.step(params, _grads(), state)
    resumed = optim.Adam(lr=0.1, amsgrad=True)
    check(
        Case(
            "stepped",
            lambda: (params, _grads(), state),
            resumed.step_,
            ValueError,
            r"`max_exp_avg_sq` is empty",
        )
    )


def test_empty_params_need_no_buffer() -> None:
    """Empty parameters step with any state of their own (every buffer is empty)."""
    opt = optim.Adam(amsgrad=True)
    state = optim.Adam().init(ParamDict())
    new, new_state = opt.step(ParamDict(), ParamDict(), state)
    assert not new
    assert new_state is state


def test_sgd_buffer_added_as_the_message_says_matches_torch() -> None:
    """SGD resumed with momentum after the fix the error gives equals torch.optim."""
    start = {"w": torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)}
    grads = [
        {"w": torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64) * k}
        for k in (1, 2, 3)
    ]
    # torch: one step without momentum, then the same parameters with momentum.
    weight = torch.nn.Parameter(start["w"].clone())
    theirs = torch.optim.SGD([weight], lr=0.1)
    weight.grad = grads[0]["w"].clone()
    theirs.step()
    saved = theirs.state_dict()
    saved["param_groups"][0]["momentum"] = 0.9  # resumed with the new option
    theirs = torch.optim.SGD([weight], lr=0.1, momentum=0.9)
    theirs.load_state_dict(saved)
    assert "momentum_buffer" not in theirs.state[weight]
    for g in grads[1:]:
        weight.grad = g["w"].clone()
        theirs.step()
    # ours: the same, adding the buffer as the error says.
    params = ParamDict(start)
    plain = optim.SGD(lr=0.1)
    params, state = plain.step(params, ParamDict(grads[0]), plain.init(params))
    resumed = optim.SGD(lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match=r"`momentum_buffer` is empty"):
        resumed.step(params, ParamDict(grads[1]), state)
    state = state._replace(momentum_buffer=params.zeros_like())
    for g in grads[1:]:
        params, state = resumed.step(params, ParamDict(g), state)
    torch.testing.assert_close(params["w"], weight.detach(), rtol=0, atol=0)


def test_extra_buffer_is_kept_as_torch_keeps_it() -> None:
    """A state with a buffer the options do not use steps (torch.optim ignores it)."""
    params = _params()
    state = optim.Adam(amsgrad=True).init(params)
    new, new_state = optim.Adam(lr=0.1).step(params, _grads(), state)
    expected, _ = optim.Adam(lr=0.1).step(params, _grads(), optim.Adam().init(params))
    torch.testing.assert_close(new["w"], expected["w"], rtol=0, atol=0)
    assert new_state.max_exp_avg_sq.keys() == params.keys()
