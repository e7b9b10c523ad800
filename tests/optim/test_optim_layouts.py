"""Every step path against torch.optim on tensors of every memory layout.

torch's fused kernels walk memory in order; gradients here come from anywhere
(`einsum`, transposes, slices, channels-last convolutions). Each example lays out
the parameters, the gradients and the state at random (contiguous, transposed,
channels-last, a stepped slice of a larger tensor, an offset view, an expanded
gradient), runs three steps in one mode, and compares with torch.optim on tensors
of the same layouts with `.grad` set to the same gradients (float64, rtol 1e-12).
Around each view a guard region of its base tensor must keep every byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optim_cases import NEWER_TORCH, TABLE, Case, unfused
from torch import Tensor, nn

from paramdict import ParamDict, optim

F64 = torch.float64
STEPS = 3
LAYOUTS = ("contiguous", "transposed", "channels_last", "stepped", "offset")
GRAD_LAYOUTS = (*LAYOUTS, "expanded")
# (shape) per key; Muon's row takes matrices only, named like the MLP's weights.
SHAPES: dict[str, tuple[int, ...]] = {
    "lin.weight": (3, 4),
    "conv.weight": (2, 3, 2, 2),
    "bias": (5,),
    "scale": (),
    "empty": (0, 3),
}
MATRICES: dict[str, tuple[int, ...]] = {"a.weight": (3, 4), "b.weight": (4, 2)}


class Placed:
    """A tensor laid out in a base tensor, with what else of the base it must keep."""

    def __init__(self, values: Tensor, layout: str) -> None:
        shape = tuple(values.shape)
        if layout == "transposed" and len(shape) >= 2:
            base = torch.empty(shape[::-1], dtype=values.dtype)
            view = base.permute(*reversed(range(len(shape))))
        elif layout == "channels_last" and len(shape) == 4:
            base = torch.empty(
                shape, dtype=values.dtype, memory_format=torch.channels_last
            )
            view = base
        elif layout == "stepped" and len(shape) >= 1:
            base = torch.full((*shape[:-1], 2 * shape[-1] + 1), -7, dtype=values.dtype)
            view = base[..., 1::2]
        elif layout == "offset":
            base = torch.full((values.numel() + 5,), -7, dtype=values.dtype)
            view = base[2 : 2 + values.numel()].view(shape)
        elif layout == "expanded" and len(shape) >= 1 and shape[0] > 1:
            base = values[:1].clone()
            self.base, self.tensor = base, base.expand(shape)
            self._mask = torch.ones_like(base, dtype=torch.bool)
            return
        else:
            base = torch.empty(shape, dtype=values.dtype)
            view = base
        view.copy_(values)
        self.base, self.tensor = base, view
        mask = torch.zeros(base.numel(), dtype=torch.bool)
        offset = view.storage_offset() - base.storage_offset()
        mask.as_strided(view.shape, view.stride(), offset).fill_(True)
        self._mask = mask.view(base.shape) if base.dim() else mask.view(())

    def guard(self) -> Tensor:
        """The base's elements outside the tensor (a copy)."""
        return self.base[~self._mask].clone()


def _entries(case: Case) -> dict[str, tuple[int, ...]]:
    if case.matrices_only:
        return MATRICES
    if case.name == "adafactor":  # torch's Adafactor divides by zero on empty entries
        return {k: s for k, s in SHAPES.items() if k != "empty"}
    return SHAPES


def _values(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        k: torch.randn(s, generator=generator, dtype=F64) for k, s in shapes.items()
    }


def _buffers_mapped(state: Any, fn: Callable[[ParamDict], ParamDict]) -> Any:
    """`state` with `fn` applied to every non-empty ParamDict in it (its buffers)."""
    if isinstance(state, ParamDict):
        return fn(state) if state else state
    if isinstance(state, tuple):
        fields = [_buffers_mapped(f, fn) for f in state]
        return type(state)(*fields) if hasattr(state, "_fields") else tuple(fields)
    return state


def _relayout_state(state: Any, draw: Callable[[], str]) -> Any:
    """`state` with each buffer moved to a drawn layout."""
    return _buffers_mapped(state, lambda b: b.map(lambda v: Placed(v, draw()).tensor))


def _torch_run(
    case: Case,
    kwargs: dict[str, Any],
    params: dict[str, Placed],
    grads: list[dict[str, Placed]],
) -> dict[str, Tensor]:
    tensors = {k: p.tensor for k, p in params.items()}
    opt = case.theirs(list(tensors.values()), **kwargs)
    for step_grads in grads:
        for k, t in tensors.items():
            t.grad = step_grads[k].tensor
        opt.step()
    return {k: t.detach().clone() for k, t in tensors.items()}


MODES = ("step", "step-unfused", "step_", "step_-fused", "differentiable", "module")


def _configs() -> list[Any]:
    out = []
    for case in TABLE:
        for mode in MODES:
            fusable = bool(unfused(case.ours))
            if mode in ("step-unfused", "step_-fused") and not fusable:
                continue
            name = case.name
            out.append(
                pytest.param(
                    case, mode, id=f"{name}-{mode}", marks=NEWER_TORCH.get(name, ())
                )
            )
    return out


def _options(case: Case, mode: str) -> dict[str, Any]:
    kwargs = dict(case.rich)
    if case.name == "sgd" and mode == "step_-fused":
        kwargs.pop("dampening")  # fused SGD refuses dampening with momentum
    if mode == "step-unfused":
        kwargs |= unfused(case.ours)
    elif mode == "step_-fused":
        kwargs["fused"] = True
    elif mode == "differentiable":
        kwargs["differentiable"] = True
    return kwargs


def _torch_options(case: Case, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k not in ("fused", "differentiable")}


class _Holder(nn.Module):
    def __init__(self, tensors: dict[str, Tensor]) -> None:
        super().__init__()
        for key, t in tensors.items():
            self.register_parameter(key.replace(".", "_"), nn.Parameter(t))


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def _check(case: Case, mode: str, data: st.DataObject) -> None:
    shapes = _entries(case)
    layout = st.sampled_from(LAYOUTS)
    param_layouts = {k: data.draw(layout, label=f"param {k}") for k in shapes}
    seed = data.draw(st.integers(0, 2**16), label="seed")
    start = _values(shapes, seed)
    grads = []
    for step in range(STEPS):
        values = _values(shapes, seed + 1 + step)
        drawn = {k: data.draw(st.sampled_from(GRAD_LAYOUTS)) for k in shapes}
        grads.append({k: Placed(values[k], drawn[k]) for k in shapes})
    kwargs = _options(case, mode)
    theirs = {k: Placed(v, param_layouts[k]) for k, v in start.items()}
    expected = _torch_run(case, _torch_options(case, kwargs), theirs, grads)

    mine = {k: Placed(v, param_layouts[k]) for k, v in start.items()}
    guards = {k: p.guard() for k, p in mine.items()}
    opt = case.ours(**kwargs)
    params = ParamDict({k: p.tensor for k, p in mine.items()})
    state = opt.init(params)
    if data.draw(st.booleans(), label="relayout state"):
        state = _relayout_state(state, lambda: data.draw(layout))
    actual = (
        _module_run(opt, params, state, grads)
        if mode == "module"
        else _paramdict_run(opt, mode, params, state, grads)
    )
    if actual is None:  # refused: nothing may have changed
        torch.testing.assert_close(
            {k: p.tensor for k, p in mine.items()}, start, rtol=0, atol=0
        )
    else:
        torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-13)
    for key, placed in mine.items():
        torch.testing.assert_close(placed.guard(), guards[key], rtol=0, atol=0)


def _paramdict_run(
    opt: optim.Optimizer[Any],
    mode: str,
    params: ParamDict,
    state: Any,
    grads: list[dict[str, Placed]],
) -> dict[str, Tensor] | None:
    for step_grads in grads:
        g = ParamDict({k: step_grads[k].tensor for k in params})
        if mode.startswith("step_"):
            try:
                params, state = opt.step_(params, g, state)
                continue
            except ValueError as error:
                refusal = str(error)
            # Only `fused=True` may refuse a layout, before writing anything.
            assert mode == "step_-fused", refusal
            assert "(fused=True)` cannot write the step" in refusal, refusal
            return None
        params, state = opt.step(params, g, state)
    return {k: v.detach().clone() for k, v in params.items()}


def _module_run(
    opt: optim.Optimizer[Any],
    params: ParamDict,
    state: Any,
    grads: list[dict[str, Placed]],
) -> dict[str, Tensor]:
    module = _Holder(dict(params))
    names = {k.replace(".", "_"): k for k in params}
    state = _buffers_mapped(
        state, lambda b: ParamDict({k.replace(".", "_"): v for k, v in b.items()})
    )
    for step_grads in grads:
        # The loss's gradient for each entry is the drawn gradient, laid out as
        # autograd makes it from that tensor.
        def loss_fn(step_grads: dict[str, Placed] = step_grads) -> Tensor:
            return sum(
                (p * step_grads[names[n]].tensor).sum()
                for n, p in module.named_parameters()
            )  # type: ignore[return-value]

        _, state = opt.step_module(module, loss_fn, state)
    return {names[n]: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize(("case", "mode"), _configs())
def test_layouts_match_torch(case: Case, mode: str) -> None:
    """Three steps on random layouts equal torch.optim; no byte outside changes."""
    _check(case, mode)
