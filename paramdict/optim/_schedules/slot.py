"""A schedule as an optimizer's learning rate: the state slot and its checks.

The schedule's state is the optimizer state's last field, `schedule` (`()` for a
plain rate), advanced once per update (torch's `optimizer.step();
scheduler.step()`). No schedule class is named here: each answers for itself
(see `BaseSchedule`).
"""

from __future__ import annotations

from typing import Any, TypeAlias, TypeGuard, cast

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
from torch import Tensor
from torch.utils import _pytree as pytree

from .._hyper import Rate
from .base import (
    BaseSchedule,
    LRSchedule,
    ScheduleState,
    check_schedule_state,
    layout_of,
    state_layout,
)
from .plateau import PlateauState, ReduceLROnPlateau
from .states import SlotState

LearningRate: TypeAlias = Rate | LRSchedule | ReduceLROnPlateau
"""A rate (number, 0-dim tensor, per-key ParamDict) or a schedule."""


__all__ = [
    "LearningRate",
    "Schedule",
    "SlotState",
    "advanced",
    "advanced_on_host",
    "check_fits",
    "check_slot",
    "cycled_momentum",
    "first_state",
    "is_schedule",
    "on_host",
    "takes_metric",
    "write_on_host",
]

Schedule: TypeAlias = LRSchedule | ReduceLROnPlateau
"""A learning-rate schedule: any `LRSchedule`, or `ReduceLROnPlateau`."""


def is_schedule(value: object) -> TypeGuard[Schedule]:
    """Return whether `value` is a schedule (not a plain rate)."""
    return isinstance(value, BaseSchedule)


def check_fits(owner: Any, schedule: Schedule) -> None:
    """Raise unless `owner`, a `TorchOptimizer`, can run with `schedule` as `lr`."""
    name = type(owner).__name__
    state_type: type[Any] = getattr(owner, "state_type", object)
    fields: tuple[str, ...] = getattr(state_type, "_fields", ())
    if "schedule" not in fields:
        msg = (
            f"`{name}` cannot take a schedule as `lr`: its state "
            f"`{state_type.__name__}` has no `schedule` field. Add "
            "`schedule: optim.SlotState = ()` as the state's last field: the "
            "optimizer reads the rate from it and advances it."
        )
        raise TypeError(msg)
    if type(schedule).takes_base and schedule.base_lr is None:
        msg = (
            f"The `{type(schedule).__name__}` given as `lr` needs its base learning "
            f"rate: build it with `base_lr=` (`{type(schedule).__name__}("
            "base_lr=0.1, ...)`)."
        )
        raise ValueError(msg)
    if not schedule.cycles_momentum:
        return
    momentum: object = getattr(owner, "momentum", None)
    if momentum is None and not hasattr(owner, "betas"):
        msg = (
            f"The `{type(schedule).__name__}` given as `lr` cycles the momentum "
            f"or the first beta, and `{name}` has neither. Pass "
            "`cycle_momentum=False` to the schedule that cycles it."
        )
        raise ValueError(msg)
    if momentum is not None and momentum == 0:
        msg = (
            f"The `{type(schedule).__name__}` given as `lr` cycles `{name}`'s "
            "momentum, but `momentum=0` keeps no momentum buffer. Give the "
            "optimizer a momentum (any value above 0: the schedule replaces it) "
            "or pass `cycle_momentum=False` to the schedule that cycles it."
        )
        raise ValueError(msg)


def first_state(schedule: Schedule) -> ScheduleState | PlateauState:
    """Return the schedule's first state on the CPU (where torch keeps it), new tensors.

    New, so that no two leaves (nor the caller's `base_lr`) share one tensor,
    which `step_` could not write in place.
    """
    state = schedule.init()

    def own(x: object) -> object:
        return x.to("cpu", copy=True) if isinstance(x, Tensor) else x

    owned: ScheduleState | PlateauState = pytree.tree_map(own, state)
    return owned


def advanced_on_host(schedule: Schedule, state: object) -> Any:
    """The slot after one step computed with Python floats (`on_host`), or None."""
    if torch.compiler.is_compiling() or not isinstance(
        state, (ScheduleState, PlateauState)
    ):
        return None
    host = on_host(state)
    return None if host is None else schedule._step_on_host(host)


def on_host(state: Any) -> Any:
    """`state` with each tensor read as its float, or None where one cannot be.

    A plain tuple field (counters, children) is read in this call, so a step
    enters one frame per schedule state, not one per tuple.
    """
    values: list[Any] = []
    for field in state:
        whole: Any = field  # pyright narrows `field` below; `whole` stays Any
        plain = isinstance(field, tuple) and not hasattr(whole, "_fields")
        members: tuple[Any, ...] = whole if plain else (whole,)
        read: list[Any] = []
        for item in members:
            if isinstance(item, Tensor):
                # Read for free only as a plain CPU tensor (see `is_traced`);
                # tested here, not in a function: one frame per tensor per step.
                if (
                    type(item) is not Tensor
                    or not item.is_cpu
                    or item.requires_grad
                    or torch._C._functorch.is_functorch_wrapped_tensor(item)
                ):
                    return None
                item = item.item()
            elif isinstance(item, tuple):
                item = on_host(item)
                if item is None:
                    return None
            read.append(item)
        values.append(tuple(read) if plain else read[0])
    return type(state)(*values) if hasattr(state, "_fields") else tuple(values)


def write_on_host(slot: Any, host: Any) -> None:
    """Write the floats of `host` into the tensors of `slot` (its structure)."""
    for field, value in zip(slot, host):
        whole: Any = field
        plain = isinstance(field, tuple) and not hasattr(whole, "_fields")
        tensors: tuple[Any, ...] = whole if plain else (whole,)
        numbers: tuple[Any, ...] = value if plain else (value,)
        for tensor, number in zip(tensors, numbers):
            if isinstance(tensor, Tensor):
                tensor.fill_(number)
            elif isinstance(tensor, tuple):
                write_on_host(tensor, number)


def cycled_momentum(lr: object, slot: object) -> Tensor | None:
    """The momentum `lr`'s schedule sets for this step, or None if none cycles."""
    if isinstance(slot, ScheduleState) and is_schedule(lr) and lr.cycles_momentum:
        return slot.momentum
    return None


def takes_metric(lr: object) -> bool:
    """Whether `lr` is a schedule that moves with a metric (`takes_metric`)."""
    return is_schedule(lr) and lr.takes_metric


def advanced(schedule: Schedule, state: SlotState) -> SlotState:
    """Return the slot after one optimizer step: the schedule's `_step_once`."""
    if not isinstance(state, (ScheduleState, PlateauState)):
        return state  # a plain rate's `()`
    # `check_slot` matched the slot to this schedule: it is the state it takes.
    moved = cast("BaseSchedule[Any]", schedule)
    stepped: ScheduleState | PlateauState = moved._step_once(state)
    return stepped


def check_slot(owner: Any, schedule: LearningRate, state: object) -> None:
    """Raise unless `state` (a state's `schedule` field) belongs to `schedule`.

    By structure (`StepLR`'s and `ExponentialLR`'s states look alike) and values.
    """
    name = type(owner).__name__
    if not is_schedule(schedule):
        if not (
            isinstance(state, tuple) and len(cast("tuple[object, ...]", state)) == 0
        ):
            msg = (
                f"The state's `schedule` holds a schedule's state, but `{name}`'s "
                "`lr` is not a schedule. Use the state from this optimizer's `init`."
            )
            raise ValueError(msg)
        return
    kind = type(schedule).__name__
    got = state_layout(state)
    if got is None or got != layout_of(schedule):
        what = (
            "no schedule state"
            if got is None
            else f"a {type(state).__name__} of another shape"
        )
        msg = (
            f"The state's `schedule` must be the state of `{name}`'s `{kind}`, got "
            f"{what}. Use the state from this optimizer's `init`."
        )
        raise ValueError(msg)
    check_schedule_state(
        schedule, state, owner=name, field="schedule.", structure=False
    )
    tensor = cast("ScheduleState | PlateauState", state).lr
    if tensor.dtype != torch.float64 and tensor.device.type != "mps":
        msg = (
            f"`{name}`'s state holds `schedule.lr` as {tensor.dtype}; it must be "
            "float64. Use the state from `init` or a saved one, unchanged."
        )
        raise TypeError(msg)
