"""Learning-rate schedules: the functional `torch.optim.lr_scheduler`.

Each class has torch's name and arguments, less the optimizer (the base rate is
the argument of `init`) and `last_epoch` (resume from a saved `ScheduleState`
instead). The machinery is in the `_schedules` package.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch
from torch import Tensor

from ._schedules.base import LRSchedule, ScheduleState, new_state
from ._schedules.cosine import CosineAnnealingLR, CosineAnnealingWarmRestarts
from ._schedules.numbers import (
    check_float,
    check_int,
    is_int,
    nonzero,
    number_field,
    pow_,
    rdiv,
    where,
)

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


def _check_gamma(instance: object, attribute: Any, value: Any) -> None:
    """Raise unless a decay factor is a finite number at least 0 (torch takes any)."""
    number_field(instance, attribute, value)
    if not (math.isfinite(value) and value >= 0):
        msg = (
            f"`{attribute.name}` must be a finite number at least 0, got {value!r}: "
            "a negative factor makes every other rate negative (a step uphill), "
            "a non-finite one makes them infinite or NaN. Give a decay factor "
            "such as 0.1."
        )
        raise ValueError(msg)


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
        epoch = state.last_epoch + 1
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

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = state.last_epoch + 1
        lr = torch.as_tensor(current * self.lr_lambda(epoch), dtype=torch.float64)
        return state._replace(last_epoch=epoch, lr=lr)


@attrs.frozen(kw_only=True, eq=False)
class StepLR(LRSchedule):
    """Decay the rate by `gamma` every `step_size` epochs, the functional `StepLR`.

    Attributes:
        step_size: The period of the decay, in epochs (at least 1).
        gamma: The multiplicative factor of the decay, finite and at least 0.

    Raises:
        TypeError: If `step_size` is not an int or `gamma` not a number.
        ValueError: If `step_size < 1`, or `gamma` is negative or not finite.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.StepLR(step_size=1, gamma=0.1)
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.1000, dtype=torch.float64)
    """

    step_size: int
    gamma: float = attrs.field(default=0.1, validator=_check_gamma)

    def __attrs_post_init__(self) -> None:
        check_int("step_size", self.step_size, minimum=1)

    def _advance(self, state: Any, current: Any) -> Any:
        epoch = state.last_epoch + 1
        lr = where(epoch % self.step_size != 0, current, current * self.gamma)
        return state._replace(last_epoch=epoch, lr=lr)

    _advance_on_host = _advance

    def _restart_lr(self, base: Any) -> Any:
        return base * self.gamma**0


def _check_milestones(instance: object, attribute: Any, value: Any) -> None:
    if not all(is_int(m) for m in value):
        msg = f"`{attribute.name}` must be a sequence of ints, got {value!r}."
        raise TypeError(msg)
    for i, m in enumerate(value):
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
        gamma: The multiplicative factor of the decay, finite and at least 0.

    Raises:
        TypeError: If `milestones` is not a sequence of ints or `gamma` not a
            number.
        ValueError: If `gamma` is negative or not finite.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.MultiStepLR(milestones=[1], gamma=0.5)
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.5000, dtype=torch.float64)
    """

    milestones: tuple[int, ...] = attrs.field(
        converter=_to_int_tuple, validator=_check_milestones
    )
    gamma: float = attrs.field(default=0.1, validator=_check_gamma)

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = state.last_epoch + 1
        lr = current
        for milestone, count in Counter(self.milestones).items():
            lr = torch.where(epoch == milestone, current * self.gamma**count, lr)
        return state._replace(last_epoch=epoch, lr=lr)

    def _advance_on_host(self, state: Any, current: float, /) -> Any:
        epoch = state.last_epoch + 1
        lr = current
        for milestone, count in Counter(self.milestones).items():
            if epoch == milestone:
                lr = current * self.gamma**count
        return state._replace(last_epoch=epoch, lr=lr)

    def _restart_lr(self, base: Any) -> Any:
        passed = sum(1 for m in self.milestones if m <= 0)
        return base * self.gamma**passed


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

    def _advance(self, state: Any, current: Any) -> Any:
        epoch = state.last_epoch + 1
        undo = math.inf if self.factor == 0 else 1.0 / self.factor
        lr = where(epoch != self.total_iters, current, current * undo)
        return state._replace(last_epoch=epoch, lr=lr)

    _advance_on_host = _advance

    def _restart_lr(self, base: Any) -> Any:
        return base * (self.factor + (self.total_iters <= 0) * (1 - self.factor))


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
        epoch = state.last_epoch + 1
        span = self.end_factor - self.start_factor
        denominator = self.total_iters * self.start_factor + (epoch - 1) * span
        ramp = current * (1.0 + rdiv(span, nonzero(denominator)))
        lr = torch.where(epoch > self.total_iters, current, ramp)
        return state._replace(last_epoch=epoch, lr=lr)

    def _advance_on_host(self, state: Any, current: float, /) -> Any:
        epoch = state.last_epoch + 1
        if epoch > self.total_iters:
            return state._replace(last_epoch=epoch, lr=current)
        span = self.end_factor - self.start_factor
        denominator = self.total_iters * self.start_factor + (epoch - 1) * span
        lr = current * (1.0 + span / denominator)
        return state._replace(last_epoch=epoch, lr=lr)

    def _restart_lr(self, base: Any) -> Any:
        span = self.end_factor - self.start_factor
        factor = self.start_factor + span * min(self.total_iters, 0) / self.total_iters
        return base * factor


@attrs.frozen(kw_only=True, eq=False)
class ExponentialLR(LRSchedule):
    """Decay the rate by `gamma` every epoch, the functional `ExponentialLR`.

    Attributes:
        gamma: The multiplicative factor of the decay, finite and at least 0.

    Raises:
        TypeError: If `gamma` is not a number.
        ValueError: If `gamma` is negative or not finite.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.ExponentialLR(gamma=0.9)
        >>> schedule.step(schedule.init(1.0)).lr
        tensor(0.9000, dtype=torch.float64)
    """

    gamma: float = attrs.field(validator=_check_gamma)

    def _advance(self, state: Any, current: Any) -> Any:
        return state._replace(last_epoch=state.last_epoch + 1, lr=current * self.gamma)

    _advance_on_host = _advance

    def _restart_lr(self, base: Any) -> Any:
        return base * self.gamma**0


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

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = state.last_epoch + 1
        total = self.total_iters
        ratio = (1.0 - epoch / total) / nonzero(1.0 - (epoch - 1) / total)
        decayed = current * pow_(ratio, self.power, current)
        lr = torch.where(epoch > total, current, decayed)
        return state._replace(last_epoch=epoch, lr=lr)

    def _advance_on_host(self, state: Any, current: float, /) -> Any:
        epoch = state.last_epoch + 1
        total = self.total_iters
        if epoch > total:
            return state._replace(last_epoch=epoch, lr=current)
        ratio = (1.0 - epoch / total) / (1.0 - (epoch - 1) / total)
        return state._replace(last_epoch=epoch, lr=current * ratio**self.power)

    def _restart_lr(self, base: Any) -> Any:
        total = self.total_iters
        return base * (1.0 - min(total, 0) / total) ** self.power
