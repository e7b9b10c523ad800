"""The dict-parameter checks of torch's `test/functorch/test_eager_transforms.py`.

Upstream trains MAML and ensembles and takes per-sample gradients and
jacobians with plain dicts of parameters; here the same computations run with
ParamDicts (as pytrees through `torch.func`, and through `params.call`) and are
compared in float64 with the plain-dict result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, jacfwd, jacrev, jvp, vjp, vmap

from paramdict import ParamDict

# torch's forward-mode AD scripts its decompositions on first use (torch 2.13).
pytestmark = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script` is deprecated:DeprecationWarning",
    "ignore:`torch.jit.script` is deprecated:FutureWarning",  # torch 2.14
)


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1)).double()


def _close_keyed(got: Any, expected: dict[str, Tensor]) -> None:
    assert isinstance(got, ParamDict)
    assert list(got) == list(expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value)


@pytest.mark.parametrize("how", ["functional_call", "call"])
def test_maml_regression_matches_plain_dicts(how: str) -> None:
    """A two-task MAML meta-gradient on a sine regression equals the dict version."""
    model = _mlp()
    gen = torch.Generator().manual_seed(1)
    tasks = [
        (
            torch.rand(6, 3, dtype=torch.float64, generator=gen),
            torch.rand(6, 1, dtype=torch.float64, generator=gen),
        )
        for _ in range(2)
    ]
    inner_lr = 0.1

    def run(params: Any, x: Tensor) -> Tensor:
        if how == "call" and isinstance(params, ParamDict):
            out: Tensor = params.call(model, x)
            return out
        result: Tensor = functional_call(model, params, (x,))
        return result

    def meta_loss(params: Any) -> Tensor:
        total = torch.zeros((), dtype=torch.float64)
        for x, y in tasks:
            inner = ((run(params, x) - y) ** 2).mean()
            grads = torch.autograd.grad(inner, list(params.values()), create_graph=True)
            adapted = {k: v - inner_lr * g for (k, v), g in zip(params.items(), grads)}
            if isinstance(params, ParamDict):
                adapted = ParamDict(adapted)
            total = total + ((run(adapted, x) - y) ** 2).mean()
        return total

    plain = {
        k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()
    }
    expected = dict(
        zip(plain, torch.autograd.grad(meta_loss(plain), list(plain.values())))
    )
    keyed = ParamDict(plain).detach().requires_grad_()
    _close_keyed(keyed.grad(meta_loss(keyed)), expected)
    # And the whole meta-gradient through `torch.func.grad` on the ParamDict.
    _close_keyed(grad(meta_loss)(keyed.detach()), expected)


def test_maml_inner_step_with_paramdict_grad() -> None:
    """The inner step written with `params.grad(..., create_graph=True)` agrees."""
    model = _mlp()
    x = torch.rand(4, 3, dtype=torch.float64)
    y = torch.rand(4, 1, dtype=torch.float64)
    params = ParamDict.from_module(model).detach().requires_grad_()
    inner = ((params.call(model, x) - y) ** 2).mean()
    adapted = params.sub(params.grad(inner, create_graph=True), alpha=0.1)
    outer = ((adapted.call(model, x) - y) ** 2).mean()
    got = params.grad(outer)
    plain = dict(params)
    inner_d = ((functional_call(model, plain, (x,)) - y) ** 2).mean()
    g = torch.autograd.grad(inner_d, list(plain.values()), create_graph=True)
    adapted_d = {k: v - 0.1 * gi for (k, v), gi in zip(plain.items(), g)}
    outer_d = ((functional_call(model, adapted_d, (x,)) - y) ** 2).mean()
    expected = dict(zip(plain, torch.autograd.grad(outer_d, list(plain.values()))))
    _close_keyed(got, expected)


def test_ensemble_with_stacked_paramdicts() -> None:
    """Vmap over stacked ParamDicts equals running each model, as stack_module_state."""
    models = [_mlp(seed) for seed in range(4)]
    x = torch.rand(5, 3, dtype=torch.float64)
    stacked = ParamDict.stack(ParamDict.from_module(m).detach() for m in models)
    params, _ = torch.func.stack_module_state(models)
    for key in params:
        torch.testing.assert_close(stacked[key], params[key])
    base = models[0]
    for run in (
        lambda q: q.call(base, x),
        lambda q: functional_call(base, q, (x,)),
    ):
        out = vmap(run)(stacked)
        expected = torch.stack([m(x) for m in models])
        torch.testing.assert_close(out, expected)
    out_batched = vmap(lambda q, xi: q.call(base, xi))(stacked, x.expand(4, 5, 3))
    torch.testing.assert_close(out_batched, torch.stack([m(x) for m in models]))


def test_per_sample_grads() -> None:
    """vmap(grad) over samples with a ParamDict equals a loop of autograd.grad."""
    model = _mlp()
    x = torch.rand(6, 3, dtype=torch.float64)
    y = torch.rand(6, 1, dtype=torch.float64)
    params = ParamDict.from_module(model).detach()

    def loss(q: ParamDict, xi: Tensor, yi: Tensor) -> Tensor:
        out = q.call(model, xi.unsqueeze(0))
        value: Tensor = ((out - yi.unsqueeze(0)) ** 2).sum()
        return value

    got = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    assert type(got) is ParamDict
    for i in range(6):
        leaf = params.detach().requires_grad_()
        expected = leaf.grad(loss(leaf, x[i], y[i]))
        for key in params:
            torch.testing.assert_close(got[key][i], expected[key])


def test_grad_with_aux_and_argnums_over_paramdicts() -> None:
    """`grad(has_aux=True, argnums=(0, 1))` returns ParamDicts per argument."""
    a = ParamDict(w=torch.tensor([1.0, 2.0], dtype=torch.float64))
    b = ParamDict(v=torch.tensor(3.0, dtype=torch.float64))

    def f(p: ParamDict, q: ParamDict) -> tuple[Tensor, Tensor]:
        out = (p["w"] ** 2).sum() * q["v"]
        return out, out.detach()

    (ga, gb), aux = grad(f, argnums=(0, 1), has_aux=True)(a, b)
    assert type(ga) is ParamDict
    assert type(gb) is ParamDict
    torch.testing.assert_close(ga["w"], 2 * a["w"] * b["v"])
    torch.testing.assert_close(gb["v"], (a["w"] ** 2).sum())
    torch.testing.assert_close(aux, (a["w"] ** 2).sum() * b["v"])


def _fn(p: ParamDict) -> Tensor:
    return p["w"].sin() * p["b"]


def _point() -> ParamDict:
    return ParamDict(
        w=torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
        b=torch.tensor(2.0, dtype=torch.float64),
    )


@pytest.mark.parametrize("jac", [jacrev, jacfwd], ids=["jacrev", "jacfwd"])
def test_jacobians_are_keyed(jac: Callable[..., Any]) -> None:
    """Jacrev and jacfwd of a function of a ParamDict return a keyed Jacobian."""
    p = _point()
    got = jac(_fn)(p)
    assert type(got) is ParamDict
    torch.testing.assert_close(got["w"], torch.diag(p["w"].cos() * p["b"]))
    torch.testing.assert_close(got["b"], p["w"].sin())


def test_vjp_and_jvp_over_paramdicts() -> None:
    """Vjp returns a keyed cotangent; jvp takes a keyed tangent; both match by hand."""
    p = _point()
    out, pullback = vjp(_fn, p)[:2]
    v = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    (cot,) = pullback(v)
    assert type(cot) is ParamDict
    torch.testing.assert_close(cot["w"], v * p["w"].cos() * p["b"])
    torch.testing.assert_close(cot["b"], (v * p["w"].sin()).sum())
    tangent = p.ones_like()
    primal, tan = jvp(_fn, (p,), (tangent,))[:2]
    torch.testing.assert_close(primal, out)
    torch.testing.assert_close(tan, p["w"].cos() * p["b"] + p["w"].sin())


def test_hessian_vector_product_over_a_paramdict() -> None:
    """Jvp of grad (forward over reverse) equals the double-backward HVP."""
    p = _point()

    def scalar(q: ParamDict) -> Tensor:
        return (_fn(q) ** 2).sum()

    tangent = p.ones_like()
    hvp = jvp(grad(scalar), (p,), (tangent,))[1]
    assert type(hvp) is ParamDict
    leaf = p.detach().requires_grad_()
    g = leaf.grad(scalar(leaf), create_graph=True)
    expected = leaf.grad(g.dot(tangent))
    for key in p:
        torch.testing.assert_close(hvp[key], expected[key])


def test_functional_call_under_grad_with_tied_weights() -> None:
    """torch.func.grad through functional_call of a tied model gives the summed grad."""
    torch.manual_seed(0)
    lm = nn.Sequential(nn.Embedding(6, 3), nn.Linear(3, 6, bias=False)).double()
    lm[1].weight = lm[0].weight
    p = ParamDict.from_module(lm).detach()
    tokens = torch.tensor([0, 4])
    got = grad(lambda q: functional_call(lm, q, (tokens,)).sum())(p)
    leaf = p["0.weight"].clone().requires_grad_()
    (expected,) = torch.autograd.grad((leaf[tokens] @ leaf.T).sum(), [leaf])
    torch.testing.assert_close(got["0.weight"], expected)
