"""Cyclical schedules: `CyclicLR` and `OneCycleLR`.

`CyclicLR` and `OneCycleLR` also cycle the momentum (or the first beta), as
torch does with `cycle_momentum=True`: the value is `ScheduleState.momentum`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Literal, cast

import attrs
import torch
from torch import Tensor

from .base import LRSchedule, ScheduleState, new_state
from .numbers import (
    INT64_MAX,
    check_float,
    check_int,
    check_rate,
    cos,
    is_int,
    nonzero,
    number_field,
    pow_,
    rdiv,
    scalar,
)

__all__ = ["CyclicLR", "OneCycleLR"]


def _read(value: float | Tensor) -> float:
    """Return a one-element real tensor as torch reads it (a number); else `value`."""
    if (
        isinstance(value, Tensor)
        and value.numel() == 1
        and not value.is_complex()
        and not value.is_meta
        and value.dtype != torch.bool
    ):
        return float(value.detach())
    return cast(float, value)


def _rate(instance: object, attribute: Any, value: Any) -> None:
    check_float(attribute.name, value)
    check_rate(attribute.name, value)


@attrs.frozen(kw_only=True, eq=False)
class CyclicLR(LRSchedule):
    """Cycle the rate between `base_lr` and `max_lr`, the functional `CyclicLR`.

    The policies `"triangular"`, `"triangular2"` and `"exp_range"`, or a custom
    `scale_fn` (of the cycle or the iteration, a 0-dim float64 tensor). With
    `cycle_momentum=True` the momentum moves the opposite way, in
    `state.momentum`. The base rate given to `init` is ignored, as in torch.

    Attributes:
        base_lr: The lower rate of the cycle. This and the other numbers
            may be given as one-element tensors, as torch takes them; each is
            read as a number when the schedule is built.
        max_lr: The upper rate of the cycle.
        step_size_up: Iterations in the increasing half of a cycle.
        step_size_down: Iterations in the decreasing half (default: `step_size_up`).
        mode: `"triangular"`, `"triangular2"` or `"exp_range"`.
        gamma: The factor of `"exp_range"`: `gamma ** iteration`.
        scale_fn: A custom scaling policy, replacing `mode`.
        scale_mode: `"cycle"` or `"iterations"`: the argument of `scale_fn`.
        cycle_momentum: Cycle the momentum too.
        base_momentum: The lower momentum.
        max_momentum: The upper momentum.

    Raises:
        TypeError: If a rate or a momentum is not a number.
        ValueError: If `mode` is unknown and no `scale_fn` is given, a step size
            is not positive, or `scale_mode` is unknown.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.CyclicLR(base_lr=0.1, max_lr=1.0, step_size_up=2)
        >>> schedule.step(schedule.init(0.1)).lr
        tensor(0.5500, dtype=torch.float64)
    """

    takes_base: ClassVar[bool] = False

    base_lr: float = attrs.field(converter=_read, validator=_rate)  # pyright: ignore[reportIncompatibleVariableOverride]  # required here, as in torch
    max_lr: float = attrs.field(converter=_read, validator=_rate)
    step_size_up: int = 2000
    step_size_down: int | None = None
    mode: Literal["triangular", "triangular2", "exp_range"] = "triangular"
    gamma: float = attrs.field(converter=_read, default=1.0, validator=number_field)
    scale_fn: Callable[[Tensor], float | Tensor] | None = None
    scale_mode: Literal["cycle", "iterations"] = "cycle"
    cycle_momentum: bool = True
    base_momentum: float = attrs.field(converter=_read, default=0.8, validator=_rate)
    max_momentum: float = attrs.field(converter=_read, default=0.9, validator=_rate)

    def __attrs_post_init__(self) -> None:
        check_int("step_size_up", self.step_size_up, minimum=1)
        if self.step_size_down is not None:
            check_int("step_size_down", self.step_size_down, minimum=1)
        if self.scale_fn is None:
            if self.mode not in ("triangular", "triangular2", "exp_range"):
                msg = (
                    f"`mode` {self.mode!r} is unknown and `scale_fn` is None; use "
                    "'triangular', 'triangular2', 'exp_range' or give a `scale_fn`."
                )
                raise ValueError(msg)
        elif not callable(cast(object, self.scale_fn)):
            msg = (
                f"`scale_fn` should be a function, got {type(self.scale_fn).__name__}."
            )
            raise TypeError(msg)
        if self.scale_mode not in ("cycle", "iterations"):
            msg = (
                "`scale_mode` must be 'cycle' or 'iterations', got "
                f"{self.scale_mode!r}."
            )
            raise ValueError(msg)

    @property
    def cycles_momentum(self) -> bool:
        """Whether the momentum is cycled too: `cycle_momentum`."""
        return self.cycle_momentum

    def _scale(self, cycle: Tensor, epoch: Tensor) -> Tensor | float:
        if self.scale_fn is not None:
            return self.scale_fn(cycle if self.scale_mode == "cycle" else epoch)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return rdiv(1, pow_(2.0, cycle - 1, cycle))
        return pow_(self.gamma, epoch, epoch)

    def _values(self, base: Tensor, epoch: Tensor) -> ScheduleState:
        up = float(self.step_size_up)
        down = float(self.step_size_down) if self.step_size_down is not None else up
        total = up + down
        ratio = up / total
        cycle = torch.floor(1 + epoch / total)
        x = 1.0 + epoch / total - cycle
        rising = x <= ratio
        scale_factor = torch.where(rising, x / ratio, (x - 1) / (ratio - 1))
        scale = self._scale(cycle, epoch)
        lr = self.base_lr + (self.max_lr - self.base_lr) * scale_factor * scale
        momentum = None
        if self.cycle_momentum:
            height = (self.max_momentum - self.base_momentum) * scale_factor
            momentum = self.max_momentum - height * scale
        lr = torch.as_tensor(lr, dtype=torch.float64)
        return new_state(base, lr, last_epoch=epoch, momentum=momentum)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return self._values(scalar(self.base_lr, base), torch.zeros_like(base))

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        return self._values(state.base_lr, state.last_epoch + 1)


@attrs.frozen(kw_only=True, eq=False)
class OneCycleLR(LRSchedule):
    """The 1cycle policy, the functional `OneCycleLR`.

    The rate rises from `max_lr / div_factor` to `max_lr`, then falls to
    `max_lr / div_factor / final_div_factor` (with `three_phase`, back to the
    start first); the momentum (`cycle_momentum=True`) moves the opposite way.
    The base rate given to `init` is ignored, as in torch. Stepping past
    `total_steps` raises eagerly (a compiled step continues the last phase).

    Attributes:
        max_lr: The peak rate. This and the other numbers may be given as
            one-element tensors, as torch takes them; each is read as a number
            when the schedule is built.
        total_steps: The number of steps; or give `epochs` and `steps_per_epoch`.
        epochs: The number of epochs (with `steps_per_epoch`).
        steps_per_epoch: The number of steps per epoch (with `epochs`).
        pct_start: The fraction of the steps spent rising, a float in [0, 1].
        anneal_strategy: `"cos"` or `"linear"`.
        cycle_momentum: Cycle the momentum too.
        base_momentum: The lower momentum.
        max_momentum: The upper momentum.
        div_factor: `max_lr / div_factor` is the starting rate.
        final_div_factor: The starting rate over this is the final rate.
        three_phase: Use three phases (rise, fall back, anneal) instead of two.

    Raises:
        ValueError: If neither `total_steps` nor `epochs` and `steps_per_epoch`
            are positive ints, `pct_start` is not a float in [0, 1], or
            `anneal_strategy` is unknown (torch's kinds of error).

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.OneCycleLR(max_lr=1.0, total_steps=10)
        >>> schedule.init(0.0).lr
        tensor(0.0400, dtype=torch.float64)
    """

    takes_base: ClassVar[bool] = False

    max_lr: float = attrs.field(converter=_read, validator=_rate)
    total_steps: int | None = None
    epochs: int | None = None
    steps_per_epoch: int | None = None
    pct_start: float = 0.3
    anneal_strategy: Literal["cos", "linear"] = "cos"
    cycle_momentum: bool = True
    base_momentum: float = attrs.field(converter=_read, default=0.85, validator=_rate)
    max_momentum: float = attrs.field(converter=_read, default=0.95, validator=_rate)
    div_factor: float = attrs.field(
        converter=_read, default=25.0, validator=number_field
    )
    final_div_factor: float = attrs.field(
        converter=_read, default=1e4, validator=number_field
    )
    three_phase: bool = False

    def __attrs_post_init__(self) -> None:
        if self.total_steps is not None:
            counts: tuple[str, ...] = ("total_steps",)
        elif self.epochs is not None and self.steps_per_epoch is not None:
            counts = ("epochs", "steps_per_epoch")
        else:
            msg = "Give either `total_steps` or both `epochs` and `steps_per_epoch`."
            raise ValueError(msg)
        for name in counts:
            value: object = getattr(self, name)
            if not (is_int(value) and 0 < value <= INT64_MAX):
                msg = f"Expected positive integer `{name}`, but got {value!r}."
                raise ValueError(msg)
        pct: object = self.pct_start
        if not isinstance(pct, float) or not 0 <= pct <= 1:
            msg = f"Expected float between 0 and 1 `pct_start`, but got {pct!r}."
            raise ValueError(msg)
        if self.anneal_strategy not in ("cos", "linear"):
            msg = (
                "`anneal_strategy` must be one of 'cos' or 'linear', got "
                f"{self.anneal_strategy!r}."
            )
            raise ValueError(msg)

    @property
    def cycles_momentum(self) -> bool:
        """Whether the momentum is cycled too: `cycle_momentum`."""
        return self.cycle_momentum

    @property
    def steps(self) -> int:
        """The total number of steps: `total_steps` or `epochs * steps_per_epoch`."""
        if self.total_steps is not None:
            return self.total_steps
        assert self.epochs is not None  # checked when built
        assert self.steps_per_epoch is not None
        return self.epochs * self.steps_per_epoch

    def _phases(self) -> list[tuple[float, str, str, str, str]]:
        total, pct = self.steps, self.pct_start
        rise = (float(pct * total) - 1, "initial", "max", "max_m", "base_m")
        if self.three_phase:
            return [
                rise,
                (float(2 * pct * total) - 2, "max", "initial", "base_m", "max_m"),
                (total - 1, "initial", "min", "max_m", "max_m"),
            ]
        return [rise, (total - 1, "max", "min", "base_m", "max_m")]

    def _anneal(self, start: float, end: float, pct: Tensor) -> Tensor:
        if self.anneal_strategy == "cos":
            cos_out = cos(math.pi * pct) + 1
            return end + (start - end) / 2.0 * cos_out
        return (end - start) * pct + start

    def _values(self, epoch: Tensor) -> ScheduleState:
        initial = self.max_lr / self.div_factor
        values = {
            "initial": initial,
            "max": self.max_lr,
            "min": initial / self.final_div_factor,
            "max_m": self.max_momentum,
            "base_m": self.base_momentum,
        }
        start_step = 0.0
        chosen: list[tuple[Tensor, Tensor, Tensor | None]] = []
        for end_step, start_lr, end_lr, start_m, end_m in self._phases():
            pct = (epoch - start_step) / nonzero(
                epoch.new_full((), end_step - start_step)
            )
            phase_lr = self._anneal(values[start_lr], values[end_lr], pct)
            phase_m = (
                self._anneal(values[start_m], values[end_m], pct)
                if self.cycle_momentum
                else None
            )
            chosen.append((epoch <= end_step, phase_lr, phase_m))
            start_step = end_step
        _, lr, momentum = chosen[-1]
        for inside, phase_lr, phase_m in reversed(chosen[:-1]):
            lr = torch.where(inside, phase_lr, lr)
            if phase_m is not None and momentum is not None:
                momentum = torch.where(inside, phase_m, momentum)
        base = epoch.new_full((), initial)
        return new_state(base, lr, last_epoch=epoch, momentum=momentum)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return self._values(torch.zeros_like(base))

    def _step_once(self, state: ScheduleState, /) -> ScheduleState:
        """Return the state after one `scheduler.step()`; raise past `total_steps`."""
        epoch = state.last_epoch + 1
        if (
            not torch.compiler.is_compiling()
            and epoch.device.type == "cpu"
            and bool(epoch > self.steps)
        ):
            msg = (
                f"Tried to step {int(epoch)} times. The specified number of total "
                f"steps is {self.steps}. Build the `OneCycleLR` with more "
                "`total_steps` (or `epochs`) or stop stepping at the end of the cycle."
            )
            raise ValueError(msg)
        return self._advance(state, state.lr)

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        return self._values(state.last_epoch + 1)
