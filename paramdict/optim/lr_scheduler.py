"""Learning-rate schedules: the functional `torch.optim.lr_scheduler`.

Each class has torch's name and arguments, less the optimizer (the base rate is
the argument of `init`) and `last_epoch` (resume from a saved `ScheduleState`
instead). The machinery is in the `_schedules` package: `base.py` holds the state
and the exact arithmetic, `cyclic.py` `CyclicLR` and `OneCycleLR`, `chain.py` the
combinators and `plateau.py` `ReduceLROnPlateau`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeGuard, cast

import attrs
import torch
from torch import Tensor

from ._schedules.base import (
    LRSchedule,
    ScheduleState,
    check_float,
    check_int,
    cos,
    new_state,
    nonzero,
    number_field,
    pow_,
    rdiv,
)
from ._schedules.slot import check_schedule_state

__all__ = [
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "ExponentialLR",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "PolynomialLR",
    "StepLR",
]

LrLambda = Callable[[Tensor], float | Tensor]


def _check_callable(instance: object, attribute: Any, value: Any) -> None:
    if not callable(value):
        msg = (
            f"`{attribute.name}` should be a function, but got {type(value).__name__}."
        )
        raise TypeError(msg)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _next(state: ScheduleState) -> Tensor:
    return state.last_epoch + 1


@attrs.frozen(kw_only=True, eq=False)
class LambdaLR(LRSchedule):
    """Multiply the base rate by `lr_lambda(epoch)`, the functional `LambdaLR`.

    `lr_lambda` receives the epoch as a 0-dim float64 tensor, not an int, so that
    a compiled step does not specialize on it: write it with tensor-friendly
    operations (`0.95 ** epoch`, `torch.where`, `torch.clamp`).

    Attributes:
        lr_lambda: A function of the epoch returning the multiplicative factor.

    Raises:
        TypeError: If `lr_lambda` is not callable.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.LambdaLR(lr_lambda=lambda epoch: 0.5**epoch)
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.5000, dtype=torch.float64)
    """

    lr_lambda: LrLambda = attrs.field(validator=_check_callable)

    def _value(self, base: Tensor, epoch: Tensor) -> Tensor:
        return torch.as_tensor(base * self.lr_lambda(epoch), dtype=torch.float64)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return new_state(base, self._value(base, torch.zeros_like(base)))

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = _next(state)
        lr = self._value(state.base_lr, epoch)
        return state._replace(last_epoch=epoch, lr=lr)


@attrs.frozen(kw_only=True, eq=False)
class MultiplicativeLR(LRSchedule):
    """Multiply the rate by `lr_lambda(epoch)` each step (`MultiplicativeLR`).

    `lr_lambda` receives the epoch as a 0-dim float64 tensor (see `LambdaLR`).

    Attributes:
        lr_lambda: A function of the epoch returning the factor for that step.

    Raises:
        TypeError: If `lr_lambda` is not callable.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.MultiplicativeLR(lr_lambda=lambda epoch: 0.5)
        >>> schedule.step(schedule.step(schedule.init(1.0))).lr
        tensor(0.2500, dtype=torch.float64)
    """

    lr_lambda: LrLambda = attrs.field(validator=_check_callable)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return new_state(base, current)

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = _next(state)
        lr = torch.as_tensor(current * self.lr_lambda(epoch), dtype=torch.float64)
        return state._replace(last_epoch=epoch, lr=lr)


@attrs.frozen(kw_only=True, eq=False)
class StepLR(LRSchedule):
    """Decay the rate by `gamma` every `step_size` epochs, the functional `StepLR`.

    Attributes:
        step_size: The period of the decay, in epochs (at least 1).
        gamma: The multiplicative factor of the decay.

    Raises:
        TypeError: If `step_size` is not an int or `gamma` not a number.
        ValueError: If `step_size < 1`.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.StepLR(step_size=1, gamma=0.1)
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.1000, dtype=torch.float64)
    """

    step_size: int
    gamma: float = attrs.field(default=0.1, validator=number_field)

    def __attrs_post_init__(self) -> None:
        check_int("step_size", self.step_size, minimum=1)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return new_state(base, current)

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = _next(state)
        keep = torch.remainder(epoch, self.step_size) != 0
        lr = torch.where(keep, current, current * self.gamma)
        return state._replace(last_epoch=epoch, lr=lr)

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        lr = state.base_lr * self.gamma**0
        return state._replace(last_epoch=torch.zeros_like(state.last_epoch), lr=lr)


def _check_milestones(instance: object, attribute: Any, value: Any) -> None:
    if not isinstance(value, tuple) or not all(
        isinstance(m, int) and not isinstance(m, bool)
        for m in cast("tuple[object, ...]", value)
    ):
        msg = f"`{attribute.name}` must be a sequence of ints, got {value!r}."
        raise TypeError(msg)
    for i, m in enumerate(cast("tuple[int, ...]", value)):
        check_int(f"{attribute.name}[{i}]", m, minimum=-(2**63))


def _to_int_tuple(value: Iterable[int]) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        msg = f"`milestones` must be a sequence of ints, got {value!r}."
        raise TypeError(msg)
    return tuple(value)


@attrs.frozen(kw_only=True, eq=False)
class MultiStepLR(LRSchedule):
    """Decay the rate by `gamma` at each milestone, the functional `MultiStepLR`.

    A milestone listed `n` times multiplies by `gamma ** n` there, as in torch.

    Attributes:
        milestones: Epochs at which to decay (any order, repeats allowed).
        gamma: The multiplicative factor of the decay.

    Raises:
        TypeError: If `milestones` is not a sequence of ints or `gamma` not a
            number.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.MultiStepLR(milestones=[1], gamma=0.5)
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.5000, dtype=torch.float64)
    """

    milestones: tuple[int, ...] = attrs.field(
        converter=_to_int_tuple, validator=_check_milestones
    )
    gamma: float = attrs.field(default=0.1, validator=number_field)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return new_state(base, current)

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = _next(state)
        lr = current
        for milestone, count in Counter(self.milestones).items():
            lr = torch.where(epoch == milestone, current * self.gamma**count, lr)
        return state._replace(last_epoch=epoch, lr=lr)

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        passed = sum(1 for m in self.milestones if m <= 0)
        lr = state.base_lr * self.gamma**passed
        return state._replace(last_epoch=torch.zeros_like(state.last_epoch), lr=lr)


def _check_unit(name: str, value: float, *, open_low: bool = False) -> None:
    check_float(name, value)
    low_ok = value > 0 if open_low else value >= 0
    if not (low_ok and value <= 1):
        interval = "(0, 1]" if open_low else "[0, 1]"
        msg = f"`{name}` must be in {interval}, got {value!r}."
        raise ValueError(msg)


@attrs.frozen(kw_only=True, eq=False)
class ConstantLR(LRSchedule):
    """Scale the rate by `factor` until `total_iters`, the functional `ConstantLR`.

    Attributes:
        factor: The factor in [0, 1] for the first `total_iters` epochs.
        total_iters: The epoch at which the factor is undone.

    Raises:
        TypeError: If `factor` is not a number or `total_iters` not an int.
        ValueError: If `factor` is outside [0, 1] or `total_iters` negative.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.ConstantLR(factor=0.5, total_iters=1)
        >>> state = schedule.init(1.0)
        >>> state.lr, schedule.step(state).lr
        (tensor(0.5000, dtype=torch.float64), tensor(1., dtype=torch.float64))
    """

    factor: float = 1.0 / 3
    total_iters: int = 5

    def __attrs_post_init__(self) -> None:
        _check_unit("factor", self.factor)
        check_int("total_iters", self.total_iters, minimum=0)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return new_state(base, current * self.factor)

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = _next(state)
        undo = math.inf if self.factor == 0 else 1.0 / self.factor
        lr = torch.where(epoch != self.total_iters, current, current * undo)
        return state._replace(last_epoch=epoch, lr=lr)

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        factor = self.factor + (self.total_iters <= 0) * (1 - self.factor)
        lr = state.base_lr * factor
        return state._replace(last_epoch=torch.zeros_like(state.last_epoch), lr=lr)


@attrs.frozen(kw_only=True, eq=False)
class LinearLR(LRSchedule):
    """Ramp the factor linearly to `end_factor`, the functional `LinearLR`.

    Attributes:
        start_factor: The factor at epoch 0, in (0, 1].
        end_factor: The factor from epoch `total_iters` on, in [0, 1].
        total_iters: The length of the ramp, in epochs.

    Raises:
        TypeError: If a factor is not a number or `total_iters` not an int.
        ValueError: If a factor is out of its range or `total_iters` negative.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.LinearLR(start_factor=0.5, total_iters=2)
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.7500, dtype=torch.float64)
    """

    start_factor: float = 1.0 / 3
    end_factor: float = 1.0
    total_iters: int = 5

    def __attrs_post_init__(self) -> None:
        _check_unit("start_factor", self.start_factor, open_low=True)
        _check_unit("end_factor", self.end_factor)
        check_int("total_iters", self.total_iters, minimum=0)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return new_state(base, current * self.start_factor)

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = _next(state)
        span = self.end_factor - self.start_factor
        denominator = self.total_iters * self.start_factor + (epoch - 1) * span
        ramp = current * (1.0 + rdiv(span, nonzero(denominator)))
        lr = torch.where(epoch > self.total_iters, current, ramp)
        return state._replace(last_epoch=epoch, lr=lr)

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        span = self.end_factor - self.start_factor
        factor = self.start_factor + span * min(self.total_iters, 0) / self.total_iters
        lr = state.base_lr * factor
        return state._replace(last_epoch=torch.zeros_like(state.last_epoch), lr=lr)


@attrs.frozen(kw_only=True, eq=False)
class ExponentialLR(LRSchedule):
    """Decay the rate by `gamma` every epoch, the functional `ExponentialLR`.

    Attributes:
        gamma: The multiplicative factor of the decay.

    Raises:
        TypeError: If `gamma` is not a number.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.ExponentialLR(gamma=0.9)
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.9000, dtype=torch.float64)
    """

    gamma: float = attrs.field(validator=number_field)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return new_state(base, current)

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = _next(state)
        return state._replace(last_epoch=epoch, lr=current * self.gamma)

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        lr = state.base_lr * self.gamma**0
        return state._replace(last_epoch=torch.zeros_like(state.last_epoch), lr=lr)


@attrs.frozen(kw_only=True, eq=False)
class PolynomialLR(LRSchedule):
    """Decay the rate polynomially to zero, the functional `PolynomialLR`.

    Attributes:
        total_iters: The number of epochs of the decay (at least 1).
        power: The power of the polynomial.

    Raises:
        TypeError: If `total_iters` is not an int or `power` not a number.
        ValueError: If `total_iters < 1`.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.PolynomialLR(total_iters=2, power=1.0)
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.5000, dtype=torch.float64)
    """

    total_iters: int = 5
    power: float = attrs.field(default=1.0, validator=number_field)

    def __attrs_post_init__(self) -> None:
        check_int("total_iters", self.total_iters, minimum=1)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return new_state(base, current)

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = _next(state)
        total = self.total_iters
        ratio = (1.0 - epoch / total) / nonzero(1.0 - (epoch - 1) / total)
        decayed = current * pow_(ratio, self.power, current)
        lr = torch.where(epoch > total, current, decayed)
        return state._replace(last_epoch=epoch, lr=lr)

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        lr = (
            state.base_lr
            * (1.0 - min(self.total_iters, 0) / self.total_iters) ** self.power
        )
        return state._replace(last_epoch=torch.zeros_like(state.last_epoch), lr=lr)


@attrs.frozen(kw_only=True, eq=False)
class CosineAnnealingLR(LRSchedule):
    """Anneal the rate along a cosine, the functional `CosineAnnealingLR`.

    torch's recursive form: each value from the previous one, so a run matches
    torch bitwise (the closed form differs from it by a few units in the last
    place). Past `T_max` the cosine continues, as in torch.

    Attributes:
        T_max: The half period, in epochs (at least 1).
        eta_min: The smallest rate.

    Raises:
        TypeError: If `T_max` is not an int or `eta_min` not a number.
        ValueError: If `T_max < 1`.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.CosineAnnealingLR(T_max=2)
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.5000, dtype=torch.float64)
    """

    T_max: int
    eta_min: float = attrs.field(default=0.0, validator=number_field)

    def __attrs_post_init__(self) -> None:
        check_int("T_max", self.T_max, minimum=1)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        return new_state(base, current)

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = _next(state)
        t_max, eta_min = self.T_max, self.eta_min
        at_restart = torch.remainder(epoch - 1 - t_max, 2 * t_max) == 0
        restart = (
            current + (state.base_lr - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
        )
        numerator = 1 + cos(math.pi * epoch / t_max)
        denominator = 1 + cos(math.pi * (epoch - 1) / t_max)
        annealed = numerator / nonzero(denominator) * (current - eta_min) + eta_min
        lr = torch.where(at_restart, restart, annealed)
        return state._replace(last_epoch=epoch, lr=lr)

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        eta_min = self.eta_min
        lr = eta_min + (state.base_lr - eta_min) * (1 + math.cos(0.0)) / 2
        return state._replace(last_epoch=torch.zeros_like(state.last_epoch), lr=lr)


@attrs.frozen(kw_only=True, eq=False)
class CosineAnnealingWarmRestarts(LRSchedule):
    """Anneal along a cosine with warm restarts (`CosineAnnealingWarmRestarts`).

    The first period is `T_0`; each restart multiplies it by `T_mult`. The
    counters `T_cur` and `T_i` are `state.counters`.

    Attributes:
        T_0: The first period, in epochs (a positive int).
        T_mult: The factor by which the period grows at each restart (an int >= 1).
        eta_min: The smallest rate.

    Raises:
        ValueError: If `T_0` is not a positive int, `T_mult` not an int >= 1, or
            `eta_min` not a number (torch's kinds of error).

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.CosineAnnealingWarmRestarts(T_0=2)
        >>> state = schedule.step(schedule.init(1.0))
        >>> state.lr, schedule.step(state).lr
        (tensor(0.5000, dtype=torch.float64), tensor(1., dtype=torch.float64))
    """

    _counter_names: ClassVar[tuple[str, ...]] = ("T_cur", "T_i")

    T_0: int
    T_mult: int = 1
    eta_min: float = 0.0

    def __attrs_post_init__(self) -> None:
        t_0, t_mult, eta_min = cast(
            "tuple[object, object, object]", (self.T_0, self.T_mult, self.eta_min)
        )
        if not _is_int(t_0) or t_0 <= 0:
            msg = f"Expected positive integer `T_0`, but got {t_0!r}."
            raise ValueError(msg)
        if not _is_int(t_mult) or t_mult < 1:
            msg = f"Expected integer `T_mult` >= 1, but got {t_mult!r}."
            raise ValueError(msg)
        check_int("T_0", t_0, minimum=1)
        check_int("T_mult", t_mult, minimum=1)
        if isinstance(eta_min, bool) or not isinstance(eta_min, (int, float)):
            msg = f"Expected float or int `eta_min`, but got {eta_min!r}."
            raise ValueError(msg)

    def step(
        self, state: ScheduleState, epoch: float | None = None, /
    ) -> ScheduleState:
        """Return the state after `scheduler.step()`, or `scheduler.step(epoch)`.

        Args:
            state: The state from `init` or from the previous `step`.
            epoch: `None` for the next epoch; else the epoch to go to, an int or
                a float (such as `epoch + i / iters` within an epoch), at least
                0: torch's `step(epoch)`, with its arithmetic. The next plain
                `step` continues from there.

        Returns:
            The new state; `state` is unchanged.

        Raises:
            TypeError: If `epoch` is not a number.
            ValueError: If `epoch` is negative or not finite.

        Example:
            >>> from paramdict import optim
            >>> schedule = optim.CosineAnnealingWarmRestarts(T_0=4)
            >>> state = schedule.step(schedule.init(1.0), 2.0)
            >>> state.lr, state.last_epoch
            (tensor(0.5000, dtype=torch.float64), tensor(2., dtype=torch.float64))
        """
        check_schedule_state(self, state)
        if epoch is None:
            return self._step_once(state)
        given = cast(object, epoch)
        if isinstance(given, bool) or not isinstance(given, (int, float)):
            msg = (
                f"`epoch` must be a number, got {type(given).__name__}. Pass the "
                "epoch as an int or a float."
            )
            raise TypeError(msg)
        if not math.isfinite(epoch) or epoch < 0:
            msg = f"Expected non-negative epoch, but got {epoch!r}."
            raise ValueError(msg)
        t_0, t_mult = self.T_0, self.T_mult
        t_cur_old, t_i_old = state.counters
        t_i: float | Tensor = t_i_old
        if epoch >= t_0:
            if t_mult == 1:
                t_cur: float = epoch % t_0
            else:
                n = int(math.log((epoch / t_0 * (t_mult - 1) + 1), t_mult))
                t_cur = epoch - t_0 * (t_mult**n - 1) / (t_mult - 1)
                t_i = float(t_0 * t_mult**n)
        else:
            t_i, t_cur = float(t_0), epoch
        like = t_cur_old
        t_cur_t = like.new_full((), float(t_cur))
        t_i_t = t_i if isinstance(t_i, Tensor) else like.new_full((), t_i)
        lr = self._value(state.base_lr, t_cur_t, t_i_t)
        last = like.new_full((), float(math.floor(epoch)))
        return state._replace(last_epoch=last, lr=lr, counters=(t_cur_t, t_i_t))

    def _value(self, base: Tensor, t_cur: Tensor, t_i: Tensor) -> Tensor:
        eta_min = self.eta_min
        return eta_min + (base - eta_min) * (1 + cos(math.pi * t_cur / t_i)) / 2

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        t_cur = torch.zeros_like(base)
        t_i = torch.full_like(base, float(self.T_0))
        return new_state(base, self._value(base, t_cur, t_i), counters=(t_cur, t_i))

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = _next(state)
        t_cur, t_i = state.counters
        t_cur = t_cur + 1
        wrap = t_cur >= t_i
        t_cur = torch.where(wrap, torch.remainder(t_cur, t_i), t_cur)
        t_i = torch.where(wrap, t_i * self.T_mult, t_i)
        lr = self._value(state.base_lr, t_cur, t_i)
        return state._replace(last_epoch=epoch, lr=lr, counters=(t_cur, t_i))

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        t_cur, t_i = state.counters
        lr = self._value(state.base_lr, t_cur, t_i)
        return state._replace(last_epoch=torch.zeros_like(state.last_epoch), lr=lr)
