"""`TorchOptimizer`: what every optimizer in the style of `torch.optim` shares.

The shared options and checks, the step counter, the maximize/weight-decay
prologue, the learning rate's schedule, and the choice between torch's fused
kernel and the rule; a concrete optimizer adds its fields, `init_state` and `math`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar, cast

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._binding import Plan
from ._fused import FusedPlan, counted
from ._hyper import (
    Rate,
    check_counter,
    check_device_counter,
    check_flag,
    check_rate,
    check_rate_keys,
    check_rate_shapes,
    decay_factor,
    device_counter,
    is_zero,
    new_counter,
    state_scalar_dtype,
)
from ._optimizer import Optimizer
from ._scheduled import ScheduledRate
from ._schedules.slot import (
    LearningRate,
    check_fits,
    check_slot,
    first_state,
    is_schedule,
)
from ._state_check import check_buffers
from ._validate import check_params, check_real, transformed

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
class TorchOptimizer(ScheduledRate[S], Optimizer[S]):
    """The base of the optimizers in the style of `torch.optim`.

    A subclass is an `attrs.frozen(kw_only=True, eq=False,
    field_transformer=optim.shared_last)` class that declares `lr` and
    `weight_decay` among its fields (in torch.optim's order and defaults), a
    `state_type`, and `math` (and `init_state` where a buffer does not start at
    zero). This base does the checks, the step counter, the (scheduled)
    learning rate, `maximize` and the weight decay.

    `Adam`, `AdamW`, `SGD` and `Adagrad` have a `fused` option. `None` (the
    default): torch's fused kernel on the CPU where the step allows it
    (float32 or float64 entries, a number `weight_decay`), the foreach rule
    elsewhere. `False`: always the rule (`foreach=True`'s bits). `True`: the
    fused kernel, refusing a step it cannot take.

    Attributes:
        lr: The learning rate: a number, a 0-dim tensor, a per-key ParamDict,
            or a schedule (`optim.CosineAnnealingLR(base_lr=0.1, T_max=100)`),
            whose state is the last field of the optimizer's, `schedule`.
        weight_decay: The weight decay, in any of the same forms.
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step`.
        capturable: Keep the step counter on the parameters' device, as
            torch.optim's `capturable=True` does, so that a CUDA graph can
            capture `step_` whole (give `lr` as a device tensor to change it
            between replays). On the CPU it changes nothing.
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
    capturable: bool = attrs.field(default=False, validator=check_flag, kw_only=True)
    state_type: ClassVar[type[Any]]
    buffer_options: ClassVar[Mapping[str, str]] = {}
    """For each buffer `init_state` may leave empty, the option that fills it.

    `Adam`'s is `{"max_exp_avg_sq": "amsgrad=True"}`, named when it is missing.
    """
    own_fields: ClassVar[tuple[str, ...]] = ()
    """Fields of the state that the subclass's `check_state` checks itself (`eta`)."""

    copies_fused: ClassVar[bool] = True
    """Whether `step` (on copies) takes the fused kernel under `fused=None`.

    `SGD`'s is False: its foreach rule in `step`, the fused kernel in `step_`.
    """

    lazy_copies: ClassVar[bool] = False
    """`math` writes only through ParamDict's in-place methods (`add_`, `lerp_`, ...).

    Never into a tensor taken out of a ParamDict (`params["w"].add_(1)`). Then
    `step` hands `math` containers copied by their first write, a pass over
    memory less. Leave it False until your `math` keeps that rule.
    """

    decoupled_decay: ClassVar[bool] = False
    """Decay the parameters by `1 - lr * weight_decay` (else: L2, `prologue`)."""
    decays_in_math: ClassVar[bool] = False
    """`math` applies the weight decay itself (Adafactor, Schedule-Free)."""

    def __attrs_post_init__(self) -> None:
        """Validate the shared fields (subclasses call this from their own)."""
        if is_schedule(self.lr):
            check_fits(self, self.lr)
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
        params = check_params(params, "init")
        self._check_rates(params)
        state = self.init_state(params)
        if is_schedule(self.lr):
            state = cast("Any", state)._replace(schedule=first_state(self.lr))
        return state

    def init_state(self, params: ParamDict, /) -> S:
        """Return the state at step 0 for checked `params`.

        By default a zero counter and a zero buffer per field after `step`
        (but `schedule`, which `init` fills).

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

    def _stand_ins(self, state: S) -> ParamDict:
        """Stand-ins for the parameters of `state`: each key's first buffer entry."""
        entries: dict[str, Tensor] = {}
        given: Any = state
        for field in given._fields:
            value = getattr(given, field)
            if field in ("step", "schedule", *self.own_fields):
                continue
            if isinstance(value, ParamDict):
                for k, v in value.items():
                    entries.setdefault(k, v)
        return ParamDict(entries)

    def _check_rates(self, params: ParamDict) -> None:
        for name in ("lr", "weight_decay"):
            rate = getattr(self, name)
            if is_schedule(rate):
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
                other options), or the step is not a whole number >= 0.

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
        step = given.step
        on_device = self.capturable and isinstance(step, Tensor) and not step.is_cpu
        dtype = state_scalar_dtype(step.device) if on_device else None
        check_counter(step, params, "step", dtype=dtype)
        if self.capturable:
            check_device_counter(step, params, "step")
        if "schedule" in given._fields:
            check_slot(self, self.lr, given.schedule)
        check_buffers(self, params, given)

    # ------------------------------------------------------------ the driver

    @override
    def _lazy_rule(self) -> bool:
        return self.lazy_copies

    def _decoupled(self) -> bool:
        """`decoupled_decay`, or the `decoupled_weight_decay` option (Adam's)."""
        option: object = getattr(self, "decoupled_weight_decay", False)
        return self.decoupled_decay or option is True

    def _fused_plan(self, params: ParamDict, state: S) -> FusedPlan[S] | None:
        """The fused kernel's plan for this step, or None (the rule; the default)."""
        del params, state
        return None

    @override
    def _plan(self, params: ParamDict, state: S, *, in_place: bool) -> Plan[S]:
        """Check `params` and `state`; choose torch's fused kernel or the rule."""
        check_real(params)
        self._check_rates(params)
        self.check_state(params, state)
        if not (
            self.differentiable or torch.compiler.is_compiling() or transformed()
        ) and (in_place or self.copies_fused or getattr(self, "fused", None)):
            # A fused kernel writes outside autograd, tracing and transforms.
            return self._fused_plan(params, state) or self._prepare
        return self._prepare

    def _prepare(self, params: ParamDict, state: S) -> Callable[[ParamDict], S]:
        """Compute what can fail (the next schedule); return the rule's commit."""

        def run(grads: ParamDict, step: Tensor, lr: Rate) -> None:
            self._run_rule(params, grads, state, step, lr)

        return counted(self, state, run, fused=False)

    def _run_rule(
        self, params: ParamDict, grads: ParamDict, state: S, step: Tensor, lr: Rate
    ) -> None:
        """The prologue (maximize, weight decay), then `math`."""
        if self._decoupled():
            if self.maximize:
                grads = grads.neg()
            if not self.decays_in_math:
                self.decay_(params, step, lr)
        else:
            grads = self.prologue(params, grads, step)
        self.math(params, grads, state, step, lr)

    @override
    def update_(self, params: ParamDict, grads: ParamDict, state: S, /) -> S:
        """Write one step of the rule into `params` and `state`; return `state`.

        The whole step around `math` (counter, rate, prologue, schedule).

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0]))
            >>> opt = optim.Lion(lr=0.5, weight_decay=1.0)
            >>> state = opt.update_(p, p, opt.init(p))
            >>> p["w"], state.step
            (tensor([0.]), tensor(1., dtype=torch.float64))
        """
        return self._prepare(params, state)(grads)

    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: S,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        """Write the rule's arithmetic into `params` and `state` (the hook).

        Override this to write an optimizer: write with ParamDict's in-place
        arithmetic into the parameters and buffers
        (`state.exp_avg.lerp_(grads, 0.1)`); read `grads` only. Rates in any
        form go to the arithmetic as they are.

        Args:
            params: The parameters (already decayed when decoupled, unless
                `decays_in_math`); written in place.
            grads: The gradients (negated to maximize; with the L2 term).
            state: The state before the step; its buffers are written in place
                (the counter and the schedule are advanced after `math`).
            step: The number of the step being taken, a 0-dim tensor.
            lr: The learning rate of this step.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0, 2.0]))
            >>> opt = optim.SGD()
            >>> opt.math(p, p, opt.init(p), torch.tensor(1.0), 0.5)
            >>> p["w"]
            tensor([0.5000, 1.0000])
        """
        msg = (
            f"`{type(self).__name__}` defines no `math`: override it with the "
            "update rule."
        )
        raise NotImplementedError(msg)

    def decay_(self, params: ParamDict, step: Tensor, lr: Rate, /) -> None:
        """Decay `params` in place by `1 - lr * weight_decay` (decoupled decay).

        A rule with `decays_in_math` calls it where it needs it.

        Args:
            params: The parameters, written in place.
            step: The number of the step being taken.
            lr: The learning rate of this step.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0]))
            >>> optim.AdamW(weight_decay=0.5).decay_(p, torch.tensor(1.0), 0.5)
            >>> p["w"]
            tensor([0.7500])
        """
        weight_decay = self.rate("weight_decay", step)
        if not is_zero(weight_decay):
            params.mul_(decay_factor(lr, weight_decay))

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
        self, params: ParamDict, grads: ParamDict, step: Tensor, /
    ) -> ParamDict:
        """Return the gradients the rule uses: negated to maximize, plus L2 decay.

        torch.optim's order: `-grads` when `maximize`, then
        `grads + weight_decay * params`. `grads` is never written.

        Args:
            params: The parameters.
            grads: The gradients.
            step: The number of the step being taken.

        Returns:
            The gradients to use.

        Example:
            >>> from paramdict import optim
            >>> p = ParamDict(w=torch.tensor([1.0]))
            >>> opt = optim.SGD(weight_decay=0.5, maximize=True)
            >>> opt.prologue(p, p.full_like(2.0), torch.tensor(1.0))["w"]
            tensor([-1.5000])
        """
        weight_decay = self.rate("weight_decay", step)
        if self.maximize:
            grads = grads.neg()
            if not is_zero(weight_decay):
                grads.add_(params, alpha=weight_decay)
            return grads
        if is_zero(weight_decay):
            return grads
        if isinstance(weight_decay, ParamDict):
            return grads.add(params.mul(weight_decay))
        return grads.add(params, alpha=weight_decay)

    def counter(self, params: ParamDict, /) -> Tensor:
        """Return a zero step counter (the first field of a state).

        Args:
            params: The parameters.

        Returns:
            A 0-dim float64 zero on the host; with `capturable=True`, a zero
            on the parameters' device in torch's dtype for it.

        Example:
            >>> from paramdict import optim
            >>> optim.SGD().counter(ParamDict(w=torch.ones(1)))
            tensor(0., dtype=torch.float64)
        """
        return device_counter(params) if self.capturable else new_counter()
