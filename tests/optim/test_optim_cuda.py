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
from paramdict.optim import _strategy
from paramdict.optim._strategy import Path

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
    choice = _strategy.choose(opt, params, opt.init(params), in_place=in_place)
    assert choice.path in (Path.FUSED, Path.FUSED_COPIES)
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
