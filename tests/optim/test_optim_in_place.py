"""`step_`: the update written into the parameters and the state."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from optim_cases import (
    STEPS,
    TABLE,
    batches,
    forward,
    make_model,
    run_ours,
    run_torch,
    wrapped,
)
from torch import Tensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from paramdict import ParamDict, optim

F64 = torch.float64


def _run_in_place(
    opt: optim.Optimizer[Any], dtype: torch.dtype = F64, *, steps: int = STEPS
) -> ParamDict:
    """Train with `step_`; check every step writes into the same tensors."""
    params = ParamDict.from_module(make_model(dtype))
    state = opt.init(params)
    tensors = [*params.values(), *pytree.tree_leaves(state)]
    for x, y in batches(dtype, steps):
        grads = params.grad(F.mse_loss(forward(params, x), y))
        params, state = opt.step_(params, grads, state)
    after = [*params.values(), *pytree.tree_leaves(state)]
    assert all(a is b for a, b in zip(after, tensors, strict=True))
    return params


def _trajectories(*, fused_only: bool = False) -> list[Any]:
    return [
        pytest.param(case, name, id=name, marks=case.mark(name))
        for case in TABLE
        for name in case.trajectories
        if not fused_only or name in case.fused
    ]


@pytest.mark.parametrize(("case", "name"), _trajectories())
def test_in_place_trajectory_equals_step_and_torch(case: Any, name: str) -> None:
    """100 `step_` calls equal `step` and torch.optim (float64, every option)."""
    kwargs = case.trajectories[name]
    actual = _run_in_place(case.ours(**kwargs))
    default = run_ours(case.ours(**kwargs), F64)
    expected = run_torch(lambda m: case.theirs(m.parameters(), **kwargs), F64)
    torch.testing.assert_close(dict(actual), expected, rtol=1e-12, atol=1e-13)
    if name in case.fused:
        # torch's fused kernel: bitwise torch.optim(fused=True); `step` is the
        # foreach rounding, equal within float64 rounding.
        fused = run_torch(
            lambda m: case.theirs(m.parameters(), fused=True, **kwargs), F64
        )
        torch.testing.assert_close(dict(actual), fused, rtol=0, atol=0)
        torch.testing.assert_close(dict(actual), dict(default), rtol=1e-12, atol=1e-13)
    else:
        torch.testing.assert_close(dict(actual), dict(default), rtol=0, atol=0)


@pytest.mark.parametrize(("case", "name"), _trajectories(fused_only=True))
def test_in_place_float32_fused_is_torch_fused_bitwise(case: Any, name: str) -> None:
    """In float32 too, a fused `step_` is bitwise torch.optim with `fused=True`."""
    kwargs = case.trajectories[name]
    actual = _run_in_place(case.ours(**kwargs), torch.float32, steps=20)
    fused = run_torch(
        lambda m: case.theirs(m.parameters(), fused=True, **kwargs),
        torch.float32,
        steps=20,
    )
    torch.testing.assert_close(dict(actual), fused, rtol=0, atol=0)


def _generic() -> list[Any]:
    """Tensor rates (fused where a class has a kernel) and per-key rates (the rule)."""
    params = ParamDict.from_module(make_model(F64))
    rows: list[Any] = []
    for case in TABLE:
        for kind, lr in (
            ("tensor", torch.tensor(0.01, dtype=F64)),
            ("per-key", params.full_like(0.01)),
        ):
            rows.append(
                pytest.param(
                    lambda c=case, lr=lr: c.ours(**{**c.rich, "lr": lr}),
                    id=f"{case.name}-{kind}",
                )
            )
        rows.append(pytest.param(case.make, id=f"{case.name}-rich"))
    rows += [pytest.param(lambda o=opt: o, id=name) for name, opt in wrapped()]
    return rows


@pytest.mark.parametrize("make", _generic())
def test_in_place_equals_step_for_every_rate_form(
    make: Callable[[], optim.Optimizer[Any]],
) -> None:
    """Rich, tensor-rate and per-key configurations: `step_` equals `step`."""
    actual = _run_in_place(make(), steps=20)
    expected = run_ours(make(), F64, steps=20)
    torch.testing.assert_close(dict(actual), dict(expected), rtol=1e-12, atol=1e-13)


def test_step_module_writes_into_the_module_and_the_state() -> None:
    """`step_module` updates the module's parameters and the state's own tensors."""
    model = make_model(F64)
    opt = optim.Adam(lr=0.01)
    state = opt.init(ParamDict.from_module(model))
    weight = model.get_parameter("0.weight")
    exp_avg = state.exp_avg["0.weight"]
    before = weight.detach().clone()
    x, y = next(iter(batches(F64, 1)))
    _, new = opt.step_module(model, lambda: F.mse_loss(model(x), y), state)
    assert new is state
    assert new.exp_avg["0.weight"] is exp_avg
    assert model.get_parameter("0.weight") is weight
    assert not torch.equal(weight, before)
    assert int(state.step) == 1


# ------------------------------------------------------------ memory


class _Allocations(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's class is unannotated
    """Keep a weak reference to every tensor an operation returns."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's class is unannotated
        self.made: list[weakref.ref[Tensor]] = []

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, Tensor):
                self.made.append(weakref.ref(leaf))
        return out


def _alive_after(step: Callable[[], object], steps: int, owned: list[Tensor]) -> int:
    """How many tensors the `steps` calls made are alive afterwards, not `owned`.

    In-place operations return the tensor they wrote into: those are the
    loop's own parameters and state, and are not counted.
    """
    with _Allocations() as mode:
        for _ in range(steps):
            step()
    mine = {t.untyped_storage().data_ptr() for t in owned}
    alive = [ref() for ref in mode.made]
    return sum(
        t is not None and t.untyped_storage().data_ptr() not in mine for t in alive
    )


def _in_place_loop(
    opt: optim.Optimizer[Any],
) -> tuple[Callable[[], object], list[Tensor]]:
    """A `step_` loop on small tensors, and the tensors it owns."""
    params = ParamDict(w=torch.randn(4, 3), b=torch.randn(3))
    grads = params.full_like(0.1)
    carried = [params, opt.init(params)]

    def step() -> object:
        carried[0], carried[1] = opt.step_(carried[0], grads, carried[1])
        return None

    owned = [*params.values(), *pytree.tree_leaves(carried[1])]
    return step, owned


@pytest.mark.parametrize(
    "opt",
    [
        optim.Adam(lr=0.01),
        optim.RMSprop(lr=0.01, momentum=0.9, centered=True),
        optim.SGD(lr=0.01, momentum=0.9, dampening=0.1),
    ],
    ids=["adam-fused", "rmsprop-generic", "sgd-generic"],
)
def test_in_place_steps_keep_no_tensor_alive(opt: optim.Optimizer[Any]) -> None:
    """5,000 `step_` calls leave none of the tensors they made alive: flat memory."""
    step, owned = _in_place_loop(opt)
    step()  # warm-up
    assert _alive_after(step, 5000, owned) == 0


def test_alive_tensor_count_sees_a_growing_loop() -> None:
    """The memory check counts what a loop keeps: `step`'s new state per call."""
    opt = optim.RMSprop(lr=0.01)
    params = ParamDict(w=torch.randn(4, 3))
    kept = [opt.init(params)]

    def step() -> None:  # out of place, keeping every state
        kept.append(opt.step(params, params.full_like(0.1), kept[-1])[1])

    assert _alive_after(step, 50, [params["w"]]) >= 50


# ------------------------------------------------------------ refusals


def _setup() -> tuple[ParamDict, ParamDict]:
    params = ParamDict(w=torch.tensor([1.0, -2.0, 3.0]), b=torch.tensor([0.5, 0.25]))
    return params, params.full_like(0.1)


def _snapshot(*trees: Any) -> list[Tensor]:
    return [t.clone() for t in pytree.tree_leaves(trees) if isinstance(t, Tensor)]


def _unchanged(before: list[Tensor], *trees: Any) -> None:
    after = [t for t in pytree.tree_leaves(trees) if isinstance(t, Tensor)]
    for old, new in zip(before, after, strict=True):
        torch.testing.assert_close(new, old, rtol=0, atol=0)


def test_differentiable_optimizer_is_refused() -> None:
    """A differentiable optimizer cannot write in place."""
    params, grads = _setup()
    opt = optim.Adam(differentiable=True)
    state = opt.init(params)
    before = _snapshot(params, state)
    with pytest.raises(ValueError, match="needs `differentiable=False`"):
        opt.step_(params, grads, state)
    _unchanged(before, params, state)


def test_recorded_parameters_are_refused() -> None:
    """Parameters autograd is recording (with a grad_fn) are named and refused."""
    params, grads = _setup()
    leaf = torch.tensor([1.0, 1.0], requires_grad=True)
    params = params | {"b": leaf * 2}
    opt = optim.SGD(lr=0.1, momentum=0.9)
    state = opt.init(params.detach())
    before = _snapshot(params, state)
    with pytest.raises(ValueError, match=r"\['b'\]: autograd is recording"):
        opt.step_(params, grads, state)
    _unchanged(before, params, state)


def test_leaves_that_require_grad_are_written() -> None:
    """Leaves that require grad are written, as torch.optim writes them."""
    params, grads = _setup()
    params = params.requires_grad_()
    opt = optim.SGD(lr=1.0)
    w = params["w"]
    opt.step_(params, grads, opt.init(params))
    assert w.requires_grad
    assert w.is_leaf
    torch.testing.assert_close(w.detach(), torch.tensor([0.9, -2.1, 2.9]))


def test_inference_tensors_are_refused_outside_inference_mode() -> None:
    """Inference tensors cannot be written outside inference mode."""
    with torch.inference_mode():
        params, grads = _setup()
    opt = optim.Adam()
    state = opt.init(params.clone())
    with pytest.raises(ValueError, match=r"\['b', 'w'\]: they are inference"):
        opt.step_(params, grads, state)


@pytest.mark.parametrize(
    ("spoil", "match"),
    [
        (lambda p, g: (p | {"b": p["w"][:2]}, g), r"\['b', 'w'\]: they share"),
        (lambda p, g: (p, p), r"they share memory"),
        (lambda p, g: (p | {"b": torch.ones(1).expand(2)}, g), r"\['b'\].*`expand`"),
    ],
    ids=["tied-entries", "grads-are-params", "expanded"],
)
def test_shared_memory_is_refused(spoil: Any, match: str) -> None:
    """Entries sharing memory with each other or with the gradients are refused."""
    params, grads = spoil(*_setup())
    opt = optim.Adam()
    state = opt.init(params.clone())
    before = _snapshot(params, state)
    with pytest.raises(ValueError, match=match):
        opt.step_(params, grads, state)
    _unchanged(before, params, state)


def test_state_buffer_sharing_a_parameter_is_refused() -> None:
    """A state buffer that is a parameter's own tensor is refused."""
    params, grads = _setup()
    opt = optim.SGD(momentum=0.9)
    state = opt.init(params)
    state = state._replace(momentum_buffer=params)
    with pytest.raises(ValueError, match=r"state.*share memory"):
        opt.step_(params, grads, state)


def test_empty_params_come_back_unchanged() -> None:
    """An empty ParamDict is returned as it is, with its state."""
    opt = optim.Adam()
    state = opt.init(ParamDict())
    assert opt.step_(ParamDict(), {}, state) == (ParamDict(), state)
