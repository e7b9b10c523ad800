"""`MultiSteps`: accumulating micro-batches equals one full-batch step."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

from paramdict import ParamDict, optim


def _problem() -> tuple[ParamDict, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    params = ParamDict(
        w=torch.randn(3, 5, generator=gen, dtype=torch.float64),
        b=torch.randn(3, generator=gen, dtype=torch.float64),
    ).requires_grad_()
    x = torch.randn(16, 5, generator=gen, dtype=torch.float64)
    y = torch.randn(16, 3, generator=gen, dtype=torch.float64)
    return params, x, y


def _loss(params: ParamDict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((x @ params["w"].T + params["b"] - y) ** 2).mean()


OPTIMIZERS = [
    optim.SGD(lr=0.1),
    optim.SGD(lr=0.1, momentum=0.9, nesterov=True),
    optim.Adam(lr=0.01),
    optim.AdamW(lr=0.01, amsgrad=True),
]


@pytest.mark.parametrize(
    "inner", OPTIMIZERS, ids=["sgd", "sgd-nesterov", "adam", "adamw-ams"]
)
def test_four_micro_batches_equal_one_full_batch(
    inner: optim.Optimizer[object],
) -> None:
    """Three rounds of 4 accumulated micro-batches equal 3 full-batch steps (1e-12)."""
    params, x, y = _problem()
    full, full_state = params, inner.init(params)
    acc = optim.MultiSteps(inner, every_k=4)
    micro, micro_state = params, acc.init(params)
    for _ in range(3):
        full, full_state = inner.step(full, full.grad(_loss(full, x, y)), full_state)
        for xb, yb in zip(x.chunk(4), y.chunk(4), strict=True):
            before = micro
            grads = micro.grad(_loss(micro, xb, yb))
            micro, micro_state = acc.step(micro, grads, micro_state)
            if int(micro_state.mini_step) != 0:  # accumulated only
                assert micro.allclose(before, rtol=0, atol=0)
        for key in params:
            torch.testing.assert_close(micro[key], full[key], rtol=1e-12, atol=1e-12)
    assert all(v.requires_grad and v.is_leaf for v in micro.values())


def test_sum_reduction_adds_the_gradients() -> None:
    """`reduction="sum"` steps with the sum of the micro-batch gradients."""
    params = ParamDict(w=torch.zeros(2, dtype=torch.float64))
    opt = optim.MultiSteps(optim.SGD(lr=1.0), every_k=3, reduction="sum")
    state = opt.init(params)
    for g in (1.0, 2.0, 4.0):
        params, state = opt.step(
            params, {"w": torch.full((2,), g, dtype=torch.float64)}, state
        )
    torch.testing.assert_close(params["w"], torch.full((2,), -7.0, dtype=torch.float64))
    assert int(state.mini_step) == 0
    # The next round starts a new sum, whatever the accumulator was left holding.
    params, state = opt.step(
        params, {"w": torch.full((2,), 8.0, dtype=torch.float64)}, state
    )
    torch.testing.assert_close(
        state.acc_grads["w"], torch.full((2,), 8.0, dtype=torch.float64)
    )


def test_differentiable_inner_keeps_the_graph() -> None:
    """A differentiable inner optimizer lets the meta-gradient through."""
    params, x, y = _problem()
    lr = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    opt = optim.MultiSteps(optim.SGD(lr=lr, differentiable=True), every_k=2)
    assert opt.differentiable
    state = opt.init(params)
    new = params
    for xb, yb in zip(x.chunk(2), y.chunk(2), strict=True):
        grads = new.grad(_loss(new, xb, yb), create_graph=True)
        new, state = opt.step(new, grads, state)
    (got,) = torch.autograd.grad(_loss(new, x, y), lr)
    # Reference: one SGD step with the full-batch gradient, in plain torch.
    g = torch.autograd.grad(
        _loss(params, x, y), list(params.values()), create_graph=True
    )
    ref = ParamDict(
        {k: v - lr * gk for (k, v), gk in zip(params.items(), g, strict=True)}
    )
    (expected,) = torch.autograd.grad(_loss(ref, x, y), lr)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_state_round_trips_weights_only() -> None:
    """The state saves and loads with `torch.load(weights_only=True)`."""
    params = ParamDict(w=torch.ones(2))
    opt = optim.MultiSteps(optim.Adam(), every_k=2)
    _, state = opt.step(params, {"w": torch.ones(2)}, opt.init(params))
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert type(loaded) is optim.MultiStepsState
    assert type(loaded.inner_state) is optim.AdamState


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"every_k": 0}, ValueError, "`every_k` must be at least 1"),
        ({"every_k": 2.0}, TypeError, "`every_k` must be an int"),
        (
            {"every_k": 2, "reduction": "max"},
            ValueError,
            "`reduction` must be 'mean' or 'sum'",
        ),
    ],
)
def test_bad_arguments_raise(
    kwargs: dict[str, object], error: type[Exception], match: str
) -> None:
    """Bad arguments are refused with the argument named."""
    with pytest.raises(error, match=match):
        optim.MultiSteps(optim.SGD(lr=0.1), **kwargs)  # type: ignore[arg-type]


def test_non_optimizer_raises() -> None:
    """Wrapping something that is not an optimizer is a TypeError."""
    with pytest.raises(TypeError, match="must be a paramdict optimizer"):
        optim.MultiSteps(torch.optim.SGD, every_k=2)  # type: ignore[arg-type]


def _reordered(d: ParamDict) -> ParamDict:
    return ParamDict({k: d[k] for k in reversed(d.keys())})


@pytest.mark.parametrize("mode", ["step", "step_"])
@pytest.mark.parametrize(
    ("acc_grads", "error", "match"),
    [
        (lambda acc: dict(acc), TypeError, r"`acc_grads` must be a ParamDict"),
        (lambda acc: acc.exclude("b"), ValueError, r"missing \['b'\]"),
        (_reordered, ValueError, r"`acc_grads` holds the parameters' keys in another"),
    ],
    ids=["dict", "missing-key", "reordered"],
)
def test_a_sum_of_another_kind_or_order_is_refused_before_any_write(
    acc_grads: Any, error: type[Exception], match: str, mode: str
) -> None:
    """The sum is added to entry by entry: it must be keyed like the parameters."""
    params = ParamDict(w=torch.ones(3, 3), b=torch.ones(3))
    opt = optim.MultiSteps(optim.Adam(lr=0.1), every_k=2)
    state = opt.init(params)
    state = state._replace(acc_grads=acc_grads(state.acc_grads))
    before = [
        t.clone() for t in (*params.values(), *state.inner_state.exp_avg.values())
    ]
    step = opt.step_ if mode == "step_" else opt.step
    with pytest.raises(error, match=match):
        step(params, params.ones_like(), state)
    after = (*params.values(), *state.inner_state.exp_avg.values())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
