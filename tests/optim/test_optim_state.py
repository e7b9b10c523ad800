"""Optimizer states: typed pytrees that round-trip through torch.save and pytree."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from optim_cases import TABLE, batches, configured, forward, make_model
from torch.utils import _pytree as pytree

from paramdict import ParamDict, optim


def _train(
    opt: optim.Optimizer[Any], params: ParamDict, state: Any, steps: range
) -> tuple[ParamDict, Any]:
    data = list(batches(steps=steps.stop))
    for i in steps:
        x, y = data[i]
        grads = params.grad(F.mse_loss(forward(params, x), y))
        params, state = opt.step(params, grads, state)
    return params, state


def _roundtrip(value: object) -> Any:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("opt", configured())
def test_state_loads_with_weights_only(opt: optim.Optimizer[Any]) -> None:
    """A state saved with torch.save loads with weights_only=True, same type."""
    params = ParamDict.from_module(make_model())
    _, state = _train(opt, params, opt.init(params), range(3))
    loaded = _roundtrip(state)
    assert type(loaded) is type(state)
    assert pytree.tree_structure(loaded) == pytree.tree_structure(state)
    for a, b in zip(pytree.tree_leaves(loaded), pytree.tree_leaves(state)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("opt", configured())
def test_training_resumes_from_a_loaded_state(opt: optim.Optimizer[Any]) -> None:
    """5 steps, save and load, 5 more steps: the same as 10 steps straight."""
    start = ParamDict.from_module(make_model())
    straight, _ = _train(opt, start, opt.init(start), range(10))
    half, state = _train(opt, start, opt.init(start), range(5))
    params, state = _roundtrip((half, state))
    params = ParamDict((k, v.requires_grad_()) for k, v in params.items())
    resumed, _ = _train(opt, params, state, range(5, 10))
    torch.testing.assert_close(dict(resumed), dict(straight), rtol=0, atol=0)


@pytest.mark.parametrize("opt", configured())
def test_state_is_a_pytree_of_tensors(opt: optim.Optimizer[Any]) -> None:
    """States flatten to tensors only and unflatten to an equal state."""
    params = ParamDict.from_module(make_model())
    state = opt.init(params)
    leaves, spec = pytree.tree_flatten(state)
    assert leaves
    assert all(isinstance(leaf, torch.Tensor) for leaf in leaves)
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert type(rebuilt) is type(state)
    assert pytree.tree_structure(rebuilt) == spec


@pytest.mark.parametrize("opt", configured(combinators=False))
def test_state_tree_spec_serializes(opt: optim.Optimizer[Any]) -> None:
    """A tree spec holding a state (as torch.export stores one) dumps and loads."""
    params = ParamDict.from_module(make_model())  # Muon's row needs "*weight" keys
    spec = pytree.tree_structure(opt.init(params))
    assert pytree.treespec_loads(pytree.treespec_dumps(spec)) == spec


def test_an_empty_paramdict_steps_to_itself() -> None:
    """An empty ParamDict has a state, and a step returns both unchanged."""
    opt = optim.Adam(amsgrad=True)
    state = opt.init(ParamDict())
    params, new_state = opt.step(ParamDict(), {}, state)
    assert params == ParamDict()
    assert new_state is state


def test_buffers_for_options_that_are_off_are_empty() -> None:
    """Options that are off leave empty ParamDicts, not None, in the state."""
    params = ParamDict(w=torch.zeros(2))
    assert optim.SGD().init(params).momentum_buffer == ParamDict()
    assert optim.Adam().init(params).max_exp_avg_sq == ParamDict()
    state = optim.RMSprop().init(params)
    assert state.momentum_buffer == ParamDict()
    assert state.grad_avg == ParamDict()


def test_adagrad_accumulator_starts_at_the_initial_value() -> None:
    """`initial_accumulator_value` fills the first state, as in torch."""
    params = ParamDict(w=torch.zeros(2, dtype=torch.float64))
    state = optim.Adagrad(initial_accumulator_value=0.25).init(params)
    torch.testing.assert_close(state.sum["w"], torch.full((2,), 0.25).double())


@pytest.mark.parametrize("opt", configured(combinators=False))
def test_vmap_steps_an_ensemble_like_separate_runs(
    opt: optim.Optimizer[Any], request: pytest.FixtureRequest
) -> None:
    """`torch.func.vmap` over init and step trains stacked members independently."""
    bfloat16 = request.node.callspec.id in {c.name for c in TABLE if c.bfloat16}
    rtol, atol = (0.0, 2e-3) if bfloat16 else (None, None)
    members = [
        ParamDict(
            (k, torch.randn_like(v))
            for k, v in ParamDict.from_module(make_model()).items()
        )
        for _ in range(3)
    ]
    grads = [ParamDict((k, torch.randn_like(v)) for k, v in m.items()) for m in members]
    stacked, stacked_grads = ParamDict.stack(members), ParamDict.stack(grads)
    state = torch.func.vmap(opt.init)(stacked)
    for _ in range(2):
        stacked, state = torch.func.vmap(opt.step)(stacked, stacked_grads, state)
    for member, grad, result in zip(members, grads, stacked.unstack()):
        expected, member_state = member, opt.init(member)
        for _ in range(2):
            expected, member_state = opt.step(expected, grad, member_state)
        torch.testing.assert_close(dict(result), dict(expected), rtol=rtol, atol=atol)


def test_adafactor_state_is_factored_for_matrices() -> None:
    """Matrices keep `row_var` and `col_var`, vectors `variance`, as in torch."""
    params = ParamDict(w=torch.zeros(2, 3, 4), b=torch.zeros(4), s=torch.zeros(()))
    state = optim.Adafactor().init(params)
    assert state._fields == ("step", "row_var", "col_var", "variance", "schedule")
    assert state.row_var["w"].shape == (2, 3, 1)
    assert state.col_var["w"].shape == (2, 1, 4)
    assert list(state.variance) == ["b", "s"]
    model = torch.nn.Linear(3, 2)
    theirs = torch.optim.Adafactor(model.parameters())
    torch.autograd.backward(model(torch.ones(1, 3)).sum())
    theirs.step()  # type: ignore[no-untyped-call]  # torch's annotation
    assert set(theirs.state[model.weight]) == {"step", "row_var", "col_var"}
    assert set(theirs.state[model.bias]) == {"step", "variance"}


def test_scalar_state_is_kept_in_torchs_dtype_for_it() -> None:
    """NAdam's `mu_product` and ASGD's `eta`, `mu` follow torch's dtype choice."""
    params = ParamDict(w=torch.zeros(2, dtype=torch.float64))
    grads = params.ones_like()
    opts: list[optim.Optimizer[Any]] = [optim.NAdam(), optim.ASGD()]
    for opt in opts:
        ours = opt.step(params, grads, opt.init(params))[1]
        model = torch.nn.Linear(2, 1).double()
        theirs = type(opt).__name__
        reference = getattr(torch.optim, theirs)(model.parameters())
        model.weight.grad = torch.ones_like(model.weight)
        model.bias.grad = torch.ones_like(model.bias)
        reference.step()
        expected = reference.state[model.weight]
        for field in ("mu_product", "eta", "mu"):
            if field in expected:
                value = getattr(ours, field)
                assert value.dtype == expected[field].dtype, field
                torch.testing.assert_close(value, expected[field], rtol=0, atol=0)


def test_asgd_per_key_learning_rate_keeps_a_per_key_eta() -> None:
    """With a per-key `lr`, ASGD's `eta` is per key, and decays per key."""
    params = ParamDict(w=torch.zeros(2, dtype=torch.float64), b=torch.zeros(1))
    lr = ParamDict(w=torch.tensor(0.1, dtype=torch.float64), b=torch.tensor(0.2))
    opt = optim.ASGD(lr=lr, lambd=1.0, alpha=1.0)
    state = opt.init(params)
    _, state = opt.step(params, params.ones_like(), state)
    assert isinstance(state.eta, ParamDict)
    torch.testing.assert_close(state.eta["w"], torch.tensor(0.1 / 1.1))
    torch.testing.assert_close(state.eta["b"], torch.tensor(0.2 / 1.2))
