"""Trajectories: 100 steps of each optimizer equal torch.optim's, option by option."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from optim_cases import (
    assert_matches,
    fused_trajectory_params,
    run_ours,
    run_torch,
    tensor_lr_params,
    trajectory_params,
    unfused,
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
    actual = run_ours(ours(**kwargs, **unfused(ours)), dtype)
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
    actual = run_ours(ours(**kwargs, **unfused(ours)), dtype)
    assert_matches(actual, expected, dtype)


@DTYPES
@pytest.mark.parametrize(("ours", "theirs", "kwargs"), fused_trajectory_params())
def test_fused_trajectory_matches_torch_fused(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
    dtype: torch.dtype,
) -> None:
    """With `fused=True`, 100 steps give torch.optim's `fused=True`, bit for bit."""
    expected = run_torch(lambda m: theirs(m.parameters(), fused=True, **kwargs), dtype)
    actual = run_ours(ours(**kwargs, fused=True), dtype)
    torch.testing.assert_close(dict(actual), expected, rtol=0, atol=0)


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), fused_trajectory_params())
def test_fused_and_foreach_trajectories_agree_in_float64(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
) -> None:
    """The fused kernel and the foreach rule round alike in float64 (rtol 1e-12)."""
    del theirs
    fused = run_ours(ours(**kwargs, fused=True), torch.float64)
    foreach = run_ours(ours(**kwargs, fused=False), torch.float64)
    assert_matches(fused, foreach, torch.float64)


@pytest.mark.parametrize(
    ("ours", "theirs", "default_is"),
    [
        (optim.Adam, torch.optim.Adam, True),
        (optim.AdamW, torch.optim.AdamW, True),
        (optim.Adagrad, torch.optim.Adagrad, True),
        (optim.SGD, torch.optim.SGD, False),
    ],
)
def test_default_step_is_the_fused_kernel_where_it_pays(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    default_is: bool,
) -> None:
    """By default `step` is the fused kernel for Adam, AdamW, Adagrad; SGD the rule.

    The default equals the explicit flag bit for bit, and that path's torch.optim
    counterpart (`fused=True`, or SGD's foreach loop): each is compared with a
    reference, never with the other path (on some CPUs the two round alike).
    """
    kwargs: dict[str, Any] = {"lr": 0.01, "momentum": 0.9} if ours is optim.SGD else {}
    actual = run_ours(ours(**kwargs))
    expected = run_ours(ours(**kwargs, fused=default_is))
    torch.testing.assert_close(dict(actual), dict(expected), rtol=0, atol=0)
    torch_path = {"fused": True} if default_is else {"foreach": True}
    reference = run_torch(lambda m: theirs(m.parameters(), **kwargs, **torch_path))
    torch.testing.assert_close(dict(actual), reference, rtol=0, atol=0)


@DTYPES
@pytest.mark.parametrize(("ours", "theirs", "kwargs"), tensor_lr_params())
def test_tensor_lr_matches_torch(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
    dtype: torch.dtype,
) -> None:
    """A 0-dim tensor learning rate gives torch.optim's tensor-lr trajectory.

    The rule (`fused=False` where a class has a fused kernel) against torch's
    default path; the fused kernel is checked below against torch's.
    """
    expected = run_torch(
        lambda m: theirs(m.parameters(), lr=torch.tensor(0.02, dtype=dtype), **kwargs),
        dtype,
    )
    actual = run_ours(
        ours(lr=torch.tensor(0.02, dtype=dtype), **kwargs, **unfused(ours)), dtype
    )
    assert_matches(actual, expected, dtype)


@DTYPES
@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize(
    ("ours", "theirs", "kwargs"), tensor_lr_params(fused_only=True)
)
def test_tensor_lr_fused_matches_torch_fused(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Callable[..., torch.optim.Optimizer],
    kwargs: dict[str, Any],
    dtype: torch.dtype,
    in_place: bool,
) -> None:
    """A tensor `lr` takes the fused kernel: torch.optim's `fused=True`, bit for bit.

    Both by default and with `fused=True`, in `step` and `step_` (SGD's default
    `step` runs the rule, within rounding).
    """
    lr = torch.tensor(0.02, dtype=dtype)
    expected = run_torch(
        lambda m: theirs(m.parameters(), lr=lr.clone(), fused=True, **kwargs), dtype
    )
    for fused in (None, True):
        opt = ours(lr=lr.clone(), fused=fused, **kwargs)
        actual = run_ours(opt, dtype, in_place=in_place)
        if ours is optim.SGD and fused is None and not in_place:
            assert_matches(actual, expected, dtype)
        else:
            torch.testing.assert_close(dict(actual), expected, rtol=0, atol=0)
