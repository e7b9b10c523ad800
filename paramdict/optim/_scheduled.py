"""How an optimizer in the style of `torch.optim` reads its learning rate.

The part of `TorchOptimizer` that asks `_schedules/slot.py` (the rate, the cycled
momentum, the schedule's next state and hooks), kept apart from the step's driver.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._hooks import OptionalHooks
from ._hyper import Rate, host_numbers
from ._schedules.base import BaseSchedule
from ._schedules.slot import (
    LearningRate,
    SlotState,
    advanced,
    advanced_on_host,
    check_slot,
    cycled_momentum,
    first_state,
    is_schedule,
    takes_metric,
)

__all__ = ["ScheduledRate"]

S = TypeVar("S")


class ScheduledRate(OptionalHooks[S], Generic[S]):
    """The learning-rate reads of `TorchOptimizer` (see the module)."""

    __slots__ = ()

    lr: LearningRate

    def rate(self, name: str, step: Tensor, state: object = None, /) -> Rate:
        """Return the rate `name` (`"lr"`, `"weight_decay"`) for step `step`.

        Every rule reads its rates here. A scheduled `lr` is read from `state`:
        torch's `get_last_lr()[0]`, a 0-dim float64 tensor.

        Args:
            name: The field's name.
            step: The number of the step being taken (1 for the first).
            state: The state before the step (needed for a scheduled `lr`).

        Returns:
            The rate: a number, a 0-dim tensor or a per-key ParamDict.

        Raises:
            TypeError: If `name` holds a schedule and `state` is not given.

        Example:
            >>> from paramdict import optim
            >>> optim.AdamW().rate("weight_decay", torch.tensor(1.0))
            0.01
            >>> opt = optim.SGD(lr=optim.StepLR(base_lr=0.5, step_size=2))
            >>> state = opt.init(ParamDict(w=torch.ones(1)))
            >>> opt.rate("lr", opt.next_step(state), state)
            tensor(0.5000, dtype=torch.float64)
        """
        del step
        value: Rate | object = getattr(self, name)
        if is_schedule(value):
            slot: Any = getattr(state, "schedule", None)
            if slot is None or slot == ():
                msg = (
                    f"`{type(self).__name__}`'s `{name}` is a schedule, whose value "
                    "is in the state: the rule must call "
                    f"`self.rate({name!r}, step, state)`."
                )
                raise TypeError(msg)
            current: Tensor = slot.lr
            return current
        return cast(Rate, value)

    def _first_rate(self, counter: Tensor, /) -> Rate:
        """The rate of the first step: a schedule's first value, else `rate("lr")`."""
        if is_schedule(self.lr):
            return first_state(self.lr).lr
        return self.rate("lr", counter + 1)

    def host_numbers(self, *values: Rate) -> tuple[float, ...] | None:
        """Return `values` (the step, a rate) as Python floats where reading is free.

        As torch.optim's foreach steps read their step counts and tensor rates,
        so that the kernels take Python scalars on their fast path. None when a
        read is not free or not allowed (compiled, under `torch.func`, on an
        accelerator, per key, or a value requiring grad with `differentiable=True`).

        Args:
            values: Numbers, 0-dim tensors or per-key ParamDicts.

        Returns:
            The values as floats, or None.

        Example:
            >>> from paramdict import optim
            >>> step = torch.tensor(3.0, dtype=torch.float64)
            >>> optim.Adan().host_numbers(step, 0.1)
            (3.0, 0.1)
            >>> rate = torch.tensor(0.1, requires_grad=True)
            >>> optim.Adan(differentiable=True).host_numbers(step, rate) is None
            True
        """
        return host_numbers(bool(getattr(self, "differentiable", False)), *values)

    def cycled(self, name: str, state: object, /) -> Any:
        """Return the field `name` (`"momentum"`, `"betas"`) for this step.

        Where the `lr` schedule cycles the momentum (`CyclicLR`, `OneCycleLR`),
        its current value replaces `momentum`, or the first of `betas`, as torch's
        scheduler writes it into the optimizer.

        Args:
            name: `"momentum"` or `"betas"`.
            state: The state before the step.

        Returns:
            The momentum, or the pair of betas.

        Example:
            >>> from paramdict import optim
            >>> schedule = optim.OneCycleLR(max_lr=0.1, total_steps=10)
            >>> opt = optim.Adam(lr=schedule)
            >>> beta1, beta2 = opt.cycled("betas", opt.init(ParamDict(w=torch.ones(1))))
            >>> float(beta1), beta2
            (0.95, 0.999)
        """
        value: Any = getattr(self, name)
        momentum = cycled_momentum(self.lr, getattr(state, "schedule", None))
        if momentum is None:
            return value
        return (momentum, value[1]) if name == "betas" else momentum

    def next_schedule(self, state: object, /) -> SlotState:
        """Return the state's `schedule` field after this step.

        torch's `optimizer.step(); scheduler.step()`; `()` without a schedule.
        `ReduceLROnPlateau`'s moves only with `step_schedule`.

        Args:
            state: The state before the step.

        Returns:
            The new `schedule` field (new tensors; `state` is unchanged).

        Example:
            >>> from paramdict import optim
            >>> opt = optim.SGD(lr=optim.ExponentialLR(base_lr=1.0, gamma=0.5))
            >>> opt.next_schedule(opt.init(ParamDict(w=torch.ones(1)))).lr
            tensor(0.5000, dtype=torch.float64)
        """
        slot: SlotState = getattr(state, "schedule", ())
        if not is_schedule(self.lr):
            return slot
        return advanced(self.lr, slot)

    def _next_slot(self, state: object) -> tuple[Any, bool]:
        """The schedule's state after this step, and whether it holds floats."""
        slot: SlotState = getattr(state, "schedule", ())
        host = advanced_on_host(self.lr, slot) if is_schedule(self.lr) else None
        if host is not None:
            return host, True
        return self.next_schedule(state), False

    @property
    def takes_metric(self) -> bool:
        """Whether the `lr` moves with a metric: a plateau, or a chain holding one."""
        return takes_metric(self.lr)

    @override
    def last_lr(self, state: S, /) -> list[float]:
        step: Tensor = cast(Any, state).step + 1
        lr = self.rate("lr", step, state)
        if isinstance(lr, ParamDict):
            return [float(v) for v in lr.values()]
        return [float(lr)]

    @override
    def step_count(self, state: S, /) -> int:
        return int(cast(Any, state).step)

    def step_schedule(self, state: S, metrics: float | Tensor, /) -> S:
        """Return `state` after `ReduceLROnPlateau` saw `metrics`; `state` is unchanged.

        torch's `scheduler.step(metrics)`, once per evaluation.

        Args:
            state: The optimizer's state.
            metrics: The metric: a number or a one-element tensor.

        Returns:
            The state with the schedule's new rate and counters.

        Raises:
            ValueError: If the `lr` takes no metric (no `ReduceLROnPlateau`).

        Example:
            >>> from paramdict import optim
            >>> plateau = optim.ReduceLROnPlateau(base_lr=1.0, patience=0)
            >>> opt = optim.SGD(lr=plateau)
            >>> state = opt.init(ParamDict(w=torch.ones(1)))
            >>> for loss in (2.0, 2.0):
            ...     state = opt.step_schedule(state, loss)
            >>> state.schedule.lr
            tensor(0.1000, dtype=torch.float64)
        """
        if not takes_metric(self.lr):
            kind = type(self.lr).__name__
            msg = (
                f"`step_schedule` takes a metric for a `ReduceLROnPlateau` `lr` (or a "
                f"chain holding one); `{type(self).__name__}`'s `lr` is a {kind}, "
                "which takes no metric (a schedule advances with every `step`)."
            )
            raise ValueError(msg)
        given: Any = state
        slot: SlotState = getattr(given, "schedule", ())
        check_slot(self, self.lr, slot)  # so the slot is the state it takes
        schedule = cast("BaseSchedule[Any]", self.lr)
        result: S = given._replace(schedule=schedule._step_metric(slot, metrics))
        return result
