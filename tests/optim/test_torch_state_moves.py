"""A run that moves between torch.optim and paramdict continues bit for bit (float32).

The documented promise (`docs/coming-from-torch-optim.md`): a run moved either way
continues as if it had never moved, when both sides run the same kernels. Moving
out, the exported dict's `foreach`/`fused`/`differentiable` settings make torch's
optimizer (built with its defaults, as a user builds it) run paramdict's kernels;
moving in, torch ran with the settings paramdict exports for its configuration.
Each case compares, in float32 and with no tolerance, the moved run with the
uninterrupted run of the side it ended on: every optimizer option set of the
table (each with its default `fused` and with the rule), Muon, and every schedule
the functions convert.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _torch_versions import needs_torch
from optim_cases import TABLE, TorchMuon, batches, forward, make_model, unfused
from torch import Tensor, nn

from paramdict import ParamDict, optim

DTYPE = torch.float32
FIRST, THEN = 3, 3
"""Steps before the move and after it."""
FLAGS = ("foreach", "fused", "capturable", "differentiable")
Sched = torch.optim.lr_scheduler


def variants() -> list[Any]:
    """Return `(ours, theirs, kwargs)` per option set, with and without `fused`."""
    out = []
    for case in TABLE:
        if case.classes is not None or not case.in_torch:
            continue
        for name, kwargs in case.trajectories.items():
            marks = case.mark(name)
            out.append(
                pytest.param(case.ours, case.theirs, kwargs, id=name, marks=marks)
            )
            rule = unfused(case.ours)
            if rule:
                out.append(
                    pytest.param(
                        case.ours,
                        case.theirs,
                        {**kwargs, **rule},
                        id=f"{name}-rule",
                        marks=marks,
                    )
                )
    return out


def torch_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Return the torch.optim options of a paramdict option set (less `fused`)."""
    return {k: v for k, v in kwargs.items() if k != "fused"}


def torch_steps(
    model: nn.Module, opt: torch.optim.Optimizer, data: list[Any], scheduler: Any = None
) -> None:
    """Train with torch: `opt.step()`, then the scheduler's step, per batch."""
    for x, y in data:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        torch.autograd.backward(loss)
        opt.step()
        if isinstance(scheduler, Sched.ReduceLROnPlateau):
            scheduler.step(float(loss.detach()))
        elif scheduler is not None:
            scheduler.step()


def our_steps(
    opt: optim.Optimizer[Any], params: ParamDict, state: Any, data: list[Any]
) -> tuple[ParamDict, Any]:
    """Train with paramdict as `torch_steps` does."""
    for x, y in data:
        loss = F.mse_loss(forward(params, x), y)
        params, state = opt.step(params, params.grad(loss), state)
        if opt.takes_metric:
            state = opt.step_schedule(state, float(loss.detach()))
    return params, state


def load_params(model: nn.Module, params: ParamDict) -> None:
    """Write `params` into `model`'s parameters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])


def exported_flags(opt: optim.Optimizer[Any], params: ParamDict) -> dict[str, Any]:
    """Return the implementation settings `to_torch_state_dict` exports for `opt`."""
    group = optim.to_torch_state_dict(opt, opt.init(params), [list(params)])
    return {k: v for k, v in group["param_groups"][0].items() if k in FLAGS}


def assert_bitwise(got: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    """Assert that two keyed results are equal bit for bit."""
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def move_out(
    opt: optim.Optimizer[Any],
    theirs: Callable[[nn.Module], torch.optim.Optimizer],
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
) -> None:
    """paramdict, then torch from the exported dicts, equals paramdict throughout."""
    data = list(batches(DTYPE, FIRST + THEN))
    start = ParamDict.from_module(make_model(DTYPE))
    reference, _ = our_steps(opt, start, opt.init(start), data)
    params, state = our_steps(opt, start, opt.init(start), data[:FIRST])
    model = make_model(DTYPE)
    load_params(model, params)
    second = theirs(model)
    second_scheduler = scheduler(second) if scheduler is not None else None
    second.load_state_dict(optim.to_torch_state_dict(opt, state, model))
    if second_scheduler is not None:
        position = optim.to_torch_scheduler_state_dict(opt, state)
        second_scheduler.load_state_dict(position)
    torch_steps(model, second, data[FIRST:], second_scheduler)
    assert_bitwise(dict(model.named_parameters()), dict(reference))


def move_in(
    opt: optim.Optimizer[Any],
    theirs: Callable[..., torch.optim.Optimizer],
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
) -> None:
    """torch, then paramdict from torch's dicts, equals torch throughout."""
    data = list(batches(DTYPE, FIRST + THEN))
    flags = exported_flags(opt, ParamDict.from_module(make_model(DTYPE)))
    reference = make_model(DTYPE)
    opt_ref = theirs(reference, **flags)
    sched_ref = scheduler(opt_ref) if scheduler is not None else None
    torch_steps(reference, opt_ref, data, sched_ref)
    model = make_model(DTYPE)
    first = theirs(model, **flags)
    first_scheduler = scheduler(first) if scheduler is not None else None
    torch_steps(model, first, data[:FIRST], first_scheduler)
    params = ParamDict.from_module(model).detach().requires_grad_()
    position = None if first_scheduler is None else first_scheduler.state_dict()
    state = optim.load_torch_state_dict(
        opt, first.state_dict(), params, model, scheduler=position
    )
    moved, _ = our_steps(opt, params, state, data[FIRST:])
    assert_bitwise(dict(moved), dict(reference.named_parameters()))


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), variants())
def test_paramdict_run_moves_to_torch_bit_for_bit(
    ours: Callable[..., Any], theirs: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    """Exported, a run continues in torch's default-built optimizer bit for bit."""
    move_out(ours(**kwargs), lambda m: theirs(m.parameters(), **torch_kwargs(kwargs)))


@pytest.mark.parametrize(("ours", "theirs", "kwargs"), variants())
def test_torch_run_moves_to_paramdict_bit_for_bit(
    ours: Callable[..., Any], theirs: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    """A torch run on paramdict's kernels continues in paramdict bit for bit."""
    move_in(
        ours(**kwargs),
        lambda m, **flags: theirs(m.parameters(), **torch_kwargs(kwargs), **flags),
    )


MUON = next(case for case in TABLE if case.name == "muon")
WEIGHTS = ["0.weight", "2.weight"]


def torch_muon(model: nn.Module, kwargs: dict[str, Any]) -> torch.optim.Optimizer:
    """Return torch's Muon on the model's weights."""
    named = dict(model.named_parameters())
    return TorchMuon([named[k] for k in WEIGHTS], **kwargs)


@pytest.mark.parametrize(
    "kwargs", list(MUON.trajectories.values()), ids=list(MUON.trajectories)
)
def test_muon_moves_both_ways_bit_for_bit(kwargs: dict[str, Any]) -> None:
    """A run of torch's Muon moves into paramdict's and back, bit for bit."""
    data = list(batches(DTYPE, 2 * FIRST + THEN))
    reference = make_model(DTYPE)
    torch_steps(reference, torch_muon(reference, kwargs), data)
    model = make_model(DTYPE)
    first = torch_muon(model, kwargs)
    torch_steps(model, first, data[:FIRST])
    muon = optim.Muon(**kwargs)
    opt: optim.ParamGroups[Any] = optim.ParamGroups(
        {"*weight": muon}, default=optim.SGD(lr=0.0)
    )
    params = ParamDict.from_module(model).detach().requires_grad_()
    loaded = optim.load_torch_state_dict(
        muon, first.state_dict(), params.select("*weight"), [WEIGHTS]
    )
    moved, state = our_steps(
        opt, params, (loaded, opt.init(params)[1]), data[FIRST:-THEN]
    )
    back = make_model(DTYPE)
    load_params(back, moved)
    second = torch_muon(back, kwargs)
    second.load_state_dict(optim.to_torch_state_dict(muon, state[0], [WEIGHTS]))
    torch_steps(back, second, data[-THEN:])
    assert_bitwise(dict(back.named_parameters()), dict(reference.named_parameters()))


def _schedules() -> dict[str, tuple[Callable[[], Any], Callable[[Any], Any]]]:
    """Every schedule class that converts, as `(ours, theirs)` builders."""
    swa = torch.optim.swa_utils
    return {
        "step": (
            lambda: optim.StepLR(base_lr=0.05, step_size=2, gamma=0.5),
            lambda o: Sched.StepLR(o, step_size=2, gamma=0.5),
        ),
        "multi-step": (
            lambda: optim.MultiStepLR(base_lr=0.05, milestones=(2, 5), gamma=0.5),
            lambda o: Sched.MultiStepLR(o, milestones=[2, 5], gamma=0.5),
        ),
        "constant": (
            lambda: optim.ConstantLR(base_lr=0.05, factor=0.3, total_iters=3),
            lambda o: Sched.ConstantLR(o, factor=0.3, total_iters=3),
        ),
        "linear": (
            lambda: optim.LinearLR(base_lr=0.05, start_factor=0.2, total_iters=5),
            lambda o: Sched.LinearLR(o, start_factor=0.2, total_iters=5),
        ),
        "exponential": (
            lambda: optim.ExponentialLR(base_lr=0.05, gamma=0.9),
            lambda o: Sched.ExponentialLR(o, gamma=0.9),
        ),
        "polynomial": (
            lambda: optim.PolynomialLR(base_lr=0.05, total_iters=6, power=1.5),
            lambda o: Sched.PolynomialLR(o, total_iters=6, power=1.5),
        ),
        "cosine": (
            lambda: optim.CosineAnnealingLR(base_lr=0.05, T_max=6),
            lambda o: Sched.CosineAnnealingLR(o, T_max=6),
        ),
        "warm-restarts": (
            lambda: optim.CosineAnnealingWarmRestarts(base_lr=0.05, T_0=2, T_mult=2),
            lambda o: Sched.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2),
        ),
        "cyclic": (
            lambda: optim.CyclicLR(base_lr=0.001, max_lr=0.05, step_size_up=2),
            lambda o: Sched.CyclicLR(o, base_lr=0.001, max_lr=0.05, step_size_up=2),
        ),
        "one-cycle": (
            lambda: optim.OneCycleLR(max_lr=0.05, total_steps=12),
            lambda o: Sched.OneCycleLR(o, max_lr=0.05, total_steps=12),
        ),
        "plateau": (
            lambda: optim.ReduceLROnPlateau(base_lr=0.05, patience=0, factor=0.5),
            lambda o: Sched.ReduceLROnPlateau(o, patience=0, factor=0.5),
        ),
        "lambda": (
            lambda: optim.LambdaLR(base_lr=0.05, lr_lambda=lambda e: 0.9**e),
            lambda o: Sched.LambdaLR(o, lr_lambda=lambda e: 0.9**e),
        ),
        "multiplicative": (
            lambda: optim.MultiplicativeLR(base_lr=0.05, lr_lambda=lambda e: 0.9),
            lambda o: Sched.MultiplicativeLR(o, lr_lambda=lambda e: 0.9),
        ),
        "swa": (
            lambda: optim.SWALR(base_lr=0.05, swa_lr=0.01, anneal_epochs=3),
            lambda o: swa.SWALR(o, swa_lr=0.01, anneal_epochs=3),
        ),
        "sequential": (
            lambda: optim.SequentialLR(
                base_lr=0.05,
                schedulers=(
                    optim.LinearLR(start_factor=0.2, total_iters=2),
                    optim.ExponentialLR(gamma=0.9),
                ),
                milestones=(2,),
            ),
            lambda o: Sched.SequentialLR(
                o,
                [
                    Sched.LinearLR(o, start_factor=0.2, total_iters=2),
                    Sched.ExponentialLR(o, gamma=0.9),
                ],
                milestones=[2],
            ),
        ),
        "chained": (
            lambda: optim.ChainedScheduler(
                base_lr=0.05,
                schedulers=(
                    optim.ConstantLR(factor=0.5, total_iters=3),
                    optim.ExponentialLR(gamma=0.9),
                ),
            ),
            lambda o: Sched.ChainedScheduler(
                [
                    Sched.ConstantLR(o, factor=0.5, total_iters=3),
                    Sched.ExponentialLR(o, gamma=0.9),
                ]
            ),
        ),
    }


SCHEDULED: dict[str, tuple[Callable[[Any], Any], Callable[..., Any]]] = {
    "adam": (
        lambda s: optim.Adam(lr=s),
        lambda m, **flags: torch.optim.Adam(m.parameters(), lr=0.05, **flags),
    ),
    "sgd-momentum": (
        lambda s: optim.SGD(lr=s, momentum=0.9),
        lambda m, **flags: torch.optim.SGD(
            m.parameters(), lr=0.05, momentum=0.9, **flags
        ),
    ),
}


def scheduled_cases() -> list[Any]:
    """Return `(schedule, optimizer)` names for every pair."""
    return [pytest.param(s, o, id=f"{o}-{s}") for s in _schedules() for o in SCHEDULED]


@pytest.mark.parametrize(("schedule", "optimizer"), scheduled_cases())
def test_scheduled_runs_move_both_ways_bit_for_bit(
    schedule: str, optimizer: str
) -> None:
    """Mid-schedule, a run moves either way and continues bit for bit."""
    ours_schedule, theirs_schedule = _schedules()[schedule]
    ours, theirs = SCHEDULED[optimizer]
    move_out(ours(ours_schedule()), theirs, theirs_schedule)
    move_in(ours(ours_schedule()), theirs, theirs_schedule)


@needs_torch(2, 7, "torch.optim.AdamW saving `decoupled_weight_decay` in its groups")
def test_another_optimizers_dict_that_fits_loads_as_torch_loads_it() -> None:
    """An RAdam dict fits Adam's settings and buffers: taken, as torch takes it.

    torch's state dicts do not name their class; torch's Adam loads RAdam's and
    continues from its buffers and step (on its loop: RAdam's dict says
    `foreach=None`). So does paramdict's (documented), on the rule.
    """
    data = list(batches(DTYPE, FIRST + THEN))
    model = make_model(DTYPE)
    radam = torch.optim.RAdam(model.parameters(), lr=0.01)
    torch_steps(model, radam, data[:FIRST])
    saved = radam.state_dict()
    twin = make_model(DTYPE)
    load_params(twin, ParamDict.from_module(model))
    adam = torch.optim.Adam(twin.parameters(), lr=0.01)
    adam.load_state_dict(copy.deepcopy(saved))  # torch steps the loaded tensors
    torch_steps(twin, adam, data[FIRST:])
    opt = optim.Adam(lr=0.01, fused=False)
    params = ParamDict.from_module(model).detach().requires_grad_()
    state = optim.load_torch_state_dict(opt, saved, params, model)
    moved, _ = our_steps(opt, params, state, data[FIRST:])
    assert_bitwise(dict(moved), dict(twin.named_parameters()))
