"""A schedule as an optimizer's learning rate: the state slot and its checks.

`TorchOptimizer` takes a schedule where it takes a rate (`lr=optim.
CosineAnnealingLR(base_lr=0.1, T_max=100)`). The schedule's state lives in the
optimizer's state, in its last field, `schedule` (`()` for a plain rate), so
`step` stays pure, the state saves and loads with `weights_only=True`, and a
compiled step sees tensors only. The rule reads the current value (torch's
`get_last_lr()[0]`, and the momentum of a schedule that cycles it), and the slot
advances once per update: torch's `optimizer.step(); scheduler.step()`. A
schedule that moves with a metric advances through `step_schedule(state,
metrics)`.

No schedule class is named here: each schedule answers for itself (see
`BaseSchedule`): whether it cycles the momentum or takes a metric, the
schedules it wraps, the counters its state keeps, and its step after an update.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, TypeAlias, TypeGuard, cast

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from ..._paramdict import ParamDict
from .._hyper import Rate, is_traced
from .._slot import install_slot_rules
from .base import BaseSchedule, LRSchedule, ScheduleState
from .plateau import PlateauState, ReduceLROnPlateau

LearningRate: TypeAlias = Rate | LRSchedule | ReduceLROnPlateau
"""A rate (number, 0-dim tensor, per-key ParamDict) or a schedule."""

SlotState: TypeAlias = ScheduleState | PlateauState | tuple[()]
"""The `schedule` field of an optimizer's state: `()` (no leaves) for a plain rate."""

__all__ = [
    "LearningRate",
    "Schedule",
    "SlotState",
    "advanced",
    "check_fits",
    "check_slot",
    "first_state",
    "initial_rate",
    "is_schedule",
]

Schedule: TypeAlias = LRSchedule | ReduceLROnPlateau
"""A learning-rate schedule: any `LRSchedule`, or `ReduceLROnPlateau`."""


def is_schedule(value: object) -> TypeGuard[Schedule]:
    """Return whether `value` is a schedule (not a plain rate)."""
    return isinstance(value, BaseSchedule)


def check_fits(owner: Any, schedule: Schedule) -> None:
    """Raise unless `owner`, a `TorchOptimizer`, can run with `schedule` as `lr`.

    Its state must have the `schedule` field; the schedule must know its base
    rate; and a schedule that cycles the momentum needs an optimizer with a
    momentum (`momentum > 0`, which keeps a buffer) or `betas`.
    """
    name = type(owner).__name__
    state_type: type[Any] = getattr(owner, "state_type", object)
    fields: tuple[str, ...] = getattr(state_type, "_fields", ())
    if "schedule" not in fields:
        msg = (
            f"`{name}` cannot take a schedule as `lr`: its state "
            f"`{state_type.__name__}` has no `schedule` field. Add "
            "`schedule: SlotState = ()` as the state's last field and carry it "
            "with `self.next_schedule(state)` in the rule."
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


def first_state(schedule: Schedule, params: ParamDict) -> ScheduleState | PlateauState:
    """Return the schedule's first state, on the device of `params`.

    Every tensor of it is a new one: a composed schedule's children start from
    their parent's base rate, and a state whose leaves shared one tensor (or held
    the caller's `base_lr` tensor) could not be written in place by `step_`.
    """
    first = next(iter(params.values()), None)
    state = schedule.init()
    device = state.lr.device if first is None else first.device

    def own(x: object) -> object:
        return x.to(device, copy=True) if isinstance(x, Tensor) else x

    owned: ScheduleState | PlateauState = pytree.tree_map(own, state)
    return owned


def initial_rate(lr: LearningRate, params: ParamDict) -> Tensor | None:
    """Return a schedule's rate for the first step, or None for a plain rate.

    For the rules that read `lr` when they build their state (Rprop's step
    sizes, ASGD's `eta`): the value torch's scheduler writes on construction.
    """
    if not is_schedule(lr):
        return None
    return first_state(lr, params).lr


def takes_metric(lr: object) -> bool:
    """Whether `lr` is a schedule that moves with a metric (`takes_metric`)."""
    return is_schedule(lr) and lr.takes_metric


def stepped_with_metric(
    schedule: Schedule, state: object, metrics: float | Tensor
) -> ScheduleState | PlateauState:
    """Return the slot `state` after `schedule` saw `metrics` (its `_step_metric`)."""
    # `check_slot` matched the slot to this schedule: it is the state it takes.
    moved = cast("BaseSchedule[Any]", schedule)
    stepped: ScheduleState | PlateauState = moved._step_metric(state, metrics)
    return stepped


def advanced(schedule: Schedule, state: SlotState) -> SlotState:
    """Return the slot after one optimizer step: one `scheduler.step()`.

    The schedule's `_step_once` says how it moves: `ReduceLROnPlateau` does
    not (it moves with a metric, `step_schedule`); `OneCycleLR` raises past its
    `total_steps`, as torch does (eagerly on the CPU, where reading the step is
    cheap; a compiled step continues its last phase).
    """
    if not isinstance(state, (ScheduleState, PlateauState)):
        return state  # a plain rate's `()`
    # `check_slot` matched the slot to this schedule: it is the state it takes.
    moved = cast("BaseSchedule[Any]", schedule)
    stepped: ScheduleState | PlateauState = moved._step_once(state)
    return stepped


_LAYOUTS: weakref.WeakKeyDictionary[Schedule, tuple[object, ...]] = (
    weakref.WeakKeyDictionary()
)
"""The layout of each schedule's state: schedules are immutable, so it is kept."""


def _layout(schedule: Schedule) -> tuple[object, ...]:
    if torch.compiler.is_compiling():  # a weak mapping would break the graph
        return _build_layout(schedule)
    known = _LAYOUTS.get(schedule)
    if known is None:
        known = _LAYOUTS[schedule] = _build_layout(schedule)
    return known


def _build_layout(schedule: Schedule) -> tuple[object, ...]:
    """The kind of state `schedule` keeps: what its state's layout must be."""
    kind = schedule._state_type.__name__
    counters = len(schedule._counter_names)
    children = tuple(_layout(s) for s in schedule._schedulers)
    return (kind, schedule.cycles_momentum, counters, children)


def _state_layout(state: object) -> tuple[object, ...] | None:
    """The layout of `state`, comparable with `_build_layout`'s; None if no state."""
    if isinstance(state, PlateauState):
        return (PlateauState.__name__, False, 0, ())
    if not isinstance(state, ScheduleState):
        return None
    children: tuple[object, ...] = tuple(_state_layout(c) for c in state.children)
    kind = ScheduleState.__name__
    return (kind, state.momentum is not None, len(state.counters), children)


def _fields(state: ScheduleState | PlateauState) -> list[tuple[str, object]]:
    if isinstance(state, PlateauState):
        return list(zip(state._fields, state))
    names = ["last_epoch", "base_lr", "lr", "momentum"]
    out: list[tuple[str, object]] = list(zip(names, state[:4]))
    out += [(f"counters[{i}]", c) for i, c in enumerate(state.counters)]
    return out


def _leaves(
    state: ScheduleState | PlateauState, prefix: str, out: list[tuple[str, object]]
) -> None:
    """Append the fields of `state` and of its children to `out`, by full name."""
    out += [(prefix + f, v) for f, v in _fields(state) if v is not None]
    if isinstance(state, ScheduleState):
        for i, child in enumerate(state.children):
            _leaves(child, f"{prefix}children[{i}].", out)


def _fine(field: str, number: float) -> bool:
    if field.endswith("best"):  # infinite before the first metric; never NaN
        return not math.isnan(number)
    # A composed schedule's later children wait at torch's `last_epoch=-1`.
    floor = -1.0 if field.startswith("children") and field.endswith("last_epoch") else 0
    return math.isfinite(number) and number >= floor


def _bad_fields(state: ScheduleState | PlateauState) -> tuple[list[str], list[str]]:
    """Return the fields of `state` (and its children) of a wrong kind, and value.

    Values are read on the CPU only (where torch reads its schedules' numbers as
    Python floats anyway), all in one read, never while tracing.
    """
    leaves: list[tuple[str, object]] = []
    _leaves(state, "", leaves)
    kinds: list[str] = []
    tensors: list[tuple[str, Tensor]] = []
    for field, value in leaves:
        if not (
            isinstance(value, Tensor)
            and value.ndim == 0
            and value.dtype.is_floating_point
        ):
            kinds.append(field)
        elif value.is_cpu:
            tensors.append((field, value))
    if kinds or not tensors or torch.compiler.is_compiling():
        return kinds, []
    dtypes = {t.dtype for _, t in tensors}
    if len(dtypes) > 1:
        tensors = [(f, t.to(torch.float64)) for f, t in tensors]
    stacked = torch.stack([t.detach() for _, t in tensors])
    if is_traced(stacked):
        return kinds, []
    numbers = cast("list[float]", stacked.tolist())  # pyright: ignore[reportUnknownMemberType]
    values = [f for (f, _), x in zip(tensors, numbers) if not _fine(f, x)]
    return kinds, values


def check_schedule_state(
    schedule: Schedule,
    state: object,
    *,
    owner: str = "",
    field: str = "",
    structure: bool = True,
) -> None:
    """Raise unless `state` is a state of `schedule`'s kind with valid values.

    The structure (the kind of state, its counters and children) is checked
    always; the values (finite, not negative; `best` not NaN) on the CPU,
    eagerly, not while tracing. `owner` names the optimizer holding the state
    in its field `field` (`"schedule."`), for the message; `structure=False`
    skips the structure, which the caller checked.
    """
    kind = type(schedule).__name__
    got = _state_layout(state) if structure else _layout(schedule)
    if got is None or got != _layout(schedule):
        what = "a" if got is None else "the state of another schedule, a"
        msg = (
            f"`{kind}.step` takes a state of this `{kind}`, got {what} "
            f"{type(state).__name__}. Use the state from this schedule's `init` "
            "(or the `step` before)."
        )
        raise (TypeError if got is None else ValueError)(msg)
    assert isinstance(state, (ScheduleState, PlateauState))
    kinds, values = _bad_fields(state)
    whose = f"`{owner}`'s state" if owner else f"The state of this `{kind}`"
    fix = "Use the state from `init` or a saved one, unchanged."
    if kinds:
        names = ", ".join(f"`{field}{b}`" for b in sorted(kinds))
        msg = (
            f"{whose} holds values of the wrong kind in {names}: each must be a "
            f"0-dim floating-point tensor. {fix}"
        )
        raise TypeError(msg)
    if values:
        names = ", ".join(f"`{field}{b}`" for b in sorted(values))
        msg = (
            f"{whose} holds invalid values in {names}: each must be finite and at "
            f"least 0 (`best` may be infinite, a later child's `last_epoch` -1). "
            f"{fix}"
        )
        raise ValueError(msg)


def check_slot(owner: Any, schedule: LearningRate, state: object) -> None:
    """Raise unless `state` (a state's `schedule` field) belongs to `schedule`.

    The check is structural (the kind of state, its counters and children): two
    schedules with states of one shape, such as `StepLR` and `ExponentialLR`,
    cannot be told apart. The values are checked too (`check_schedule_state`).
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
    got = _state_layout(state)
    if got is None or got != _layout(schedule):
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


class _Rules:
    """The schedules' side of `_slot.SlotRules`, installed below."""

    __slots__ = ()

    def is_schedule(self, value: object, /) -> bool:
        return is_schedule(value)

    def is_slot(self, value: object, /) -> bool:
        return isinstance(value, (ScheduleState, PlateauState))

    def check_fits(self, owner: Any, schedule: Any, /) -> None:
        check_fits(owner, schedule)

    def check_slot(self, owner: Any, lr: Any, slot: object, /) -> None:
        check_slot(owner, lr, slot)

    def first_state(
        self, schedule: Any, params: ParamDict, /
    ) -> ScheduleState | PlateauState:
        return first_state(schedule, params)

    def advanced(self, schedule: Any, slot: SlotState, /) -> SlotState:
        return advanced(schedule, slot)

    def momentum(self, schedule: Any, slot: object, /) -> Tensor | None:
        if not isinstance(slot, ScheduleState) or not schedule.cycles_momentum:
            return None
        return slot.momentum

    def takes_metric(self, schedule: object, /) -> bool:
        return takes_metric(schedule)

    def step_metric(
        self, schedule: Any, slot: SlotState, metrics: float | Tensor, /
    ) -> SlotState:
        return stepped_with_metric(schedule, slot, metrics)


install_slot_rules(_Rules())
