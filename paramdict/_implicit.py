"""Implicit meta-gradients: adapted params that autograd treats as an exact solution.

`implicit_proximal(adapted, params, loss=..., lam=...)` and
`implicit_root(adapted, params, optimality=...)` return `adapted`'s values, joined to
`params` in the autograd graph by a `torch.autograd.Function` whose backward applies
the implicit function theorem: if `adapted` solves `F(phi, theta) = 0`, then
`d phi / d theta = -(dF/dphi)^-1 dF/dtheta`, so the gradient reaching `params` is
`-(dF/dtheta)^T w` with `(dF/dphi)^T w = g`, `g` the gradient arriving at `adapted`.
`w` is found by `cg` with Hessian-vector (or vector-Jacobian) products. Nothing of
the inner loop that produced `adapted` is kept, so memory does not grow with the
number of inner steps (iMAML, Rajeswaran et al., 2019).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

from ._container import key_mismatch_message
from ._paramdict import ParamDict
from ._product_checks import (
    aligned,
    check_callable,
    check_floating,
    check_paramdict,
    evaluate,
    filled,
    grad_or_none,
    leaves,
)
from ._products import (
    HessianOperator,
)
from ._solve import CGInfo, cg, check_real

__all__ = ["implicit_proximal", "implicit_root"]

P = TypeVar("P", bound=ParamDict)

OnSolve = Callable[[CGInfo], object]


_SECOND_ORDER = (
    "`{what}`'s meta-gradient carries no graph: the implicit function theorem "
    "gives the first derivative only, so it cannot be differentiated again (with "
    "`allow_unused=True` the answer would be zeros, which is wrong). Take second "
    "derivatives through the unrolled inner loop instead, or use the meta-gradient "
    "without differentiating it."
)


class _NoSecondOrder(torch.autograd.Function):
    """Return a copy of `value` whose backward raises: no second derivative.

    What `once_differentiable` does, and also where no gradient reaching the
    implicit backward requires grad: the result still depends on `params`, and
    a second pass must not silently skip it.
    """

    @staticmethod
    def forward(ctx: Any, what: str, value: Tensor, *anchors: Tensor) -> Tensor:
        ctx.what = what
        return value.clone()

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:  # pyright: ignore[reportIncompatibleMethodOverride]  # torch's stub takes `*grad_outputs: Any`
        msg = _SECOND_ORDER.format(what=ctx.what)
        raise ValueError(msg)


class _Implicit(torch.autograd.Function):
    """Return fixed values whose backward is a given function of the output grads."""

    @staticmethod
    def forward(
        ctx: Any,
        backward: Callable[[tuple[Tensor, ...]], list[Tensor]],
        what: str,
        outputs: list[Tensor],
        *inputs: Tensor,
    ) -> tuple[Tensor, ...]:
        ctx.implicit_backward = backward
        ctx.what = what
        ctx.save_for_backward(*inputs)
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:  # pyright: ignore[reportIncompatibleMethodOverride]  # torch's stub takes `*grad_outputs: Any`
        with torch.no_grad():
            found: list[Tensor] = ctx.implicit_backward(
                tuple(g.detach() for g in grads)
            )
        if torch.is_grad_enabled():  # `create_graph=True`: refuse a second pass
            anchors = [t for t in (*ctx.saved_tensors, *grads) if t.requires_grad]
            if anchors:
                found = [
                    cast(Tensor, _NoSecondOrder.apply(ctx.what, f, *anchors))  # type: ignore[no-untyped-call]  # torch leaves `Function.apply` untyped
                    for f in found
                ]
        return (None, None, None, *found)


def _check_solver_options(
    what: str, rtol: object, atol: object, maxiter: object, on_solve: object
) -> None:
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            msg = f"`{what}`: `{name}` must be a number, got {type(value).__name__}."
            raise TypeError(msg)
        if not math.isfinite(value) or value < 0:
            msg = f"`{what}`: `{name}` must be a finite number >= 0, got {value!r}."
            raise ValueError(msg)
    if maxiter is not None and (
        isinstance(maxiter, bool) or not isinstance(maxiter, int)
    ):
        msg = f"`{what}`: `maxiter` must be an int or None, got {maxiter!r}."
        raise TypeError(msg)
    if isinstance(maxiter, int) and maxiter < 0:
        msg = f"`{what}`: `maxiter` must be >= 0, got {maxiter}."
        raise ValueError(msg)
    if on_solve is not None:
        check_callable(on_solve, "on_solve", what)


def _check_pair(adapted: object, params: object, what: str) -> None:
    """Check that `adapted` and `params` are ParamDicts with matching entries.

    Every entry of `adapted` has its param's shape, or that shape after leading
    batch dimensions (one solution per task, `params` shared).
    """
    check_paramdict(adapted, "adapted", what)
    check_paramdict(params, "params", what)
    assert isinstance(adapted, ParamDict)
    assert isinstance(params, ParamDict)
    if set(adapted) != set(params):
        msg = key_mismatch_message(
            list(params),
            adapted,
            what=f"`{what}` (adapted vs params)",
            fix="Pass the params the adapted entries came from, e.g. "
            "`params.select(...)` for a partly adapted model.",
        )
        raise ValueError(msg)
    check_floating(adapted, "adapted", what)
    check_floating(params, "params", what)
    check_real(adapted, "adapted", what)
    check_real(params, "params", what)
    meta = sorted(
        {k for k, v in adapted.items() if v.is_meta}
        | {k for k, v in params.items() if v.is_meta}
    )
    if meta:
        msg = (
            f"`{what}`: entries {meta!r} are meta tensors, which hold no values: "
            "the backward solve reads residual norms to decide when to stop. "
            "Move `adapted` and `params` to a real device first (`.to(device)`)."
        )
        raise ValueError(msg)
    wrong: list[str] = []
    for key, theta in params.items():
        shape, base = adapted[key].shape, theta.shape
        if len(shape) < len(base) or shape[len(shape) - len(base) :] != base:
            wrong.append(key)
    if wrong:
        detail = ", ".join(
            f"{k!r}: {tuple(adapted[k].shape)} vs {tuple(params[k].shape)}"
            for k in sorted(wrong)
        )
        msg = (
            f"`{what}`: adapted entries {sorted(wrong)!r} do not have their param's "
            f"shape, nor that shape after leading batch dimensions ({detail})."
        )
        raise ValueError(msg)


def _attach(
    adapted: P,
    params: ParamDict,
    backward: Callable[[P], list[Tensor]],
    what: str,
) -> P:
    """Return `adapted`'s values, joined to `params` by `backward` in the graph."""
    values = [v.detach() for v in adapted.values()]
    inputs = list(params.values())
    if not torch.is_grad_enabled() or not any(v.requires_grad for v in inputs):
        return adapted._derive(values)
    # Values of `params` themselves would come back as views of an input; copy.
    ids = {id(v) for v in inputs}
    values = [
        v.clone() if id(a) in ids else v for a, v in zip(adapted.values(), values)
    ]

    def run(grads: tuple[Tensor, ...]) -> list[Tensor]:
        return backward(adapted._derive(list(grads)))

    outs = _Implicit.apply(run, what, values, *inputs)  # type: ignore[no-untyped-call]  # torch leaves `Function.apply` untyped
    return adapted._derive(list(cast("tuple[Tensor, ...]", outs)))


def _reduced(grads: Sequence[Tensor], params: ParamDict) -> list[Tensor]:
    """Sum per-task gradients over their leading batch dimensions."""
    return [g.sum_to_size(p.shape) for g, p in zip(grads, params.values())]


def implicit_proximal(
    adapted: P,
    params: ParamDict,
    /,
    *,
    loss: Callable[[P], Tensor],
    lam: float,
    rtol: float = 1e-5,
    atol: float = 0.0,
    maxiter: int | None = None,
    on_solve: OnSolve | None = None,
) -> P:
    """Declare `adapted` the minimizer of `loss(phi) + lam/2 |phi - params|^2` (iMAML).

    Returns `adapted`'s values (detached from however they were computed), joined
    to `params` in the autograd graph so that gradients reaching them flow to
    `params` by the implicit function theorem: a gradient `g` at the result gives
    `lam (H + lam I)^-1 g` at `params`, with `H` the Hessian of `loss` at
    `adapted`. It is found by solving `(I + H / lam) x = g` with `cg` and keyed
    Hessian-vector products; memory does not grow with the inner steps that
    produced `adapted`. `adapted` and `params` are unchanged. The meta-gradient
    carries no graph back to `params`, even under `create_graph=True`, so a
    second derivative through it is refused.

    The gradient is exact when `adapted` is the exact minimizer and the solve
    converges; iMAML's approximation is a few inner steps and a few CG
    iterations (`maxiter=5` in the paper). For a meta-batch at once, `adapted`'s
    entries may carry leading task dimensions (`params` shared); `loss` must then
    be the sum of the tasks' losses, so that `H` is block-diagonal by task, and
    the per-task gradients are summed into `params`.

    Args:
        adapted: The adapted params `phi`, keyed like `params`.
        params: The meta-parameters `theta`, the centre of the proximal term.
        loss: The inner loss without the proximal term: a function from a
            ParamDict like `adapted` to a scalar (e.g. the support loss).
        lam: The proximal strength `lam > 0`.
        rtol: `cg`'s relative tolerance.
        atol: `cg`'s absolute tolerance.
        maxiter: `cg`'s iteration limit (`None`: its default).
        on_solve: Called with the `CGInfo` of each backward solve (to record or
            check convergence); not converging is not an error.

    Returns:
        A new ParamDict with `adapted`'s keys and values, differentiable with
        respect to `params`. Where `loss` is NaN or infinite at `adapted`, the
        gradient reaching `params` is NaN (no solve is run).

    Raises:
        TypeError: If `adapted` or `params` is not a ParamDict or holds
            integer, sparse or complex tensors (named), `loss` or `on_solve` is
            not callable, or a number is of the wrong kind.
        ValueError: If the keys differ, an entry of `adapted` does not have its
            param's shape (after leading batch dimensions), an entry is a meta
            tensor, `lam` is not positive, or a tolerance or `maxiter` is
            negative (the message names them); when the meta-gradient is itself
            differentiated. Errors of `loss` surface when the gradient is taken.

    Example:
        >>> theta = ParamDict(w=torch.tensor([1.0, 2.0], requires_grad=True))
        >>> phi = (theta / 2).detach()  # minimizes |w|^2/2 + 1/2 |w - theta|^2
        >>> phi = implicit_proximal(phi, theta, loss=lambda p: p.dot(p) / 2, lam=1.0)
        >>> theta.grad(phi["w"].sum())["w"]  # d phi / d theta = 1/2
        tensor([0.5000, 0.5000])

    See Also:
        `implicit_root` for any optimality condition; `hvp`, `cg`.
    """
    what = "implicit_proximal"
    _check_pair(adapted, params, what)
    check_callable(loss, "loss", what)
    if isinstance(lam, bool) or not isinstance(lam, (int, float)):
        msg = f"`{what}`: `lam` must be a number, got {type(lam).__name__}."
        raise TypeError(msg)
    if not math.isfinite(lam) or lam <= 0:
        msg = f"`{what}`: `lam` must be a finite number > 0, got {lam!r}."
        raise ValueError(msg)
    _check_solver_options(what, rtol, atol, maxiter, on_solve)

    def backward(g: P) -> list[Tensor]:
        phi = adapted.detach()
        hessian = HessianOperator(
            loss, phi, create_graph=False, allow_unused=True, what=what
        )
        if not math.isfinite(float(hessian.loss)):
            # No minimizer where the inner loss is NaN or infinite: the
            # meta-gradient is not a number, which must not look like one.
            return [torch.full_like(t, math.nan) for t in params.values()]
        x, info = cg(
            lambda v: v.add(hessian(v), alpha=1 / lam),
            g,
            rtol=rtol,
            atol=atol,
            maxiter=maxiter,
        )
        if on_solve is not None:
            on_solve(info)
        return _reduced(list(x.values()), params)

    return _attach(adapted, params, backward, what)


def implicit_root(
    adapted: P,
    params: ParamDict,
    /,
    *,
    optimality: Callable[[P, ParamDict], Mapping[str, Tensor]],
    rtol: float = 1e-5,
    atol: float = 0.0,
    maxiter: int | None = None,
    on_solve: OnSolve | None = None,
) -> P:
    """Declare `adapted` a root of `optimality(phi, params) = 0`, for autograd.

    Returns `adapted`'s values (detached from however they were computed), joined
    to `params` in the autograd graph by the implicit function theorem: with
    `F = optimality`, a gradient `g` at the result gives `-(dF/dtheta)^T w` at
    `params`, where `(dF/dphi)^T w = g` is solved by `cg` (one vector-Jacobian
    product of `F` per iteration). `adapted` and `params` are unchanged.

    `cg` needs `dF/dphi` symmetric positive definite, as it is when `F` is the
    gradient of a strongly convex inner objective (`F = grad_phi L_in`, the
    common case, iMAML's included). `optimality` is differentiated, so gradients
    inside it must be taken with `create_graph=True`.

    Args:
        adapted: The solution `phi`, keyed like `params` (entries may carry
            leading batch dimensions, as for `implicit_proximal`).
        params: The outer parameters `theta` that the solution depends on.
        optimality: `F(phi, theta)`, a ParamDict keyed and shaped like `phi`
            that is zero at the solution.
        rtol: `cg`'s relative tolerance.
        atol: `cg`'s absolute tolerance.
        maxiter: `cg`'s iteration limit (`None`: its default).
        on_solve: Called with the `CGInfo` of each backward solve.

    Returns:
        A new ParamDict with `adapted`'s keys and values, differentiable with
        respect to `params`.

    Raises:
        TypeError: If `adapted` or `params` is not a ParamDict or holds
            integer, sparse or complex tensors (named), `optimality` or
            `on_solve` is not callable, or a number is of the wrong kind.
        ValueError: If the keys differ, an entry of `adapted` does not have its
            param's shape (after leading batch dimensions), an entry is a meta
            tensor, or a tolerance or `maxiter` is negative. When the gradient
            is taken: if `optimality` returns other keys or shapes, or does not
            depend on `phi` (a gradient taken without `create_graph=True`), or
            when the meta-gradient is itself differentiated.

    Example:
        >>> theta = ParamDict(w=torch.tensor([1.0, 2.0], requires_grad=True))
        >>> phi = (theta / 3).detach()  # the root of F = 3 phi - theta
        >>> phi = implicit_root(phi, theta, optimality=lambda p, t: 3 * p - t)
        >>> theta.grad(phi["w"].sum())["w"]
        tensor([0.3333, 0.3333])

    See Also:
        `implicit_proximal`, iMAML's special case; `jvp`, `vjp`, `cg`.
    """
    what = "implicit_root"
    _check_pair(adapted, params, what)
    check_callable(optimality, "optimality", what)
    _check_solver_options(what, rtol, atol, maxiter, on_solve)

    def backward(g: P) -> list[Tensor]:
        with torch.enable_grad():
            phi = leaves(adapted, create_graph=False)
            theta = leaves(params, create_graph=False)
            residual: object = evaluate(optimality, "optimality", what, phi, theta)
            if not isinstance(residual, Mapping):
                msg = (
                    f"`{what}`: `optimality` must return a ParamDict keyed like "
                    f"`adapted`, got {type(residual).__name__}."
                )
                raise TypeError(msg)
            outs = aligned(
                adapted, residual, "optimality(phi, theta)", what, against="adapted"
            )
            phi_values = list(phi.values())

            def transposed(w: P) -> P:
                found = grad_or_none(
                    outs,
                    phi_values,
                    list(w.values()),
                    create_graph=False,
                    retain_graph=True,
                )
                missing = [k for k, f in zip(adapted, found) if f is None]
                if len(missing) == len(found):
                    msg = (
                        f"`{what}`: `optimality` does not depend on `phi`. Take "
                        "gradients inside it with `create_graph=True`."
                    )
                    raise ValueError(msg)
                return adapted._derive(filled(adapted, found, what, allow_unused=True))

            w, info = cg(transposed, g, rtol=rtol, atol=atol, maxiter=maxiter)
            if on_solve is not None:
                on_solve(info)
            found = grad_or_none(
                outs, list(theta.values()), list(w.values()), create_graph=False
            )
        grads = filled(params, found, what, allow_unused=True)
        return [-t for t in _reduced(grads, params)]

    return _attach(adapted, params, backward, what)
