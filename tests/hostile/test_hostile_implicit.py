"""Hostile input to the second-order toolkit: meta, complex, NaN, second derivatives.

`implicit_proximal`, `implicit_root` and `cg` read numbers on the host, so meta
tensors are refused by key; a complex loss is refused as having no gradient; a
NaN inner loss reaches the meta-gradient as NaN instead of being hidden by the
solver's breakdown; and differentiating a meta-gradient again is refused, with
or without `allow_unused=True`, because the implicit backward carries no graph.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _unchanged import Case, check
from torch import Tensor

from paramdict import ParamDict, cg, hvp, implicit_proximal, implicit_root, jvp, vjp


def _theta(**kwargs: Any) -> ParamDict:
    return ParamDict(
        w=torch.tensor([0.3, -0.5], dtype=torch.float64, **kwargs),
        b=torch.tensor([0.7], dtype=torch.float64, **kwargs),
    )


def _quartic(p: ParamDict) -> Tensor:
    return sum(((v**4).sum() / 4 for v in p.values()), torch.tensor(0.0))


def _optimality(p: ParamDict, t: ParamDict) -> ParamDict:
    return p.map(lambda v: v**3) + (p - t)


@pytest.mark.parametrize("where", ["adapted", "params"])
def test_implicit_proximal_refuses_meta_by_key(where: str) -> None:
    """Meta entries are refused when the result is built; nothing changes."""

    def build() -> Any:
        real = _theta(requires_grad=True)
        meta = _theta(device="meta", requires_grad=True)
        if where == "adapted":
            return meta.detach(), real
        return real.detach(), meta

    check(
        Case(
            where,
            build,
            lambda a, p: implicit_proximal(a, p, loss=_quartic, lam=1.0),
            ValueError,
            r"\['b', 'w'\] are meta tensors(?s:.*)\.to\(device\)",
        )
    )


def test_implicit_root_refuses_meta_by_key() -> None:
    """`implicit_root` refuses meta entries the same way."""
    meta = _theta(device="meta", requires_grad=True)
    check(
        Case(
            "meta",
            lambda: (meta.detach(), meta),
            lambda a, p: implicit_root(a, p, optimality=_optimality),
            ValueError,
            r"\['b', 'w'\] are meta tensors",
        )
    )


def test_cg_refuses_meta_by_key() -> None:
    """`cg` refuses a meta right-hand side by key instead of failing on `.item()`."""
    b = _theta(device="meta")
    check(
        Case(
            "meta",
            lambda: (b,),
            lambda b: cg(lambda v: v, b),
            ValueError,
            r"\['b', 'w'\] of `b` are meta",
        )
    )


def test_hvp_and_vjp_on_meta_give_torch_shapes() -> None:
    """`hvp` and `vjp` on meta tensors give meta results, as torch.autograd does."""
    p = _theta(device="meta")
    h = hvp(_quartic, p, p)
    w = p["w"].detach().requires_grad_()
    (expected,) = torch.autograd.grad((w**2).sum(), w)
    v = vjp(lambda q: q["w"] ** 2, p.select("w"), torch.ones(2, device="meta"))
    for got in (h["w"], h["b"], v["w"]):
        assert got.is_meta
    assert h["w"].shape == expected.shape == v["w"].shape


def test_hvp_refuses_a_complex_loss() -> None:
    """A complex loss has no gradient: `hvp` says so and how to make it real."""
    p = _theta()
    check(
        Case(
            "complex",
            lambda: (p, p.ones_like()),
            lambda p, v: hvp(lambda q: _quartic(q) * (1 + 1j), p, v),
            TypeError,
            r"`hvp`: the function must return a real scalar loss, got a "
            r"torch\.complex128(?s:.*)`\.real`",
        )
    )


def test_implicit_proximal_refuses_a_complex_loss_when_differentiated() -> None:
    """A complex inner loss is refused by name when the meta-gradient is taken."""
    theta = _theta(requires_grad=True)
    adapted = implicit_proximal(
        theta.detach(), theta, loss=lambda q: _quartic(q) * 1j, lam=1.0
    )
    with pytest.raises(TypeError, match=r"`implicit_proximal`(?s:.*)real scalar loss"):
        theta.grad(adapted.sum())


def test_vjp_of_a_complex_output_equals_torch() -> None:
    """`vjp` of a complex output with a complex cotangent is torch.autograd.grad's."""
    p = _theta()
    u = torch.tensor([1.0 + 2.0j, -0.5j], dtype=torch.complex128)
    got = vjp(lambda q: q["w"] * (2 - 1j), p.select("w"), u)
    w = p["w"].clone().requires_grad_()
    (expected,) = torch.autograd.grad(w * (2 - 1j), w, grad_outputs=u)
    torch.testing.assert_close(got["w"], expected)


@pytest.mark.parametrize("where", ["everywhere", "one entry"])
def test_nan_inner_loss_gives_nan_meta_gradient(where: str) -> None:
    """A NaN inner loss reaches the meta-gradient as NaN, not as zeros."""
    theta = _theta(requires_grad=True)

    def loss(q: ParamDict) -> Tensor:
        scale = math.nan if where == "everywhere" else 1.0
        return _quartic(q) * scale + (q["b"] * math.nan).sum()

    adapted = implicit_proximal(theta.detach(), theta, loss=loss, lam=1.0)
    grads = theta.grad(adapted.sum())
    assert all(v.isnan().all() for v in grads.values())


def test_nan_in_the_solve_is_reported() -> None:
    """`cg` with a NaN right-hand side or operator returns NaN and not `converged`."""
    b = _theta()
    x, info = cg(lambda v: v, b.map(lambda v: v * math.nan))
    assert all(v.isnan().all() for v in x.values())
    assert not info.converged
    x, info = cg(lambda v: v * math.nan, b)
    assert all(v.isnan().all() for v in x.values())
    assert not info.converged


def _second_order_cases() -> list[tuple[str, Any]]:
    return [
        (
            "proximal",
            lambda theta: implicit_proximal(
                theta.detach(), theta, loss=_quartic, lam=1.0
            ),
        ),
        (
            "root",
            lambda theta: implicit_root(theta.detach(), theta, optimality=_optimality),
        ),
    ]


@pytest.mark.parametrize("allow_unused", [False, True])
@pytest.mark.parametrize(("name", "make"), _second_order_cases())
def test_second_derivative_refused(name: str, make: Any, allow_unused: bool) -> None:
    """Differentiating the meta-gradient again raises, never returns zeros."""
    theta = _theta(requires_grad=True)
    adapted = make(theta)
    grads = theta.grad((adapted.map(lambda v: v**2)).sum(), create_graph=True)
    with pytest.raises(
        ValueError, match=r"carries no graph(?s:.*)differentiated again"
    ):
        theta.grad(grads.sum(), allow_unused=allow_unused)


@pytest.mark.parametrize(("name", "make"), _second_order_cases())
def test_first_derivative_with_create_graph_unchanged(name: str, make: Any) -> None:
    """With `create_graph=True` the first derivative is the one without it."""
    theta = _theta(requires_grad=True)
    plain = theta.grad(make(theta).map(lambda v: v**2).sum())
    graphed = theta.grad(make(theta).map(lambda v: v**2).sum(), create_graph=True)
    for key in theta:
        torch.testing.assert_close(graphed[key].detach(), plain[key], rtol=0, atol=0)


def test_first_derivative_matches_the_closed_form() -> None:
    """The meta-gradient is `lam (H + lam I)^-1 g` (here H = diag(3 phi^2))."""
    theta = _theta(requires_grad=True)
    adapted = implicit_proximal(theta.detach(), theta, loss=_quartic, lam=1.0)
    grads = theta.grad(adapted.sum(), create_graph=True)
    for key, phi in theta.items():
        expected = 1 / (3 * phi.detach() ** 2 + 1)
        torch.testing.assert_close(grads[key].detach(), expected)


_AWAY: dict[str, Callable[[Tensor], Tensor]] = {
    "meta": lambda v: torch.empty_like(v, device="meta"),
    "sparse": lambda v: v.to_sparse(),
    "complex": lambda v: v.to(torch.complex64),
}
_AWAY_ERRORS = {
    "meta": (ValueError, r"does not fit params at \['w'\] \('w': float32\[2\] meta"),
    "sparse": (TypeError, r"has sparse tensors at \['w'\]"),
    "complex": (ValueError, r"does not fit params at \['w'\] \('w': complex64\[2\]"),
}


@pytest.mark.parametrize("kind", list(_AWAY))
@pytest.mark.parametrize("product", ["hvp", "jvp"])
def test_tangents_torch_cannot_pair_are_named(product: str, kind: str) -> None:
    """Tangents on the meta device, sparse or complex for real params: named."""
    p = _theta()
    error, match = _AWAY_ERRORS[kind]
    funcs = {"hvp": lambda v: hvp(_quartic, p, v), "jvp": lambda v: jvp(_quartic, p, v)}
    check(
        Case(
            kind,
            lambda: (p.ones_like() | {"w": _AWAY[kind](torch.ones(2))},),
            funcs[product],
            error,
            rf"`{product}`: `tangents` {match}",
        )
    )


@pytest.mark.parametrize("kind", list(_AWAY))
def test_cotangents_torch_cannot_pair_are_named(kind: str) -> None:
    """A cotangent on the meta device, sparse or complex for a real output: named."""
    p = _theta()
    error = TypeError if kind == "sparse" else ValueError
    check(
        Case(
            kind,
            lambda: (_AWAY[kind](torch.ones(2)),),
            lambda u: vjp(lambda q: q["w"] ** 2, p, u),
            error,
            r"`vjp`: `cotangents` (is a sparse tensor|\((float32\[2\] meta|"
            r"complex64\[2\] cpu)\) does not fit the function's output)",
        )
    )


@pytest.mark.parametrize("kind", ["sparse", "complex"])
def test_cg_and_implicit_refuse_what_cg_cannot_solve(kind: str) -> None:
    """`cg` solves real dense systems: sparse or complex entries are named."""
    b = _theta() | {"w": _AWAY[kind](torch.ones(2))}
    match = r"entries \['w'\] of `b` are (sparse|complex)"
    with pytest.raises(TypeError, match=match):
        cg(lambda v: v, b)
    theta = _theta(requires_grad=True)
    adapted = theta.detach() | {"w": _AWAY[kind](torch.ones(2))}
    with pytest.raises(TypeError, match=r"entries \['w'\] of `adapted` are"):
        implicit_proximal(adapted, theta, loss=_quartic, lam=1.0)


def _c(name: str, build: Any, call: Any, error: Any, match: str) -> Case:
    return Case(name, build, call, error, match)


def _cube(q: ParamDict) -> Tensor:
    return (q["w"] ** 3).sum() + (q["b"] ** 3).sum()


def _first(q: ParamDict) -> Tensor:
    return q["w"]


# Options of the wrong kind, typed as anything to pass them.
_YES: Any = "yes"
_NONE: Any = None


@pytest.mark.parametrize(
    "case",
    [
        c.param()
        for c in [
            _c(
                "hvp create_graph str",
                lambda: (_theta(),),
                lambda p: hvp(_cube, p, p, create_graph=_YES),
                TypeError,
                r"`hvp` takes True or False as `create_graph`",
            ),
            _c(
                "vjp allow_unused None",
                lambda: (_theta(),),
                lambda p: vjp(_first, p, torch.ones(2), allow_unused=_NONE),
                TypeError,
                r"`vjp` takes True or False as `allow_unused`",
            ),
            _c(
                "jvp of nothing",
                lambda: (ParamDict(),),
                lambda p: jvp(lambda q: q["w"], p, p),
                ValueError,
                r"`jvp` needs at least one entry in `params`",
            ),
        ]
    ],
)
def test_product_options_of_the_wrong_kind_are_named(case: Case) -> None:
    """Flags that are not bools and an empty `params` are named; nothing changes."""
    check(case)


def test_an_error_of_the_function_given_says_where_it_came_from() -> None:
    """What the function given to `hvp` raises is passed on, with a note naming it."""

    def broken(q: ParamDict) -> torch.Tensor:
        return q["missing"].sum()

    with pytest.raises(KeyError, match="missing") as info:
        hvp(broken, _theta(), _theta())
    notes = getattr(info.value, "__notes__", [])
    assert notes == ["(raised by `func`, the function given to `hvp`)"]


@pytest.mark.parametrize("product", ["hvp", "vjp", "jvp"])
def test_params_half_on_the_meta_device_are_named(product: str) -> None:
    """Meta entries beside real ones are named: torch cannot differentiate both."""
    p = _theta() | {"w": torch.ones(2, dtype=torch.float64, device="meta")}
    calls = {
        "hvp": lambda q: hvp(_quartic, q, q),
        "vjp": lambda q: vjp(_quartic, q, torch.ones((), dtype=torch.float64)),
        "jvp": lambda q: jvp(_quartic, q, q),
    }
    check(
        Case(
            product,
            lambda: (p,),
            calls[product],
            ValueError,
            rf"`{product}`: entries \['w'\] of `params` are meta tensors and the "
            "others are not",
        )
    )
