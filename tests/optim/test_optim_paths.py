"""The path of a step: chosen once per binding, by the configuration and the facts.

A `TorchOptimizer` with a fused kernel plans it (`_fused.FusedPlan`) or its rule,
when it is bound; the choice reads the `fused` and `differentiable` flags and the
bound entries (dtypes, devices, the kinds of the rates), never their layout, and
is the same for `step` and `step_`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from paramdict import ParamDict, optim
from paramdict.optim import _fused


def _params() -> ParamDict:
    torch.manual_seed(0)
    return ParamDict(w=torch.randn(3, 2), b=torch.randn(2))


def _strided(params: ParamDict) -> ParamDict:
    """`w` as a view with gaps (`base[:, ::2]`): a layout no fused kernel walks."""
    base = torch.zeros(3, 4)
    base[:, ::2] = params["w"]
    return ParamDict(w=base[:, ::2], b=params["b"])


def _path(opt: optim.Optimizer[Any], params: ParamDict, in_place: bool) -> str:
    plan = opt._plan(params, opt.init(params), in_place=in_place)  # pyright: ignore[reportPrivateUsage]
    return "fused" if isinstance(plan, _fused.FusedPlan) else "rule"


ROWS: list[tuple[str, Callable[[], optim.Optimizer[Any]], bool, str]] = [
    ("Adam", lambda: optim.Adam(), False, "fused"),
    ("AdamW", lambda: optim.AdamW(), False, "fused"),
    ("SGD", lambda: optim.SGD(momentum=0.9, fused=True), False, "fused"),
    ("Adagrad", lambda: optim.Adagrad(), False, "fused"),
    ("strided entries", lambda: optim.Adam(), True, "fused"),
    ("no kernel", lambda: optim.RMSprop(), False, "rule"),
    ("fused=False", lambda: optim.Adam(fused=False), False, "rule"),
    ("differentiable", lambda: optim.Adam(differentiable=True), False, "rule"),
    ("SGD dampening", lambda: optim.SGD(momentum=0.9, dampening=0.1), False, "rule"),
    ("tensor rate", lambda: optim.Adam(lr=torch.tensor(0.1)), False, "fused"),
    ("per-key rate", lambda: optim.Adam(lr=_params().full_like(0.1)), False, "rule"),
    ("tensor decay", lambda: optim.Adam(weight_decay=torch.tensor(0.1)), False, "rule"),
    (
        "schedule",
        lambda: optim.Adam(lr=optim.StepLR(base_lr=0.1, step_size=2)),
        False,
        "fused",
    ),
    (
        "cycled momentum",
        lambda: optim.Adam(lr=optim.OneCycleLR(max_lr=0.1, total_steps=10)),
        False,
        "rule",
    ),
]


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize(
    ("make", "strided", "path"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_the_configuration_and_the_entries_choose_the_path(
    make: Callable[[], optim.Optimizer[Any]], strided: bool, path: str, in_place: bool
) -> None:
    """The same path for `step` and `step_`, whatever the entries' layout.

    (`SGD` by default keeps torch.optim's default path in `step`: below.)
    """
    params = _strided(_params()) if strided else _params()
    assert _path(make(), params, in_place) == path


def test_sgd_keeps_torch_default_path_in_step() -> None:
    """`SGD(fused=None)`: the foreach rule in `step`, the fused kernel in `step_`."""
    params = _params()
    assert _path(optim.SGD(momentum=0.9), params, False) == "rule"
    assert _path(optim.SGD(momentum=0.9), params, True) == "fused"


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize("make", [optim.Adam, optim.AdamW, optim.SGD, optim.Adagrad])
def test_layouts_give_the_bytes_of_dense_entries(
    make: Callable[..., optim.Optimizer[Any]], in_place: bool
) -> None:
    """A strided or transposed entry is staged through dense scratch: same bits."""
    dense = _params()
    base = torch.zeros(3, 4)
    base[:, ::2] = dense["w"]
    layouts = {
        "dense": dense,
        "strided": ParamDict(w=base[:, ::2], b=dense["b"].clone()),
        "transposed": ParamDict(
            w=dense["w"].t().contiguous().t(), b=dense["b"].clone()
        ),
    }
    results: dict[str, list[torch.Tensor]] = {}
    for name, start in layouts.items():
        opt = make(lr=0.1, **({"momentum": 0.9} if make is optim.SGD else {}))
        params = start.clone() if name == "dense" else start
        state = opt.init(params)
        step = opt.step_ if in_place else opt.step
        for i in range(3):
            grads = ParamDict(w=torch.full((3, 2), 0.5 + i), b=torch.ones(2))
            params, state = step(params, grads, state)
        results[name] = [p.contiguous() for p in params.values()]
    for name, got in results.items():
        for mine, theirs in zip(got, results["dense"], strict=True):
            assert torch.equal(mine, theirs), name


def test_a_transform_takes_the_rule() -> None:
    """Under `torch.func.vmap` the rule runs (a fused kernel has no batching rule)."""
    opt = optim.Adam(lr=0.1)

    def one(w: torch.Tensor) -> torch.Tensor:
        params = ParamDict(w=w)
        return opt.step(params, params, opt.init(params))[0]["w"]

    out = torch.func.vmap(one)(torch.ones(4, 3))
    torch.testing.assert_close(out, torch.full((4, 3), 0.9))


def test_the_fused_refusal_says_why_and_writes_nothing() -> None:
    """`fused=True` where no kernel can take the step: refused before any write."""
    params = _params()
    opt = optim.Adam(lr=params.full_like(0.1), fused=True)
    state = opt.init(params)
    before = [t.clone() for t in (*params.values(), state.step)]
    with pytest.raises(ValueError, match=r"per-key ParamDict.*fused=None"):
        opt.step_(params, params.map(torch.ones_like), state)
    for old, new in zip(before, (*params.values(), state.step), strict=True):
        assert torch.equal(old, new)


@pytest.mark.parametrize("transform", ["vmap", "grad"])
def test_step_in_place_under_a_transform_is_refused_and_writes_nothing(
    transform: str,
) -> None:
    """`step_` writes into its inputs, which a transform sees as wrapped values."""
    params = _params()
    opt = optim.Adam(lr=0.1)
    state = opt.init(params)
    before = [t.clone() for t in (*params.values(), state.step)]

    def inside(x: torch.Tensor) -> torch.Tensor:
        opt.step_(params, params.map(lambda t: t * x.sum()), state)
        return x.sum()

    run = torch.func.vmap(inside) if transform == "vmap" else torch.func.grad(inside)
    with pytest.raises(ValueError, match=r"`torch.func` transform.*Call `step`"):
        run(torch.ones(2, 3))
    for old, new in zip(before, (*params.values(), state.step), strict=True):
        assert torch.equal(old, new)
