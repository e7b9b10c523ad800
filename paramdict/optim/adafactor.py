"""Adafactor: second moments factored into row and column averages for matrices."""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple, cast

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._base import TorchOptimizer
from ._fields import shared_last
from ._hyper import Rate, check_counter, check_number, check_rate_keys
from ._keyed import check_keyed
from ._protocol import register_state
from ._schedules.slot import LearningRate, SlotState, check_slot
from ._vocabulary import Kernels

__all__ = ["Adafactor", "AdafactorState"]


@register_state
class AdafactorState(NamedTuple):
    """The state of `Adafactor`: `step`, the second moments, `schedule`.

    Entries of two or more dimensions keep factored second moments (`row_var`,
    `col_var`, averaged over the last and the second-to-last dimension); the
    others keep a full one (`variance`). Each buffer holds only its own keys.

    Attributes:
        row_var: Per matrix: the running mean of the squared gradient over the
            last dimension (its shape with the last dimension 1).
        col_var: Per matrix: the same over the second-to-last dimension.
        variance: Per entry of fewer than two dimensions: the running mean of
            the squared gradient.

    Example:
        >>> from paramdict import optim
        >>> params = ParamDict(w=torch.ones(2, 3), b=torch.ones(3))
        >>> state = optim.Adafactor().init(params)
        >>> state.row_var["w"].shape, state.col_var["w"].shape, list(state.variance)
        (torch.Size([2, 1]), torch.Size([1, 3]), ['b'])
    """

    step: Tensor
    row_var: ParamDict
    col_var: ParamDict
    variance: ParamDict
    schedule: SlotState = ()


def _norm(x: Tensor) -> Tensor:
    """Return the 2-norm of all of `x`."""
    return cast(Tensor, x.norm(2))  # pyright: ignore[reportUnknownMemberType]  # torch leaves `dim`, `dtype` of its norms untyped


def _row_mean(g: Tensor) -> Tensor:
    """Return the mean square of each row of `g` (torch's `norm(dim=-1)**2 / n`)."""
    norm = cast(Tensor, torch.norm(g, dim=-1, keepdim=True))  # pyright: ignore[reportUnknownMemberType]  # torch leaves `dim`, `dtype` of its norms untyped
    return norm.square().div(g.size(-1))


def _col_mean(g: Tensor) -> Tensor:
    """Return the mean square of each column of `g`."""
    norm = cast(Tensor, torch.norm(g, dim=-2, keepdim=True))  # pyright: ignore[reportUnknownMemberType]  # torch leaves `dim`, `dtype` of its norms untyped
    return norm.square().div(g.size(-2))


def _square(g: Tensor) -> Tensor:
    """Return `g * g`."""
    return g * g


def _check_eps(instance: object, attribute: Any, value: Any) -> None:
    pair = cast("tuple[object, ...]", value if isinstance(value, tuple) else ())
    first_ok = len(pair) == 2 and (pair[0] is None or _is_number(pair[0]))
    if not (first_ok and _is_number(pair[1])):
        msg = (
            f"`{attribute.name}` must be a pair (eps1, eps2): None or a number, "
            f"then a number, got {value!r}."
        )
        raise TypeError(msg)
    for i, eps in enumerate(pair):
        if eps is not None and not 0 <= cast(float, eps) < math.inf:
            msg = f"`{attribute.name}[{i}]` must be finite and >= 0, got {eps!r}."
            raise ValueError(msg)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_beta2_decay(instance: object, attribute: Any, value: Any) -> None:
    check_number(instance, attribute, value)
    if not value <= 0:
        msg = f"`{attribute.name}` must be <= 0, got {value!r}."
        raise ValueError(msg)


def _check_d(instance: object, attribute: Any, value: Any) -> None:
    check_number(instance, attribute, value)
    if not 1 <= value < math.inf:
        msg = (
            f"`{attribute.name}` (the clipping threshold) must be >= 1, got {value!r}."
        )
        raise ValueError(msg)


def _check_foreach(instance: object, attribute: Any, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        msg = f"`{attribute.name}` must be None, True or False, got {value!r}."
        raise TypeError(msg)


def _row_shaped(p: Tensor) -> Tensor:
    return p[..., :1]


def _col_shaped(p: Tensor) -> Tensor:
    return p[..., :1, :]


def _check_not_empty(params: ParamDict) -> None:
    """Raise unless every entry has elements (torch's Adafactor divides by them)."""
    empty = sorted(k for k, v in params.items() if v.numel() == 0)
    if empty:
        msg = (
            f"`Adafactor` cannot update entries without elements; {empty!r} have "
            "none (their root mean square, by which the update is scaled, is "
            "0 / 0; torch.optim.Adafactor fails on them too). Leave them out with "
            "`.exclude(...)`."
        )
        raise ValueError(msg)


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class Adafactor(TorchOptimizer[AdafactorState]):
    """Adafactor, the functional `torch.optim.Adafactor`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adafactor`,
    so a run gives the same parameters: for each entry of two or more
    dimensions the second moment is the outer product of running row and
    column means (normalized by the mean row), else a running mean; the
    update `grad / sqrt(max(variance, eps1 ** 2))` is clipped to an RMS of at
    most `d`, and scaled by the entry's RMS (at least `eps2`) times
    `min(lr, 1 / sqrt(step))`. Weight decay is decoupled. torch reads its
    step-dependent scalars on the host (`.item()`); here they are
    double-precision tensors, and the final per-entry factor is read as the
    number torch uses in the default mode (a tensor under `torch.compile` and
    with `differentiable=True`). The attributes below are the constructor's
    keyword arguments, with `maximize` and `differentiable` (see
    `TorchOptimizer`).

    Attributes:
        lr: The learning rate (the cap of the relative step size), in any of
            its forms (a schedule too).
        beta2_decay: The exponent of the second-moment decay: the running
            means move by `step ** beta2_decay` each step; `<= 0`.
        eps: `(eps1, eps2)`: the least second moment (`None`: the machine
            epsilon of each entry's dtype) and the least parameter RMS.
        d: The clipping threshold of the update's RMS, `>= 1`.
        weight_decay: The decoupled weight decay, in any rate form.
        foreach: Accepted for torch.optim's signature; the foreach kernels are
            used wherever they exist.

    Raises:
        ValueError: If `beta2_decay` is positive, `d` below 1, an `eps` or a
            rate negative; the message names the argument.
        TypeError: If a hyperparameter is of the wrong kind (`eps` not a pair).

    Example:
        >>> from paramdict import optim
        >>> params = ParamDict(w=torch.ones(2, 2))
        >>> opt = optim.Adafactor(lr=0.1)
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.ones(2, 2)}, state)
        >>> params["w"]
        tensor([[0.9000, 0.9000],
                [0.9000, 0.9000]])
    """

    state_type: ClassVar[type[AdafactorState]] = AdafactorState

    lr: LearningRate = 1e-2
    beta2_decay: float = attrs.field(default=-0.8, validator=_check_beta2_decay)
    eps: tuple[float | None, float] = attrs.field(
        default=(None, 1e-3), validator=_check_eps
    )
    d: float = attrs.field(default=1.0, validator=_check_d)
    weight_decay: Rate = 0.0
    foreach: bool | None = attrs.field(default=None, validator=_check_foreach)

    @override
    def init_state(self, params: ParamDict, /) -> AdafactorState:
        """Return the first state: step 0 and zero second moments."""
        _check_not_empty(params)
        matrices = params.filter(lambda _, v: v.dim() > 1)
        vectors = params.filter(lambda _, v: v.dim() <= 1)
        return AdafactorState(
            self.counter(params),
            matrices.map(lambda v: torch.zeros_like(_row_shaped(v))),
            matrices.map(lambda v: torch.zeros_like(_col_shaped(v))),
            vectors.zeros_like(),
        )

    @override
    def check_state(self, params: ParamDict, state: AdafactorState, /) -> None:
        given: Any = cast(Any, state)  # checked here: annotations are promises
        if not isinstance(given, AdafactorState):
            msg = (
                "`Adafactor` needs a `AdafactorState` as its state, got "
                f"{type(state).__name__}. Use the state from this optimizer's `init`."
            )
            raise TypeError(msg)
        check_counter(given.step, params, "step")
        if "schedule" in given._fields:
            check_slot(self, self.lr, given.schedule)
        _check_not_empty(params)
        matrices = params.filter(lambda _, v: v.dim() > 1)
        templates = {
            "row_var": matrices.map(_row_shaped),
            "col_var": matrices.map(_col_shaped),
            "variance": params.filter(lambda _, v: v.dim() <= 1),
        }
        for field, template in templates.items():
            buffer = getattr(given, field)
            what = f"The state's `{field}`"
            if not isinstance(buffer, ParamDict):
                msg = f"{what} must be a ParamDict, got {type(buffer).__name__}."
                raise TypeError(msg)
            if set(buffer) != set(template):
                check_rate_keys(template, field, buffer)
            aligned = ParamDict((k, buffer[k]) for k in template)
            check_keyed(template, aligned, what=what)

    def _eps1(self, dtype: torch.dtype) -> float:
        eps1 = self.eps[0]
        return torch.finfo(dtype).eps if eps1 is None else eps1

    @override
    def update(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdafactorState,
        ops: Kernels,
        /,
    ) -> tuple[ParamDict, AdafactorState]:
        step = self.next_step(state)
        lr = self.rate("lr", step, state)
        if self.maximize:
            grads = ops.neg(grads)
        eps2, d = self.eps[1], self.d
        # torch's host scalars, as double-precision tensors from the step.
        weight = ops.scalar(step**self.beta2_decay)
        inverse_sqrt = torch.div(torch.ones_like(step), step**0.5)
        rho: dict[str, Tensor] = {}
        for key in params:
            rate: float | Tensor = lr[key] if isinstance(lr, ParamDict) else lr
            rate = rate.to(step.dtype) if isinstance(rate, Tensor) else rate
            rho[key] = (
                torch.minimum(rate, inverse_sqrt)
                if isinstance(rate, Tensor)
                else inverse_sqrt.clamp(max=rate)
            )
        alpha = {
            k: (_norm(p).to(step.dtype) / (p.numel() ** 0.5)).clamp(min=eps2) * rho[k]
            for k, p in params.items()
        }
        params = ops.decay(params, lr, self.rate("weight_decay", step))

        matrix_keys = tuple(k for k, v in grads.items() if v.dim() > 1)
        vector_keys = tuple(k for k, v in grads.items() if v.dim() <= 1)
        matrix_grads = ops.subset(grads, matrix_keys)
        # The gradients are read again below: borrowed, never consumed.
        row_mean = ops.apply(ops.borrowed(matrix_grads), _row_mean)
        row_var = ops.lerp(state.row_var, row_mean, weight)
        col_mean = ops.apply(ops.borrowed(matrix_grads), _col_mean)
        col_var = ops.lerp(state.col_var, col_mean, weight)

        # Each writes only into the tensor it made, as torch's in-place steps.
        def factored(r: Tensor, c: Tensor) -> Tensor:
            return (r @ c).div_(
                r.mean(dim=-2, keepdim=True).clamp(min=self._eps1(r.dtype))
            )

        def scaled(v: Tensor, g: Tensor) -> Tensor:
            inverse = v.clamp(min=self._eps1(v.dtype) ** 2).rsqrt_()
            # Recorded, autograd keeps `rsqrt`'s result for the backward pass.
            return inverse.mul(g) if torch.is_grad_enabled() else inverse.mul_(g)

        estimate = ops.apply(ops.borrowed(row_var), factored, col_var)
        vector_grads = ops.subset(grads, vector_keys)
        squared = ops.apply(ops.borrowed(vector_grads), _square)
        variance = ops.lerp(state.variance, squared, weight)

        estimates = {**estimate, **ops.borrowed(variance)}
        merged = params._derive([estimates[k] for k in params])
        update = ops.apply(merged, scaled, grads)
        scale: dict[str, float | Tensor] = {
            k: alpha[k]
            / (_norm(u).to(step.dtype) / ((u.numel() ** 0.5) * d)).clamp(min=1.0)
            for k, u in update.items()
        }
        new_params = ops.sub_scaled_by_key(params, update, scale)
        new_state = AdafactorState(
            step, row_var, col_var, variance, self.next_schedule(state)
        )
        return new_params, new_state
