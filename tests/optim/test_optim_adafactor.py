"""Adafactor: the differentiable mode follows the default one and reaches `lr`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from optim_cases import batches, forward, make_model

from paramdict import ParamDict, optim


def test_differentiable_steps_equal_default_and_reach_the_learning_rate() -> None:
    """3 differentiable float64 steps give the default values and d(loss)/d(lr)."""
    start = ParamDict.from_module(make_model(torch.float64)).detach()
    data = list(batches(torch.float64, steps=4))
    lr = torch.tensor(0.01, dtype=torch.float64, requires_grad=True)
    results = []
    for differentiable in (False, True):
        opt = optim.Adafactor(
            lr=lr, weight_decay=0.01, d=1.5, differentiable=differentiable
        )
        params = start.requires_grad_()
        state = opt.init(params)
        for x, y in data[:3]:
            loss = F.mse_loss(forward(params, x), y)
            grads = params.grad(loss, create_graph=differentiable)
            params, state = opt.step(params, grads, state)
        results.append(params)
    default, recorded = results
    torch.testing.assert_close(
        dict(recorded.detach()), dict(default.detach()), rtol=1e-12, atol=1e-14
    )
    (meta,) = torch.autograd.grad(
        F.mse_loss(forward(recorded, *data[3][:1]), data[3][1]), lr
    )
    assert meta.isfinite()
    assert meta != 0
