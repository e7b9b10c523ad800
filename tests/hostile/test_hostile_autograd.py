"""Bad input to `grad` and `backward` is refused before any gradient is written.

Each case builds its operands fresh (leaves that require grad, and a loss), makes
one call with a bad input, and expects a clear error; the entries, their `.grad`
and the other operands are bit-identical afterwards.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _unchanged import Case, check, unique_ids

from paramdict import ParamDict


def _leaves() -> ParamDict:
    return ParamDict(
        w=torch.tensor([1.0, 2.0], requires_grad=True),
        b=torch.tensor(0.5, requires_grad=True),
    )


def _with_loss() -> tuple[ParamDict, torch.Tensor]:
    p = _leaves()
    return p, (p["w"] * p["b"]).sum()


def _with_vector_loss() -> tuple[ParamDict, torch.Tensor]:
    p = _leaves()
    return p, p["w"] * p["b"]


_BAD_LOSS: dict[str, tuple[Any, str]] = {
    "None": (None, "got NoneType"),
    "float": (1.0, "got float"),
    "int": (0, "got int"),
    "str": ("loss", "got str"),
    "empty list": ([], r"got list \(empty\)"),
    "empty tuple": ((), r"got tuple \(empty\)"),
    "list of floats": ([1.0, 2.0], r"positions \[0, 1\]"),
    "list with None": ([None], r"positions \[0\]"),
    "numpy": (np.ones(()), "got ndarray"),
    "dict": ({"loss": 1.0}, "got dict"),
    "module": (torch.nn.Linear(1, 1), "got Linear"),
}


def _cases() -> list[Case]:
    cases = []
    for what in ("grad", "backward"):
        for name, (bad, match) in _BAD_LOSS.items():
            cases.append(
                Case(
                    f"{what} loss={name}",
                    lambda: (_leaves(),),
                    lambda p, w=what, b=bad: getattr(p, w)(b),
                    TypeError,
                    match,
                )
            )
        cases += [
            Case(
                f"{what} empty ParamDict",
                lambda: (ParamDict(), _with_loss()[1]),
                lambda p, loss, w=what: getattr(p, w)(loss),
                ValueError,
                "ParamDict is empty",
            ),
            Case(
                f"{what} constant loss",
                lambda: (_leaves(), torch.ones(())),
                lambda p, loss, w=what: getattr(p, w)(loss),
                ValueError,
                "`loss` does not require grad",
            ),
            Case(
                f"{what} loss under no_grad",
                lambda: (_leaves(),),
                lambda p, w=what: _no_grad_loss(p, w),
                ValueError,
                "`loss` does not require grad",
            ),
            Case(
                f"{what} frozen entry",
                lambda: (*_with_loss(), torch.ones(2)),
                lambda p, loss, f, w=what: getattr(p | {"f": f}, w)(loss),
                ValueError,
                r"\['f'\]: they do not require grad",
            ),
            Case(
                f"{what} integer entry",
                lambda: (*_with_loss(), torch.ones(2, dtype=torch.int64)),
                lambda p, loss, f, w=what: getattr(p | {"i": f}, w)(loss),
                ValueError,
                r"\['i'\]",
            ),
            Case(
                f"{what} grad_outputs too few",
                lambda: (p := _leaves(), [p["w"] * 2, p["w"] * 3], torch.ones(2)),
                lambda p, loss, g, w=what: getattr(p, w)(loss, grad_outputs=[g]),
                ValueError,
                "`grad_outputs` does not fit",
            ),
            Case(
                f"{what} grad_outputs a dict",
                lambda: (*_with_vector_loss(), {"w": torch.ones(2)}),
                lambda p, loss, g, w=what: getattr(p, w)(loss, grad_outputs=g),
                TypeError,
                "as `grad_outputs`, got dict",
            ),
            *(
                []
                if what == "backward"  # documented: reached entries accumulate
                else [
                    Case(
                        "grad unused entry",
                        lambda: (*_with_loss(), torch.ones(2, requires_grad=True)),
                        lambda p, loss, u: (p | {"u": u}).grad(loss),
                        ValueError,
                        r"\['u'\]",
                    )
                ]
            ),
            Case(
                f"{what} vector loss without grad_outputs",
                _with_vector_loss,
                lambda p, loss, w=what: getattr(p, w)(loss),
                ValueError,
                "`grad_outputs` does not fit",
            ),
            Case(
                f"{what} grad_outputs of the wrong shape",
                lambda: (*_with_vector_loss(), torch.ones(3)),
                lambda p, loss, g, w=what: getattr(p, w)(loss, grad_outputs=g),
                ValueError,
                "`grad_outputs` does not fit",
            ),
            Case(
                f"{what} grad_outputs too many",
                lambda: (*_with_vector_loss(), torch.ones(2)),
                lambda p, loss, g, w=what: getattr(p, w)([loss], grad_outputs=[g, g]),
                ValueError,
                "`grad_outputs` does not fit",
            ),
            Case(
                f"{what} freed graph",
                lambda: _freed(),
                lambda p, loss, w=what: getattr(p, w)(loss),
                ValueError,
                "retain_graph=True",
            ),
        ]
    return cases


def _no_grad_loss(p: ParamDict, what: str) -> Any:
    with torch.no_grad():
        loss = (p["w"] * 2).sum()
    return getattr(p, what)(loss)


def _freed() -> tuple[ParamDict, torch.Tensor]:
    p = _leaves()
    loss = (p["w"].exp() * p["b"]).sum()
    torch.autograd.grad(loss, list(p.values()))
    return p, loss


ALL = unique_ids(_cases())


@pytest.mark.parametrize("case", [c.param() for c in ALL])
def test_bad_input_is_refused_and_nothing_changes(case: Case) -> None:
    """The call raises a clear error; no entry, `.grad` or operand changed."""
    check(case)


def test_backward_accumulates_nothing_when_it_refuses() -> None:
    """A refused `backward` leaves every `.grad` as it was (None here)."""
    p = _leaves()
    frozen = torch.ones(2)
    with pytest.raises(ValueError, match="do not require grad"):
        (p | {"f": frozen}).backward((p["w"] * frozen).sum())
    assert all(v.grad is None for v in p.values())


@pytest.mark.parametrize("earlier", [False, True], ids=["no grads", "grads"])
def test_backward_with_an_unreached_entry_accumulates_nothing(earlier: bool) -> None:
    """An unreached entry is named, and no `.grad` changes (torch's would)."""
    p = _leaves()
    u = torch.ones(2, requires_grad=True)
    if earlier:  # accumulating into existing gradients must not start either
        for value in p.values():
            value.grad = torch.full_like(value, 7.0)
    before = {k: None if v.grad is None else v.grad.clone() for k, v in p.items()}
    with pytest.raises(ValueError, match=r"does not reach \['u'\](?s:.*)nothing"):
        (p | {"u": u}).backward((p["w"] * p["b"]).sum())
    assert u.grad is None
    for key, value in p.items():
        if before[key] is None:
            assert value.grad is None, key
        else:
            assert value.grad is not None
            torch.testing.assert_close(value.grad, before[key])


def _loss(q: ParamDict) -> torch.Tensor:
    return (q["w"] ** 3).sum() + q["b"] ** 3


def _c(name: str, build: Any, call: Any, error: Any, match: str) -> Case:
    return Case(name, build, call, error, match)


OPTIONS = unique_ids(
    [
        _c(
            "grad create_graph str",
            lambda: (_leaves(),),
            lambda p: p.grad(_loss(p), create_graph="yes"),
            TypeError,
            r"`grad` takes True or False as `create_graph`, got 'yes'",
        ),
        _c(
            "grad allow_unused None",
            lambda: (_leaves(),),
            lambda p: p.grad(_loss(p), allow_unused=None),
            TypeError,
            r"`grad` takes True or False as `allow_unused`, got None",
        ),
        _c(
            "backward retain_graph 1",
            lambda: (_leaves(),),
            lambda p: p.backward(_loss(p), retain_graph=1),
            TypeError,
            r"`backward` takes True or False or None as `retain_graph`, got 1",
        ),
        _c(
            "grad grad_outputs str",
            lambda: (_leaves(),),
            lambda p: p.grad(_loss(p), grad_outputs=["x"]),
            TypeError,
            r"`grad` takes tensors \(or `None`\) in `grad_outputs`(?s:.*)str at "
            r"position 0",
        ),
        _c(
            "grad grad_outputs meta",
            lambda: (_leaves(),),
            lambda p: p.grad(_loss(p), grad_outputs=torch.ones((), device="meta")),
            ValueError,
            r"`grad`: `grad_outputs` does not fit `loss`",
        ),
        _c(
            "backward grad_outputs complex",
            lambda: (_leaves(),),
            lambda p: p.backward(
                _loss(p), grad_outputs=torch.ones((), dtype=torch.complex64)
            ),
            ValueError,
            r"`backward`: `grad_outputs` does not fit `loss`",
        ),
    ]
)


@pytest.mark.parametrize("case", [c.param() for c in OPTIONS])
def test_options_of_the_wrong_kind_are_named(case: Case) -> None:
    """Options of the wrong kind are named before anything runs; no `.grad` changes."""
    check(case)
