"""The schedules' `cos`: bitwise `math.cos` eager and compiled, no complex code."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pytest
import torch
from _torch_versions import ONE_GRAPH
from torch._dynamo.utils import counters
from torch.optim import lr_scheduler as tls

from paramdict import optim
from paramdict.optim._schedules.numbers import cos

# The angles the cosine schedules take: pi * e / t for every step e of every length t.
_ANGLES = [(e, t) for t in range(1, 61) for e in range(2 * t + 1)]


def _cos_of_ratio(e: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return cos(math.pi * e / t)


def test_eager_cos_is_math_cos_on_the_schedule_angles() -> None:
    """Eager `cos(pi * e / t)` equals `math.cos` bitwise for every angle tried."""
    e, t = (torch.tensor(v, dtype=torch.float64) for v in zip(*_ANGLES, strict=True))
    got = [float(c) for c in _cos_of_ratio(e, t)]
    want = [math.cos(math.pi * a / b) for a, b in _ANGLES]
    assert got == want


class _Inductor:
    """The inductor backend, keeping the graphs it is given."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(
        self,
        gm: torch.fx.GraphModule,
        inputs: list[torch.Tensor | int | torch.SymInt | None],
    ) -> object:
        self.graphs.append(gm)
        return torch._inductor.compile(gm, inputs)

    def complex_free(self) -> bool:
        """Whether no value in the graphs is complex (inductor's warning is once)."""
        return bool(self.graphs) and all(
            "complex" not in str(node.meta.get("example_value", ""))
            for graph in self.graphs
            for node in graph.graph.nodes
        )


def test_compiled_cos_is_math_cos_and_real() -> None:
    """Inductor's `cos` of a 0-dim double is `math.cos` bitwise, without a warning."""
    torch._dynamo.reset()
    counters.clear()
    backend = _Inductor()
    compiled = torch.compile(_cos_of_ratio, backend=backend, fullgraph=True)
    f64 = torch.float64
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", "`torch.jit.script_method` is deprecated")
        got = [
            float(compiled(torch.tensor(a, dtype=f64), torch.tensor(b, dtype=f64)))
            for a, b in _ANGLES[::3]
        ]
    assert [str(w.message) for w in caught] == []
    assert got == [math.cos(math.pi * a / b) for a, b in _ANGLES[::3]]
    assert counters["stats"]["unique_graphs"] == 1
    assert backend.complex_free()


Make = Callable[[torch.optim.Optimizer], tls.LRScheduler]

_CASES: list[tuple[optim.LRSchedule, Make, int]] = [
    (
        optim.CosineAnnealingLR(T_max=70, eta_min=0.001),
        lambda o: tls.CosineAnnealingLR(o, T_max=70, eta_min=0.001),
        300,
    ),
    (
        optim.OneCycleLR(max_lr=0.1, total_steps=301),
        lambda o: tls.OneCycleLR(o, max_lr=0.1, total_steps=301),
        300,
    ),
    (
        optim.CosineAnnealingWarmRestarts(T_0=7, T_mult=2, eta_min=0.001),
        lambda o: tls.CosineAnnealingWarmRestarts(o, T_0=7, T_mult=2, eta_min=0.001),
        300,
    ),
]


@pytest.mark.parametrize(
    ("schedule", "make", "steps"),
    [pytest.param(*case, id=type(case[0]).__name__) for case in _CASES],
)
@ONE_GRAPH
def test_inductor_schedule_equals_torch_bitwise(
    schedule: optim.LRSchedule, make: Make, steps: int
) -> None:
    """A schedule compiled by inductor gives torch's rates bitwise, from one graph."""
    torch._dynamo.reset()
    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=0.1)
    sched = make(opt)
    counters.clear()
    backend = _Inductor()
    step = torch.compile(schedule.step, backend=backend, fullgraph=True)
    state = schedule.init(0.1)
    ours, theirs = [float(state.lr)], [sched.get_last_lr()[0]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", "`torch.jit.script_method` is deprecated")
        for _ in range(steps):
            opt.step()
            sched.step()
            state = step(state)
            ours.append(float(state.lr))
            theirs.append(sched.get_last_lr()[0])
    assert [str(w.message) for w in caught] == []
    assert ours == theirs
    assert counters["stats"]["unique_graphs"] == 1
    assert backend.complex_free()
