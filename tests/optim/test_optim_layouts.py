"""Every step path against torch.optim on tensors of every memory layout.

torch's fused kernels walk memory in order; gradients here come from anywhere
(`einsum`, transposes, slices, channels-last convolutions). Each example lays out
the parameters, the gradients and the state at random (contiguous, transposed,
channels-last, a stepped slice of a larger tensor, an offset view; for a
gradient also expanded, or a view with the negative bit set, as the imaginary
part of a conjugated complex tensor is), runs three steps in one mode, and
compares with torch.optim on tensors of the same layouts with `.grad` set to the
same gradients (float64, rtol 1e-12).
Around each view a guard region of its base tensor must keep every byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from optim_cases import TABLE, Case, unfused
from torch import Tensor, nn

from paramdict import ParamDict, optim

F64 = torch.float64
STEPS = 3
LAYOUTS = ("contiguous", "transposed", "channels_last", "stepped", "offset")
GRAD_LAYOUTS = (*LAYOUTS, "expanded", "negated")
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
        elif layout == "negated":  # the negative bit set: a view reading `-base`
            base = values.neg()
            self.base, self.tensor = base, base._neg_view()
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


def _values(
    shapes: dict[str, tuple[int, ...]], seed: int, dtype: torch.dtype = F64
) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        k: torch.randn(s, generator=generator, dtype=dtype) for k, s in shapes.items()
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


MODES = (
    "step",
    "step-unfused",
    "step_",
    "step_-unfused",
    "step_-fused",
    "differentiable",
    "module",
)


def _configs() -> list[Any]:
    out = []
    for case in TABLE:
        for mode in MODES:
            fusable = bool(unfused(case.ours))
            if mode in ("step-unfused", "step_-unfused", "step_-fused") and not fusable:
                continue
            name = case.name
            out.append(
                pytest.param(case, mode, id=f"{name}-{mode}", marks=case.mark(name))
            )
    return out


def _options(case: Case, mode: str) -> dict[str, Any]:
    kwargs = dict(case.rich)
    if case.name == "sgd" and mode == "step_-fused":
        kwargs.pop("dampening")  # fused SGD refuses dampening with momentum
    if mode in ("step-unfused", "step_-unfused"):
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
    elif mode == "differentiable":
        # torch's differentiable arithmetic (Adam's bias corrections from a float32
        # step tensor, `test_optim_differentiable_torch.py`) against its default
        # path: about 1e-7 apart in float64, as torch's own two paths are.
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
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


# ------------------------------------------------- the same bytes in every layout


def _leaves(state: Any, prefix: str = "state") -> dict[str, Tensor]:
    """Every tensor of `state` by its path (buffers entry by entry)."""
    if isinstance(state, Tensor):
        return {prefix: state}
    if isinstance(state, ParamDict):
        return {f"{prefix}[{k!r}]": v for k, v in state.items()}
    if isinstance(state, tuple):
        names = getattr(state, "_fields", range(len(state)))
        out: dict[str, Tensor] = {}
        for name, field in zip(names, state, strict=True):
            out |= _leaves(field, f"{prefix}.{name}")
        return out
    return {}


def _bytes_run(
    opt: optim.Optimizer[Any],
    mode: str,
    start: dict[str, Tensor],
    grads: list[dict[str, Placed]],
    layout: Callable[[str], str],
) -> dict[str, Tensor]:
    """Steps of `opt` in `mode` with params and state laid out by `layout`."""
    params = ParamDict(
        {k: Placed(v, layout(f"param {k}")).tensor for k, v in start.items()}
    )
    state = opt.init(params)
    state = _buffers_mapped(
        state,
        lambda b: ParamDict(
            {k: Placed(v, layout(f"state {k}")).tensor for k, v in b.items()}
        ),
    )
    if mode == "module":
        new = _module_run(opt, params, state, grads)
        return {f"param {k}": v for k, v in new.items()}
    for step_grads in grads:
        g = ParamDict({k: step_grads[k].tensor for k in params})
        if mode.startswith("step_"):
            params, state = opt.step_(params, g, state)
        else:
            params, state = opt.step(params, g, state)
    out = {f"param {k}": v.detach().clone() for k, v in params.items()}
    return out | {k: v.detach().clone() for k, v in _leaves(state).items()}


def _bits(t: Tensor) -> Tensor:
    """`t`'s elements as integers of their width (NaNs and signed zeros kept)."""
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(width[t.element_size()])


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(data=st.data())
def _check_bytes(
    make: Callable[[], optim.Optimizer[Any]],
    shapes: dict[str, tuple[int, ...]],
    mode: str,
    data: st.DataObject,
) -> None:
    seed = data.draw(st.integers(0, 2**16), label="seed")
    start = _values(shapes, seed, torch.float32)
    grad_layout = st.sampled_from(GRAD_LAYOUTS)
    grads = [
        {
            k: Placed(v, data.draw(grad_layout, label=f"grad {i} {k}"))
            for k, v in _values(shapes, seed + 1 + i, torch.float32).items()
        }
        for i in range(STEPS)
    ]
    # The same gradients' values (an expanded gradient repeats its first row), dense.
    dense_grads = [
        {k: Placed(p.tensor.contiguous(), "contiguous") for k, p in g.items()}
        for g in grads
    ]
    layout = st.sampled_from(LAYOUTS)
    runs = [
        _bytes_run(make(), mode, start, dense_grads, lambda _: "contiguous"),
        _bytes_run(
            make(), mode, start, grads, lambda label: data.draw(layout, label=label)
        ),
    ]
    dense, drawn = runs
    assert drawn.keys() == dense.keys()
    differ = [
        k
        for k in dense
        if dense[k].dtype != drawn[k].dtype
        or not torch.equal(_bits(dense[k]), _bits(drawn[k]))
    ]
    assert not differ, f"bytes differ from the dense run's at {differ}"


@pytest.mark.parametrize(("case", "mode"), _configs())
def test_layouts_give_the_bytes_of_dense_tensors(case: Case, mode: str) -> None:
    """A layout never changes a number: every mode's float32 bytes are dense's."""
    _check_bytes(lambda: case.ours(**_options(case, mode)), _entries(case), mode)


@pytest.mark.parametrize("mode", ["step", "step_"])
@pytest.mark.parametrize("name", ["groups", "clip", "multisteps"])
def test_wrappers_on_layouts_give_the_bytes_of_dense_tensors(
    name: str, mode: str
) -> None:
    """ParamGroups, ClipGradNorm and MultiSteps: float32 bytes of dense tensors."""
    _check_bytes(lambda: _ours_wrapped(name), SHAPES, mode)


# ---------------------------------------------------------------- an einsum layer


def _einsum_loss(weight: Tensor, x: Tensor) -> Tensor:
    return torch.einsum("bi,oi->bo", x, weight).pow(2).sum()


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize(
    "case",
    [pytest.param(c, id=c.name, marks=c.mark(c.name)) for c in TABLE],
)
def test_einsum_layer_matches_torch(case: Case, in_place: bool) -> None:
    """An `einsum` layer (transposed gradients) trains as with torch.optim (float32)."""
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(3, 4, generator=generator)
    x = torch.randn(5, 4, generator=generator)
    kwargs = dict(case.rich)
    weight = start.clone().requires_grad_()
    theirs = case.theirs([weight], **kwargs)
    for _ in range(5):
        theirs.zero_grad()
        torch.autograd.backward(_einsum_loss(weight, x))
        theirs.step()
    opt = case.ours(**kwargs)
    params = ParamDict(weight=start.clone().requires_grad_())
    state = opt.init(params)
    for _ in range(5):
        grads = params.grad(_einsum_loss(params["weight"], x))
        assert grads["weight"].stride() == (1, 3)  # what torch's einsum gives
        if in_place:
            params, state = opt.step_(params, grads, state)
        else:
            params, state = opt.step(params, grads, state)
    torch.testing.assert_close(
        params["weight"].detach(), weight.detach(), rtol=1e-6, atol=1e-6
    )


# ---------------------------------------------------------------- wrappers


def _torch_wrapped(
    name: str, tensors: dict[str, Tensor], grads: list[dict[str, Tensor]]
) -> dict[str, Tensor]:
    """The reference of each wrapper, written with torch.optim."""
    if name == "groups":
        lin = [t for k, t in tensors.items() if k.startswith("lin")]
        rest = [t for k, t in tensors.items() if not k.startswith("lin")]
        opts = [
            torch.optim.Adam(lin, lr=0.01),
            torch.optim.SGD(rest, lr=0.1, momentum=0.9),
        ]
    else:
        opts = [torch.optim.Adam(list(tensors.values()), lr=0.01)]
    every = 2 if name == "multisteps" else 1
    for i, step_grads in enumerate(grads):
        for k, t in tensors.items():
            g = step_grads[k] / every
            t.grad = g if t.grad is None else t.grad + g
        if (i + 1) % every:
            continue
        if name == "clip":
            torch.nn.utils.clip_grad_norm_(list(tensors.values()), 0.5)
        for opt in opts:
            opt.step()
            opt.zero_grad()
    return {k: t.detach().clone() for k, t in tensors.items()}


def _ours_wrapped(name: str) -> optim.Optimizer[Any]:
    if name == "groups":
        return optim.ParamGroups(
            {"lin.*": optim.Adam(lr=0.01)},
            default=optim.SGD(lr=0.1, momentum=0.9),
        )
    if name == "clip":
        return optim.ClipGradNorm(optim.Adam(lr=0.01), max_norm=0.5)
    return optim.MultiSteps(optim.Adam(lr=0.01), every_k=2)


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize("name", ["groups", "clip", "multisteps"])
@settings(max_examples=6, deadline=None, derandomize=True)
@given(data=st.data())
def test_wrappers_on_layouts_match_torch(
    name: str, in_place: bool, data: st.DataObject
) -> None:
    """ParamGroups, ClipGradNorm and MultiSteps on random layouts equal torch."""
    layout = st.sampled_from(LAYOUTS)
    param_layouts = {k: data.draw(layout) for k in SHAPES}
    start = _values(SHAPES, 0)
    grads = [
        {
            k: Placed(v, data.draw(st.sampled_from(GRAD_LAYOUTS))).tensor
            for k, v in _values(SHAPES, 1 + i).items()
        }
        for i in range(4)
    ]
    theirs = {k: Placed(v, param_layouts[k]).tensor for k, v in start.items()}
    expected = _torch_wrapped(name, theirs, grads)
    mine = {k: Placed(v, param_layouts[k]) for k, v in start.items()}
    guards = {k: p.guard() for k, p in mine.items()}
    opt = _ours_wrapped(name)
    params = ParamDict({k: p.tensor for k, p in mine.items()})
    state = opt.init(params)
    for step_grads in grads:
        step = opt.step_ if in_place else opt.step
        params, state = step(params, ParamDict(step_grads), state)
    torch.testing.assert_close(dict(params), expected, rtol=1e-12, atol=1e-13)
    for key, placed in mine.items():
        torch.testing.assert_close(placed.guard(), guards[key], rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["ema", "swa"])
@settings(max_examples=6, deadline=None, derandomize=True)
@given(data=st.data())
def test_averages_on_layouts_match_torch(kind: str, data: st.DataObject) -> None:
    """Weight averages of values of any layout equal the plain torch formula."""
    average = (
        optim.WeightAverage.ema(0.9) if kind == "ema" else optim.WeightAverage.swa()
    )
    layout = st.sampled_from(GRAD_LAYOUTS)
    steps = [_values(SHAPES, i) for i in range(3)]
    state = average.init(ParamDict(steps[0]))
    expected = dict(steps[0])
    for n, values in enumerate(steps):
        placed = {k: Placed(v, data.draw(layout)).tensor for k, v in values.items()}
        state = average.update(state, placed)
        for k, v in placed.items():
            if n == 0:
                expected[k] = v.clone()
            elif kind == "ema":
                expected[k] = torch.lerp(expected[k], v, 1 - 0.9)
            else:
                expected[k] = expected[k] + (v - expected[k]) / (n + 1)
    torch.testing.assert_close(dict(state.averaged), expected, rtol=1e-12, atol=1e-13)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(data=st.data())
def test_collectives_keep_each_element_in_place(data: st.DataObject) -> None:
    """Coalesced collectives read and place strided entries element by element."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import HashStore  # typed; `dist.HashStore` is not

    from paramdict import distributed

    values = _values(SHAPES, 3)
    layout = st.sampled_from(GRAD_LAYOUTS)
    placed = ParamDict(
        {k: Placed(v, data.draw(layout)).tensor for k, v in values.items()}
    )
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        reduced = distributed.all_reduce(placed, bucket_cap_mb=1e-4)
        sent = distributed.broadcast(placed)
        (gathered,) = distributed.all_gather(placed)
    finally:
        dist.destroy_process_group()
    expected = {k: v.clone() for k, v in placed.items()}
    for result in (reduced, sent, gathered):
        torch.testing.assert_close(dict(result), expected, rtol=0, atol=0)


def test_compiled_step_on_layouts_matches_torch() -> None:
    """`torch.compile(opt.step)` on transposed gradients and a sliced parameter."""
    start = _values({"w": (3, 4), "v": (4, 3)}, 5)
    grads = [_values({"w": (3, 4), "v": (4, 3)}, 6 + i) for i in range(3)]
    grads_t = [
        {
            k: Placed(v, "transposed" if k == "w" else "stepped").tensor
            for k, v in g.items()
        }
        for g in grads
    ]
    theirs = {k: Placed(v, "stepped").tensor for k, v in start.items()}
    opt_t = torch.optim.Adam(list(theirs.values()), lr=0.01)
    for g in grads_t:
        for k, t in theirs.items():
            t.grad = g[k]
        opt_t.step()
    opt = optim.Adam(lr=0.01)
    params = ParamDict({k: Placed(v, "stepped").tensor for k, v in start.items()})
    state = opt.init(params)
    step = torch.compile(opt.step, fullgraph=True)
    for g in grads_t:
        params, state = step(params, ParamDict(g), state)
    torch.testing.assert_close(dict(params), dict(theirs), rtol=1e-12, atol=1e-13)
