"""How an optimizer in the style of `torch.optim` reads its learning rate.

The rate of a step (a number, a 0-dim tensor, a per-key ParamDict, or a
schedule's current value kept in the state's `schedule` field), the momentum a
schedule cycles, the schedule's next state, the schedule-facing hooks
(`step_schedule`, `last_lr`, `step_count`), and the step's numbers read on the
host where that is free (`host_numbers`): the part of `TorchOptimizer` that asks
`_schedules/slot.py`, kept apart from the step's driver.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._hooks import OptionalHooks
from ._hyper import Rate, host_numbers
from ._schedules.slot import (
    LearningRate,
    Schedule,
    SlotState,
    advanced,
    advanced_on_host,
    check_slot,
    cycled_momentum,
    is_schedule,
    stepped_with_metric,
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

        Every rule reads its rates through this method: the one place where a
        rate that depends on the step (a schedule) is looked up. A rule passes
        the state it was given, from which a scheduled `lr` is read: the value
        torch's scheduler set (`get_last_lr()[0]`), a 0-dim float64 tensor used
        as torch uses the float its scheduler writes.

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

    def host_numbers(self, *values: Rate) -> tuple[float, ...] | None:
        """Return `values` (the step, a rate) as Python floats where reading is free.

        What torch.optim's foreach steps do with their step counts and tensor
        rates: read them on the host and compute the step sizes with Python
        floats, which the foreach kernels take as scalars on their fast path (a
        0-dim tensor of another dtype than the entries costs a conversion and
        a kernel per entry on the CPU). A rule computes its step-dependent
        numbers from these where it gets them, and from the tensors otherwise:
        None when a read is not free or not allowed (compiled, under a
        `torch.func` transform, a value on an accelerator or per key, or, with
        `differentiable=True`, a value that requires grad, which stays a
        tensor for autograd).

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

        The field itself, unless the `lr` schedule cycles the momentum
        (`CyclicLR`, `OneCycleLR` with `cycle_momentum=True`): then its current
        momentum (a 0-dim float64 tensor) replaces `momentum`, or the first of
        `betas`, as torch's scheduler writes it into the optimizer.

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

        The schedule advances once per update, after the update used the
        current rate (torch's `optimizer.step(); scheduler.step()`). `()`
        without a schedule; `ReduceLROnPlateau`'s moves only with
        `step_schedule`.

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
        """The schedule's state after this step, and whether it holds floats.

        Floats where the eager step reads the state for free (`advanced_on_host`),
        else new tensors (`next_schedule`); written by `write_slot`.
        """
        slot: SlotState = getattr(state, "schedule", ())
        if not is_schedule(self.lr) or slot == ():
            return slot, False
        host = advanced_on_host(self.lr, slot)
        if host is not None:
            return host, True
        return advanced(self.lr, slot), False

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
        counter: Tensor = cast(Any, state).step
        return int(counter)

    def step_schedule(self, state: S, metrics: float | Tensor, /) -> S:
        """Return `state` after `ReduceLROnPlateau` saw `metrics`; `state` is unchanged.

        The explicit call for a schedule that reacts to a metric (torch's
        `scheduler.step(metrics)`), once per evaluation; the other schedules
        advance with every `step` and take no metric.

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
        check_slot(self, self.lr, slot)
        new_slot = stepped_with_metric(cast("Schedule", self.lr), slot, metrics)
        result: S = given._replace(schedule=new_slot)
        return result
