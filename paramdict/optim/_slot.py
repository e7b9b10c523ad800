"""What `TorchOptimizer` needs of a schedule given as its `lr`: a small protocol.

The optimizer base never names a schedule class (its annotations name the
schedule types for the type checkers only). It asks `slot_rules()`, an
object with the few operations below, which the schedules' side
(`_schedules/slot.py`) implements and installs when `paramdict.optim` is
imported. So the import graph runs from the schedules to the base, never back.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor

from .._paramdict import ParamDict

__all__ = [
    "SlotRules",
    "install_slot_rules",
    "slot_rules",
]


class SlotRules(Protocol):
    """The operations on a schedule and its state slot that the optimizer uses."""

    def is_schedule(self, value: object, /) -> bool:
        """Return whether `value` is a schedule (not a plain rate)."""
        ...

    def is_slot(self, value: object, /) -> bool:
        """Return whether `value` is a schedule's state (not `()`)."""
        ...

    def check_fits(self, owner: Any, schedule: Any, /) -> None:
        """Raise unless `owner` can run with `schedule` as its `lr`."""
        ...

    def check_slot(self, owner: Any, lr: Any, slot: object, /) -> None:
        """Raise unless `slot` (a state's `schedule` field) belongs to `lr`."""
        ...

    def first_state(self, schedule: Any, params: ParamDict, /) -> Any:
        """Return the schedule's first state, on the device of `params`."""
        ...

    def advanced(self, schedule: Any, slot: Any, /) -> Any:
        """Return the slot after one optimizer step: one `scheduler.step()`."""
        ...

    def momentum(self, schedule: Any, slot: object, /) -> Tensor | None:
        """Return the cycled momentum of this step, or `None` if none cycles."""
        ...

    def takes_metric(self, schedule: object, /) -> bool:
        """Return whether `schedule` moves only with a metric (`step_schedule`)."""
        ...

    def step_metric(self, schedule: Any, slot: Any, metrics: float | Tensor, /) -> Any:
        """Return the slot after the metric schedule saw `metrics`."""
        ...


_INSTALLED: list[SlotRules] = []


def install_slot_rules(rules: SlotRules) -> None:
    """Make `rules` the ones `slot_rules` returns (once, by `_schedules/slot.py`)."""
    _INSTALLED[:] = [rules]


def slot_rules() -> SlotRules:
    """Return the installed slot rules.

    Raises:
        RuntimeError: If none are installed: import `paramdict.optim`, which
            installs them.
    """
    if not _INSTALLED:
        msg = (
            "No schedule rules are installed: import `paramdict.optim` (its "
            "`_schedules.slot` module installs them) before stepping an optimizer."
        )
        raise RuntimeError(msg)
    return _INSTALLED[0]
