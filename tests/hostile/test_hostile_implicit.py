"""Hostile input to the second-order toolkit: meta, complex, NaN, second derivatives.

`implicit_proximal`, `implicit_root` and `cg` read numbers on the host, so meta
tensors are refused by key; a complex loss is refused as having no gradient; a
NaN inner loss reaches the meta-gradient as NaN instead of being hidden by the
solver's breakdown; and differentiating a meta-gradient again is refused, with
or without `allow_unused=True`, because the implicit backward carries no graph.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _unchanged import Case, check
from torch import Tensor

from paramdict import ParamDict, cg, hvp, implicit_proximal, implicit_root, vjp


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
