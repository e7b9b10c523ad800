"""Gradient clipping by global norm, as a step in front of any optimizer."""

from __future__ import annotations

from typing import TypeVar, cast

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from .._reduce import CLIP_EPS
from ._binding import Composed, Plan
from ._hyper import check_non_negative, check_number_in
from ._optimizer import Optimizer

__all__ = ["ClipGradNorm"]

S = TypeVar("S")
P = TypeVar("P", bound=ParamDict)


_check_norm_type = check_number_in(lambda x: x > 0, "positive or `math.inf`")


@attrs.frozen(eq=False)
class ClipGradNorm(Optimizer[S]):
    """Clip the gradients by their global norm, then step `optimizer`.

    Wraps any optimizer (a `ParamGroups` too: the norm is over all groups):
    `grads` become `grads.clip_norm(max_norm, p=norm_type)` (torch's
    `clip_grad_norm_` arithmetic, without a host sync). The state is the
    wrapped optimizer's; so is `differentiable`.

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

    @override
    def eval_params(self, params: P, state: S, /) -> P:
        return self.optimizer.eval_params(params, state)

    def init(self, params: ParamDict, /) -> S:
        """Return the wrapped optimizer's first state for `params`.

        Example:
            >>> from paramdict import optim
            >>> opt = optim.ClipGradNorm(optim.Adam(), max_norm=1.0)
            >>> type(opt.init(ParamDict(w=torch.ones(2)))).__name__
            'AdamState'
        """
        return self.optimizer.init(params)

    @override
    def _lazy_rule(self) -> bool:
        return self.optimizer._lazy_rule()

    @override
    def _plan(self, params: ParamDict, state: S, *, in_place: bool) -> Plan[S]:
        inner = self.optimizer._plan(params, state, in_place=in_place)
        max_norm, norm_type = self.max_norm, self.norm_type

        def clipped(grads: ParamDict) -> ParamDict:
            return grads.clip_norm(max_norm, p=norm_type)

        def clipped_(grads: ParamDict) -> ParamDict:
            # `clip_norm`'s factor, multiplied in place: the same bits.
            total = grads._norm(norm_type, "clip_norm")
            return grads.mul_(torch.clamp(max_norm / (total + CLIP_EPS), max=1.0))

        return Composed(inner, clipped, clipped_)
