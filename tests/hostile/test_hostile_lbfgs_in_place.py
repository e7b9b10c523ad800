"""LBFGS has no in-place step: `step_` refuses, saying why and what to use."""

from __future__ import annotations

import pytest
import torch
from _unchanged import Case, check

from paramdict import ParamDict, optim


def test_lbfgs_step_refuses_and_names_step() -> None:
    """`LBFGS.step_` raises a TypeError naming `step`; nothing changes."""
    opt = optim.LBFGS()

    def build() -> tuple[ParamDict, object, object]:
        params = ParamDict(w=torch.tensor([3.0, -1.0]))
        return params, lambda p: (p["w"] ** 2).sum(), opt.init(params)

    check(
        Case(
            "step_",
            build,
            opt.step_,
            TypeError,
            r"`LBFGS` has no in-place `step_`.*opt\.step\(params, closure, state\)",
        )
    )


def test_lbfgs_step_is_the_way() -> None:
    """The suggested `step` does what `step_` would have."""
    params = ParamDict(w=torch.tensor([3.0, -1.0], dtype=torch.float64))
    opt = optim.LBFGS(line_search_fn="strong_wolfe")
    new, _ = opt.step(params, lambda p: ((p["w"] - 1) ** 2).sum(), opt.init(params))
    torch.testing.assert_close(new["w"], torch.ones(2, dtype=torch.float64))
    with pytest.raises(TypeError, match="step_"):
        opt.step_(params, lambda p: p["w"].sum(), opt.init(params))
