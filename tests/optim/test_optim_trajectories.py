"""Trajectories: 100 steps of each optimizer equal torch.optim's, option by option."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import pytest
import torch
from optim_cases import assert_matches, run_ours, run_torch

from paramdict import optim

# Each case: our class, torch's class, and keyword arguments both accept as they are.
Case = tuple[
    str,
    Callable[..., optim.Optimizer[Any]],
    Callable[..., torch.optim.Optimizer],
    dict[str, Any],
]
CASES: list[Case] = [
    ("sgd", optim.SGD, torch.optim.SGD, {"lr": 0.05}),
    ("sgd-momentum", optim.SGD, torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    (
        "sgd-dampening",
        optim.SGD,
        torch.optim.SGD,
        {"lr": 0.05, "momentum": 0.9, "dampening": 0.3},
    ),
    (
        "sgd-nesterov",
        optim.SGD,
        torch.optim.SGD,
        {"lr": 0.05, "momentum": 0.9, "nesterov": True},
    ),
    ("sgd-weight-decay", optim.SGD, torch.optim.SGD, {"lr": 0.05, "weight_decay": 0.1}),
    (
        "sgd-maximize",
        optim.SGD,
        torch.optim.SGD,
        {"lr": 0.01, "momentum": 0.5, "weight_decay": 0.1, "maximize": True},
    ),
    ("adam", optim.Adam, torch.optim.Adam, {"lr": 0.01}),
    (
        "adam-betas-eps",
        optim.Adam,
        torch.optim.Adam,
        {"lr": 0.01, "betas": (0.5, 0.9), "eps": 1e-3},
    ),
    ("adam-amsgrad", optim.Adam, torch.optim.Adam, {"lr": 0.01, "amsgrad": True}),
    (
        "adam-weight-decay",
        optim.Adam,
        torch.optim.Adam,
        {"lr": 0.01, "weight_decay": 0.1},
    ),
    (
        "adam-decoupled",
        optim.Adam,
        torch.optim.Adam,
        {"lr": 0.01, "weight_decay": 0.1, "decoupled_weight_decay": True},
    ),
    ("adam-maximize", optim.Adam, torch.optim.Adam, {"lr": 0.01, "maximize": True}),
    ("adamw", optim.AdamW, torch.optim.AdamW, {"lr": 0.01}),
    (
        "adamw-amsgrad-maximize",
        optim.AdamW,
        torch.optim.AdamW,
        {"lr": 0.01, "weight_decay": 0.1, "amsgrad": True, "maximize": True},
    ),
    ("rmsprop", optim.RMSprop, torch.optim.RMSprop, {"lr": 0.01}),
    (
        "rmsprop-centered",
        optim.RMSprop,
        torch.optim.RMSprop,
        {"lr": 0.01, "centered": True},
    ),
    (
        "rmsprop-momentum",
        optim.RMSprop,
        torch.optim.RMSprop,
        {"lr": 0.01, "momentum": 0.9},
    ),
    (
        "rmsprop-centered-momentum",
        optim.RMSprop,
        torch.optim.RMSprop,
        {"lr": 0.01, "centered": True, "momentum": 0.9, "alpha": 0.9},
    ),
    (
        "rmsprop-weight-decay-maximize",
        optim.RMSprop,
        torch.optim.RMSprop,
        {"lr": 0.01, "weight_decay": 0.1, "maximize": True},
    ),
    ("adagrad", optim.Adagrad, torch.optim.Adagrad, {"lr": 0.1}),
    (
        "adagrad-lr-decay",
        optim.Adagrad,
        torch.optim.Adagrad,
        {"lr": 0.1, "lr_decay": 0.05},
    ),
    (
        "adagrad-initial-eps",
        optim.Adagrad,
        torch.optim.Adagrad,
        {"lr": 0.1, "initial_accumulator_value": 0.5, "eps": 1e-3},
    ),
    (
        "adagrad-weight-decay-maximize",
        optim.Adagrad,
        torch.optim.Adagrad,
        {"lr": 0.1, "weight_decay": 0.1, "maximize": True},
    ),
]

# One case per optimizer with most of its options on, also against torch's
# multi-tensor (foreach) implementation.
FOREACH = {
    "sgd-maximize",
    "sgd-dampening",
    "adam-weight-decay",
    "adamw-amsgrad-maximize",
    "rmsprop-centered-momentum",
    "adagrad-weight-decay-maximize",
}
# Cases whose torch.optim reference needs a newer torch than the oldest supported.
NEWER_TORCH = {
    "adam-decoupled": pytest.mark.skipif(
        torch.__version__ < "2.7",
        reason="torch.optim.Adam takes `decoupled_weight_decay` from torch 2.7 on",
    ),
}


def _params(names: Collection[str] | None = None) -> list[Any]:
    """The cases (all, or those named) as pytest parameters with their marks."""
    return [
        pytest.param(*case[1:], id=case[0], marks=NEWER_TORCH.get(case[0], ()))
        for case in CASES
        if names is None or case[0] in names
    ]


DTYPES = pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64], ids=["float32", "float64"]
)


@DTYPES
@pytest.mark.parametrize(("ours", "theirs", "kwargs"), _params())
def test_trajectory_matches_torch(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
    dtype: torch.dtype,
) -> None:
    """100 steps give torch.optim's parameters for the same hyperparameters."""
    expected = run_torch(lambda m: theirs(m.parameters(), **kwargs), dtype)
    actual = run_ours(ours(**kwargs), dtype)
    assert_matches(actual, expected, dtype)


@DTYPES
@pytest.mark.parametrize(("ours", "theirs", "kwargs"), _params(FOREACH))
def test_trajectory_matches_torch_foreach(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
    dtype: torch.dtype,
) -> None:
    """100 steps give the parameters of torch.optim's foreach implementation."""
    expected = run_torch(
        lambda m: theirs(m.parameters(), foreach=True, **kwargs), dtype
    )
    actual = run_ours(ours(**kwargs), dtype)
    assert_matches(actual, expected, dtype)


@DTYPES
@pytest.mark.parametrize(
    ("ours", "theirs", "kwargs"),
    [
        (optim.SGD, torch.optim.SGD, {"momentum": 0.9, "weight_decay": 0.1}),
        (optim.Adam, torch.optim.Adam, {"weight_decay": 0.1}),
        (optim.AdamW, torch.optim.AdamW, {}),
        (optim.RMSprop, torch.optim.RMSprop, {"centered": True}),
        (optim.Adagrad, torch.optim.Adagrad, {"lr_decay": 0.05}),
    ],
    ids=["sgd", "adam", "adamw", "rmsprop", "adagrad"],
)
def test_tensor_lr_matches_torch(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
    dtype: torch.dtype,
) -> None:
    """A 0-dim tensor learning rate gives torch.optim's tensor-lr trajectory."""
    expected = run_torch(
        lambda m: theirs(m.parameters(), lr=torch.tensor(0.02, dtype=dtype), **kwargs),
        dtype,
    )
    actual = run_ours(ours(lr=torch.tensor(0.02, dtype=dtype), **kwargs), dtype)
    assert_matches(actual, expected, dtype)
