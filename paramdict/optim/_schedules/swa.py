"""`SWALR`: anneal the rate to a constant for stochastic weight averaging.

The functional `torch.optim.swa_utils.SWALR`, a schedule like the others: the
`lr` of any `TorchOptimizer`, or stepped on its own with `init` and `step`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import attrs
import torch
from torch import Tensor

from .base import LRSchedule, ScheduleState, new_state
from .cyclic import _rate, _read
from .numbers import check_int, cos, nonzero

__all__ = ["SWALR"]


def _check_anneal_epochs(instance: object, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = (
            f"anneal_epochs must be equal or greater than 0, got {value!r}. Give "
            "an int (0 switches to `swa_lr` at once)."
        )
        raise ValueError(msg)
    check_int("anneal_epochs", value, minimum=0)


@attrs.frozen(kw_only=True, eq=False)
class SWALR(LRSchedule):
    """Anneal the rate from the optimizer's to `swa_lr`, then hold it (`SWALR`).

    Over `anneal_epochs` steps the rate moves from the optimizer's to `swa_lr`
    along a half cosine (or a line), then stays there: the schedule of the
    averaging phase of `WeightAverage.swa`. Bitwise equal to torch's on the CPU.

    Attributes:
        swa_lr: The rate annealed to, a number (finite, at least 0) or a
            one-element tensor, read as a number when built (as torch reads it).
        anneal_epochs: The number of steps of the annealing, an int >= 0.
        anneal_strategy: `"cos"` or `"linear"`.

    Raises:
        ValueError: If `swa_lr` is negative or not finite, `anneal_epochs` is
            not an int >= 0 or `anneal_strategy` is unknown.
        TypeError: If `swa_lr` is not a number.

    Example:
        >>> from paramdict import optim
        >>> schedule = optim.SWALR(swa_lr=0.05, anneal_epochs=2,
        ...                        anneal_strategy="linear")
        >>> state, rates = schedule.init(1.0), []
        >>> for _ in range(4):
        ...     rates.append(round(float(state.lr), 6))
        ...     state = schedule.step(state)
        >>> rates
        [1.0, 0.525, 0.05, 0.05]
    """

    swa_lr: float = attrs.field(converter=_read, validator=_rate)
    anneal_epochs: int = attrs.field(default=10, validator=_check_anneal_epochs)
    anneal_strategy: Literal["cos", "linear"] = "cos"

    def __attrs_post_init__(self) -> None:
        if self.anneal_strategy not in ("cos", "linear"):
            msg = (
                "anneal_strategy must be one of 'cos' or 'linear', instead got "
                f"{self.anneal_strategy!r}."
            )
            raise ValueError(msg)

    def _anneal(self, t: Tensor) -> Tensor:
        if self.anneal_strategy == "cos":
            return (1 - cos(math.pi * t)) / 2
        return t

    def _value(self, epoch: Tensor, current: Tensor) -> Tensor:
        # torch's `get_lr` at `step = _step_count - 1`, our `last_epoch`.
        step = epoch.clamp_min(1) if self.anneal_epochs == 0 else epoch
        span = float(max(1, self.anneal_epochs))
        prev_alpha = self._anneal(((step - 1) / span).clamp(0, 1))
        swa_lr = self.swa_lr
        done = prev_alpha == 1
        prev_lr = torch.where(
            done,
            current.new_full((), swa_lr),
            (current - prev_alpha * swa_lr) / nonzero(1 - prev_alpha),
        )
        alpha = self._anneal((step / span).clamp(0, 1))
        return swa_lr * alpha + prev_lr * (1 - alpha)

    def _initial(self, base: Tensor, current: Tensor) -> ScheduleState:
        epoch = torch.zeros_like(base)
        return new_state(base, self._value(epoch, current))

    def _advance(self, state: ScheduleState, current: Tensor) -> ScheduleState:
        epoch = state.last_epoch + 1
        return state._replace(last_epoch=epoch, lr=self._value(epoch, current))
