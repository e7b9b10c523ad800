"""Gradient clipping by global norm, as a step in front of any optimizer."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar, cast

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._foreach import holds_dtensors
from .._paramdict import ParamDict
from .._reduce import _CLIP_EPS
from ._hyper import check_non_negative, check_number
from ._protocol import Optimizer
from ._strategy import one_graph
from ._vocabulary import Kernels

__all__ = ["ClipGradNorm"]

S = TypeVar("S")
P = TypeVar("P", bound=ParamDict)


def _check_norm_type(instance: object, attribute: Any, value: Any) -> None:
    check_number(instance, attribute, value)
    if not value > 0:
        msg = f"`{attribute.name}` must be positive or `math.inf`, got {value!r}."
        raise ValueError(msg)


@attrs.frozen(eq=False)
class ClipGradNorm(Optimizer[S]):
    """Clip the gradients by their global norm, then step `optimizer`.

    Wraps any optimizer (a `ParamGroups` too, so the norm is over all groups):
    `step` replaces `grads` by `grads.clip_norm(max_norm, p=norm_type)` (the
    arithmetic of `torch.nn.utils.clip_grad_norm_`, without a host sync) and hands
    them to `optimizer`, whose state it uses unchanged. Differentiable exactly
    when `optimizer` is. Built as `ClipGradNorm(optimizer, max_norm=...)`.

    Attributes:
        optimizer: The optimizer that takes the clipped gradients.
        max_norm: The largest global gradient norm allowed.
        norm_type: The order of the norm; `math.inf` for the largest absolute value.

    Raises:
        ValueError: If `max_norm` is negative or `norm_type` not positive.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.tensor([0.0, 0.0]))
        >>> opt = optim.ClipGradNorm(optim.SGD(lr=1.0), max_norm=1.0)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([30.0, 40.0])}, state)
        >>> params["w"]
        tensor([-0.6000, -0.8000])
    """

    optimizer: Optimizer[S]
    max_norm: float = attrs.field(kw_only=True, validator=check_non_negative)
    norm_type: float = attrs.field(
        default=2.0, kw_only=True, validator=_check_norm_type
    )

    differentiable: bool = attrs.field(init=False, repr=False)
    """Whether `step` keeps the graph: the same as the wrapped optimizer's."""

    def __attrs_post_init__(self) -> None:
        """Refuse a non-optimizer; take `differentiable` from the wrapped one."""
        given = cast(object, self.optimizer)  # checked here: annotations are promises
        if not isinstance(given, Optimizer):
            msg = (
                "`ClipGradNorm` wraps a paramdict optimizer (an `Optimizer` such as "
                f"`optim.SGD(...)`), got {type(self.optimizer).__name__}."
            )
            raise TypeError(msg)
        object.__setattr__(self, "differentiable", self.optimizer.differentiable)

    @override
    def check_state(self, params: ParamDict, state: S, /) -> None:
        self.optimizer.check_state(params, state)

    @property
    @override
    def takes_metric(self) -> bool:
        return self.optimizer.takes_metric

    @override
    def step_schedule(self, state: S, metrics: float | Tensor, /) -> S:
        return self.optimizer.step_schedule(state, metrics)

    @override
    def last_lr(self, state: S, /) -> list[float]:
        return self.optimizer.last_lr(state)

    @override
    def step_count(self, state: S, /) -> int:
        return self.optimizer.step_count(state)

    def init(self, params: ParamDict, /) -> S:
        """Return the wrapped optimizer's first state for `params`.

        Args:
            params: The parameters to optimize; unchanged.

        Returns:
            `optimizer.init(params)`.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.ClipGradNorm(optim.Adam(), max_norm=1.0)
            >>> type(opt.init(ParamDict(w=torch.ones(2)))).__name__
            'AdamState'
        """
        return self.optimizer.init(params)

    @override
    def _prepare(self, params: ParamDict, grads: ParamDict, state: S) -> None:
        self.optimizer._prepare(params, grads, state)

    @override
    def _step_in_place(self, params: ParamDict, grads: ParamDict, state: S) -> S:
        clipped = grads.clip_norm(self.max_norm, p=self.norm_type)
        return self.optimizer._step_in_place(params, clipped, state)

    @override
    def step(self, params: P, grads: Mapping[str, Tensor], state: S, /) -> tuple[P, S]:
        """Return the parameters after one update, and the next state.

        As `Optimizer.step`. Eager and not differentiable, the clipped gradients
        go to the wrapped optimizer's own `step`, so it steps on its best path
        (torch's fused kernel on copies where it has one); otherwise (traced, or
        differentiable) its rule runs on them.

        Arguments and result as `Optimizer.step`.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.ClipGradNorm(optim.SGD(lr=1.0), max_norm=10.0)
            >>> params = ParamDict(w=torch.zeros(2))
            >>> grads = {"w": torch.tensor([3.0, 4.0])}  # norm 5: not clipped
            >>> opt.step(params, grads, opt.init(params))[0]["w"]
            tensor([-3., -4.])
        """
        if one_graph(self) is not None:  # `update`, one graph
            return super().step(params, grads, state)
        with self._facts_kept(params, state):
            aligned = self._checked(params, grads, state)
        if not params:
            return params, state
        with torch.no_grad():
            clipped = aligned.clip_norm(self.max_norm, p=self.norm_type)
        return self.optimizer.step(params, clipped, state)

    def _step_in_place_clipping(
        self, params: ParamDict, grads: ParamDict, state: S, divisor: int = 1
    ) -> S:
        """`_step_in_place` on `grads / divisor`, clipping `grads` in place.

        For a wrapper whose gradients are its own scratch (`MultiSteps`' sum of
        `divisor` micro-batches): the same numbers as dividing, then
        `clip_norm`'s copy, without the copy. Where `divisor` is a power of two
        and the norm is the 2-norm or the largest value, the division is folded
        into the clipping factor (both scale by a power of two, exactly, for
        values in the normal range), which saves a pass over the gradients.
        """
        values = list(grads.values())
        folded = divisor == 1 or (
            divisor & (divisor - 1) == 0 and self.norm_type in (2.0, math.inf)
        )
        if not values or holds_dtensors(values) or not folded:
            if divisor != 1:
                torch._foreach_div_(values, divisor)
            if not values or holds_dtensors(values):
                return self._step_in_place(params, grads, state)
            divisor = 1
        total = grads.norm(self.norm_type)
        if divisor != 1:
            total = total / divisor  # the norm of `grads / divisor`, exactly
        coef = torch.clamp(self.max_norm / (total + _CLIP_EPS), max=1.0)
        if divisor != 1:
            coef = coef / divisor
        torch._foreach_mul_(values, [coef] * len(values))  # as `clip_norm`'s
        return self.optimizer._step_in_place(params, grads, state)

    @override
    def update(
        self, params: ParamDict, grads: ParamDict, state: S, ops: Kernels, /
    ) -> tuple[ParamDict, S]:
        clipped = grads.clip_norm(self.max_norm, p=self.norm_type)
        return self.optimizer.update(params, clipped, state, ops)
