"""Adafactor: the differentiable mode follows the default one and reaches `lr`."""

from __future__ import annotations

import pytest
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


@pytest.mark.parametrize(
    "shapes", [[(3,), (4,)], [(2, 3), (3, 2)]], ids=["vectors", "matrices"]
)
def test_in_place_step_with_one_kind_of_entry_equals_step(
    shapes: list[tuple[int, ...]],
) -> None:
    """`step_` works when no entry is a matrix, or every one is (one buffer empty)."""
    gen = torch.Generator().manual_seed(0)
    start = ParamDict(
        {f"w{i}": torch.randn(s, generator=gen) for i, s in enumerate(shapes)}
    )
    grads = start.map(lambda v: torch.randn(v.shape, generator=gen))
    opt = optim.Adafactor(lr=0.1)
    want, want_state = start, opt.init(start)
    got, got_state = start.map(torch.clone), opt.init(start)
    for _ in range(3):
        want, want_state = opt.step(want, grads, want_state)
        got, got_state = opt.step_(got, grads, got_state)
    torch.testing.assert_close(dict(got), dict(want), rtol=0, atol=0)
    torch.testing.assert_close(int(got_state.step), 3)
