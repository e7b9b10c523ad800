"""`step_` checks, then commits: a failure at any point leaves everything as it was.

Each optimizer of the table and each wrapper runs in place with a schedule whose
callback raises at the second step (a `ValueError`, or a `KeyboardInterrupt` as
from Ctrl-C); the parameters, every buffer and every counter must keep every byte.
A retry after the failure then equals an uninterrupted run: nothing was applied
twice. The states `init` builds for every schedule composition are accepted by
`step_` and `step_module` and give `step`'s values.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from optim_cases import TABLE, Case
from torch import Tensor, nn

from paramdict import ParamDict, optim

sys.path.insert(0, str(Path(__file__).parents[1] / "hostile"))
from _unchanged import equal
from _unchanged import state as snapshot

F64 = torch.float64


class _Trip:
    """A schedule callback that raises `error` on its first call once armed."""

    def __init__(self, error: type[BaseException]) -> None:
        self.error, self.armed = error, False

    def __call__(self, epoch: Tensor) -> float:
        if self.armed:
            self.armed = False
            msg = "a schedule callback failed"
            raise self.error(msg)
        return float(0.9 ** float(epoch))


def _params(case: Case) -> ParamDict:
    generator = torch.Generator().manual_seed(0)
    shapes = (
        {"a.weight": (3, 4), "b.weight": (4, 2)}
        if case.matrices_only
        else {"lin.weight": (3, 4), "bias": (4,), "scale": ()}
    )
    return ParamDict(
        {k: torch.randn(s, generator=generator, dtype=F64) for k, s in shapes.items()}
    )


def _grads(params: ParamDict, seed: int) -> ParamDict:
    generator = torch.Generator().manual_seed(seed)
    return params.map(lambda v: torch.randn(v.shape, generator=generator, dtype=F64))


def _with_schedule(case: Case, trip: Callable[[Tensor], float]) -> optim.Optimizer[Any]:
    kwargs = dict(case.rich)
    base = float(kwargs.pop("lr", 1.0))
    return case.ours(lr=optim.LambdaLR(base_lr=base, lr_lambda=trip), **kwargs)


def _wrapped(trip: Callable[[Tensor], float]) -> dict[str, optim.Optimizer[Any]]:
    def lr() -> optim.LambdaLR:
        return optim.LambdaLR(base_lr=0.01, lr_lambda=trip)

    return {
        "groups": optim.ParamGroups(
            {"lin.*": optim.SGD(lr=0.1, momentum=0.9)},
            default=optim.Adam(lr=lr()),
        ),
        "clip": optim.ClipGradNorm(optim.AdamW(lr=lr()), max_norm=0.5),
        "multisteps": optim.MultiSteps(optim.RMSprop(lr=lr()), every_k=1),
    }


def _cases() -> list[Any]:
    rows = [
        pytest.param(
            lambda trip, c=c: _with_schedule(c, trip),
            c,
            id=c.name,
            marks=c.mark(c.name),
        )
        for c in TABLE
    ]
    rows += [
        pytest.param(lambda trip, n=name: _wrapped(trip)[n], TABLE[0], id=name)
        for name in ("groups", "clip", "multisteps")
    ]
    return rows


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
@pytest.mark.parametrize(("make", "case"), _cases())
def test_failing_schedule_callback_changes_nothing(
    make: Callable[[Callable[[Tensor], float]], optim.Optimizer[Any]],
    case: Case,
    error: type[BaseException],
) -> None:
    """A callback raising in a `step_` leaves every byte; a retry is exact."""
    trip = _Trip(error)
    opt = make(trip)
    params = _params(case)
    state = opt.init(params)
    params, state = opt.step_(params, _grads(params, 1), state)
    before = snapshot((params, state))
    trip.armed = True
    with pytest.raises(error, match="a schedule callback failed"):
        opt.step_(params, _grads(params, 2), state)
    assert equal(snapshot((params, state)), before)
    params, state = opt.step_(params, _grads(params, 2), state)  # the retry

    reference = make(_Trip(error))
    expected = _params(case)
    ref_state = reference.init(expected)
    for seed in (1, 2):
        expected, ref_state = reference.step(
            expected, _grads(expected, seed), ref_state
        )
    torch.testing.assert_close(dict(params), dict(expected), rtol=1e-12, atol=1e-13)


def _compositions() -> dict[str, optim.LRSchedule]:
    def warmup() -> optim.LinearLR:
        return optim.LinearLR(start_factor=0.1, total_iters=3)

    return {
        "sequential": optim.SequentialLR(
            base_lr=0.05,
            schedulers=[warmup(), optim.CosineAnnealingLR(T_max=10)],
            milestones=[3],
        ),
        "chained": optim.ChainedScheduler(
            schedulers=[warmup(), optim.ExponentialLR(gamma=0.9)], base_lr=0.05
        ),
        "nested": optim.SequentialLR(
            base_lr=0.05,
            schedulers=[
                optim.ChainedScheduler(
                    schedulers=[warmup(), optim.ExponentialLR(gamma=0.9)]
                ),
                optim.CosineAnnealingLR(T_max=10),
            ],
            milestones=[3],
        ),
        "cyclic": optim.CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=2),
        "one-cycle": optim.OneCycleLR(max_lr=0.1, total_steps=20),
        "warm-restarts": optim.CosineAnnealingWarmRestarts(base_lr=0.05, T_0=2),
    }


@pytest.mark.parametrize("name", sorted(_compositions()))
@pytest.mark.parametrize("make", [optim.SGD, optim.AdamW], ids=["sgd", "adamw"])
def test_init_of_every_composition_is_accepted_in_place(
    name: str, make: Callable[..., optim.Optimizer[Any]]
) -> None:
    """`init`'s state runs through `step_` and `step_module` and equals `step`."""
    schedule = _compositions()[name]
    extra = {"momentum": 0.9} if make is optim.SGD else {}
    opt = make(lr=schedule, **extra)
    start = ParamDict(
        weight=torch.randn(3, 4, dtype=F64), bias=torch.randn(3, dtype=F64)
    )
    grads = [_grads(start, seed) for seed in range(4)]

    expected, state = start, opt.init(start)
    for g in grads:
        expected, state = opt.step(expected, g, state)

    in_place, state = start.clone(), opt.init(start)
    for g in grads:
        in_place, state = opt.step_(in_place, g, state)
    # SGD's `step` runs its rule, its `step_` torch's fused kernel: equal to rounding.
    torch.testing.assert_close(dict(in_place), dict(expected), rtol=1e-12, atol=1e-13)

    module = nn.Linear(4, 3).to(F64)
    with torch.no_grad():
        module.weight.copy_(start["weight"])
        module.bias.copy_(start["bias"])
    state = opt.init(ParamDict.from_module(module))
    for g in grads:

        def loss_fn(g: ParamDict = g) -> Tensor:
            return (module.weight * g["weight"]).sum() + (module.bias * g["bias"]).sum()

        _, state = opt.step_module(module, loss_fn, state)
    torch.testing.assert_close(
        dict(ParamDict.from_module(module).detach()), dict(in_place), rtol=0, atol=0
    )
