"""Rprop: resilient backpropagation, per-entry step sizes driven by gradient signs."""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, ClassVar, NamedTuple, cast

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._base import TorchOptimizer
from ._fields import shared_last
from ._hyper import Rate
from ._protocol import register_state
from ._schedules.slot import LearningRate, SlotState, initial_rate
from ._vocabulary import Kernels

__all__ = ["Rprop", "RpropState"]


def _pair(name: str, value: object) -> tuple[float, float]:
    is_tuple = isinstance(value, tuple)
    pair = cast("tuple[object, ...]", value) if is_tuple else ()
    if not (
        is_tuple
        and len(pair) == 2
        and all(type(v) is not bool and isinstance(v, Real) for v in pair)
    ):
        msg = f"`{name}` must be a pair of numbers, got {value!r}."
        raise TypeError(msg)
    return cast("tuple[float, float]", pair)


def _check_etas(instance: object, attribute: Any, value: Any) -> None:
    etaminus, etaplus = _pair(attribute.name, value)
    if not 0 < etaminus < 1 < etaplus < math.inf:
        msg = (
            f"`etas` must be (etaminus, etaplus) with 0 < etaminus < 1 < etaplus, "
            f"got {value!r}."
        )
        raise ValueError(msg)


def _check_step_sizes(instance: object, attribute: Any, value: Any) -> None:
    low, high = _pair(attribute.name, value)
    if not 0 <= low <= high < math.inf:
        msg = (
            "`step_sizes` must be (min, max) with 0 <= min <= max, both finite, "
            f"got {value!r}."
        )
        raise ValueError(msg)


@register_state
class RpropState(NamedTuple):
    """The state of `Rprop`: `step`, `prev`, `step_size`, `schedule`.

    Attributes:
        prev: The previous step's gradient (zero where its sign flipped).
        step_size: The per-entry step sizes, starting at `lr`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.Rprop(lr=0.1)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> grads = ParamDict(w=torch.tensor([2.0, -2.0]))
        >>> _, state = opt.step(params, grads, opt.init(params))
        >>> state.prev["w"], state.step_size["w"]
        (tensor([ 2., -2.]), tensor([0.1000, 0.1000]))
    """

    step: Tensor
    prev: ParamDict
    step_size: ParamDict
    schedule: SlotState = ()


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class Rprop(TorchOptimizer[RpropState]):
    """Rprop, the functional `torch.optim.Rprop`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Rprop`, so a
    run gives the same parameters. Each entry moves by its own step size
    against the sign of its gradient; the step size grows by `etas[1]` while
    the gradient keeps its sign, shrinks by `etas[0]` when it flips (and that
    step is skipped), and stays within `step_sizes`. `lr` is the first step
    size. Like torch.optim's, Rprop has no weight decay. The attributes below
    are the constructor's keyword arguments, with `maximize` and
    `differentiable` (see `TorchOptimizer`).

    Attributes:
        lr: The initial step size: a number, a 0-dim tensor, a ParamDict of
            per-key values, or a schedule, whose first value is the initial
            step size (torch reads `lr` only then; later values change nothing).
        etas: `(etaminus, etaplus)`, the factors that shrink and grow the step
            sizes, with `0 < etaminus < 1 < etaplus`.
        step_sizes: `(min, max)`, the bounds of the step sizes.

    Raises:
        ValueError: If `lr` is negative, or `etas` or `step_sizes` is out of
            range; the message names the argument.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> from paramdict import optim
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> opt = optim.Rprop(lr=0.1)
        >>> state = opt.init(params)
        >>> grads = {"w": torch.tensor([3.0, -3.0])}
        >>> params, state = opt.step(params, grads, state)
        >>> params, state = opt.step(params, grads, state)
        >>> params["w"]
        tensor([0.7800, 2.2200])
    """

    state_type: ClassVar[type[RpropState]] = RpropState
    # Not an option: torch.optim.Rprop has no weight decay.
    weight_decay: Rate = attrs.field(default=0.0, init=False)

    lr: LearningRate = 1e-2
    etas: tuple[float, float] = attrs.field(default=(0.5, 1.2), validator=_check_etas)
    step_sizes: tuple[float, float] = attrs.field(
        default=(1e-6, 50), validator=_check_step_sizes
    )

    @override
    def init_state(self, params: ParamDict, /) -> RpropState:
        """Return the first state: step 0, zero `prev`, step sizes at `lr`."""
        counter = self.counter(params)
        # A schedule's first value: torch reads `lr` only to fill the step sizes.
        first = initial_rate(self.lr, params)
        lr = self.rate("lr", counter + 1) if first is None else first
        return RpropState(counter, params.zeros_like(), params.zeros_like().add(lr))

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        buffers: RpropState,
        step: Tensor,
        lr: Rate,
        ops: Kernels,
        /,
    ) -> tuple[ParamDict, tuple[ParamDict, ParamDict]]:
        etaminus, etaplus = self.etas
        step_size_min, step_size_max = self.step_sizes
        # The factor for each entry: etaplus where the gradient kept its sign,
        # etaminus where it flipped, 1 where either is zero (torch's order; the
        # sign is exactly 1, -1 or 0, and etaplus > 1 > etaminus > 0). It is
        # computed in `prev`'s memory, which then takes the new `prev`.
        sign = ops.sign(ops.mul(buffers.prev, grads))
        flipped = ops.eq(sign, -1)
        sign = ops.masked_fill(sign, ops.eq(sign, 1), etaplus)
        sign = ops.masked_fill(sign, flipped, etaminus)
        sign = ops.masked_fill(sign, ops.eq(sign, 0), 1)
        step_size = ops.mul(buffers.step_size, sign)
        step_size = ops.clamp(step_size, step_size_min, step_size_max)
        # Where the sign flipped the step is skipped and forgotten.
        prev = ops.masked_fill(ops.copy(sign, grads), flipped, 0)
        direction = ops.sign(ops.borrowed(prev))
        return ops.addcmul(params, direction, step_size, -1), (prev, step_size)
