"""Cosine schedules: `CosineAnnealingLR` and `CosineAnnealingWarmRestarts`.

Re-exported from `paramdict.optim.lr_scheduler`, where users find them.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

import attrs
import torch
from torch import Tensor

from .base import LRSchedule, ScheduleState, check_schedule_state, new_state
from .numbers import check_float, check_int, cos, is_int, nonzero, number_field, where

__all__ = ["CosineAnnealingLR", "CosineAnnealingWarmRestarts"]


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

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = state.last_epoch + 1
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

    def _advance_on_host(self, state: Any, current: float, /) -> Any:
        epoch = state.last_epoch + 1
        t_max, eta_min = self.T_max, self.eta_min
        if (epoch - 1 - t_max) % (2 * t_max) == 0:
            lr = (
                current
                + (state.base_lr - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
            )
        else:
            numerator = 1 + math.cos(math.pi * epoch / t_max)
            denominator = 1 + math.cos(math.pi * (epoch - 1) / t_max)
            lr = numerator / denominator * (current - eta_min) + eta_min
        return state._replace(last_epoch=epoch, lr=lr)

    def _restart_lr(self, base: Any) -> Any:
        return self.eta_min + (base - self.eta_min) * (1 + math.cos(0.0)) / 2


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
            `eta_min` not a number (torch's kinds of error) or too large for a
            float (torch's first step overflows).

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
        if not is_int(t_0) or t_0 <= 0:
            msg = f"Expected positive integer `T_0`, but got {t_0!r}."
            raise ValueError(msg)
        if not is_int(t_mult) or t_mult < 1:
            msg = f"Expected integer `T_mult` >= 1, but got {t_mult!r}."
            raise ValueError(msg)
        check_int("T_0", t_0, minimum=1)
        check_int("T_mult", t_mult, minimum=1)
        if isinstance(eta_min, bool) or not isinstance(eta_min, (int, float)):
            msg = f"Expected float or int `eta_min`, but got {eta_min!r}."
            raise ValueError(msg)
        check_float("eta_min", eta_min)  # torch's first step overflows on 10**400

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
        t_cur_t = t_cur_old.new_full((), float(t_cur))
        t_i_t = t_i if isinstance(t_i, Tensor) else t_cur_old.new_full((), t_i)
        lr = self._value(state.base_lr, t_cur_t, t_i_t)
        last = t_cur_old.new_full((), float(math.floor(epoch)))
        return state._replace(last_epoch=last, lr=lr, counters=(t_cur_t, t_i_t))

    def _value(self, base: Any, t_cur: Any, t_i: Any) -> Any:
        """The rate at `t_cur` of `t_i`, with tensors or (as torch) Python floats."""
        turn = math.pi * t_cur / t_i
        wave = cos(turn) if isinstance(turn, Tensor) else math.cos(turn)
        eta_min = self.eta_min
        return eta_min + (base - eta_min) * (1 + wave) / 2

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        t_cur = torch.zeros_like(base)
        t_i = torch.full_like(base, float(self.T_0))
        return new_state(base, self._value(base, t_cur, t_i), counters=(t_cur, t_i))

    def _advance(self, state: Any, current: Any) -> Any:
        epoch = state.last_epoch + 1
        t_cur, t_i = state.counters
        t_cur = t_cur + 1
        wrap = t_cur >= t_i
        t_cur = where(wrap, t_cur % t_i, t_cur)  # a tensor's `%` is `torch.remainder`
        t_i = where(wrap, t_i * self.T_mult, t_i)
        lr = self._value(state.base_lr, t_cur, t_i)
        return state._replace(last_epoch=epoch, lr=lr, counters=(t_cur, t_i))

    _advance_on_host = _advance

    def _restart_on_host(self, state: Any, current: float, /) -> Any:
        return state._replace(
            last_epoch=0.0, lr=self._value(state.base_lr, *state.counters)
        )

    def _restart(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        lr = self._value(state.base_lr, *state.counters)
        return state._replace(last_epoch=torch.zeros_like(state.last_epoch), lr=lr)
