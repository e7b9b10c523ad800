"""torch's fused optimizer kernels as a step's plan, for any memory layout.

`Adam`, `AdamW`, `SGD` and `Adagrad` plan `torch._fused_*_` at bind time where
their `fused` flag and the bound facts allow (`fused_refusal`). The kernels read
no strides: an entry whose tensors are not dense in one shared layout is staged
through contiguous scratch (elementwise arithmetic, so the same bits).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import torch
import torch.optim.optimizer as _optimizer
from torch import Tensor
from torch.utils import _pytree as pytree

from .._foreach import holds_dtensors
from .._fresh import owned
from .._paramdict import ParamDict
from ._hyper import Rate, compute_dtype, is_int_or_float
from ._schedules.slot import is_schedule, write_on_host

if TYPE_CHECKING:
    from ._torch_optimizer import TorchOptimizer

__all__ = [
    "FusedPlan",
    "Kernel",
    "adagrad_kernel",
    "adam_kernel",
    "assign",
    "counted",
    "dense",
    "fused_plan",
    "fused_refusal",
    "sgd_kernel",
    "write_slot",
]

S = TypeVar("S")
Strides = tuple[int, ...]
Kernel = Callable[..., None]
"""Runs a fused kernel: `(params, grads, buffers, steps, lr)` as lists."""
Vals = list[Tensor]
"""One tensor per entry, in key order (a ParamDict's value list)."""


def _devices() -> frozenset[str]:
    return frozenset(_optimizer._get_fused_kernels_supported_devices())  # type: ignore[attr-defined]  # private, not re-exported


def dense(t: Tensor, /) -> bool:
    """Whether `t`'s elements fill one block of its memory, each once (any order).

    Example:
        >>> base = torch.zeros(3, 4)
        >>> dense(base.t()), dense(base[:, ::2]), dense(base[:1].expand(3, 4))
        (True, False, False)
    """
    if t.is_contiguous() or t.numel() == 0:
        return True
    expected = 1
    for size, stride in sorted(
        ((s, st) for s, st in zip(t.shape, t.stride()) if s != 1), key=lambda d: d[1]
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def fused_refusal(
    params: ParamDict, lr: object, weight_decay: Rate, *, cpu_only: bool = False
) -> str | None:
    """Return why no fused kernel can take these steps, or None when one can."""
    if isinstance(lr, ParamDict):
        return "`lr` is a per-key ParamDict (fused kernels take one rate)"
    if not is_int_or_float(weight_decay):
        return (
            "`weight_decay` is a tensor or a per-key ParamDict (fused kernels take "
            "it as a number)"
        )
    if compute_dtype(params) is None:
        return "the entries do not all share float32 or float64"
    values = params._vals
    if holds_dtensors(values):
        return "the entries are DTensors"
    device = values[0].device
    if any(v.device != device for v in values):
        return "the entries are on more than one device"
    if device.type not in _devices() or (cpu_only and device.type != "cpu"):
        return f"torch has no fused kernel for this optimizer on {device.type!r}"
    if is_schedule(lr) and lr.cycles_momentum:
        return (
            "the schedule cycles the momentum, which the kernel takes as a "
            "number fixed at construction"
        )
    if isinstance(lr, Tensor) and lr.device.type != "cpu":
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


def _contiguous_strides(shape: Sequence[int]) -> Strides:
    strides: list[int] = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class FusedPlan(Generic[S]):
    """A fused kernel as the plan of a step: its buffers and the staged entries."""

    __slots__ = ("_buffers", "_kernel", "_opt", "_staged", "grad_strides")

    def __init__(
        self,
        opt: TorchOptimizer[Any],
        params: ParamDict,
        state: S,
        buffers: tuple[str, ...],
        kernel: Kernel,
    ) -> None:
        self._opt = opt
        self._kernel = kernel
        self._buffers = buffers
        fields = [params._aligned(getattr(state, f), what="The state") for f in buffers]
        self._staged = staged = tuple(
            i
            for i, p in enumerate(params._vals)
            if p.numel()
            and (not dense(p) or any(b[i].stride() != p.stride() for b in fields))
        )
        self.grad_strides: list[Strides | None] = [
            _contiguous_strides(p.shape) if i in staged else p.stride()
            for i, p in enumerate(params._vals)
        ]

    def __call__(self, params: ParamDict, state: S) -> Callable[[ParamDict], S]:
        def run(grads: ParamDict, step: Tensor, lr: float | Tensor) -> None:
            written = [params, *[getattr(state, f) for f in self._buffers]]
            lazy = [c for c in written if c._pending]  # `_fresh.pending`, inline
            if lazy:  # the kernel writes in place: copies first
                owned(lazy, [list(c._vals) for c in lazy])
            values = list(params._vals)
            fields = [
                list(params._aligned(getattr(state, f), what="The state"))
                for f in self._buffers
            ]
            # Each staged tensor the kernel cannot walk, in contiguous scratch.
            targets: list[Tensor] = []
            scratch: list[Tensor] = []
            for i in self._staged:
                for tensors in (values, *fields):
                    original = tensors[i]
                    if not original.is_contiguous():
                        tensors[i] = original.contiguous()
                        targets.append(original)
                        scratch.append(tensors[i])
            device = values[0].device
            compiling = torch.compiler.is_compiling()
            if step.is_cpu and device.type != "cpu" and not compiling:
                # Made on the device from the host's number: a copy from the
                # host would wait for the device.
                count = torch.full((), step.item(), dtype=torch.float32, device=device)
            else:
                count = step.to(device=device, dtype=torch.float32)
            self._kernel(values, list(grads._vals), fields, [count] * len(values), lr)
            if targets:
                torch._foreach_copy_(targets, scratch)

        return counted(self._opt, state, run, fused=True)


def counted(
    opt: Any, state: S, run: Callable[[ParamDict, Tensor, Any], None], *, fused: bool
) -> Callable[[ParamDict], S]:
    """Read the step's number, rate and next schedule; return the commit.

    The commit runs `run(grads, step, lr)`, then advances the counter (on a
    device, `capturable`: in place before) and the schedule.
    """
    counter: Tensor = cast(Any, state).step
    on_device = not counter.is_cpu
    step: Tensor = counter if on_device else opt.next_step(state)
    lr = opt.rate("lr", step, state)
    if fused and isinstance(lr, Tensor):
        # The `.tensor_lr` overloads read a CPU rate as this double; one on
        # the entries' accelerator goes as it is. Detached: torch.optim's
        # fused step runs without recording.
        lr = lr.item() if lr.device.type == "cpu" else lr.detach()
    slot: object = getattr(state, "schedule", ())
    new_slot, floats = opt._next_slot(state)

    def commit(grads: ParamDict) -> S:
        if on_device:
            advance(step)
        run(grads, step, lr)
        if not on_device:
            assign(counter, step)
        write_slot(slot, new_slot, floats=floats)
        return state

    return commit


def advance(counter: Tensor) -> None:
    """`counter += 1` in place, also while compiled (see `assign`)."""
    if torch.compiler.is_compiling():
        counter.view(1).add_(1)
    else:
        counter.add_(1)


def assign(target: Tensor, value: Tensor) -> None:
    """`target.copy_(value)` for a 0-dim counter, also while compiled.

    Through a view: traced, torch 2.13 drops a `copy_` into a 0-dim float64 input.
    """
    if torch.compiler.is_compiling():
        target.view(1).copy_(value.view(1))
    else:
        target.copy_(value)


def write_slot(slot: object, new_slot: object, *, floats: bool = False) -> None:
    """Copy an advanced schedule state (`floats`: of Python floats) into the old one."""
    if new_slot is slot:
        return
    if floats:
        write_on_host(slot, new_slot)
        return
    for old, value in zip(pytree.tree_leaves(slot), pytree.tree_leaves(new_slot)):
        if isinstance(old, Tensor) and old is not value:
            assign(old, value)


# ---------------------------------------------------------------- the kernels


def adam_kernel(opt: Any) -> Kernel:
    """`torch._fused_adam_` (`_fused_adamw_` when decoupled); betas read each step."""
    kernel = torch._fused_adamw_ if opt._decoupled() else torch._fused_adam_
    amsgrad = opt.amsgrad

    def run(
        params: Vals, grads: Vals, buffers: list[Vals], steps: Vals, lr: float | Tensor
    ) -> None:
        beta1, beta2 = opt.betas
        kernel(
            params,
            grads,
            buffers[0],
            buffers[1],
            buffers[2] if amsgrad else [],
            steps,
            amsgrad=amsgrad,
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            weight_decay=float(opt.weight_decay),
            eps=opt.eps,
            maximize=opt.maximize,
            grad_scale=None,
            found_inf=None,
        )

    return run


def sgd_kernel(opt: Any) -> Kernel:
    """`torch._fused_sgd_` without dampening (a zero first buffer: `is_first_step`)."""

    def run(
        params: Vals, grads: Vals, buffers: list[Vals], steps: Vals, lr: float | Tensor
    ) -> None:
        del steps
        torch._fused_sgd_(
            params,
            grads,
            buffers[0] if buffers else [],
            weight_decay=float(opt.weight_decay),
            momentum=opt.momentum,
            lr=lr,
            dampening=0.0,
            nesterov=opt.nesterov,
            maximize=opt.maximize,
            is_first_step=False,
            grad_scale=None,
            found_inf=None,
        )

    return run


def adagrad_kernel(opt: Any) -> Kernel:
    """`torch._fused_adagrad_` with `opt`'s options (CPU only in torch)."""

    def run(
        params: Vals, grads: Vals, buffers: list[Vals], steps: Vals, lr: float | Tensor
    ) -> None:
        torch._fused_adagrad_(
            params,
            grads,
            buffers[0],
            steps,
            lr=lr,
            lr_decay=opt.lr_decay,
            weight_decay=float(opt.weight_decay),
            eps=opt.eps,
            maximize=opt.maximize,
            grad_scale=None,
            found_inf=None,
        )

    return run


def fused_plan(
    opt: Any,
    params: ParamDict,
    state: S,
    buffers: tuple[str, ...],
    kernel: Kernel,
    *,
    cpu_only: bool = False,
) -> FusedPlan[S] | None:
    """Return the fused plan `opt`'s `fused` flag and the bound facts allow, or None."""
    if opt.fused is False or not params:
        return None
    if opt.fused is None and not params._vals[0].is_cpu:
        # torch.optim's default on an accelerator is the foreach rule: so is
        # this, in `step_` and `step` alike (`fused=True` takes the kernel).
        return None
    why = fused_refusal(params, opt.lr, opt.weight_decay, cpu_only=cpu_only)
    if why is None:
        return FusedPlan(opt, params, state, buffers, kernel)
    if opt.fused:
        msg = (
            f"`{type(opt).__name__}(fused=True)` cannot take this step with torch's "
            f"fused kernel: {why}. Pass `fused=None` to fall back to the foreach "
            "kernels where a step cannot be fused, or make the step fusable."
        )
        raise ValueError(msg)
    return None
