"""The Adam family's configuration: AdamW is Adam with its decay fixed, as in torch."""

from __future__ import annotations

import inspect
import pickle
from collections.abc import Callable
from typing import Any

import attrs
import pytest
import torch
from _torch_versions import needs_torch

from paramdict import ParamDict, optim


def test_adamw_is_an_adam_with_decoupled_decay_fixed() -> None:
    """AdamW derives from Adam, its decay always decoupled and not an argument."""
    opt = optim.AdamW(lr=0.1)
    assert isinstance(opt, optim.Adam)
    assert opt.decoupled_weight_decay is True
    assert opt.weight_decay == 1e-2
    assert "decoupled_weight_decay" not in inspect.signature(optim.AdamW).parameters
    assert "decoupled_weight_decay" not in repr(opt)


@needs_torch(2, 7, "torch.optim.AdamW as a subclass of Adam")
def test_torch_adamw_is_an_adam_too() -> None:
    """torch.optim.AdamW derives from torch.optim.Adam, as ours from ours."""
    assert issubclass(torch.optim.AdamW, torch.optim.Adam)
    assert issubclass(optim.AdamW, optim.Adam)


def test_adamw_refuses_decoupled_weight_decay_as_torch_does() -> None:
    """`AdamW(decoupled_weight_decay=...)` is no argument, as in torch.optim.AdamW."""
    with pytest.raises(TypeError, match="decoupled_weight_decay"):
        optim.AdamW(decoupled_weight_decay=False)  # type: ignore[call-arg]  # the test


def test_adamw_keeps_adams_argument_order() -> None:
    """AdamW's arguments are Adam's, in Adam's (and torch's) order, less one."""
    adam = [f.name for f in attrs.fields(optim.Adam) if f.init]
    adamw = [f.name for f in attrs.fields(optim.AdamW) if f.init]
    assert adamw == [name for name in adam if name != "decoupled_weight_decay"]
    torch_adamw = list(inspect.signature(torch.optim.AdamW).parameters)
    ordered = [name for name in torch_adamw if name in adamw]
    assert ordered == [name for name in adamw if name in torch_adamw]


def test_adamw_steps_as_adam_with_decoupled_decay() -> None:
    """AdamW's step is bitwise Adam's with `decoupled_weight_decay=True`."""
    params = ParamDict(w=torch.linspace(-1.0, 1.0, 7))
    grads = ParamDict(w=torch.linspace(0.5, -0.3, 7))
    ours = optim.AdamW(lr=0.1, weight_decay=0.2, amsgrad=True)
    adam = optim.Adam(
        lr=0.1, weight_decay=0.2, amsgrad=True, decoupled_weight_decay=True
    )
    got, _ = ours.step(params, grads, ours.init(params))
    want, _ = adam.step(params, grads, adam.init(params))
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_adamw_pickles_with_its_fixed_field() -> None:
    """A pickled AdamW comes back an AdamW whose decay is still decoupled."""
    back = pickle.loads(pickle.dumps(optim.AdamW(lr=0.5, weight_decay=0.1)))
    assert type(back) is optim.AdamW
    assert back.decoupled_weight_decay is True
    assert (back.lr, back.weight_decay) == (0.5, 0.1)


@pytest.mark.parametrize(
    "cls", [optim.Adam, optim.AdamW, optim.NAdam, optim.RAdam, optim.Adamax]
)
def test_adam_family_rules_are_math_only(cls: type[optim.TorchOptimizer[Any]]) -> None:
    """The driver owns the step: each rule defines `math` and inherits `update_`."""
    assert cls.update_ is optim.TorchOptimizer.update_
    assert "math" in vars(cls) or cls is optim.AdamW


@pytest.mark.parametrize("cls", [optim.Adam, optim.NAdam, optim.RAdam])
def test_decoupled_weight_decay_option_decides_the_drivers_decay(
    cls: Callable[..., optim.TorchOptimizer[Any]],
) -> None:
    """`decoupled_weight_decay` decays the parameters first; else the gradient."""
    params = ParamDict(w=torch.tensor([2.0, -1.0, 0.5], dtype=torch.float64))
    grads = ParamDict(w=torch.tensor([0.3, 0.2, -0.7], dtype=torch.float64))
    plain = cls(lr=0.5)
    for decoupled in (True, False):
        opt = cls(lr=0.5, weight_decay=0.2, decoupled_weight_decay=decoupled)
        new, _ = opt.step(params, grads, opt.init(params))
        if decoupled:  # p * (1 - lr * wd), then the rule without decay
            start = ParamDict(w=params["w"] * (1 - 0.5 * 0.2))
            want, _ = plain.step(start, grads, plain.init(start))
        else:  # the rule on g + wd * p
            l2 = ParamDict(w=grads["w"] + 0.2 * params["w"])
            want, _ = plain.step(params, l2, plain.init(params))
        torch.testing.assert_close(new["w"], want["w"], rtol=1e-15, atol=1e-15)


def _radam_run(opt: optim.RAdam, steps: int) -> ParamDict:
    """Return the float64 parameters after `steps` RAdam steps on fixed gradients."""
    gen = torch.Generator().manual_seed(0)
    params = ParamDict(
        w=torch.randn(4, 3, generator=gen, dtype=torch.float64),
        b=torch.randn(3, generator=gen, dtype=torch.float64),
    )
    state = opt.init(params)
    for _ in range(steps):
        grads = {
            k: torch.randn(v.shape, generator=gen, dtype=v.dtype)
            for k, v in params.items()
        }
        params, state = opt.step(params, grads, state)
    return params


def test_radam_host_branch_matches_the_where_form() -> None:
    """An eager step's one side equals the traced `where` form, both sides of step 6."""
    eager = _radam_run(optim.RAdam(lr=0.05, weight_decay=0.01), 10)
    recorded = _radam_run(
        optim.RAdam(lr=0.05, weight_decay=0.01, differentiable=True), 10
    )
    per_key = _radam_run(
        optim.RAdam(
            lr=ParamDict(
                w=torch.tensor(0.05, dtype=torch.float64),
                b=torch.tensor(0.05, dtype=torch.float64),
            ),
            weight_decay=0.01,
        ),
        10,
    )
    for k in eager:
        torch.testing.assert_close(
            recorded[k].detach(), eager[k], rtol=1e-13, atol=1e-15
        )
        torch.testing.assert_close(per_key[k], eager[k], rtol=1e-13, atol=1e-15)


def test_radam_matches_torch_foreach_across_the_rectification() -> None:
    """RAdam's eager step follows torch's foreach RAdam on both sides of step 6."""
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    grads = [torch.randn(6, 5, generator=gen, dtype=torch.float64) for _ in range(10)]
    theirs = start.clone().requires_grad_()
    reference = torch.optim.RAdam([theirs], lr=0.05, foreach=True)
    opt = optim.RAdam(lr=0.05)
    params = ParamDict(w=start.clone())
    state = opt.init(params)
    for grad in grads:
        theirs.grad = grad.clone()
        reference.step()
        params, state = opt.step_(params, {"w": grad}, state)
        torch.testing.assert_close(params["w"], theirs.detach(), rtol=1e-13, atol=1e-15)
