"""A keyed conjugate-gradient solver: `x, info = cg(matvec, b)` over ParamDicts.

The vectors of the solver are ParamDicts, so a linear operator on keyed params (a
Hessian-vector product, `v + hvp(f, p, v) / lam`) is solved for without flattening
anything; each iteration is one `matvec`, two `dot`s and three fused `add`s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple, TypeVar

from torch import Tensor

from ._paramdict import ParamDict
from ._product_checks import (
    aligned,
    check_callable,
    check_floating,
    check_paramdict,
    evaluate,
)

__all__ = ["CGInfo", "cg"]

P = TypeVar("P", bound=ParamDict)


class CGInfo(NamedTuple):
    """How a `cg` solve went.

    Attributes:
        converged: Whether the residual norm reached the tolerance.
        iterations: The iterations run (`matvec` calls, besides one for a given
            `x0`).
        residual_norms: The residual norm `|b - A x|` before the first iteration
            and after each one (the recurrence's residual, as SciPy reports it).
        tolerance: The bound the residual norm had to reach,
            `max(rtol * |b|, atol)`.

    Example:
        >>> b = ParamDict(w=torch.tensor([3.0, 4.0]))
        >>> _, info = cg(lambda v: v, b)
        >>> info
        CGInfo(converged=True, iterations=1, residual_norms=(5.0, 0.0), tolerance=5e-05)
    """

    converged: bool
    iterations: int
    residual_norms: tuple[float, ...]
    tolerance: float


def check_real(values: ParamDict, name: str, what: str) -> None:
    """Raise a TypeError naming the complex entries of `values`.

    `cg`'s inner products do not conjugate: on complex vectors the iteration
    would run and return a wrong answer.
    """
    complex_ = sorted(k for k, v in values.items() if v.is_complex())
    if complex_:
        msg = (
            f"`{what}`: entries {complex_!r} of `{name}` are complex, but `cg` "
            "solves real systems. Split them into real and imaginary parts "
            "(`torch.view_as_real`) first."
        )
        raise TypeError(msg)


def _check_number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"`cg`: `{name}` must be a number, got {type(value).__name__}."
        raise TypeError(msg)
    if not math.isfinite(value) or value < 0:
        msg = f"`cg`: `{name}` must be a finite number >= 0, got {value!r}."
        raise ValueError(msg)
    return float(value)


def _applied(matvec: Callable[[P], Mapping[str, Tensor]], x: P, b: P) -> P:
    """Return `matvec(x)` as a ParamDict like `b`, checking its keys and shapes."""
    out = evaluate(matvec, "matvec", "cg", x)
    values = aligned(b, out, "matvec(x)", "cg", against="`b`")
    return b._derive(values)


def cg(
    matvec: Callable[[P], Mapping[str, Tensor]],
    b: P,
    /,
    *,
    x0: Mapping[str, Tensor] | None = None,
    rtol: float = 1e-5,
    atol: float = 0.0,
    maxiter: int | None = None,
) -> tuple[P, CGInfo]:
    """Solve `A x = b` for a symmetric positive definite `A` by conjugate gradients.

    `A` is given by its product `matvec(v)` with a ParamDict keyed like `b`; the
    solution is keyed like `b`, which is unchanged. The iteration stops when the
    residual norm is at most `max(rtol * |b|, atol)` (SciPy's rule) or after
    `maxiter` iterations, whichever comes first; `info` says which, with every
    residual norm on the way. Not converging is reported, not raised: check
    `info.converged`. An indefinite `A` (a Hessian away from a minimum) is not
    refused: the iteration runs on, as iMAML's does, and may or may not
    converge; it stops early only at a breakdown (`p^T A p` zero or not finite).
    A NaN or infinity from `matvec` or in `b` is not hidden: the solution then
    holds NaNs, and `info.converged` is false.

    Args:
        matvec: The operator: a function from a ParamDict like `b` to one with the
            same keys and shapes (e.g. `lambda v: v + hvp(f, p, v) / lam`).
        b: The right-hand side.
        x0: The initial guess; zeros when `None`.
        rtol: The tolerance relative to `|b|`.
        atol: The absolute tolerance.
        maxiter: The most iterations; `10 * b.numel()` when `None`.

    Returns:
        `(x, info)`: the solution, keyed like `b`, and a `CGInfo`.

    Raises:
        TypeError: If `matvec` is not callable, `b` is not a ParamDict, a
            tolerance is not a number, `b` holds integer, sparse or complex
            tensors (`cg` solves real systems), or `x0` or `matvec`'s result is
            not a mapping of dense tensors.
        ValueError: If a tolerance is negative or not finite, `maxiter` is
            negative, `b` holds meta tensors, or the keys, shapes or devices of
            `x0` or `matvec`'s result differ from `b`'s (the message names them).

    Example:
        >>> b = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> x, info = cg(lambda v: 2 * v, b)
        >>> x["w"], info.converged, info.iterations
        (tensor([0.5000, 1.0000]), True, 1)

    See Also:
        `hvp` for Hessian operators; `implicit_proximal` solves with `cg`.
    """
    check_callable(matvec, "matvec", "cg")
    check_paramdict(b, "b", "cg")
    rtol = _check_number(rtol, "rtol")
    atol = _check_number(atol, "atol")
    if maxiter is None:
        maxiter = 10 * b.numel()
    elif isinstance(maxiter, bool) or not isinstance(maxiter, int):
        msg = f"`cg`: `maxiter` must be an int or None, got {type(maxiter).__name__}."
        raise TypeError(msg)
    elif maxiter < 0:
        msg = f"`cg`: `maxiter` must be >= 0, got {maxiter}."
        raise ValueError(msg)
    meta = sorted(k for k, v in b.items() if v.is_meta)
    if meta:
        msg = (
            f"`cg`: entries {meta!r} of `b` are meta tensors, which hold no values, "
            "and `cg` reads residual norms to decide when to stop. Solve on a real "
            "device (`b.to(device)`)."
        )
        raise ValueError(msg)
    check_floating(b, "b", "cg")
    check_real(b, "b", "cg")
    b_norm = float(b.norm()) if len(b) else 0.0
    tolerance = max(rtol * b_norm, atol)
    if x0 is None:
        x = b.zeros_like()
        r = b
    else:
        x = b._derive(aligned(b, x0, "x0", "cg", against="`b`"))
        r = b - _applied(matvec, x, b)
    rr = r.dot(r)
    norms = [math.sqrt(float(rr))]
    if not math.isfinite(norms[0]):
        # A NaN or infinite right-hand side (or residual): the solution is not a
        # number either; say so rather than return the initial guess.
        x = x.add(r, alpha=math.nan)
    p = r
    iterations = 0
    while norms[-1] > tolerance and iterations < maxiter:
        ap = _applied(matvec, p, b)
        curvature = p.dot(ap)
        iterations += 1
        if not math.isfinite(float(curvature)):
            # `A` gave a NaN or infinity (a NaN loss behind a Hessian product):
            # let it reach the solution, as a direct solve would, not hide it.
            x = x.add(p, alpha=rr / curvature)
            norms.append(math.nan)
            break
        if float(curvature) == 0:
            break  # breakdown: no step along `p` is defined
        alpha = rr / curvature
        x = x.add(p, alpha=alpha)
        r = r.sub(ap, alpha=alpha)
        rr_new = r.dot(r)
        norms.append(math.sqrt(float(rr_new)))
        p = r.add(p, alpha=rr_new / rr)
        rr = rr_new
    info = CGInfo(
        converged=norms[-1] <= tolerance,
        iterations=iterations,
        residual_norms=tuple(norms),
        tolerance=tolerance,
    )
    return x, info
