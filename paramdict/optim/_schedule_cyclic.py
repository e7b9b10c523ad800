"""Cyclical schedules, the combinators and `ReduceLROnPlateau`.

`CyclicLR` and `OneCycleLR` also cycle the momentum (or the first beta), as
torch does with `cycle_momentum=True`: the value is `ScheduleState.momentum`.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, NamedTuple, cast

import attrs
import torch
from torch import Tensor

from ._protocol import register_state
from ._schedule import (
    INT64_MAX,
    LRSchedule,
    ScheduleState,
    _check_base_lr,  # pyright: ignore[reportPrivateUsage]  # this package's own
    base_of,
    check_float,
    check_int,
    check_rate,
    cos,
    new_state,
    nonzero,
    pow_,
    rdiv,
    refuse_epoch,
    scalar,
)

__all__ = [
    "ChainedScheduler",
    "CyclicLR",
    "OneCycleLR",
    "PlateauState",
    "ReduceLROnPlateau",
    "SequentialLR",
]


def _number(instance: object, attribute: Any, value: Any) -> None:
    check_float(attribute.name, value)


def _read(value: float | Tensor) -> float:
    """Return a one-element real tensor as the number it holds, as torch reads it.

    torch's `CyclicLR` and `OneCycleLR` take tensors where they take numbers;
    the value is read once, when the schedule is built. Anything else is
    returned as given, for the validator to judge.
    """
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


# ---------------------------------------------------------------- CyclicLR


@attrs.frozen(kw_only=True, eq=False)
class CyclicLR(LRSchedule):
    """Cycle the rate between `base_lr` and `max_lr`, the functional `CyclicLR`.

    The policies `"triangular"`, `"triangular2"` and `"exp_range"`, or a custom
    `scale_fn` (which receives the cycle or the iteration as a 0-dim float64
    tensor). With `cycle_momentum=True` the momentum moves between
    `max_momentum` and `base_momentum` the opposite way, in `state.momentum`.
    The base rate given to `init` is ignored, as torch replaces the optimizer's
    with `base_lr`.

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
    gamma: float = attrs.field(converter=_read, default=1.0, validator=_number)
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

    def _scale(self, cycle: Tensor, epoch: Tensor) -> tuple[Tensor | float, bool]:
        if self.scale_fn is not None:
            by_cycle = self.scale_mode == "cycle"
            return self.scale_fn(cycle if by_cycle else epoch), by_cycle
        if self.mode == "triangular":
            return 1.0, True
        if self.mode == "triangular2":
            return rdiv(1, pow_(2.0, cycle - 1, cycle)), True
        return pow_(self.gamma, epoch, epoch), False

    def _values(self, base: Tensor, epoch: Tensor) -> ScheduleState:
        up = float(self.step_size_up)
        down = float(self.step_size_down) if self.step_size_down is not None else up
        total = up + down
        ratio = up / total
        cycle = torch.floor(1 + epoch / total)
        x = 1.0 + epoch / total - cycle
        rising = x <= ratio
        scale_factor = torch.where(rising, x / ratio, (x - 1) / (ratio - 1))
        scale, _ = self._scale(cycle, epoch)
        lr = self.base_lr + (self.max_lr - self.base_lr) * scale_factor * scale
        momentum = None
        if self.cycle_momentum:
            height = (self.max_momentum - self.base_momentum) * scale_factor
            momentum = self.max_momentum - height * scale
        return new_state(base, _f64(lr), last_epoch=epoch, momentum=momentum)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return self._values(scalar(self.base_lr, base), torch.zeros_like(base))

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        return self._values(state.base_lr, state.last_epoch + 1)


def _f64(value: Tensor | float) -> Tensor:
    return torch.as_tensor(value, dtype=torch.float64)


# ---------------------------------------------------------------- OneCycleLR


@attrs.frozen(kw_only=True, eq=False)
class OneCycleLR(LRSchedule):
    """The 1cycle policy, the functional `OneCycleLR`.

    The rate rises from `max_lr / div_factor` to `max_lr`, then falls to
    `max_lr / div_factor / final_div_factor` (with `three_phase`, back to the
    start first); with `cycle_momentum=True` the momentum moves the opposite
    way, in `state.momentum`. The base rate given to `init` is ignored, as torch
    replaces it. Stepping past `total_steps` raises eagerly, as in torch (a
    compiled step cannot raise; there the last phase continues).

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
    div_factor: float = attrs.field(converter=_read, default=25.0, validator=_number)
    final_div_factor: float = attrs.field(
        converter=_read, default=1e4, validator=_number
    )
    three_phase: bool = False

    def __attrs_post_init__(self) -> None:
        def positive_int(value: object) -> bool:
            return (
                isinstance(value, int)
                and not isinstance(value, bool)
                and 0 < value <= INT64_MAX
            )

        if self.total_steps is not None:
            if not positive_int(self.total_steps):
                msg = (
                    "Expected positive integer `total_steps`, but got "
                    f"{self.total_steps!r}."
                )
                raise ValueError(msg)
        elif self.epochs is not None and self.steps_per_epoch is not None:
            if not positive_int(self.epochs):
                msg = f"Expected positive integer `epochs`, but got {self.epochs!r}."
                raise ValueError(msg)
            if not positive_int(self.steps_per_epoch):
                msg = (
                    "Expected positive integer `steps_per_epoch`, but got "
                    f"{self.steps_per_epoch!r}."
                )
                raise ValueError(msg)
        else:
            msg = "Give either `total_steps` or both `epochs` and `steps_per_epoch`."
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
    def steps(self) -> int:
        """The total number of steps: `total_steps` or `epochs * steps_per_epoch`."""
        if self.total_steps is not None:
            return self.total_steps
        assert self.epochs is not None  # checked when built
        assert self.steps_per_epoch is not None
        return self.epochs * self.steps_per_epoch

    def _phases(self) -> list[tuple[float, str, str, str, str]]:
        total, pct = self.steps, self.pct_start
        if self.three_phase:
            return [
                (float(pct * total) - 1, "initial", "max", "max_m", "base_m"),
                (float(2 * pct * total) - 2, "max", "initial", "base_m", "max_m"),
                (total - 1, "initial", "min", "max_m", "max_m"),
            ]
        return [
            (float(pct * total) - 1, "initial", "max", "max_m", "base_m"),
            (total - 1, "max", "min", "base_m", "max_m"),
        ]

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
        lr: Tensor | None = None
        momentum: Tensor | None = None
        phases = self._phases()
        start_step = 0.0
        chosen: list[tuple[Tensor, Tensor, Tensor | None]] = []
        for end_step, start_lr, end_lr, start_m, end_m in phases:
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
        for i, (inside, phase_lr, phase_m) in enumerate(reversed(chosen)):
            if i == 0:
                lr, momentum = phase_lr, phase_m
                continue
            assert lr is not None  # set on the first pass
            lr = torch.where(inside, phase_lr, lr)
            if phase_m is not None and momentum is not None:
                momentum = torch.where(inside, phase_m, momentum)
        assert lr is not None  # there are at least two phases
        base = epoch.new_full((), initial)
        return new_state(base, lr, last_epoch=epoch, momentum=momentum)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return self._values(torch.zeros_like(base))

    def step(
        self, state: ScheduleState, epoch: float | None = None, /
    ) -> ScheduleState:
        """Return the state after one `scheduler.step()`; `state` is unchanged.

        Args:
            state: The state from `init` or from the previous `step`.
            epoch: Refused (torch deprecates `step(epoch)` here).

        Returns:
            The next state.

        Raises:
            ValueError: If this would step past `total_steps` (checked eagerly on
                the CPU only: a compiled step cannot raise).

        Example:
            >>> from paramdict import optim
            >>> schedule = optim.OneCycleLR(max_lr=1.0, total_steps=10)
            >>> round(float(schedule.step(schedule.init(0.0)).momentum), 6)
            0.9
        """
        from ._scheduled import check_schedule_state  # a cycle

        refuse_epoch(self, epoch)
        check_schedule_state(self, state)
        self._check_within(state)
        return self._advance(state, state.lr)

    def _check_within(self, state: ScheduleState) -> None:
        """Raise if one more step would pass `total_steps` (eagerly, on the CPU)."""
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

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        return self._values(state.last_epoch + 1)


# ---------------------------------------------------------------- combinators


def _check_children(
    name: str, schedulers: Sequence[Any], *, metric: bool = False
) -> None:
    if len(schedulers) < 1:
        msg = f"{name} expects at least one schedule, but got none."
        raise ValueError(msg)
    for i, schedule in enumerate(schedulers):
        if isinstance(schedule, ReduceLROnPlateau) and not metric:
            msg = (
                f"{name} does not support `ReduceLROnPlateau` (its `step` takes the "
                f"metric), but got one at index {i}. Chain it with the others in a "
                "`ChainedScheduler`, which the optimizer's `step_schedule` steps "
                "with the metric."
            )
            raise ValueError(msg)
        if not isinstance(schedule, (LRSchedule, ReduceLROnPlateau)):
            msg = (
                f"{name} takes schedules from `paramdict.optim`; the one at index "
                f"{i} is a {type(schedule).__name__}."
            )
            raise TypeError(msg)
        if type(schedule).takes_base and schedule.base_lr is not None:
            msg = (
                f"{name} gives its schedules its own base rate, but the one at "
                f"index {i} has `base_lr={schedule.base_lr!r}`. Give `base_lr` to "
                f"the {name} instead."
            )
            raise ValueError(msg)


def _tuple(value: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True, eq=False)
class SequentialLR(LRSchedule):
    """Run `schedulers` one after another, the functional `SequentialLR`.

    At each milestone the next schedule restarts from epoch 0 from the base rate
    (torch's `_update_lr(0)`: its closed form where it has one). The children's
    states are `state.children`.

    Attributes:
        schedulers: The schedules, in order.
        milestones: The epochs at which to switch; one fewer than `schedulers`.

    Raises:
        TypeError: If a schedule is not a `paramdict.optim` schedule.
        ValueError: If there is no schedule, one is a `ReduceLROnPlateau`, or the
            number of milestones is not one fewer than the number of schedules.

    Example:
        >>> from paramdict import optim
        >>> warmup = optim.LinearLR(start_factor=0.5, total_iters=2)
        >>> decay = optim.ExponentialLR(gamma=0.5)
        >>> schedule = optim.SequentialLR(schedulers=[warmup, decay], milestones=[2])
        >>> state = schedule.init(1.0)
        >>> lrs = []
        >>> for _ in range(4):
        ...     lrs.append(float(state.lr))
        ...     state = schedule.step(state)
        >>> lrs
        [0.5, 0.75, 1.0, 0.5]
    """

    schedulers: tuple[LRSchedule, ...] = attrs.field(converter=_tuple)
    milestones: tuple[int, ...] = attrs.field(converter=_tuple)

    def __attrs_post_init__(self) -> None:
        _check_children("SequentialLR", self.schedulers)
        if len(self.milestones) != len(self.schedulers) - 1:
            msg = (
                "SequentialLR expects one milestone fewer than schedules, got "
                f"{len(self.schedulers)} schedules and {len(self.milestones)} "
                "milestones."
            )
            raise ValueError(msg)
        for i, m in enumerate(self.milestones):
            check_int(f"milestones[{i}]", m, minimum=0)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        children = [s._initial(base, base) for s in self.schedulers]
        # torch rewinds every child by one epoch and re-runs the first one's
        # initial step from the base rate.
        children = [c._replace(last_epoch=c.last_epoch - 1) for c in children]
        first = bisect_right(self.milestones, 0)
        children[first] = self.schedulers[first]._initial(base, base)
        lr = children[first].lr.clone()  # not aliased: see `new_state`
        # The momentum the optimizer holds: the last one a cycling child wrote
        # (each child's constructor writes it; then the first child again).
        momenta = [c.momentum for c in (*children, children[first])]
        momentum = _last(momenta)
        return new_state(base, lr, momentum=momentum, children=tuple(children))

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = state.last_epoch + 1
        # A SequentialLR refuses plateaus: its children are schedule states.
        children = [cast(ScheduleState, c) for c in state.children]
        lr = current
        momentum = state.momentum
        # The active schedule is found with `where` over all of them, so the
        # step count stays a tensor; each child computes both of its cases.
        bounds = [-math.inf, *self.milestones, math.inf]
        for i, schedule in enumerate(self.schedulers):
            active = (epoch >= bounds[i]) & (epoch < bounds[i + 1])
            child = children[i]
            stepped = schedule._advance(child, current)
            if i > 0:
                restarted = schedule._restart(child, current)
                at_milestone = epoch == bounds[i]
                stepped = _select(at_milestone, restarted, stepped)
            children[i] = _select(active, stepped, child)
            lr = torch.where(active, stepped.lr, lr)
            if stepped.momentum is not None and momentum is not None:
                momentum = torch.where(active, stepped.momentum, momentum)
        return state._replace(
            last_epoch=epoch, lr=lr, momentum=momentum, children=tuple(children)
        )


def _last(momenta: Sequence[Tensor | None]) -> Tensor | None:
    """Return a copy of the last momentum that is not None (None if none is)."""
    found = [m for m in momenta if m is not None]
    return found[-1].clone() if found else None


def _select(condition: Tensor, a: ScheduleState, b: ScheduleState) -> ScheduleState:
    """Return `a` where `condition` holds, else `b`, field by field."""

    def pick(x: Any, y: Any) -> Any:
        if x is y:  # unchanged (the base rate): keep it, and its aliasing
            return x
        if isinstance(x, Tensor):
            return torch.where(condition, x, y)
        if isinstance(x, ScheduleState):
            pairs = zip(x, cast(ScheduleState, y), strict=True)
            return ScheduleState(*(pick(u, v) for u, v in pairs))
        if isinstance(x, tuple):
            items = zip(
                cast("tuple[object, ...]", x),
                cast("tuple[object, ...]", y),
                strict=True,
            )
            return tuple(pick(u, v) for u, v in items)
        return x  # None: the same on both sides

    selected: ScheduleState = pick(a, b)
    return selected


@attrs.frozen(kw_only=True, eq=False)
class ChainedScheduler(LRSchedule):
    """Step all `schedulers` every epoch, the functional `ChainedScheduler`.

    Each schedule starts from the rate the previous one set, as in torch.

    A `ReduceLROnPlateau` may be one of them: this is torch's pattern of two
    schedulers stepped on one optimizer (`StepLR` every step and
    `ReduceLROnPlateau` with the loss), since torch's own `ChainedScheduler`
    cannot step a plateau. The other schedules advance with every `step` (the
    plateau passes the rate on unchanged); the plateau advances when the
    metric is given, through `step_metric` (the optimizer's `step_schedule`),
    from the rate the others set, as torch's plateau reads the optimizer's.

    Attributes:
        schedulers: The schedules, applied in order at every step.

    Raises:
        TypeError: If a schedule is not a `paramdict.optim` schedule.
        ValueError: If there is no schedule.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.ChainedScheduler(
        ...     schedulers=[optim.ConstantLR(factor=0.5, total_iters=2),
        ...                 optim.ExponentialLR(gamma=0.5)])
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.2500, dtype=torch.float64)
    """

    schedulers: tuple[LRSchedule | ReduceLROnPlateau, ...] = attrs.field(
        converter=_tuple
    )

    def __attrs_post_init__(self) -> None:
        _check_children("ChainedScheduler", self.schedulers, metric=True)

    @property
    def takes_metric(self) -> bool:
        """Whether a `ReduceLROnPlateau` is chained (`step_metric` moves it)."""
        return any(isinstance(s, ReduceLROnPlateau) for s in self.schedulers)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        children: list[ScheduleState | PlateauState] = []
        lr = current
        for schedule in self.schedulers:
            # A copy, so no two children start out sharing one tensor (a
            # compiled `step` would see the aliasing change and recompile).
            child: ScheduleState | PlateauState
            if isinstance(schedule, ReduceLROnPlateau):
                child = schedule.init(lr.clone())
            else:
                child = schedule._initial(base, lr.clone())
            children.append(child)
            lr = child.lr
        momentum = _last([_momentum(c) for c in children])
        return new_state(base, lr, momentum=momentum, children=tuple(children))

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        children: list[ScheduleState | PlateauState] = []
        lr = current
        for schedule, child in zip(self.schedulers, state.children, strict=True):
            if isinstance(child, PlateauState):
                # Moves with the metric only; a copy, so no two fields alias.
                child = child._replace(lr=lr.clone())
            else:
                child = cast(LRSchedule, schedule)._advance(child, lr)
            children.append(child)
            lr = child.lr
        epoch = state.last_epoch + 1
        momentum = _last([_momentum(c) for c in children])
        return state._replace(
            last_epoch=epoch, lr=lr, momentum=momentum, children=tuple(children)
        )

    def step_metric(
        self, state: ScheduleState, metrics: float | Tensor, /
    ) -> ScheduleState:
        """Return the state after the chained plateaus saw `metrics`.

        torch's `plateau.step(metrics)` beside the other schedulers' `step()`:
        each `ReduceLROnPlateau` of the chain reduces the current rate when the
        metric stopped improving; the other schedules keep their positions.

        Args:
            state: The state from `init` or the previous step.
            metrics: The metric: a number or a one-element tensor.

        Returns:
            The next state; `state` is unchanged.

        Raises:
            ValueError: If no `ReduceLROnPlateau` is chained.

        Example:
            >>> from paramdict import optim
            >>> schedule = optim.ChainedScheduler(schedulers=[
            ...     optim.StepLR(step_size=10, gamma=0.9),
            ...     optim.ReduceLROnPlateau(patience=0, factor=0.5)])
            >>> state = schedule.init(1.0)
            >>> for loss in (3.0, 3.0):
            ...     state = schedule.step_metric(schedule.step(state), loss)
            >>> state.lr
            tensor(0.5000, dtype=torch.float64)
        """
        from ._scheduled import check_schedule_state  # a cycle

        if not self.takes_metric:
            msg = (
                "`step_metric` moves the `ReduceLROnPlateau` of a chain, and this "
                "ChainedScheduler has none; its schedules advance with `step`."
            )
            raise ValueError(msg)
        check_schedule_state(self, state)
        children: list[ScheduleState | PlateauState] = []
        lr = state.lr
        for schedule, child in zip(self.schedulers, state.children, strict=True):
            if isinstance(schedule, ReduceLROnPlateau):
                plateau = schedule.step(
                    cast(PlateauState, child)._replace(lr=lr), metrics
                )
                child, lr = plateau, plateau.lr
            children.append(child)
        return state._replace(lr=lr.clone(), children=tuple(children))


def _momentum(state: ScheduleState | PlateauState) -> Tensor | None:
    return None if isinstance(state, PlateauState) else state.momentum


# ---------------------------------------------------------------- ReduceLROnPlateau


def _metric(metrics: object) -> float:
    """Return `metrics` read as torch's `float(metrics)` does (numpy scalars too)."""
    if isinstance(metrics, (bool, str, bytes)) or not hasattr(metrics, "__float__"):
        msg = (
            f"`metrics` must be a number, got {type(metrics).__name__}. Pass the "
            "metric as a float, a numpy scalar or a one-element tensor."
        )
        raise TypeError(msg)
    try:
        return float(cast(Any, metrics))
    except (TypeError, ValueError) as error:
        msg = (
            f"`metrics` must be one number, got {type(metrics).__name__} that "
            f"`float` cannot read ({error}). Pass a scalar."
        )
        raise ValueError(msg) from error


@register_state
class PlateauState(NamedTuple):
    """The state of `ReduceLROnPlateau`.

    Attributes:
        last_epoch: The number of `step` calls, a 0-dim float64 tensor.
        lr: The current learning rate.
        best: The best metric so far (`inf` or `-inf` before the first).
        num_bad_epochs: Epochs since the last improvement.
        cooldown_counter: Epochs of cooldown left.

    Example:
        >>> from paramdict import optim
        >>> state = optim.ReduceLROnPlateau().init(0.1)
        >>> state.best
        tensor(inf, dtype=torch.float64)
    """

    last_epoch: Tensor
    lr: Tensor
    best: Tensor
    num_bad_epochs: Tensor
    cooldown_counter: Tensor


@attrs.frozen(kw_only=True, eq=False)
class ReduceLROnPlateau:
    """Reduce the rate when a metric stops improving (`ReduceLROnPlateau`).

    Not an `LRSchedule`: its `step` takes the metric, `step(state, metrics)`,
    once per evaluation. Everything is tensor arithmetic, so a compiled step
    does not specialize on the metric.

    Attributes:
        mode: `"min"` (lower is better) or `"max"`.
        factor: The factor by which the rate is reduced, below 1.
        patience: Bad epochs tolerated before a reduction.
        threshold: The smallest change that counts as an improvement.
        threshold_mode: `"rel"` or `"abs"`.
        cooldown: Epochs to wait after a reduction before counting again.
        min_lr: The smallest rate.
        eps: A reduction smaller than this is skipped.
        base_lr: The starting rate (a number or a 0-dim tensor), or `None` to
            give it to `init`.

    Raises:
        ValueError: If `factor >= 1` or `mode`/`threshold_mode` is unknown.
        TypeError: If a number argument is not a number.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.ReduceLROnPlateau(patience=0, factor=0.5)
        >>> state = schedule.init(1.0)
        >>> state = schedule.step(state, 3.0)  # improves on inf
        >>> state = schedule.step(state, 3.0)  # no improvement: halve
        >>> state.lr
        tensor(0.5000, dtype=torch.float64)
    """

    mode: Literal["min", "max"] = "min"
    factor: float = attrs.field(default=0.1, validator=_number)
    patience: int = 10
    threshold: float = attrs.field(default=1e-4, validator=_number)
    threshold_mode: Literal["rel", "abs"] = "rel"
    cooldown: int = 0
    min_lr: float = attrs.field(default=0.0, validator=_number)
    eps: float = attrs.field(default=1e-8, validator=_number)
    base_lr: float | Tensor | None = attrs.field(default=None, validator=_check_base_lr)

    takes_base: ClassVar[bool] = True

    def __attrs_post_init__(self) -> None:
        if self.factor >= 1.0:
            msg = f"`factor` should be < 1.0, got {self.factor!r}."
            raise ValueError(msg)
        if self.mode not in ("min", "max"):
            msg = f"`mode` {self.mode!r} is unknown; use 'min' or 'max'."
            raise ValueError(msg)
        if self.threshold_mode not in ("rel", "abs"):
            msg = (
                f"`threshold_mode` {self.threshold_mode!r} is unknown; use 'rel' "
                "or 'abs'."
            )
            raise ValueError(msg)
        check_int("patience", self.patience, minimum=0)
        check_int("cooldown", self.cooldown, minimum=0)

    def init(self, lr: float | Tensor | None = None, /) -> PlateauState:
        """Return the first state for base rate `lr`.

        Args:
            lr: The optimizer's learning rate: a number or a 0-dim tensor;
                `None` for `base_lr`.

        Returns:
            A `PlateauState` with no best metric yet.

        Raises:
            TypeError: If `lr` is not a number or a tensor.
            ValueError: If `lr` is a tensor with dimensions, or neither `lr` nor
                `base_lr` is given.

        Example:
            >>> from paramdict import optim
            >>> optim.ReduceLROnPlateau().init(0.1).lr
            tensor(0.1000, dtype=torch.float64)
        """
        base = scalar(base_of(self, lr))
        zero = torch.zeros_like(base)
        worse = math.inf if self.mode == "min" else -math.inf
        # Separate tensors: no field aliases another (see `new_state`).
        return PlateauState(
            zero, base.clone(), torch.full_like(zero, worse), zero.clone(), zero.clone()
        )

    def step(self, state: PlateauState, metrics: float | Tensor, /) -> PlateauState:
        """Return the state after one evaluation that measured `metrics`.

        Args:
            state: The state from `init` or the previous `step`.
            metrics: The metric: a number or a 0-dim tensor (detached; it is
                read as a float64 value, as torch's `float(metrics)`).

        Returns:
            The next state; `state` is unchanged.

        Raises:
            TypeError: If `metrics` is not a number or a tensor.
            ValueError: If `metrics` has more than one element.

        Example:
            >>> from paramdict import optim
            >>> schedule = optim.ReduceLROnPlateau(mode="max", patience=0)
            >>> state = schedule.step(schedule.init(1.0), 0.5)
            >>> state.best
            tensor(0.5000, dtype=torch.float64)
        """
        from ._scheduled import check_schedule_state  # a cycle

        check_schedule_state(self, state)
        if isinstance(metrics, Tensor):
            if metrics.numel() != 1:
                msg = (
                    "`metrics` must be one number, got a tensor of shape "
                    f"{tuple(metrics.shape)}."
                )
                raise ValueError(msg)
            current = (
                metrics.detach()
                .reshape(())
                .to(dtype=torch.float64, device=state.lr.device)
            )
        else:
            current = state.lr.new_full((), _metric(metrics))
        best = state.best
        if self.mode == "min" and self.threshold_mode == "rel":
            better = current < best * (1.0 - self.threshold)
        elif self.mode == "min":
            better = current < best - self.threshold
        elif self.threshold_mode == "rel":
            better = current > best * (self.threshold + 1.0)
        else:
            better = current > best + self.threshold
        best = torch.where(better, current, best)
        bad = torch.where(better, 0, state.num_bad_epochs + 1)
        in_cooldown = state.cooldown_counter > 0
        cooldown = torch.where(
            in_cooldown, state.cooldown_counter - 1, state.cooldown_counter
        )
        bad = torch.where(in_cooldown, 0, bad)
        reduce = bad > self.patience
        old = state.lr
        new = torch.clamp_min(old * self.factor, self.min_lr)
        lr = torch.where(reduce & (old - new > self.eps), new, old)
        cooldown = torch.where(reduce, float(self.cooldown), cooldown)
        bad = torch.where(reduce, 0, bad)
        epoch = state.last_epoch + 1
        return PlateauState(epoch, lr, best, bad.to(torch.float64), cooldown)
