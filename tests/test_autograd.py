import pytest
import torch
import torch.nn.functional as F
from _helpers import MyParams
from torch import nn

from paramdict import ParamDict


def _mlp(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 1)).to(dtype)


def test_seed_example_without_tuple_conversions() -> None:
    """The seed's example: keyed gradients equal the tuple-and-zip version."""
    model = _mlp()
    x, y = torch.randn(8, 1), torch.randn(8, 1)
    params = ParamDict.from_module(model)

    def calculate_loss(params: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(torch.func.functional_call(model, params, (x,)), y)

    grads = params.grad(calculate_loss(params))

    plain: dict[str, torch.Tensor] = dict(model.named_parameters())
    tuple_grads = torch.autograd.grad(calculate_loss(plain), tuple(plain.values()))
    reference = dict(zip(plain.keys(), tuple_grads))

    assert type(grads) is ParamDict
    assert list(grads) == list(reference)
    for k in reference:
        torch.testing.assert_close(grads[k], reference[k])


def test_grad_of_non_scalar_with_grad_outputs() -> None:
    """`grad_outputs` is passed through as the vector in the vector-Jacobian product."""
    w = torch.randn(3, requires_grad=True)
    p = ParamDict(w=w)
    v = torch.tensor([1.0, 2.0, 3.0])
    out = p.grad(w * 2, grad_outputs=v)
    torch.testing.assert_close(out["w"], 2 * v)


def test_grad_keeps_subclass_and_order() -> None:
    """The gradient ParamDict has the subclass type and key order of `self`."""
    p = MyParams(
        b=torch.ones(2, requires_grad=True), a=torch.ones(1, requires_grad=True)
    )
    g = p.grad(p["a"].sum() * 3 + p["b"].sum())
    assert type(g) is MyParams
    assert list(g) == ["b", "a"]


def test_frozen_entry_is_an_error_naming_it_before_any_work() -> None:
    """An entry that does not require grad is named; the graph is kept for a retry."""
    w = torch.ones(2, requires_grad=True)
    p = ParamDict(w=w, frozen=torch.ones(2), also=torch.zeros(1))
    loss = (w * p["frozen"]).sum()
    with pytest.raises(ValueError, match=r"\['also', 'frozen'\].*do not require grad"):
        p.grad(loss)
    g = p.grad(loss, allow_unused=True)
    torch.testing.assert_close(g["w"], torch.ones(2))
    torch.testing.assert_close(g["frozen"], torch.zeros(2))
    torch.testing.assert_close(g["also"], torch.zeros(1))


def test_unused_entry_is_an_error_or_zeros() -> None:
    """An entry `loss` does not reach is named, or gets zeros with `allow_unused`."""
    a = torch.ones(2, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    p = ParamDict(a=a, b=b)
    with pytest.raises(ValueError, match=r"does not depend on \['b'\].*allow_unused"):
        p.grad((a * 2).sum())
    g = p.grad((a * 2).sum(), allow_unused=True)
    torch.testing.assert_close(g["b"], torch.zeros(3))
    torch.testing.assert_close(g["a"], torch.full((2,), 2.0))


def _meta_gradient_reference(
    model: nn.Module,
    xs: torch.Tensor,
    ys: torch.Tensor,
    xq: torch.Tensor,
    yq: torch.Tensor,
    lr: float,
    first_order: bool,
) -> list[torch.Tensor]:
    """MAML meta-gradient with tuples and an explicit forward, no ParamDict."""
    w1, b1, w2, b2 = (p for _, p in model.named_parameters())

    def forward(
        x: torch.Tensor,
        w1: torch.Tensor,
        b1: torch.Tensor,
        w2: torch.Tensor,
        b2: torch.Tensor,
    ) -> torch.Tensor:
        return torch.relu(x @ w1.T + b1) @ w2.T + b2

    inner = ((forward(xs, w1, b1, w2, b2) - ys) ** 2).mean()
    grads = torch.autograd.grad(inner, (w1, b1, w2, b2), create_graph=not first_order)
    fast = [w - lr * g for w, g in zip((w1, b1, w2, b2), grads)]
    outer = ((forward(xq, *fast) - yq) ** 2).mean()
    return list(torch.autograd.grad(outer, (w1, b1, w2, b2)))


@pytest.mark.parametrize("first_order", [False, True])
def test_maml_meta_gradient_matches_plain_torch(first_order: bool) -> None:
    """MAML meta-gradients (both orders) equal the plain-torch ones in float64."""
    model = _mlp(torch.float64)
    gen = torch.Generator().manual_seed(3)
    xs = torch.rand(10, 1, generator=gen, dtype=torch.float64) * 10 - 5
    xq = torch.rand(10, 1, generator=gen, dtype=torch.float64) * 10 - 5
    ys, yq = 2 * torch.sin(xs - 0.5), 2 * torch.sin(xq - 0.5)
    lr = 0.01

    params = ParamDict.from_module(model)
    inner = F.mse_loss(params.call(model, xs), ys)
    fast = params - lr * params.grad(inner, create_graph=not first_order)
    meta = params.grad(F.mse_loss(fast.call(model, xq), yq))

    reference = _meta_gradient_reference(model, xs, ys, xq, yq, lr, first_order)
    for got, want in zip(meta.values(), reference):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_second_order_differs_from_first_order() -> None:
    """The second-order term is present: the two meta-gradients differ measurably."""
    model = _mlp(torch.float64)
    gen = torch.Generator().manual_seed(4)
    xs = torch.rand(10, 1, generator=gen, dtype=torch.float64) * 10 - 5
    xq = torch.rand(10, 1, generator=gen, dtype=torch.float64) * 10 - 5
    ys, yq = 3 * torch.sin(xs - 1.0), 3 * torch.sin(xq - 1.0)
    params = ParamDict.from_module(model)

    def meta(create_graph: bool) -> ParamDict:
        inner = F.mse_loss(params.call(model, xs), ys)
        fast = params - 0.5 * params.grad(inner, create_graph=create_graph)
        return params.grad(F.mse_loss(fast.call(model, xq), yq))

    second, first = meta(True), meta(False)
    diff = (second - first).abs()
    assert max(v.max().item() for v in diff.values()) > 1e-6


def test_backward_accumulates_and_returns_grads() -> None:
    """`backward` accumulates into `.grad` like torch and returns those tensors."""
    w = torch.ones(2, requires_grad=True)
    other = torch.ones(1, requires_grad=True)
    p = ParamDict(w=w)
    loss = (w * 3).sum() + other.sum()
    g = p.backward(loss, retain_graph=True)
    assert g["w"] is w.grad
    torch.testing.assert_close(w.grad, torch.full((2,), 3.0))
    assert other.grad is None  # only the listed inputs receive gradients
    g = p.backward(loss)
    torch.testing.assert_close(g["w"], torch.full((2,), 6.0))


def test_backward_frozen_entry_refused_before_accumulating() -> None:
    """A frozen entry is named and nothing is accumulated anywhere."""
    w = torch.ones(2, requires_grad=True)
    p = ParamDict(w=w, frozen=torch.ones(2))
    with pytest.raises(ValueError, match=r"\['frozen'\].*do not require grad"):
        p.backward((w * p["frozen"]).sum())
    assert w.grad is None


def test_backward_unreached_entry_named() -> None:
    """An entry the loss does not reach is named in the error."""
    a = torch.ones(2, requires_grad=True)
    b = torch.ones(2, requires_grad=True)
    with pytest.raises(ValueError, match=r"does not reach \['b'\]"):
        ParamDict(a=a, b=b).backward(a.sum())
    assert b.grad is None


@pytest.mark.filterwarnings(
    "ignore:Using backward\\(\\) with create_graph=True:UserWarning"
)
def test_backward_with_grad_outputs_and_create_graph() -> None:
    """`grad_outputs` and `create_graph` behave as in `torch.autograd.backward`."""
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    p = ParamDict(w=w)
    g = p.backward(w**3, grad_outputs=torch.ones(2), create_graph=True)
    assert g["w"].requires_grad
    torch.testing.assert_close(g["w"], 3 * w.detach() ** 2)


def test_other_autograd_errors_pass_through_unchanged() -> None:
    """A loss outside the graph is torch's own error; a frozen entry is ours alone."""
    p = ParamDict(w=torch.ones(2, requires_grad=True))
    with pytest.raises(RuntimeError, match="does not require grad"):
        p.grad(torch.ones(()))
    q = p | {"frozen": torch.ones(2)}
    with pytest.raises(ValueError, match=r"\['frozen'\]") as info:
        q.grad((q["w"] * q["frozen"]).sum())
    assert info.value.__suppress_context__
