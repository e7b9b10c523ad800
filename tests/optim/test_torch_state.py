"""A run moves between torch.optim and paramdict, both ways, and continues alike."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from optim_cases import (
    TABLE,
    TorchMuon,
    assert_matches,
    batches,
    forward,
    fused_trajectory_params,
    make_model,
    unfused,
)
from torch import Tensor, nn

from paramdict import ParamDict, optim

HALF = int(os.environ.get("PARAMDICT_MOVE_STEPS", "20"))
"""Steps on each side of the move: 20 by default, so the table's moves stay fast;
`PARAMDICT_MOVE_STEPS=50` runs 50 on each side."""
DTYPE = torch.float64


def cases() -> list[Any]:
    """Return `(ours, theirs, kwargs)` for each option set of the table's optimizers."""
    return [
        pytest.param(case.ours, case.theirs, kwargs, id=name, marks=case.mark(name))
        for case in TABLE
        if case.classes is None and case.in_torch
        for name, kwargs in case.trajectories.items()
    ]


def torch_steps(
    model: nn.Module, opt: torch.optim.Optimizer, data: list[tuple[Tensor, Tensor]]
) -> None:
    """Train `model` with `opt` on `data`, the usual way."""
    for x, y in data:
        opt.zero_grad()
        torch.autograd.backward(F.mse_loss(model(x), y))
        opt.step()


def our_steps(
    opt: optim.Optimizer[Any],
    params: ParamDict,
    state: Any,
    data: list[tuple[Tensor, Tensor]],
) -> tuple[ParamDict, Any]:
    """Train `params` with `opt` on `data`; return the parameters and state."""
    for x, y in data:
        grads = params.grad(F.mse_loss(forward(params, x), y))
        params, state = opt.step(params, grads, state)
    return params, state


def settings(ours: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Return the paramdict settings of a torch option set (the rule, not fused)."""
    return {**kwargs, **unfused(ours)}


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), cases())
def test_torch_run_continues_in_paramdict(
    ours: Callable[..., Any], theirs: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    """Torch steps, then paramdict steps from the loaded state, equal torch's run."""
    data = list(batches(DTYPE, 2 * HALF))
    reference = make_model(DTYPE)
    torch_steps(reference, theirs(reference.parameters(), **kwargs), data)

    model = make_model(DTYPE)
    first = theirs(model.parameters(), **kwargs)
    torch_steps(model, first, data[:HALF])
    opt = ours(**settings(ours, kwargs))
    params = ParamDict.from_module(model).detach().requires_grad_()
    state = optim.load_torch_state_dict(opt, first.state_dict(), params, model)
    params, _ = our_steps(opt, params, state, data[HALF:])
    assert_matches(params, dict(reference.named_parameters()), DTYPE)


def load_params(model: nn.Module, params: ParamDict) -> None:
    """Write `params` into `model`'s parameters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), cases())
def test_paramdict_run_continues_in_torch(
    ours: Callable[..., Any], theirs: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    """Paramdict steps, then torch steps from the exported state, equal ours."""
    data = list(batches(DTYPE, 2 * HALF))
    opt = ours(**settings(ours, kwargs))
    start = ParamDict.from_module(make_model(DTYPE))
    reference, _ = our_steps(opt, start, opt.init(start), data)

    params, state = our_steps(opt, start, opt.init(start), data[:HALF])
    model = make_model(DTYPE)
    load_params(model, params)
    second = theirs(model.parameters(), **kwargs)
    second.load_state_dict(optim.to_torch_state_dict(opt, state, model))
    torch_steps(model, second, data[HALF:])
    assert_matches(dict(model.named_parameters()), reference, DTYPE)


MUON = next(case for case in TABLE if case.name == "muon")
WEIGHTS = ["0.weight", "2.weight"]
BIASES = ["0.bias", "2.bias"]


@pytest.mark.parametrize(
    "kwargs", list(MUON.trajectories.values()), ids=list(MUON.trajectories)
)
def test_muon_runs_move_both_ways(kwargs: dict[str, Any]) -> None:
    """Torch's Muon on the weights moves into paramdict's Muon and back."""
    data = list(batches(DTYPE, 2 * HALF))
    reference = make_model(DTYPE)
    torch_steps(reference, torch_muon(reference, kwargs), data)
    model = make_model(DTYPE)
    first = torch_muon(model, kwargs)
    torch_steps(model, first, data[:HALF])
    muon = optim.Muon(**kwargs)
    opt: optim.ParamGroups[Any] = optim.ParamGroups(
        {"*weight": muon}, default=optim.SGD(lr=0.0)
    )
    params = ParamDict.from_module(model).detach().requires_grad_()
    weights = params.select("*weight")
    loaded = optim.load_torch_state_dict(muon, first.state_dict(), weights, [WEIGHTS])
    state = (loaded, opt.init(params)[1])
    moved, state = our_steps(opt, params, state, data[HALF:])
    assert_matches(moved, dict(reference.named_parameters()), DTYPE)

    back = make_model(DTYPE)
    load_params(back, moved)
    second = torch_muon(back, kwargs)
    second.load_state_dict(optim.to_torch_state_dict(muon, state[0], [WEIGHTS]))
    again = make_model(DTYPE)
    load_params(again, moved)
    torch_steps(back, second, data[:HALF])
    continued, _ = our_steps(opt, moved, state, data[:HALF])
    assert_matches(dict(back.named_parameters()), continued, DTYPE)


def torch_muon(model: nn.Module, kwargs: dict[str, Any]) -> torch.optim.Optimizer:
    """Return torch's Muon on the model's weights."""
    named = dict(model.named_parameters())
    return TorchMuon([named[k] for k in WEIGHTS], **kwargs)


def grouped() -> optim.ParamGroups[Any]:
    """Return Adam with its own settings for the biases."""
    return optim.ParamGroups(
        {"*bias": optim.Adam(lr=0.05, weight_decay=0.1, amsgrad=True, fused=False)},
        default=optim.Adam(lr=0.01, betas=(0.8, 0.99), fused=False),
    )


def torch_grouped(model: nn.Module) -> torch.optim.Optimizer:
    """Return torch's Adam with the groups of `grouped`."""
    named = dict(model.named_parameters())
    groups: list[dict[str, Any]] = [
        {
            "params": [named[k] for k in BIASES],
            "lr": 0.05,
            "weight_decay": 0.1,
            "amsgrad": True,
        },
        {"params": [named[k] for k in WEIGHTS], "betas": (0.8, 0.99)},
    ]
    return torch.optim.Adam(groups, lr=0.01)


def test_param_groups_move_both_ways() -> None:
    """Per-group settings move between torch's groups and ParamGroups, both ways."""
    data = list(batches(DTYPE, 2 * HALF))
    reference = make_model(DTYPE)
    torch_steps(reference, torch_grouped(reference), data)
    model = make_model(DTYPE)
    first = torch_grouped(model)
    torch_steps(model, first, data[:HALF])
    opt = grouped()
    params = ParamDict.from_module(model).detach().requires_grad_()
    state = optim.load_torch_state_dict(
        opt, first.state_dict(), params, [BIASES, WEIGHTS]
    )
    moved, state = our_steps(opt, params, state, data[HALF:])
    assert_matches(moved, dict(reference.named_parameters()), DTYPE)

    exported = optim.to_torch_state_dict(opt, state, [BIASES, WEIGHTS])
    assert [g["lr"] for g in exported["param_groups"]] == [0.05, 0.01]
    back = make_model(DTYPE)
    load_params(back, moved)
    second = torch_grouped(back)
    second.load_state_dict(exported)
    torch_steps(back, second, data[:HALF])
    continued, _ = our_steps(opt, moved, state, data[:HALF])
    assert_matches(dict(back.named_parameters()), continued, DTYPE)


Sched = torch.optim.lr_scheduler
SCHEDULES: list[Any] = [
    pytest.param(
        lambda: optim.SGD(
            lr=optim.StepLR(base_lr=0.05, step_size=7, gamma=0.5), momentum=0.9
        ),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        lambda o: Sched.StepLR(o, step_size=7, gamma=0.5),
        id="sgd-step",
    ),
    pytest.param(
        lambda: optim.Adam(
            lr=optim.CosineAnnealingWarmRestarts(base_lr=0.05, T_0=3, T_mult=2),
            fused=False,
        ),
        lambda m: torch.optim.Adam(m.parameters(), lr=0.05),
        lambda o: Sched.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2),
        id="adam-warm-restarts",
    ),
    pytest.param(
        lambda: optim.Adam(
            lr=optim.OneCycleLR(max_lr=0.05, total_steps=3 * HALF), fused=False
        ),
        lambda m: torch.optim.Adam(m.parameters()),
        lambda o: Sched.OneCycleLR(o, max_lr=0.05, total_steps=3 * HALF),
        id="adam-one-cycle",
    ),
    pytest.param(
        lambda: optim.SGD(
            lr=optim.CyclicLR(base_lr=0.001, max_lr=0.05, step_size_up=6), momentum=0.9
        ),
        lambda m: torch.optim.SGD(m.parameters(), momentum=0.9),
        lambda o: Sched.CyclicLR(o, base_lr=0.001, max_lr=0.05, step_size_up=6),
        id="sgd-cyclic",
    ),
    pytest.param(
        lambda: optim.SGD(
            lr=optim.ReduceLROnPlateau(base_lr=0.05, patience=1, factor=0.5),
            momentum=0.5,
        ),
        lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.5),
        lambda o: Sched.ReduceLROnPlateau(o, patience=1, factor=0.5),
        id="sgd-plateau",
    ),
    pytest.param(
        lambda: optim.RMSprop(
            lr=optim.SequentialLR(
                base_lr=0.01,
                schedulers=(
                    optim.LinearLR(start_factor=0.2, total_iters=5),
                    optim.ExponentialLR(gamma=0.9),
                ),
                milestones=(5,),
            )
        ),
        lambda m: torch.optim.RMSprop(m.parameters(), lr=0.01),
        lambda o: Sched.SequentialLR(
            o,
            [
                Sched.LinearLR(o, start_factor=0.2, total_iters=5),
                Sched.ExponentialLR(o, gamma=0.9),
            ],
            milestones=[5],
        ),
        id="rmsprop-sequential",
    ),
]


def scheduled_torch_steps(
    model: nn.Module, opt: torch.optim.Optimizer, scheduler: Any, data: list[Any]
) -> None:
    """Train with a torch optimizer and scheduler, stepping both each batch."""
    for x, y in data:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        torch.autograd.backward(loss)
        opt.step()
        if isinstance(scheduler, Sched.ReduceLROnPlateau):
            scheduler.step(float(loss.detach()))
        else:
            scheduler.step()


def scheduled_our_steps(
    opt: optim.Optimizer[Any], params: ParamDict, state: Any, data: list[Any]
) -> tuple[ParamDict, Any]:
    """Train with a scheduled paramdict optimizer, as `scheduled_torch_steps`."""
    for x, y in data:
        loss = F.mse_loss(forward(params, x), y)
        params, state = opt.step(params, params.grad(loss), state)
        if opt.takes_metric:
            state = opt.step_schedule(state, float(loss.detach()))
    return params, state


@pytest.mark.parametrize(("ours", "theirs", "scheduler"), SCHEDULES)
def test_scheduled_runs_move_both_ways(
    ours: Callable[[], optim.Optimizer[Any]],
    theirs: Callable[[nn.Module], torch.optim.Optimizer],
    scheduler: Callable[[torch.optim.Optimizer], Any],
) -> None:
    """A run with a schedule moves both ways mid-schedule and continues alike."""
    data = list(batches(DTYPE, 2 * HALF))
    reference = make_model(DTYPE)
    opt_ref = theirs(reference)
    scheduled_torch_steps(reference, opt_ref, scheduler(opt_ref), data)
    model = make_model(DTYPE)
    first = theirs(model)
    first_scheduler = scheduler(first)
    scheduled_torch_steps(model, first, first_scheduler, data[:HALF])

    opt = ours()
    params = ParamDict.from_module(model).detach().requires_grad_()
    state = optim.load_torch_state_dict(
        opt, first.state_dict(), params, model, scheduler=first_scheduler.state_dict()
    )
    assert opt.last_lr(state) == first_scheduler.get_last_lr()
    moved, state = scheduled_our_steps(opt, params, state, data[HALF:])
    assert_matches(moved, dict(reference.named_parameters()), DTYPE)

    back = make_model(DTYPE)
    load_params(back, moved)
    second = theirs(back)
    second_scheduler = scheduler(second)
    second.load_state_dict(optim.to_torch_state_dict(opt, state, back))
    second_scheduler.load_state_dict(optim.to_torch_scheduler_state_dict(opt, state))
    assert second_scheduler.get_last_lr() == opt.last_lr(state)
    scheduled_torch_steps(back, second, second_scheduler, data[:HALF])
    continued, state = scheduled_our_steps(opt, moved, state, data[:HALF])
    assert_matches(dict(back.named_parameters()), continued, DTYPE)
    assert second_scheduler.get_last_lr() == opt.last_lr(state)


def fused_cases() -> list[Any]:
    """Return the fused option set with the most settings on, one per class."""
    chosen: dict[object, Any] = {}
    for param in fused_trajectory_params():
        ours, _, kwargs = param.values
        best = chosen.get(ours)
        if best is None or len(kwargs) > len(best.values[2]):
            chosen[ours] = param
    return list(chosen.values())


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), fused_cases())
def test_fused_runs_move_bit_for_bit(
    ours: Callable[..., Any], theirs: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    """With torch's fused kernel on both sides, a move both ways changes no bit."""
    data = list(batches(DTYPE, 2 * HALF))
    reference = make_model(DTYPE)
    torch_steps(reference, theirs(reference.parameters(), fused=True, **kwargs), data)
    model = make_model(DTYPE)
    first = theirs(model.parameters(), fused=True, **kwargs)
    torch_steps(model, first, data[:HALF])
    opt = ours(**kwargs, fused=True)
    params = ParamDict.from_module(model).detach().requires_grad_()
    state = optim.load_torch_state_dict(opt, first.state_dict(), params, model)
    moved, state = our_steps(opt, params, state, data[HALF:])
    expected = dict(reference.named_parameters())
    torch.testing.assert_close(dict(moved), expected, rtol=0, atol=0)

    back = make_model(DTYPE)
    load_params(back, moved)
    second = theirs(back.parameters(), **kwargs)
    second.load_state_dict(optim.to_torch_state_dict(opt, state, back))
    assert all(group["fused"] for group in second.param_groups)
    torch_steps(back, second, data[:HALF])
    continued, _ = our_steps(opt, moved, state, data[:HALF])
    torch.testing.assert_close(
        dict(back.named_parameters()), dict(continued), rtol=0, atol=0
    )


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), cases())
def test_state_dict_round_trip_is_exact(
    ours: Callable[..., Any], theirs: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    """Loading a torch state dict and exporting it again gives every buffer back."""
    model = make_model(DTYPE)
    first = theirs(model.parameters(), **kwargs)
    torch_steps(model, first, list(batches(DTYPE, 3)))
    saved = first.state_dict()
    opt = ours(**settings(ours, kwargs))
    params = ParamDict.from_module(model).detach()
    state = optim.load_torch_state_dict(opt, saved, params, model)
    again = optim.to_torch_state_dict(opt, state, model)
    assert again["state"].keys() == saved["state"].keys()
    for i, entry in saved["state"].items():
        kept = {k: v for k, v in entry.items() if v is not None}
        torch.testing.assert_close(again["state"][i], kept, rtol=0, atol=0)
    for mine, theirs_group in zip(
        again["param_groups"], saved["param_groups"], strict=True
    ):
        assert mine.keys() == theirs_group.keys()


def torch_adamw_groups(model: nn.Module) -> torch.optim.Optimizer:
    """Return torch's AdamW with its own rate for the biases."""
    named = dict(model.named_parameters())
    groups: list[dict[str, Any]] = [
        {"params": [named[k] for k in BIASES], "lr": 0.05},
        {"params": [named[k] for k in WEIGHTS]},
    ]
    return torch.optim.AdamW(groups, lr=0.01)


def test_distributed_checkpoint_format_moves_both_ways() -> None:
    """The name-keyed dicts of get_/set_optimizer_state_dict move both ways."""
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    data = list(batches(DTYPE, 2 * HALF))
    reference = make_model(DTYPE)
    torch_steps(reference, torch_adamw_groups(reference), data)
    model = make_model(DTYPE)
    first = torch_adamw_groups(model)
    torch_steps(model, first, data[:HALF])
    saved = get_optimizer_state_dict(model, first)
    keyed: Any = saved["state"]
    assert sorted(keyed) == sorted(BIASES + WEIGHTS)  # keyed by name
    opt: optim.ParamGroups[Any] = optim.ParamGroups(
        {"*bias": optim.AdamW(lr=0.05, fused=False)},
        default=optim.AdamW(lr=0.01, fused=False),
    )
    params = ParamDict.from_module(model).detach().requires_grad_()
    state = optim.load_torch_state_dict(opt, saved, params)
    moved, state = our_steps(opt, params, state, data[HALF:])
    assert_matches(moved, dict(reference.named_parameters()), DTYPE)

    exported = optim.to_torch_state_dict(opt, state, [BIASES, WEIGHTS], by_name=True)
    assert sorted(exported["state"]) == sorted(BIASES + WEIGHTS)
    back = make_model(DTYPE)
    load_params(back, moved)
    second = torch_adamw_groups(back)
    set_optimizer_state_dict(back, second, exported)
    torch_steps(back, second, data[:HALF])
    continued, _ = our_steps(opt, moved, state, data[:HALF])
    assert_matches(dict(back.named_parameters()), continued, DTYPE)


def test_importing_paramdict_leaves_the_checkpoint_package_alone() -> None:
    """`import paramdict` imports no part of torch.distributed.checkpoint."""
    code = (
        "import sys, paramdict, paramdict.optim; "
        "print([m for m in sys.modules if m.startswith('torch.distributed.check')])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
