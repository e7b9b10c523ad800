"""torch.compile: a step compiles into one graph and gives eager's result.

Graph breaks are decided by dynamo's capture, which the "eager" backend runs in
full; "aot_eager" adds AOTAutograd (functionalization, the backward graph) for
Adam. Inductor is left out to keep the suite fast; it lowers the same graph.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _torch_versions import ONE_GRAPH
from hypothesis import given, settings
from hypothesis import strategies as st
from optim_cases import batches, configured, make_model
from torch import Tensor

from paramdict import ParamDict, optim

pytestmark = ONE_GRAPH


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _loss(params: ParamDict, x: Tensor, y: Tensor) -> Tensor:
    hidden = torch.tanh(F.linear(x, params["0.weight"], params["0.bias"]))
    return F.mse_loss(F.linear(hidden, params["2.weight"], params["2.bias"]), y)


def _functional_run(opt: optim.Optimizer[Any], step: Any, steps: int = 3) -> ParamDict:
    """Train torch.func style: values that need no grad, grads from func.grad."""
    params = ParamDict(
        (k, v.detach()) for k, v in ParamDict.from_module(make_model()).items()
    )
    state = opt.init(params)
    for i, (x, y) in enumerate(batches(steps=steps)):
        grads = torch.func.grad(_loss)(params, x, y)
        if i == 1:  # compiled once; later steps must reuse the graph
            with torch._dynamo.config.patch(error_on_recompile=True):
                params, state = step(params, grads, state)
        else:
            params, state = step(params, grads, state)
    return params


@pytest.mark.parametrize("opt", configured())
def test_compiled_step_is_one_graph_and_equals_eager(opt: optim.Optimizer[Any]) -> None:
    """`torch.compile(opt.step, fullgraph=True)` compiles once and matches eager."""
    compiled = torch.compile(opt.step, fullgraph=True, backend="eager")
    expected = _functional_run(opt, opt.step)
    torch.testing.assert_close(dict(_functional_run(opt, compiled)), dict(expected))


def test_compiled_adam_through_aot_autograd_equals_eager() -> None:
    """With AOTAutograd (backend "aot_eager") Adam still compiles fully."""
    opt = optim.Adam(lr=0.01, weight_decay=0.1)
    compiled = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
    expected = _functional_run(opt, opt.step)
    torch.testing.assert_close(dict(_functional_run(opt, compiled)), dict(expected))


# Dynamo reads `.grad` of every tensor input while tracing; for the non-leaf
# gradients of a differentiable step that read emits torch's own UserWarning.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_compiled_differentiable_adam_gives_eager_meta_gradient() -> None:
    """A differentiable step compiles fully and backpropagates like eager."""
    opt = optim.Adam(lr=0.05, differentiable=True)
    compiled = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
    data = list(batches(steps=3))

    def meta_gradient(step: Any) -> ParamDict:
        start = ParamDict(
            (k, v.detach().requires_grad_())
            for k, v in ParamDict.from_module(make_model()).items()
        )
        params, state = start, opt.init(start)
        for x, y in data[:2]:
            grads = params.grad(_loss(params, x, y), create_graph=True)
            params, state = step(params, grads, state)
        return start.grad(_loss(params, *data[2]))

    expected = meta_gradient(opt.step)
    torch.testing.assert_close(dict(meta_gradient(compiled)), dict(expected))


def test_default_step_on_grad_requiring_values_compiles_up_to_the_flags() -> None:
    """Default mode on values that require grad: no fullgraph, same result.

    A compiled graph cannot return new leaves that require grad, so `fullgraph`
    refuses; without it the update compiles and the flags are set after it.
    """
    opt = optim.SGD(lr=0.1, momentum=0.9)
    params = ParamDict.from_module(make_model())
    grads = ParamDict((k, torch.ones_like(v)) for k, v in params.items())
    state = opt.init(params)
    strict = torch.compile(opt.step, fullgraph=True, backend="eager")
    with pytest.raises(torch._dynamo.exc.Unsupported, match="requires_grad_"):
        strict(params, grads, state)
    torch._dynamo.reset()
    relaxed = torch.compile(opt.step, backend="eager")
    new, _ = relaxed(params, grads, state)
    expected, _ = opt.step(params, grads, state)
    assert all(v.is_leaf and v.requires_grad for v in new.values())
    torch.testing.assert_close(dict(new), dict(expected))


def _in_place_run(opt: optim.Optimizer[Any], step: Any, steps: int = 3) -> ParamDict:
    """`step_` on tensors of its own, from the same start and gradients."""
    params = ParamDict(
        (k, v.detach().clone()) for k, v in ParamDict.from_module(make_model()).items()
    )
    state = opt.init(params)
    for x, y in batches(steps=steps):
        grads = torch.func.grad(_loss)(params, x, y)
        params, state = step(params, grads, state)
    counters = [t for t in torch.utils._pytree.tree_leaves(state) if t.dim() == 0]
    return params | ParamDict((f"counter{i}", c) for i, c in enumerate(counters))


@pytest.mark.parametrize("opt", configured())
def test_compiled_step_in_place_equals_eager(opt: optim.Optimizer[Any]) -> None:
    """`torch.compile(opt.step_)` writes eager's values, counters included.

    Traced, `step_` runs the rule functionally and copies the results into the
    parameters and state ("aot_eager": functionalization, as inductor has it).
    The values are eager's to float32 rounding (eager `step_` may take torch's
    fused kernel, or read a per-key scale on the host), and a 0-dim float64
    counter is written too (a plain `copy_` into one is dropped there).
    """
    expected = _in_place_run(opt, opt.step_)
    actual = _in_place_run(opt, torch.compile(opt.step_, backend="aot_eager"))
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)


def test_inductor_step_in_place_equals_eager_adam() -> None:
    """With inductor itself, Adam's compiled `step_` equals eager's to rounding."""
    opt = optim.Adam(lr=0.01, amsgrad=True)
    expected = _in_place_run(opt, opt.step_)
    actual = _in_place_run(opt, torch.compile(opt.step_))
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("opt", configured())
def test_compiled_step_in_place_is_one_graph(opt: optim.Optimizer[Any]) -> None:
    """`torch.compile(opt.step_)` is one eager check, then one graph, compiled once.

    The checks of what `step_` may write (memory addresses, inference tensors)
    run eagerly; traced, each of them broke the step into graphs of its own.
    Three steps compile one graph (the frame before the checks holds none) and
    never recompile: the step counter is a tensor.
    """
    counter = torch._dynamo.testing.CompileCounter()
    step = torch.compile(opt.step_, backend=counter)
    _in_place_run(opt, step, steps=3)
    assert counter.frame_count == 1


def test_compiled_step_in_place_checks_every_call() -> None:
    """Compiled, `step_` still refuses shared memory on any call, writing nothing."""
    opt = optim.RMSprop(lr=0.1, momentum=0.9)
    step = torch.compile(opt.step_, backend="aot_eager")
    params = ParamDict(w=torch.ones(4), b=torch.ones(2))
    state = opt.init(params)
    grads = ParamDict(w=torch.full((4,), 0.5), b=torch.full((2,), 0.5))
    params, state = step(params, grads, state)  # compiles
    before = [t.clone() for t in torch.utils._pytree.tree_leaves((params, state))]

    # A gradient that is a parameter's own memory, then a buffer shared by two keys.
    aliased = ParamDict(w=params["w"], b=grads["b"])
    with pytest.raises(ValueError, match=r"grads\['w'\]"):
        step(params, aliased, state)
    shared = state._replace(square_avg=ParamDict(w=params["w"], b=torch.zeros(2)))
    with pytest.raises(ValueError, match=r"state.square_avg\['w'\]"):
        step(params, grads, shared)
    after = torch.utils._pytree.tree_leaves((params, state))
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))

    # And the next valid call steps as eager does.
    params, state = step(params, grads, state)
    eager_params = ParamDict(w=before[0], b=before[1])
    eager_state = torch.utils._pytree.tree_unflatten(
        [t.clone() for t in before[2:]], torch.utils._pytree.tree_structure(state)
    )
    expected, _ = opt.step(eager_params, grads, eager_state)
    torch.testing.assert_close(dict(params), dict(expected))


_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@settings(max_examples=60, deadline=None)
@given(
    value=st.floats(allow_nan=True, allow_infinity=True),
    dtype=st.sampled_from(sorted(_DTYPES)),
    flag=st.booleans(),
)
def test_a_hoisted_operand_is_its_value(value: float, dtype: str, flag: bool) -> None:
    """Traced, an operand computed once per step is the value itself, bit for bit.

    ParamDict's arithmetic hands a 0-dim operand (a step size, an `alpha`, a
    `lerp` weight) to inductor as a reduction over two copies of
    it, so that it is computed once rather than in every vectorized iteration;
    that maximum is the value, signed zeros and infinities included, and NaN
    stays NaN.
    """
    from paramdict._kernels import hoisted as once

    compiled = torch.compile(lambda t, b: (once(t), once(b)))
    tensor = torch.tensor(value, dtype=_DTYPES[dtype])
    hoisted, condition = compiled(tensor, torch.tensor(flag))
    assert hoisted.dtype == tensor.dtype
    assert hoisted.shape == ()
    assert condition.dtype == torch.bool
    assert bool(condition) is flag
    if math.isnan(value):
        assert torch.isnan(hoisted)
    else:
        assert torch.equal(hoisted, tensor)
        assert math.copysign(1.0, hoisted.item()) == math.copysign(1.0, value)


def test_compiled_step_in_place_with_fullgraph_says_what_to_do() -> None:
    """`fullgraph=True` cannot hold the eager checks; the error says what can."""
    opt = optim.RMSprop(lr=0.1)
    params = ParamDict(w=torch.ones(3))
    state = opt.init(params)
    strict = torch.compile(opt.step_, fullgraph=True, backend="eager")
    with pytest.raises(torch._dynamo.exc.Unsupported, match="without `fullgraph=True`"):
        strict(params, params.ones_like(), state)
    torch.testing.assert_close(params["w"], torch.ones(3))  # nothing written
