"""Quickstart: one MAML-style inner step on a small MLP, keyed end to end.

Run with `python examples/quickstart.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paramdict import ParamDict


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 1))
    x, y = torch.randn(10, 1), torch.randn(10, 1)

    params = ParamDict.from_module(model)
    loss = F.mse_loss(torch.func.functional_call(model, params, (x,)), y)
    grads = params.grad(loss, create_graph=True)  # keyed like params
    fast = params - 0.01 * grads  # one fused foreach update, differentiable

    query_loss = F.mse_loss(fast.call(model, x), y)
    meta_grads = params.grad(query_loss)  # second order through the inner step
    print(fast)
    print(f"loss before {loss.item():.4f}, after one step {query_loss.item():.4f}")
    norm = sum(g.pow(2).sum() for g in meta_grads.values()) ** 0.5
    print(f"meta-gradient norm {norm:.4f}")


if __name__ == "__main__":
    main()
