"""`step_` keeps its verdict on what it may write only while nothing changes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from paramdict import ParamDict, optim


def _setup(opt: optim.Optimizer[Any]) -> tuple[ParamDict, ParamDict, Any]:
    params = ParamDict(w=torch.randn(3, 4), b=torch.randn(4), s=torch.randn(4, 4))
    grads = params.ones_like()
    state = opt.init(params)
    params, state = opt.step_(params, grads, state)  # the verdict is kept
    return params, grads, state


def _snapshot(tree: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    leaves = [t for t in torch.utils._pytree.tree_leaves(tree) if torch.is_tensor(t)]
    return [(t, t.clone()) for t in leaves]


def _unchanged(snapshot: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for tensor, copy in snapshot:
        assert torch.equal(tensor, copy)


def _share_a_buffer(params: ParamDict, state: Any) -> None:
    state.exp_avg["b"].set_(params["b"])  # a buffer now reads a parameter


def _data_into_another(params: ParamDict, state: Any) -> None:
    params["b"].data = params["w"][0]  # same shape, another entry's memory


def _expand_in_place(params: ParamDict, state: Any) -> None:
    b = params["b"]
    b.set_(b.untyped_storage(), b.storage_offset(), (4,), (0,))  # one element, 4x


SPOILS: list[tuple[str, Callable[[ParamDict, Any], None], str]] = [
    ("set_-into-a-parameter", _share_a_buffer, "share memory"),
    ("data-into-another-entry", _data_into_another, "share memory"),
    ("set_-to-an-expand", _expand_in_place, "share one memory location"),
]


@pytest.mark.parametrize(
    ("spoil", "match"), [pytest.param(f, m, id=i) for i, f, m in SPOILS]
)
def test_a_change_after_a_step_is_checked_again(
    spoil: Callable[[ParamDict, Any], None], match: str
) -> None:
    """Memory re-pointed between steps (`set_`, `.data =`) is refused, not trusted."""
    opt = optim.Adam(lr=0.1)
    params, grads, state = _setup(opt)
    spoil(params, state)
    before = _snapshot((params, state))
    with pytest.raises(ValueError, match=match):
        opt.step_(params, grads, state)
    _unchanged(before)


def test_a_gradient_sharing_memory_is_refused_on_every_step() -> None:
    """The kept verdict covers params and state; the gradients are checked each time."""
    opt = optim.SGD(lr=0.1, momentum=0.9)
    params, grads, state = _setup(opt)
    bad = ParamDict(w=grads["w"], b=params["b"], s=grads["s"])
    before = _snapshot((params, state))
    with pytest.raises(ValueError, match=r"grads\['b'\]"):
        opt.step_(params, bad, state)
    _unchanged(before)


def test_inference_tensors_are_refused_after_a_step_inside_inference_mode() -> None:
    """A verdict reached inside `inference_mode` does not carry outside it."""
    opt = optim.SGD(lr=0.1)
    with torch.inference_mode():
        params = ParamDict(w=torch.randn(3))
        state = opt.init(params)
        params, state = opt.step_(params, params.ones_like(), state)
    with pytest.raises(ValueError, match="inference tensors"):
        opt.step_(params, ParamDict(w=torch.ones(3)), state)


def test_a_loop_with_a_verdict_kept_equals_one_checked_in_full() -> None:
    """Steps that reuse the verdict give the same bytes as fresh, fully checked ones."""
    torch.manual_seed(0)
    start = ParamDict(w=torch.randn(5, 3), b=torch.randn(3))
    grads = [start.randn_like() for _ in range(6)]
    opt = optim.AdamW(lr=0.05, weight_decay=0.1)
    kept, kept_state = start.clone(), opt.init(start)
    fresh, fresh_state = start.clone(), opt.init(start)
    for g in grads:
        kept, kept_state = opt.step_(kept, g, kept_state)
        # Another tensor in between: the next call checks `fresh` in full.
        opt.step_(
            ParamDict(x=torch.zeros(1)),
            ParamDict(x=torch.ones(1)),
            opt.init(ParamDict(x=torch.zeros(1))),
        )
        fresh, fresh_state = opt.step_(fresh, g, fresh_state)
    for key in start:
        assert torch.equal(kept[key], fresh[key])


def test_a_change_made_in_one_thread_is_refused_in_another() -> None:
    """The kept record is the optimizer's: another thread sees the change too."""
    opt = optim.Adam(lr=0.1)
    params, grads, state = _setup(opt)
    _share_a_buffer(params, state)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            opt.step_(params, grads, state)
        except ValueError as error:
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert len(errors) == 1
    assert "share memory" in str(errors[0])
