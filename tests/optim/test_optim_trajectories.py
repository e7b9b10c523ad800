"""Trajectories: 100 steps of each optimizer equal torch.optim's, option by option."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from optim_cases import (
    assert_matches,
    run_ours,
    run_torch,
    tensor_lr_params,
    trajectory_params,
)

from paramdict import optim

DTYPES = pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64], ids=["float32", "float64"]
)


@DTYPES
@pytest.mark.parametrize(("ours", "theirs", "kwargs"), trajectory_params())
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
@pytest.mark.parametrize(
    ("ours", "theirs", "kwargs"), trajectory_params(foreach_only=True)
)
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
@pytest.mark.parametrize(("ours", "theirs", "kwargs"), tensor_lr_params())
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
