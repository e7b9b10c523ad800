"""Second order: meta-gradients through differentiable steps equal torch.optim's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from optim_cases import TABLE, batches, make_model
from torch import Tensor

from paramdict import ParamDict, optim


@pytest.fixture(autouse=True)
def _double_default() -> Iterator[None]:
    """torch.optim keeps some scalar state in the default dtype: make it float64."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _loss(values: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    hidden = torch.tanh(F.linear(x, values["0.weight"], values["0.bias"]))
    return F.mse_loss(F.linear(hidden, values["2.weight"], values["2.bias"]), y)


def _torch_meta_gradient(
    make: Callable[[list[Tensor]], torch.optim.Optimizer],
    start: dict[str, Tensor],
    data: list[tuple[Tensor, Tensor]],
) -> list[Tensor]:
    """Three steps of torch.optim with `differentiable=True`, then d(meta)/d(start).

    torch.optim writes into its parameters and buffers; each step gets fresh
    copies of both, so the graph of earlier steps is never overwritten.
    """
    names = list(start)
    leaves = [v.clone().requires_grad_() for v in start.values()]
    current = [v.clone() for v in leaves]
    opt = make(current)
    for x, y in data[:3]:
        grads = torch.autograd.grad(
            _loss(dict(zip(names, current)), x, y), current, create_graph=True
        )
        stepped = [v.clone() for v in current]
        for old, new, grad in zip(current, stepped, grads):
            if old in opt.state:
                buffers = opt.state.pop(old).items()
                opt.state[new] = {k: v.clone() for k, v in buffers}
            new.grad = grad
        opt.param_groups[0]["params"] = stepped
        opt.step()
        current = stepped
    return list(torch.autograd.grad(_loss(dict(zip(names, current)), *data[3]), leaves))


def _our_meta_gradient(
    opt: optim.Optimizer[Any],
    start: dict[str, Tensor],
    data: list[tuple[Tensor, Tensor]],
) -> list[Tensor]:
    leaves = ParamDict((k, v.clone().requires_grad_()) for k, v in start.items())
    params, state = leaves, opt.init(leaves)
    for x, y in data[:3]:
        grads = params.grad(_loss(params, x, y), create_graph=True)
        params, state = opt.step(params, grads, state)
    return list(leaves.grad(_loss(params, *data[3])).values())


def _rows() -> list[Any]:
    return [
        pytest.param(case.ours, case.theirs, options, id=name, marks=case.mark(name))
        for case in TABLE
        if case.second_order
        for name, options in {
            **case.trajectories,
            f"{case.name}-rich": case.rich,
        }.items()
    ]


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), _rows())
def test_meta_gradient_through_three_steps_matches_torch(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
) -> None:
    """d(meta-loss)/d(params) through 3 differentiable steps equals torch.optim's."""
    start = {k: v.detach() for k, v in make_model(torch.float64).named_parameters()}
    data = list(batches(torch.float64, steps=4))
    expected = _torch_meta_gradient(
        lambda ps: theirs(ps, differentiable=True, **kwargs), start, data
    )
    got = _our_meta_gradient(ours(differentiable=True, **kwargs), start, data)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
