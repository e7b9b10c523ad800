"""A 0-dim tensor `lr` takes torch's fused kernels where torch.optim's does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from paramdict import ParamDict, optim
from paramdict.optim import _fused

F32, F64 = torch.float32, torch.float64

# (ours, theirs, options): each class with a fused kernel, most options on.
KERNELS: dict[str, tuple[Any, Any, dict[str, Any]]] = {
    "Adam": (optim.Adam, torch.optim.Adam, {"weight_decay": 0.1, "amsgrad": True}),
    "AdamW": (optim.AdamW, torch.optim.AdamW, {"maximize": True}),
    "SGD": (
        optim.SGD,
        torch.optim.SGD,
        {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    ),
    "Adagrad": (optim.Adagrad, torch.optim.Adagrad, {"lr_decay": 0.01}),
}
STEPS = 5


def _entries(dtype: torch.dtype) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(7, 5, generator=generator, dtype=dtype),
        "b": torch.randn(5, generator=generator, dtype=dtype),
        "s": torch.randn((), generator=generator, dtype=dtype),
    }


def _grads(dtype: torch.dtype) -> list[dict[str, Tensor]]:
    generator = torch.Generator().manual_seed(1)
    shapes = {k: v.shape for k, v in _entries(dtype).items()}
    return [
        {k: torch.randn(s, generator=generator, dtype=dtype) for k, s in shapes.items()}
        for _ in range(STEPS)
    ]


def _torch_run(
    theirs: Callable[..., torch.optim.Optimizer],
    lr: float | Tensor,
    options: dict[str, Any],
    dtype: torch.dtype,
    schedule: Callable[[torch.optim.Optimizer], Any] | None = None,
) -> list[Tensor]:
    """torch.optim with `fused=True`, stepped `STEPS` times; its parameters."""
    params = [torch.nn.Parameter(v) for v in _entries(dtype).values()]
    opt = theirs(params, lr=lr, fused=True, **options)
    scheduler = schedule(opt) if schedule is not None else None
    for grads in _grads(dtype):
        for p, g in zip(params, grads.values(), strict=True):
            p.grad = g
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return [p.detach() for p in params]


def _path(
    opt: optim.Optimizer[Any], params: ParamDict, state: Any, in_place: bool
) -> str:
    """The path a step of `opt` takes: torch's fused kernel, or the rule."""
    plan = opt._plan(params, state, in_place=in_place)  # pyright: ignore[reportPrivateUsage]
    return "fused" if isinstance(plan, _fused.FusedPlan) else "rule"


def _our_run(
    opt: optim.Optimizer[Any], dtype: torch.dtype, *, in_place: bool
) -> tuple[list[Tensor], list[str]]:
    """`STEPS` steps of `opt` (`step` or `step_`); the parameters and paths taken."""
    params = ParamDict(_entries(dtype))
    state = opt.init(params)
    paths: list[str] = []
    for grads in _grads(dtype):
        paths.append(_path(opt, params, state, in_place))
        params, state = (opt.step_ if in_place else opt.step)(params, grads, state)
    return list(params.values()), paths


def _assert_bitwise(actual: list[Tensor], expected: list[Tensor]) -> None:
    for ours, theirs in zip(actual, expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("lr_dtype", [F32, F64], ids=["lr-float32", "lr-float64"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_tensor_lr_is_torch_fused_bitwise(
    name: str, lr_dtype: torch.dtype, dtype: torch.dtype, in_place: bool
) -> None:
    """Every lr dtype on every entry dtype: the fused path, torch's fused bytes."""
    ours, theirs, options = KERNELS[name]
    lr = torch.tensor(0.0123, dtype=lr_dtype)
    expected = _torch_run(theirs, lr.clone(), options, dtype)
    actual, paths = _our_run(
        ours(lr=lr, fused=True, **options), dtype, in_place=in_place
    )
    assert paths == ["fused"] * STEPS
    _assert_bitwise(actual, expected)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(list(KERNELS)),
    value=st.floats(1e-6, 1.0),
    lr_dtype=st.sampled_from([torch.float16, torch.bfloat16, F32, F64]),
    in_place=st.booleans(),
)
def test_any_tensor_lr_value_is_torch_fused_bitwise(
    name: str, value: float, lr_dtype: torch.dtype, in_place: bool
) -> None:
    """Any rate, in any floating dtype, is read as torch's kernels read it."""
    ours, theirs, options = KERNELS[name]
    lr = torch.tensor(value, dtype=lr_dtype)
    expected = _torch_run(theirs, lr.clone(), options, F32)
    actual, _ = _our_run(ours(lr=lr, **options), F32, in_place=in_place)
    if name == "SGD" and not in_place:  # SGD's default `step` runs the rule
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    else:
        _assert_bitwise(actual, expected)


@pytest.mark.parametrize("name", list(KERNELS))
def test_a_tensor_lr_requiring_grad_is_read_without_recording(name: str) -> None:
    """A learnable rate outside `differentiable=True`: fused, no graph, untouched."""
    ours, theirs, options = KERNELS[name]
    lr = torch.tensor(0.05, requires_grad=True)
    expected = _torch_run(theirs, lr.detach().clone(), options, F32)
    actual, paths = _our_run(ours(lr=lr, **options), F32, in_place=True)
    assert paths == ["fused"] * STEPS
    _assert_bitwise(actual, expected)
    assert lr.grad is None
    assert all(t.grad_fn is None for t in actual)
    assert lr.item() == torch.tensor(0.05).item()


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_a_schedule_with_a_tensor_base_lr_is_fused(in_place: bool) -> None:
    """A schedule reads a tensor `base_lr` as its number: fused, as torch with it.

    torch's scheduler would write each rate into a tensor `lr` (rounding it to
    the tensor's dtype); a schedule here computes in float64 from the value
    given, so the reference is torch's scheduler on that value as a number.
    """
    base = torch.tensor(0.1)
    ours = optim.AdamW(lr=optim.CosineAnnealingLR(base_lr=base, T_max=3), fused=True)
    same = optim.AdamW(
        lr=optim.CosineAnnealingLR(base_lr=float(base), T_max=3), fused=True
    )
    expected = _torch_run(
        torch.optim.AdamW,
        float(base),
        {},
        F32,
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=3),
    )
    actual, paths = _our_run(ours, F32, in_place=in_place)
    assert paths == ["fused"] * STEPS
    _assert_bitwise(actual, expected)
    _assert_bitwise(_our_run(same, F32, in_place=in_place)[0], expected)


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_an_lr_on_another_device_is_refused_under_fused_true(in_place: bool) -> None:
    """A rate neither on the CPU nor on the entries' device: a `ValueError` naming it.

    Nothing is written; the entries are on the CPU and the rate on `meta`.
    """
    params = ParamDict(_entries(F32))
    opt = optim.Adam(lr=torch.tensor(0.1, device="meta"), fused=True)
    state = opt.init(params)
    before = [t.clone() for t in (*params.values(), state.step)]
    with pytest.raises(
        ValueError, match=r"`lr` is a tensor on 'meta'.*'cpu'.*move `lr` there"
    ):
        (opt.step_ if in_place else opt.step)(params, _grads(F32)[0], state)
    for old, new in zip(before, (*params.values(), state.step), strict=True):
        assert torch.equal(old, new)


def test_an_accelerator_lr_goes_to_the_kernel_as_a_float32_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the entries' accelerator: float32 is handed over, float64 refused.

    `meta` stands for the accelerator (marked as having the kernels): the
    plan is made and its commit prepared, nothing is computed. `fused=None`
    takes the rule there (the foreach kernels), `fused=True` the kernel.
    """
    devices = _fused._devices() | {"meta"}  # pyright: ignore[reportPrivateUsage]
    monkeypatch.setattr(_fused, "_devices", lambda: devices)
    params = ParamDict(w=torch.ones(3, device="meta"))
    lr = torch.tensor(0.1, device="meta", requires_grad=True)
    default = optim.Adam(lr=lr)
    assert _path(default, params, default.init(params), True) == "rule"
    opt = optim.Adam(lr=lr, fused=True)
    state = opt.init(params)
    assert _path(opt, params, state, True) == "fused"
    double = torch.tensor(0.1, dtype=F64, device="meta")
    assert _fused.fused_refusal(params, double, 0.0) == (
        "`lr` is a torch.float64 tensor on 'meta' (torch's fused kernels read a "
        "rate on an accelerator as float32; pass `lr.float()` or a rate on the CPU)"
    )
    strict = optim.Adam(lr=double, fused=True)
    with pytest.raises(ValueError, match=r"float64 tensor on 'meta'.*fused=None"):
        _path(strict, params, strict.init(params), True)


@pytest.mark.parametrize("lr_dtype", [F32, F64], ids=["lr-float32", "lr-float64"])
def test_the_tensor_lr_overloads_give_the_bytes_of_the_number(
    lr_dtype: torch.dtype,
) -> None:
    """On the CPU each kernel's `.tensor_lr` overload is its number overload.

    The fused plan reads a CPU rate as a float for that reason; the overload is
    what an accelerator rate takes (the kernels pass it on).
    """
    lr = torch.tensor(0.0123, dtype=lr_dtype)
    results: list[list[Tensor]] = []
    adam = optim.Adam(amsgrad=True, weight_decay=0.1)
    sgd = optim.SGD(momentum=0.9, nesterov=True)
    adagrad = optim.Adagrad()
    for rate in (lr, float(lr)):
        params = ParamDict(_entries(F32))
        grads = ParamDict(_grads(F32)[0])
        values, gvals = list(params.values()), list(grads.values())
        buffers = [[torch.zeros_like(v) for v in values] for _ in range(5)]
        steps = [torch.tensor(1.0)] * len(values)
        _fused.adam_kernel(adam)(values, gvals, buffers[:3], steps, rate)
        _fused.sgd_kernel(sgd)(values, gvals, buffers[3:4], steps, rate)
        _fused.adagrad_kernel(adagrad)(values, gvals, buffers[4:5], steps, rate)
        results.append([*values, *(t for b in buffers for t in b)])
    _assert_bitwise(results[0], results[1])
