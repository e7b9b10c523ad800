"""A schedule's scalar arithmetic and the checks of its settings.

Every number in a schedule's state is a 0-dim double-precision tensor; the
arithmetic here repeats `torch.optim.lr_scheduler`'s recursive formulas
operation by operation, rounding as its Python floats do (see `cos` and
`pow_` for the two places where a tensor operation needs help to).
"""

from __future__ import annotations

import math
from typing import Any, TypeGuard

import torch
from torch import Tensor

from ..._paramdict import ParamDict

__all__ = [
    "INT64_MAX",
    "base_of",
    "check_base",
    "check_base_lr",
    "check_float",
    "check_int",
    "check_rate",
    "cos",
    "is_int",
    "nonzero",
    "number_field",
    "pow_",
    "rdiv",
    "refuse_epoch",
    "scalar",
    "where",
]


def scalar(value: float | Tensor, like: Tensor | None = None) -> Tensor:
    """Return `value` as a 0-dim float64 tensor (on `like`'s device)."""
    device = like.device if like is not None else None
    if isinstance(value, Tensor):
        return value.to(dtype=torch.float64, device=device)
    return torch.tensor(value, dtype=torch.float64, device=device)


def pow_(base: float | Tensor, exponent: float | Tensor, like: Tensor) -> Tensor:
    """Return `base ** exponent` rounded as Python's `pow`.

    Both operands are tensors: `tensor ** 3` would be `x * x * x`, rounded otherwise.
    """
    return torch.pow(scalar(base, like), scalar(exponent, like))


def cos(x: Tensor) -> Tensor:
    """Return `cos(x)` equal to `math.cos` bitwise (on the CPU).

    Eager `torch.cos` is off by one unit in the last place for some arguments;
    the real part of `torch.polar(1, x)` calls the C library's `cos`, as
    `math.cos` does (`exp(i x)` did on torch 2.13, not on 2.6). Compiled, it is
    `torch.cos`, which inductor's C++ code computes so too (a backend running the
    eager kernels, such as `"aot_eager"`, inherits their differences).
    """
    if torch.compiler.is_compiling():
        return torch.cos(x)
    return torch.polar(torch.ones_like(x), x).real


def rdiv(number: float, x: Tensor) -> Tensor:
    """Return `number / x` rounded once (`number / x` is a reciprocal and a product)."""
    return torch.div(x.new_full((), number), x)


def where(condition: Any, new: Any, old: Any) -> Any:
    """`torch.where` of a tensor `condition`; of a host step's bool, `new` or `old`."""
    if isinstance(condition, Tensor):
        return torch.where(condition, new, old)
    return new if condition else old


def nonzero(x: Tensor) -> Tensor:
    """Return `x` with zeros replaced by one: a divisor for a branch `where` drops.

    `torch.where` evaluates both branches; a division by zero in the dropped one
    would put `nan` into the gradient of the kept one.
    """
    return torch.where(x == 0, torch.ones_like(x), x)


INT64_MAX = 2**63 - 1
"""The largest setting a schedule's tensor arithmetic can hold as an integer."""


def is_int(value: object) -> TypeGuard[int]:
    """Whether `value` is an `int` and not a `bool`."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: Any, *, minimum: int) -> None:
    """Raise unless `value` is an `int` (not a bool) from `minimum` to `INT64_MAX`."""
    if not isinstance(value, int) or isinstance(value, bool):
        msg = f"`{name}` must be an int, got {type(value).__name__}."
        raise TypeError(msg)
    if value < minimum:
        msg = f"`{name}` must be at least {minimum}, got {value!r}."
        raise ValueError(msg)
    if value > INT64_MAX:
        msg = f"`{name}` must be at most 2**63 - 1 (an int64), got {value!r}."
        raise ValueError(msg)


def check_float(name: str, value: Any) -> None:
    """Raise unless `value` is a real number (not a bool) a float can hold."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"`{name}` must be a number, got {type(value).__name__}."
        raise TypeError(msg)
    if isinstance(value, int) and not -(2**1023) <= value <= 2**1023:
        msg = f"`{name}` is too large for a float: give a value below 1e308."
        raise ValueError(msg)


def number_field(instance: object, attribute: Any, value: Any) -> None:
    """An attrs validator: `check_float` on the field's value, by the field's name."""
    check_float(attribute.name, value)


def check_rate(name: str, value: float | Tensor) -> None:
    """Raise unless the rate `value` is finite and not negative, as an optimizer's `lr`.

    A tensor is read once on the host (not while compiling, nor on the meta device).
    """
    if isinstance(value, Tensor):
        if torch.compiler.is_compiling() or value.is_meta:
            return
        number = float(value.detach())
    else:
        number = float(value)
    if not math.isfinite(number) or number < 0:
        msg = (
            f"`{name}` must be finite and at least 0, got {number!r}. Give the "
            "value the optimizer would accept for its own `lr` (or momentum)."
        )
        raise ValueError(msg)


def refuse_epoch(schedule: object, epoch: object) -> None:
    """Raise unless `epoch` is None: only warm restarts step to an epoch."""
    if epoch is not None:
        kind = type(schedule).__name__
        msg = (
            f"`{kind}.step` takes no epoch (torch deprecates `step(epoch)` for "
            f"it). Step it once per epoch with `{kind}.step(state)`; only "
            "`CosineAnnealingWarmRestarts.step(state, epoch)` jumps to an epoch."
        )
        raise TypeError(msg)


def check_base(lr: Any) -> None:
    """Raise unless the `base_lr` `lr` is a number or a 0-dim floating-point tensor."""
    if isinstance(lr, ParamDict):
        msg = (
            "`base_lr`, a schedule's base learning rate, must be a number or a "
            "0-dim tensor, got a ParamDict of per-key values. For per-key "
            "schedules give each group of keys its own optimizer and schedule "
            "with `optim.ParamGroups`."
        )
        raise TypeError(msg)
    if isinstance(lr, Tensor):
        if lr.dim() != 0 or not lr.is_floating_point():
            msg = (
                "`base_lr`, a schedule's base learning rate, must be a number or "
                "a 0-dim floating-point tensor, got shape "
                f"{tuple(lr.shape)} and {lr.dtype}."
            )
            raise ValueError(msg)
        check_rate("base_lr", lr)
        return
    check_float("base_lr", lr)
    check_rate("base_lr", lr)


def check_base_lr(instance: object, attribute: Any, value: Any) -> None:
    if value is not None:
        check_base(value)


def base_of(schedule: Any, lr: float | Tensor | None) -> float | Tensor:
    """Return the base rate for `init`: `lr`, else the schedule's `base_lr`."""
    given: float | Tensor | None = schedule.base_lr if lr is None else lr
    if given is None:
        if not schedule.takes_base:
            return 0.0  # the schedule sets its own rates and ignores the base
        msg = (
            f"`{type(schedule).__name__}` needs its base learning rate: give "
            f"`base_lr=` when building it (`{type(schedule).__name__}(base_lr=0.1, "
            "...)`) or pass it to `init`."
        )
        raise ValueError(msg)
    check_base(given)
    # A copy, as torch copies its base rates: changing the caller's tensor
    # later must not change the schedule (autograd still flows through it).
    return given.clone() if isinstance(given, Tensor) else given
