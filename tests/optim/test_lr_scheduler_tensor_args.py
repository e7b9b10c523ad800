"""`CyclicLR` and `OneCycleLR` take tensor arguments where torch's do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.optim import lr_scheduler as torch_lr

from paramdict import optim

T = torch.tensor


def TT(value: float) -> Any:
    """A tensor for torch's schedulers, whose annotations say float."""
    return torch.tensor(value)


CASES: list[tuple[str, Callable[[Any], Any], Callable[[], optim.LRSchedule]]] = [
    (
        # torch writes each rate into the `base_lr` tensor it was given (it
        # becomes the group's `lr`), so its later rates start from a moved base;
        # the reference is torch with the numbers those tensors hold.
        "cyclic-rates",
        lambda o: torch_lr.CyclicLR(
            o, base_lr=float(T(0.01)), max_lr=float(T(0.1)), step_size_up=3
        ),
        lambda: optim.CyclicLR(base_lr=T(0.01), max_lr=T(0.1), step_size_up=3),
    ),
    (
        "cyclic-momentum",
        lambda o: torch_lr.CyclicLR(
            o, base_lr=0.01, max_lr=0.1, step_size_up=3, base_momentum=TT(0.8)
        ),
        lambda: optim.CyclicLR(
            base_lr=0.01, max_lr=0.1, step_size_up=3, base_momentum=T(0.8)
        ),
    ),
    (
        "one-cycle-max_lr",
        lambda o: torch_lr.OneCycleLR(o, max_lr=TT(0.1), total_steps=12),
        lambda: optim.OneCycleLR(max_lr=T(0.1), total_steps=12),
    ),
    (
        "one-cycle-div_factor",
        lambda o: torch_lr.OneCycleLR(
            o, max_lr=0.1, total_steps=12, div_factor=TT(10.0)
        ),
        lambda: optim.OneCycleLR(max_lr=0.1, total_steps=12, div_factor=T(10.0)),
    ),
]


@pytest.mark.parametrize(
    ("make_torch", "make_ours"), [pytest.param(t, o, id=i) for i, t, o in CASES]
)
def test_tensor_arguments_follow_torch(
    make_torch: Callable[[Any], Any], make_ours: Callable[[], optim.LRSchedule]
) -> None:
    """Rates and momenta follow torch's; torch computes in the tensors' float32.

    The tensors are read as numbers, so the values are float64 arithmetic on the
    float32 values given: equal to torch's to float32 precision.
    """
    w = torch.nn.Parameter(torch.ones(1))
    torch_opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    torch_sched = make_torch(torch_opt)
    schedule = make_ours()
    state = schedule.init()
    for _ in range(12):
        torch_opt.step()
        torch_sched.step()
        state = schedule.step(state)
        group = torch_opt.param_groups[0]
        torch.testing.assert_close(
            float(state.lr), float(group["lr"]), rtol=1e-6, atol=0
        )
        assert state.momentum is not None
        torch.testing.assert_close(
            float(state.momentum), float(group["momentum"]), rtol=1e-6, atol=0
        )


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (torch.ones(2), r"`max_lr` must be a number, got Tensor"),
        (torch.tensor(True), r"`max_lr` must be a number, got Tensor"),
        (torch.tensor(-0.1), r"`max_lr` must be finite and at least 0"),
    ],
    ids=["vector", "bool", "negative"],
)
def test_bad_tensor_arguments_refused(value: torch.Tensor, match: str) -> None:
    """A tensor of many elements, a bool or a negative rate is refused."""
    with pytest.raises((TypeError, ValueError), match=match):
        optim.OneCycleLR(max_lr=value, total_steps=4)
