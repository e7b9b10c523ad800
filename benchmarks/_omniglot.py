"""The Omniglot-shaped MAML setup shared by the CNN cases: the 4-conv network and tasks.

The network is MAML's few-shot classifier for Omniglot (Finn et al., 2017, section
5.2): four blocks of a 3 x 3 convolution, BatchNorm, ReLU and 2 x 2 max-pooling on
1 x 28 x 28 images (28 -> 14 -> 7 -> 3 -> 1), then a linear layer to the 5 classes.
BatchNorm uses the statistics of each batch (`track_running_stats=False`), as MAML
implementations do. Tasks are 5-way 1-shot: one support image per class and
`queries` query images per class. The images are synthetic: each class of a task is
a random pattern, each image that pattern plus noise, all from a seeded generator,
so every candidate sees the same data and nothing is downloaded.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

__all__ = [
    "CHANNELS",
    "INNER_LR",
    "QUERIES",
    "TASKS",
    "WAYS",
    "Task",
    "make_model",
    "sample_tasks",
    "stacked",
]

WAYS = 5
"""Classes per task (N-way)."""
QUERIES = 5
"""Query images per class."""
CHANNELS = 64
"""Channels of every convolution, as in the paper."""
TASKS = 4
"""Tasks per meta-iteration."""
INNER_LR = 0.4
"""The inner SGD step (the paper's, for Omniglot)."""
SIZE = 28
"""Image height and width."""


class Task(NamedTuple):
    """One task: support images and labels, query images and labels."""

    x: Tensor
    y: Tensor
    x_query: Tensor
    y_query: Tensor


def make_model(
    *, channels: int = CHANNELS, seed: int = 0, dtype: torch.dtype = torch.float32
) -> nn.Sequential:
    """Return the 4-conv network with `channels` channels, initialized from `seed`."""
    layers: list[nn.Module] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for i in range(4):
            layers += [
                nn.Conv2d(1 if i == 0 else channels, channels, 3, padding=1),
                nn.BatchNorm2d(channels, track_running_stats=False),
                nn.ReLU(),
                nn.MaxPool2d(2),
            ]
        model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels, WAYS))
    return model.to(dtype)


def sample_tasks(
    count: int = TASKS,
    /,
    *,
    queries: int = QUERIES,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> list[Task]:
    """Return `count` synthetic 5-way 1-shot tasks drawn from `seed`."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.arange(WAYS)
    tasks = []
    for _ in range(count):
        patterns = torch.randn(WAYS, 1, SIZE, SIZE, generator=gen, dtype=dtype)

        def images(per_class: int, patterns: Tensor = patterns) -> Tensor:
            noise = torch.randn(
                per_class * WAYS, 1, SIZE, SIZE, generator=gen, dtype=dtype
            )
            return patterns.repeat(per_class, 1, 1, 1) + 0.5 * noise

        tasks.append(Task(images(1), labels, images(queries), labels.repeat(queries)))
    return tasks


def stacked(tasks: list[Task], /) -> Task:
    """Return the tasks' tensors stacked along a new leading task dimension."""
    x, y, x_query, y_query = zip(*tasks)
    return Task(
        torch.stack(x), torch.stack(y), torch.stack(x_query), torch.stack(y_query)
    )
