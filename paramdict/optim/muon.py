"""Muon: momentum orthogonalized by Newton-Schulz iterations, for 2-D entries."""

from __future__ import annotations

import math
from typing import Any, ClassVar, cast

import attrs
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._fields import flag, non_negative, shared_last
from ._hyper import Rate, check_int, is_finite
from ._matrix import newton_schulz
from ._schedules.slot import LearningRate
from ._states import MuonState
from ._torch_optimizer import TorchOptimizer

__all__ = ["Muon", "MuonState"]

# torch.optim.Muon's defaults (Keller Jordan's coefficients).
_NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
_ADJUST_LR_FNS = (None, "original", "match_rms_adamw", "spectral_unclamped")

NOT_A_MATRIX = (
    "Muon updates 2-D entries (matrices) only; {keys!r} are not 2-D ({shapes}). "
    "Give the other entries to another optimizer by key pattern, e.g. "
    "`optim.ParamGroups({{'*.weight': optim.Muon(...)}}, default=optim.AdamW(...))`."
)


def _check_coefficients(instance: object, attribute: Any, value: Any) -> None:
    ok = isinstance(value, tuple) and len(value) == 3  # pyright: ignore[reportUnknownArgumentType]  # checked here
    if not ok or not all(
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and is_finite(attribute.name, v)
        for v in cast("tuple[object, ...]", value)
    ):
        msg = f"`{attribute.name}` must be a tuple of three numbers, got {value!r}."
        raise TypeError(msg)


def _check_adjust_lr_fn(instance: object, attribute: Any, value: Any) -> None:
    if value not in _ADJUST_LR_FNS:
        msg = (
            f"`{attribute.name}` must be None, 'original', 'match_rms_adamw' or "
            f"'spectral_unclamped', got {value!r}."
        )
        raise ValueError(msg)


def _check_matrices(params: ParamDict) -> None:
    """Raise unless every entry is a matrix with elements, naming the others."""
    bad = sorted(k for k, v in params.items() if v.dim() != 2)
    if bad:
        shapes = ", ".join(f"{k!r}: {tuple(params[k].shape)}" for k in bad)
        raise ValueError(NOT_A_MATRIX.format(keys=bad, shapes=shapes))
    empty = sorted(k for k, v in params.items() if v.numel() == 0)
    if empty:
        shapes = ", ".join(f"{k!r}: {tuple(params[k].shape)}" for k in empty)
        msg = (
            f"Muon cannot orthogonalize empty matrices; {empty!r} have no "
            f"elements ({shapes}). Leave them out of the parameters, or give them "
            "to another optimizer by key pattern with `optim.ParamGroups`."
        )
        raise ValueError(msg)


def _ratio(shape: tuple[int, ...], adjust_lr_fn: str | None) -> float:
    """Return torch.optim.Muon's learning-rate factor for a matrix of `shape`."""
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if adjust_lr_fn == "spectral_unclamped":
        return math.sqrt(rows / cols)
    return math.sqrt(max(1, rows / cols))


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class Muon(TorchOptimizer[MuonState]):
    """Muon, the functional `torch.optim.Muon`: orthogonalized momentum for matrices.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Muon`
    (including its bfloat16 Newton-Schulz iterations), so a run gives the same
    parameters. Each step: the momentum buffer moves toward the gradient
    (`lerp` by `1 - momentum`); the update (Nesterov: the gradient moved toward
    the buffer by `momentum`) is orthogonalized by `ns_steps` Newton-Schulz
    iterations; the parameters decay by `1 - lr * weight_decay`; then the update
    is subtracted, scaled by `lr` adjusted to each matrix's shape
    (`adjust_lr_fn`). Muon updates 2-D entries only: `init` refuses others,
    naming them; give those to another optimizer with `ParamGroups`. Like
    torch.optim.Muon it has no `maximize`. A 0-dim tensor `lr` is read as a
    number (as torch reads it) in the default mode and stays a tensor with
    `differentiable=True`. The attributes below are the constructor's keyword
    arguments, with `differentiable` (see `TorchOptimizer`).

    Attributes:
        lr: The learning rate, in any of its forms (of the schedules,
            `CyclicLR` and `OneCycleLR` cycle `momentum` too).
        weight_decay: The decoupled weight decay, in any rate form.
        momentum: Momentum factor.
        nesterov: Use Nesterov momentum.
        ns_coefficients: The coefficients `(a, b, c)` of the Newton-Schulz
            polynomial.
        eps: The least norm the update is divided by.
        ns_steps: The number of Newton-Schulz iterations, below 100.
        adjust_lr_fn: `None` or `"original"` (`lr * sqrt(max(1, rows / cols))`),
            `"match_rms_adamw"` (`0.2 * lr * sqrt(max(rows, cols))`), or
            `"spectral_unclamped"` (`lr * sqrt(rows / cols)`, as torch 2.14 has it).

    Raises:
        ValueError: If a rate, `momentum` or `eps` is negative, `ns_steps` is
            not in [0, 100) or `adjust_lr_fn` is unknown; the message names it.
        TypeError: If a hyperparameter is of the wrong kind.

    Example:
        >>> from paramdict import optim
        >>> params = ParamDict(w=torch.eye(2))
        >>> opt = optim.Muon(lr=0.1, weight_decay=0.0)
        >>> state = opt.init(params)
        >>> grads = {"w": torch.tensor([[2.0, 0.0], [0.0, 2.0]])}
        >>> params, state = opt.step(params, grads, state)
        >>> params["w"].diagonal()
        tensor([0.8875, 0.8875])
    """

    state_type: ClassVar[type[MuonState]] = MuonState
    lazy_copies: ClassVar[bool] = True
    decoupled_decay: ClassVar[bool] = True

    lr: LearningRate = 1e-3
    weight_decay: Rate = 0.1
    momentum: float = non_negative(0.95)
    nesterov: bool = flag(True)
    ns_coefficients: tuple[float, float, float] = attrs.field(
        default=_NS_COEFFICIENTS, validator=_check_coefficients
    )
    eps: float = non_negative(1e-7)
    ns_steps: int = attrs.field(
        default=5, validator=check_int(lambda n: 0 <= n < 100, "in [0, 100)")
    )
    adjust_lr_fn: str | None = attrs.field(default=None, validator=_check_adjust_lr_fn)
    # Not an argument: torch.optim.Muon has no `maximize`.
    maximize: bool = attrs.field(default=False, init=False, repr=False)

    @override
    def init_state(self, params: ParamDict, /) -> MuonState:
        """Return step 0 and a zero buffer; refuse non-2-D or empty entries by name."""
        _check_matrices(params)
        return MuonState(self.counter(params), params.zeros_like())

    @override
    def check_state(self, params: ParamDict, state: MuonState, /) -> None:
        """Check `state` as every optimizer does, and refuse what `init` refuses."""
        super().check_state(params, state)
        _check_matrices(params)

    def _adjusted(self, params: ParamDict, lr: Rate) -> dict[str, float | Tensor]:
        """Each matrix's rate: `lr` times its `adjust_lr_fn` ratio, torch's rounding."""
        ratios = {
            k: _ratio(tuple(v.shape), self.adjust_lr_fn) for k, v in params.items()
        }
        if isinstance(lr, ParamDict):
            return {k: lr[k] * r for k, r in ratios.items()}
        return {k: lr * r for k, r in ratios.items()}

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: MuonState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        momentum = self.cycled("momentum", state)
        buffer = state.momentum_buffer.lerp_(grads, 1 - momentum)
        update = grads.lerp(buffer, momentum) if self.nesterov else buffer
        coefficients, steps, eps = self.ns_coefficients, self.ns_steps, self.eps
        ortho = update._derive(
            [newton_schulz(v, coefficients, steps, eps) for v in update.values()]
        )
        params.sub_(ortho, alpha=self._adjusted(params, lr))
