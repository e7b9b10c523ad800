"""A state checked once is not compared again, and anything changed is checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _torch_versions import ONE_GRAPH
from torch import nn

from paramdict import ParamDict, optim
from paramdict.optim import _state_check


def _setup() -> tuple[ParamDict, ParamDict, optim.Adam, optim.AdamState]:
    torch.manual_seed(0)
    params = ParamDict(w=torch.randn(3, 2), b=torch.randn(2))
    grads = params.map(torch.randn_like)
    opt = optim.Adam(lr=0.1)
    return params, grads, opt, opt.init(params)


def _count_full_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = _state_check.check_buffers

    def counted(opt: Any, params: ParamDict, state: Any) -> None:
        calls.append(1)
        original(opt, params, state)

    monkeypatch.setattr("paramdict.optim._torch_optimizer.check_buffers", counted)
    return calls


@pytest.mark.parametrize(("mode", "full_checks"), [("step", 1), ("step_", 1)])
def test_a_state_checked_in_step_in_place_is_not_compared_again(
    monkeypatch: pytest.MonkeyPatch, mode: str, full_checks: int
) -> None:
    """`step_` gets the same objects back, `step` new ones of the same facts: once."""
    params, grads, opt, state = _setup()
    calls = _count_full_checks(monkeypatch)
    step = opt.step if mode == "step" else opt.step_
    for _ in range(4):
        params, state = step(params, grads, state)
    assert len(calls) == full_checks


def test_the_skipped_check_changes_no_number() -> None:
    """Steps with the kept verdict equal torch.optim.Adam's, bitwise (fused)."""
    params, grads, opt, state = _setup()
    ref = [t.detach().clone().requires_grad_() for t in params.values()]
    torch_opt = torch.optim.Adam(ref, lr=0.1, fused=True)
    for _ in range(5):
        params, state = opt.step(params, grads, state)
        for t, g in zip(ref, grads.values()):
            t.grad = g.clone()
        torch_opt.step()
    for ours, theirs in zip(params.values(), ref):
        torch.testing.assert_close(ours, theirs.detach(), rtol=0, atol=0)


def _replaced_buffer(params: ParamDict, state: Any) -> tuple[ParamDict, Any]:
    return params, state._replace(exp_avg=state.exp_avg.map(lambda t: t[:1]))


def _swapped_data(params: ParamDict, state: Any) -> tuple[ParamDict, Any]:
    params["w"].data = params["w"].data.double()  # what `module.double()` does
    return params, state


def _resized_buffer(params: ParamDict, state: Any) -> tuple[ParamDict, Any]:
    state.exp_avg["w"].resize_(2)  # a fused kernel would write past its end
    return params, state


def _other_params(params: ParamDict, state: Any) -> tuple[ParamDict, Any]:
    return params.map(lambda t: t.reshape(-1)), state


def _buffer_as_dict(params: ParamDict, state: Any) -> tuple[ParamDict, Any]:
    return params, state._replace(exp_avg=dict(state.exp_avg))


TAMPERED: dict[str, Callable[[ParamDict, Any], tuple[ParamDict, Any]]] = {
    "replaced buffer": _replaced_buffer,
    "swapped data": _swapped_data,
    "resized buffer": _resized_buffer,
    "other params": _other_params,
    "buffer as dict": _buffer_as_dict,
}


@pytest.mark.parametrize("mode", ["step", "step_"])
@pytest.mark.parametrize("tamper", list(TAMPERED), ids=str)
def test_anything_changed_since_the_check_is_checked(tamper: str, mode: str) -> None:
    """A state or parameters changed after a step are refused as on first sight."""
    params, grads, opt, state = _setup()
    step = opt.step if mode == "step" else opt.step_
    params, state = step(params, grads, state)
    params, state = TAMPERED[tamper](params, state)
    grads = params.map(torch.zeros_like)
    with pytest.raises((TypeError, ValueError), match=r"exp_avg|must match|ParamDict"):
        step(params, grads, state)


def test_another_optimizer_checks_the_state_again() -> None:
    """The verdict belongs to the optimizer: another one's options are checked."""
    params, grads, opt, state = _setup()
    params, state = opt.step_(params, grads, state)
    amsgrad = optim.Adam(lr=0.1, amsgrad=True)
    with pytest.raises(ValueError, match=r"`max_exp_avg_sq` is empty"):
        amsgrad.step_(params, grads, state)


def test_module_conversion_after_a_step_is_refused_by_key() -> None:
    """`model.double()` swaps the parameters' data under the ParamDict: refused."""
    model = nn.Linear(2, 1)
    params = ParamDict.from_module(model)
    opt = optim.AdamW(lr=0.1)
    state = opt.init(params)
    grads = params.map(torch.ones_like)
    params, state = opt.step_(params, grads, state)
    model.double()
    before = [t.clone() for t in state.exp_avg.values()]
    with pytest.raises(ValueError, match=r"exp_avg.*'bias'"):
        opt.step_(params, params.map(torch.ones_like), state)
    for kept, now in zip(before, state.exp_avg.values()):
        assert torch.equal(kept, now)


@ONE_GRAPH
def test_a_compiled_step_keeps_no_binding() -> None:
    """A binding is an eager shortcut: a compiled `step` neither keeps nor reads one."""
    params, grads, opt, state = _setup()
    params = params.detach()
    step = torch.compile(opt.step, backend="eager", fullgraph=True)
    step(params, grads, state)
    assert getattr(opt, "_last", None) is None
    opt.step(params, grads, state)
    assert getattr(opt, "_last", None) is not None
