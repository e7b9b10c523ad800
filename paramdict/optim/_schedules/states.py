"""The states of the schedules, and `SlotState`, the `schedule` field of a state.

Light (no attrs), so that `import paramdict.optim` registers them with
`torch.load` and pytrees without building the schedules; each keeps the module
name its pickles have always carried (see `register_state_as`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, TypeAlias

from .._registry import register_state_as

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["PlateauState", "ScheduleState", "SlotState"]


@register_state_as("paramdict.optim._schedules.base")
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


@register_state_as("paramdict.optim._schedules.plateau")
class PlateauState(NamedTuple):
    """The state of `ReduceLROnPlateau`.

    Attributes:
        last_epoch: The number of `step` calls, a 0-dim float64 tensor.
        lr: The current learning rate.
        best: The best metric so far (`inf` or `-inf` before the first).
        num_bad_epochs: Epochs since the last improvement.
        cooldown_counter: Epochs of cooldown left.

    Example:
        >>> from paramdict import optim
        >>> state = optim.ReduceLROnPlateau().init(0.1)
        >>> state.best
        tensor(inf, dtype=torch.float64)
    """

    last_epoch: Tensor
    lr: Tensor
    best: Tensor
    num_bad_epochs: Tensor
    cooldown_counter: Tensor


SlotState: TypeAlias = ScheduleState | PlateauState | tuple[()]
"""The `schedule` field of an optimizer's state: `()` (no leaves) for a plain rate."""
