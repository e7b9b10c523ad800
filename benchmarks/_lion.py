"""Lion written with torch's foreach kernels, the fastest plain-torch Lion.

torch has no Lion, so the benchmarks compare `optim.Lion` with this: the paper's
update with decoupled decay in four `torch._foreach_*` passes over all entries,
as a `torch.optim.Optimizer` a torch user would write.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["ForeachLion"]


class ForeachLion(torch.optim.Optimizer):
    """Lion on every parameter with a gradient, one foreach call per operation.

    `foreach` and `fused` are accepted and ignored: there is one implementation.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
        *,
        foreach: bool | None = None,
        fused: bool | None = None,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """Take one Lion step."""
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            params: list[Tensor] = [p for p in group["params"] if p.grad is not None]
            grads: list[Tensor] = [p.grad for p in params]  # type: ignore[misc]
            for p in params:
                if not self.state[p]:
                    self.state[p]["exp_avg"] = torch.zeros_like(p)
            avgs: list[Tensor] = [self.state[p]["exp_avg"] for p in params]
            if wd != 0:
                torch._foreach_mul_(params, 1 - lr * wd)
            direction = torch._foreach_lerp(avgs, grads, 1 - beta1)
            torch._foreach_sign_(direction)
            torch._foreach_add_(params, direction, alpha=-lr)
            torch._foreach_lerp_(avgs, grads, 1 - beta2)
