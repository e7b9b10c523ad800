"""Clipping by global norm in front of an optimizer, against clip_grad_norm_."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from optim_cases import assert_matches, run_ours, run_torch

from paramdict import ParamDict, optim


@pytest.mark.parametrize("norm_type", [2.0, math.inf], ids=["l2", "inf"])
@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (
            optim.SGD(lr=0.1, momentum=0.9),
            lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        ),
        (optim.Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    ],
    ids=["sgd", "adam"],
)
def test_clipped_training_matches_clip_grad_norm(
    ours: optim.Optimizer[Any], theirs: Any, norm_type: float
) -> None:
    """100 clipped steps equal torch's clip_grad_norm_ followed by step()."""
    max_norm = 0.2  # below the gradient norms here, so clipping is active
    opt = optim.ClipGradNorm(ours, max_norm=max_norm, norm_type=norm_type)

    def make(model: torch.nn.Module) -> torch.optim.Optimizer:
        return theirs(model.parameters())  # type: ignore[no-any-return]  # a factory

    expected = run_torch(make, max_norm=max_norm, norm_type=norm_type)
    assert_matches(run_ours(opt), expected, torch.float32)


def test_gradients_under_the_limit_are_unchanged() -> None:
    """With a norm below `max_norm` the step is the wrapped optimizer's."""
    params = ParamDict(w=torch.tensor([1.0, 2.0]))
    grads = ParamDict(w=torch.tensor([0.3, 0.4]))
    clipped = optim.ClipGradNorm(optim.SGD(lr=1.0), max_norm=1.0)
    new, _ = clipped.step(params, grads, clipped.init(params))
    torch.testing.assert_close(new["w"], torch.tensor([0.7, 1.6]))


def test_clipping_is_differentiable_when_the_optimizer_is() -> None:
    """The clip coefficient is part of the graph in differentiable mode."""
    w = torch.tensor([3.0, 4.0], dtype=torch.float64, requires_grad=True)
    params = ParamDict(w=w)
    opt = optim.ClipGradNorm(optim.SGD(lr=1.0, differentiable=True), max_norm=1.0)
    assert opt.differentiable
    grads = params.grad((params["w"] ** 2).sum() / 2, create_graph=True)  # g = w
    new, _ = opt.step(params, grads, opt.init(params))
    # new = w - w / (|w| + 1e-6); d sum(new) / dw by hand:
    norm = w.detach().norm()
    c = 1 / (norm + 1e-6)
    expected = 1 - c + c**2 * w.detach().sum() * w.detach() / norm
    (meta,) = torch.autograd.grad(new["w"].sum(), w)
    torch.testing.assert_close(meta, expected)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_norm": -1.0}, r"`max_norm` must be non-negative"),
        ({"max_norm": 1.0, "norm_type": 0.0}, r"`norm_type` must be positive"),
    ],
)
def test_invalid_clipping_is_refused(kwargs: dict[str, float], match: str) -> None:
    """Negative limits and non-positive norm orders raise, naming the argument."""
    with pytest.raises(ValueError, match=match):
        optim.ClipGradNorm(optim.SGD(), **kwargs)
