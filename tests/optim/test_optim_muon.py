"""Muon: meta-gradients through differentiable steps, per-tensor reference."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from _torch_versions import needs_torch
from optim_cases import TorchMuon, batches, make_model
from torch import Tensor

from paramdict import ParamDict, optim

WEIGHTS = ("0.weight", "2.weight")


def _loss(
    weights: Mapping[str, Tensor], biases: Mapping[str, Tensor], x: Tensor, y: Tensor
) -> Tensor:
    hidden = torch.tanh(F.linear(x, weights["0.weight"], biases["0.bias"]))
    return F.mse_loss(F.linear(hidden, weights["2.weight"], biases["2.bias"]), y)


def _newton_schulz(g: Tensor, steps: int = 5) -> Tensor:
    """torch.optim.Muon's orthogonalization, written out for one matrix."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.bfloat16()
    tall = g.shape[0] > g.shape[1]
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return (x.T if tall else x).to(g.dtype)


def _reference(
    start: dict[str, Tensor],
    biases: dict[str, Tensor],
    lr: Tensor,
    data: list[tuple[Tensor, Tensor]],
) -> tuple[Tensor, ...]:
    """Three Nesterov Muon steps per tensor, then the meta-gradient."""
    momentum, weight_decay = 0.9, 0.05
    leaves = [start[k].detach().clone().requires_grad_() for k in WEIGHTS]
    current = list(leaves)
    buffers = [torch.zeros_like(p) for p in current]
    for x, y in data[:3]:
        loss = _loss(dict(zip(WEIGHTS, current)), biases, x, y)
        grads = torch.autograd.grad(loss, current, create_graph=True)
        new = []
        for i, (p, g) in enumerate(zip(current, grads)):
            buffers[i] = buffers[i] + (1 - momentum) * (g - buffers[i])
            update = _newton_schulz(g + momentum * (buffers[i] - g))
            ratio = math.sqrt(max(1, p.shape[0] / p.shape[1]))
            new.append(p * (1 - lr * weight_decay) - lr * ratio * update)
        current = new
    meta = _loss(dict(zip(WEIGHTS, current)), biases, *data[3])
    return torch.autograd.grad(meta, [*leaves, lr])


def test_meta_gradient_through_three_muon_steps_matches_reference() -> None:
    """Second order: d(meta-loss)/d(weights, lr) through 3 Muon steps, float64."""
    model = make_model(torch.float64)
    named = {k: v.detach() for k, v in model.named_parameters()}
    start = {k: named[k] for k in WEIGHTS}
    biases = {k: v for k, v in named.items() if k not in WEIGHTS}
    data = list(batches(torch.float64, steps=4))
    lr = torch.tensor(0.02, dtype=torch.float64, requires_grad=True)
    opt = optim.Muon(lr=lr, momentum=0.9, weight_decay=0.05, differentiable=True)

    params = ParamDict((k, v.clone().requires_grad_()) for k, v in start.items())
    current, state = params, opt.init(params)
    for x, y in data[:3]:
        grads = current.grad(_loss(current, biases, x, y), create_graph=True)
        current, state = opt.step(current, grads, state)
    got = torch.autograd.grad(_loss(current, biases, *data[3]), [*params.values(), lr])
    expected = _reference(start, biases, lr, data)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_muon_on_matrices_adamw_on_the_rest() -> None:
    """The documented recipe: Muon for "*.weight", AdamW for the rest, as torch."""
    model = make_model(torch.float64)
    opt: optim.ParamGroups[Any] = optim.ParamGroups(
        {"*.weight": optim.Muon(lr=0.02)}, default=optim.AdamW(lr=3e-4)
    )
    params = ParamDict.from_module(model)
    state = opt.init(params)
    matrices = [p for p in model.parameters() if p.dim() == 2]
    others = [p for p in model.parameters() if p.dim() != 2]
    muon: dict[str, Any] = {"lr": 0.02}  # TorchMuon is typed as torch's base class
    theirs = [TorchMuon(matrices, **muon), torch.optim.AdamW(others, lr=3e-4)]
    for x, y in batches(torch.float64, steps=10):
        loss = _loss(params, params, x, y)
        params, state = opt.step(params, params.grad(loss), state)
        for t in theirs:
            t.zero_grad()
        named = dict(model.named_parameters())
        torch.autograd.backward(_loss(named, named, x, y))
        for t in theirs:
            t.step()
    expected = {k: v.detach() for k, v in model.named_parameters()}
    torch.testing.assert_close(dict(params), expected, rtol=1e-12, atol=1e-13)


def test_spectral_unclamped_scales_by_the_unclamped_shape_ratio() -> None:
    """`spectral_unclamped` takes `lr * sqrt(rows / cols)`, below 1 when wide."""
    start = ParamDict(wide=torch.randn(2, 8, dtype=torch.float64))
    grads = ParamDict(wide=torch.randn(2, 8, dtype=torch.float64))

    def moved(adjust_lr_fn: str | None) -> Tensor:
        opt = optim.Muon(lr=0.1, weight_decay=0.0, adjust_lr_fn=adjust_lr_fn)
        new, _ = opt.step(start, grads, opt.init(start))
        return start["wide"] - new["wide"]

    # `original` clamps the ratio at 1 for a wide matrix; the unclamped one is 1/2.
    torch.testing.assert_close(moved("spectral_unclamped"), moved("original") / 2)


@needs_torch(2, 14, "torch.optim.Muon(adjust_lr_fn='spectral_unclamped')")
def test_spectral_unclamped_equals_torch() -> None:
    """Five steps equal torch.optim.Muon with the same adjustment."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    grads = [torch.randn(3, 5, generator=gen, dtype=torch.float64) for _ in range(5)]
    param = start.clone().requires_grad_()
    theirs = torch.optim.Muon([param], lr=0.05, adjust_lr_fn="spectral_unclamped")
    opt = optim.Muon(lr=0.05, adjust_lr_fn="spectral_unclamped")
    params = ParamDict(w=start.clone())
    state = opt.init(params)
    for g in grads:
        param.grad = g.clone()
        theirs.step()  # type: ignore[no-untyped-call]  # torch's annotation
        params, state = opt.step(params, ParamDict(w=g), state)
    torch.testing.assert_close(params["w"], param.detach(), rtol=1e-12, atol=1e-14)
