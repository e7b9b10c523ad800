"""`differentiable=True` gives torch.optim's `differentiable=True` step, bit for bit.

torch's differentiable steps run its single-tensor arithmetic: Adam's bias
corrections on its float32 step tensor, NAdam's step sizes as 0-dim tensors of
its `mu_product`, RAdam's per-tensor products, the rest with the step and the
rates read as numbers. Six steps of every optimizer torch lets differentiate,
with weight decay, `maximize` and each option that changes the arithmetic, on
entries of several shapes (a 0-dim one among them), in float32 and float64; the
parameters and every buffer of the state equal torch's exactly (but Adam's
float64 parameters, whose bias corrections stay float64, 1e-7 from torch's).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from paramdict import ParamDict, optim

SHAPES = {"w": (4, 3), "b": (3,), "s": ()}
STEPS = 6

CASES: list[tuple[str, dict[str, Any]]] = [
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "maximize": True}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.01}),
    ("Adam", {"lr": 0.01, "amsgrad": True, "maximize": True}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.1}),
    ("NAdam", {"lr": 0.01, "weight_decay": 0.01}),
    ("NAdam", {"lr": 0.01, "decoupled_weight_decay": True, "weight_decay": 0.1}),
    ("RAdam", {"lr": 0.01, "weight_decay": 0.01}),
    ("RAdam", {"lr": 0.01, "decoupled_weight_decay": True, "weight_decay": 0.1}),
    ("Adamax", {"lr": 0.01, "weight_decay": 0.01}),
    ("RMSprop", {"lr": 0.01, "momentum": 0.9, "centered": True}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.01}),
    ("Adadelta", {"lr": 1.0, "weight_decay": 0.01}),
    ("ASGD", {"lr": 0.01, "weight_decay": 0.01}),
    ("Rprop", {"lr": 0.01, "maximize": True}),
]


def _data(dtype: torch.dtype) -> tuple[dict[str, Tensor], list[dict[str, Tensor]]]:
    gen = torch.Generator().manual_seed(0)
    start = {k: torch.randn(s, generator=gen, dtype=dtype) for k, s in SHAPES.items()}
    grads = [
        {k: torch.randn(s, generator=gen, dtype=dtype) for k, s in SHAPES.items()}
        for _ in range(STEPS)
    ]
    return start, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("name", "options"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)]
)
def test_differentiable_step_is_torch_s(
    name: str, options: dict[str, Any], dtype: torch.dtype
) -> None:
    """Six differentiable steps: torch's parameters and state, bitwise."""
    start, grads = _data(dtype)
    leaves = [start[k].clone().requires_grad_() for k in SHAPES]
    theirs = [leaf.clone() for leaf in leaves]  # not leaves: torch writes into them
    reference = getattr(torch.optim, name)(theirs, differentiable=True, **options)
    for g in grads:
        for t, k in zip(theirs, SHAPES):
            t.grad = g[k].clone()
        reference.step()

    opt = getattr(optim, name)(differentiable=True, **options)
    params = ParamDict({k: start[k].clone().requires_grad_() for k in SHAPES})
    state = opt.init(params)
    for g in grads:
        params, state = opt.step(params, ParamDict(g), state)

    # torch's Adam rounds its bias corrections to float32 (its step tensor's
    # dtype) for float64 parameters too; paramdict keeps float64 there, so that
    # a meta-gradient in float64 keeps float64's precision: about 1e-7 apart.
    exact = not (name in ("Adam", "AdamW") and dtype == torch.float64)
    for key, t in zip(SHAPES, theirs):
        assert params[key].grad_fn is not None, key  # recorded, as torch's
        if exact:
            assert torch.equal(params[key].detach(), t.detach()), key
        else:
            torch.testing.assert_close(
                params[key].detach(), t.detach(), rtol=1e-5, atol=1e-6
            )
    torch_state = optim.to_torch_state_dict(opt, state, [list(SHAPES)])
    expected = reference.state_dict()["state"]
    for index, fields in torch_state["state"].items():
        for field, value in fields.items():
            want = expected[index][field]
            if isinstance(value, Tensor) and exact:
                assert torch.equal(value.detach().to(want.dtype), want.detach()), (
                    index,
                    field,
                )
            elif isinstance(value, Tensor):
                torch.testing.assert_close(
                    value.detach().to(want.dtype), want.detach(), rtol=1e-5, atol=1e-6
                )
