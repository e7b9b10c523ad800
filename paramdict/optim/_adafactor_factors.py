"""Adafactor's per-entry factors: the relative step size and the update's scale.

`alpha = max(eps2, rms(p)) * min(lr, 1 / sqrt(step))`, and the update's scale
`alpha / max(1, rms(u) / d)`, in three forms with the same numbers (torch's
`.item()` reads and Python floats): on the host (each kind of norm read at once),
on an accelerator (foreach kernels over the 0-dim norms, no read), or traced
(double-precision tensors per entry).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import Tensor

from .._foreach import holds_dtensors
from .._paramdict import ParamDict
from ._hyper import Rate, is_traced
from ._validate import transformed

__all__ = [
    "alphas",
    "device_alphas",
    "device_scales",
    "factor_form",
    "host_alphas",
    "host_scales",
    "host_update",
    "norm",
    "scales",
    "small",
]


def norm(x: Tensor) -> Tensor:
    """Return the 2-norm of all of `x`, summed in row-major order (any layout)."""
    return cast(Tensor, x.contiguous().norm(2))  # pyright: ignore[reportUnknownMemberType]  # torch leaves `dim`, `dtype` of its norms untyped


def factor_form(
    opt: Any, params: ParamDict, grads: ParamDict, step: Tensor, lr: Rate
) -> str:
    """Return the factors' form: `"host"`, `"device"` or `"traced"`.

    `"host"`: eager, outside autograd, on plain CPU tensors and CPU rates;
    `"device"`: the same on another device (no DTensors).
    """
    if (
        opt.differentiable
        or torch.is_grad_enabled()
        or is_traced(step)
        or transformed()
    ):
        return "traced"
    rates = list(lr.values()) if isinstance(lr, ParamDict) else [lr]
    for rate in rates:
        if isinstance(rate, Tensor) and (
            rate.dim() != 0 or type(rate) is not Tensor or not rate.is_cpu
        ):
            return "traced"
    values = [*params.values(), *grads.values()]
    if all(type(v) in _PLAIN and v.is_cpu for v in values):
        return "host"
    return "traced" if holds_dtensors(values) else "device"


_PLAIN = (Tensor, torch.nn.Parameter)


def _host_norms(values: list[Tensor]) -> list[float]:
    """Return `[norm(v).item() for v in values]` (the same bits), read at once."""
    norms = torch.stack(torch._foreach_norm([v.contiguous() for v in values]))
    return cast("list[float]", norms.tolist())  # pyright: ignore[reportUnknownMemberType]


def host_alphas(
    params: ParamDict, lr: Rate, step: Tensor, eps2: float
) -> dict[str, float]:
    """Return each entry's relative step size `alpha`, in numbers."""
    alpha: dict[str, float] = {}
    norms = _host_norms(list(params.values()))
    for (key, p), norm, rho in zip(params.items(), norms, _rhos(params, lr, step)):
        rms = norm / (p.numel() ** 0.5)
        rms = eps2 if rms < eps2 else rms  # `clamp`: NaN stays NaN
        alpha[key] = rms * rho
    return alpha


def _rhos(params: ParamDict, lr: Rate, step: Tensor) -> list[float]:
    """Return each entry's `min(lr, 1 / sqrt(step))`, in numbers."""
    if isinstance(lr, ParamDict):
        stacked = torch.stack([lr[k] for k in params])
        rates = cast("list[float]", stacked.tolist())  # pyright: ignore[reportUnknownMemberType]
    else:
        rates = [float(lr)] * len(params)
    # `1 / sqrt(step)` as `alphas` rounds it: the root of the tensor, then an
    # (exactly rounded) division; `minimum`'s NaN stays NaN.
    inverse = 1.0 / (step**0.5).item()
    return [rate if rate != rate or rate < inverse else inverse for rate in rates]


_SMALL = 1 << 16
"""The mean element count up to which the update takes foreach kernels; larger
entries take `Adafactor._scaled` each, in cache (a tenth faster at 50 x 400,000)."""


def small(x: ParamDict) -> bool:
    """Whether the entries of `x` hold at most `_SMALL` elements on average."""
    return sum(map(Tensor.numel, x.values())) <= _SMALL * len(x)


def host_update(
    estimates: ParamDict, grads: ParamDict, eps1: Callable[[torch.dtype], float]
) -> ParamDict:
    """Return `grads / sqrt(max(estimates, eps1 ** 2))`: `_scaled`'s bits, foreach."""
    values = list(estimates.values())
    dtypes = {v.dtype for v in values}
    floors: float | list[float] = (
        eps1(next(iter(dtypes))) ** 2
        if len(dtypes) == 1
        else [eps1(v.dtype) ** 2 for v in values]
    )
    update = torch._foreach_clamp_min(values, floors)
    torch._foreach_rsqrt_(update)
    torch._foreach_mul_(update, estimates._aligned(grads, what="The gradients"))
    return estimates._derive(update)


def host_scales(
    update: ParamDict, alpha: Mapping[str, float | Tensor], d: float
) -> dict[str, float | Tensor]:
    """Return each entry's factor `alpha / max(1, rms(update) / d)`, in numbers."""
    scale: dict[str, float | Tensor] = {}
    norms = _host_norms(list(update.values()))
    for (key, u), norm in zip(update.items(), norms):
        clip = norm / ((u.numel() ** 0.5) * d)
        clip = 1.0 if clip < 1.0 else clip  # `clamp`: NaN stays NaN
        scale[key] = cast(float, alpha[key]) / clip
    return scale


def _device_norms(values: list[Tensor]) -> list[Tensor]:
    """Each value's 2-norm (torch's kernel per entry), as 0-dim float64 views."""
    norms = torch.stack([norm(v) for v in values])
    return list(norms.to(torch.float64).unbind())


def device_alphas(
    params: ParamDict, lr: Rate, step: Tensor, eps2: float
) -> list[Tensor]:
    """`host_alphas` with the norms left on their device: three foreach kernels."""
    values = list(params.values())
    rms = _device_norms(values)
    torch._foreach_div_(rms, [v.numel() ** 0.5 for v in values])
    torch._foreach_clamp_min_(rms, eps2)  # `clamp`: NaN stays NaN
    torch._foreach_mul_(rms, _rhos(params, lr, step))
    return rms


def device_scales(update: ParamDict, alpha: list[Tensor], d: float) -> list[Tensor]:
    """`host_scales` with the norms left on their device: three foreach kernels."""
    values = list(update.values())
    clip = _device_norms(values)
    torch._foreach_div_(clip, [(u.numel() ** 0.5) * d for u in values])
    torch._foreach_clamp_min_(clip, 1.0)
    return list(torch._foreach_div(alpha, clip))


def alphas(params: ParamDict, step: Tensor, lr: Rate, eps2: float) -> dict[str, Tensor]:
    """Return each entry's relative step size `alpha`, as tensors of `step`'s dtype."""
    inverse_sqrt = torch.div(torch.ones_like(step), step**0.5)
    alpha: dict[str, Tensor] = {}
    for key, p in params.items():
        rate: float | Tensor = lr[key] if isinstance(lr, ParamDict) else lr
        rho = (
            torch.minimum(rate.to(step.dtype), inverse_sqrt)
            if isinstance(rate, Tensor)
            else inverse_sqrt.clamp(max=rate)
        )
        rms = norm(p).to(step.dtype) / (p.numel() ** 0.5)
        alpha[key] = rms.clamp(min=eps2) * rho
    return alpha


def scales(
    update: ParamDict, alpha: Mapping[str, float | Tensor], d: float, dtype: torch.dtype
) -> dict[str, float | Tensor]:
    """Return each entry's factor `alpha / max(1, rms(update) / d)`, as tensors."""
    return {
        k: alpha[k] / (norm(u).to(dtype) / ((u.numel() ** 0.5) * d)).clamp(min=1.0)
        for k, u in update.items()
    }
