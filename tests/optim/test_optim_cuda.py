"""Every optimizer of the table on a CUDA device, against torch.optim there.

Skipped without a CUDA device (CI has none). The CPU suite checks the same
trajectories on the CPU; here the kernels are CUDA's: torch's fused CUDA kernels
(Adam, AdamW, SGD; Adagrad's is CPU-only), with a number `lr` and with a 0-dim
tensor `lr` on the CPU or on the device, and every rule's foreach arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from optim_cases import (
    fused_trajectory_params,
    run_ours,
    run_torch,
    tensor_lr_params,
    trajectory_params,
    unfused,
)

from paramdict import ParamDict, optim
from paramdict.optim import _fused

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"
)

CUDA = "cuda"
STEPS = 20
IN_PLACE = pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])


def _close(actual: ParamDict, expected: dict[str, torch.Tensor]) -> None:
    """float32 within rounding: CUDA's kernels may contract a multiply-add."""
    torch.testing.assert_close(dict(actual), expected, rtol=1e-5, atol=1e-6)


def _equal(actual: ParamDict, expected: dict[str, torch.Tensor]) -> None:
    torch.testing.assert_close(dict(actual), expected, rtol=0, atol=0)


@IN_PLACE
@pytest.mark.parametrize(("ours", "theirs", "kwargs"), trajectory_params())
def test_trajectory_matches_torch_on_cuda(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
    in_place: bool,
) -> None:
    """The rule on CUDA tensors gives torch.optim's trajectory there."""
    expected = run_torch(
        lambda m: theirs(m.parameters(), **kwargs), steps=STEPS, device=CUDA
    )
    opt = ours(**kwargs, **unfused(ours))
    actual = run_ours(opt, steps=STEPS, in_place=in_place, device=CUDA)
    assert all(v.device.type == CUDA for v in actual.values())
    _close(actual, expected)


@IN_PLACE
@pytest.mark.parametrize(("ours", "theirs", "kwargs"), fused_trajectory_params())
def test_fused_trajectory_is_torch_fused_on_cuda(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
    in_place: bool,
) -> None:
    """`fused=True` on CUDA: torch's CUDA kernel, bit for bit; Adagrad refuses.

    torch.optim.Adagrad has no CUDA kernel: it refuses `fused=True` there, and
    so does ours, naming the device, before anything is written.
    """
    if ours is optim.Adagrad:
        with pytest.raises(RuntimeError, match="fused"):
            run_torch(
                lambda m: theirs(m.parameters(), fused=True, **kwargs),
                steps=1,
                device=CUDA,
            )
        with pytest.raises(ValueError, match="'cuda'"):
            run_ours(
                ours(**kwargs, fused=True), steps=1, in_place=in_place, device=CUDA
            )
        return
    expected = run_torch(
        lambda m: theirs(m.parameters(), fused=True, **kwargs), steps=STEPS, device=CUDA
    )
    actual = run_ours(
        ours(**kwargs, fused=True), steps=STEPS, in_place=in_place, device=CUDA
    )
    _equal(actual, expected)


@pytest.mark.parametrize("lr_device", ["cpu", CUDA])
@IN_PLACE
@pytest.mark.parametrize(
    ("ours", "theirs", "kwargs"),
    [p for p in tensor_lr_params(fused_only=True) if p.id != "adagrad"],
)
def test_tensor_lr_takes_the_cuda_kernel(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
    in_place: bool,
    lr_device: str,
) -> None:
    """A 0-dim tensor `lr` (CPU or device) runs the fused kernel: torch's bytes."""
    lr = torch.tensor(0.02, device=lr_device)
    expected = run_torch(
        lambda m: theirs(m.parameters(), lr=lr.clone(), fused=True, **kwargs),
        steps=STEPS,
        device=CUDA,
    )
    opt = ours(lr=lr.clone(), fused=True, **kwargs)
    params = ParamDict(w=torch.ones(3, device=CUDA))
    plan = opt._plan(params, opt.init(params), in_place=in_place)  # pyright: ignore[reportPrivateUsage]
    assert isinstance(plan, _fused.FusedPlan)
    _equal(run_ours(opt, steps=STEPS, in_place=in_place, device=CUDA), expected)


@pytest.mark.parametrize("fused", [None, True, False], ids=["default", "fused", "rule"])
def test_transposed_and_strided_entries_on_cuda(fused: bool | None) -> None:
    """`step_` on transposed and stepped views matches torch.optim.Adam on CUDA.

    The gradients have other strides than the entries (contiguous), the case
    torch's fused kernels get wrong; ours refuses the kernel for them (with
    `fused=True`, naming the keys) or runs the rule.
    """
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(9, 6, generator=gen)
    views = {"t": base.clone().to(CUDA).t(), "s": base.clone().to(CUDA)[::2, 1:]}
    grads = {k: torch.randn(v.shape, generator=gen).to(CUDA) for k, v in views.items()}
    reference = {k: v.clone() for k, v in views.items()}
    params = ParamDict(views)
    opt = optim.Adam(lr=0.1, fused=fused)
    state = opt.init(params)
    if fused:
        before = {k: v.clone() for k, v in views.items()}
        with pytest.raises(ValueError, match="'s'"):
            opt.step_(params, grads, state)
        _equal(params, before)
        return
    tensors = [torch.nn.Parameter(v) for v in reference.values()]
    torch_opt = torch.optim.Adam(tensors, lr=0.1, foreach=True)
    for _ in range(3):
        params, state = opt.step_(params, grads, state)
        for t, g in zip(tensors, grads.values(), strict=True):
            t.grad = g
        torch_opt.step()
    _close(params, {k: t.detach() for k, t in zip(reference, tensors, strict=True)})
    assert params["t"].data_ptr() == views["t"].data_ptr()  # written in place


# The steps that wait for the device (`torch.cuda.set_sync_debug_mode`), by
# optimizer id: each wait is a host read that torch.optim's step makes too.
WAITS: dict[str, str] = {
    "adafactor": "reads each entry's step size on the host, as torch.optim.Adafactor "
    "reads each entry's norms (`.item()`)",
    "asgd": "reads `eta` and `mu` as numbers, as torch.optim.ASGD (it also copies "
    "two rates per entry to the device on every step)",
}


def _entries(dtype: torch.dtype = torch.float32) -> ParamDict:
    gen = torch.Generator().manual_seed(0)
    shapes = {"fc.weight": (5, 3), "fc.bias": (3,), "out.weight": (2, 5)}
    return ParamDict(
        {k: torch.randn(s, generator=gen).to(CUDA, dtype) for k, s in shapes.items()}
    )


@IN_PLACE
@pytest.mark.parametrize(("ours", "theirs", "kwargs"), trajectory_params())
def test_a_step_does_not_wait_for_the_device(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
    in_place: bool,
    request: pytest.FixtureRequest,
) -> None:
    """An eager step on CUDA reads nothing back from the device, as torch's.

    A host read of a device tensor (`item`, a 0-dim tensor taken as a number)
    waits for every kernel queued before it; torch.optim's steps make none.
    """
    known = [
        WAITS[part] for part in request.node.callspec.id.split("-") if part in WAITS
    ]
    params = _entries()
    grads = params.map(lambda v: torch.randn_like(v) * 0.1)
    opt = ours(**kwargs, **unfused(ours))
    state = opt.init(params)
    step = opt.step_ if in_place else opt.step
    for _ in range(2):
        params, state = step(params, grads, state)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        if known:
            pytest.skip(known[0])
        step(params, grads, state)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("where", ["cuda", "cpu"])
@pytest.mark.parametrize("scalar_dtype", ["same", "float64"])
def test_a_shared_scalar_is_the_per_entry_operation(
    dtype: torch.dtype, where: str, scalar_dtype: str
) -> None:
    """`p * t`, `p / t`, `p + t`, `p - t` with one 0-dim `t`: torch's bytes per entry.

    On CUDA the scalar goes to the `.Tensor` overloads once (a CPU one of the
    entries' dtype as its number); the values must be the per-entry kernels'.
    """
    params = _entries(dtype)
    sdtype = dtype if scalar_dtype == "same" else torch.float64
    t = torch.tensor(0.3, dtype=sdtype, device=where)
    cases: dict[str, tuple[ParamDict, Callable[..., torch.Tensor]]] = {
        "mul": (params * t, torch.mul),
        "div": (params / t, torch.div),
        "add": (params + t, torch.add),
        "sub": (params - t, torch.sub),
        "mul method": (params.mul(t), torch.mul),
    }
    for what, (got, fn) in cases.items():
        for key, value in params.items():
            expected = fn(value, t)
            assert got[key].dtype == expected.dtype, what
            assert torch.equal(got[key], expected), (what, key)


def test_a_shared_device_scalar_is_read_on_the_device() -> None:
    """Scaling by a 0-dim device tensor neither waits for the device nor loses grads."""
    params = _entries()
    t = torch.tensor(0.3, device=CUDA)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _ = (params * t, params / t, params + t)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    # Recorded by autograd, the scalar keeps its gradient (the per-entry form).
    lr = torch.tensor(0.3, device=CUDA, requires_grad=True)
    loss = torch.stack([(v * lr).sum() for v in (params * lr).values()]).sum()
    (grad,) = torch.autograd.grad(loss, lr)
    # d/dlr of sum(v * lr * lr) over every entry: 2 * lr * sum(v)
    expected = torch.stack([2 * 0.3 * v.sum() for v in params.values()]).sum()
    torch.testing.assert_close(grad, expected)
