"""Implicit meta-gradients equal the dense closed form and torchopt's."""

from __future__ import annotations

import importlib.util
import operator

import pytest
import torch
from torch import Tensor, nn

from paramdict import CGInfo, ParamDict, implicit_proximal, implicit_root

LAM = 0.7
RTOL, ATOL = 1e-8, 1e-10


def _problem() -> tuple[Tensor, Tensor, ParamDict]:
    """A dense SPD `A`, a vector `c`, and keyed meta-parameters `theta` (7 numbers)."""
    gen = torch.Generator().manual_seed(0)
    m = torch.randn(7, 7, generator=gen, dtype=torch.float64)
    a = m @ m.T / 7 + 0.1 * torch.eye(7, dtype=torch.float64)
    c = torch.randn(7, generator=gen, dtype=torch.float64)
    theta = ParamDict(
        w=torch.randn(2, 2, generator=gen, dtype=torch.float64),
        b=torch.randn(3, generator=gen, dtype=torch.float64),
    ).requires_grad_()
    return a, c, theta


def _inner_loss(a: Tensor, c: Tensor):  # type: ignore[no-untyped-def]  # a test helper returning a closure
    """`1/2 phi^T A phi - c^T phi` on the flattened keyed `phi`."""

    def loss(phi: ParamDict) -> Tensor:
        z = phi.to_vector()
        return 0.5 * z @ a @ z - c @ z

    return loss


def _outer_loss(phi: ParamDict) -> Tensor:
    """A non-quadratic outer loss, so its gradient depends on where `phi` is."""
    return torch.sin(phi["w"]).sum() + (phi["b"] ** 3).sum()


def _exact_solution(a: Tensor, c: Tensor, theta: ParamDict) -> ParamDict:
    """The minimizer of the quadratic inner loss plus `lam/2 |phi - theta|^2`."""
    eye = torch.eye(7, dtype=torch.float64)
    z = torch.linalg.solve(a + LAM * eye, c + LAM * theta.to_vector().detach())
    return ParamDict.from_vector(z, like=theta.detach())


def _closed_form(a: Tensor, phi: ParamDict) -> Tensor:
    """`lam (A + lam I)^-1 grad L_out(phi)`, the dense meta-gradient."""
    leaf = phi.detach().requires_grad_()
    g = leaf.grad(_outer_loss(leaf)).to_vector()
    eye = torch.eye(7, dtype=torch.float64)
    solved: Tensor = torch.linalg.solve(a + LAM * eye, g)
    return LAM * solved


def test_proximal_meta_gradient_equals_the_closed_form() -> None:
    """At an exact solution the gradient is `lam (H + lam I)^-1 grad L_out`."""
    a, c, theta = _problem()
    phi = _exact_solution(a, c, theta)
    infos: list[CGInfo] = []
    adapted = implicit_proximal(
        phi, theta, loss=_inner_loss(a, c), lam=LAM, rtol=1e-12, on_solve=infos.append
    )
    torch.testing.assert_close(adapted, phi, rtol=0, atol=0)
    got = theta.grad(_outer_loss(adapted))
    torch.testing.assert_close(
        got.to_vector(), _closed_form(a, phi), rtol=RTOL, atol=ATOL
    )
    assert len(infos) == 1
    assert infos[0].converged


def test_root_meta_gradient_equals_the_closed_form() -> None:
    """`implicit_root` with iMAML's optimality condition gives the same gradient."""
    a, c, theta = _problem()
    phi = _exact_solution(a, c, theta)
    inner = _inner_loss(a, c)

    def optimality(p: ParamDict, t: ParamDict) -> ParamDict:
        return p.grad(inner(p), create_graph=True) + LAM * (p - t)

    adapted = implicit_root(phi, theta, optimality=optimality, rtol=1e-12)
    got = theta.grad(_outer_loss(adapted))
    torch.testing.assert_close(
        got.to_vector(), _closed_form(a, phi), rtol=RTOL, atol=ATOL
    )


def test_proximal_through_a_module_equals_the_closed_form() -> None:
    """Least squares through `params.call` (an exact inner solve) meets the formula."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2).double()
    theta = ParamDict.from_module(model)
    x = torch.randn(8, 3, dtype=torch.float64)
    y = torch.randn(8, 2, dtype=torch.float64)

    def inner(p: ParamDict) -> Tensor:
        out: Tensor = p.call(model, x)
        return ((out - y) ** 2).sum() / 2

    flat = theta.to_vector().detach()

    def dense_inner(z: Tensor) -> Tensor:
        return inner(ParamDict.from_vector(z, like=theta))

    h = torch.autograd.functional.hessian(  # type: ignore[no-untyped-call]  # untyped in torch
        dense_inner, flat
    )
    g0 = torch.autograd.functional.jacobian(  # type: ignore[no-untyped-call]  # untyped in torch
        dense_inner, torch.zeros_like(flat)
    )
    eye = torch.eye(len(flat), dtype=torch.float64)
    z = torch.linalg.solve(h + LAM * eye, LAM * flat - g0)  # grad = h z + g0
    phi = ParamDict.from_vector(z, like=theta.detach())
    adapted = implicit_proximal(phi, theta, loss=inner, lam=LAM, rtol=1e-13)
    outer = (adapted.call(model, x) ** 2).sum()
    got = theta.grad(outer)
    leaf = phi.detach().requires_grad_()
    g = leaf.grad((leaf.call(model, x) ** 2).sum()).to_vector()
    want = LAM * torch.linalg.solve(h + LAM * eye, g)
    torch.testing.assert_close(got.to_vector(), want, rtol=RTOL, atol=ATOL)


def test_batched_solutions_sum_their_gradients() -> None:
    """Per-task solutions (a leading dim) give the sum of the per-task gradients."""
    a, c, theta = _problem()
    phi = _exact_solution(a, c, theta)
    batched = phi.map(lambda v: torch.stack([v, v, v]))

    def inner(p: ParamDict) -> Tensor:
        z = torch.cat([v.reshape(3, -1) for v in p.values()], dim=1)
        return (0.5 * torch.einsum("ti,ij,tj->t", z, a, z) - z @ c).sum()

    adapted = implicit_proximal(batched, theta, loss=inner, lam=LAM, rtol=1e-12)
    assert adapted["w"].shape == (3, 2, 2)
    per_task = [_outer_loss(adapted.map(operator.itemgetter(i))) for i in range(3)]
    got = theta.grad(torch.stack(per_task).sum())
    torch.testing.assert_close(
        got.to_vector(), 3 * _closed_form(a, phi), rtol=RTOL, atol=ATOL
    )


def test_no_graph_without_grad() -> None:
    """With frozen params or under `no_grad`, the values come back detached."""
    a, c, theta = _problem()
    phi = _exact_solution(a, c, theta)
    with torch.no_grad():
        out = implicit_proximal(phi, theta, loss=_inner_loss(a, c), lam=LAM)
    assert not out["w"].requires_grad
    out = implicit_proximal(phi, theta.detach(), loss=_inner_loss(a, c), lam=LAM)
    assert not out["b"].requires_grad
    assert list(out) == list(phi)


def test_adapted_and_params_are_unchanged() -> None:
    """Neither ParamDict changes, and `adapted`'s tensors get no graph."""
    a, c, theta = _problem()
    phi = _exact_solution(a, c, theta)
    before = phi.clone()
    adapted = implicit_proximal(phi, theta, loss=_inner_loss(a, c), lam=LAM)
    theta.grad(_outer_loss(adapted))
    assert phi["w"].grad_fn is None
    torch.testing.assert_close(phi, before, rtol=0, atol=0)
    assert theta["w"].grad is None


@pytest.mark.skipif(
    importlib.util.find_spec("torchopt") is None, reason="torchopt is not installed"
)
# torchopt 0.7.3 calls the deprecated `functorch.vjp` (its own warning).
@pytest.mark.filterwarnings("ignore:We've integrated functorch:FutureWarning")
def test_agrees_with_torchopt() -> None:
    """Torchopt's `custom_root` on tuples gives the same meta-gradient."""
    import torchopt

    a, c, theta = _problem()
    phi = _exact_solution(a, c, theta)
    eye = torch.eye(7, dtype=torch.float64)

    def optimality(sol: tuple[Tensor, Tensor], t: tuple[Tensor, Tensor]):  # type: ignore[no-untyped-def]  # torchopt's protocol
        z = torch.cat([sol[0].reshape(-1), sol[1]])
        grad = a @ z - c + LAM * (z - torch.cat([t[0].reshape(-1), t[1]]))
        return grad[:4].reshape(2, 2), grad[4:]

    @torchopt.diff.implicit.custom_root(  # type: ignore[untyped-decorator]  # torchopt is untyped here
        optimality, argnums=1, solve=torchopt.linear_solve.solve_cg(rtol=1e-12)
    )
    def solve(init: tuple[Tensor, Tensor], t: tuple[Tensor, Tensor]):  # type: ignore[no-untyped-def]  # torchopt's protocol
        z = torch.linalg.solve(
            a + LAM * eye, c + LAM * torch.cat([t[0].reshape(-1), t[1]]).detach()
        )
        return z[:4].reshape(2, 2), z[4:]

    w, b = theta["w"].detach().requires_grad_(), theta["b"].detach().requires_grad_()
    sol = solve(
        (torch.zeros(2, 2, dtype=torch.float64), torch.zeros(3).double()), (w, b)
    )
    first, second = sol
    assert isinstance(first, Tensor)
    assert isinstance(second, Tensor)
    loss = torch.sin(first).sum() + (second**3).sum()
    theirs = torch.autograd.grad(loss, (w, b))
    adapted = implicit_proximal(phi, theta, loss=_inner_loss(a, c), lam=LAM, rtol=1e-12)
    ours = theta.grad(_outer_loss(adapted))
    torch.testing.assert_close(ours["w"], theirs[0], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(ours["b"], theirs[1], rtol=RTOL, atol=ATOL)


def test_hostile_inputs_name_the_problem() -> None:
    """Wrong kinds, keys, shapes and values give errors naming them."""
    a, c, theta = _problem()
    phi = _exact_solution(a, c, theta)
    loss = _inner_loss(a, c)
    with pytest.raises(TypeError, match="`adapted` must be a ParamDict, got dict"):
        implicit_proximal(dict(phi), theta, loss=loss, lam=LAM)  # type: ignore[type-var]  # the error under test
    with pytest.raises(TypeError, match="`params` must be a ParamDict"):
        implicit_root(phi, [1], optimality=lambda p, t: p)  # type: ignore[arg-type]  # the error under test
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        implicit_proximal(phi.select("w"), theta, loss=loss, lam=LAM)
    with pytest.raises(ValueError, match=r"entries \['b'\] do not have their param's"):
        implicit_proximal(
            phi | {"b": torch.zeros(4).double()}, theta, loss=loss, lam=LAM
        )
    with pytest.raises(TypeError, match="`loss` must be a callable"):
        implicit_proximal(phi, theta, loss=None, lam=LAM)  # type: ignore[arg-type]  # the error under test
    with pytest.raises(ValueError, match="`lam` must be a finite number > 0, got 0"):
        implicit_proximal(phi, theta, loss=loss, lam=0)
    with pytest.raises(TypeError, match="`lam` must be a number, got Tensor"):
        implicit_proximal(phi, theta, loss=loss, lam=torch.tensor(1.0))  # type: ignore[arg-type]  # the error under test
    with pytest.raises(ValueError, match="`rtol` must be a finite number >= 0"):
        implicit_root(phi, theta, optimality=lambda p, t: p, rtol=-1.0)
    with pytest.raises(ValueError, match="`maxiter` must be >= 0"):
        implicit_proximal(phi, theta, loss=loss, lam=LAM, maxiter=-2)
    with pytest.raises(TypeError, match="`on_solve` must be a callable"):
        implicit_proximal(phi, theta, loss=loss, lam=LAM, on_solve=[])  # type: ignore[arg-type]  # the error under test
    with pytest.raises(TypeError, match="`optimality` must be a callable"):
        implicit_root(phi, theta, optimality="grad")  # type: ignore[arg-type]  # the error under test


def test_bad_optimality_is_named_when_the_gradient_is_taken() -> None:
    """An optimality condition with other keys, or without a graph, is refused."""
    a, c, theta = _problem()
    phi = _exact_solution(a, c, theta)
    inner = _inner_loss(a, c)
    adapted = implicit_root(phi, theta, optimality=lambda p, t: p.select("w"))
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        theta.grad(_outer_loss(adapted))

    def no_graph(p: ParamDict, t: ParamDict) -> ParamDict:
        return p.grad(inner(p)).detach() + 0 * t

    adapted = implicit_root(phi, theta, optimality=no_graph)
    with pytest.raises(ValueError, match="does not depend on `phi`"):
        theta.grad(_outer_loss(adapted))


def test_the_meta_gradient_is_not_differentiated_again() -> None:
    """The implicit gradient carries no graph, so a second derivative is refused."""
    a, c, theta = _problem()
    phi = _exact_solution(a, c, theta)
    adapted = implicit_proximal(phi, theta, loss=_inner_loss(a, c), lam=LAM)
    grads = theta.grad(_outer_loss(adapted), create_graph=True)
    with pytest.raises(ValueError, match=r"no graph(?s:.*)cannot be differentiated"):
        theta.grad(grads.sum())
