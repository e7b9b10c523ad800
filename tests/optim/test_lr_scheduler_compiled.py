"""Compiled schedules: no tensor held twice, no recompile, no graph break.

A composed schedule's rate is its last child's: a state holding that tensor in
both fields made a compiled step return one buffer twice, and the next call
recompiled on the aliasing ("Duplicate tensors found"). A plateau's float metric
is a symbolic float when compiled, which the metric's check broke the graph on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters
from torch.utils import _pytree as pytree

from paramdict import ParamDict, optim

pytestmark = pytest.mark.skipif(
    torch.__version__ < "2.8",
    reason="torch.compile traces a ParamDict in one graph from torch 2.8 on",
)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _held_twice(state: object) -> list[int]:
    """Return the positions of the tensor leaves that repeat an earlier leaf."""
    leaves = [x for x in pytree.tree_leaves(state) if isinstance(x, torch.Tensor)]
    return [i for i, x in enumerate(leaves) if any(x is y for y in leaves[:i])]


COMPOSED: dict[str, Callable[[], Any]] = {
    "chained": lambda: optim.ChainedScheduler(
        base_lr=0.1,
        schedulers=(
            optim.ConstantLR(factor=0.5, total_iters=2),
            optim.ExponentialLR(gamma=0.9),
        ),
    ),
    "chained-constant-lambda": lambda: optim.ChainedScheduler(
        base_lr=0.01,
        schedulers=(
            optim.ConstantLR(factor=0.001),
            optim.ConstantLR(factor=0.001),
            optim.LambdaLR(lr_lambda=lambda epoch: 10),
        ),
    ),
    "chained-cyclic": lambda: optim.ChainedScheduler(
        base_lr=0.1,
        schedulers=(
            optim.CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=2),
            optim.ExponentialLR(gamma=0.9),
        ),
    ),
    "chained-plateau": lambda: optim.ChainedScheduler(
        base_lr=0.1,
        schedulers=(optim.StepLR(step_size=2), optim.ReduceLROnPlateau(patience=0)),
    ),
    "sequential": lambda: optim.SequentialLR(
        base_lr=0.1,
        schedulers=(
            optim.ConstantLR(factor=0.5, total_iters=2),
            optim.ExponentialLR(gamma=0.9),
        ),
        milestones=(2,),
    ),
}


@pytest.mark.parametrize("name", list(COMPOSED))
def test_composed_schedule_states_hold_no_tensor_twice(name: str) -> None:
    """`init`, `step` and `step_metric` states hold every tensor once."""
    schedule = COMPOSED[name]()
    state = schedule.init()
    assert _held_twice(state) == []
    for _ in range(3):
        state = schedule.step(state)
        assert _held_twice(state) == []
        if schedule.takes_metric:
            state = schedule.step_metric(state, 1.0)
            assert _held_twice(state) == []


# Inductor (where the aliasing appeared) on the rate's and the momentum's case.
@pytest.mark.parametrize("name", ["chained", "chained-cyclic"])
def test_compiled_step_with_a_composed_schedule_compiles_once(name: str) -> None:
    """An inductor-compiled SGD step with a composed schedule never recompiles."""
    opt = optim.SGD(lr=COMPOSED[name](), momentum=0.9)
    params = ParamDict(w=torch.linspace(-1.0, 1.0, 4))
    state = opt.init(params)
    eager_params, eager_state = params, state
    step = torch.compile(opt.step)
    for i in range(3):
        grads = params.full_like(0.5 - i)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            params, state = step(params, grads, state)
        eager_params, eager_state = opt.step(eager_params, grads, eager_state)
        assert _held_twice(state) == []
    assert opt.last_lr(state) == opt.last_lr(eager_state)
    torch.testing.assert_close(dict(params), dict(eager_params))


def test_compiled_plateau_step_schedule_has_no_graph_break() -> None:
    """A compiled `step_schedule` with float and tensor metrics is one graph each."""
    opt = optim.SGD(lr=optim.ReduceLROnPlateau(base_lr=0.1, patience=0), momentum=0.9)
    state = eager = opt.init(ParamDict(w=torch.ones(3)))
    counter = CompileCounter()
    step = torch.compile(opt.step_schedule, backend=counter, fullgraph=True)
    for metric in (1.0, 2.0, 3.0, 0.5, torch.tensor(0.25), torch.tensor(0.75)):
        state = step(state, metric)
        eager = opt.step_schedule(eager, metric)
    assert dict(counters["graph_break"]) == {}
    assert counter.frame_count <= 3  # a constant, a symbolic float, a tensor
    torch.testing.assert_close(state.schedule, eager.schedule)
