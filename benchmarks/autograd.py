"""`p.grad(loss)` against `torch.autograd.grad` on a tuple plus rebuilding the dict.

Candidates, each differentiating the same retained graph (`retain_graph=True`, so
only the backward pass and the bookkeeping around it are timed):

- `ParamDict`: `p.grad(loss)`;
- `autograd.grad + dict`: `dict(zip(d, torch.autograd.grad(loss, tuple(d.values()))))`
  on a plain dict `d` of the same tensors;
- `autograd.grad (tuple)`: the same without the dict, the floor.

On the MAML regressor (the MLP 1-40-40-1, a batch of K = 10 points, MSE loss) and at
every size with the loss `sum_k (p[k] ** 2).sum()`. Part of `python -m benchmarks`
(run only this with `--only grad`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from paramdict import ParamDict

from ._agree import check_agreement
from ._report import OURS, Config, Row, Section, ratio_target
from ._sinusoid import make_model, sample_tasks

__all__ = ["measure"]

BARE = "autograd.grad + dict"


def _candidates(
    params: dict[str, Tensor], loss: Tensor
) -> dict[str, Callable[[], object]]:
    p = ParamDict(params)

    def bare() -> dict[str, Tensor]:
        grads = torch.autograd.grad(loss, tuple(params.values()), retain_graph=True)
        return dict(zip(params, grads))

    def floor() -> tuple[Tensor, ...]:
        return torch.autograd.grad(loss, tuple(params.values()), retain_graph=True)

    return {
        OURS: lambda: p.grad(loss, retain_graph=True),
        BARE: bare,
        "autograd.grad (tuple)": floor,
    }


def _mlp() -> tuple[dict[str, Tensor], Tensor]:
    model = make_model()
    params: dict[str, Tensor] = dict(model.named_parameters())
    task = sample_tasks(1)[0]
    loss = F.mse_loss(torch.func.functional_call(model, params, (task.x,)), task.y)
    return params, loss


def _sized(entries: int, elements: int) -> tuple[dict[str, Tensor], Tensor]:
    gen = torch.Generator().manual_seed(0)
    params = {
        f"layers.{i}.weight": torch.randn(elements, generator=gen).requires_grad_()
        for i in range(entries)
    }
    loss = torch.stack([(v * v).sum() for v in params.values()]).sum()
    return params, loss


def measure(config: Config) -> Section:
    """Time the three candidates on the MLP and at every size."""
    section = Section(
        "grad",
        "Keyed gradients",
        "One backward pass per call through a retained graph; the float32 MLP "
        "1-40-40-1 on K = 10 points, and `sum_k (p[k] ** 2).sum()` per size.",
    )
    problems = [("MLP 1-40-40-1", _mlp())]
    problems += [(f"{n} x {m:,}", _sized(n, m)) for n, m in config.sizes]
    mlp_row = None
    for size, (params, loss) in problems:
        candidates = _candidates(params, loss)
        check_agreement(
            {name: fn() for name, fn in candidates.items()},
            list(params),
            reference=OURS,
        )
        row = Row.from_timings("p.grad(loss)", size, config.time(candidates))
        mlp_row = mlp_row or row
        section.rows.append(row)
    section.targets.append(
        ratio_target(
            "`p.grad(loss)` within 1.05x of `torch.autograd.grad` + dict, MLP",
            mlp_row,
            OURS,
            BARE,
            1.05,
        )
    )
    return section
