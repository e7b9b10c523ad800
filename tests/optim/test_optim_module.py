"""`step_module`: one training step on an nn.Module, updating it in place."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from optim_cases import assert_matches, batches, make_model, run_torch
from torch import Tensor

from paramdict import ParamDict, optim


def _loss(model: torch.nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return F.mse_loss(model(x), y)


def test_step_module_trains_like_torch_optim() -> None:
    """100 `step_module` calls leave the module as torch.optim.Adam would."""
    model = make_model()
    originals = dict(model.named_parameters())
    opt = optim.Adam(lr=0.01, weight_decay=0.1)
    state = opt.init(ParamDict.from_module(model))
    for x, y in batches():
        loss, state = opt.step_module(
            model, functools.partial(_loss, model, x, y), state
        )
        assert loss.grad_fn is None
    expected = run_torch(
        lambda m: torch.optim.Adam(m.parameters(), lr=0.01, weight_decay=0.1)
    )
    assert_matches(ParamDict.from_module(model), expected, torch.float32)
    # The very same Parameter objects, updated in place; `.grad` never touched.
    assert all(p is originals[k] for k, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters())


def test_step_module_returns_the_loss_before_the_step() -> None:
    """The loss is the one computed before the update, detached."""
    model = make_model()
    x, y = next(batches())
    expected = F.mse_loss(model(x), y).detach()
    opt = optim.SGD(lr=0.1)
    loss, _ = opt.step_module(
        model, lambda: F.mse_loss(model(x), y), opt.init(ParamDict.from_module(model))
    )
    torch.testing.assert_close(loss, expected)
    assert F.mse_loss(model(x), y) < loss


def test_step_module_leaves_frozen_parameters_and_buffers_alone() -> None:
    """Parameters that do not require grad and buffers are not stepped."""
    linear, norm = torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)
    model = torch.nn.Sequential(linear, norm)
    linear.bias.requires_grad_(False)
    frozen = linear.bias.detach().clone()
    assert norm.running_mean is not None
    stats = norm.running_mean.clone()
    trainable = ParamDict.from_module(model).trainable()
    opt = optim.SGD(lr=0.1, weight_decay=0.5)
    state = opt.init(trainable)
    x = torch.randn(8, 3)
    weight = linear.weight.detach().clone()
    _, state = opt.step_module(model, lambda: model(x).pow(2).mean(), state)
    torch.testing.assert_close(linear.bias.detach(), frozen, rtol=0, atol=0)
    assert not torch.equal(linear.weight.detach(), weight)
    # BatchNorm updated its running mean in the forward pass, not in the step.
    assert not torch.equal(norm.running_mean, stats)
    assert list(state.momentum_buffer) == []
    assert int(state.step) == 1


def test_step_module_refuses_a_differentiable_optimizer() -> None:
    """Writing into a module cuts the graph, so differentiable=True is refused."""
    model = make_model()
    opt = optim.SGD(differentiable=True)
    state = opt.init(ParamDict.from_module(model))
    with pytest.raises(ValueError, match="needs `differentiable=False`"):
        opt.step_module(model, lambda: model(torch.ones(1, 4)).sum(), state)
