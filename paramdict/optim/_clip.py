"""Gradient clipping by global norm, as a step in front of any optimizer."""

from __future__ import annotations

from typing import Any, TypeVar

import attrs
import torch

from .._paramdict import ParamDict
from ._hyper import check_non_negative, check_number, spread
from ._protocol import Optimizer

__all__ = ["ClipGradNorm", "clip_grad_norm"]

S = TypeVar("S")
P = TypeVar("P", bound=ParamDict)


def clip_grad_norm(grads: P, /, max_norm: float, *, norm_type: float = 2.0) -> P:
    """Return `grads` scaled so that their global norm is at most `max_norm`.

    The arithmetic of `torch.nn.utils.clip_grad_norm_`, out of place and without
    reading anything back to the host: the global norm is the norm of the
    per-entry norms, and every entry is multiplied by
    `min(1, max_norm / (norm + 1e-6))`. `grads` is unchanged.

    Args:
        grads: The gradients.
        max_norm: The largest global norm allowed.
        norm_type: The order of the norm; `math.inf` for the largest absolute value.

    Returns:
        A new ParamDict of the same type and keys.
    """
    if not grads:
        return grads
    norms = torch._foreach_norm(list(grads.values()), norm_type)
    total = torch.linalg.vector_norm(torch.stack(list(norms)), norm_type)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    return grads.mul(spread(coefficient, grads))


def _check_norm_type(instance: object, attribute: Any, value: Any) -> None:
    check_number(instance, attribute, value)
    if not value > 0:
        msg = f"`{attribute.name}` must be positive or `math.inf`, got {value!r}."
        raise ValueError(msg)


@attrs.frozen(eq=False)
class ClipGradNorm(Optimizer[S]):
    """Clip the gradients by their global norm, then step `optimizer`.

    Wraps any optimizer (a `ParamGroups` too, so the norm is over all groups):
    `step` replaces `grads` by `clip_grad_norm(grads, max_norm)` and hands them
    to `optimizer`, whose state it uses unchanged. Differentiable exactly when
    `optimizer` is.

    Args:
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

    @property
    def differentiable(self) -> bool:
        """Whether `step` keeps the graph: the same as the wrapped optimizer's."""
        return self.optimizer.differentiable

    def init(self, params: ParamDict, /) -> S:
        """Return the wrapped optimizer's first state for `params`.

        Args:
            params: The parameters to optimize; unchanged.

        Returns:
            `optimizer.init(params)`.
        """
        return self.optimizer.init(params)

    def _update(self, params: P, grads: ParamDict, state: S, /) -> tuple[P, S]:
        clipped = clip_grad_norm(grads, self.max_norm, norm_type=self.norm_type)
        return self.optimizer._update(params, clipped, state)
