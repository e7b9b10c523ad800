"""Kernel launches and host syncs per step, against torch.optim, on fake CUDA tensors.

On a GPU a step costs its kernel launches and the host's waits for the device, not
its arithmetic. Each test takes steps on `cuda` tensors of `FakeTensorMode` (no GPU
needed, see `launches.py`), counts the device calls of the third one, and compares
with torch.optim's `foreach=True` step on the same tensors (its fastest default
path on a GPU): never more calls, never a host sync. Learning-rate schedules run
on the host (torch's schedulers do), so a scheduled step launches what an
unscheduled one does; two parameter groups launch what torch's two groups do.
`as_torch_optimizer`'s `step` launches exactly what the `step_` it wraps does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _torch_versions import needs_torch
from launches import DeviceOps, count, cuda_tensors

from paramdict import ParamDict, optim

SHAPES = [(32, 16), (16,), (8, 8), (4, 3, 2, 2), (16, 8), (8,)]


def _keys() -> list[str]:
    return [f"{'w' if len(s) > 1 else 'b'}{i}" for i, s in enumerate(SHAPES)]


# name: (ours, torch's class, default options, options with most switches on)
TABLE: dict[str, tuple[Any, Any, dict[str, Any], dict[str, Any]]] = {
    "SGD": (
        optim.SGD,
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9},
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.1},
    ),
    "Adam": (optim.Adam, torch.optim.Adam, {}, {"weight_decay": 0.1, "amsgrad": True}),
    "AdamW": (optim.AdamW, torch.optim.AdamW, {}, {"amsgrad": True}),
    "NAdam": (
        optim.NAdam,
        torch.optim.NAdam,
        {},
        {"weight_decay": 0.1, "decoupled_weight_decay": True},
    ),
    "RAdam": (
        optim.RAdam,
        torch.optim.RAdam,
        {},
        {"weight_decay": 0.1, "decoupled_weight_decay": True},
    ),
    "Adamax": (optim.Adamax, torch.optim.Adamax, {}, {"weight_decay": 0.1}),
    "RMSprop": (
        optim.RMSprop,
        torch.optim.RMSprop,
        {},
        {"momentum": 0.9, "centered": True, "weight_decay": 0.1},
    ),
    "Adagrad": (
        optim.Adagrad,
        torch.optim.Adagrad,
        {},
        {"lr_decay": 0.01, "weight_decay": 0.1},
    ),
    "Adadelta": (optim.Adadelta, torch.optim.Adadelta, {}, {"weight_decay": 0.1}),
    "ASGD": (optim.ASGD, torch.optim.ASGD, {}, {"weight_decay": 0.1}),
    "Rprop": (optim.Rprop, torch.optim.Rprop, {}, {"etas": (0.4, 1.3)}),
    "Adafactor": (
        optim.Adafactor,
        torch.optim.Adafactor,
        {},
        {"weight_decay": 0.1},
    ),
}


def _torch_ops(cls: Any, options: dict[str, Any], *, groups: bool = False) -> DeviceOps:
    """torch.optim's foreach step on the fake CUDA tensors (CPU ones if it cannot)."""
    try:
        return _run_torch(cls, options, "cuda", groups=groups)
    except (RuntimeError, AssertionError, NotImplementedError) as error:
        # A torch step that reads a device tensor on the host (ASGD's) or makes
        # real CUDA tensors (Rprop's) cannot run on fake ones: the same calls on
        # CPU tensors, each counted as a device call.
        reason = str(error)
        ops = _run_torch(cls, options, "cpu", groups=groups)
        ops.syncs.append(f"runs only on real tensors: {reason[:80]}")
        return ops


def _run_torch(
    cls: Any, options: dict[str, Any], device: str, *, groups: bool
) -> DeviceOps:
    if device == "cuda":
        tensors, grads = cuda_tensors(SHAPES), cuda_tensors(SHAPES)
    else:
        tensors = [torch.randn(s) for s in SHAPES]
        grads = [torch.randn(s) for s in SHAPES]
    params = [torch.nn.Parameter(t) for t in tensors]
    kwargs = {**options, "foreach": True}
    lr = options.get("lr", 0.01)
    arg: Any = (
        [{"params": params[::2], "lr": lr}, {"params": params[1::2], "lr": lr / 2}]
        if groups
        else params
    )
    opt = cls(arg, **kwargs)

    def step() -> None:
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()

    return count(step, everywhere=device == "cpu")


def _ours_ops(opt: optim.Optimizer[Any], *, in_place: bool) -> DeviceOps:
    params = ParamDict(zip(_keys(), cuda_tensors(SHAPES)))
    grads = ParamDict(zip(_keys(), cuda_tensors(SHAPES)))
    held: list[Any] = [params, opt.init(params)]

    def step() -> None:
        take = opt.step_ if in_place else opt.step
        held[0], held[1] = take(held[0], grads, held[1])

    return count(step)


def _ours(name: str, options: dict[str, Any], config: str) -> optim.Optimizer[Any]:
    make: Callable[..., optim.Optimizer[Any]] = TABLE[name][0]
    lr = options.get("lr", 0.01 if name != "Adadelta" else 1.0)
    rest = {k: v for k, v in options.items() if k != "lr"}
    if config == "schedule":
        return make(lr=optim.StepLR(base_lr=lr, step_size=2, gamma=0.5), **rest)
    if config == "groups":
        return optim.ParamGroups(
            {"w*": make(lr=lr, **rest)}, default=make(lr=lr / 2, **rest)
        )
    return make(lr=lr, **rest)


CONFIGS = ["default", "rich", "schedule", "groups"]


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("name", list(TABLE))
def test_a_step_launches_no_more_than_torch_foreach(
    name: str, config: str, in_place: bool
) -> None:
    """As many device calls as torch.optim's foreach step at most; no host sync."""
    _, theirs_cls, default, rich = TABLE[name]
    options = rich if config == "rich" else default
    if config in ("rich",):
        options = {**options, "maximize": True}
    opt = _ours(name, options, config)
    ours = _ours_ops(opt, in_place=in_place)
    theirs = _torch_ops(theirs_cls, options, groups=config == "groups")
    assert not ours.syncs, f"host syncs: {ours.syncs}"
    assert len(ours.ops) <= len(theirs.ops), (
        f"{name} ({config}) launches {len(ours.ops)} calls: {ours.summary()}; "
        f"torch.optim foreach: {len(theirs.ops)}: {theirs.summary()}"
    )


# ------------------------------------------------------------ schedules


def _schedules(lr: float) -> dict[str, Any]:
    return {
        "LambdaLR": optim.LambdaLR(base_lr=lr, lr_lambda=lambda e: 0.9**e),
        "MultiplicativeLR": optim.MultiplicativeLR(base_lr=lr, lr_lambda=lambda e: 0.9),
        "StepLR": optim.StepLR(base_lr=lr, step_size=2),
        "MultiStepLR": optim.MultiStepLR(base_lr=lr, milestones=[1, 3]),
        "ConstantLR": optim.ConstantLR(base_lr=lr),
        "LinearLR": optim.LinearLR(base_lr=lr),
        "ExponentialLR": optim.ExponentialLR(base_lr=lr, gamma=0.9),
        "PolynomialLR": optim.PolynomialLR(base_lr=lr),
        "CosineAnnealingLR": optim.CosineAnnealingLR(base_lr=lr, T_max=10),
        "CosineAnnealingWarmRestarts": optim.CosineAnnealingWarmRestarts(
            base_lr=lr, T_0=2
        ),
        "CyclicLR": optim.CyclicLR(
            base_lr=lr, max_lr=10 * lr, step_size_up=2, cycle_momentum=False
        ),
        "OneCycleLR": optim.OneCycleLR(
            base_lr=lr, max_lr=10 * lr, total_steps=10, cycle_momentum=False
        ),
        "SequentialLR": optim.SequentialLR(
            base_lr=lr,
            schedulers=[
                optim.LinearLR(start_factor=0.1, total_iters=2),
                optim.CosineAnnealingLR(T_max=8),
            ],
            milestones=[2],
        ),
        "ChainedScheduler": optim.ChainedScheduler(
            base_lr=lr,
            schedulers=[optim.ConstantLR(), optim.ExponentialLR(gamma=0.9)],
        ),
        "SWALR": optim.SWALR(base_lr=lr, swa_lr=lr / 2, anneal_epochs=2),
    }


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize("schedule", list(_schedules(0.01)))
def test_a_schedule_launches_nothing(schedule: str, in_place: bool) -> None:
    """Every schedule advances on the host: a step launches what a plain one does."""
    plain = _ours_ops(optim.AdamW(lr=0.01, weight_decay=0.1), in_place=in_place)
    opt = optim.AdamW(lr=_schedules(0.01)[schedule], weight_decay=0.1)
    ours = _ours_ops(opt, in_place=in_place)
    assert not ours.syncs, f"host syncs: {ours.syncs}"
    assert ours.ops == plain.ops, f"{ours.summary()} against {plain.summary()}"


def test_a_plateau_schedule_launches_nothing() -> None:
    """`ReduceLROnPlateau` steps with a metric on the host; the step launches alike."""
    plain = _ours_ops(optim.SGD(lr=0.1, momentum=0.9), in_place=True)
    opt = optim.SGD(lr=optim.ReduceLROnPlateau(base_lr=0.1), momentum=0.9)
    params = ParamDict(zip(_keys(), cuda_tensors(SHAPES)))
    grads = ParamDict(zip(_keys(), cuda_tensors(SHAPES)))
    held: list[Any] = [opt.init(params)]

    def step() -> None:
        _, held[0] = opt.step_(params, grads, held[0])
        held[0] = opt.step_schedule(held[0], 1.0)

    ours = count(step)
    assert not ours.syncs, f"host syncs: {ours.syncs}"
    assert ours.ops == plain.ops, f"{ours.summary()} against {plain.summary()}"


# ------------------------------------------------------------ wrappers


def _torch_clip_adamw(max_norm: float) -> DeviceOps:
    """`clip_grad_norm_(foreach=True)` and AdamW's foreach step.

    On CPU tensors, counted everywhere, where torch's clipping moves its norms
    to the fake device through CUDA itself: a CPU build refuses that, a CUDA
    build without a driver fails in its initialization.
    """
    if not (torch.version.cuda is not None and not torch.cuda.is_available()):
        try:
            return _clip_adamw(max_norm, cuda_tensors(SHAPES), cuda_tensors(SHAPES))
        except AssertionError:  # "Torch not compiled with CUDA enabled"
            pass
    tensors = [torch.randn(s) for s in SHAPES]
    grads = [torch.randn(s) for s in SHAPES]
    return _clip_adamw(max_norm, tensors, grads, everywhere=True)


def _clip_adamw(
    max_norm: float, tensors: list[Any], grads: list[Any], *, everywhere: bool = False
) -> DeviceOps:
    params = [torch.nn.Parameter(t) for t in tensors]
    opt = torch.optim.AdamW(params, foreach=True)

    def step() -> None:
        for p, g in zip(params, grads):
            p.grad = g
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        opt.step()

    return count(step, everywhere=everywhere)


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_clip_grad_norm_launches_no_more_than_torch(in_place: bool) -> None:
    """`ClipGradNorm(AdamW)`: `clip_grad_norm_(foreach=True)` + AdamW's launches."""
    ours = _ours_ops(optim.ClipGradNorm(optim.AdamW(), max_norm=1.0), in_place=in_place)
    theirs = _torch_clip_adamw(1.0)
    assert not ours.syncs, f"host syncs: {ours.syncs}"
    assert len(ours.ops) <= len(theirs.ops), (
        f"{ours.summary()}; torch: {theirs.summary()}"
    )


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_multi_steps_launch_one_add_per_micro_batch(in_place: bool) -> None:
    """`MultiSteps(AdamW, 2)`: one kernel to accumulate, two more to step.

    An accumulating call adds the gradients (torch's backward does the same
    into `.grad`); a stepping one adds, takes the mean, and runs AdamW.
    """
    adamw = _ours_ops(optim.AdamW(), in_place=in_place)
    opt = optim.MultiSteps(optim.AdamW(), every_k=2)
    params = ParamDict(zip(_keys(), cuda_tensors(SHAPES)))
    grads = ParamDict(zip(_keys(), cuda_tensors(SHAPES)))
    held: list[Any] = [params, opt.init(params)]
    take = opt.step_ if in_place else opt.step

    def step() -> None:
        held[0], held[1] = take(held[0], grads, held[1])

    accumulating = count(step, warm=2)  # the third call accumulates
    stepping = count(step, warm=0)  # the fourth steps
    for ops in (accumulating, stepping):
        assert not ops.syncs, f"host syncs: {ops.syncs}"
    assert len(accumulating.ops) == 1, accumulating.summary()
    assert len(stepping.ops) <= len(adamw.ops) + 2, (
        f"{stepping.summary()}; AdamW alone: {adamw.summary()}"
    )


# ------------------------------------------------------------ Lion and Muon


def _torch_lion_foreach() -> DeviceOps:
    """Lion written with torch's foreach kernels, as torch.optim would write it."""
    params = cuda_tensors(SHAPES)
    grads = cuda_tensors(SHAPES)
    exp_avg = [torch.zeros_like(p) for p in params]
    lr, beta1, beta2, wd = 1e-4, 0.9, 0.99, 0.1

    def step() -> None:
        torch._foreach_mul_(params, 1 - lr * wd)
        update = torch._foreach_lerp(exp_avg, grads, 1 - beta1)
        torch._foreach_sign_(update)
        torch._foreach_add_(params, update, alpha=-lr)
        torch._foreach_lerp_(exp_avg, grads, 1 - beta2)

    return count(step)


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_lion_launches_no_more_than_a_foreach_lion(in_place: bool) -> None:
    """Lion (no torch.optim class): at most a foreach Lion's five kernels."""
    ours = _ours_ops(optim.Lion(lr=1e-4, weight_decay=0.1), in_place=in_place)
    theirs = _torch_lion_foreach()
    assert not ours.syncs, f"host syncs: {ours.syncs}"
    assert len(ours.ops) <= len(theirs.ops), f"{ours.summary()}; {theirs.summary()}"


MATRICES = [(32, 16), (16, 8), (8, 8)]


@needs_torch(2, 9, "torch.optim.Muon")
@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_muon_launches_no_more_than_torch(in_place: bool) -> None:
    """Muon against `torch.optim.Muon` on the same matrices."""
    keys = [f"w{i}" for i in range(len(MATRICES))]
    params = ParamDict(zip(keys, cuda_tensors(MATRICES)))
    grads = ParamDict(zip(keys, cuda_tensors(MATRICES)))
    opt = optim.Muon(lr=0.02)
    held: list[Any] = [params, opt.init(params)]
    take = opt.step_ if in_place else opt.step

    def step() -> None:
        held[0], held[1] = take(held[0], grads, held[1])

    ours = count(step)
    tensors = [torch.nn.Parameter(t) for t in cuda_tensors(MATRICES)]
    torch_grads = cuda_tensors(MATRICES)
    muon = torch.optim.Muon(tensors, lr=0.02)

    def torch_step() -> None:
        for p, g in zip(tensors, torch_grads):
            p.grad = g
        muon.step()  # type: ignore[no-untyped-call]  # torch leaves Muon.step untyped

    theirs = count(torch_step)
    assert not ours.syncs, f"host syncs: {ours.syncs}"
    assert len(ours.ops) <= len(theirs.ops), f"{ours.summary()}; {theirs.summary()}"


# ------------------------------------------------------------ weight averaging


@pytest.mark.parametrize("in_place", [False, True], ids=["update", "update_"])
@pytest.mark.parametrize("kind", ["ema", "swa"])
def test_weight_average_launches_one_kernel_per_group(
    kind: str, in_place: bool
) -> None:
    """`WeightAverage`: one foreach kernel per device and dtype, no host read.

    torch's `AveragedModel.update_parameters` with a `multi_avg_fn` calls one
    per group too, and reads its count on the host every update.
    """
    average = (
        optim.WeightAverage.ema(0.99) if kind == "ema" else optim.WeightAverage.swa()
    )
    values = ParamDict(zip(_keys(), cuda_tensors(SHAPES)))
    held: list[Any] = [average.init(values)]

    def update() -> None:
        if in_place:
            average.update_(held[0], values)
        else:
            held[0] = average.update(held[0], values)

    ops = count(update)
    assert not ops.syncs, f"host syncs: {ops.syncs}"
    assert len(ops.ops) == 1, ops.summary()


# ------------------------------------------------------------ as_torch_optimizer


def _adapter_ops(opt: optim.Optimizer[Any], *, scheduled: bool) -> DeviceOps:
    """`as_torch_optimizer(opt)`'s step (and a torch scheduler's) in a plain loop."""
    # Leaves, as torch.optim wants; not requiring grad: autograd's views of a
    # fake tensor outside its mode end the process (Adafactor's `init` makes one).
    tensors = cuda_tensors(SHAPES)
    grads = cuda_tensors(SHAPES)
    adapter = optim.as_torch_optimizer(opt, list(zip(_keys(), tensors)))
    sched = torch.optim.lr_scheduler.StepLR(adapter, step_size=2) if scheduled else None

    def step() -> None:
        for tensor, grad in zip(tensors, grads):
            tensor.grad = grad
        adapter.step()
        if sched is not None:
            sched.step()

    return count(step)


@pytest.mark.parametrize("config", ["default", "rich", "scheduled", "groups"])
@pytest.mark.parametrize("name", list(TABLE))
def test_the_torch_adapter_launches_what_step_in_place_does(
    name: str, config: str
) -> None:
    """`as_torch_optimizer`'s `step` makes the device calls of the `step_` it wraps.

    The same calls, in the same order, and no host sync; a torch scheduler
    writing `lr` into the group each step adds none (two parameter groups: as
    `ParamGroups` of the same optimizers).
    """
    options = TABLE[name][3] if config == "rich" else TABLE[name][2]
    opt = _ours(name, options, "groups" if config == "groups" else "default")
    adapted = _adapter_ops(opt, scheduled=config == "scheduled")
    wrapped = _ours_ops(opt, in_place=True)
    assert not adapted.syncs, f"host syncs: {adapted.syncs}"
    assert adapted.ops == wrapped.ops, (
        f"{name} ({config}): the adapter {adapted.summary()}; step_ {wrapped.summary()}"
    )
