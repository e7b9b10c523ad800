"""A run moves between torch.optim and paramdict, both ways, and continues alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from optim_cases import (
    TABLE,
    assert_matches,
    batches,
    forward,
    make_model,
    unfused,
)
from torch import Tensor, nn

from paramdict import ParamDict, optim

HALF = 20
DTYPE = torch.float64


def cases() -> list[Any]:
    """Return `(ours, theirs, kwargs)` for each option set of the table's optimizers."""
    return [
        pytest.param(case.ours, case.theirs, kwargs, id=name)
        for case in TABLE
        if case.classes is None
        for name, kwargs in case.trajectories.items()
    ]


def torch_steps(
    model: nn.Module, opt: torch.optim.Optimizer, data: list[tuple[Tensor, Tensor]]
) -> None:
    """Train `model` with `opt` on `data`, the usual way."""
    for x, y in data:
        opt.zero_grad()
        torch.autograd.backward(F.mse_loss(model(x), y))
        opt.step()


def our_steps(
    opt: optim.Optimizer[Any],
    params: ParamDict,
    state: Any,
    data: list[tuple[Tensor, Tensor]],
) -> tuple[ParamDict, Any]:
    """Train `params` with `opt` on `data`; return the parameters and state."""
    for x, y in data:
        grads = params.grad(F.mse_loss(forward(params, x), y))
        params, state = opt.step(params, grads, state)
    return params, state


def settings(ours: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Return the paramdict settings of a torch option set (the rule, not fused)."""
    return {**kwargs, **unfused(ours)}


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), cases())
def test_torch_run_continues_in_paramdict(
    ours: Callable[..., Any], theirs: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    """Torch steps, then paramdict steps from the loaded state, equal torch's run."""
    data = list(batches(DTYPE, 2 * HALF))
    reference = make_model(DTYPE)
    torch_steps(reference, theirs(reference.parameters(), **kwargs), data)

    model = make_model(DTYPE)
    first = theirs(model.parameters(), **kwargs)
    torch_steps(model, first, data[:HALF])
    opt = ours(**settings(ours, kwargs))
    params = ParamDict.from_module(model).detach().requires_grad_()
    state = optim.load_torch_state_dict(opt, first.state_dict(), params, model)
    params, _ = our_steps(opt, params, state, data[HALF:])
    assert_matches(params, dict(reference.named_parameters()), DTYPE)


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), cases())
def test_paramdict_run_continues_in_torch(
    ours: Callable[..., Any], theirs: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    """Paramdict steps, then torch steps from the exported state, equal torch's run."""
    data = list(batches(DTYPE, 2 * HALF))
    reference = make_model(DTYPE)
    torch_steps(reference, theirs(reference.parameters(), **kwargs), data)

    opt = ours(**settings(ours, kwargs))
    params = ParamDict.from_module(make_model(DTYPE))
    params, state = our_steps(opt, params, opt.init(params), data[:HALF])
    model = make_model(DTYPE)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])
    second = theirs(model.parameters(), **kwargs)
    second.load_state_dict(optim.to_torch_state_dict(opt, state, model))
    torch_steps(model, second, data[HALF:])
    assert_matches(
        dict(model.named_parameters()), dict(reference.named_parameters()), DTYPE
    )
