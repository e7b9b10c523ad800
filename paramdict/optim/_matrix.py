"""Matrix kernels of the optimizers that work on whole 2-D entries (Muon)."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

__all__ = ["newton_schulz"]


def newton_schulz(
    grad: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float
) -> Tensor:
    """Return `grad` orthogonalized by `steps` Newton-Schulz iterations, as torch.

    In bfloat16 (cast back exactly), wide, divided by its norm (at least `eps`),
    then the quintic iteration `(a, b, c)`; out of place, so differentiable.
    """
    a, b, c = coefficients
    x = grad.bfloat16()
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    norm = cast(Tensor, x.norm())  # pyright: ignore[reportUnknownMemberType]  # torch leaves `dim`, `dtype` of its norms untyped
    x = x / norm.clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    if tall:
        x = x.T
    return x.to(grad.dtype)
