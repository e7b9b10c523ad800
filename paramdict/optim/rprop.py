"""Rprop: resilient backpropagation, per-entry step sizes driven by gradient signs."""

from __future__ import annotations

import math
from functools import partial
from numbers import Real
from typing import Any, ClassVar, cast

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._fields import shared_last
from ._hyper import Rate
from ._schedules.slot import LearningRate
from ._states import RpropState
from ._torch_optimizer import TorchOptimizer

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
    lazy_copies: ClassVar[bool] = True
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
        # torch reads `lr` only to fill the step sizes.
        lr = self._first_rate(counter)
        return RpropState(counter, params.zeros_like(), params.zeros_like().add(lr))

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: RpropState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        etaminus, etaplus = self.etas
        step_size_min, step_size_max = self.step_sizes
        # Recorded, the product keeps `prev` for the backward pass, and `prev`
        # is written below: read from a copy then, as torch's Rprop does.
        prev = state.prev.clone() if self.differentiable else state.prev
        sign = prev.mul(grads).sign_()
        # `partial(torch.eq, ...)` runs each comparison without a Python frame.
        flipped = sign.map(partial(torch.eq, other=-1))
        _masked_fill_(sign, sign.map(partial(torch.eq, other=1)), etaplus)
        _masked_fill_(sign, flipped, etaminus)
        _masked_fill_(sign, sign.map(partial(torch.eq, other=0)), 1)
        step_size = state.step_size.mul_(sign).clamp_(step_size_min, step_size_max)
        new_prev = _masked_fill_(state.prev.copy_(grads), flipped, 0)
        params.addcmul_(new_prev.sign(), step_size, value=-1)


def _masked_fill_(x: ParamDict, mask: ParamDict, value: float) -> ParamDict:
    """Write `value` into `x` where `mask` holds (no foreach kernel has it)."""
    for v, m in zip(x.values(), x._aligned(mask, what="`masked_fill_`")):
        v.masked_fill_(m, value)
    return x
