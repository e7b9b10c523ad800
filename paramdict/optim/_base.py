"""`TorchOptimizer`: what every optimizer in the style of `torch.optim` shares.

The learning rate, weight decay, `maximize` and `differentiable` options and their
validation; the checks of parameters, hyperparameters and state; the step counter;
the maximize/weight-decay prologue; and `rate`, the one method through which the
rules read their rates (the place learning-rate schedules plug in, through the
protocol of `_slot.py`; `cycled` and `next_schedule` are its other two ends).
A concrete optimizer adds its own fields (with torch.optim's names, order and
defaults), its first state (`init_state`) and its rule (`update`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, TypeVar, cast
from weakref import ref

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._hyper import (
    Rate,
    check_counter,
    check_flag,
    check_rate,
    check_rate_keys,
    check_rate_shapes,
    is_zero,
    new_counter,
)
from ._keyed import check_real
from ._protocol import Optimizer, recall, remember
from ._repeat import kept
from ._slot import slot_rules
from ._state_check import check_buffers
from ._vocabulary import Kernels

if TYPE_CHECKING:  # types only: at run time the schedules are reached via `_slot`
    from ._schedules.slot import LearningRate, SlotState

__all__ = ["HasStep", "TorchOptimizer"]


class HasStep(Protocol):
    """A state whose first field is the step counter, a 0-dim tensor."""

    @property
    def step(self) -> Tensor:
        """The number of steps taken."""
        ...


S = TypeVar("S", bound=HasStep)


class _Field(NamedTuple):
    name: str


@attrs.frozen(kw_only=True, eq=False, auto_attribs=False)
class TorchOptimizer(Optimizer[S]):
    """The base of the optimizers in the style of `torch.optim`.

    A subclass is an `attrs.frozen(kw_only=True, eq=False,
    field_transformer=shared_last)` class that declares `lr` and `weight_decay`
    among its own fields (in its torch.optim order, with its defaults), a
    `state_type`, and defines `init_state` and `math` (or `update`). `maximize`
    and `differentiable` are declared once, here. This base validates the
    shared fields, checks
    parameters, per-key rates, gradients and states, and gives the rule its
    pieces: `rate`, `next_step` and `prologue`.

    `Adam`, `AdamW`, `SGD` and `Adagrad` have torch's fused kernels and a `fused`
    option for them. `None` (the default): the fused kernel wherever the step
    allows it (every entry float32 or float64 on one device that has the kernel,
    a number `weight_decay`, an `lr` that is a number, a 0-dim tensor or a
    schedule on the CPU), bitwise `torch.optim` with `fused=True`, and
    the foreach rule otherwise. `False`: always the foreach rule, bitwise
    `torch.optim` with `foreach=True`. `True`: the fused kernel, and a step it
    cannot take is refused (not with `differentiable=True`).

    Attributes:
        lr: The learning rate: a number, a 0-dim tensor, a per-key ParamDict,
            or a schedule (`optim.CosineAnnealingLR(base_lr=0.1, T_max=100)`),
            whose state is the last field of the optimizer's, `schedule`.
        weight_decay: The weight decay, in any of the same forms.
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step`.
        state_type: The state class (a NamedTuple whose first field is `step`).

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Adam(lr=0.1)
        >>> isinstance(opt, optim.TorchOptimizer), opt.rate("lr", torch.tensor(1.0))
        (True, 0.1)
    """

    lr: LearningRate
    weight_decay: Rate
    # `attrs.field` itself, not `flag()`: the type checkers' attrs support reads
    # the fields of a class without `auto_attribs` from these calls only.
    maximize: bool = attrs.field(default=False, validator=check_flag, kw_only=True)
    differentiable: bool = attrs.field(
        default=False, validator=check_flag, kw_only=True
    )
    state_type: ClassVar[type[Any]]
    # The option that makes `init_state` fill each buffer it may leave empty,
    # for the message when a state from another setting lacks it.
    buffer_options: ClassVar[Mapping[str, str]] = {}

    def __attrs_post_init__(self) -> None:
        """Validate the shared fields (subclasses call this from their own)."""
        if slot_rules().is_schedule(self.lr):
            slot_rules().check_fits(self, self.lr)
        else:
            check_rate(self, _Field("lr"), self.lr)
        check_rate(self, _Field("weight_decay"), self.weight_decay)

    # ------------------------------------------------------------ state

    def init(self, params: ParamDict, /) -> S:
        """Return the first state for `params`, after checking them.

        Args:
            params: The parameters to optimize; unchanged.

        Returns:
            `init_state(params)`, the optimizer's state at step 0.

        Raises:
            TypeError: If `params` is not a ParamDict, or a value is not a real
                floating-point tensor.
            ValueError: If a per-key rate has other keys than `params`, or a
                shape that would change a parameter's.

        Example:
            >>> from paramdict import optim
            >>> optim.SGD().init(ParamDict(w=torch.ones(2))).step
            tensor(0., dtype=torch.float64)
        """
        given = cast(object, params)  # checked here: annotations are promises
        if not isinstance(given, ParamDict):
            msg = (
                f"`init` takes the parameters as a ParamDict, got "
                f"{type(params).__name__}. Wrap them: `ParamDict(params)`."
            )
            raise TypeError(msg)
        check_real(params)
        self._check_rates(params)
        state = self.init_state(params)
        if slot_rules().is_schedule(self.lr):
            schedule = slot_rules().first_state(self.lr, params)
            state = cast("Any", state)._replace(schedule=schedule)
        return state

    def init_state(self, params: ParamDict, /) -> S:
        """Return the state at step 0 for checked `params`.

        By default a zero counter and a zero buffer for each field of
        `state_type` after `step` (but `schedule`, which `init` fills):
        override it for a buffer that starts otherwise or may be empty.

        Args:
            params: The parameters, already checked by `init`.

        Returns:
            The state; its first field is `self.counter(params)`.

        Example:
            >>> from paramdict import optim
            >>> state = optim.RAdam().init_state(ParamDict(w=torch.ones(2)))
            >>> state.step, state.exp_avg_sq["w"]
            (tensor(0., dtype=torch.float64), tensor([0., 0.]))
        """
        fields: tuple[str, ...] = type(self).state_type._fields
        buffers = [params.zeros_like() for f in fields[1:] if f != "schedule"]
        state: S = type(self).state_type(self.counter(params), *buffers)
        return state

    def _check_rates(self, params: ParamDict) -> None:
        for name in ("lr", "weight_decay"):
            rate = getattr(self, name)
            if slot_rules().is_schedule(rate):
                continue
            check_rate_keys(params, name, rate)
            if isinstance(rate, ParamDict):
                check_rate_shapes(params, name, rate)

    def check_state(self, params: ParamDict, state: S, /) -> None:
        """Raise unless `state` is this optimizer's state for `params`.

        Args:
            params: The parameters of the step.
            state: The state to check.

        Raises:
            TypeError: If `state` is not an instance of `state_type`, or its step
                is not a 0-dim tensor of the counters' dtype.
            ValueError: If a buffer's keys, shapes or dtypes are not `params`',
                a buffer this optimizer's options need is empty (a state from
                other options), or the step is on another device or not a whole
                number >= 0.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.Adam()
            >>> state = opt.init(ParamDict(w=torch.ones(3, 1)))
            >>> opt.check_state(ParamDict(w=torch.ones(3)), state)
            Traceback (most recent call last):
            ...
            ValueError: The state's `exp_avg` must match the parameters ...
        """
        expected = type(self).state_type
        given: Any = cast(Any, state)  # checked here: annotations are promises
        if not isinstance(given, expected):
            msg = (
                f"`{type(self).__name__}` needs a `{expected.__name__}` as its "
                f"state, got {type(state).__name__}. Use the state from this "
                "optimizer's `init`."
            )
            raise TypeError(msg)
        check_counter(given.step, params, "step")
        if "schedule" in given._fields:
            slot_rules().check_slot(self, self.lr, given.schedule)
        # The buffers: once while `step_` gets the same tensors back (`_repeat`).
        check = partial(check_buffers, self, params, given)
        kept(params, given, ("state", ref(self)), check)

    # ------------------------------------------------------------ rule pieces

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
        value: Rate | object = getattr(self, name)
        if slot_rules().is_schedule(value):
            slot: Any = getattr(state, "schedule", None)
            if not slot_rules().is_slot(slot):
                msg = (
                    f"`{type(self).__name__}`'s `{name}` is a schedule, whose value "
                    "is in the state: the rule must call "
                    f"`self.rate({name!r}, step, state)`."
                )
                raise TypeError(msg)
            current: Tensor = slot.lr
            return current
        return cast(Rate, value)

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
        slot: object = getattr(state, "schedule", None)
        momentum = slot_rules().momentum(self.lr, slot)
        if momentum is None:
            return value
        return (momentum, value[1]) if name == "betas" else momentum

    def next_schedule(self, state: object, /) -> SlotState:
        """Return the state's `schedule` field after this step, for the new state.

        A rule passes it as the last field of the state it returns: the schedule
        advances once per update, after the update used the current rate
        (torch's `optimizer.step(); scheduler.step()`). `()` without a
        schedule; `ReduceLROnPlateau`'s moves only with `step_schedule`.

        Args:
            state: The state before the step.

        Returns:
            The new `schedule` field.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.SGD(lr=optim.ExponentialLR(base_lr=1.0, gamma=0.5))
            >>> opt.next_schedule(opt.init(ParamDict(w=torch.ones(1)))).lr
            tensor(0.5000, dtype=torch.float64)
        """
        slot: SlotState = getattr(state, "schedule", ())
        if not slot_rules().is_schedule(self.lr):
            return slot
        known, value = recall(slot)  # advanced by `_prepare` before `step_` wrote
        if known:
            return cast("SlotState", value)
        new_slot: SlotState = slot_rules().advanced(self.lr, slot)
        return new_slot

    def _prepare(self, params: ParamDict, grads: ParamDict, state: S) -> None:
        """Choose the kernels, and advance the schedule, before `step_` writes."""
        super()._prepare(params, grads, state)
        slot: SlotState = getattr(state, "schedule", ())
        if slot_rules().is_schedule(self.lr) and slot != ():
            remember(slot, slot_rules().advanced(self.lr, slot))

    @property
    def takes_metric(self) -> bool:
        """Whether the `lr` moves with a metric: a plateau, or a chain holding one."""
        return slot_rules().takes_metric(self.lr)

    @override
    def last_lr(self, state: S, /) -> list[float]:
        lr = self.rate("lr", self.next_step(state), state)
        if isinstance(lr, ParamDict):
            return [float(v) for v in lr.values()]
        return [float(lr)]

    @override
    def step_count(self, state: S, /) -> int:
        return int(state.step)

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
        if not slot_rules().takes_metric(self.lr):
            kind = type(self.lr).__name__
            msg = (
                f"`step_schedule` takes a metric for a `ReduceLROnPlateau` `lr` (or a "
                f"chain holding one); `{type(self).__name__}`'s `lr` is a {kind}, "
                "which takes no metric (a schedule advances with every `step`)."
            )
            raise ValueError(msg)
        given: Any = state
        slot: SlotState = getattr(given, "schedule", ())
        slot_rules().check_slot(self, self.lr, slot)
        new_slot = slot_rules().step_metric(self.lr, slot, metrics)
        result: S = given._replace(schedule=new_slot)
        return result

    # ------------------------------------------------------------ the driver

    decoupled_decay: ClassVar[bool] = False
    """Decay the parameters by `1 - lr * weight_decay` (else: L2, `prologue`)."""
    decays_in_math: ClassVar[bool] = False
    """`math` gets the parameters before the decoupled decay and applies it itself
    (`decayed`): for a rule that reads them first (Adafactor's step size)."""

    def _decoupled(self) -> bool:
        """`decoupled_decay`, else the `decoupled_weight_decay` option (Adam's)."""
        option: object = getattr(self, "decoupled_weight_decay", False)
        return self.decoupled_decay or option is True

    @override
    def update(
        self, params: ParamDict, grads: ParamDict, state: S, ops: Kernels, /
    ) -> tuple[ParamDict, S]:
        """Run the step around `math`: the counter, rate, prologue and new state.

        It reads `lr` (scheduled or not), handles `maximize` and the weight decay
        (decoupled per `_decoupled`, by `math` itself where `decays_in_math`, else
        L2 in `prologue`), calls `math` and builds the new state: the counter,
        `math`'s buffers, the advanced schedule. Arguments and result as
        `Optimizer.update`.

        Raises:
            TypeError: If `math` returns other than one value per buffer field.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0]))
            >>> opt = optim.Lion(lr=0.5, weight_decay=1.0)
            >>> new, state = opt.update(p, p, opt.init(p), optim.Kernels.for_params(p))
            >>> new["w"], state.step
            (tensor([0.]), tensor(1., dtype=torch.float64))
        """
        step = self.next_step(state)
        lr = self.rate("lr", step, state)
        if self._decoupled():
            if self.maximize:
                grads = ops.neg(grads)
            if not self.decays_in_math:
                params = self.decayed(params, step, lr, ops)
        else:
            grads = self.prologue(params, grads, step, ops)
        new_params, buffers = self.math(params, grads, state, step, lr, ops)
        given: Any = state
        fields: tuple[str, ...] = given._fields
        scheduled = fields[-1] == "schedule"
        names = list(fields[1 : len(fields) - scheduled])
        if len(buffers) != len(names):
            msg = (
                f"`{type(self).__name__}.math` returned {len(buffers)} buffers; its "
                f"state has the buffer fields {names}. Return one new value for "
                "each, in the state's order."
            )
            raise TypeError(msg)
        tail = (self.next_schedule(state),) if scheduled else ()
        new_state: S = type(given)(step, *buffers, *tail)
        return new_params, new_state

    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        buffers: S,
        step: Tensor,
        lr: Rate,
        ops: Kernels,
        /,
    ) -> tuple[ParamDict, tuple[ParamDict | Tensor, ...]]:
        """Return the new parameters and buffers: the rule's arithmetic only (the hook).

        Override this (or `update`) to write an optimizer: `update` did the rest.
        Read the buffers by name from `buffers` (the state before the step);
        return the new ones in the state's field order.

        Args:
            params: The parameters (already decayed when decoupled, unless
                `decays_in_math`).
            grads: The gradients (negated to maximize; with the L2 term).
            buffers: The state before the step, for its buffer fields (each a
                ParamDict, or a 0-dim tensor such as NAdam's `mu_product`).
            step: The number of the step being taken.
            lr: The learning rate of this step.
            ops: The kernels to compute with.

        Returns:
            `(new_params, new_buffers)`.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> opt, ops = optim.SGD(), optim.Kernels.for_params(p)
            >>> new, buffers = opt.math(p, p, opt.init(p), torch.tensor(1.0), 0.5, ops)
            >>> new["w"], buffers
            (tensor([0.5000, 1.0000]), (ParamDict(),))
        """
        msg = (
            f"`{type(self).__name__}` defines neither `math` nor `update`: override "
            "one of them with the update rule."
        )
        raise NotImplementedError(msg)

    def decayed(
        self, params: ParamDict, step: Tensor, lr: Rate, ops: Kernels, /
    ) -> ParamDict:
        """Return `params` after the decoupled weight decay of step `step`.

        `params * (1 - lr * weight_decay)`, the driver's decay of a decoupled
        rule; a rule with `decays_in_math` calls it where it needs it.

        Args:
            params: The parameters.
            step: The number of the step being taken.
            lr: The learning rate of this step.
            ops: The kernels of the step.

        Returns:
            The decayed parameters (`params` itself for a weight decay of 0).

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0]))
            >>> opt, ops = optim.AdamW(weight_decay=0.5), optim.Kernels.for_params(p)
            >>> opt.decayed(p, torch.tensor(1.0), 0.5, ops)["w"]
            tensor([0.7500])
        """
        return ops.decay(params, lr, self.rate("weight_decay", step))

    @staticmethod
    def next_step(state: HasStep, /) -> Tensor:
        """Return the number of the step being taken: the state's counter plus one.

        Args:
            state: The state before the step.

        Returns:
            A 0-dim tensor.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.SGD()
            >>> opt.next_step(opt.init(ParamDict(w=torch.ones(1))))
            tensor(1., dtype=torch.float64)
        """
        return state.step + 1

    def prologue(
        self, params: ParamDict, grads: ParamDict, step: Tensor, ops: Kernels, /
    ) -> ParamDict:
        """Return the gradients the rule uses: negated to maximize, plus L2 decay.

        torch.optim's order: `-grads` when `maximize`, then
        `grads + weight_decay * params` when the weight decay is not zero.
        Decoupled decay (AdamW) is `update`'s `ops.decay` of the parameters instead.

        Args:
            params: The parameters.
            grads: The gradients.
            step: The number of the step being taken.
            ops: The kernels of the step.

        Returns:
            The gradients to use.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0]))
            >>> opt = optim.SGD(weight_decay=0.5, maximize=True)
            >>> ops = optim.Kernels.for_params(p)
            >>> opt.prologue(p, p.full_like(2.0), torch.tensor(1.0), ops)["w"]
            tensor([-1.5000])
        """
        if self.maximize:
            grads = ops.neg(grads)
        weight_decay = self.rate("weight_decay", step)
        if not is_zero(weight_decay):
            grads = ops.add_scaled(grads, params, weight_decay)
        return grads

    @staticmethod
    def counter(params: ParamDict, /) -> Tensor:
        """Return a zero step counter for `params` (the first field of a state).

        Args:
            params: The parameters; the counter goes on the first one's device.

        Returns:
            A 0-dim double-precision zero (single precision on MPS).

        Example:
            >>> from paramdict import optim
            >>> optim.SGD.counter(ParamDict(w=torch.ones(1)))
            tensor(0., dtype=torch.float64)
        """
        return new_counter(params)
