"""Schedule combinators: `SequentialLR` and `ChainedScheduler`."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any, cast

import attrs
import torch
from torch import Tensor

from .base import LRSchedule, ScheduleState, check_schedule_state, distinct, new_state
from .numbers import check_int
from .plateau import PlateauState, ReduceLROnPlateau
from .slot import is_schedule

__all__ = ["ChainedScheduler", "SequentialLR"]


def _check_children(
    name: str, schedulers: Sequence[Any], *, metric: bool = False
) -> None:
    if len(schedulers) < 1:
        msg = f"{name} expects at least one schedule, but got none."
        raise ValueError(msg)
    for i, schedule in enumerate(schedulers):
        if not is_schedule(schedule):
            msg = (
                f"{name} takes schedules from `paramdict.optim`; "
                f"`schedulers[{i}]` is a {type(schedule).__name__}."
            )
            raise TypeError(msg)
        if schedule.takes_metric and not metric:
            msg = (
                f"{name} does not support a schedule that moves with a metric "
                f"(`ReduceLROnPlateau`, or a `ChainedScheduler` holding one), but "
                f"got a {type(schedule).__name__} that does at index {i}. Chain it "
                "with the others in a `ChainedScheduler`, which the optimizer's "
                "`step_schedule` steps with the metric."
            )
            raise ValueError(msg)
        if type(schedule).takes_base and schedule.base_lr is not None:
            msg = (
                f"{name} gives its schedules its own base rate, but the one at "
                f"index {i} has `base_lr={schedule.base_lr!r}`. Give `base_lr` to "
                f"the {name} instead."
            )
            raise ValueError(msg)


def _as_tuple(name: str, value: object) -> tuple[Any, ...]:
    """Return a list or tuple as a tuple; refuse anything else by `name`."""
    if not isinstance(value, list | tuple):
        msg = f"`{name}` must be a list or a tuple, got {type(value).__name__}."
        raise TypeError(msg)
    return tuple(cast("Sequence[Any]", value))


def _schedulers(value: Sequence[Any]) -> tuple[Any, ...]:
    return _as_tuple("schedulers", value)


def _milestones(value: Sequence[Any]) -> tuple[Any, ...]:
    return _as_tuple("milestones", value)


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

    schedulers: tuple[LRSchedule, ...] = attrs.field(converter=_schedulers)
    milestones: tuple[int, ...] = attrs.field(converter=_milestones)

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

    @property
    def _schedulers(self) -> tuple[LRSchedule, ...]:
        return self.schedulers

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
        momentum = _last([c.momentum for c in (*children, children[first])])
        return distinct(
            new_state(base, lr, momentum=momentum, children=tuple(children))
        )

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
        return distinct(
            state._replace(
                last_epoch=epoch, lr=lr, momentum=momentum, children=tuple(children)
            )
        )

    def _advance_on_host(self, state: Any, current: float, /) -> Any:
        """Torch's `SequentialLR.step()`: only the active schedule moves."""
        epoch = state.last_epoch + 1
        index = bisect_right(self.milestones, epoch)
        schedule = self.schedulers[index]
        child = state.children[index]
        if index > 0 and self.milestones[index - 1] == epoch:
            moved = schedule._restart_on_host(child, current)
        else:
            moved = schedule._advance_on_host(child, current)
        if moved is None:
            return None
        children = (*state.children[:index], moved, *state.children[index + 1 :])
        momentum = state.momentum
        if moved.momentum is not None and momentum is not None:
            momentum = moved.momentum
        return state._replace(
            last_epoch=epoch, lr=moved.lr, momentum=momentum, children=children
        )


def _last(momenta: Sequence[Tensor | None]) -> Tensor | None:
    """Return the last momentum that is not None (None if none is)."""
    found = [m for m in momenta if m is not None]
    return found[-1] if found else None


def _select(condition: Tensor, a: ScheduleState, b: ScheduleState) -> ScheduleState:
    """Return `a` where `condition` holds, else `b`, field by field."""

    def pick(x: Any, y: Any) -> Any:
        if x is y:  # unchanged (the base rate): keep it, and its aliasing
            return x
        if isinstance(x, Tensor):
            return torch.where(condition, x, y)
        if isinstance(x, tuple):
            items = [pick(u, v) for u, v in zip(cast(Any, x), y, strict=True)]
            return (
                ScheduleState(*items) if isinstance(x, ScheduleState) else tuple(items)
            )
        return x  # None: the same on both sides

    selected: ScheduleState = pick(a, b)
    return selected


@attrs.frozen(kw_only=True, eq=False)
class ChainedScheduler(LRSchedule):
    """Step all `schedulers` every epoch, the functional `ChainedScheduler`.

    Each schedule starts from the rate the previous one set, as in torch.

    A `ReduceLROnPlateau` may be one of them (torch's pattern of two schedulers
    on one optimizer, which its own `ChainedScheduler` cannot step): it passes
    the rate on with every `step`, and moves from the rate the others set when
    `step_metric` (the optimizer's `step_schedule`) gives it the metric.

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
        converter=_schedulers
    )

    def __attrs_post_init__(self) -> None:
        _check_children("ChainedScheduler", self.schedulers, metric=True)

    @property
    def takes_metric(self) -> bool:
        """Whether a chained schedule moves with a metric (`step_metric` moves it).

        A `ReduceLROnPlateau`, or a `ChainedScheduler` holding one, at any depth.

        Example:
            >>> from paramdict import optim
            >>> plateau = optim.ChainedScheduler(schedulers=[
            ...     optim.StepLR(step_size=10), optim.ReduceLROnPlateau()])
            >>> plateau.takes_metric
            True
            >>> optim.ChainedScheduler(schedulers=[plateau]).takes_metric
            True
        """
        return any(s.takes_metric for s in self.schedulers)

    @property
    def _schedulers(self) -> tuple[LRSchedule | ReduceLROnPlateau, ...]:
        return self.schedulers

    def _step_metric(
        self, state: ScheduleState, metrics: float | Tensor, /
    ) -> ScheduleState:
        return self.step_metric(state, metrics)

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
        return distinct(
            new_state(base, lr, momentum=momentum, children=tuple(children))
        )

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        advanced: ScheduleState = distinct(self._chain(state, current, host=False))
        return advanced

    def _advance_on_host(self, state: Any, current: float, /) -> Any:
        return self._chain(state, current, host=True)

    def _chain(self, state: Any, current: Any, *, host: bool) -> Any:
        """Step each schedule from the rate the one before set (None: no host path)."""
        children: list[Any] = []
        lr: Any = current
        for schedule, child in zip(self.schedulers, state.children, strict=True):
            if isinstance(child, PlateauState):
                # Moves with the metric only (`distinct` copies the rate).
                moved: Any = child._replace(lr=lr)
            else:
                kid = cast(LRSchedule, schedule)
                moved = (
                    kid._advance_on_host(child, lr) if host else kid._advance(child, lr)
                )
                if moved is None:
                    return None
            children.append(moved)
            lr = moved.lr
        momentum = _last([_momentum(c) for c in children])
        return state._replace(
            last_epoch=state.last_epoch + 1,
            lr=lr,
            momentum=momentum,
            children=tuple(children),
        )

    def step_metric(
        self, state: ScheduleState, metrics: float | Tensor, /
    ) -> ScheduleState:
        """Return the state after the chained plateaus saw `metrics`.

        torch's `plateau.step(metrics)`: each `ReduceLROnPlateau` of the chain (or
        of a chain nested in it) moves; the other schedules keep their positions.

        Args:
            state: The state from `init` or the previous step.
            metrics: The metric: a number or a one-element tensor.

        Returns:
            The next state; `state` is unchanged.

        Raises:
            ValueError: If no `ReduceLROnPlateau` is chained, at any depth.

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
        if not self.takes_metric:
            msg = (
                "`step_metric` moves the `ReduceLROnPlateau`s of a chain (nested "
                "chains' too), and this ChainedScheduler holds none; its schedules "
                "advance with `step`."
            )
            raise ValueError(msg)
        check_schedule_state(self, state)
        children: list[ScheduleState | PlateauState] = []
        lr = state.lr
        for schedule, child in zip(self.schedulers, state.children, strict=True):
            if schedule.takes_metric:  # a plateau, or a chain holding one
                mover: Any = schedule  # the child is its state (checked above)
                moved: ScheduleState | PlateauState = mover._step_metric(
                    child._replace(lr=lr), metrics
                )
                child, lr = moved, moved.lr
            children.append(child)
        return distinct(state._replace(lr=lr, children=tuple(children)))


def _momentum(state: ScheduleState | PlateauState) -> Tensor | None:
    return None if isinstance(state, PlateauState) else state.momentum
