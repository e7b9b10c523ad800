"""The schedule state, the schedule base classes and their exact scalar arithmetic.

A schedule is an immutable configuration with a pure, explicit state:

    state = schedule.init(lr)        # torch's scheduler right after construction
    state = schedule.step(state)     # one `scheduler.step()`
    state.lr                         # `scheduler.get_last_lr()[0]`, a 0-dim tensor

Every number in the state is a 0-dim double-precision tensor, so a compiled
function that steps a schedule sees no Python number that changes from step to
step, and branches on the step count are `torch.where` selections. The arithmetic
repeats `torch.optim.lr_scheduler`'s recursive formulas operation by operation:
IEEE double arithmetic on tensors rounds as Python floats do, with two
exceptions handled here. `tensor ** number` takes shortcuts for some exponents
(`x * x * x` for 3) that round differently from Python's `pow`, so exponents are
tensors too (`_pow`); and `torch.cos` differs from `math.cos` by one unit in the
last place for some arguments (14 of 9,600 tested), so `cos` takes the real part
of a complex exponential, which the CPU computes with the C library's `cos`.
Compiled code has no complex numbers: there `cos` is `torch.cos`, which inductor's
C++ code for a 0-dim tensor computes with the C library's `cos` too.
"""

from __future__ import annotations

import abc
import math
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypeVar

import attrs
import torch
from torch import Tensor

from ..._paramdict import ParamDict
from .._protocol import register_state

if TYPE_CHECKING:
    from .plateau import PlateauState, ReduceLROnPlateau

__all__ = ["BaseSchedule", "LRSchedule", "ScheduleState"]


@register_state
class ScheduleState(NamedTuple):
    """The state of a learning-rate schedule: its position and current value.

    Attributes:
        last_epoch: torch's `last_epoch`: the number of `step` calls (0 after
            `init`), a 0-dim float64 tensor.
        base_lr: torch's `initial_lr` (`base_lrs[0]`), a 0-dim float64 tensor.
        lr: The current learning rate, torch's `get_last_lr()[0]`.
        momentum: The cycled momentum (or first beta) of `CyclicLR` and
            `OneCycleLR` with `cycle_momentum=True`; `None` otherwise.
        counters: Schedule-specific counters (`CosineAnnealingWarmRestarts`:
            `T_cur`, `T_i`; `ReduceLROnPlateau`: `best`, `num_bad_epochs`,
            `cooldown_counter`); empty for the others.
        children: The states of the schedules of `SequentialLR` and
            `ChainedScheduler`; empty for the others.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.StepLR(step_size=2, gamma=0.5)
        >>> state = schedule.init(1.0)
        >>> for _ in range(2):
        ...     state = schedule.step(state)
        >>> state.last_epoch, state.lr
        (tensor(2., dtype=torch.float64), tensor(0.5000, dtype=torch.float64))
    """

    last_epoch: Tensor
    base_lr: Tensor
    lr: Tensor
    momentum: Tensor | None
    counters: tuple[Tensor, ...]
    children: tuple[ScheduleState | PlateauState, ...]


StateT = TypeVar("StateT", "ScheduleState", "PlateauState")
"""The kind of state a schedule keeps: `ScheduleState`, or `PlateauState`."""


class BaseSchedule(Generic[StateT], abc.ABC):
    """The root of every schedule: what an optimizer holding one asks of it.

    `LRSchedule` and `ReduceLROnPlateau` derive from it. The optimizer (the
    slot that keeps a schedule's state, the fused kernels, torch's state dicts)
    names no schedule class: it asks these members, so a new schedule, a
    subclass of `LRSchedule` or a new combinator, works by declaring what it
    is. The defaults describe a schedule of one rate that wraps no other; a
    class that differs overrides them (as properties or class variables: they
    add no field, so the `repr`, equality and pickles of a schedule stay its
    configuration's).
    """

    __slots__ = ()

    _state_type: ClassVar[type[ScheduleState] | type[PlateauState]]
    """The class of the state `init` returns."""

    _counter_names: ClassVar[tuple[str, ...]] = ()
    """torch's names of the values the state keeps in `ScheduleState.counters`.

    `CosineAnnealingWarmRestarts` keeps `("T_cur", "T_i")`; the slot checks
    that a state holds as many, and torch's scheduler state dicts keep them
    under these names.
    """

    @property
    def cycles_momentum(self) -> bool:
        """Whether the schedule sets the momentum (or first beta) too.

        torch's `cycle_momentum=True` of `CyclicLR` and `OneCycleLR`; a
        schedule that wraps others (`SequentialLR`, `ChainedScheduler`) does
        when one of them does, as torch's schedulers write the momentum into
        the optimizer they share. The state carries the value in
        `ScheduleState.momentum`; an optimizer without a momentum (or `betas`)
        refuses such a schedule.

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
        """The schedules this one wraps, whose states are `ScheduleState.children`.

        torch's `_schedulers` of `SequentialLR` and `ChainedScheduler`; none for
        the others. The slot checks a state's children against them.
        """
        return ()

    @abc.abstractmethod
    def _step_once(self, state: StateT, /) -> StateT:
        """Return `state` (already checked) after the step that follows an update.

        torch's `scheduler.step()` after `optimizer.step()`: what the optimizer
        holding the schedule runs once per update.
        """

    def _step_metric(self, state: StateT, metrics: float | Tensor, /) -> StateT:
        """Return `state` after the schedule saw `metrics` (`step_schedule`)."""
        kind = type(self).__name__
        msg = (
            f"`{kind}` does not move with a metric (its `takes_metric` is False). "
            "Step it with `step`; give the metric to a `ReduceLROnPlateau`, or to "
            "a `ChainedScheduler` holding one."
        )
        raise ValueError(msg)


# ---------------------------------------------------------------- exact scalars


def scalar(value: float | Tensor, like: Tensor | None = None) -> Tensor:
    """Return `value` as a 0-dim float64 tensor (on `like`'s device)."""
    device = like.device if like is not None else None
    if isinstance(value, Tensor):
        return value.to(dtype=torch.float64, device=device)
    return torch.tensor(value, dtype=torch.float64, device=device)


def pow_(base: float | Tensor, exponent: float | Tensor, like: Tensor) -> Tensor:
    """Return `base ** exponent` rounded as Python's `pow` (tensor operands only)."""
    return torch.pow(scalar(base, like), scalar(exponent, like))


def cos(x: Tensor) -> Tensor:
    """Return `cos(x)` equal to `math.cos` bitwise (on the CPU).

    Eager `torch.cos` is off by one unit in the last place for some arguments (its
    vectorized kernel); the real part of `exp(i x)` comes from the C library's
    `cos` (times `exp(0) = 1`). Inductor generates no code for complex numbers,
    while its C++ code for a 0-dim `torch.cos` calls the C library's `cos`, so
    compiled, `cos` is `torch.cos`. (A compiler backend that runs torch's eager
    kernels, such as `"aot_eager"`, inherits their last-place differences.)
    """
    if torch.compiler.is_compiling():
        return torch.cos(x)
    return torch.exp(torch.complex(torch.zeros_like(x), x)).real


def rdiv(number: float, x: Tensor) -> Tensor:
    """Return `number / x` rounded once (`number / x` is a reciprocal and a product)."""
    return torch.div(x.new_full((), number), x)


def nonzero(x: Tensor) -> Tensor:
    """Return `x` with zeros replaced by one: a divisor for a branch `where` drops.

    `torch.where` evaluates both branches; a division by zero in the dropped one
    would put `nan` into the gradient of the kept one.
    """
    return torch.where(x == 0, torch.ones_like(x), x)


INT64_MAX = 2**63 - 1
"""The largest setting a schedule's tensor arithmetic can hold as an integer."""


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
    """Raise unless `lr` is a number or a 0-dim floating-point tensor."""
    if isinstance(lr, ParamDict):
        msg = (
            "A schedule's base learning rate must be a number or a 0-dim tensor, "
            "got a ParamDict of per-key values. For per-key schedules give each "
            "group of keys its own optimizer and schedule with `optim.ParamGroups`."
        )
        raise TypeError(msg)
    if isinstance(lr, Tensor):
        if lr.dim() != 0 or not lr.is_floating_point():
            msg = (
                "A schedule's base learning rate must be a number or a 0-dim "
                f"floating-point tensor, got shape {tuple(lr.shape)} and {lr.dtype}."
            )
            raise ValueError(msg)
        check_rate("base_lr", lr)
        return
    check_float("lr", lr)
    check_rate("base_lr", lr)


def _check_base_lr(instance: object, attribute: Any, value: Any) -> None:
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


# ---------------------------------------------------------------- base classes


@attrs.frozen(kw_only=True, eq=False)
class LRSchedule(BaseSchedule[ScheduleState]):
    """The base of every learning-rate schedule except `ReduceLROnPlateau`.

    A subclass is an immutable configuration with `torch.optim.lr_scheduler`'s
    arguments, less the optimizer, plus `base_lr`: the base learning rate
    (torch's `initial_lr`, the optimizer's `lr`). A schedule is the `lr` of any
    `TorchOptimizer` (`optim.Adam(lr=optim.CosineAnnealingLR(base_lr=0.1,
    T_max=100))`), which keeps its state; on its own, `init` gives the state and
    `step` is pure; the schedule's position and value live in the returned
    `ScheduleState`.

    Subclasses define `_initial` (the value after torch's constructor), `_advance`
    (one `scheduler.step()`) and, for `SequentialLR`, `_restart`
    (`scheduler._update_lr(0)`). Each receives `current`, the learning rate the
    optimizer holds now, which the recursive formulas start from; a schedule on
    its own passes its own `lr`, `SequentialLR` and `ChainedScheduler` pass the
    value their children share. A subclass whose state is not one plain rate
    says so, and the optimizer holding it follows: `cycles_momentum` (its state
    carries a momentum), `_schedulers` (the schedules it wraps, whose states are
    its children), `_counter_names` (the counters its state keeps) and
    `_step_once` (the step after each update, `_advance` by default).

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

    base_lr: float | Tensor | None = attrs.field(default=None, validator=_check_base_lr)

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
        from .slot import check_schedule_state  # a cycle

        refuse_epoch(self, epoch)
        check_schedule_state(self, state)
        return self._step_once(state)

    def _step_once(self, state: ScheduleState, /) -> ScheduleState:
        """Return the state after one `scheduler.step()`: `_advance` from its rate."""
        return self._advance(state, state.lr)

    @abc.abstractmethod
    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        """Return the state after the constructor, the optimizer holding `current`."""

    @abc.abstractmethod
    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        """Return the state after one `step()`, the optimizer holding `current`."""

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        """Return the state after `_update_lr(0)`: `get_lr()` at epoch 0."""
        epoch = torch.zeros_like(state.last_epoch)
        return self._advance(state._replace(last_epoch=epoch - 1), current)


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
