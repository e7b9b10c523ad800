"""SOAP: Adam in the eigenbasis of Shampoo's preconditioner.

Vyas et al., 2024, "SOAP: Improving and Stabilizing Shampoo using Adam".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

import attrs
import torch
from torch import Tensor
from typing_extensions import override

# The public names only (`paramdict.optim.*`), from the modules defining them.
from .._paramdict import ParamDict
from . import fields
from ._hyper import Rate, check_count, check_optional_number
from ._schedules.slot import LearningRate
from ._states import SOAPState
from ._torch_optimizer import TorchOptimizer

__all__ = ["SOAP", "SOAPState"]

_Phase = bool | Tensor
"""A decision of the step: a bool read on the host, or a 0-dim bool tensor."""


def _check_dtype(instance: object, attribute: Any, value: Any) -> None:
    """Raise unless `value` is None or a floating-point dtype, naming the option."""
    if value is not None and not (
        isinstance(value, torch.dtype) and value.is_floating_point
    ):
        msg = f"`{attribute.name}` must be None or a floating dtype, got {value!r}."
        raise TypeError(msg)


def merged(shape: Sequence[int], bound: int) -> tuple[int, ...]:
    """Merge neighbouring dimensions while their product stays within `bound`.

    Left to right, as the authors' `merge_dims`; dimensions of size 1 vanish.

    Example:
        >>> merged((2, 2, 3), 4), merged((64, 3, 3, 3), 100), merged((4, 3), 10000)
        ((4, 3), (64, 27), (12,))
    """
    out: list[int] = []
    running = 1
    for size in shape:
        if running * size <= bound:
            running *= size
        elif running > 1:
            out.append(running)
            running = size
        else:
            out.append(size)
    if running > 1 or not out:
        out.append(running)
    return tuple(out)


# torch's stubs leave these untyped (and `tensordot`'s `dims` an int only).
_tensordot = cast("Callable[..., Tensor]", torch.tensordot)  # pyright: ignore[reportUnknownMemberType]
_eigh = cast("Callable[[Tensor], tuple[Tensor, Tensor]]", torch.linalg.eigh)  # pyright: ignore[reportUnknownMemberType]
_qr = cast("Callable[[Tensor], tuple[Tensor, Tensor]]", torch.linalg.qr)  # pyright: ignore[reportUnknownMemberType]


def _rotate(
    value: Tensor, bases: Sequence[Tensor | None], shape: tuple[int, ...], back: bool
) -> Tensor:
    """`value` with each preconditioned dimension `i` in `Q_i`'s basis (`back`: out).

    Each contraction (or permutation) moves its dimension last: they end in order.
    """
    out = value.reshape(shape)
    for basis in bases:
        if basis is None:
            out = out.permute([*range(1, out.dim()), 0])
        else:
            out = _tensordot(out, basis, dims=([0], [1 if back else 0]))
    return out.reshape(value.shape)


def _gram(grad: Tensor, shape: tuple[int, ...], dim: int) -> Tensor:
    """The gradient's Gram matrix along dimension `dim` of `shape`."""
    folded = grad.reshape(shape)
    if folded.dim() == 1:
        return folded.unsqueeze(1) @ folded.unsqueeze(0)
    others = [i for i in range(folded.dim()) if i != dim]
    return _tensordot(folded, folded, dims=(others, others))


def _select(when: _Phase, new: Tensor, old: Tensor) -> Tensor:
    """`new` where `when` holds, else `old`: a host decision is taken already."""
    if isinstance(when, bool):
        return new
    return torch.where(when, new, old)


@attrs.frozen(kw_only=True, eq=False, field_transformer=fields.shared_last)
class SOAP(TorchOptimizer[SOAPState]):
    """SOAP: Adam's update in the eigenbasis of Shampoo's Kronecker factors.

    The algorithm of Vyas et al., 2024 ("SOAP: Improving and Stabilizing
    Shampoo using Adam"), with the options and defaults of the authors' code.
    An entry of shape `d_1 x ... x d_n` (merged with `merge_dims`) keeps one
    factor `GG_i` (`d_i x d_i`) per dimension with `d_i <= max_precond_dim`;
    other dimensions, and vectors unless `precondition_1d`, stay in their own
    coordinates. `rot(X)` takes every preconditioned dimension of `X` into the
    eigenbasis `Q_i` of its factor, `rot_back` out of it. With `g` the
    gradient and `t` Adam's step number:

        m  = b1 * m + (1 - b1) * g                  (own coordinates)
        v  = b2 * v + (1 - b2) * rot(g) ** 2        (eigenbasis coordinates)
        N  = rot_back(rot(m) / (sqrt(v) + eps))     (/ its RMS: normalize_grads)
        p  = p - lr * sqrt(1 - b2 ** t) / (1 - b1 ** t) * N
        p  = p * (1 - lr * weight_decay)
        GG_i = lerp(GG_i, G_(i) G_(i)^T, 1 - shampoo_beta)

    and every `precondition_frequency` steps one power iteration refreshes
    each basis (`Q_i = QR(GG_i Q_i)`, its columns and `v` ordered by the
    estimated eigenvalues). The first call only builds the factors from its
    gradient and their eigenbases (`eigh`), and leaves the parameters and
    moments as they are, as the authors' code does: Adam's `t` is the call
    count minus one. `m` is kept in the parameters' coordinates, as in the
    paper's algorithm (the authors' later code keeps it rotated, the same in
    exact arithmetic). The factors and bases are in the state (`gg`, `q`), so
    it saves and loads with the rest.

    An eager step reads its call count on the host and computes the
    eigendecomposition or the QR only on the calls that take them; compiled or
    under a `torch.func` transform every call computes both and selects with
    `where` (worth it for small factors only). With `differentiable=True` the
    gradients flow through `eigh` and `qr`, unstable where eigenvalues repeat.

    Attributes:
        lr: The learning rate: a number, a 0-dim tensor, a per-key ParamDict,
            or a schedule.
        betas: Adam's `beta1` and `beta2`.
        shampoo_beta: The decay of the factors (None: `beta2`).
        eps: Term added to the denominator.
        weight_decay: The decoupled weight decay, after the update.
        precondition_frequency: Steps between the refreshes of the bases.
        max_precond_dim: The largest dimension preconditioned.
        merge_dims: Merge neighbouring dimensions of entries of 2 or more
            dimensions while their product stays within `max_precond_dim`.
        precondition_1d: Precondition vectors too (one factor each).
        normalize_grads: Divide each entry's update by its root mean square.
        correct_bias: Adam's bias correction of the step size.
        eigh_dtype: The dtype of the first eigendecompositions (None: the
            entry's; the authors' code uses float32).
        qr_dtype: The dtype of the refreshes' QR (None: the entry's; the
            authors' code and `pytorch_optimizer` use float32).
        maximize: Maximize the objective instead of minimizing it.
        differentiable: Keep the autograd graph through `step`.

    Example:
        >>> from paramdict import optim
        >>> opt = optim.SOAP(lr=0.1)
        >>> params = ParamDict(w=torch.tensor([[1.0, -1.0]]))
        >>> state = opt.init(params)
        >>> params, state = opt.step(params, {"w": torch.tensor([[3.0, -3.0]])}, state)
        >>> params["w"]  # the first call builds the preconditioner only
        tensor([[ 1., -1.]])
        >>> params, state = opt.step(params, {"w": torch.tensor([[1.0, -2.0]])}, state)
        >>> params["w"]
        tensor([[ 0.9990, -0.8577]])
    """

    state_type: ClassVar[type[SOAPState]] = SOAPState
    own_fields: ClassVar[tuple[str, ...]] = ("gg", "q")
    decoupled_decay: ClassVar[bool] = True
    decays_in_math: ClassVar[bool] = True  # after the update, from the 2nd call
    # Not `lazy_copies`: the bases and the rotated second moment are written per
    # entry (`basis.copy_`), into tensors taken out of their ParamDicts.

    lr: LearningRate = 3e-3
    betas: tuple[float, float] = fields.betas((0.95, 0.95))
    shampoo_beta: float | None = attrs.field(
        default=None, validator=check_optional_number(lambda b: 0 <= b < 1, "in [0, 1)")
    )
    eps: float = fields.non_negative(1e-8)
    weight_decay: Rate = 0.01
    precondition_frequency: int = attrs.field(default=10, validator=check_count)
    max_precond_dim: int = attrs.field(default=10000, validator=check_count)
    merge_dims: bool = fields.flag()
    precondition_1d: bool = fields.flag()
    normalize_grads: bool = fields.flag()
    correct_bias: bool = fields.flag(True)
    eigh_dtype: torch.dtype | None = attrs.field(default=None, validator=_check_dtype)
    qr_dtype: torch.dtype | None = attrs.field(default=None, validator=_check_dtype)

    # ------------------------------------------------------------ layout

    def layout(self, value: Tensor, /) -> tuple[tuple[int, ...], list[int | None]]:
        """Return the shape the preconditioner sees and each dimension's factor size.

        Args:
            value: A parameter.

        Returns:
            `(shape, sizes)`: the shape (merged with `merge_dims`), and for each
            of its dimensions the size of its factor, or None where it is not
            preconditioned.

        Example:
            >>> from paramdict import optim
            >>> optim.SOAP(max_precond_dim=4).layout(torch.ones(3, 5))
            ((3, 5), [3, None])
        """
        bound = self.max_precond_dim
        if value.dim() == 1:
            keep = self.precondition_1d and value.shape[0] <= bound
            return tuple(value.shape), [value.shape[0] if keep else None]
        shape = (
            merged(value.shape, bound)
            if self.merge_dims and value.dim() > 1
            else tuple(value.shape)
        )
        return shape, [size if size <= bound else None for size in shape]

    def _bases(self, state: SOAPState, key: str, sizes: list[int | None]) -> list[Any]:
        """`key`'s basis per dimension (None: none), copies if recorded."""
        found = [None if n is None else state.q[i][key] for i, n in enumerate(sizes)]
        if self.differentiable:
            return [None if q is None else q.clone() for q in found]
        return found

    def init_state(self, params: ParamDict, /) -> SOAPState:
        """Return zero moments, factors and bases; the first step fills `gg` and `q`."""
        layouts = {k: self.layout(v)[1] for k, v in params.items()}
        dims = max([0, *(len(sizes) for sizes in layouts.values())])

        def factors() -> tuple[ParamDict, ...]:
            return tuple(
                ParamDict(
                    {
                        k: v.new_zeros(size, size)
                        for k, v in params.items()
                        for size in layouts[k][i : i + 1]
                        if size is not None
                    }
                ).detach()
                for i in range(dims)
            )

        return SOAPState(
            self.counter(params),
            params.zeros_like(),
            params.zeros_like(),
            factors(),
            factors(),
        )

    @override
    def check_state(self, params: ParamDict, state: SOAPState, /) -> None:
        """Also check the factors and bases: per dimension, square of its size."""
        super().check_state(params, state)
        probe = self.init_state(
            ParamDict(
                {k: torch.empty_like(v, device="meta") for k, v in params.items()}
            )
        )
        for name in self.own_fields:
            field: object = getattr(state, name)
            given = cast(
                "tuple[object, ...]", field if isinstance(field, tuple) else ()
            )
            wanted: tuple[ParamDict, ...] = getattr(probe, name)
            fits = (
                isinstance(field, tuple)
                and len(given) == len(wanted)
                and all(
                    isinstance(have, ParamDict)
                    and list(have) == list(want)
                    and all(
                        have[k].shape == want[k].shape
                        and have[k].dtype == params[k].dtype
                        for k in want
                    )
                    for have, want in zip(given, wanted)
                )
            )
            if not fits:
                msg = (
                    f"The state's `{name}` does not fit these parameters and "
                    "options (one ParamDict per dimension, a square matrix for "
                    "each entry preconditioned there: see `SOAP.layout`). Build "
                    "the state with `init` on these parameters."
                )
                raise ValueError(msg)

    # ------------------------------------------------------------ the rule

    @staticmethod
    def _phase(step: Tensor, frequency: int) -> tuple[_Phase, _Phase]:
        """Whether this call is the first, and whether it refreshes the bases.

        Read on the host where that is free, else 0-dim bool tensors.
        """
        if step.is_cpu and not torch.compiler.is_compiling():
            try:
                calls = int(step.item())
            except RuntimeError:  # a `torch.func` transform: not readable
                pass
            else:
                return calls == 1, calls > 1 and (calls - 1) % frequency == 0
        adam_steps = step - 1
        refresh = (adam_steps > 0) & (torch.remainder(adam_steps, frequency) == 0)
        return step == 1, refresh

    def _step_size(
        self, betas: tuple[Any, float], step: Tensor, lr: Rate, first: _Phase
    ) -> Rate:
        """Adam's step size (bias-corrected); 0 on the first call when traced."""
        beta1, beta2 = betas
        if not self.correct_bias and isinstance(first, bool):
            return lr
        if isinstance(first, bool):
            t = int(step.item()) - 1
            size: Rate = lr * (1 - beta2**t) ** 0.5 / (1 - beta1**t)
            return size
        factor = (~first).to(step.dtype)
        if self.correct_bias:
            adam_step = torch.clamp(step - 1, min=1)
            bias2 = 1 - torch.pow(beta2, adam_step)
            factor = factor * bias2.sqrt() / (1 - torch.pow(beta1, adam_step))
        return lr * factor

    @override
    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: SOAPState,
        step: Tensor,
        lr: Rate,
        /,
    ) -> None:
        betas: tuple[Any, float] = self.cycled("betas", state)
        shampoo_beta = betas[1] if self.shampoo_beta is None else self.shampoo_beta
        first, refresh = self._phase(step, self.precondition_frequency)
        layouts = {k: self.layout(v) for k, v in params.items()}
        if first is not True:
            self._adam(params, grads, state, (step, lr, first), betas, layouts)
        for i, factors in enumerate(state.gg):
            grams = ParamDict({k: _gram(grads[k], layouts[k][0], i) for k in factors})
            factors.lerp_(grams, 1 - shampoo_beta)
        if first is True or not isinstance(first, bool):
            self._eigenbases(state, first)
        if refresh is not False:
            self._power_iteration(state, layouts, refresh)

    def _adam(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: SOAPState,
        call: tuple[Tensor, Rate, _Phase],
        betas: tuple[Any, float],
        layouts: dict[str, tuple[tuple[int, ...], list[int | None]]],
    ) -> None:
        """Adam's step in the eigenbasis (masked to nothing on a traced 1st call)."""
        step, lr, first = call
        beta1, beta2 = betas
        bases = {k: self._bases(state, k, sizes) for k, (_, sizes) in layouts.items()}

        def rotated(values: ParamDict, back: bool = False) -> ParamDict:
            return ParamDict(
                {
                    k: _rotate(v, bases[k], layouts[k][0], back)
                    for k, v in values.items()
                }
            )

        turned = rotated(grads)
        weight1: float | Tensor = 1 - beta1
        weight2: float | Tensor = 1 - beta2
        if not isinstance(first, bool):  # the first call leaves the moments be
            zero = torch.zeros_like(step)
            weight1 = torch.where(first, zero, weight1)
            weight2 = torch.where(first, zero, weight2)
        # `lerp_` rather than the paper's scale-and-add: the same averages to
        # rounding, one pass instead of two (as `pytorch_optimizer` computes them).
        state.exp_avg.lerp_(grads, weight1)
        state.exp_avg_sq.lerp_(turned.mul(turned), weight2)
        denom = state.exp_avg_sq.sqrt()
        # Recorded, the root's result is saved for the backward pass.
        denom = denom.add(self.eps) if self.differentiable else denom.add_(self.eps)
        # Out of place: a rotation without a basis is a view of its argument.
        direction = rotated(rotated(state.exp_avg).div(denom), back=True)
        if self.normalize_grads:
            direction = ParamDict(
                {k: d / (1e-30 + torch.mean(d**2) ** 0.5) for k, d in direction.items()}
            )
        params.add_(direction, alpha=-self._step_size(betas, step, lr, first))
        if not isinstance(first, bool):  # no decay on the first call
            lr = lr * (~first).to(step.dtype)
        self.decay_(params, step, lr)

    def _eigenbases(self, state: SOAPState, first: _Phase) -> None:
        """The bases of the first call: each factor's eigenvectors, largest first."""
        for factors, bases in zip(state.gg, state.q):
            for k, factor in factors.items():
                dtype = self.eigh_dtype or factor.dtype
                work = factor.to(dtype)
                eye = torch.eye(factor.shape[0], dtype=dtype, device=factor.device)
                _, vectors = _eigh(work + 1e-30 * eye)
                vectors = torch.flip(vectors, [1]).to(factor.dtype)
                bases[k].copy_(_select(first, vectors, bases[k]))

    def _power_iteration(
        self,
        state: SOAPState,
        layouts: dict[str, tuple[tuple[int, ...], list[int | None]]],
        refresh: _Phase,
    ) -> None:
        """One power iteration per basis, its columns and `v` sorted by eigenvalue."""
        for k, (shape, sizes) in layouts.items():
            if all(size is None for size in sizes):
                continue
            second = state.exp_avg_sq[k]
            folded = second.reshape(shape)
            for i, size in enumerate(sizes):
                if size is None:
                    continue
                factor, basis = state.gg[i][k], state.q[i][k]
                # Recorded, the products save the basis, which is written below.
                now = basis.clone() if self.differentiable else basis
                estimate = torch.diag(now.T @ factor @ now)
                order = torch.argsort(estimate, descending=True)
                if not isinstance(refresh, bool):
                    kept = torch.arange(size, device=order.device)
                    order = torch.where(refresh, order, kept)
                folded = folded.index_select(i, order)
                power = factor @ now[:, order]
                dtype = self.qr_dtype or power.dtype
                orthonormal, _ = _qr(power.to(dtype))
                orthonormal = orthonormal.to(power.dtype)
                basis.copy_(_select(refresh, orthonormal, basis))
            second.copy_(folded.reshape(second.shape))
