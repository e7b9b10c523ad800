"""`ReduceLROnPlateau`: lower the rate when a metric stops improving."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal, cast

import attrs
import torch
from torch import Tensor

from .base import BaseSchedule, check_schedule_state
from .numbers import base_of, check_base_lr, check_int, number_field, scalar
from .states import PlateauState

__all__ = ["PlateauState", "ReduceLROnPlateau"]


def _metric(metrics: object) -> float:
    """Return `metrics` read as torch's `float(metrics)` does (numpy scalars too)."""
    if isinstance(metrics, (int, float)) and not isinstance(metrics, bool):
        # First: compiled, a float metric is a symbolic float, which `hasattr`
        # below would break the graph on.
        return float(metrics)
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


@attrs.frozen(kw_only=True, eq=False)
class ReduceLROnPlateau(BaseSchedule[PlateauState]):
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
    factor: float = attrs.field(default=0.1, validator=number_field)
    patience: int = 10
    threshold: float = attrs.field(default=1e-4, validator=number_field)
    threshold_mode: Literal["rel", "abs"] = "rel"
    cooldown: int = 0
    min_lr: float = attrs.field(default=0.0, validator=number_field)
    eps: float = attrs.field(default=1e-8, validator=number_field)
    base_lr: float | Tensor | None = attrs.field(default=None, validator=check_base_lr)

    takes_base: ClassVar[bool] = True
    _state_type = PlateauState

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

    @property
    def takes_metric(self) -> bool:
        """True: the rate moves only with a metric (`step(state, metrics)`)."""
        return True

    def _step_once(self, state: PlateauState, /) -> PlateauState:
        """Return `state` unchanged: an update without a metric does not move it."""
        return state

    def _step_metric(
        self, state: PlateauState, metrics: float | Tensor, /
    ) -> PlateauState:
        return self.step(state, metrics)

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
            TypeError: If `metrics` is not a number or a real tensor.
            ValueError: If `metrics` has more than one element, or is on the
                meta device (it holds no value).

        Example:
            >>> from paramdict import optim
            >>> schedule = optim.ReduceLROnPlateau(mode="max", patience=0)
            >>> state = schedule.step(schedule.init(1.0), 0.5)
            >>> state.best
            tensor(0.5000, dtype=torch.float64)
        """
        check_schedule_state(self, state)
        if isinstance(metrics, Tensor):
            if metrics.numel() != 1:
                msg = (
                    "`metrics` must be one number, got a tensor of shape "
                    f"{tuple(metrics.shape)}."
                )
                raise ValueError(msg)
            if metrics.is_meta or metrics.is_complex():
                what = "on the meta device" if metrics.is_meta else "complex"
                msg = (
                    f"`metrics` must be a real number with a value, got a tensor "
                    f"{what}. Pass the metric as a float or a real one-element "
                    "tensor."
                )
                raise (ValueError if metrics.is_meta else TypeError)(msg)
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
