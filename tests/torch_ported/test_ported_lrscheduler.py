"""PyTorch's `test/optim/test_lrscheduler.py`, on the functional schedules.

Upstream steps each scheduler on an SGD with two parameter groups (rates 0.05 and
a tensor 0.5) and compares the groups' rates with hand-written targets at
`atol=1e-5`. A paramdict schedule holds one rate, so each group is its own run
(`init(0.05)`, `init(torch.tensor(0.5))`); `state.lr` after `n` steps is the
group's rate after `n` `scheduler.step()` calls. Two schedulers stepped on one
optimizer ("compound" tests) are a `ChainedScheduler`. Beside the targets,
each case is also run against torch's scheduler and compared bit for bit.

Upstream tests not ported, with the reason:

- `test_error_when_getlr_has_epoch`, `test_no_cyclic_references`,
  `test_no_cyclic_references_in_step`, `test_cycle_lr_removed_after_out_of_scope`:
  subclassing and garbage collection of torch's scheduler objects; a schedule
  here is an attrs value holding no optimizer.
- `test_old_pattern_warning*` (5) and `test_new_pattern_no_warning*` (3): the
  warning about calling `scheduler.step()` before `optimizer.step()`; a schedule
  here is not attached to an optimizer, so there is no order to warn about.
- `test_*_is_constant_for_constant_epoch` (5), `test_*_with_epoch` (3) and the
  `step(epoch)` half of `test_closed_form_*` (7): the deprecated
  `step(epoch)`; paramdict refuses it for every schedule but
  `CosineAnnealingWarmRestarts` (checked in `test_step_epoch_is_refused`),
  and the closed forms are written out here instead.
- `test_raise_error_when_last_epoch_is_greater_than_0_and_initial_lr_is_not_specified`,
  `test_cos_anneal_lr_continue`, `test_lr_scheduler_checkpoint`,
  `test_lr_scheduler_checkpoint_on_plateau`: resuming through `last_epoch` and
  `initial_lr`; paramdict resumes from a saved `ScheduleState` instead.
- `test_*_state_dict*` (10, with `test_lr_scheduler_state_dict_load`),
  `test_cycle_lr_state_dict_picklable`,
  `test_cycle_lr_scale_fn_restored_from_state_dict`,
  `test_onecycle_lr_legacy_state_dict`: torch's scheduler `state_dict`; the
  state here is a NamedTuple of tensors, saved like any other.
- `test_add_param_group_does_not_break_reduce_lr_on_plateau`,
  `test_add_param_group_errors_reduce_lr_on_plateau`: parameter groups added to
  a torch optimizer mid-run; a schedule here holds one rate.
- `test_CosineAnnealingWarmRestarts_T_cur_reset`: assigns the torch object's
  `T_cur` attribute by hand; the position here is in the state.

Upstream's `test_compound_reduce_lr_on_plateau1..5` set `targets = targets[1:]`
on a one-element list, so they compare nothing; here the same settings are
compared with torch's two schedulers side by side instead.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from _torch_versions import needs_torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.optim import lr_scheduler as tls
from torch.optim import swa_utils

from paramdict import ParamDict, optim

_loose: Any = optim  # untyped view of the API, to pass bad arguments
TorchMake = Callable[[torch.optim.Optimizer], Any]
BASES = (0.05, 0.5)  # upstream's two parameter groups
ETA = 1e-10


def _base(lr: float) -> float | torch.Tensor:
    """Upstream's first group holds a float, its second a tensor rate."""
    return torch.tensor(lr) if lr == 0.5 else lr


def _rates(schedule: Any, lr: float | torch.Tensor | None, n: int) -> list[float]:
    """`state.lr` at init and after each of `n - 1` steps (`n` rates)."""
    state = schedule.init(lr)
    out = [float(state.lr)]
    for _ in range(n - 1):
        state = schedule.step(state)
        out.append(float(state.lr))
    return out


def _torch_rates(make: Sequence[TorchMake], lr: float, n: int) -> list[float]:
    """The same with torch's schedulers, all stepped on one SGD each time."""
    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=lr, momentum=0.9)
    with warnings.catch_warnings():
        # torch's SequentialLR steps a chained child before any optimizer step.
        warnings.filterwarnings(
            "ignore", "Detected call of `lr_scheduler.step", UserWarning
        )
        scheds = [m(opt) for m in make]
        out = [float(opt.param_groups[0]["lr"])]
        for _ in range(n - 1):
            opt.step()
            for sched in scheds:
                sched.step()
            out.append(float(opt.param_groups[0]["lr"]))
    return out


def _close(got: Sequence[float], expected: Sequence[float]) -> None:
    """Upstream's tolerance: `atol=1e-5`, `rtol=0`."""
    torch.testing.assert_close(
        torch.tensor(got, dtype=torch.float64),
        torch.tensor(expected, dtype=torch.float64),
        atol=1e-5,
        rtol=0,
    )


def _bitwise(got: Sequence[float], expected: Sequence[float]) -> None:
    diffs = [i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
    assert not diffs, f"first difference at step {diffs[0]}: {got[diffs[0]]!r}"


def _cos(b: float, x: float, t: float) -> float:
    return ETA + (b - ETA) * (1 + math.cos(math.pi * x / t)) / 2


def _lin(start: float, end: float, iters: int, n: int) -> list[float]:
    return [start + i * (end - start) / iters for i in range(iters)] + [end] * (
        n - iters
    )


def _poly(b: float, power: float, total: int, n: int) -> list[float]:
    return [b * (1.0 - x / total) ** power for x in range(total)] + [0.0] * (n - total)


# (id, our schedule, torch's schedulers, epochs, targets for a base rate b)
Case = tuple[str, Any, Sequence[TorchMake], int, Callable[[float], list[float]]]
CASES: list[Case] = [
    (
        "step_lr",
        optim.StepLR(step_size=3, gamma=0.1),
        [lambda o: tls.StepLR(o, step_size=3, gamma=0.1)],
        10,
        lambda b: [b * 0.1 ** (i // 3) for i in range(10)],
    ),
    (
        "multi_step_lr",
        optim.MultiStepLR(milestones=[2, 5, 9], gamma=0.1),
        [lambda o: tls.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.1)],
        10,
        lambda b: [b] * 2 + [b * 0.1] * 3 + [b * 0.01] * 4 + [b * 0.001],
    ),
    (
        "constantlr",
        optim.ConstantLR(factor=0.5, total_iters=5),
        [lambda o: tls.ConstantLR(o, factor=0.5, total_iters=5)],
        10,
        lambda b: [b * 0.5] * 5 + [b] * 5,
    ),
    (
        "linearlr",
        optim.LinearLR(start_factor=0.5, total_iters=4),
        [lambda o: tls.LinearLR(o, start_factor=0.5, total_iters=4)],
        10,
        lambda b: [b * f for f in _lin(0.5, 1.0, 4, 10)],
    ),
    (
        "get_last_lr_linearlr",
        optim.LinearLR(start_factor=0.25, end_factor=0.6, total_iters=4),
        [lambda o: tls.LinearLR(o, start_factor=0.25, end_factor=0.6, total_iters=4)],
        10,
        lambda b: [b * f for f in _lin(0.25, 0.6, 4, 10)],
    ),
    (
        "exp_lr",
        optim.ExponentialLR(gamma=0.9),
        [lambda o: tls.ExponentialLR(o, gamma=0.9)],
        10,
        lambda b: [b * 0.9**x for x in range(10)],
    ),
    (
        "poly_lr",
        optim.PolynomialLR(power=0.9, total_iters=5),
        [lambda o: tls.PolynomialLR(o, power=0.9, total_iters=5)],
        10,
        lambda b: _poly(b, 0.9, 5, 10),
    ),
    (
        "cos_anneal_lr",
        optim.CosineAnnealingLR(T_max=10, eta_min=ETA),
        [lambda o: tls.CosineAnnealingLR(o, T_max=10, eta_min=ETA)],
        10,
        lambda b: [_cos(b, x, 10) for x in range(10)],
    ),
    # The closed forms of `test_closed_form_*`, 20 epochs each.
    (
        "closed_form_step_lr",
        optim.StepLR(step_size=3, gamma=0.1),
        [lambda o: tls.StepLR(o, step_size=3, gamma=0.1)],
        20,
        lambda b: [b * 0.1 ** (e // 3) for e in range(20)],
    ),
    (
        "closed_form_linearlr",
        optim.LinearLR(start_factor=1 / 3, end_factor=0.7, total_iters=4),
        [lambda o: tls.LinearLR(o, start_factor=1 / 3, end_factor=0.7, total_iters=4)],
        20,
        lambda b: [b * (1 / 3 + (0.7 - 1 / 3) * min(e, 4) / 4) for e in range(20)],
    ),
    (
        "closed_form_constantlr",
        optim.ConstantLR(factor=1 / 3, total_iters=4),
        [lambda o: tls.ConstantLR(o, factor=1 / 3, total_iters=4)],
        20,
        lambda b: [b / 3 if e < 4 else b for e in range(20)],
    ),
    (
        "closed_form_multi_step_lr",
        optim.MultiStepLR(milestones=[2, 5, 9], gamma=0.1),
        [lambda o: tls.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.1)],
        20,
        lambda b: [b * 0.1 ** sum(e >= m for m in (2, 5, 9)) for e in range(20)],
    ),
    (
        "closed_form_exp_lr",
        optim.ExponentialLR(gamma=0.9),
        [lambda o: tls.ExponentialLR(o, gamma=0.9)],
        20,
        lambda b: [b * 0.9**e for e in range(20)],
    ),
    (
        "closed_form_poly_lr",
        optim.PolynomialLR(power=0.9),
        [lambda o: tls.PolynomialLR(o, power=0.9)],
        20,
        lambda b: [b * (1 - min(e, 5) / 5) ** 0.9 for e in range(20)],
    ),
    (
        "closed_form_cos_anneal_lr",
        optim.CosineAnnealingLR(T_max=5, eta_min=ETA),
        [lambda o: tls.CosineAnnealingLR(o, T_max=5, eta_min=ETA)],
        20,
        lambda b: [_cos(b, e, 5) for e in range(20)],
    ),
    # SequentialLR: `test_sequentiallr1..3,5`, `test_get_last_lr_sequentiallr`.
    (
        "sequentiallr1",
        optim.SequentialLR(
            schedulers=[optim.ExponentialLR(gamma=0.8), optim.StepLR(step_size=4)],
            milestones=[3],
        ),
        [
            lambda o: tls.SequentialLR(
                o,
                schedulers=[tls.ExponentialLR(o, 0.8), tls.StepLR(o, step_size=4)],
                milestones=[3],
            )
        ],
        19,
        lambda b: (
            [b, b * 0.8, b * 0.64] + [b * 0.1**i for i in range(4) for _ in "1234"]
        ),
    ),
    (
        "sequentiallr2",
        optim.SequentialLR(
            schedulers=[
                optim.ConstantLR(factor=0.1, total_iters=3),
                optim.ExponentialLR(gamma=0.9),
            ],
            milestones=[3],
        ),
        [
            lambda o: tls.SequentialLR(
                o,
                schedulers=[
                    tls.ConstantLR(o, factor=0.1, total_iters=3),
                    tls.ExponentialLR(o, gamma=0.9),
                ],
                milestones=[3],
            )
        ],
        13,
        lambda b: [b * 0.1] * 3 + [b * 0.9**x for x in range(10)],
    ),
    (
        "sequentiallr3",
        optim.SequentialLR(
            schedulers=[
                optim.ConstantLR(factor=0.1, total_iters=3),
                optim.ExponentialLR(gamma=0.8),
                optim.StepLR(step_size=2, gamma=0.1),
            ],
            milestones=[3, 6],
        ),
        [
            lambda o: tls.SequentialLR(
                o,
                schedulers=[
                    tls.ConstantLR(o, factor=0.1, total_iters=3),
                    tls.ExponentialLR(o, gamma=0.8),
                    tls.StepLR(o, step_size=2, gamma=0.1),
                ],
                milestones=[3, 6],
            )
        ],
        12,
        lambda b: (
            [b * 0.1] * 3
            + [b, b * 0.8, b * 0.64]
            + [b, b, b * 0.1, b * 0.1, b * 0.01, b * 0.01]
        ),
    ),
    (
        "sequentiallr5",
        optim.SequentialLR(
            schedulers=[
                optim.ChainedScheduler(
                    schedulers=[
                        optim.LinearLR(start_factor=0.1, total_iters=5),
                        optim.ConstantLR(factor=0.1, total_iters=5),
                    ]
                ),
                optim.ConstantLR(factor=0.5, total_iters=5),
            ],
            milestones=[5],
        ),
        [
            lambda o: tls.SequentialLR(
                o,
                schedulers=[
                    tls.ChainedScheduler(
                        [
                            tls.LinearLR(o, start_factor=0.1, total_iters=5),
                            tls.ConstantLR(o, factor=0.1, total_iters=5),
                        ]
                    ),
                    tls.ConstantLR(o, factor=0.5, total_iters=5),
                ],
                milestones=[5],
            )
        ],
        10,
        lambda b: [b * f for f in (0.01, 0.028, 0.046, 0.064, 0.082)] + [b * 0.5] * 5,
    ),
    # ChainedScheduler: `test_chained_lr1..5`.
    (
        "chained_lr1",
        optim.ChainedScheduler(schedulers=[optim.StepLR(step_size=3, gamma=0.1)]),
        [lambda o: tls.ChainedScheduler([tls.StepLR(o, step_size=3, gamma=0.1)])],
        10,
        lambda b: [b * 0.1 ** (i // 3) for i in range(10)],
    ),
    (
        "chained_lr2",
        optim.ChainedScheduler(
            schedulers=[optim.LinearLR(start_factor=0.4, total_iters=3)]
        ),
        [
            lambda o: tls.ChainedScheduler(
                [tls.LinearLR(o, start_factor=0.4, total_iters=3)]
            )
        ],
        10,
        lambda b: [b * 0.4, b * 0.6, b * 0.8] + [b] * 7,
    ),
    (
        "chained_lr3",
        optim.ChainedScheduler(
            schedulers=[
                optim.LinearLR(start_factor=0.4, total_iters=3),
                optim.MultiStepLR(milestones=[4, 8, 10], gamma=0.1),
            ]
        ),
        [
            lambda o: tls.ChainedScheduler(
                [
                    tls.LinearLR(o, start_factor=0.4, total_iters=3),
                    tls.MultiStepLR(o, milestones=[4, 8, 10], gamma=0.1),
                ]
            )
        ],
        10,
        lambda b: [b * 0.4, b * 0.6, b * 0.8, b] + [b * 0.1] * 4 + [b * 0.01] * 2,
    ),
    (
        "chained_lr4",
        optim.ChainedScheduler(
            schedulers=[
                optim.ExponentialLR(gamma=0.9),
                optim.ConstantLR(factor=0.2, total_iters=4),
                optim.StepLR(step_size=3, gamma=0.1),
            ]
        ),
        [
            lambda o: tls.ChainedScheduler(
                [
                    tls.ExponentialLR(o, gamma=0.9),
                    tls.ConstantLR(o, factor=0.2, total_iters=4),
                    tls.StepLR(o, step_size=3, gamma=0.1),
                ]
            )
        ],
        9,
        lambda b: (
            [b * 0.2 * 0.9**x for x in range(3)]
            + [b * 0.2 * 0.9**3 * 0.1]
            + [b * 0.9**x * 0.1 for x in (4, 5)]
            + [b * 0.9**x * 0.01 for x in (6, 7, 8)]
        ),
    ),
    (
        "chained_lr5",
        optim.ChainedScheduler(
            schedulers=[
                optim.PolynomialLR(power=0.9, total_iters=5),
                optim.ConstantLR(factor=0.1),
            ]
        ),
        [
            lambda o: tls.ChainedScheduler(
                [
                    tls.PolynomialLR(o, power=0.9, total_iters=5),
                    tls.ConstantLR(o, factor=0.1),
                ]
            )
        ],
        10,
        lambda b: [0.1 * x for x in _poly(b, 0.9, 5, 10)],
    ),
    (
        "sequentiallr_no_warnings",
        optim.SequentialLR(
            schedulers=[
                optim.LinearLR(start_factor=0.5, end_factor=0.1, total_iters=5),
                optim.ExponentialLR(gamma=0.9),
            ],
            milestones=[5],
        ),
        [
            lambda o: tls.SequentialLR(
                o,
                schedulers=[
                    tls.LinearLR(o, start_factor=0.5, end_factor=0.1, total_iters=5),
                    tls.ExponentialLR(o, gamma=0.9),
                ],
                milestones=[5],
            )
        ],
        10,
        lambda b: (
            [b * f for f in _lin(0.5, 0.1, 5, 5)] + [b * 0.9**x for x in range(5)]
        ),
    ),
]


def _pair(a: Any, b: Any, ta: TorchMake, tb: TorchMake) -> tuple[Any, list[TorchMake]]:
    """Two schedulers on one optimizer: ours chained, torch's stepped in turn."""
    return optim.ChainedScheduler(schedulers=[a, b]), [ta, tb]


def _lin_factor(i: int, start: float, end: float = 1.0, iters: int = 4) -> float:
    return start + i / iters * (end - start) if i < iters else end


# `test_compound_*`: (id, (ours, torch's), targets), 10 epochs each.
COMPOUND: list[tuple[str, tuple[Any, list[TorchMake]], Callable[[float], list[float]]]]
COMPOUND = [
    (
        "step_and_multistep_lr",
        _pair(
            optim.StepLR(step_size=3, gamma=0.1),
            optim.MultiStepLR(milestones=[2, 5, 9], gamma=0.1),
            lambda o: tls.StepLR(o, step_size=3, gamma=0.1),
            lambda o: tls.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.1),
        ),
        lambda b: (
            [b] * 2
            + [b * 0.1]
            + [b * 1e-2] * 2
            + [b * 1e-3]
            + [b * 1e-4] * 3
            + [b * 1e-6]
        ),
    ),
    (
        "step_and_exp_lr",
        _pair(
            optim.StepLR(step_size=3, gamma=0.1),
            optim.ExponentialLR(gamma=0.9),
            lambda o: tls.StepLR(o, step_size=3, gamma=0.1),
            lambda o: tls.ExponentialLR(o, gamma=0.9),
        ),
        lambda b: [b * 0.1 ** (i // 3) * 0.9**i for i in range(10)],
    ),
    (
        "exp_and_multistep_lr",
        _pair(
            optim.MultiStepLR(milestones=[2, 5, 9], gamma=0.1),
            optim.ExponentialLR(gamma=0.9),
            lambda o: tls.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.1),
            lambda o: tls.ExponentialLR(o, gamma=0.9),
        ),
        lambda b: [
            b * 0.1 ** sum(i >= m for m in (2, 5, 9)) * 0.9**i for i in range(10)
        ],
    ),
    (
        "exp_and_linearlr",
        _pair(
            optim.LinearLR(start_factor=0.4, end_factor=0.9, total_iters=4),
            optim.ExponentialLR(gamma=0.9),
            lambda o: tls.LinearLR(o, start_factor=0.4, end_factor=0.9, total_iters=4),
            lambda o: tls.ExponentialLR(o, gamma=0.9),
        ),
        lambda b: [b * 0.9**i * _lin_factor(i, 0.4, 0.9) for i in range(10)],
    ),
    (
        "step_and_constantlr",
        _pair(
            optim.StepLR(step_size=3, gamma=0.1),
            optim.ConstantLR(factor=0.4, total_iters=4),
            lambda o: tls.StepLR(o, step_size=3, gamma=0.1),
            lambda o: tls.ConstantLR(o, factor=0.4, total_iters=4),
        ),
        lambda b: (
            [b * 0.4] * 3
            + [b * 0.1 * 0.4]
            + [b * 0.1] * 2
            + [b * 0.01] * 3
            + [b * 0.001]
        ),
    ),
    (
        "linearlr_and_multistep_lr",
        _pair(
            optim.MultiStepLR(milestones=[2, 5, 9], gamma=0.1),
            optim.LinearLR(start_factor=0.4, total_iters=4),
            lambda o: tls.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.1),
            lambda o: tls.LinearLR(o, start_factor=0.4, total_iters=4),
        ),
        lambda b: [
            b * 0.1 ** sum(i >= m for m in (2, 5, 9)) * _lin_factor(i, 0.4)
            for i in range(10)
        ],
    ),
    (
        "cosanneal_and_step_lr",
        _pair(
            optim.CosineAnnealingLR(T_max=10, eta_min=ETA),
            optim.StepLR(step_size=3, gamma=0.1),
            lambda o: tls.CosineAnnealingLR(o, T_max=10, eta_min=ETA),
            lambda o: tls.StepLR(o, step_size=3, gamma=0.1),
        ),
        lambda b: [_cos(b, i, 10) * 0.1 ** (i // 3) for i in range(10)],
    ),
    (
        "cosanneal_and_multistep_lr",
        _pair(
            optim.CosineAnnealingLR(T_max=10, eta_min=ETA),
            optim.MultiStepLR(milestones=[2, 5, 9], gamma=0.1),
            lambda o: tls.CosineAnnealingLR(o, T_max=10, eta_min=ETA),
            lambda o: tls.MultiStepLR(o, milestones=[2, 5, 9], gamma=0.1),
        ),
        lambda b: [
            _cos(b, i, 10) * 0.1 ** sum(i >= m for m in (2, 5, 9)) for i in range(10)
        ],
    ),
    (
        "cosanneal_and_linearlr",
        _pair(
            optim.LinearLR(start_factor=0.4, total_iters=4),
            optim.CosineAnnealingLR(T_max=10, eta_min=ETA),
            lambda o: tls.LinearLR(o, start_factor=0.4, total_iters=4),
            lambda o: tls.CosineAnnealingLR(o, T_max=10, eta_min=ETA),
        ),
        lambda b: [_cos(b, i, 10) * _lin_factor(i, 0.4) for i in range(10)],
    ),
    (
        "cosanneal_and_exp_lr",
        _pair(
            optim.CosineAnnealingLR(T_max=10, eta_min=ETA),
            optim.ExponentialLR(gamma=0.1),
            lambda o: tls.CosineAnnealingLR(o, T_max=10, eta_min=ETA),
            lambda o: tls.ExponentialLR(o, gamma=0.1),
        ),
        lambda b: [_cos(b, i, 10) * 0.1**i for i in range(10)],
    ),
]
CASES += [
    (f"compound_{name}", pair[0], pair[1], 10, targets)
    for name, pair, targets in COMPOUND
]


@pytest.mark.parametrize("lr", BASES)
@pytest.mark.parametrize(
    ("schedule", "torch_make", "epochs", "targets"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_schedule_targets(
    schedule: Any,
    torch_make: Sequence[TorchMake],
    epochs: int,
    targets: Callable[[float], list[float]],
    lr: float,
) -> None:
    """Each rate meets upstream's target and equals torch's scheduler bitwise."""
    _close(_rates(schedule, _base(lr), epochs), targets(lr))
    _bitwise(_rates(schedule, lr, epochs), _torch_rates(torch_make, lr, epochs))


def test_sequentiallr_keeps_the_initial_rate() -> None:
    """`test_sequentiallr4`: the later schedules leave the starting rate alone."""
    schedule = optim.SequentialLR(
        schedulers=[optim.ConstantLR(factor=1), optim.ConstantLR(factor=0.1)],
        milestones=[10],
    )
    assert float(schedule.init(0.1).lr) == 0.1


def test_sequentiallr_from_a_tensor_rate() -> None:
    """`test_sequentiallr_does_not_alias_lr_and_initial_lr`, from a tensor 2.0."""
    schedule = optim.SequentialLR(
        schedulers=[
            optim.LinearLR(start_factor=0.1, end_factor=0.8, total_iters=4),
            optim.LinearLR(start_factor=0.8, end_factor=0.1, total_iters=4),
        ],
        milestones=[4],
    )
    lr = torch.tensor(2.0)
    expected = [0.2, 0.55, 0.9, 1.25, 1.6, 1.25, 0.9, 0.55]
    _close(_rates(schedule, lr, 8), expected)
    assert float(lr) == 2.0


@pytest.mark.parametrize("steps", [0, 10])
def test_chained_lr_is_its_last_schedule_rate(steps: int) -> None:
    """`test_chained_lr2_get_last_lr_before_step`: the chain's rate is the last's."""
    schedule = optim.ChainedScheduler(
        schedulers=[
            optim.LinearLR(start_factor=0.4, total_iters=3),
            optim.MultiStepLR(milestones=[4, 8, 10], gamma=0.1),
        ]
    )
    state = schedule.init(0.05)
    for _ in range(steps):
        state = schedule.step(state)
    last = state.children[-1]
    assert float(state.lr) == float(last.lr)


def _plateau_rates(
    schedule: Any, lr: float | torch.Tensor, metrics: list[float]
) -> list[float]:
    """The rate after each `step(state, metric)`, as upstream checks it."""
    state = schedule.init(lr)
    out = []
    for metric in metrics:
        state = schedule.step(state, metric)
        out.append(float(state.lr))
    return out


def _torch_plateau_rates(kwargs: dict[str, Any], metrics: list[float]) -> list[float]:
    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=0.5)
    sched = tls.ReduceLROnPlateau(opt, **kwargs)
    out = []
    for metric in metrics:
        opt.step()
        sched.step(metric)
        out.append(float(opt.param_groups[0]["lr"]))
    return out


ABS_MIN = {"threshold_mode": "abs", "mode": "min"}
REL_MAX = {"threshold_mode": "rel", "mode": "max", "threshold": 0.1}
# `test_reduce_lr_on_plateau1..8`: (settings, metrics, targets), from rate 0.5.
PLATEAU: list[tuple[dict[str, Any], list[float], list[float]]] = [
    (
        {**ABS_MIN, "threshold": 0.01, "patience": 5, "cooldown": 5},
        [10 - i * 0.0167 for i in range(10)],
        [0.5] * 10,
    ),
    (
        {**ABS_MIN, "threshold": 0.1, "patience": 5, "cooldown": 0},
        [10 - i * 0.0165 for i in range(22)],
        [0.5] * 6 + [0.05] * 7 + [0.005] * 7 + [0.0005] * 2,
    ),
    (
        {"mode": "max", "threshold_mode": "abs", "patience": 5, "cooldown": 5},
        [-0.8] * 2 + [-0.234] * 20,
        [0.5] * 8 + [0.05] * 11 + [0.005] * 3,
    ),
    (
        {**REL_MAX, "patience": 3},
        [1.5 * 1.025**i for i in range(20)],
        [0.5] * 20,
    ),
    (
        {**REL_MAX, "patience": 5, "cooldown": 5},
        [1.5 * 1.005**i for i in range(20)],
        [0.5] * 6 + [0.05] * 11 + [0.005] * 3,
    ),
    (
        {"mode": "min", "threshold_mode": "rel", "threshold": 0.1},
        [1.5 * 0.85**i for i in range(20)],
        [0.5] * 20,
    ),
    (
        {
            "mode": "min",
            "threshold_mode": "rel",
            "threshold": 0.1,
            "patience": 5,
            "cooldown": 5,
        },
        [1.0] * 7 + [0.6] + [0.5] * 12,
        [0.5] * 6 + [0.05] * 11 + [0.005] * 3,
    ),
    (
        {**REL_MAX, "patience": 5, "cooldown": 5, "min_lr": 0.4},
        [1.5 * 1.005**i for i in range(20)],
        [0.5] * 6 + [0.4] * 14,
    ),
    (  # upstream's second group of the same test
        {**REL_MAX, "patience": 5, "cooldown": 5, "min_lr": 0.3},
        [1.5 * 1.005**i for i in range(20)],
        [0.5] * 6 + [0.3] * 14,
    ),
]


@pytest.mark.parametrize("tensor", [False, True])
@pytest.mark.parametrize(
    ("kwargs", "metrics", "targets"),
    PLATEAU,
    ids=["1", "2", "3", "4", "5", "6", "7", "8-group0", "8-group1"],
)
def test_reduce_lr_on_plateau(
    kwargs: dict[str, Any], metrics: list[float], targets: list[float], tensor: bool
) -> None:
    """Each rate meets upstream's target and equals torch's plateau bitwise."""
    schedule = optim.ReduceLROnPlateau(**kwargs)
    lr = torch.tensor(0.5) if tensor else 0.5
    _close(_plateau_rates(schedule, lr, metrics), targets)
    _bitwise(
        _plateau_rates(schedule, 0.5, metrics), _torch_plateau_rates(kwargs, metrics)
    )


def test_reduce_lr_on_plateau_rate_before_step() -> None:
    """`test_reduce_lr_on_plateau_get_last_lr_before_step`: the rate given."""
    assert float(optim.ReduceLROnPlateau().init(0.5).lr) == 0.5


def test_reduce_lr_on_plateau_keeps_the_rate_a_0_dim_tensor() -> None:
    """`test_reduce_lr_on_plateau_preserves_lr_type`, through a reduction."""
    schedule = optim.ReduceLROnPlateau(mode="min", patience=0)
    state = schedule.init(torch.tensor(0.5))
    kind = (type(state.lr), state.lr.dtype, state.lr.shape)
    state = schedule.step(schedule.step(state, 1.0), 2.0)
    assert float(state.lr) == 0.5 * 0.1
    assert (type(state.lr), state.lr.dtype, state.lr.shape) == kind


# `test_compound_reduce_lr_on_plateau1..5`: (plateau settings, torch's other
# scheduler, ours, metrics, rate); compared with torch side by side.
COMPOUND_PLATEAU: list[tuple[dict[str, Any], TorchMake, Any, list[float], float]] = [
    (
        {**ABS_MIN, "threshold": 0.01, "patience": 5, "cooldown": 5},
        lambda o: tls.StepLR(o, gamma=0.1, step_size=3),
        optim.StepLR(gamma=0.1, step_size=3),
        [10 - i * 0.0167 for i in range(10)],
        0.5,
    ),
    (
        {**ABS_MIN, "threshold": 0.1, "patience": 5, "cooldown": 0},
        lambda o: tls.MultiStepLR(o, gamma=0.1, milestones=[3, 8, 12]),
        optim.MultiStepLR(gamma=0.1, milestones=[3, 8, 12]),
        [10 - i * 0.0165 for i in range(22)],
        0.5,
    ),
    (
        {"mode": "max", "threshold_mode": "abs", "patience": 5, "cooldown": 5},
        lambda o: tls.ExponentialLR(o, gamma=0.1),
        optim.ExponentialLR(gamma=0.1),
        [-0.8] * 2 + [-0.234] * 20,
        0.5,
    ),
    (
        {**REL_MAX, "patience": 3},
        lambda o: tls.CosineAnnealingLR(o, 10, ETA),
        optim.CosineAnnealingLR(T_max=10, eta_min=ETA),
        [1.5 * 1.025**i for i in range(10)],
        0.05,
    ),
    (
        {**ABS_MIN, "threshold": 0.1, "patience": 5, "cooldown": 0},
        lambda o: tls.LinearLR(o, start_factor=0.4, total_iters=4),
        optim.LinearLR(start_factor=0.4, total_iters=4),
        [10 - i * 0.0165 for i in range(22)],
        0.5,
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "torch_other", "other", "metrics", "lr"),
    COMPOUND_PLATEAU,
    ids=["1", "2", "3", "4", "5"],
)
def test_compound_reduce_lr_on_plateau(
    kwargs: dict[str, Any],
    torch_other: TorchMake,
    other: Any,
    metrics: list[float],
    lr: float,
) -> None:
    """A plateau stepped before another schedule gives torch's rates bitwise."""
    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=lr)
    plateau = tls.ReduceLROnPlateau(opt, **kwargs)
    sched = torch_other(opt)
    schedule = optim.ChainedScheduler(
        schedulers=[optim.ReduceLROnPlateau(**kwargs), other]
    )
    state = schedule.init(lr)
    got, expected = [], []
    for metric in metrics:
        opt.step()
        plateau.step(metric)
        sched.step()
        expected.append(float(opt.param_groups[0]["lr"]))
        state = schedule.step(schedule.step_metric(state, metric))
        got.append(float(state.lr))
    _bitwise(got, expected)


def _cycle(schedule: Any, n: int) -> tuple[list[float], list[float | None]]:
    """The rates and momenta of `n` steps, from `init`."""
    state = schedule.init()
    lrs: list[float] = []
    moms: list[float | None] = []
    for _ in range(n):
        lrs.append(float(state.lr))
        moms.append(None if state.momentum is None else float(state.momentum))
        state = schedule.step(state)
    return lrs, moms


def _torch_cycle(
    make: TorchMake, n: int, *, adam: bool = False
) -> tuple[list[float], list[float]]:
    param = torch.zeros(1, requires_grad=True)
    opt: torch.optim.Optimizer
    if adam:
        opt = torch.optim.Adam([param], lr=0.05)
    else:
        opt = torch.optim.SGD([param], lr=0.05, momentum=0.9)
    sched = make(opt)
    group = opt.param_groups[0]
    lrs, moms = [], []
    for _ in range(n):
        lrs.append(float(group["lr"]))
        moms.append(float(group["betas"][0] if adam else group["momentum"]))
        opt.step()
        sched.step()
    return lrs, moms


_TRI2 = [
    1,
    2,
    3,
    4,
    5,
    4,
    3,
    2,
    1,
    1.5,
    2,
    2.5,
    3,
    2.5,
    2,
    1.5,
    1,
    1.25,
    1.5,
    1.75,
    2,
    1.75,
]
_TRI2_UD = [1, 3, 5, 13 / 3, 11 / 3, 3, 7 / 3, 5 / 3, 1, 2, 3, 8 / 3, 7 / 3, 2, 5 / 3]
_TRI2_UD += [4 / 3, 1, 1.5, 2, 11 / 6, 10 / 6, 9 / 6, 8 / 6, 7 / 6]
_XS = [0, 0.25, 0.5, 0.75, 1, 0.75, 0.5, 0.25, 0, 0.25, 0.5, 0.75, 1]
_XS_UD = [0, 0.5, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0, 0.5, 1, 5 / 6, 4 / 6]


def _cyclic_case(
    mode: str, base: float, top: float, xs: list[float], **kwargs: Any
) -> tuple[dict[str, Any], list[float], list[float]]:
    """Settings and targets: rates `base + x * (top - base)`, momenta mirrored."""
    gamma = 0.9 if mode == "exp_range" else 1.0
    scale = [gamma**i for i in range(len(xs))]
    settings = {
        "base_lr": base,
        "max_lr": top,
        "base_momentum": base,
        "max_momentum": top,
        "mode": mode,
        "gamma": gamma,
        **kwargs,
    }
    lrs = [base + x * (top - base) * s for x, s in zip(xs, scale, strict=True)]
    moms = [top - x * (top - base) * s for x, s in zip(xs, scale, strict=True)]
    return settings, lrs, moms


_TRI = [0, 0.25, 0.5, 0.75, 1, 0.75, 0.5, 0.25, 0, 0.25, 0.5]
_UP_DOWN = [0, 0.25, 0.5, 0.75, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6, 0]
# `test_cycle_lr_*`: each of upstream's groups is a row (base and max rates);
# a group equal to the one-rate test's is not repeated.
CYCLIC = {
    "triangular_one_lr": _cyclic_case("triangular", 1, 5, _TRI, step_size_up=4),
    "triangular_group1": _cyclic_case("triangular", 2, 6, _TRI, step_size_up=4),
    "triangular2_one_lr": _cyclic_case(
        "triangular2", 1, 5, [(v - 1) / 4 for v in _TRI2], step_size_up=4
    ),
    "triangular2_group1": _cyclic_case(
        "triangular2", 3, 7, [(v - 1) / 4 for v in _TRI2], step_size_up=4
    ),
    "exp_range_one_lr": _cyclic_case("exp_range", 1, 5, _XS, step_size_up=4),
    "exp_range_group1": _cyclic_case("exp_range", 5, 12, _XS, step_size_up=4),
    "triangular_step_size_up_down": _cyclic_case(
        "triangular", 1, 5, _UP_DOWN, step_size_up=4, step_size_down=6
    ),
    "triangular2_step_size_up_down_group0": _cyclic_case(
        "triangular2",
        1,
        5,
        [(v - 1) / 4 for v in _TRI2_UD],
        step_size_up=2,
        step_size_down=6,
    ),
    "triangular2_step_size_up_down_group1": _cyclic_case(
        "triangular2",
        3,
        7,
        [(v - 1) / 4 for v in _TRI2_UD],
        step_size_up=2,
        step_size_down=6,
    ),
    "exp_range_step_size_up_down": _cyclic_case(
        "exp_range", 1, 5, _XS_UD, step_size_up=2, step_size_down=6
    ),
}


@pytest.mark.parametrize(
    ("settings", "lrs", "moms"), CYCLIC.values(), ids=CYCLIC.keys()
)
def test_cycle_lr(
    settings: dict[str, Any], lrs: list[float], moms: list[float]
) -> None:
    """Rates and momenta meet upstream's targets and equal torch's bitwise."""
    schedule = optim.CyclicLR(**settings)
    got_lrs, got_moms = _cycle(schedule, len(lrs))
    _close(got_lrs, lrs)
    _close([m if m is not None else math.nan for m in got_moms], moms)
    torch_lrs, torch_moms = _torch_cycle(
        lambda o: tls.CyclicLR(o, **settings), len(lrs)
    )
    _bitwise(got_lrs, torch_lrs)
    _bitwise([m if m is not None else math.nan for m in got_moms], torch_moms)


def test_cycle_lr_without_momentum() -> None:
    """`..._no_momentum` and `..._with_momentumless_optimizer`: rates, no momentum."""
    schedule = optim.CyclicLR(base_lr=1, max_lr=5, step_size_up=4, cycle_momentum=False)
    lrs, moms = _cycle(schedule, 11)
    _close(lrs, [1, 2, 3, 4, 5, 4, 3, 2, 1, 2, 3])
    assert moms == [None] * 11
    optim.Adam(lr=schedule)  # the optimizer of upstream's test takes it


def test_cycle_lr_momentum_needs_an_optimizer_with_one() -> None:
    """`..._cycle_momentum_fail_with_momentumless_optimizer` and `..._with_beta1`."""
    schedule = optim.CyclicLR(base_lr=1, max_lr=5, cycle_momentum=True)
    with pytest.raises(ValueError, match="`Rprop` has neither"):
        optim.Rprop(lr=schedule)
    optim.Adam(lr=schedule)


def test_cycle_lr_invalid_mode() -> None:
    """`test_cycle_lr_invalid_mode`: an unknown mode is refused."""
    with pytest.raises(ValueError, match="`mode` 'CATS' is unknown"):
        _loose.CyclicLR(base_lr=0, max_lr=0, mode="CATS")


def _anneal_cos(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


_ONE_CYCLE = {"max_lr": 25, "base_momentum": 1, "max_momentum": 22, "total_steps": 10}
ONE_CYCLE: dict[str, tuple[dict[str, Any], list[float], list[float]]] = {
    "linear_annealing": (
        {**_ONE_CYCLE, "final_div_factor": 2, "anneal_strategy": "linear"},
        [1, 13, 25, 21.5, 18, 14.5, 11, 7.5, 4, 0.5],
        [22, 11.5, 1, 4, 7, 10, 13, 16, 19, 22],
    ),
    "linear_annealing_three_phases": (
        {
            **_ONE_CYCLE,
            "div_factor": 25,
            "anneal_strategy": "linear",
            "pct_start": 0.4,
            "final_div_factor": 4,
            "three_phase": True,
        },
        [1, 9, 17, 25, 17, 9, 1, 0.75, 0.5, 0.25],
        [22, 15, 8, 1, 8, 15, 22, 22, 22, 22],
    ),
    "cosine_annealing": (
        {**_ONE_CYCLE, "final_div_factor": 2},
        [1, 13, 25] + [_anneal_cos(25, 0.5, i / 7) for i in range(1, 7)] + [0.5],
        [22, 11.5, 1] + [_anneal_cos(1, 22, i / 7) for i in range(1, 7)] + [22],
    ),
}


@pytest.mark.parametrize("adam", [False, True], ids=["sgd", "adam"])
@pytest.mark.parametrize(
    ("settings", "lrs", "moms"), ONE_CYCLE.values(), ids=ONE_CYCLE.keys()
)
def test_onecycle_lr(
    settings: dict[str, Any], lrs: list[float], moms: list[float], adam: bool
) -> None:
    """`test_onecycle_lr_*`, `test_cycle_lr_with_adam`: targets, and torch's bitwise."""
    # With Adam, torch cycles the first beta; the schedule's momentum is that.
    schedule = optim.OneCycleLR(**settings)
    got_lrs, got_moms = _cycle(schedule, 10)
    _close(got_lrs, lrs)
    _close([m if m is not None else math.nan for m in got_moms], moms)
    torch_lrs, torch_moms = _torch_cycle(
        lambda o: tls.OneCycleLR(o, **settings), 10, adam=adam
    )
    _bitwise(got_lrs, torch_lrs)
    _bitwise([m if m is not None else math.nan for m in got_moms], torch_moms)


@needs_torch(2, 13, "torch's OneCycleLR over 2 total steps (2.6's divides by zero)")
@settings(max_examples=40, deadline=None)
@given(
    max_lr=st.sampled_from([1.3, 0.1, 25.0, 0.013, 3e-4, 7.77]),
    total_steps=st.integers(2, 1000),
    div_factor=st.sampled_from([25.0, 3.0, 10.0, 1.7]),
    pct_start=st.sampled_from([0.3, 0.25, 0.5, 0.9]),
    anneal_strategy=st.sampled_from(["cos", "linear"]),
    three_phase=st.booleans(),
)
def test_onecycle_first_rate_is_torchs_exactly(**settings: Any) -> None:
    """The rate and momentum at `init`, before any step, are torch's, bit for bit.

    Also as an optimizer's `lr` (its `last_lr` and its torch export). torch's
    group whose `lr` is a float32 tensor (upstream's second group) holds the
    float32 rounding of the same rate (0.052000001 for 0.052): that rounding is
    the tensor's, not the schedule's.
    """
    ours = optim.OneCycleLR(**settings)
    state = ours.init()
    rate = torch.zeros(1, requires_grad=True)
    exact = torch.optim.SGD([rate], lr=0.05, momentum=0.9)
    tls.OneCycleLR(exact, **settings)
    group = exact.param_groups[0]
    assert float(state.lr) == group["lr"]
    assert state.momentum is not None
    assert float(state.momentum) == group["momentum"]
    opt = optim.SGD(lr=ours, momentum=0.9)
    held = opt.init(ParamDict(w=torch.zeros(1)))
    assert opt.last_lr(held) == [group["lr"]]
    saved = optim.to_torch_state_dict(opt, held, [["w"]])
    assert saved["param_groups"][0]["lr"] == group["lr"]
    tensor_rate = torch.optim.SGD([rate], lr=torch.tensor(0.5), momentum=0.9)
    tls.OneCycleLR(tensor_rate, **settings)
    rounded = tensor_rate.param_groups[0]["lr"]
    assert float(rounded) == float(torch.tensor(group["lr"], dtype=torch.float32))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"total_steps": 10, "anneal_strategy": "CATS"}, "`anneal_strategy` must be"),
        ({"total_steps": 10, "pct_start": 1.1}, "float between 0 and 1 `pct_start`"),
        ({}, "Give either `total_steps` or both"),
    ],
    ids=[
        "invalid_anneal_strategy",
        "invalid_pct_start",
        "cannot_calculate_total_steps",
    ],
)
def test_onecycle_lr_refuses(kwargs: dict[str, Any], match: str) -> None:
    """`test_onecycle_lr_invalid_*` and `..._cannot_calculate_total_steps`."""
    with pytest.raises(ValueError, match=match):
        _loose.OneCycleLR(max_lr=1e-3, **kwargs)


def _pow_09(epoch: Any) -> Any:
    return 0.9**epoch


def _pow_08(epoch: Any) -> Any:
    return 0.8**epoch


def _times_09(epoch: Any) -> Any:
    return 0.9


def _times_08(epoch: Any) -> Any:
    return 0.8


@pytest.mark.parametrize(
    ("ours", "theirs", "lr", "factor"),
    [
        (optim.LambdaLR, tls.LambdaLR, 0.05, _pow_09),
        (optim.LambdaLR, tls.LambdaLR, 0.4, _pow_08),
        (optim.MultiplicativeLR, tls.MultiplicativeLR, 0.05, _times_09),
        (optim.MultiplicativeLR, tls.MultiplicativeLR, 0.4, _times_08),
    ],
    ids=[
        "lambda_lr-group0",
        "lambda_lr-group1",
        "multiplicative-group0",
        "multiplicative-group1",
    ],
)
def test_lambda_and_multiplicative_lr(
    ours: Any, theirs: Any, lr: float, factor: Callable[[Any], Any]
) -> None:
    """`test_lambda_lr`, `test_multiplicative_lr`: one lambda per upstream group."""
    gamma = factor(1)
    schedule = ours(lr_lambda=factor)
    got = _rates(schedule, lr, 10)
    _close(got, [lr * gamma**x for x in range(10)])
    _bitwise(got, _torch_rates([lambda o: theirs(o, lr_lambda=factor)], lr, 10))


@pytest.mark.parametrize("lr_lambda", [0.95, [0.95, 0.95]], ids=["number", "list"])
def test_multiplicative_lr_with_lr_lambda(lr_lambda: object) -> None:
    """`test_multiplicative_lr_with_lr_lambda`: a non-function is refused."""
    with pytest.raises(TypeError, match="`lr_lambda` should be a function"):
        _loose.MultiplicativeLR(lr_lambda=lr_lambda)


def _warm_restart_target(lr: float, t_cur: float, t_i: float) -> float:
    return ETA + (lr - ETA) * (1 + math.cos(math.pi * t_cur / t_i)) / 2


@pytest.mark.parametrize("lr", BASES)
@pytest.mark.parametrize("t_mult", [1, 2, 4])
def test_cosine_annealing_warm_restarts_lr1(t_mult: int, lr: float) -> None:
    """`test_CosineAnnealingWarmRestarts_lr1`: 100 plain steps, then torch's bitwise."""
    t_i, t_cur, targets = 10, 0, [lr]
    for _ in range(99):
        t_cur += 1
        if t_cur >= t_i:
            t_cur, t_i = t_cur - t_i, t_mult * t_i
        targets.append(_warm_restart_target(lr, t_cur, t_i))
    schedule = optim.CosineAnnealingWarmRestarts(T_0=10, T_mult=t_mult, eta_min=ETA)
    _close(_rates(schedule, _base(lr), 100), targets)
    torch_make: TorchMake = lambda o: tls.CosineAnnealingWarmRestarts(  # noqa: E731
        o, T_0=10, T_mult=t_mult, eta_min=ETA
    )
    _bitwise(_rates(schedule, lr, 100), _torch_rates([torch_make], lr, 100))


def _epoch_rates(
    schedule: Any, lr: float | torch.Tensor, epochs: list[float]
) -> list[float]:
    state = schedule.init(lr)
    out = []
    for epoch in epochs:
        state = schedule.step(state, epoch)
        out.append(float(state.lr))
    return out


@pytest.mark.parametrize("lr", BASES)
@pytest.mark.parametrize("t_mult", [1, 2, 4])
def test_cosine_annealing_warm_restarts_lr2(t_mult: int, lr: float) -> None:
    """`test_CosineAnnealingWarmRestarts_lr2`: `step(state, epoch)` in tenths."""
    t_i, t_cur, targets = 10, 0.0, [lr]
    for _ in range(299):
        t_cur = round(t_cur + 0.1, 1)
        if t_cur >= t_i:
            t_cur, t_i = t_cur - t_i, t_mult * t_i
        targets.append(_warm_restart_target(lr, t_cur, t_i))
    epochs = [round(e.item(), 1) for e in torch.arange(0, 30, 0.1)]
    schedule = optim.CosineAnnealingWarmRestarts(T_0=10, T_mult=t_mult, eta_min=ETA)
    _close(_epoch_rates(schedule, _base(lr), epochs), targets)


@pytest.mark.parametrize("lr", BASES)
@pytest.mark.parametrize(
    ("t_mult", "epochs", "t_curs", "t_is"),
    [
        (
            1,
            [0, 1, 2, 3, 4, 5, 12, 27, 3, 4, 5, 6, 13],
            [1, 2, 3, 4, 5, 2, 7, 3, 4, 5, 6, 3],
            [10] * 12,
        ),
        (
            2,
            [0, 1, 2, 3, 4, 5, 25, 32, 33, 34, 80, 81, 3],
            [1, 2, 3, 4, 5, 15, 2, 3, 4, 10, 11, 3],
            [10, 10, 10, 10, 10, 20, 40, 40, 40, 80, 80, 10],
        ),
        (
            3,
            [0, 0.1, 0.2, 0.3, 1.3, 2.3, 17.5, 18.5, 19.5, 29.5, 30.5, 31.5, 50],
            [0.1, 0.2, 0.3, 1.3, 2.3, 7.5, 8.5, 9.5, 19.5, 20.5, 21.5, 10],
            [10, 10, 10, 10, 10, 30, 30, 30, 30, 30, 30, 90],
        ),
    ],
    ids=["T_mult1", "T_mult2", "T_mult3"],
)
def test_cosine_annealing_warm_restarts_lr3(
    t_mult: int, epochs: list[float], t_curs: list[float], t_is: list[int], lr: float
) -> None:
    """`test_CosineAnnealingWarmRestarts_lr3`: epochs jumping back and forth."""
    targets = [lr] + [
        _warm_restart_target(lr, c, i) for c, i in zip(t_curs, t_is, strict=True)
    ]
    schedule = optim.CosineAnnealingWarmRestarts(T_0=10, T_mult=t_mult, eta_min=ETA)
    _close(_epoch_rates(schedule, _base(lr), epochs), targets)
    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=lr)
    sched = tls.CosineAnnealingWarmRestarts(opt, T_0=10, T_mult=t_mult, eta_min=ETA)
    expected = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's `step(epoch)` notice
        for epoch in epochs:
            opt.step()
            sched.step(epoch)
            expected.append(float(opt.param_groups[0]["lr"]))
    _bitwise(_epoch_rates(schedule, lr, epochs), expected)


@pytest.mark.parametrize(
    "schedule",
    [
        optim.StepLR(step_size=2),
        optim.ExponentialLR(gamma=0.9),
        optim.ConstantLR(),
        optim.LinearLR(),
        optim.PolynomialLR(power=0.9),
    ],
    ids=["step_lr", "exponential_lr", "constantlr", "linearlr", "polynomial_lr"],
)
def test_step_epoch_is_refused(schedule: Any) -> None:
    """The deprecated `step(epoch)` of `test_*_is_constant_for_constant_epoch`."""
    state = schedule.init(0.05)
    with pytest.raises(
        TypeError, match=r"takes no epoch .* deprecates `step\(epoch\)`"
    ):
        schedule.step(state, 2)


@pytest.mark.parametrize("start_factor", [0.0, 1.1], ids=["limits1", "limits2"])
def test_linearlr_start_factor_limits(start_factor: float) -> None:
    """`test_linearlr_start_factor_limits1/2`: the factor must be in (0, 1]."""
    with pytest.raises(ValueError, match=r"`start_factor` must be in \(0, 1\]"):
        optim.LinearLR(start_factor=start_factor, total_iters=4)


def _mult_09(epoch: Any) -> Any:
    return 0.9


def _swa_run(
    swa: Any, lr: float | torch.Tensor, swa_start: int, epochs: int, *, before: bool
) -> list[float]:
    """Upstream's `_test_swalr`: MultiplicativeLR (or nothing) then SWALR."""
    mult = optim.MultiplicativeLR(lr_lambda=_mult_09)
    state = mult.init(lr)
    out = []
    for _ in range(swa_start):
        out.append(float(state.lr))
        if before:
            state = mult.step(state)
    swa_state = swa.init(state.lr)
    for _ in range(swa_start, epochs):
        out.append(float(swa_state.lr))
        swa_state = swa.step(swa_state)
    return out


def _torch_swa_run(
    kwargs: dict[str, Any], lr: float, swa_start: int, epochs: int, *, before: bool
) -> list[float]:
    param = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([param], lr=lr)
    mult = tls.MultiplicativeLR(opt, lr_lambda=_mult_09)
    swa = swa_utils.SWALR(opt, **kwargs)
    out = []
    for epoch in range(epochs):
        out.append(float(opt.param_groups[0]["lr"]))
        if epoch >= swa_start:
            opt.step()
            swa.step()
        elif before:
            opt.step()
            mult.step()
    return out


@pytest.mark.parametrize("lr", BASES)
def test_swalr_no_anneal(lr: float) -> None:
    """`test_swalr_no_anneal`: the rate holds, then jumps to `swa_lr`."""
    kwargs = {"anneal_epochs": 1, "swa_lr": 0.01}
    swa = _loose.SWALR(**kwargs)
    _close(_swa_run(swa, _base(lr), 5, 10, before=False), [lr] * 6 + [0.01] * 4)
    _bitwise(
        _swa_run(swa, lr, 5, 10, before=False),
        _torch_swa_run(kwargs, lr, 5, 10, before=False),
    )


@pytest.mark.parametrize(
    ("strategy", "lr", "swa_lr"),
    [
        ("cos", 0.05, 0.01),
        ("cos", 0.5, 0.01),
        ("linear", 0.05, 0.01),
        ("linear", 0.5, 0.02),
    ],
    ids=["cos-group0", "cos-group1", "linear-group0", "linear-group1"],
)
def test_swalr_anneal_after_multiplicative(
    strategy: str, lr: float, swa_lr: float
) -> None:
    """`test_swalr_{cosine,linear}_anneal_after_multiplicative`."""
    anneal_epochs = 5 if strategy == "cos" else 4

    def coef(t: int) -> float:
        if t + 1 >= anneal_epochs:
            return 0.0
        if strategy == "cos":
            return (1 + math.cos(math.pi * (t + 1) / anneal_epochs)) / 2
        return 1 - (t + 1) / anneal_epochs

    before = [lr * 0.9**i for i in range(6)]
    targets = before + [before[-1] * coef(t) + swa_lr * (1 - coef(t)) for t in range(9)]
    kwargs = {
        "anneal_epochs": anneal_epochs,
        "anneal_strategy": strategy,
        "swa_lr": swa_lr,
    }
    swa = _loose.SWALR(**kwargs)
    _close(_swa_run(swa, _base(lr), 5, 15, before=True), targets)
    _bitwise(
        _swa_run(swa, lr, 5, 15, before=True),
        _torch_swa_run(kwargs, lr, 5, 15, before=True),
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"anneal_strategy": "exponential"}, ValueError, "anneal_strategy must"),
        ({"anneal_epochs": -1}, ValueError, "anneal_epochs must"),
        ({"anneal_epochs": 1.7}, ValueError, "anneal_epochs must"),
        # torch's ValueError counts one rate per group; one rate here, a list is
        # the wrong kind.
        ({"swa_lr": [1.0, 0.1, 0.01]}, TypeError, "`swa_lr` must be a number"),
    ],
    ids=[
        "anneal_strategy",
        "anneal_epochs_negative",
        "anneal_epochs_float",
        "swa_lr_list",
    ],
)
def test_swalr_hypers(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """`test_swalr_hypers`: bad settings are refused."""
    with pytest.raises(error, match=match):
        _loose.SWALR(**{"swa_lr": 1.0, **kwargs})


def _div10(epoch: Any) -> Any:
    return epoch // 10


def _times_095(epoch: Any) -> Any:
    return 0.95


@pytest.mark.parametrize(
    "schedule",
    [
        optim.LambdaLR(lr_lambda=_div10),
        optim.MultiplicativeLR(lr_lambda=_times_095),
        optim.StepLR(step_size=30),
        optim.MultiStepLR(milestones=[30, 80]),
        optim.ConstantLR(),
        optim.LinearLR(),
        optim.ExponentialLR(gamma=0.9),
        optim.PolynomialLR(),
        optim.CosineAnnealingLR(T_max=10),
        optim.CosineAnnealingWarmRestarts(T_0=20),
    ],
    ids=lambda s: type(s).__name__,
)
def test_constant_initial_lr(schedule: Any) -> None:
    """`test_constant_initial_lr`: changing the tensor rate given later does nothing."""
    lr = torch.as_tensor(0.1)
    expected = _rates(schedule, float(lr), 3)
    state = schedule.init(lr)
    got = [float(state.lr)]
    for _ in range(2):
        state = schedule.step(state)
        lr.multiply_(0.1)
        got.append(float(state.lr))
        assert float(state.base_lr) == float(torch.as_tensor(0.1))
    _bitwise(got, expected)


def test_constant_initial_lr_float64() -> None:
    """`test_constant_initial_lr` with a float64 tensor rate, for LambdaLR."""
    schedule = optim.LambdaLR(lr_lambda=_div10)
    lr = torch.tensor(0.1, dtype=torch.float64)
    expected = _rates(schedule, 0.1, 12)
    state = schedule.init(lr)
    got = [float(state.lr)]
    lr.multiply_(0.1)
    for _ in range(11):
        state = schedule.step(state)
        got.append(float(state.lr))
    _bitwise(got, expected)


def test_constant_initial_params_cyclelr() -> None:
    """`test_constant_initial_params_cyclelr`: tensor settings are read once."""
    tensors = [torch.as_tensor(v) for v in (0.1, 0.2, 0.8, 0.9)]
    names = ("base_lr", "max_lr", "base_momentum", "max_momentum")
    numbers = dict(zip(names, [float(t) for t in tensors], strict=True))
    schedule = _loose.CyclicLR(**dict(zip(names, tensors, strict=True)))
    for t in tensors:
        t.multiply_(0.5)
    assert {name: getattr(schedule, name) for name in names} == numbers
    _bitwise(_cycle(schedule, 5)[0], _cycle(_loose.CyclicLR(**numbers), 5)[0])


def test_constant_initial_params_onecyclelr() -> None:
    """`test_constant_initial_params_onecyclelr`: tensor settings are read once."""
    tensors = [torch.as_tensor(v) for v in (0.1, 0.85, 0.95)]
    names = ("max_lr", "base_momentum", "max_momentum")
    numbers = dict(zip(names, [float(t) for t in tensors], strict=True))
    schedule = _loose.OneCycleLR(
        total_steps=10, **dict(zip(names, tensors, strict=True))
    )
    for t in tensors:
        t.multiply_(0.5)
    assert {name: getattr(schedule, name) for name in names} == numbers
    reference = _loose.OneCycleLR(total_steps=10, **numbers)
    assert _cycle(schedule, 10) == _cycle(reference, 10)


def test_constant_initial_params_swalr() -> None:
    """`test_constant_initial_params_swalr`: tensor rates are read once."""
    lr, swa_lr = torch.as_tensor(0.1), torch.as_tensor(0.05)
    expected = _rates(optim.SWALR(swa_lr=float(swa_lr)), float(lr), 3)
    schedule = _loose.SWALR(swa_lr=swa_lr)
    state = schedule.init(lr)
    got = [float(state.lr)]
    for _ in range(2):
        lr.multiply_(0.5)
        swa_lr.multiply_(0.5)
        state = schedule.step(state)
        got.append(float(state.lr))
    _bitwise(got, expected)


def test_cosine_then_cyclic() -> None:
    """`test_cosine_then_cyclic`: after the switch the rate stays at most `max_lr`."""
    schedule = optim.SequentialLR(
        schedulers=[
            optim.CosineAnnealingLR(T_max=20, eta_min=0.1),
            optim.CyclicLR(base_lr=0.1, max_lr=0.3, step_size_up=1, step_size_down=3),
        ],
        milestones=[21],
    )
    rates = _rates(schedule, 0.5, 41)
    assert rates[0] == 0.5
    assert max(rates[21:]) <= 0.3
    _close(rates[21:25], [0.1, 0.3, 0.3 - 0.2 / 3, 0.3 - 0.4 / 3])
