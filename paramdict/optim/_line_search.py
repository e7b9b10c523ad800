"""The strong Wolfe line search of `LBFGS`, in `torch.optim.LBFGS`'s arithmetic.

`evaluate(t)` returns the loss and the flat gradient at `x + t * d`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

__all__ = ["strong_wolfe"]

Evaluate = Callable[[Any], tuple[float, Tensor]]


def _cubic_minimum(
    x1: Any, f1: Any, g1: Any, x2: Any, f2: Any, g2: Any, bounds: Any = None
) -> Any:
    """Return the minimizer of the cubic through two points and slopes, in bounds."""
    if bounds is not None:
        low, high = bounds
    else:
        low, high = (x1, x2) if x1 <= x2 else (x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1**2 - g1 * g2
    if not d2_square >= 0:  # also NaN
        return (low + high) / 2.0
    d2 = d2_square.sqrt()
    if x1 <= x2:
        point = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        point = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(point, low), high)


def strong_wolfe(
    evaluate: Evaluate,
    t: Any,
    d: Tensor,
    loss: float,
    grad: Tensor,
    gtd: Tensor,
    *,
    c1: float = 1e-4,
    c2: float = 0.9,
    tolerance_change: float = 1e-9,
    max_ls: int = 25,
) -> tuple[float, Tensor, Any, int]:
    """Return `(loss, flat_grad, t, evaluations)` at the step `t` found along `d`."""
    d_norm = d.abs().max()
    grad = grad.clone()
    new_loss, new_grad = evaluate(t)
    evaluations = 1
    new_gtd = new_grad.dot(d)

    t_prev, f_prev, g_prev, gtd_prev = 0, loss, grad, gtd
    done = False
    iteration = 0
    bracket: list[Any] = []
    bracket_f: list[Any] = []
    bracket_g: list[Tensor] = []
    bracket_gtd: list[Any] = []
    # Bracketing phase.
    while iteration < max_ls:
        if new_loss > (loss + c1 * t * gtd) or (iteration > 1 and new_loss >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, new_loss]
            bracket_g, bracket_gtd = [g_prev, new_grad.clone()], [gtd_prev, new_gtd]
            break
        if abs(new_gtd) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [new_loss], [new_grad]
            done = True
            break
        if new_gtd >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, new_loss]
            bracket_g, bracket_gtd = [g_prev, new_grad.clone()], [gtd_prev, new_gtd]
            break
        # Extrapolate between 1.01 t - 0.01 t_prev and 10 t.
        bounds = (t + 0.01 * (t - t_prev), t * 10)
        previous = t
        t = _cubic_minimum(t_prev, f_prev, gtd_prev, t, new_loss, new_gtd, bounds)
        t_prev, f_prev, g_prev, gtd_prev = previous, new_loss, new_grad.clone(), new_gtd
        new_loss, new_grad = evaluate(t)
        evaluations += 1
        new_gtd = new_grad.dot(d)
        iteration += 1
    if iteration == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [loss, new_loss], [grad, new_grad]

    # Zoom phase: narrow the bracket until the conditions hold.
    insufficient = False
    low, high = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and iteration < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_minimum(
            bracket[0],
            bracket_f[0],
            bracket_gtd[0],
            bracket[1],
            bracket_f[1],
            bracket_gtd[1],
        )
        # Keep away from the ends of the bracket when progress stalls.
        margin = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < margin:
            if insufficient or t >= max(bracket) or t <= min(bracket):
                if abs(t - max(bracket)) < abs(t - min(bracket)):
                    t = max(bracket) - margin
                else:
                    t = min(bracket) + margin
                insufficient = False
            else:
                insufficient = True
        else:
            insufficient = False
        new_loss, new_grad = evaluate(t)
        evaluations += 1
        new_gtd = new_grad.dot(d)
        iteration += 1
        if new_loss > (loss + c1 * t * gtd) or new_loss >= bracket_f[low]:
            bracket[high], bracket_f[high] = t, new_loss
            bracket_g[high], bracket_gtd[high] = new_grad.clone(), new_gtd
            low, high = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(new_gtd) <= -c2 * gtd:
                done = True
            elif new_gtd * (bracket[high] - bracket[low]) >= 0:
                bracket[high], bracket_f[high] = bracket[low], bracket_f[low]
                bracket_g[high], bracket_gtd[high] = bracket_g[low], bracket_gtd[low]
            bracket[low], bracket_f[low] = t, new_loss
            bracket_g[low], bracket_gtd[low] = new_grad.clone(), new_gtd
    return bracket_f[low], bracket_g[low], bracket[low], evaluations
