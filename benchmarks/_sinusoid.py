"""The MAML sinusoid setup shared by the cases: the 1-40-40-1 MLP and its tasks.

Each task is `y = A sin(x - phi)` with `A ~ U[0.1, 5]`, `phi ~ U[0, pi]` and
`x ~ U[-5, 5]`, with K support and K query points (Finn et al., 2017, section 5.1).
Everything is drawn from a seeded generator, so every candidate sees the same data.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = ["INNER_LR", "SHOTS", "TASKS", "Task", "make_model", "sample_tasks"]

SHOTS = 10
"""K: support points per task, and query points."""
TASKS = 25
"""Tasks per meta-iteration."""
INNER_LR = 0.01
"""The inner SGD step."""


class Task(NamedTuple):
    """One task's support set `(x, y)` and query set `(x_query, y_query)`, `(K, 1)`."""

    x: Tensor
    y: Tensor
    x_query: Tensor
    y_query: Tensor


def make_model(*, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """Return the MLP 1-40-40-1 with ReLU, initialized from `seed`."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Linear(1, 40), nn.ReLU(), nn.Linear(40, 40), nn.ReLU(), nn.Linear(40, 1)
        )
    return model.to(dtype)


def sample_tasks(
    count: int = TASKS,
    /,
    *,
    shots: int = SHOTS,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> list[Task]:
    """Return `count` sinusoid tasks drawn from `seed`."""
    gen = torch.Generator().manual_seed(seed)

    def uniform(low: float, high: float, *shape: int) -> Tensor:
        return low + (high - low) * torch.rand(shape, generator=gen, dtype=dtype)

    tasks = []
    for _ in range(count):
        amplitude = uniform(0.1, 5.0, 1)
        phase = uniform(0.0, math.pi, 1)
        x = uniform(-5.0, 5.0, shots, 1)
        x_query = uniform(-5.0, 5.0, shots, 1)
        tasks.append(
            Task(
                x,
                amplitude * torch.sin(x - phase),
                x_query,
                amplitude * torch.sin(x_query - phase),
            )
        )
    return tasks
