"""`MultiSteps`: the eager, host-decided step equals the traced `where` form bitwise."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from paramdict import ParamDict, optim
from paramdict.optim._accumulate import _selected  # the traced form itself
from paramdict.optim._copies import copied


def _warmup_cosine(epoch: Any) -> float:
    e = float(epoch)
    return (e + 1) / 3 if e < 3 else 0.5 * (1 + math.cos(math.pi * (e - 3) / 10))


def _recipe(
    every_k: int, reduction: Any = "mean", max_norm: float = 0.5
) -> optim.MultiSteps:
    """Clipping in front of decay / no-decay AdamW groups on a schedule."""

    def lr() -> optim.LambdaLR:
        return optim.LambdaLR(base_lr=0.01, lr_lambda=_warmup_cosine)

    groups = optim.ParamGroups(
        {
            lambda _, t: t.dim() >= 2: optim.AdamW(
                lr=lr(), weight_decay=0.1, fused=False
            )
        },
        default=optim.AdamW(lr=lr(), weight_decay=0.0, fused=False),
    )
    inner = optim.ClipGradNorm(groups, max_norm=max_norm)
    return optim.MultiSteps(inner, every_k=every_k, reduction=reduction)


def _params() -> ParamDict:
    gen = torch.Generator().manual_seed(0)
    return ParamDict(
        w=torch.randn(4, 3, generator=gen),
        b=torch.randn(3, generator=gen),
        v=torch.randn(2, 5, generator=gen),
    )


def _grads(params: ParamDict, count: int) -> list[ParamDict]:
    gen = torch.Generator().manual_seed(1)
    return [
        ParamDict((k, torch.randn(v.shape, generator=gen)) for k, v in params.items())
        for _ in range(count)
    ]


def _where_form(
    opt: optim.MultiSteps, params: ParamDict, grads: ParamDict, state: Any
) -> tuple[ParamDict, Any]:
    """One call of the traced form (what `torch.compile` and `vmap` run)."""
    with torch.no_grad():
        params, state = copied(params, state, recorded=False)
        plan = opt.optimizer._plan(params, state.inner_state, in_place=True)
        mean = opt.reduction == "mean"
        _selected(plan, opt.every_k, mean, params, grads, state)
        return params, state


def _leaves(tree: object) -> list[Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, Tensor)]


CASES = [(2, "mean"), (3, "mean"), (4, "mean"), (3, "sum"), (1, "mean")]


@pytest.mark.parametrize(("every_k", "reduction"), CASES)
def test_eager_rule_equals_the_where_form_bitwise(every_k: int, reduction: str) -> None:
    """The host-decided step gives the `where` form's results, bit for bit."""
    opt = _recipe(every_k, reduction)
    start = _params()
    ref, ref_state = start.clone(), opt.init(start)
    mine, mine_state = start.clone(), opt.init(start)
    for grads in _grads(start, 4 * every_k + 1):
        ref, ref_state = _where_form(opt, ref, grads, ref_state)
        mine, mine_state = opt.step(mine, grads, mine_state)
        got, want = _leaves((mine, mine_state)), _leaves((ref, ref_state))
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert opt.step_count(mine_state) == 4 + (every_k == 1)


@pytest.mark.parametrize("max_norm", [0.5, 1e3], ids=["clipped", "unclipped"])
@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize(("every_k", "reduction"), CASES)
def test_step_equals_the_wrapped_step_on_the_mean(
    every_k: int, reduction: str, in_place: bool, max_norm: float
) -> None:
    """`step`/`step_` is the wrapped one on the accumulated mean, once per `every_k`."""
    opt = _recipe(every_k, reduction, max_norm)
    start = _params()
    mine, mine_state = start.clone(), opt.init(start)
    ref, ref_state = start.clone(), opt.optimizer.init(start)
    step = opt.step_ if in_place else opt.step
    ref_step = opt.optimizer.step_ if in_place else opt.optimizer.step
    total = [torch.zeros_like(v) for v in start.values()]
    for call, grads in enumerate(_grads(start, 4 * every_k + 1), start=1):
        mine, mine_state = step(mine, grads, mine_state)
        total = [t + g for t, g in zip(total, grads.values(), strict=True)]
        if call % every_k == 0:
            scale = every_k if reduction == "mean" else 1
            mean = ParamDict(zip(start, [t / scale for t in total], strict=True))
            ref, ref_state = ref_step(ref, mean, ref_state)
            total = [torch.zeros_like(t) for t in total]
        got, want = _leaves((mine, mine_state.inner_state)), _leaves((ref, ref_state))
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        if call % every_k:  # at a round's end the accumulator is left over
            acc = list(mine_state.acc_grads.values())
            assert all(torch.equal(a, t) for a, t in zip(acc, total, strict=True))
    assert opt.step_count(mine_state) == 4 + (every_k == 1)


def test_accumulating_call_leaves_the_wrapped_optimizer_alone() -> None:
    """A call that only accumulates neither runs nor schedules the wrapped step."""
    calls: list[float] = []

    def lam(epoch: Any) -> float:
        calls.append(float(epoch))
        return 1.0

    inner = optim.SGD(lr=optim.LambdaLR(base_lr=0.5, lr_lambda=lam))
    opt = optim.MultiSteps(inner, every_k=3)
    params = ParamDict(w=torch.zeros(2))
    state = opt.init(params)
    grads = {"w": torch.ones(2)}
    held = state.inner_state
    for step in (opt.step, opt.step_):
        calls.clear()
        params, state = step(params, grads, state)
        assert calls == []
        assert state.inner_state is held
        assert int(state.mini_step) in (1, 2)
    calls.clear()
    params, state = opt.step_(params, grads, state)
    assert calls  # the third call steps, and the schedule advances
    assert int(state.mini_step) == 0
    torch.testing.assert_close(params["w"], torch.full((2,), -0.5))


def test_step_in_place_accumulates_into_the_state() -> None:
    """`step_` adds into the state's own accumulator and counter, and the params."""
    opt = optim.MultiSteps(optim.SGD(lr=1.0), every_k=2)
    params = ParamDict(w=torch.zeros(2))
    state = opt.init(params)
    acc, counter, w = state.acc_grads["w"], state.mini_step, params["w"]
    params, state = opt.step_(params, {"w": torch.tensor([1.0, 2.0])}, state)
    assert state.acc_grads["w"] is acc
    assert state.mini_step is counter
    torch.testing.assert_close(acc, torch.tensor([1.0, 2.0]))
    params, state = opt.step_(params, {"w": torch.tensor([3.0, 2.0])}, state)
    assert params["w"] is w
    torch.testing.assert_close(w, torch.tensor([-2.0, -2.0]))
    assert float(counter) == 0.0
    # Not cleared (no pass over it): the next round's first call writes over it.
    params, state = opt.step_(params, {"w": torch.tensor([5.0, -0.0])}, state)
    assert state.acc_grads["w"] is acc
    assert torch.equal(acc, torch.tensor([5.0, -0.0]))
    assert torch.signbit(acc[1])


def test_failing_wrapped_step_writes_nothing() -> None:
    """A failing wrapped step leaves the accumulator and the counter as they were."""

    def boom(epoch: Any) -> float:
        if float(epoch) >= 1:  # the first step moves the schedule to 1
            msg = "bad schedule"
            raise ValueError(msg)
        return 1.0

    opt = optim.MultiSteps(
        optim.SGD(lr=optim.LambdaLR(base_lr=0.1, lr_lambda=boom)), every_k=2
    )
    params = ParamDict(w=torch.zeros(2))
    state = opt.init(params)
    params, state = opt.step_(params, {"w": torch.ones(2)}, state)  # accumulates
    before = [t.clone() for t in _leaves((params, state))]
    with pytest.raises(ValueError, match="bad schedule"):
        opt.step_(params, {"w": torch.ones(2)}, state)
    for got, want in zip(_leaves((params, state)), before, strict=True):
        assert torch.equal(got, want)


@pytest.mark.skipif(
    torch.__version__ < "2.8",
    reason="torch.compile traces a ParamDict in one graph from torch 2.8 on",
)
def test_compiled_step_takes_the_where_form_and_equals_eager() -> None:
    """Compiled, one graph serves every call and equals the eager rule bitwise."""
    torch._dynamo.reset()
    opt = optim.MultiSteps(optim.Adam(lr=0.01, fused=False), every_k=2)
    compiled = torch.compile(opt.step, fullgraph=True, backend="eager")
    start = _params()
    eager, eager_state = start, opt.init(start)
    traced, traced_state = start, opt.init(start)
    for i, grads in enumerate(_grads(start, 5)):
        eager, eager_state = opt.step(eager, grads, eager_state)
        if i >= 2:  # compiled once: the count is not guarded on
            with torch._dynamo.config.patch(error_on_recompile=True):
                traced, traced_state = compiled(traced, grads, traced_state)
        else:
            traced, traced_state = compiled(traced, grads, traced_state)
    for a, b in zip(_leaves((traced, traced_state)), _leaves((eager, eager_state))):
        assert torch.equal(a, b)
    torch._dynamo.reset()


@pytest.mark.parametrize("form", ["step", "step_", "traced"])
def test_first_micro_batch_is_written_as_backward_writes_grad(form: str) -> None:
    """A first gradient of -0.0 stays -0.0 in the sum, as in torch's `.grad`."""
    opt = optim.MultiSteps(optim.SGD(lr=0.1), every_k=3)
    params = ParamDict(w=torch.zeros(3))
    state = opt.init(params)
    grads = ParamDict(w=torch.tensor([-0.0, 1.0, -2.0]))
    if form == "traced":  # the `where` form, as `torch.compile` runs it
        torch._dynamo.reset()
        compiled = torch.compile(opt.step, backend="eager", fullgraph=True)
        _, state = compiled(params, grads, state)
        acc = state.acc_grads["w"]
        torch._dynamo.reset()
    else:
        step = opt.step if form == "step" else opt.step_
        _, state = step(params, grads, state)
        acc = state.acc_grads["w"]
    assert torch.equal(acc, grads["w"])
    assert torch.signbit(acc[0]), "the sign of -0.0 was lost"
    ref = torch.zeros(3, requires_grad=True)
    (grad,) = torch.autograd.grad((ref * grads["w"]).sum(), [ref])
    assert torch.signbit(grad[0]), "torch's gradient keeps the sign"
