"""What the Adam family shares: its common options and the running moments."""

from __future__ import annotations

from typing import Any, TypeVar

import attrs
from torch import Tensor

from .._paramdict import ParamDict
from ._fields import betas, non_negative, shared_last
from ._hyper import Rate, host_numbers
from ._schedules.slot import LearningRate
from ._torch_optimizer import HasStep, TorchOptimizer

__all__ = ["AdamOptions", "in_inherited_order", "moments_"]

S = TypeVar("S", bound=HasStep)


def in_inherited_order(
    cls: type, fields: list[attrs.Attribute[Any]]
) -> list[attrs.Attribute[Any]]:
    """Return `fields` with each redeclared one at its base's place, shared last.

    So a subclass that redeclares an option (NAdam's `lr`, AdamW's
    `weight_decay`) keeps torch.optim's order of the arguments:

    >>> from paramdict import optim
    >>> [f.name for f in attrs.fields(optim.NAdam)][:4]
    ['lr', 'betas', 'eps', 'weight_decay']
    """
    base = next(b for b in cls.__mro__[1:] if attrs.has(b))
    order = {f.name: i for i, f in enumerate(attrs.fields(base))}
    placed = sorted(
        enumerate(fields),
        key=lambda item: (order.get(item[1].name, len(order)), item[0]),
    )
    return shared_last(cls, [f for _, f in placed])


@attrs.frozen(kw_only=True, eq=False, field_transformer=in_inherited_order)
class AdamOptions(TorchOptimizer[S]):
    """The options of every Adam-family optimizer, declared once (see `Adam`)."""

    lr: LearningRate = 1e-3
    betas: tuple[float, float] = betas((0.9, 0.999))
    eps: float = non_negative(1e-8)
    weight_decay: Rate = 0.0


def moments_(
    betas: tuple[float | Tensor, float],
    exp_avg: ParamDict,
    exp_avg_sq: ParamDict,
    grads: ParamDict,
) -> None:
    """Update the running averages of the gradient and its square (torch's order)."""
    beta1, beta2 = betas
    if isinstance(beta1, Tensor):  # a cycled momentum: read where that is free
        read = host_numbers(False, beta1)
        beta1 = beta1 if read is None else read[0]
    exp_avg.lerp_(grads, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grads, grads, value=1 - beta2)
