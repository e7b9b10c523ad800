"""`capturable=True`: the step counter on the device, as torch.optim's capturable steps.

Counted on fake CUDA tensors (see `launches.py`), both sides inside one
`FakeTensorMode` (torch's capturable state is made on the device at its first
step): every step of ours launches at most what torch's capturable foreach step
launches, reads nothing on the host, and keeps its counter on the device. On a
machine with a GPU, a CUDA graph captures `step_` whole and its replays follow
the eager steps.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _torch_versions import ONE_GRAPH
from launches import DeviceOps, count, cuda_tensors
from torch._subclasses.fake_tensor import FakeTensorMode

from paramdict import ParamDict, optim

SHAPES = [(32, 16), (16,), (8, 8), (4, 3, 2, 2), (16, 8), (8,)]
KEYS = [f"p{i}" for i in range(len(SHAPES))]

# torch.optim's classes with a capturable foreach step that runs on fake tensors
# (Rprop's makes real CUDA tensors), and options that switch most branches on.
CAPTURABLE: dict[str, dict[str, Any]] = {
    "Adam": {"weight_decay": 0.1, "amsgrad": True},
    "AdamW": {"amsgrad": True},
    "NAdam": {"weight_decay": 0.1, "decoupled_weight_decay": True},
    "RAdam": {"weight_decay": 0.1},
    "Adamax": {"weight_decay": 0.1},
    "ASGD": {"weight_decay": 0.1},
    "Adadelta": {"weight_decay": 0.1},
    "RMSprop": {"momentum": 0.9, "centered": True},
}
CONFIGS = ["default", "rich"]


def _torch_ops(name: str, options: dict[str, Any]) -> DeviceOps:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    params = [torch.nn.Parameter(t) for t in cuda_tensors(SHAPES)]
    grads = cuda_tensors(SHAPES)
    opt = getattr(torch.optim, name)(params, **options, foreach=True, capturable=True)

    def step() -> None:
        for p, g in zip(params, grads, strict=True):
            p.grad = g
        with mode:
            opt.step()

    return count(step)


def _ours(
    name: str, options: dict[str, Any], *, in_place: bool
) -> tuple[DeviceOps, Any]:
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    opt = getattr(optim, name)(**options, capturable=True)
    params = ParamDict(zip(KEYS, cuda_tensors(SHAPES), strict=True))
    grads = ParamDict(zip(KEYS, cuda_tensors(SHAPES), strict=True))
    with mode:
        held: list[Any] = [params, opt.init(params)]

    def step() -> None:
        with mode:
            take = opt.step_ if in_place else opt.step
            held[0], held[1] = take(held[0], grads, held[1])

    return count(step), held[1]


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", list(CAPTURABLE))
def test_a_capturable_step_launches_no_more_than_torch(
    name: str, config: str, in_place: bool
) -> None:
    """`step_` launches at most torch's capturable step; `step` one copy more.

    `step` leaves its input state as it was, so its counter is a copy first:
    one kernel for all the state's scalars (torch has no out-of-place step).
    """
    options = CAPTURABLE[name] if config == "rich" else {}
    ours, state = _ours(name, options, in_place=in_place)
    theirs = _torch_ops(name, options)
    assert not ours.syncs, f"host syncs: {ours.syncs}"
    assert state.step.device.type == "cuda"
    assert "_local_scalar_dense" not in ours.ops
    budget = len(theirs.ops) + (0 if in_place else 1)
    assert len(ours.ops) <= budget, (
        f"{name} ({config}) launches {len(ours.ops)}: {ours.summary()}; torch's "
        f"capturable step {len(theirs.ops)}: {theirs.summary()}"
    )


def test_a_capturable_counter_is_made_on_the_device_in_torchs_dtype() -> None:
    """Where torch's capturable `step` is: the parameters' device, float32."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        params = ParamDict(zip(KEYS, cuda_tensors(SHAPES), strict=True))
        state = optim.Adam(capturable=True).init(params)
    assert state.step.device.type == "cuda"
    assert state.step.dtype == torch.float32
    host = optim.Adam(capturable=True).init(ParamDict(w=torch.ones(2)))
    assert host.step.device.type == "cpu"
    assert host.step.dtype == torch.float64


def test_a_host_counter_is_refused_with_capturable_true() -> None:
    """A state from a non-capturable optimizer: named, the fix given, nothing run."""
    params = ParamDict(zip(KEYS, cuda_tensors(SHAPES), strict=True))
    grads = ParamDict(zip(KEYS, cuda_tensors(SHAPES), strict=True))
    state = optim.Adam().init(params)
    with pytest.raises(ValueError, match=r"`step` is on cpu.*capturable=True"):
        optim.Adam(capturable=True).step_(params, grads, state)
    assert state.step.item() == 0


def test_capturable_on_the_cpu_is_the_plain_step() -> None:
    """On the CPU the option changes nothing: the same bits, step for step."""
    torch.manual_seed(0)
    params = ParamDict(w=torch.randn(4, 3), b=torch.randn(3))
    plain, captured = optim.NAdam(), optim.NAdam(capturable=True)
    a = b = params
    sa, sb = plain.init(a), captured.init(b)
    for _ in range(4):
        grads = params.randn_like()
        a, sa = plain.step(a, grads, sa)
        b, sb = captured.step(b, grads, sb)
    for key in params:
        assert torch.equal(a[key], b[key])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", list(CAPTURABLE))
def test_a_cuda_graph_captures_step_in_place(name: str) -> None:  # pragma: no cover
    """Captured once, replayed: the eager capturable run's parameters."""
    torch.manual_seed(0)
    params = ParamDict(
        zip(KEYS, [torch.randn(s, device="cuda") for s in SHAPES], strict=True)
    )
    grads = params.randn_like()
    opt = getattr(optim, name)(capturable=True)
    eager, eager_state = params.clone(), opt.init(params)
    for _ in range(5):
        opt.step_(eager, grads, eager_state)
    graphed, state = params.clone(), opt.init(params)
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # untyped in torch
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the graph, as torch asks
        opt.step_(graphed, grads, state)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        opt.step_(graphed, grads, state)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert state.step.item() == 5
    for key in params:
        torch.testing.assert_close(graphed[key], eager[key], rtol=1e-6, atol=1e-7)


@ONE_GRAPH
def test_a_compiled_capturable_step_does_not_recompile() -> None:
    """The counter is a tensor input: the compiled step is made once."""
    params = ParamDict(w=torch.randn(4, 3), b=torch.randn(3))
    opt = optim.Adam(capturable=True)
    state = opt.init(params)
    step = torch.compile(opt.step_)
    grads = params.randn_like()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(4):
            step(params, grads, state)
    assert state.step.item() == 4
