"""torch's fused optimizer kernels, called on ParamDicts by `step_` and `step`.

`torch._fused_adam_`, `_fused_adamw_`, `_fused_sgd_` and `_fused_adagrad_` update
every parameter and buffer of a step in one pass over memory, writing into them.
`Adam`, `AdamW`, `SGD` and `Adagrad` call them here when their `fused` flag and
the step allow it (`fused_rates`, `refusal`): every entry of one dtype (float32 or
float64) on one device that has the kernel, `weight_decay` a number, and `lr` a
number, a 0-dim tensor, or a schedule's current value on the CPU (read as the
float torch's scheduler writes; a schedule that cycles the momentum is not
fused). `step_` runs them on the caller's tensors, the default `step` on fresh
copies. Any other step runs the rule.

A tensor `lr` is what `torch.optim` passes to the kernels' `.tensor_lr`
overloads with `fused=True`. Each of those overloads reads a rate on the CPU as
`lr.item<double>()` and calls its number overload, whatever the entries'
device, so a CPU rate is read here as the same double (free on the CPU, and the
same bytes: checked for float16 to float64 rates). A rate on an accelerator is
handed to the overload as the tensor, as torch does, so nothing waits for the
device: the CUDA and XPU kernels read it as float32 from the entries' device, so
it must be a float32 tensor there (`refusal`).

The arguments are those `torch.optim` passes with `fused=True`: per-parameter step
tensors in single precision, already incremented (here one counter shared by every
entry), and no gradient scaling (`grad_scale` and `found_inf` are `None`). The
fused kernels round differently from the foreach path (they keep intermediates in
registers); their results are bitwise those of `torch.optim` with `fused=True`.
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false, reportPrivateImportUsage=false
# (torch's fused kernels and its list of devices that have them are private)
from functools import partial
from typing import Any, NamedTuple, Protocol, cast

import torch
import torch.optim.optimizer as _optimizer
from torch import Tensor

from .._foreach import holds_dtensors
from .._paramdict import ParamDict
from ._hyper import Rate, compute_dtype
from ._repeat import kept
from ._schedules.slot import is_schedule

__all__ = ["KernelRates", "adagrad_", "adam_", "fused_rates", "refusal", "sgd_"]

_DEVICES = frozenset(
    _optimizer._get_fused_kernels_supported_devices()  # type: ignore[attr-defined]  # private, not re-exported
)


class KernelRates(NamedTuple):
    """The rates of a fused step, as torch's kernels take them."""

    lr: float | Tensor
    """A number, or a float32 0-dim tensor on the entries' accelerator."""
    weight_decay: float


def refusal(
    params: ParamDict, lr: Rate, weight_decay: Rate, *, cpu_only: bool = False
) -> str | None:
    """Return why no fused kernel can take this step, or None when one can.

    Every entry must share float32 or float64 and one device that has fused
    kernels (only the CPU with `cpu_only`), `weight_decay` must be a number, and
    `lr` a number or a 0-dim tensor, on the CPU or (float32) on the entries' device.
    """
    if isinstance(lr, ParamDict):
        return "`lr` is a per-key ParamDict (fused kernels take one rate)"
    if not _is_number(weight_decay):
        return (
            "`weight_decay` is a tensor or a per-key ParamDict (fused kernels take "
            "it as a number)"
        )
    # The entries' part: once while `step_` gets the same tensors back.
    why = kept(
        params, None, ("entries", cpu_only), partial(_entries_refusal, params, cpu_only)
    )
    if why is None and isinstance(lr, Tensor) and lr.device.type != "cpu":
        return _accelerator_lr_refusal(lr, params._vals[0].device)
    return why


def _entries_refusal(params: ParamDict, cpu_only: bool) -> str | None:
    """Why the entries themselves (dtypes, devices, kinds) keep a kernel off."""
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


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _accelerator_lr_refusal(lr: Tensor, device: torch.device) -> str | None:
    """Why a tensor `lr` off the CPU cannot go to the kernel as it is, or None."""
    if lr.device != device:
        return (
            f"`lr` is a tensor on {str(lr.device)!r} and the entries are on "
            f"{str(device)!r} (the kernel takes a rate on the CPU or on the "
            "entries' device; move `lr` there)"
        )
    if lr.dtype != torch.float32:
        return (
            f"`lr` is a {lr.dtype} tensor on {str(device)!r} (torch's fused "
            "kernels read a rate on an accelerator as float32; pass "
            "`lr.float()` or a rate on the CPU)"
        )
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
) -> KernelRates | None:
    """Return the rates of a fused step under the optimizer's `fused` flag.

    `fused=False`: None (the rule runs). `None`: the rates of the step `state`
    leads to, as the kernel takes them, when a fused kernel can take it: a tensor
    `lr` on the CPU (a plain one, or a schedule's current value) as the float
    the kernel's `.tensor_lr` overload would read from it, one on the entries'
    accelerator as the tensor. `True`: the same, and a step that cannot be fused
    is refused.

    Raises:
        ValueError: With `fused=True`, if a fused kernel cannot take the step;
            the message says why and names the fix.
    """
    if opt.fused is False:
        return None
    step = opt.next_step(state)
    lr = opt.rate("lr", step, state)
    weight_decay = opt.rate("weight_decay", step, state)
    why = _scheduled_refusal(opt, params) or refusal(
        params, lr, weight_decay, cpu_only=cpu_only
    )
    if why is None:
        given = cast("float | Tensor", lr)  # refused above if a ParamDict
        kernel_lr: float | Tensor = given
        if not isinstance(given, Tensor):
            kernel_lr = float(given)
        elif given.device.type == "cpu":
            # The `.tensor_lr` overloads call the number overload with
            # `lr.item<double>()`: this float, a free host read (`item`, which
            # reads a rate that requires grad without a warning).
            kernel_lr = cast(float, given.item())
        else:
            # The kernel reads it on the device: nothing waits. Detached, as
            # torch.optim's step runs without recording.
            kernel_lr = given.detach()
        return KernelRates(kernel_lr, float(cast(float, weight_decay)))
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
    if not kept(params, None, "on the CPU", partial(_on_the_cpu, params)):
        return (
            "the rate is scheduled and the entries are not on the CPU (reading "
            "the rate would wait for the device)"
        )
    return None


def _on_the_cpu(params: ParamDict) -> bool:
    return all(v.device.type == "cpu" for v in params._vals)


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
    lr: float | Tensor,
    betas: tuple[float, float],
    weight_decay: float,
    eps: float,
    maximize: bool,
    decoupled: bool,
) -> None:
    """Run `torch._fused_adam_` (or `_fused_adamw_`) on the entries, in place.

    A tensor `lr` (float32, on the entries' accelerator) takes the kernel's
    `.tensor_lr` overload, as in `torch.optim`; a number the number overload.
    """
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
    lr: float | Tensor,
    momentum: float,
    weight_decay: float,
    nesterov: bool,
    maximize: bool,
) -> None:
    """Run `torch._fused_sgd_` on the entries, in place, without dampening.

    The momentum buffer starts at zero, so the first step's `0 * momentum + grad`
    is the gradient itself, what torch's `is_first_step` copies in. A tensor `lr`
    takes the `.tensor_lr` overload, as for `adam_`.
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
    lr: float | Tensor,
    lr_decay: float,
    weight_decay: float,
    eps: float,
    maximize: bool,
) -> None:
    """Run `torch._fused_adagrad_` on the entries, in place (CPU only in torch).

    A tensor `lr` takes the `.tensor_lr` overload, as for `adam_` (the kernel is
    on the CPU only, where `fused_rates` hands it the rate as a number).
    """
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
