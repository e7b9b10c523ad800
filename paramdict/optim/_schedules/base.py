"""The schedule base classes and the checks of a state.

A schedule is an immutable configuration with a pure, explicit state:

    state = schedule.init(lr)        # torch's scheduler right after construction
    state = schedule.step(state)     # one `scheduler.step()`
    state.lr                         # `scheduler.get_last_lr()[0]`, a 0-dim tensor

Every number in the state is a 0-dim double-precision tensor, so a compiled step
sees no Python number that changes from step to step; branches on the step count
are `torch.where` selections (the exact arithmetic is in `numbers.py`).
"""

from __future__ import annotations

import abc
import math
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

import attrs
import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from .._hyper import is_traced
from .numbers import base_of, check_base_lr, refuse_epoch, scalar
from .states import ScheduleState

if TYPE_CHECKING:
    from .plateau import PlateauState, ReduceLROnPlateau

__all__ = ["BaseSchedule", "LRSchedule", "ScheduleState"]


StateT = TypeVar("StateT", "ScheduleState", "PlateauState")
"""The kind of state a schedule keeps: `ScheduleState`, or `PlateauState`."""


class BaseSchedule(Generic[StateT], abc.ABC):
    """The root of every schedule: what an optimizer holding one asks of it.

    The defaults describe a schedule of one rate that wraps no other; a class
    that differs overrides them (as properties or class variables, which add no
    field to its `repr`, equality and pickles).
    """

    __slots__ = ()

    _state_type: ClassVar[type[ScheduleState] | type[PlateauState]]
    """The class of the state `init` returns."""

    _counter_names: ClassVar[tuple[str, ...]] = ()
    """torch's names of the values the state keeps in `ScheduleState.counters`."""

    @property
    def cycles_momentum(self) -> bool:
        """Whether the schedule sets the momentum (or first beta) too.

        torch's `cycle_momentum=True` of `CyclicLR` and `OneCycleLR`, or of a
        schedule a combinator wraps. The value is `ScheduleState.momentum`; an
        optimizer without a momentum (or `betas`) refuses such a schedule.

        Example:
            >>> from paramdict import optim
            >>> optim.CyclicLR(base_lr=0.01, max_lr=0.1).cycles_momentum
            True
            >>> optim.StepLR(step_size=2).cycles_momentum
            False
        """
        return any(s.cycles_momentum for s in self._schedulers)

    @property
    def takes_metric(self) -> bool:
        """Whether the schedule moves with a metric (the optimizer's `step_schedule`).

        Example:
            >>> from paramdict import optim
            >>> optim.StepLR(step_size=2).takes_metric
            False
            >>> optim.ReduceLROnPlateau().takes_metric
            True
        """
        return False

    @property
    def _schedulers(self) -> tuple[LRSchedule | ReduceLROnPlateau, ...]:
        """The schedules this one wraps, whose states are `ScheduleState.children`."""
        return ()

    @abc.abstractmethod
    def _step_once(self, state: StateT, /) -> StateT:
        """Return `state` (already checked) after the step that follows an update."""

    def _step_on_host(self, state: Any, /) -> Any:
        """`_step_once` on a state of Python floats, or None (see `LRSchedule`)."""
        return None

    def _step_metric(self, state: StateT, metrics: float | Tensor, /) -> StateT:
        """Return `state` after the schedule saw `metrics` (`step_schedule`)."""
        kind = type(self).__name__
        msg = (
            f"`{kind}` does not move with a metric (its `takes_metric` is False). "
            "Step it with `step`; give the metric to a `ReduceLROnPlateau`, or to "
            "a `ChainedScheduler` holding one."
        )
        raise ValueError(msg)


# ---------------------------------------------------------------- checks of a state


def layout_of(schedule: BaseSchedule[Any]) -> tuple[object, ...]:
    """The kind of state `schedule` keeps: what its state's layout must be."""
    kind = schedule._state_type.__name__
    counters = len(schedule._counter_names)
    children = tuple(layout_of(s) for s in schedule._schedulers)
    return (kind, schedule.cycles_momentum, counters, children)


def state_layout(state: object) -> tuple[object, ...] | None:
    """The layout of `state`, comparable with `layout_of`'s; None if no state."""
    if not isinstance(state, ScheduleState):
        kind = type(state).__name__  # a PlateauState is one of plain fields
        return (kind, False, 0, ()) if kind == "PlateauState" else None
    children: tuple[object, ...] = tuple(state_layout(c) for c in state.children)
    kind = ScheduleState.__name__
    return (kind, state.momentum is not None, len(state.counters), children)


def _fields(state: Any) -> list[tuple[str, object]]:
    if not isinstance(state, ScheduleState):
        return list(zip(state._fields, state))
    # By name, not `state[:4]`: torch 2.6's dynamo fails inside on a named
    # tuple's slice, even where it may break the graph.
    out: list[tuple[str, object]] = [
        ("last_epoch", state.last_epoch),
        ("base_lr", state.base_lr),
        ("lr", state.lr),
        ("momentum", state.momentum),
    ]
    out += [(f"counters[{i}]", c) for i, c in enumerate(state.counters)]
    return out


def _leaves(state: Any, prefix: str = "") -> list[tuple[str, object]]:
    """The fields of `state` and of its children, by full name."""
    # Only the momentum may be None (a schedule that does not cycle it; the
    # layout says which): a None elsewhere is a value of the wrong kind.
    out = [
        (prefix + f, v) for f, v in _fields(state) if v is not None or f != "momentum"
    ]
    if isinstance(state, ScheduleState):
        for i, child in enumerate(state.children):
            out += _leaves(child, f"{prefix}children[{i}].")
    return out


def _fine(field: str, number: float) -> bool:
    if field.endswith("best"):  # infinite before the first metric; never NaN
        return not math.isnan(number)
    # A composed schedule's later children wait at torch's `last_epoch=-1`.
    floor = -1.0 if field.startswith("children") and field.endswith("last_epoch") else 0
    counts = field.endswith(_COUNTS)  # ints in torch's schedulers
    whole = not counts or (math.isfinite(number) and number == int(number))
    return math.isfinite(number) and number >= floor and whole


_COUNTS = ("last_epoch", "num_bad_epochs", "cooldown_counter")


def _bad_fields(state: Any) -> tuple[list[str], list[str]]:
    """Return the fields of `state` (and its children) of a wrong kind, and value.

    Values are read on the CPU only, all in one read, never while tracing.
    """
    kinds: list[str] = []
    tensors: list[tuple[str, Tensor]] = []
    for field, value in _leaves(state):
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


def _departure(
    state: object, expected: tuple[object, ...], prefix: str = ""
) -> tuple[str, object]:
    """The field of `state` (and its value) where its layout departs from `expected`."""
    got = state_layout(state)
    if got is None or got[0] != expected[0] or not isinstance(state, ScheduleState):
        return prefix.rstrip("."), state
    for i, (name, value) in enumerate(
        (("momentum", state.momentum), ("counters", state.counters)), start=1
    ):
        if got[i] != expected[i]:
            return f"{prefix}{name}", value
    theirs = cast("tuple[tuple[object, ...], ...]", expected[3])
    if len(state.children) != len(theirs):
        return f"{prefix}children", state.children
    for i, (child, layout) in enumerate(zip(state.children, theirs, strict=True)):
        if state_layout(child) != layout:
            return _departure(child, layout, f"{prefix}children[{i}].")
    return prefix.rstrip("."), state


def check_schedule_state(
    schedule: BaseSchedule[Any],
    state: object,
    *,
    owner: str = "",
    field: str = "",
    structure: bool = True,
) -> None:
    """Raise unless `state` is a state of `schedule`'s kind with valid values.

    The values are read eagerly on the CPU only. `owner` names the optimizer
    holding the state in its field `field` (`"schedule."`); `structure=False`
    skips the structure, which the caller checked.
    """
    kind = type(schedule).__name__
    got = state_layout(state) if structure else layout_of(schedule)
    if got is None or got != layout_of(schedule):
        path, part = _departure(state, layout_of(schedule))
        what = "a" if got is None else "the state of another schedule, a"
        got_what = f"got {what} {type(state).__name__}"
        if got is not None and path.startswith("children["):
            got_what = (
                f"but the given {type(state).__name__}'s `{path}` (a "
                f"{type(part).__name__}) is not what it keeps there"
            )
        msg = (
            f"`{kind}.step` takes a state of this `{kind}`, {got_what}. Use the "
            "state from this schedule's `init` (or the `step` before)."
        )
        raise (TypeError if got is None else ValueError)(msg)
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
    meta = sorted(f for f, v in _leaves(state) if isinstance(v, Tensor) and v.is_meta)
    if meta:
        names = ", ".join(f"`{field}{b}`" for b in meta)
        msg = (
            f"{whose} holds tensors on the meta device in {names}, which hold no "
            f"value to step from. {fix}"
        )
        raise ValueError(msg)
    if values:
        names = ", ".join(f"`{field}{b}`" for b in sorted(values))
        msg = (
            f"{whose} holds invalid values in {names}: each must be finite and at "
            f"least 0 (`best` may be infinite, a later child's `last_epoch` -1), "
            "and a count (`last_epoch`, `num_bad_epochs`, `cooldown_counter`) a "
            "whole number. "
            f"{fix}"
        )
        raise ValueError(msg)


# ---------------------------------------------------------------- base classes


@attrs.frozen(kw_only=True, eq=False)
class LRSchedule(BaseSchedule[ScheduleState]):
    """The base of every learning-rate schedule except `ReduceLROnPlateau`.

    A subclass is an immutable configuration with `torch.optim.lr_scheduler`'s
    arguments, less the optimizer, plus `base_lr` (torch's `initial_lr`). It is
    the `lr` of any `TorchOptimizer` (`optim.Adam(lr=optim.CosineAnnealingLR(
    base_lr=0.1, T_max=100))`), which keeps its state; on its own, `init` gives
    the state and `step` is pure.

    Subclasses define `_advance` (one `scheduler.step()`), `_initial` (the value
    after torch's constructor) unless it is `current`, and, for `SequentialLR`,
    `_restart` (`scheduler._update_lr(0)`, or its closed form `_restart_lr`),
    each from `current`, the rate the optimizer holds now. A subclass whose state
    is not one plain rate says so: `cycles_momentum`, `_schedulers` (the schedules
    whose states are its children), `_counter_names` and `_step_once` (the step
    after each update, `_advance` by default).

    Example:
        >>> from paramdict import optim
        >>> def rates(schedule: optim.LRSchedule, lr: float, n: int) -> list[float]:
        ...     state, out = schedule.init(lr), []
        ...     for _ in range(n):
        ...         out.append(float(state.lr))
        ...         state = schedule.step(state)
        ...     return out
        >>> rates(optim.StepLR(step_size=2, gamma=0.5), 1.0, 5)
        [1.0, 1.0, 0.5, 0.5, 0.25]

    Attributes:
        base_lr: The base learning rate: a number or a 0-dim floating-point
            tensor (which may require grad, for a learned base rate), or `None`
            to give it to `init` instead. `CyclicLR` and `OneCycleLR` set their
            own rates, as torch does (`CyclicLR.base_lr` is its lower rate).
    """

    takes_base: ClassVar[bool] = True
    """Whether the schedule starts from a base rate (not `CyclicLR`, `OneCycleLR`)."""

    _state_type = ScheduleState

    base_lr: float | Tensor | None = attrs.field(default=None, validator=check_base_lr)

    def init(self, lr: float | Tensor | None = None, /) -> ScheduleState:
        """Return the state right after torch's constructor, for base rate `lr`.

        Args:
            lr: The optimizer's learning rate (torch's `initial_lr`): a number or
                a 0-dim floating-point tensor, which may require grad; `None`
                for the schedule's own `base_lr`. `CyclicLR` and `OneCycleLR`
                take theirs from their own arguments, as torch does, and ignore
                it.

        Returns:
            A `ScheduleState` at `last_epoch == 0`.

        Raises:
            TypeError: If `lr` is not a number or a tensor.
            ValueError: If `lr` is a tensor with dimensions or not floating
                point, or neither `lr` nor `base_lr` is given.

        Example:
            >>> from paramdict import optim
            >>> optim.LinearLR(start_factor=0.5).init(0.1).lr
            tensor(0.0500, dtype=torch.float64)
        """
        base = scalar(base_of(self, lr))
        return self._initial(base, base)

    def step(
        self, state: ScheduleState, epoch: float | None = None, /
    ) -> ScheduleState:
        """Return the state after one `scheduler.step()`; `state` is unchanged.

        Args:
            state: The state from `init` or from the previous `step`.
            epoch: Only `CosineAnnealingWarmRestarts` steps to a given epoch
                (torch's `step(epoch)`, not deprecated there); the others
                refuse it, since torch deprecates their `step(epoch)`.

        Returns:
            The next state; its `lr` is torch's `get_last_lr()[0]` after as many
            `step()` calls, bitwise on the CPU.

        Example:
            >>> from paramdict import optim
            >>> schedule = optim.ExponentialLR(gamma=0.5)
            >>> schedule.step(schedule.init(1.0)).lr
            tensor(0.5000, dtype=torch.float64)
        """
        refuse_epoch(self, epoch)
        check_schedule_state(self, state)
        return self._step_once(state)

    def _step_once(self, state: ScheduleState, /) -> ScheduleState:
        """Return the state after one `scheduler.step()`: `_advance` from its rate."""
        return self._advance(state, state.lr)

    def _step_on_host(self, state: Any, /) -> Any:
        """`_step_once` on a state of Python floats (`slot.on_host`), or None."""
        return self._advance_on_host(state, state.lr)

    def _advance_on_host(self, state: Any, current: float, /) -> Any:
        """`_advance` with Python floats, branch by branch; None if not defined."""
        return None

    def _restart_on_host(self, state: Any, current: float, /) -> Any:
        """`_restart` with Python floats; None if not defined."""
        lr = self._restart_lr(state.base_lr)
        if lr is not None:
            return state._replace(last_epoch=0.0, lr=lr)
        return self._advance_on_host(state._replace(last_epoch=-1.0), current)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        """Return the state after the constructor: by default, at `current`."""
        return new_state(base, current)

    @abc.abstractmethod
    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        """Return the state after one `step()`, the optimizer holding `current`."""

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        """Return the state after `_update_lr(0)`: `get_lr()` at epoch 0."""
        epoch = torch.zeros_like(state.last_epoch)
        lr = self._restart_lr(state.base_lr)
        if lr is not None:
            return state._replace(last_epoch=epoch, lr=lr)
        return self._advance(state._replace(last_epoch=epoch - 1), current)

    def _restart_lr(self, base: Any) -> Any:
        """The rate at epoch 0 from `base` (a float or a tensor), or None."""
        return None


def distinct(state: StateT) -> StateT:
    """Return `state` holding each tensor once: a repeated leaf becomes a copy.

    Leaves sharing one tensor make a compiled step recompile on its next call
    ("Duplicate tensors found"), and `step_` cannot write them as two fields.
    Compiled, the copy is `x.neg().neg()` (exact): inductor drops a `clone` (and
    from torch 2.15 a product by 1) whose result is only copied into the state.
    """
    seen: list[Tensor] = []
    compiling = torch.compiler.is_compiling()

    def own(x: object) -> object:
        if not isinstance(x, Tensor):
            return x
        if any(x is s for s in seen):
            return x.neg().neg() if compiling else x.clone()
        seen.append(x)
        return x

    owned: StateT = pytree.tree_map(own, state)
    return owned


def new_state(
    base: Tensor,
    lr: Tensor,
    *,
    last_epoch: Tensor | None = None,
    momentum: Tensor | None = None,
    counters: tuple[Tensor, ...] = (),
    children: tuple[ScheduleState | PlateauState, ...] = (),
) -> ScheduleState:
    """Return a `ScheduleState`, at epoch 0 unless `last_epoch` is given."""
    if last_epoch is None:
        last_epoch = torch.zeros((), dtype=torch.float64, device=base.device)
    if lr is base:
        # Two fields holding one tensor would make a compiled `step` see
        # different aliasing on its first call than later, and recompile.
        lr = lr.clone()
    return ScheduleState(last_epoch, base, lr, momentum, counters, children)
