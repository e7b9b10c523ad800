"""`hvp`, `jvp` and `vjp` equal products with dense Hessians and Jacobians."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from paramdict import ParamDict, hvp, jvp, vjp

RTOL, ATOL = 1e-10, 1e-12


def _mlp() -> nn.Module:
    """An MLP with BatchNorm in eval mode (non-trivial running statistics)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2)
    ).double()
    bn = model[1]
    assert isinstance(bn, nn.BatchNorm1d)
    mean, var = bn.running_mean, bn.running_var
    assert mean is not None
    assert var is not None
    with torch.no_grad():
        mean.normal_()
        var.uniform_(0.5, 2.0)
    return model.eval()


def _dense(f: Callable[[ParamDict], Tensor], like: ParamDict) -> Callable[..., Tensor]:
    """`f` as a function of one flat vector, for torch.autograd.functional."""
    return lambda z: f(ParamDict.from_vector(z, like=like))


def _setup() -> tuple[nn.Module, ParamDict, Tensor, Tensor]:
    model = _mlp()
    params = ParamDict.from_module(model)
    x = torch.randn(6, 3, dtype=torch.float64)
    y = torch.randn(6, 2, dtype=torch.float64)
    return model, params, x, y


def test_hvp_equals_the_dense_hessian_through_call() -> None:
    """`hvp` of an MSE through `params.call` on a BatchNorm MLP is `H @ v`."""
    model, params, x, y = _setup()

    def loss(p: ParamDict) -> Tensor:
        return F.mse_loss(p.call(model, x), y)

    v = params.randn_like()
    flat = params.to_vector().detach()
    dense = torch.autograd.functional.hessian(  # type: ignore[no-untyped-call]  # untyped in torch
        _dense(loss, params), flat
    )
    got = hvp(loss, params, v)
    assert list(got) == list(params)
    torch.testing.assert_close(
        got.to_vector(), dense @ v.to_vector(), rtol=RTOL, atol=ATOL
    )


# torch.func's forward mode scripts a helper on first use (torch's own warning).
@pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning",
    "ignore:`torch.jit.script` is deprecated:FutureWarning",  # torch 2.14
)
def test_torch_route_fails_where_hvp_works() -> None:
    """`torch.func.jvp(torch.func.grad(f))` fails on this loss; `hvp` does not."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    params = ParamDict.from_module(model)
    x, y = torch.rand(10, 3), torch.rand(10, 2)

    def loss(p: ParamDict) -> Tensor:
        return F.mse_loss(p.call(model, x), y)

    v = params.randn_like().detach()
    with pytest.raises(RuntimeError, match="ZeroTensors are immutable"):
        torch.func.jvp(torch.func.grad(loss), (params,), (v,))
    assert hvp(loss, params, v).isfinite()


def test_jvp_and_vjp_equal_the_dense_jacobian_through_call() -> None:
    """`jvp` is `J @ v` and `vjp` is `J.T @ u` for the network's output."""
    model, params, x, _ = _setup()

    def out(p: ParamDict) -> Tensor:
        result: Tensor = p.call(model, x)
        return result

    flat = params.to_vector().detach()
    dense = torch.autograd.functional.jacobian(  # type: ignore[no-untyped-call]  # untyped in torch
        lambda z: _dense(out, params)(z).reshape(-1), flat
    )
    v = params.randn_like()
    u = torch.randn(6, 2, dtype=torch.float64)
    torch.testing.assert_close(
        jvp(out, params, v).reshape(-1), dense @ v.to_vector(), rtol=RTOL, atol=ATOL
    )
    torch.testing.assert_close(
        vjp(out, params, u).to_vector(), dense.T @ u.reshape(-1), rtol=RTOL, atol=ATOL
    )


def test_jvp_of_a_gradient_is_the_hvp() -> None:
    """`jvp` of the keyed gradient map (an optimality condition) is `H @ v`."""
    model, params, x, y = _setup()

    def loss(p: ParamDict) -> Tensor:
        return F.mse_loss(p.call(model, x), y)

    def gradient(p: ParamDict) -> ParamDict:
        return p.grad(loss(p), create_graph=True)

    v = params.randn_like()
    dense = torch.autograd.functional.hessian(  # type: ignore[no-untyped-call]  # untyped in torch
        _dense(loss, params), params.to_vector().detach()
    )
    got = jvp(gradient, params, v)
    assert isinstance(got, ParamDict)
    torch.testing.assert_close(
        got.to_vector(), dense @ v.to_vector(), rtol=RTOL, atol=ATOL
    )
    torch.testing.assert_close(
        vjp(gradient, params, v).to_vector(),
        dense @ v.to_vector(),
        rtol=RTOL,
        atol=ATOL,
    )


def test_products_with_create_graph_differentiate_again() -> None:
    """With `create_graph=True`, `hvp` is differentiable in `params` (third order)."""
    w = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64, requires_grad=True)
    params = ParamDict(w=w)
    v = ParamDict(w=torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))

    def loss(p: ParamDict) -> Tensor:
        return (p["w"] ** 4).sum()

    product = hvp(loss, params, v, create_graph=True)  # 12 w^2 v
    (third,) = torch.autograd.grad(product["w"].sum(), w)
    torch.testing.assert_close(third, 24 * w.detach() * v["w"], rtol=RTOL, atol=ATOL)
    assert not hvp(loss, params, v)["w"].requires_grad


def test_linear_and_unused_entries() -> None:
    """Linear entries give zero rows; unused ones raise unless `allow_unused`."""
    params = ParamDict(
        a=torch.tensor([1.0, 2.0], dtype=torch.float64),
        b=torch.tensor(3.0, dtype=torch.float64),
    )
    v = params.ones_like()
    got = hvp(lambda p: (p["a"] ** 2).sum() + 5 * p["b"], params, v)
    torch.testing.assert_close(got["a"], torch.full((2,), 2.0, dtype=torch.float64))
    torch.testing.assert_close(got["b"], torch.zeros((), dtype=torch.float64))
    with pytest.raises(ValueError, match=r"does not depend on \['b'\]"):
        hvp(lambda p: (p["a"] ** 2).sum(), params, v)
    with pytest.raises(ValueError, match=r"does not depend on \['a'\]"):
        vjp(lambda p: p["b"] * 2, params, torch.tensor(1.0, dtype=torch.float64))
    zeros = jvp(lambda p: p["b"] * 2, params, v, allow_unused=True)
    torch.testing.assert_close(zeros, torch.tensor(2.0, dtype=torch.float64))


def test_inputs_are_unchanged() -> None:
    """The params keep their values, grads and graph-free state."""
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    params = ParamDict(w=w)
    v = ParamDict(w=torch.ones(2))
    hvp(lambda p: (p["w"] ** 3).sum(), params, v)
    jvp(lambda p: p["w"] ** 2, params, v)
    assert w.grad is None
    assert params["w"] is w
    torch.testing.assert_close(w.detach(), torch.tensor([1.0, 2.0]))


def test_hostile_inputs_name_the_problem() -> None:
    """Wrong kinds, keys, shapes and outputs give errors naming them."""
    params = ParamDict(a=torch.ones(2), b=torch.ones(3))
    v = params.ones_like()

    def loss(p: ParamDict) -> Tensor:
        return p.dot(p)

    with pytest.raises(TypeError, match="`func` must be a callable"):
        hvp(3, params, v)  # type: ignore[arg-type]  # the error under test
    with pytest.raises(TypeError, match="`params` must be a ParamDict, got dict"):
        hvp(loss, dict(params), v)  # type: ignore[arg-type, type-var]  # the error under test
    with pytest.raises(ValueError, match=r"missing \['b'\], unexpected \['c'\]"):
        hvp(loss, params, {"a": torch.ones(2), "c": torch.ones(3)})
    with pytest.raises(ValueError, match=r"wrong shapes at \['b'\]"):
        jvp(loss, params, {"a": torch.ones(2), "b": torch.ones(4)})
    with pytest.raises(TypeError, match=r"non-tensors at \['a'\]"):
        hvp(loss, params, {"a": 1.0, "b": torch.ones(3)})  # type: ignore[dict-item]  # the error under test
    with pytest.raises(ValueError, match=r"scalar loss, got shape \(2,\)"):
        hvp(lambda p: p["a"] * 2, params, v)
    with pytest.raises(TypeError, match="must return a tensor or a ParamDict"):
        jvp(lambda p: 3.0, params, v)  # type: ignore[arg-type, return-value]  # the error under test
    with pytest.raises(
        ValueError, match=r"cotangents vs function's output\): missing \['b'\]"
    ):
        vjp(lambda p: p * 2, params, {"a": torch.ones(2)})
    with pytest.raises(TypeError, match="returns a tensor, so `cotangents` must be"):
        vjp(lambda p: p["a"] * 2, params, v)  # type: ignore[arg-type, return-value]  # the error under test
    with pytest.raises(TypeError, match="`func` must be a callable"):
        jvp(None, params, v)  # type: ignore[call-overload]  # the error under test
    with pytest.raises(ValueError, match=r"`cotangents` has shape \(3,\)"):
        vjp(lambda p: p["a"] * 2, params, torch.ones(3))
    with pytest.raises(TypeError, match=r"\['i'\] of `params` are not floating"):
        hvp(
            loss,
            ParamDict(i=torch.ones(2, dtype=torch.long)),
            ParamDict(i=torch.ones(2)),
        )
