"""Shared pieces of the optimizer tests: a small MLP, a fixed data stream, runners."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from paramdict import ParamDict, optim

STEPS = 100
# (rtol, atol) per dtype; atol only matters for entries near zero.
TOLERANCE = {torch.float32: (1e-6, 1e-7), torch.float64: (1e-12, 1e-13)}


def assert_matches(
    actual: Mapping[str, Tensor], expected: Mapping[str, Tensor], dtype: torch.dtype
) -> None:
    """Assert that two keyed results agree within the dtype's tolerance."""
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(dict(actual), dict(expected), rtol=rtol, atol=atol)


def make_model(dtype: torch.dtype = torch.float32) -> nn.Module:
    """Return the same small MLP every time (4 -> 8 -> 3, tanh)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)


def batches(
    dtype: torch.dtype = torch.float32, steps: int = STEPS
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield the same `steps` regression batches every time."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=generator, dtype=dtype)
        y = torch.randn(16, 3, generator=generator, dtype=dtype)
        yield x, y


def forward(params: ParamDict, x: Tensor) -> Tensor:
    """Run the MLP of `make_model` with `params`: the module's own operations."""
    hidden = torch.tanh(F.linear(x, params["0.weight"], params["0.bias"]))
    return F.linear(hidden, params["2.weight"], params["2.bias"])


def run_torch(
    make: Callable[[nn.Module], torch.optim.Optimizer],
    dtype: torch.dtype = torch.float32,
    *,
    steps: int = STEPS,
    max_norm: float | None = None,
    norm_type: float = 2.0,
) -> dict[str, Tensor]:
    """Train with a torch.optim optimizer the usual way; return the parameters."""
    model = make_model(dtype)
    opt = make(model)
    for x, y in batches(dtype, steps):
        opt.zero_grad()
        torch.autograd.backward(F.mse_loss(model(x), y))
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type)
        opt.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def run_ours(
    opt: optim.Optimizer[Any],
    dtype: torch.dtype = torch.float32,
    *,
    steps: int = STEPS,
) -> ParamDict:
    """Train with a paramdict optimizer on keyed params; return the parameters."""
    params = ParamDict.from_module(make_model(dtype))
    state = opt.init(params)
    for x, y in batches(dtype, steps):
        grads = params.grad(F.mse_loss(forward(params, x), y))
        params, state = opt.step(params, grads, state)
    return params
