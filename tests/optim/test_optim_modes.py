"""The two modes of `step`: fresh leaves by default, the graph with differentiable."""

from __future__ import annotations

import gc
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F
from optim_cases import batches, configured, forward, make_model
from torch import Tensor

from paramdict import ParamDict, optim

resource = pytest.importorskip("resource", reason="peak memory is read via resource")


def _tensors(tree: object) -> list[Tensor]:
    leaves = torch.utils._pytree.tree_leaves(tree)
    return [leaf for leaf in leaves if isinstance(leaf, Tensor)]


@pytest.mark.parametrize("opt", configured(combinators=False))
def test_default_step_returns_fresh_leaves(opt: optim.Optimizer[object]) -> None:
    """By default new values are leaves, requiring grad exactly where inputs did."""
    params = ParamDict.from_module(make_model())
    frozen = params["2.bias"].detach()  # a value that does not require grad
    params = params | {"2.bias": frozen}
    before = {k: v.detach().clone() for k, v in params.items()}
    objects = dict(params)
    state = opt.init(params)
    x, y = next(batches())
    for _ in range(2):
        loss = F.mse_loss(forward(params, x), y)
        grads = params.grad(loss, allow_unused=True, create_graph=True)
        new, state = opt.step(params, grads, state)
        assert [v.requires_grad for v in new.values()] == [
            v.requires_grad for v in params.values()
        ]
        assert all(v.is_leaf and v.grad_fn is None for v in new.values())
        assert not any(t.requires_grad for t in _tensors(state))
        params = new
    assert all(objects[k] is not params[k] for k in objects)
    for k, value in objects.items():
        torch.testing.assert_close(value.detach(), before[k], rtol=0, atol=0)


@pytest.mark.parametrize("opt", configured(combinators=False))
def test_step_leaves_its_inputs_unchanged(opt: optim.Optimizer[object]) -> None:
    """`step` changes neither params, grads nor state (values and objects)."""
    params = ParamDict(
        (k, v.detach().clone()) for k, v in ParamDict.from_module(make_model()).items()
    )
    grads = ParamDict((k, torch.randn_like(v)) for k, v in params.items())
    _, state = opt.step(params, grads, opt.init(params))  # non-zero buffers
    snapshot = [t.clone() for t in _tensors((params, grads, state))]
    objects = _tensors((params, grads, state))
    opt.step(params, grads, state)
    after = _tensors((params, grads, state))
    assert all(a is b for a, b in zip(after, objects))
    for a, b in zip(after, snapshot):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_differentiable_step_keeps_the_graph() -> None:
    """With `differentiable=True` the new values depend on the old ones."""
    w = torch.tensor([1.0, -2.0], requires_grad=True)
    params = ParamDict(w=w)
    opt = optim.SGD(lr=0.5, momentum=0.9, differentiable=True)
    state = opt.init(params)
    for _ in range(2):
        grads = params.grad((params["w"] ** 2).sum(), create_graph=True)
        params, state = opt.step(params, grads, state)
    # w2 = w1 - 0.5 * (0.9 * g0 + g1), w1 = w0 - w0 = 0, g = 2 w: w2 = -0.9 w0
    (meta,) = torch.autograd.grad(params["w"].sum(), w)
    torch.testing.assert_close(meta, torch.tensor([-0.9, -0.9]))
    assert state.momentum_buffer["w"].grad_fn is not None


def _inner_loss(values: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    hidden = torch.tanh(F.linear(x, values["0.weight"], values["0.bias"]))
    return F.mse_loss(F.linear(hidden, values["2.weight"], values["2.bias"]), y)


def _reference_adam_meta_grads(
    start: dict[str, Tensor], lr: Tensor, data: list[tuple[Tensor, Tensor]]
) -> tuple[Tensor, ...]:
    """Three Adam steps written out per tensor, then the meta-gradient."""
    beta1, beta2, eps, weight_decay = 0.9, 0.999, 1e-8, 0.01
    names = list(start)
    leaves = [start[k].detach().clone().requires_grad_() for k in names]
    current = list(leaves)
    m = [torch.zeros_like(v) for v in current]
    v = [torch.zeros_like(t) for t in current]
    for t, (x, y) in enumerate(data[:3], start=1):
        loss = _inner_loss(dict(zip(names, current)), x, y)
        grads = torch.autograd.grad(loss, current, create_graph=True)
        new = []
        for i, (p, g) in enumerate(zip(current, grads)):
            g = g + weight_decay * p
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            m_hat = m[i] / (1 - beta1**t)
            denom = torch.sqrt(v[i]) / (1 - beta2**t) ** 0.5 + eps
            new.append(p - lr * m_hat / denom)
        current = new
    meta = _inner_loss(dict(zip(names, current)), *data[3])
    return torch.autograd.grad(meta, [*leaves, lr])


def test_meta_gradient_through_three_adam_steps_matches_reference() -> None:
    """Second order: d(meta-loss)/d(params, lr) through 3 Adam steps, float64."""
    model = make_model(torch.float64)
    start = {k: v.detach() for k, v in model.named_parameters()}
    data = list(batches(torch.float64, steps=4))
    lr = torch.tensor(0.05, dtype=torch.float64, requires_grad=True)

    def meta_loss(params: ParamDict, lr: Tensor) -> Tensor:
        opt = optim.Adam(lr=lr, weight_decay=0.01, differentiable=True)
        state = opt.init(params)
        for x, y in data[:3]:
            grads = params.grad(_inner_loss(params, x, y), create_graph=True)
            params, state = opt.step(params, grads, state)
        return _inner_loss(params, *data[3])

    params = ParamDict((k, v.clone().requires_grad_()) for k, v in start.items())
    got = torch.autograd.grad(meta_loss(params, lr), [*params.values(), lr])
    expected = _reference_adam_meta_grads(start, lr, data)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_meta_sgd_per_key_learning_rates_are_learned() -> None:
    """Meta-SGD: per-entry learning rates get the reference meta-gradient."""
    torch.manual_seed(0)
    w0 = torch.randn(3, dtype=torch.float64)
    x = torch.randn(5, 3, dtype=torch.float64)
    y = torch.randn(5, dtype=torch.float64)
    alpha = torch.full((3,), 0.1, dtype=torch.float64, requires_grad=True)

    def loss_of(w: Tensor) -> Tensor:
        return ((x @ w - y) ** 2).mean()

    params = ParamDict(w=w0.clone().requires_grad_())
    opt = optim.SGD(lr=ParamDict(w=alpha), differentiable=True)
    state = opt.init(params)
    for _ in range(2):
        grads = params.grad(loss_of(params["w"]), create_graph=True)
        params, state = opt.step(params, grads, state)
    (got,) = torch.autograd.grad(loss_of(params["w"]), alpha)

    w = w0.clone().requires_grad_()
    current = w
    for _ in range(2):
        (g,) = torch.autograd.grad(loss_of(current), current, create_graph=True)
        current = current - alpha * g
    (expected,) = torch.autograd.grad(loss_of(current), alpha)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)


def test_torch_func_grad_differentiates_through_steps() -> None:
    """`torch.func.grad` through differentiable steps equals `torch.autograd`."""
    start = ParamDict(
        (k, v.detach())
        for k, v in ParamDict.from_module(make_model(torch.float64)).items()
    )
    data = list(batches(torch.float64, steps=3))
    opt = optim.RMSprop(lr=0.01, momentum=0.5, differentiable=True)

    def meta_loss(params: ParamDict) -> Tensor:
        state = opt.init(params)
        for x, y in data[:2]:
            grads = torch.func.grad(_inner_loss)(params, x, y)
            params, state = opt.step(params, grads, state)
        return _inner_loss(params, *data[2])

    got = torch.func.grad(meta_loss)(start)
    leaves = ParamDict((k, v.clone().requires_grad_()) for k, v in start.items())

    def meta_loss_autograd(params: ParamDict) -> Tensor:
        state = opt.init(params)
        for x, y in data[:2]:
            grads = params.grad(_inner_loss(params, x, y), create_graph=True)
            params, state = opt.step(params, grads, state)
        return _inner_loss(params, *data[2])

    expected = leaves.grad(meta_loss_autograd(leaves))
    torch.testing.assert_close(dict(got), dict(expected), rtol=1e-12, atol=1e-14)


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)  # bytes on macOS


def test_memory_stays_flat_over_5000_steps() -> None:
    """5,000 default-mode steps keep no history: old values die, memory is flat.

    The parameters require grad, so any history kept by `step` would chain every
    step to the previous one (about 16 KiB a step here); fixed gradients keep the
    test fast without changing that.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3)
    )
    params = ParamDict.from_module(model)
    grads = ParamDict((k, torch.randn_like(v) * 1e-3) for k, v in params.items())
    opt = optim.Adam(lr=1e-3)
    state = opt.init(params)
    early: list[weakref.ref[Tensor]] = []
    baseline = 0
    for i in range(5000):
        params, state = opt.step(params, grads, state)
        if i < 3:
            early.extend(weakref.ref(v) for v in params.values())
        if i == 500:
            gc.collect()
            baseline = _peak_rss_bytes()
    gc.collect()
    assert all(v.is_leaf and v.requires_grad for v in params.values())
    assert not any(t.requires_grad for t in _tensors(state))
    assert all(ref() is None for ref in early)  # nothing holds the old values
    growth = _peak_rss_bytes() - baseline
    assert growth < 16 * 2**20, f"peak memory grew by {growth / 2**20:.1f} MiB"


def test_differentiable_steps_keep_old_values_alive() -> None:
    """The control for the test above: a kept graph holds the earlier gradients."""
    params = ParamDict.from_module(make_model())
    x, y = next(batches())
    opt = optim.Adam(lr=1e-3, differentiable=True)
    state = opt.init(params)
    early: list[weakref.ref[Tensor]] = []
    for i in range(3):
        grads = params.grad(F.mse_loss(forward(params, x), y), create_graph=True)
        params, state = opt.step(params, grads, state)
        if i == 0:
            # Adam's second moment needs `g * g`: the graph keeps these gradients.
            early.extend(weakref.ref(v) for v in grads.values())
    del grads
    gc.collect()
    assert all(ref() is not None for ref in early)
    del params, state
    gc.collect()
    assert all(ref() is None for ref in early)
