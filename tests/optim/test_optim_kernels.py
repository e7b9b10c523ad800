"""The kernel vocabulary: in-place results are bitwise the functional ones."""

from __future__ import annotations

import gc
import weakref
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
        # A schedule that cycles the momentum or first beta where there is one.
        config = case.ours(**case.rich)
        cycles = hasattr(config, "betas") or getattr(config, "momentum", 0) > 0
        schedule: optim.LRSchedule = (
            optim.OneCycleLR(max_lr=0.05, total_steps=10)
            if cycles
            else optim.StepLR(base_lr=0.05, step_size=2, gamma=0.5)
        )
        scheduled = case.ours(**{**case.rich, "lr": schedule})
        cases.append(pytest.param(scheduled, id=f"{case.name}-scheduled"))
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
        with torch.no_grad():  # the functional vocabulary, as `step` ran it before
            params, state = opt.update(
                params, grads, state, optim.Kernels.for_params(params)
            )
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


def _matrix_kernel_calls(ops: optim.Kernels, x: ParamDict, y: ParamDict) -> ParamDict:
    """Muon's and Adafactor's kernels, each consuming its first operand."""
    x = ops.orthogonalize(x, (3.4445, -4.7750, 2.0315), 5, 1e-7)
    x = ops.sub_scaled_by_key(x, y, {"w": 0.25, "v": torch.tensor(0.5).double()})
    return ops.apply(x, lambda a, b: a * b.abs().sqrt(), y)


def test_new_kernels_in_place_equal_functional_and_recorded_bitwise() -> None:
    """`orthogonalize`, `sub_scaled_by_key`, `apply`: one result in three modes."""
    torch.manual_seed(0)
    x = ParamDict(w=torch.randn(4, 3).double(), v=torch.randn(2, 5).double())
    y = ParamDict((k, torch.randn_like(v)) for k, v in x.items())
    functional = _matrix_kernel_calls(optim.Kernels.for_params(x), x, y)
    recorded = _matrix_kernel_calls(optim.RecordedKernels.for_params(x), x, y)
    ops = optim.InPlaceKernels.for_params(x)
    assert isinstance(ops, optim.InPlaceKernels)
    owned = _clone(x)
    pointers = [t.data_ptr() for t in owned.values()]
    ops.own(owned)
    in_place = _matrix_kernel_calls(ops, owned, y)
    assert [t.data_ptr() for t in in_place.values()] == pointers
    for other in (recorded, in_place):
        torch.testing.assert_close(dict(other), dict(functional), rtol=0, atol=0)


def _kernel_calls() -> list[Any]:
    """The kernels added for NAdam ... ASGD, each as `call(ops, x, y)`."""
    return [
        pytest.param(lambda ops, x, y: ops.abs(x), id="abs"),
        pytest.param(lambda ops, x, y: ops.reciprocal(x), id="reciprocal"),
        pytest.param(lambda ops, x, y: ops.clamp(x, -0.5, 0.25), id="clamp"),
        pytest.param(lambda ops, x, y: ops.div(x, y), id="div-per-key"),
        pytest.param(
            lambda ops, x, y: ops.masked_fill(x, ops.eq(y.sign(), 0.0), 4.0),
            id="masked-eq",
        ),
    ]


@pytest.mark.parametrize("call", _kernel_calls())
def test_new_kernels_in_place_equal_functional_bitwise(call: Any) -> None:
    """A kernel writes into an owned operand exactly the functional result."""
    gen = torch.Generator().manual_seed(0)
    x = ParamDict(
        w=torch.randn(4, 3, generator=gen, dtype=torch.float64),
        b=torch.randn(3, generator=gen, dtype=torch.float64),
    )
    y = x.map(lambda v: torch.randn(v.shape, generator=gen, dtype=v.dtype))
    y = y | {"b": torch.tensor([0.0, -1.0, 2.0], dtype=torch.float64)}
    expected = call(optim.Kernels.for_params(x), x, y)
    recorded = call(optim.RecordedKernels.for_params(x), x, y)
    owned = _clone(x)
    ops = optim.InPlaceKernels(torch.float64, torch.device("cpu"))
    ops.own(owned)
    pointers = [t.data_ptr() for t in owned.values()]
    got = call(ops, owned, y)
    assert [t.data_ptr() for t in got.values()] == pointers
    torch.testing.assert_close(dict(got), dict(expected), rtol=0, atol=0)
    torch.testing.assert_close(dict(recorded), dict(expected), rtol=0, atol=0)


def test_in_place_kernels_keep_no_temporary_alive() -> None:
    """A temporary of the step is freed when the rule drops it, as torch's are.

    The kernels list what they own and what they wrote into by weak reference:
    a listed temporary kept alive to the end of the step held Adafactor's
    squared gradients beside its update (1.49x torch's peak memory of a 20-step
    loop at 50 x 400,000; now 1.00x). A dead object's id, reused, is not owned.
    """
    params = ParamDict(w=torch.ones(3), b=torch.ones(2))
    ops = optim.InPlaceKernels(torch.float32, torch.device("cpu"))
    ops.own(params)
    squared = ops.mul(ops.borrowed(params), params)  # made by the step: owned
    memory = weakref.ref(squared["w"])
    params = ops.lerp(params, squared, 0.5)  # reads it, writes into `params`
    del squared
    gc.collect()
    assert memory() is None

    # Owned and spent are about the object itself: a dead one listed under the
    # id another object now has (CPython reuses ids) does not make it owned.
    dead = ParamDict(w=torch.zeros(3), b=torch.zeros(2))
    dead_ref = weakref.ref(dead)
    del dead
    gc.collect()
    stranger = ParamDict(w=torch.zeros(3), b=torch.zeros(2))
    ops._owned[id(stranger)] = dead_ref
    ops._spent[id(stranger)] = dead_ref
    kept = stranger["w"].clone()
    ops.mul(stranger, 3.0)  # neither refused as spent nor written as owned
    torch.testing.assert_close(stranger["w"], kept)
