"""The kernel vocabulary: in-place results are bitwise the functional ones."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from optim_cases import TABLE, batches, forward, make_model, wrapped
from torch import Tensor

from paramdict import ParamDict, optim


def _rates(params: ParamDict) -> dict[str, Any]:
    """A tensor and a per-key learning rate for the same optimizer."""
    return {
        "tensor": torch.tensor(0.01, dtype=torch.float64),
        "per-key": params.full_like(0.01),
    }


def _cases() -> list[Any]:
    cases: list[Any] = []
    for case in TABLE:
        options = {**case.trajectories, f"{case.name}-rich": case.rich}
        cases += [
            pytest.param(case.ours(**kwargs), id=name)
            for name, kwargs in options.items()
        ]
        lrs = _rates(ParamDict.from_module(make_model(torch.float64)))
        cases += [
            pytest.param(case.ours(**{**case.rich, "lr": lr}), id=f"{case.name}-{kind}")
            for kind, lr in lrs.items()
        ]
    return cases + [pytest.param(opt, id=name) for name, opt in wrapped()]


def _clone(tree: Any) -> Any:
    return torch.utils._pytree.tree_map(
        lambda x: x.clone() if isinstance(x, Tensor) else x, tree
    )


@pytest.mark.parametrize("opt", _cases())
def test_in_place_kernels_equal_functional_bitwise(opt: optim.Optimizer[Any]) -> None:
    """Each rule run on `InPlaceKernels` gives the functional result bit for bit."""
    params = ParamDict.from_module(make_model(torch.float64)).detach()
    state = opt.init(params)
    own_params, own_state = _clone(params), _clone(state)
    for x, y in batches(torch.float64, steps=5):
        grads = params.requires_grad_().grad(F.mse_loss(forward(params, x), y))
        params = params.detach()
        grads_before = _clone(grads)
        params, state = opt.step(params, grads, state)
        before = [t.data_ptr() for t in own_params.values()]
        own_params, own_state = opt._update_in_place(own_params, grads, own_state)
        # Written into the same tensors; the gradients are untouched.
        assert [t.data_ptr() for t in own_params.values()] == before
        torch.testing.assert_close(dict(grads), dict(grads_before), rtol=0, atol=0)
    torch.testing.assert_close(dict(own_params), dict(params), rtol=0, atol=0)
    for ours, theirs in zip(
        torch.utils._pytree.tree_leaves(own_state),
        torch.utils._pytree.tree_leaves(state),
    ):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_in_place_state_buffers_are_written_in_place() -> None:
    """The state's buffers come back as the same tensors, updated."""
    params = ParamDict(w=torch.ones(3, dtype=torch.float64))
    opt = optim.Adam(lr=0.1, amsgrad=True)
    state = opt.init(params)
    pointers = [t.data_ptr() for t in state.exp_avg_sq.values()]
    _, new = opt._update_in_place(params, params.ones_like(), state)
    assert [t.data_ptr() for t in new.exp_avg_sq.values()] == pointers
    torch.testing.assert_close(
        new.exp_avg_sq["w"], torch.full((3,), 0.001, dtype=torch.float64)
    )


def test_kernels_accept_rates_in_every_form() -> None:
    """A number, a 0-dim tensor and a per-key ParamDict give the same product."""
    x = ParamDict(w=torch.tensor([1.0, 2.0]), b=torch.tensor([3.0]))
    ops = optim.Kernels.for_params(x)
    by_number = ops.mul(x, 0.5)
    by_tensor = ops.mul(x, torch.tensor(0.5))
    by_key = ops.mul(x, x.full_like(0.5))
    torch.testing.assert_close(dict(by_tensor), dict(by_number))
    torch.testing.assert_close(dict(by_key), dict(by_number))
