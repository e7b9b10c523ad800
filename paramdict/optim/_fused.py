"""torch's fused optimizer kernels, called on ParamDicts by `step_` and `step`.

`torch._fused_adam_`, `_fused_adamw_`, `_fused_sgd_` and `_fused_adagrad_` update
every parameter and buffer of a step in one pass over memory, writing into them.
`Adam`, `AdamW`, `SGD` and `Adagrad` call them here when their `fused` flag and
the step allow it (`fused_rates`, `refusal`): every entry of one dtype (float32 or
float64) on one device that has the kernel, and the rates plain numbers or a
schedule's current value on the CPU (read as the float torch's scheduler writes;
a schedule that cycles the momentum is not fused). `step_`
runs them on the caller's tensors, the default `step` on fresh copies. Any other
step runs the rule.

The arguments are those `torch.optim` passes with `fused=True`: per-parameter step
tensors in single precision, already incremented (here one counter shared by every
entry), and no gradient scaling (`grad_scale` and `found_inf` are `None`). The
fused kernels round differently from the foreach path (they keep intermediates in
registers); their results are bitwise those of `torch.optim` with `fused=True`.
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false, reportPrivateImportUsage=false
# (torch's fused kernels and its list of devices that have them are private)
from typing import Any, Protocol, cast

import torch
import torch.optim.optimizer as _optimizer
from torch import Tensor

from .._foreach import holds_dtensors
from .._paramdict import ParamDict
from ._hyper import Rate, compute_dtype
from ._schedules.slot import is_schedule

__all__ = ["adagrad_", "adam_", "fused_rates", "refusal", "sgd_"]

_DEVICES = frozenset(
    _optimizer._get_fused_kernels_supported_devices()  # type: ignore[attr-defined]  # private, not re-exported
)


def refusal(params: ParamDict, *rates: Rate, cpu_only: bool = False) -> str | None:
    """Return why no fused kernel can take this step, or None when one can.

    Every entry must share float32 or float64 and one device that has fused
    kernels (only the CPU with `cpu_only`), and every rate must be a number.
    """
    if not all(isinstance(r, (int, float)) and not isinstance(r, bool) for r in rates):
        return (
            "a rate is a tensor, a per-key ParamDict or a schedule "
            "(fused kernels take numbers)"
        )
    if compute_dtype(params) is None:
        return "the entries do not all share float32 or float64"
    values = params._vals
    if holds_dtensors(values):
        # Fused SGD and Adagrad have no DTensor sharding rules in torch 2.13: the
        # generic path (foreach kernels that have rules) takes the step.
        return "the entries are DTensors"
    device = values[0].device
    if any(v.device != device for v in values):
        return "the entries are on more than one device"
    if device.type not in _DEVICES or (cpu_only and device.type != "cpu"):
        return f"torch has no fused kernel for this optimizer on {device.type!r}"
    return None


class _Fusable(Protocol):
    """What `fused_rates` reads of an optimizer with a fused kernel."""

    @property
    def fused(self) -> bool | None: ...

    @property
    def lr(self) -> object: ...

    def next_step(self, state: Any, /) -> Tensor: ...

    def rate(self, name: str, step: Tensor, state: object = None, /) -> Rate: ...


def fused_rates(
    opt: _Fusable, params: ParamDict, state: object, *, cpu_only: bool = False
) -> list[float] | None:
    """Return `[lr, weight_decay]` for a fused step under the optimizer's `fused` flag.

    `fused=False`: None (the rule runs). `None`: the rates of the step `state`
    leads to, as floats, when a fused kernel can take it. `True`: the same, and
    a step that cannot be fused is refused.

    Raises:
        ValueError: With `fused=True`, if a fused kernel cannot take the step;
            the message says why and names the fix.
    """
    if opt.fused is False:
        return None
    step = opt.next_step(state)
    rates = (opt.rate("lr", step, state), opt.rate("weight_decay", step, state))
    why = _scheduled_refusal(opt, params)
    if why is None and is_schedule(opt.lr):
        # The rate torch's scheduler would have written into the group, as the
        # float it is (a host read, free on the CPU).
        rates = (float(cast(Tensor, rates[0])), rates[1])
    why = why or refusal(params, *rates, cpu_only=cpu_only)
    if why is None:
        return [float(cast(float, r)) for r in rates]
    if opt.fused:
        msg = (
            f"`{type(opt).__name__}(fused=True)` cannot take this step with torch's "
            f"fused kernel: {why}. Pass `fused=None` to fall back to the foreach "
            "kernels where a step cannot be fused, or make the step fusable."
        )
        raise ValueError(msg)
    return None


def _scheduled_refusal(opt: _Fusable, params: ParamDict) -> str | None:
    """Why a scheduled `lr` keeps the step from the kernel, or None."""
    lr = opt.lr
    if not is_schedule(lr):
        return None
    if lr.cycles_momentum:
        return (
            "the schedule cycles the momentum, which the kernel takes as a number "
            "fixed at construction"
        )
    if any(v.device.type != "cpu" for v in params._vals):
        return (
            "the rate is scheduled and the entries are not on the CPU (reading "
            "the rate would wait for the device)"
        )
    return None


def _steps(step: Tensor, count: int) -> list[Tensor]:
    """One single-precision step tensor per entry, as `torch.optim` keeps them."""
    return [step.to(torch.float32)] * count


def _buffer(params: ParamDict, buffer: ParamDict) -> list[Tensor]:
    values: list[Tensor] = params._aligned(buffer, what="The state")
    return values


def adam_(
    params: ParamDict,
    grads: ParamDict,
    exp_avg: ParamDict,
    exp_avg_sq: ParamDict,
    max_exp_avg_sq: ParamDict,
    step: Tensor,
    *,
    amsgrad: bool,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    eps: float,
    maximize: bool,
    decoupled: bool,
) -> None:
    """Run `torch._fused_adam_` (or `_fused_adamw_`) on the entries, in place."""
    kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_
    values = params._vals
    kernel(
        values,
        _buffer(params, grads),
        _buffer(params, exp_avg),
        _buffer(params, exp_avg_sq),
        _buffer(params, max_exp_avg_sq) if amsgrad else [],
        _steps(step, len(values)),
        amsgrad=amsgrad,
        lr=lr,
        beta1=betas[0],
        beta2=betas[1],
        weight_decay=weight_decay,
        eps=eps,
        maximize=maximize,
        grad_scale=None,
        found_inf=None,
    )


def sgd_(
    params: ParamDict,
    grads: ParamDict,
    momentum_buffer: ParamDict,
    *,
    lr: float,
    momentum: float,
    weight_decay: float,
    nesterov: bool,
    maximize: bool,
) -> None:
    """Run `torch._fused_sgd_` on the entries, in place, without dampening.

    The momentum buffer starts at zero, so the first step's `0 * momentum + grad`
    is the gradient itself, what torch's `is_first_step` copies in.
    """
    torch._fused_sgd_(
        params._vals,
        _buffer(params, grads),
        _buffer(params, momentum_buffer) if momentum != 0 else [],
        weight_decay=weight_decay,
        momentum=momentum,
        lr=lr,
        dampening=0.0,
        nesterov=nesterov,
        maximize=maximize,
        is_first_step=False,
        grad_scale=None,
        found_inf=None,
    )


def adagrad_(
    params: ParamDict,
    grads: ParamDict,
    total: ParamDict,
    step: Tensor,
    *,
    lr: float,
    lr_decay: float,
    weight_decay: float,
    eps: float,
    maximize: bool,
) -> None:
    """Run `torch._fused_adagrad_` on the entries, in place (CPU only in torch)."""
    values = params._vals
    torch._fused_adagrad_(
        values,
        _buffer(params, grads),
        _buffer(params, total),
        _steps(step, len(values)),
        lr=lr,
        lr_decay=lr_decay,
        weight_decay=weight_decay,
        eps=eps,
        maximize=maximize,
        grad_scale=None,
        found_inf=None,
    )
