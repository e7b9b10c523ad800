"""Adafactor: second moments factored into row and column averages for matrices."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, cast

import attrs
import torch
from torch import Tensor
from typing_extensions import override

from .._paramdict import ParamDict
from ._adafactor_factors import (
    alphas,
    device_alphas,
    device_scales,
    factor_form,
    host_alphas,
    host_scales,
    host_update,
    scales,
    small,
)
from ._fields import shared_last
from ._hyper import (
    Rate,
    check_counter,
    check_number,
    check_optional_flag,
    check_rate_keys,
    compute_dtype,
    is_int_or_float,
    is_traced,
)
from ._schedules.slot import LearningRate, check_slot
from ._states import AdafactorState
from ._torch_optimizer import TorchOptimizer
from ._validate import check_keyed

__all__ = ["Adafactor", "AdafactorState"]


def _mean_squares(grads: ParamDict, dim: int) -> ParamDict:
    """The mean square of each matrix along `dim` (torch's `norm(dim)**2 / n`).

    Each norm reduced in row-major order (its rounding), whatever the layout.
    """
    norms = grads.map(
        lambda g: cast(Tensor, torch.norm(g.contiguous(), dim=dim, keepdim=True))  # pyright: ignore[reportUnknownMemberType]  # torch leaves `dim`, `dtype` of its norms untyped
    )
    sizes = {k: g.size(dim) for k, g in grads.items()}
    return norms.mul(norms).div(sizes)


def _check_eps(instance: object, attribute: Any, value: Any) -> None:
    pair = cast("tuple[object, ...]", value if isinstance(value, tuple) else ())
    first_ok = len(pair) == 2 and (pair[0] is None or is_int_or_float(pair[0]))
    if not (first_ok and is_int_or_float(pair[1])):
        msg = (
            f"`{attribute.name}` must be a pair (eps1, eps2): None or a number, "
            f"then a number, got {value!r}."
        )
        raise TypeError(msg)
    for i, eps in enumerate(pair):
        if eps is not None and not 0 <= cast(float, eps) < math.inf:
            msg = f"`{attribute.name}[{i}]` must be finite and >= 0, got {eps!r}."
            raise ValueError(msg)


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


def _row_shaped(p: Tensor) -> Tensor:
    return p.narrow(-1, 0, min(1, p.size(-1)))  # `p[..., :1]`


def _col_shaped(p: Tensor) -> Tensor:
    return p.narrow(-2, 0, min(1, p.size(-2)))  # `p[..., :1, :]`


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


def _check_buffers(params: ParamDict, state: AdafactorState) -> None:
    """Raise unless every entry has elements and a buffer of its second moments."""
    if all(v.dim() <= 1 and v.numel() for v in params.values()):
        matrices, vectors = ParamDict(), params  # the common case, in one pass
    else:
        _check_not_empty(params)
        matrices = params.filter(lambda _, v: v.dim() > 1)
        vectors = params.filter(lambda _, v: v.dim() <= 1)
    for field, shaped, shape_of in (
        ("row_var", _row_shaped, _row_shape),
        ("col_var", _col_shaped, _col_shape),
    ):
        what = f"The state's `{field}`"
        values = matrices._aligned(_buffer(state, field, matrices), what=what)
        if not all(
            v.shape == shape_of(p.shape)
            and v.dtype == p.dtype
            and v.device == p.device
            and v.layout == torch.strided
            for v, p in zip(values, matrices.values())
        ):
            check_keyed(matrices.map(shaped), values, what=what)
    what = "The state's `variance`"
    values = vectors._aligned(_buffer(state, "variance", vectors), what=what)
    check_keyed(vectors, values, what=what)


def _buffer(state: AdafactorState, field: str, template: ParamDict) -> ParamDict:
    """Return the state's buffer `field`, checked to hold `template`'s keys."""
    buffer: object = getattr(state, field)
    if not isinstance(buffer, ParamDict):
        msg = f"The state's `{field}` must be a ParamDict, got {type(buffer).__name__}."
        raise TypeError(msg)
    if buffer.keys() != template.keys():
        check_rate_keys(template, field, buffer)
    return buffer


def _row_shape(shape: torch.Size) -> tuple[int, ...]:
    return (*shape[:-1], 1)


def _col_shape(shape: torch.Size) -> tuple[int, ...]:
    return (*shape[:-2], 1, shape[-1])


@attrs.frozen(kw_only=True, eq=False, field_transformer=shared_last)
class Adafactor(TorchOptimizer[AdafactorState]):
    """Adafactor, the functional `torch.optim.Adafactor`.

    Same hyperparameters, defaults and arithmetic as `torch.optim.Adafactor`,
    so a run gives the same parameters: for each entry of two or more
    dimensions the second moment is the outer product of running row and
    column means (normalized by the mean row), else a running mean; the
    update `grad / sqrt(max(variance, eps1 ** 2))` is clipped to an RMS of at
    most `d`, and scaled by the entry's RMS (at least `eps2`) times
    `min(lr, 1 / sqrt(step))` (from the parameters before their decay, as
    torch). Weight decay is decoupled. An eager CPU step computes these
    per-entry factors from host reads in Python numbers, as torch does; other
    steps in double-precision tensors, the same values (the last one rounded
    once more under `torch.compile` and with `differentiable=True`). The
    attributes below are the constructor's keyword arguments, with `maximize`
    and `differentiable` (see `TorchOptimizer`).

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
    lazy_copies: ClassVar[bool] = True
    decoupled_decay: ClassVar[bool] = True
    decays_in_math: ClassVar[bool] = True

    lr: LearningRate = 1e-2
    beta2_decay: float = attrs.field(default=-0.8, validator=_check_beta2_decay)
    eps: tuple[float | None, float] = attrs.field(
        default=(None, 1e-3), validator=_check_eps
    )
    d: float = attrs.field(default=1.0, validator=_check_d)
    weight_decay: Rate = 0.0
    foreach: bool | None = attrs.field(default=None, validator=check_optional_flag)

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
        _check_buffers(params, given)  # once while unchanged

    @override
    def _stand_ins(self, state: AdafactorState) -> ParamDict:
        """Each matrix's shape from its row and column moments; `variance`'s entries."""
        stand_ins = super()._stand_ins(state)
        cols: object = state.col_var
        if not isinstance(cols, ParamDict):
            return stand_ins
        out = dict(stand_ins.items())
        for k, row in stand_ins.items():
            col = cols.get(k)
            if (
                col is not None
                and row.dim() >= 2
                and col.dim() == row.dim()
                and row.shape[-1] == 1
                and col.shape[-2] == 1
                and row.shape[:-2] == col.shape[:-2]
            ):
                out[k] = row.expand(*row.shape[:-1], col.shape[-1])
        return ParamDict(out)

    def _eps1(self, dtype: torch.dtype) -> float:
        eps1 = self.eps[0]
        return torch.finfo(dtype).eps if eps1 is None else eps1

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdafactorState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        eps2 = self.eps[1]
        form = factor_form(self, params, grads, step, lr)
        # Recorded, the norms keep the parameters for the backward pass: read
        # from a copy, since the decay writes into them next.
        read = params.clone() if self.differentiable else params
        alpha: Mapping[str, float | Tensor]
        on_device: list[Tensor] = []
        if form == "host":
            alpha = host_alphas(read, lr, step, eps2)
        elif form == "device":
            on_device = device_alphas(read, lr, step, eps2)
            alpha = dict(zip(read.keys(), on_device))
        else:
            alpha = alphas(read, step, lr, eps2)
        self.decay_(params, step, lr)  # after the step size read the parameters
        estimates = self._moments(params, grads, state, step)
        merged = params._derive([estimates[k] for k in params])
        if form == "device" or (form == "host" and small(merged)):
            update = host_update(merged, grads, self._eps1)
        else:
            gvals = merged._aligned(grads, what="The gradients")
            update = merged._derive(
                [self._scaled(v, g) for v, g in zip(merged.values(), gvals)]
            )
        scale: Mapping[str, float | Tensor]
        if form == "host":
            scale = host_scales(update, alpha, self.d)
        elif form == "device":
            factors = device_scales(update, on_device, self.d)
            scale = dict(zip(update.keys(), factors))
        else:
            scale = scales(update, alpha, self.d, step.dtype)
        params.sub_(update, alpha=scale)

    def _moments(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: AdafactorState,
        step: Tensor,
    ) -> dict[str, Tensor]:
        """Update the second moments in place; return each entry's estimate."""
        power = step**self.beta2_decay
        dtype = compute_dtype(params)
        weight: float | Tensor = power.item() if dtype is None else power.to(dtype)
        if dtype is None and (is_traced(power) or torch.compiler.is_compiling()):
            weight = power
        matrix_keys: list[str] = []
        vector_keys: list[str] = []
        for key, g in grads.items():
            (matrix_keys if g.dim() > 1 else vector_keys).append(key)
        estimates: dict[str, Tensor] = {}
        if matrix_keys:
            matrix_grads = _subset(grads, matrix_keys)
            row_var = state.row_var.lerp_(_mean_squares(matrix_grads, -1), weight)
            col_var = state.col_var.lerp_(_mean_squares(matrix_grads, -2), weight)
            estimates.update(self._factored(row_var, col_var))
        if vector_keys:
            vector_grads = _subset(grads, vector_keys) if matrix_keys else grads
            variance = state.variance
            if torch.compiler.is_compiling():
                squares = vector_grads.map(lambda g: g * g)
            else:
                squares = vector_grads.mul(vector_grads)
            estimates.update(variance.lerp_(squares, weight))
        return estimates

    def _factored(self, row_var: ParamDict, col_var: ParamDict) -> ParamDict:
        """Return each matrix's estimate `r @ c / max(mean(r), eps1)` (new tensors)."""
        cols = row_var._aligned(col_var, what="The state's `col_var`")
        rows = row_var.values()
        products = row_var._derive([r @ c for r, c in zip(rows, cols)])
        means = row_var.map(lambda r: r.mean(dim=-2, keepdim=True))
        floors = {k: self._eps1(r.dtype) for k, r in row_var.items()}
        return products.div(means.clamp(min=floors))

    def _scaled(self, v: Tensor, g: Tensor) -> Tensor:
        """Return the unclipped update `g / sqrt(max(v, eps1 ** 2))`."""
        inverse = v.clamp(min=self._eps1(v.dtype) ** 2).rsqrt_()
        # Recorded, autograd keeps `rsqrt`'s result for the backward pass.
        return inverse.mul(g) if torch.is_grad_enabled() else inverse.mul_(g)


def _subset(x: ParamDict, keys: list[str]) -> ParamDict:
    return ParamDict._from_parts(tuple(keys), [x[k] for k in keys])
