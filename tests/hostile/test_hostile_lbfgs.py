"""Hostile input to `LBFGS`: foreign states, tampered counts, wrong closures.

L-BFGS keeps its curvature history as flat vectors, so a state from other
parameters with the same element count would fit; it records the keys and
shapes and refuses another layout. Other counts, dtypes, a negative `n_iter`,
a closure returning a vector, a float, `None` or a bad tuple, and a per-key
`lr` are refused with the field's name and the fix; nothing changes.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _unchanged import Case, check, unique_ids
from torch import Tensor

from paramdict import ParamDict, optim

D = torch.float64


def _params() -> ParamDict:
    return ParamDict(
        w=torch.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=D),
        b=torch.tensor([0.25, -1.5], dtype=D),
    )


def _loss(p: ParamDict) -> Tensor:
    return sum(((v - 0.5) ** 4).sum() + (v**2).sum() for v in p.values())  # type: ignore[return-value]  # a sum of tensors


def _reloaded(state: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _stepped(params: ParamDict, steps: int = 2) -> Any:
    opt = optim.LBFGS(max_iter=3, history_size=4)
    state = opt.init(params)
    for _ in range(steps):
        params, state = opt.step(params, _loss, state)
    return state


def _same_count() -> ParamDict:
    """Six numbers again, under other keys and shapes."""
    return ParamDict(a=torch.zeros(3, 2, dtype=D))


_STATES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    (
        "same-count-other-keys",
        lambda: _stepped(_same_count()),
        ValueError,
        r"built for other parameters(?s:.*)missing \['b', 'w'\](?s:.*)"
        r"unexpected \['a'\](?s:.*)`init`",
    ),
    (
        "same-count-other-shapes",
        lambda: _stepped(
            ParamDict(w=torch.zeros(4, dtype=D), b=torch.zeros(2, 1, dtype=D))
        ),
        ValueError,
        r"with other shapes \['b', 'w'\]",
    ),
    (
        "other-count",
        lambda: _stepped(ParamDict(w=torch.zeros(5, dtype=D)))._replace(layout=()),
        ValueError,
        r"`d` has 5 elements, the parameters 6",
    ),
    (
        "float32-state",
        lambda: _stepped(_params().to(torch.float32)),
        ValueError,
        r"`d` is torch\.float32(?s:.*)torch\.float64",
    ),
    (
        "negative-n_iter",
        lambda: _stepped(_params())._replace(n_iter=-5),
        ValueError,
        r"`n_iter` must be >= 0, got -5",
    ),
    (
        "float-n_iter",
        lambda: _stepped(_params())._replace(n_iter=2.0),
        TypeError,
        r"`n_iter` must be an int, got float",
    ),
    (
        "negative-func_evals",
        lambda: _stepped(_params())._replace(func_evals=-1),
        ValueError,
        r"`func_evals` must be >= 0",
    ),
    (
        "missing-direction",
        lambda: _stepped(_params())._replace(d=None),
        ValueError,
        r"`d` is None after \d+ iterations",
    ),
    (
        "history-lengths",
        lambda: (lambda s: s._replace(ro=s.ro[:-1]))(_stepped(_params())),
        ValueError,
        r"`old_stps` and `ro` differ in length",
    ),
    (
        "history-vector",
        lambda: (lambda s: s._replace(old_dirs=(s.old_dirs[0][:3], *s.old_dirs[1:])))(
            _stepped(_params())
        ),
        ValueError,
        r"`old_dirs\[0\]` has 3 elements",
    ),
    (
        "h_diag-kind",
        lambda: _stepped(_params())._replace(H_diag="1"),
        TypeError,
        r"`H_diag` must be a number",
    ),
]


def _state_cases() -> list[Case]:
    cases: list[Case] = []
    for name, make, error, match in _STATES:

        def build(make: Callable[[], Any] = make) -> Any:
            return _params(), _reloaded(make())

        cases.append(
            Case(
                name,
                build,
                lambda p, s: optim.LBFGS(max_iter=3, history_size=4).step(p, _loss, s),
                error,
                match,
            )
        )
    return unique_ids(cases)


@pytest.mark.parametrize("case", [c.param() for c in _state_cases()])
def test_foreign_or_tampered_state_refused(case: Case) -> None:
    """A state that is not this optimizer's for these parameters is refused by field."""
    check(case)


def test_reloaded_state_continues_as_torch() -> None:
    """A state saved and reloaded keeps stepping, equal to torch.optim.LBFGS."""
    params = _params()
    opt = optim.LBFGS(max_iter=3, history_size=4)
    state = opt.init(params)
    ours = params
    for _ in range(3):
        ours, state = opt.step(ours, _loss, _reloaded(state))
    weights = [torch.nn.Parameter(v.clone()) for v in params.values()]
    theirs = torch.optim.LBFGS(weights, max_iter=3, history_size=4)

    def closure() -> Tensor:
        theirs.zero_grad()
        loss = _loss(ParamDict(zip(params, weights)))
        torch.autograd.backward(loss)
        return loss

    for _ in range(3):
        theirs.step(closure)  # type: ignore[no-untyped-call]  # torch's annotation
    for key, weight in zip(params, weights):
        torch.testing.assert_close(ours[key], weight.detach())


def test_state_saved_without_layout_still_steps() -> None:
    """A state from before layouts were recorded steps, its counts still checked."""
    params = _params()
    opt = optim.LBFGS(max_iter=3)
    state = _stepped(params)._replace(layout=())
    new, _ = opt.step(params, _loss, state)
    assert all(v.isfinite().all() for v in new.values())


_CLOSURES: list[tuple[str, Callable[[ParamDict], Any], type[Exception], str]] = [
    (
        "vector",
        lambda p: p["w"].sum(0),
        ValueError,
        r"loss of shape \(2,\)(?s:.*)`\.sum\(\)`",
    ),
    ("float", lambda p: float(_loss(p).detach()), TypeError, r"got float as the loss"),
    ("none", lambda p: None, TypeError, r"got NoneType as the loss"),
    (
        "int-tensor",
        lambda p: torch.tensor(3),
        TypeError,
        r"got torch\.int64 as the loss",
    ),
    ("complex", lambda p: _loss(p) * 1j, TypeError, r"complex128 as the loss"),
    ("tuple-of-3", lambda p: (_loss(p), p, p), TypeError, r"a tuple of 3"),
    ("tuple-grads-list", lambda p: (_loss(p), [p["w"]]), TypeError, r"a tuple of 2"),
    ("constant", lambda p: torch.tensor(1.0, dtype=D), ValueError, r"does not depend"),
    (
        "grads-other-keys",
        lambda p: (_loss(p), {"w": p["w"]}),
        ValueError,
        r"missing \['b'\]",
    ),
]


@pytest.mark.parametrize(("name", "closure", "error", "match"), _CLOSURES)
def test_closure_of_the_wrong_kind_refused(
    name: str, closure: Callable[[ParamDict], Any], error: type[Exception], match: str
) -> None:
    """What a closure should return is said by name; nothing changes."""
    opt = optim.LBFGS(max_iter=3)
    check(
        Case(
            name,
            lambda: (_params(), _stepped(_params())),
            lambda p, s: opt.step(p, closure, s),
            error,
            match,
        )
    )


@pytest.mark.parametrize(
    ("lr", "error", "match"),
    [
        (ParamDict(w=torch.tensor(0.1)), TypeError, r"per-key learning rates"),
        (-0.5, ValueError, r"`lr`"),
        (math.nan, ValueError, r"`lr`"),
        ("0.1", TypeError, r"`lr` must be a number"),
        (torch.ones(2), ValueError, r"0-dim"),
    ],
    ids=["paramdict", "negative", "nan", "string", "vector"],
)
def test_lr_refused_at_construction(
    lr: Any, error: type[Exception], match: str
) -> None:
    """A per-key, negative, NaN or non-number `lr` is refused when LBFGS is built."""
    with pytest.raises(error, match=match):
        optim.LBFGS(lr=lr)
