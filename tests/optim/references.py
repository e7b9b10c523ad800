"""Plain-torch references for optimizers that torch.optim does not have.

Each optimizer is a pair of functions on lists of tensors: `*_init(params)` builds
the state and `*_step(params, grads, state, **hyperparameters)` returns the new
parameters and the new state, out of place (no argument is modified). The loops run
tensor by tensor with torch's elementwise operations, in the order the published
implementations use, so that float64 runs agree with them to rounding; each
function's docstring gives the algorithm, its defaults and the order of operations
that matters for rounding.

- Schedule-Free AdamW: Defazio et al. 2024, "The Road Less Scheduled"
  (`schedulefree.AdamWScheduleFree` and `AdamWScheduleFreePaper`).
- AdEMAMix: Pagliardini et al. 2024, "The AdEMAMix Optimizer: Better, Faster,
  Older" (the authors' PyTorch code; `pytorch_optimizer.AdEMAMix`).
- SOAP: Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo using Adam"
  (the authors' `soap.py`; `pytorch_optimizer.SOAP`).
- Adan: Xie et al. 2022, "Adan: Adaptive Nesterov Momentum Algorithm for Faster
  Optimizing Deep Models" (the authors' `adan.py`; `pytorch_optimizer.Adan`).
- MARS: Yuan et al. 2024, "MARS: Unleashing the Power of Variance Reduction for
  Training Large Models" (the authors' `mars.py`, approximate form;
  `pytorch_optimizer.MARS`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "AdEMAMixState",
    "AdanState",
    "MARSState",
    "SOAPState",
    "ScheduleFreeAdamWState",
    "adan_init",
    "adan_step",
    "ademamix_alpha",
    "ademamix_beta3",
    "ademamix_init",
    "ademamix_step",
    "mars_init",
    "mars_step",
    "merged_shape",
    "schedule_free_adamw_eval_point",
    "schedule_free_adamw_init",
    "schedule_free_adamw_step",
    "soap_init",
    "soap_step",
]


def _zeros(params: Sequence[Tensor]) -> list[Tensor]:
    return [torch.zeros_like(p) for p in params]


# --------------------------------------------------------------------------------------
# Schedule-Free AdamW


@dataclass(frozen=True)
class ScheduleFreeAdamWState:
    """Schedule-Free AdamW's state beside the gradient point y (the parameters).

    Attributes:
        step: Steps taken (k).
        z: The base sequence z, one tensor per parameter.
        exp_avg_sq: The second-moment average v.
        weight_sum: The sum of the averaging weights so far.
        lr_max: The largest scheduled learning rate so far (-1 before any step).
    """

    step: int
    z: list[Tensor]
    exp_avg_sq: list[Tensor]
    weight_sum: float
    lr_max: float


def schedule_free_adamw_init(params: Sequence[Tensor]) -> ScheduleFreeAdamWState:
    """Return the state before the first step: z = y = x, v = 0."""
    return ScheduleFreeAdamWState(
        step=0,
        z=[p.clone() for p in params],
        exp_avg_sq=_zeros(params),
        weight_sum=0.0,
        lr_max=-1.0,
    )


def schedule_free_adamw_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    state: ScheduleFreeAdamWState,
    *,
    lr: float = 0.0025,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    warmup_steps: int = 0,
    r: float = 0.0,
    weight_lr_power: float = 2.0,
    lr_bias_correction: bool = False,
) -> tuple[list[Tensor], ScheduleFreeAdamWState]:
    """One Schedule-Free AdamW step; `params` is y, where `grads` were taken.

    With k the steps taken before this one and g the gradient at y:

        lr_k   = lr * min(1, (k + 1) / warmup_steps)         (no warm-up at 0 steps)
        lr_max = max(lr_max, lr_k)
        w      = (k + 1) ** r * lr_max ** weight_lr_power
        c      = w / (sum of w so far)                       (0 while the sum is 0)
        v      = beta2 * v + (1 - beta2) * g * g
        u      = g / (sqrt(v / (1 - beta2 ** (k + 1))) + eps) + weight_decay * y
        y'     = (1 - c) * y + c * z + lr_k * (beta1 * (1 - c) - 1) * u
        z'     = z - lr_k * u

    This is the paper's primal-averaging iteration (z' = z - lr_k * u,
    x' = (1 - c) * x + c * z', y' = (1 - beta1) * z' + beta1 * x') rewritten on y, as
    `schedulefree.AdamWScheduleFree` stores it: x is not kept but recovered by
    `schedule_free_adamw_eval_point`. Weight decay is evaluated at y, before y moves.
    The weights use the largest learning rate so far, as the package does (the
    paper's use the current one: the same while the rate does not fall).
    With `lr_bias_correction=True` the bias correction moves into the learning rate,
    as in the paper's experiments (`AdamWScheduleFreePaper`): lr_k is multiplied by
    sqrt(1 - beta2 ** (k + 1)) (so it also enters lr_max and the weights) and the
    denominator is sqrt(v) + eps.

    Order of operations (float64 agreement with the package): v is scaled, then g * g
    added with `addcmul`; the denominator divides v by the correction, takes the root
    and adds eps; u divides g by it and adds `weight_decay * y` (`add` with alpha); y
    is `lerp`ed towards z by c, then gets u with alpha lr_k * (beta1 * (1 - c) - 1); z
    subtracts u with alpha lr_k.

    Defaults are the package's: lr 0.0025, betas (0.9, 0.999), eps 1e-8, no weight
    decay, no warm-up, r 0, weight_lr_power 2.
    """
    beta1, beta2 = betas
    k = state.step
    sched = (k + 1) / warmup_steps if k < warmup_steps else 1.0
    bias_correction2 = 1 - beta2 ** (k + 1)
    lr_k = lr * sched
    if lr_bias_correction:
        lr_k *= math.sqrt(bias_correction2)
    lr_max = max(lr_k, state.lr_max)
    weight = ((k + 1) ** r) * (lr_max**weight_lr_power)
    weight_sum = state.weight_sum + weight
    ckp1 = weight / weight_sum if weight_sum != 0 else 0.0
    y_coefficient = lr_k * (beta1 * (1 - ckp1) - 1)

    new_y: list[Tensor] = []
    new_z: list[Tensor] = []
    new_v: list[Tensor] = []
    for y, g, z, v in zip(params, grads, state.z, state.exp_avg_sq):
        v = torch.addcmul(v * beta2, g, g, value=1 - beta2)
        if lr_bias_correction:
            denom = v.sqrt() + eps
        else:
            denom = (v / bias_correction2).sqrt() + eps
        u = g / denom
        if weight_decay != 0:
            u = torch.add(u, y, alpha=weight_decay)
        y_next = torch.add(torch.lerp(y, z, ckp1), u, alpha=y_coefficient)
        new_y.append(y_next)
        new_z.append(torch.sub(z, u, alpha=lr_k))
        new_v.append(v)
    return new_y, ScheduleFreeAdamWState(
        step=k + 1, z=new_z, exp_avg_sq=new_v, weight_sum=weight_sum, lr_max=lr_max
    )


def schedule_free_adamw_eval_point(
    params: Sequence[Tensor],
    state: ScheduleFreeAdamWState,
    *,
    beta1: float = 0.9,
) -> list[Tensor]:
    """Return the averaged point x, where the model is evaluated, from y and z.

    y = (1 - beta1) * z + beta1 * x, so x = (y - (1 - beta1) * z) / beta1, computed
    as `lerp(y, z, 1 - 1 / beta1)` (the package's `eval()`, which moves the
    parameters there). Before the first step x = y = z.
    """
    return [torch.lerp(y, z, 1 - 1 / beta1) for y, z in zip(params, state.z)]


# --------------------------------------------------------------------------------------
# AdEMAMix


@dataclass(frozen=True)
class AdEMAMixState:
    """AdEMAMix's state: steps taken, the fast and slow averages and v."""

    step: int
    exp_avg_fast: list[Tensor]
    exp_avg_slow: list[Tensor]
    exp_avg_sq: list[Tensor]


def ademamix_init(params: Sequence[Tensor]) -> AdEMAMixState:
    """Return the state before the first step: every average zero."""
    return AdEMAMixState(0, _zeros(params), _zeros(params), _zeros(params))


def ademamix_alpha(step: int, alpha: float, warmup: float | None) -> float:
    """The slow average's weight at `step` (from 1): alpha * min(1, step / warmup)."""
    if warmup is None:
        return alpha
    return min(step * alpha / warmup, alpha)


def ademamix_beta3(
    step: int, beta1: float, beta3: float, warmup: float | None
) -> float:
    """The slow average's decay at `step` (from 1), rising from beta1 to beta3.

    The half-life ln(0.5) / ln(beta) grows linearly in the step, from beta1's at step
    0 to beta3's at `warmup`, then stays; in closed form
    beta3(t) = min(exp(ln(b1) ln(b3) / ((1 - t/T) ln(b3) + (t/T) ln(b1))), b3).
    (The authors' code interpolates the half-lives of beta + 1e-8, which moves
    beta3(t) by 1e-8 to 1e-7 during the warm-up.)
    """
    if warmup is None:
        return beta3
    log_beta1, log_beta3 = math.log(beta1), math.log(beta3)
    a = step / warmup
    return min(
        math.exp(log_beta1 * log_beta3 / ((1.0 - a) * log_beta3 + a * log_beta1)),
        beta3,
    )


def ademamix_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    state: AdEMAMixState,
    *,
    lr: float = 1e-3,
    betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
    alpha: float = 2.0,
    t_alpha_beta3: float | None = None,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
) -> tuple[list[Tensor], AdEMAMixState]:
    """One AdEMAMix step (the paper's Algorithm 1).

    With t the step count after this step (from 1) and g the gradient:

        alpha_t = ademamix_alpha(t, alpha, T),  beta3_t = ademamix_beta3(t, b1, b3, T)
        m1 = b1 * m1 + (1 - b1) * g                      (fast average)
        m2 = beta3_t * m2 + (1 - beta3_t) * g            (slow average, no correction)
        v  = b2 * v + (1 - b2) * g * g
        u  = (m1 / (1 - b1 ** t) + alpha_t * m2) / (sqrt(v) / sqrt(1 - b2 ** t) + eps)
        p  = p - lr * (u + weight_decay * p)             (decoupled decay, as AdamW)

    T is `t_alpha_beta3` (None: no warm-up, alpha and beta3 from the first step).

    Order of operations (the authors' code): each average is scaled, then gets its
    increment with `add(alpha=1 - beta)` (`addcmul` for v); the denominator is
    sqrt(v) divided by sqrt(1 - b2 ** t), plus eps; u is m1 / (1 - b1 ** t) plus
    alpha_t * m2, divided by the denominator, then gets `weight_decay * p` with
    `add(alpha=)`; the parameter adds -lr * u.

    Defaults are the authors' code's: lr 1e-3, betas (0.9, 0.999, 0.9999), alpha 2
    (the paper suggests 4 to 10 with beta3 0.9999), eps 1e-8, no weight decay, no
    warm-up.
    """
    beta1, beta2, beta3 = betas
    t = state.step + 1
    bias_correction1 = 1 - beta1**t
    bias_correction2 = 1 - beta2**t
    alpha_t = ademamix_alpha(t, alpha, t_alpha_beta3)
    beta3_t = ademamix_beta3(t, beta1, beta3, t_alpha_beta3)

    new_p: list[Tensor] = []
    fast: list[Tensor] = []
    slow: list[Tensor] = []
    sq: list[Tensor] = []
    for p, g, m1, m2, v in zip(
        params, grads, state.exp_avg_fast, state.exp_avg_slow, state.exp_avg_sq
    ):
        m1 = torch.add(m1 * beta1, g, alpha=1 - beta1)
        m2 = torch.add(m2 * beta3_t, g, alpha=1 - beta3_t)
        v = torch.addcmul(v * beta2, g, g, value=1 - beta2)
        denom = v.sqrt() / math.sqrt(bias_correction2) + eps
        u = (m1 / bias_correction1 + alpha_t * m2) / denom
        u = torch.add(u, p, alpha=weight_decay)
        new_p.append(p + -lr * u)
        fast.append(m1)
        slow.append(m2)
        sq.append(v)
    return new_p, AdEMAMixState(t, fast, slow, sq)


# --------------------------------------------------------------------------------------
# SOAP


@dataclass(frozen=True)
class SOAPState:
    """SOAP's state.

    Attributes:
        step: Adam steps taken; the first call only sets up the preconditioner.
        exp_avg: The gradient average m, in the parameter's own coordinates.
        exp_avg_sq: The squared-gradient average v, in the eigenbasis coordinates.
        gg: Per parameter, per dimension of its (merged) shape, the Kronecker factor
            (L, R, ... in the paper), or None for a dimension left unpreconditioned;
            None before the first call.
        q: The eigenbases of `gg`, laid out alike; None before the first call.
    """

    step: int
    exp_avg: list[Tensor]
    exp_avg_sq: list[Tensor]
    gg: list[list[Tensor | None]] | None
    q: list[list[Tensor | None]] | None


def soap_init(params: Sequence[Tensor]) -> SOAPState:
    """Return the state before the first call: zero averages, no preconditioner."""
    return SOAPState(0, _zeros(params), _zeros(params), None, None)


def merged_shape(shape: Sequence[int], max_precond_dim: int) -> list[int]:
    """Merge neighbouring dimensions while their product stays <= max_precond_dim.

    Left to right: a dimension joins the running product when the product stays
    within the bound; otherwise the running product (when above 1) is closed and the
    dimension starts a new one, or a dimension too large on its own stands alone.
    Dimensions of size 1 vanish into their neighbours. (4, 3) with bound 4 stays
    (4, 3); (2, 2, 3) becomes (4, 3); (4, 3) with bound 10000 becomes (12,).
    """
    merged: list[int] = []
    running = 1
    for size in shape:
        product = running * size
        if product > max_precond_dim:
            if running > 1:
                merged.append(running)
                running = size
            else:
                merged.append(size)
                running = 1
        else:
            running = product
    if running > 1 or not merged:
        merged.append(running)
    return merged


def _soap_shape(p: Tensor, merge_dims: bool, max_precond_dim: int) -> tuple[int, ...]:
    """The shape the preconditioner sees: merged, when asked, for 2 or more dims."""
    if merge_dims and p.dim() > 1:
        return tuple(merged_shape(p.shape, max_precond_dim))
    return tuple(p.shape)


def _soap_rotate(
    t: Tensor, q: Sequence[Tensor | None], shape: tuple[int, ...], *, back: bool
) -> Tensor:
    """Q_1^T ... Q_n^T applied mode by mode (back: Q_1 ... Q_n), in `shape`.

    Each step contracts the leading dimension and appends the result's dimension at
    the end (an unpreconditioned dimension is moved there unchanged), so after all
    modes the dimensions are back in order.
    """
    out = t.reshape(shape)
    for mat in q:
        if mat is None:
            out = out.permute([*range(1, out.dim()), 0])
        else:
            out = torch.tensordot(out, mat, dims=([0], [1 if back else 0]))
    return out.reshape(t.shape)


def _soap_factors(
    g: Tensor,
    gg: Sequence[Tensor | None],
    shape: tuple[int, ...],
    shampoo_beta: float,
) -> list[Tensor | None]:
    """Each factor lerped towards its mode's Gram matrix of g, by 1 - shampoo_beta."""
    grad = g.reshape(shape)
    out: list[Tensor | None] = []
    for idx, factor in enumerate(gg):
        if factor is None:
            out.append(None)
            continue
        if grad.dim() == 1:
            outer = grad.unsqueeze(1) @ grad.unsqueeze(0)
        else:
            others = [*chain(range(idx), range(idx + 1, grad.dim()))]
            outer = torch.tensordot(grad, grad, dims=(others, others))
        out.append(torch.lerp(factor, outer, 1 - shampoo_beta))
    return out


def _soap_eigh(m: Tensor, dtype: torch.dtype | None) -> Tensor:
    """Eigenvectors of m, largest eigenvalue first, computed in `dtype`."""
    work = m.to(dtype or m.dtype)
    eye = torch.eye(m.shape[0], dtype=work.dtype, device=m.device)
    _, vectors = torch.linalg.eigh(work + 1e-30 * eye)
    return torch.flip(vectors, [1]).to(m.dtype)


def soap_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    state: SOAPState,
    *,
    lr: float = 3e-3,
    betas: tuple[float, float] = (0.95, 0.95),
    shampoo_beta: float | None = None,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    precondition_frequency: int = 10,
    max_precond_dim: int = 10000,
    merge_dims: bool = False,
    precondition_1d: bool = False,
    normalize_grads: bool = False,
    correct_bias: bool = True,
    eigh_dtype: torch.dtype | None = None,
    qr_dtype: torch.dtype | None = None,
) -> tuple[list[Tensor], SOAPState]:
    """One SOAP step: Adam in the eigenbasis of Shampoo's Kronecker factors.

    A tensor's (merged, with `merge_dims`) shape d_1 x ... x d_n has one factor
    GG_i (d_i x d_i) per dimension with d_i <= max_precond_dim; other dimensions,
    and 1-D tensors unless `precondition_1d`, are left in their own coordinates.
    rot(X) contracts every preconditioned dimension i of X with Q_i (Q_i^T X along
    that dimension); rot_back contracts with Q_i^T.

    First call (no step is taken, the parameters are returned unchanged):
        GG_i = lerp(0, G_(i) G_(i)^T, 1 - b_s)      (G_(i): g unfolded along mode i)
        Q_i  = eigenvectors of GG_i, by decreasing eigenvalue

    Every later call, with t the Adam step count (from 1):
        m  = b1 * m + (1 - b1) * g                   (m in the parameter's coordinates)
        v  = b2 * v + (1 - b2) * rot(g) ** 2         (v in the eigenbasis)
        N  = rot_back(rot(m) / (sqrt(v) + eps))
        N  = N / (1e-30 + sqrt(mean(N ** 2)))        (normalize_grads only)
        p  = p - lr * sqrt(1 - b2 ** t) / (1 - b1 ** t) * N   (lr alone without
                                                               correct_bias)
        p  = p - lr * weight_decay * p               (decoupled, after the step)
        GG_i = lerp(GG_i, G_(i) G_(i)^T, 1 - b_s)
        every `precondition_frequency` steps (t % f == 0), one power iteration:
            order = argsort(diag(Q_i^T GG_i Q_i), descending); v permuted along
            dimension i by it; Q_i = QR(GG_i Q_i[:, order]).Q

    The factors are updated after the step, so the step never uses its own gradient
    in the basis. b_s is `shampoo_beta`, beta2 when None. m is kept in the parameter's
    coordinates, as in the paper's algorithm (the authors' later `soap.py` keeps it
    rotated and rotates it with each new basis, which is the same in exact
    arithmetic).

    Order of operations: m and v are scaled, then get their increments with
    `add(alpha=1 - beta)`; the step size is lr * sqrt(1 - b2 ** t) / (1 - b1 ** t),
    left to right; the parameter adds N with alpha -step size, then itself with
    alpha -lr * weight_decay; the factors are `lerp`ed from `tensordot` Gram matrices
    (for 1-D tensors, the outer product). The eigenvectors come from `eigh` of
    GG + 1e-30 I, flipped to decreasing order, and the QR is `torch.linalg.qr`'s;
    `eigh_dtype` and `qr_dtype` compute them in another dtype (the authors compute
    both in float32, `pytorch_optimizer` the QR only), None in the tensor's own.

    Defaults are the authors': lr 3e-3, betas (0.95, 0.95), shampoo_beta = beta2,
    eps 1e-8, weight decay 0.01, precondition_frequency 10, max_precond_dim 10000,
    no merging, no 1-D preconditioning, no normalization, bias correction on.
    """
    beta1, beta2 = betas
    b_s = beta2 if shampoo_beta is None else shampoo_beta
    shapes = [_soap_shape(p, merge_dims, max_precond_dim) for p in params]

    if state.gg is None or state.q is None:
        gg: list[list[Tensor | None]] = []
        for p, g, shape in zip(params, grads, shapes):
            if p.dim() == 1:
                keep = precondition_1d and p.shape[0] <= max_precond_dim
                modes = [p.shape[0] if keep else None]
            else:
                modes = [size if size <= max_precond_dim else None for size in shape]
            zeros: list[Tensor | None] = [
                None if n is None else torch.zeros(n, n, dtype=g.dtype, device=g.device)
                for n in modes
            ]
            gg.append(_soap_factors(g, zeros, shape, b_s))
        q = [[None if m is None else _soap_eigh(m, eigh_dtype) for m in f] for f in gg]
        return [p.clone() for p in params], SOAPState(
            0, list(state.exp_avg), list(state.exp_avg_sq), gg, q
        )

    t = state.step + 1
    step_size = lr
    if correct_bias:
        step_size = step_size * (1 - beta2**t) ** 0.5 / (1 - beta1**t)
    refresh = t % precondition_frequency == 0

    new_p: list[Tensor] = []
    new_m: list[Tensor] = []
    new_v: list[Tensor] = []
    new_gg: list[list[Tensor | None]] = []
    new_q: list[list[Tensor | None]] = []
    for p, g, m, v, gg_p, q_p, shape in zip(
        params, grads, state.exp_avg, state.exp_avg_sq, state.gg, state.q, shapes
    ):
        g_rot = _soap_rotate(g, q_p, shape, back=False)
        m = torch.add(m * beta1, g, alpha=1 - beta1)
        v = torch.add(v * beta2, g_rot.square(), alpha=1 - beta2)
        denom = v.sqrt() + eps
        m_rot = _soap_rotate(m, q_p, shape, back=False)
        direction = _soap_rotate(m_rot / denom, q_p, shape, back=True)
        if normalize_grads:
            direction = direction / (1e-30 + torch.mean(direction**2) ** 0.5)
        p = torch.add(p, direction, alpha=-step_size)
        if weight_decay > 0:
            p = torch.add(p, p, alpha=-lr * weight_decay)
        factors = _soap_factors(g, gg_p, shape, b_s)
        bases = list(q_p)
        if refresh:
            v_merged = v.reshape(shape)
            for idx, (factor, basis) in enumerate(zip(factors, bases)):
                if factor is None or basis is None:
                    continue
                estimate = torch.diag(basis.T @ factor @ basis)
                order = torch.argsort(estimate, descending=True)
                v_merged = v_merged.index_select(idx, order)
                power = factor @ basis[:, order]
                orthonormal, _ = torch.linalg.qr(power.to(qr_dtype or power.dtype))
                bases[idx] = orthonormal.to(power.dtype)
            v = v_merged.reshape(p.shape)
        new_p.append(p)
        new_m.append(m)
        new_v.append(v)
        new_gg.append(factors)
        new_q.append(bases)
    return new_p, SOAPState(t, new_m, new_v, new_gg, new_q)


# --------------------------------------------------------------------------------------
# Adan


@dataclass(frozen=True)
class AdanState:
    """Adan's state: steps taken, the three averages and the previous gradient."""

    step: int
    exp_avg: list[Tensor]
    exp_avg_diff: list[Tensor]
    exp_avg_sq: list[Tensor]
    prev_grad: list[Tensor] | None


def adan_init(params: Sequence[Tensor]) -> AdanState:
    """Return the state before the first step: zero averages, no previous gradient."""
    return AdanState(0, _zeros(params), _zeros(params), _zeros(params), None)


def adan_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    state: AdanState,
    *,
    lr: float = 1e-3,
    betas: tuple[float, float, float] = (0.98, 0.92, 0.99),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    no_prox: bool = False,
) -> tuple[list[Tensor], AdanState]:
    """One Adan step (the paper's Algorithm 1 with bias correction).

    The betas weigh the old average, as in the authors' code (the paper's beta_i are
    1 - these). With t the step count after this step (from 1), g the gradient and
    g_prev the previous one (g itself at the first step, so the difference starts
    at 0):

        d  = g - g_prev
        m  = b1 * m + (1 - b1) * g
        dm = b2 * dm + (1 - b2) * d
        w  = g + b2 * d                                   (Nesterov-corrected gradient)
        n  = b3 * n + (1 - b3) * w * w
        D  = sqrt(n) / sqrt(1 - b3 ** t) + eps
        p  = p - lr / (1 - b1 ** t) * m / D - lr * b2 / (1 - b2 ** t) * dm / D
        p  = p / (1 + lr * weight_decay)                  (proximal decay, default)

    With `no_prox` the decay is decoupled instead and comes first:
    p = p * (1 - lr * weight_decay), then the two updates.

    Order of operations (the authors' code): each average is scaled, then gets its
    increment with `add(alpha=1 - beta)` (`addcmul` for n); w is d scaled by b2 plus
    g; the parameter gets two `addcdiv`s, m's then dm's, with values
    -lr / (1 - b1 ** t) and -(lr * b2 / (1 - b2 ** t)).

    Defaults are the authors': lr 1e-3, betas (0.98, 0.92, 0.99), eps 1e-8, no
    weight decay, proximal decay. (The authors' optional global gradient clipping,
    `max_grad_norm`, is not part of this reference.)
    """
    beta1, beta2, beta3 = betas
    t = state.step + 1
    bias_correction1 = 1 - beta1**t
    bias_correction2 = 1 - beta2**t
    bias_correction3_sqrt = math.sqrt(1 - beta3**t)
    step_size = lr / bias_correction1
    step_size_diff = lr * beta2 / bias_correction2
    previous = list(grads) if state.prev_grad is None else state.prev_grad

    new_p: list[Tensor] = []
    ms: list[Tensor] = []
    dms: list[Tensor] = []
    ns: list[Tensor] = []
    for p, g, g_prev, m, dm, n in zip(
        params, grads, previous, state.exp_avg, state.exp_avg_diff, state.exp_avg_sq
    ):
        diff = g - g_prev
        m = torch.add(m * beta1, g, alpha=1 - beta1)
        dm = torch.add(dm * beta2, diff, alpha=1 - beta2)
        w = diff * beta2 + g
        n = torch.addcmul(n * beta3, w, w, value=1 - beta3)
        denom = n.sqrt() / bias_correction3_sqrt + eps
        if no_prox:
            p = p * (1 - lr * weight_decay)
        p = torch.addcdiv(p, m, denom, value=-step_size)
        p = torch.addcdiv(p, dm, denom, value=-step_size_diff)
        if not no_prox:
            p = p / (1 + lr * weight_decay)
        new_p.append(p)
        ms.append(m)
        dms.append(dm)
        ns.append(n)
    return new_p, AdanState(t, ms, dms, ns, [g.clone() for g in grads])


# --------------------------------------------------------------------------------------
# MARS


@dataclass(frozen=True)
class MARSState:
    """MARS's state: steps taken, the averages and the previous gradient (0 first)."""

    step: int
    exp_avg: list[Tensor]
    exp_avg_sq: list[Tensor]
    last_grad: list[Tensor]


def mars_init(params: Sequence[Tensor]) -> MARSState:
    """Return the state before the first step: everything zero."""
    return MARSState(0, _zeros(params), _zeros(params), _zeros(params))


def mars_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    state: MARSState,
    *,
    lr: float = 3e-3,
    betas: tuple[float, float] = (0.95, 0.99),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    gamma: float = 0.025,
    mars_type: Literal["adamw", "lion"] = "adamw",
    optimize_1d: bool = False,
    lr_1d: float = 3e-3,
    betas_1d: tuple[float, float] = (0.9, 0.95),
    weight_decay_1d: float = 0.1,
) -> tuple[list[Tensor], MARSState]:
    """One MARS step, in its approximate form.

    The previous gradient stands in for the gradient of the current batch at the
    previous point. Matrices (exactly 2 dimensions; every tensor with
    `optimize_1d`), with t the step count after this step (from 1), g the gradient
    and g_prev the previous one (0 at the first step):

        c = g + gamma * b1 / (1 - b1) * (g - g_prev)      (variance-reduced gradient)
        c = c / ||c||                                      (only when ||c|| > 1)
        m = b1 * m + (1 - b1) * c
        adamw:  v = b2 * v + (1 - b2) * c * c
                D = (sqrt(v) / sqrt(1 - b2 ** t) + eps) * (1 - b1 ** t)
                p = p - lr * (weight_decay * p + m / D)
        lion:   p = p - lr * (weight_decay * p + sign(m))

    Other tensors take AdamW on g with `betas_1d`, `weight_decay_1d` and learning rate
    lr * (lr_1d / lr) (the authors fix the ratio lr_1d / lr, so a scheduled lr scales
    both): the `adamw` lines with c = g.

    Order of operations (the authors' code): c is (g - g_prev) times
    gamma * (b1 / (1 - b1)), plus g; the averages are scaled, then get their increments
    with `add(alpha=1 - beta)` (`addcmul` for v); the denominator is sqrt(v) times
    1 / sqrt(1 - b2 ** t), plus eps, times 1 - b1 ** t; the update is
    -lr * (p * weight_decay + m / denominator), added to p.

    Defaults are the authors': lr 3e-3, betas (0.95, 0.99), eps 1e-8, no weight decay
    on matrices, gamma 0.025, `adamw`, other tensors with AdamW (lr 3e-3,
    betas (0.9, 0.95), weight decay 0.1).
    """
    beta1, beta2 = betas
    beta1_1d, beta2_1d = betas_1d
    t = state.step + 1
    lr_1d_factor = lr_1d / lr

    new_p: list[Tensor] = []
    ms: list[Tensor] = []
    vs: list[Tensor] = []
    for p, g, g_prev, m, v in zip(
        params, grads, state.last_grad, state.exp_avg, state.exp_avg_sq
    ):
        if optimize_1d or p.dim() == 2:
            c = (g - g_prev) * (gamma * (beta1 / (1.0 - beta1))) + g
            c_norm = torch.norm(c)
            if c_norm > 1.0:
                c = c / c_norm
            m = torch.add(m * beta1, c, alpha=1.0 - beta1)
            if mars_type == "adamw":
                v = torch.addcmul(v * beta2, c, c, value=1.0 - beta2)
                denom = (v.sqrt() * (1 / math.sqrt(1.0 - beta2**t)) + eps) * (
                    1.0 - beta1**t
                )
                update = -lr * (p * weight_decay + m / denom)
            else:
                update = -lr * (p * weight_decay + m.sign())
        else:
            m = torch.add(m * beta1_1d, g, alpha=1.0 - beta1_1d)
            v = torch.addcmul(v * beta2_1d, g, g, value=1.0 - beta2_1d)
            denom = (v.sqrt() * (1 / math.sqrt(1.0 - beta2_1d**t)) + eps) * (
                1.0 - beta1_1d**t
            )
            update = -lr * lr_1d_factor * (p * weight_decay_1d + m / denom)
        new_p.append(p + update)
        ms.append(m)
        vs.append(v)
    return new_p, MARSState(t, ms, vs, [g.clone() for g in grads])
