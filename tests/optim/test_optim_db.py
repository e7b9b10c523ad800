"""torch's own optimizer configurations (`optim_db`) replayed against paramdict.

`torch.testing._internal.common_optimizers.optim_db` lists, for every optimizer
of `torch.optim`, the option sets and the schedulers torch's own tests run
(`StepLR` and `ReduceLROnPlateau` stepped together on one optimizer, chains of
`ConstantLR`, `ExponentialLR`, ...). Each configuration of an optimizer paramdict
has runs here for 20 float64 steps with `torch.optim` (its default
implementation) and with paramdict's `step` and `step_` from the same start;
the parameters are compared after every step. Torch's schedulers stepped
together on one optimizer are paramdict's `ChainedScheduler`, with the metric
given through `step_schedule`.

Counted apart, each asserted as what it is:

- Refused on purpose: `LBFGS` takes no schedule (its step runs a line search at
  one rate); the error says why and how to step a schedule beside it.
- A documented difference: a float32 tensor `lr` under a schedule. torch writes
  each scheduled rate into that float32 tensor and computes the next one from
  it in float32; paramdict's schedules compute in float64 throughout, so the
  parameters agree to float32's precision of the rate (rtol 1e-6), not bitwise.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _torch_versions import needs_torch
from torch import Tensor

from paramdict import ParamDict, optim

common_optimizers = pytest.importorskip(
    "torch.testing._internal.common_optimizers",
    reason="torch's optimizer test data needs `expecttest` (the test extra)",
)

STEPS = 20
F64 = torch.float64
SKIPPED_CLASSES = {"SparseAdam": "paramdict has no SparseAdam (see the docs)"}


def _inputs(info: Any) -> list[Any]:
    """Return the option sets of `info` for float64 on the CPU."""
    func = info.optim_inputs_func
    if "dtype" in inspect.signature(func).parameters:
        return list(func(device="cpu", dtype=F64))
    return list(func(device="cpu"))


# Ours stops the strong-Wolfe line search at `max_eval` evaluations, as torch 2.13's
# LBFGS does; torch 2.6's lets it run its own 25 (the releases between unchecked).
_BOUNDED_LINE_SEARCH = needs_torch(
    2, 13, "torch.optim.LBFGS's strong-Wolfe line search bounded by `max_eval`"
)


def _configs() -> list[Any]:
    """Return one pytest parameter per (optimizer, option set, schedulers)."""
    rows: list[Any] = []
    for info in common_optimizers.optim_db:
        name = info.optim_cls.__name__
        if name in SKIPPED_CLASSES:
            continue
        for optim_input in _inputs(info):
            if optim_input.params is not None:
                continue  # torch's group-structure inputs: test_optim_groups
            kwargs = dict(optim_input.kwargs)
            wolfe = kwargs.get("line_search_fn") == "strong_wolfe"
            for i, schedulers in enumerate([[], *info.scheduler_inputs]):
                rows.append(
                    pytest.param(
                        info.optim_cls,
                        kwargs,
                        list(schedulers),
                        id=f"{name}-{optim_input.desc}-sched{i}",
                        marks=_BOUNDED_LINE_SEARCH if wolfe and not i else (),
                    )
                )
    return rows


def _start(name: str) -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(0)
    shapes: dict[str, tuple[int, ...]] = {"weight": (3, 4), "other": (4, 2)}
    if name != "Muon":  # Muon takes matrices only
        shapes["bias"] = (3,)
    return {
        k: torch.randn(s, generator=generator, dtype=F64) for k, s in shapes.items()
    }


def _data() -> list[tuple[Tensor, Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(5, 2, generator=generator, dtype=F64),
            torch.randn(5, 3, generator=generator, dtype=F64),
        )
        for _ in range(STEPS)
    ]


def _loss(p: dict[str, Tensor] | ParamDict, x: Tensor, y: Tensor) -> Tensor:
    out = x @ p["other"].T @ p["weight"].T
    if "bias" in p:
        out = out + p["bias"]
    return F.mse_loss(torch.tanh(out), y)


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, Tensor) else value


def _schedule(made: Any) -> Any:
    """Return paramdict's schedule for torch's scheduler object `made`."""
    kind = type(made).__name__
    if kind == "StepLR":
        return optim.StepLR(step_size=made.step_size, gamma=made.gamma)
    if kind == "ExponentialLR":
        return optim.ExponentialLR(gamma=made.gamma)
    if kind == "LinearLR":
        return optim.LinearLR(
            start_factor=made.start_factor,
            end_factor=made.end_factor,
            total_iters=made.total_iters,
        )
    if kind == "ConstantLR":
        return optim.ConstantLR(factor=made.factor, total_iters=made.total_iters)
    if kind == "PolynomialLR":
        return optim.PolynomialLR(total_iters=made.total_iters, power=made.power)
    if kind == "ReduceLROnPlateau":
        return optim.ReduceLROnPlateau(
            mode=made.mode,
            factor=made.factor,
            patience=made.patience,
            threshold=made.threshold,
            threshold_mode=made.threshold_mode,
            cooldown=made.cooldown,
            min_lr=made.min_lrs[0],
            eps=made.eps,
        )
    msg = f"no paramdict schedule mapped for torch's {kind}"
    raise AssertionError(msg)


def _ours(
    cls: type[Any], kwargs: dict[str, Any], made: list[Any]
) -> optim.Optimizer[Any] | optim.LBFGS:
    """Return paramdict's optimizer for `cls(**kwargs)` with `made` schedulers."""
    ours_cls = getattr(optim, cls.__name__)
    kwargs = {k: _copy(v) for k, v in kwargs.items()}
    if made:
        lr = kwargs.pop("lr", inspect.signature(cls).parameters["lr"].default)
        children = [_schedule(m) for m in made]
        if len(children) == 1:
            only = children[0]
            kwargs["lr"] = attrs_evolve(only, base_lr=_copy(lr))
        else:
            kwargs["lr"] = optim.ChainedScheduler(
                schedulers=children, base_lr=_copy(lr)
            )
    result: optim.Optimizer[Any] | optim.LBFGS = ours_cls(**kwargs)
    return result


def attrs_evolve(schedule: Any, **changes: Any) -> Any:
    import attrs

    return attrs.evolve(schedule, **changes)


def _torch_run(
    cls: type[Any],
    kwargs: dict[str, Any],
    schedulers: list[Callable[[Any], Any]],
    data: list[tuple[Tensor, Tensor]],
) -> tuple[list[dict[str, Tensor]], list[Any]]:
    params = {k: v.requires_grad_() for k, v in _start(cls.__name__).items()}
    opt = cls(list(params.values()), **{k: _copy(v) for k, v in kwargs.items()})
    made = [s(opt) for s in schedulers]
    trajectory = []
    for x, y in data:

        def closure(x: Tensor = x, y: Tensor = y) -> Tensor:
            opt.zero_grad()
            loss = _loss(params, x, y)
            torch.autograd.backward(loss)
            return loss

        loss = opt.step(closure)
        for sched in made:
            if type(sched).__name__ == "ReduceLROnPlateau":
                sched.step(loss.detach())
            else:
                sched.step()
        trajectory.append({k: v.detach().clone() for k, v in params.items()})
    return trajectory, made


def _our_run(
    opt: Any, data: list[tuple[Tensor, Tensor]], name: str, *, in_place: bool
) -> list[dict[str, Tensor]]:
    params = ParamDict(_start(name))
    state = opt.init(params)
    trajectory = []
    for x, y in data:
        if isinstance(opt, optim.LBFGS):
            loss = _loss(params, x, y).detach()

            def closure(p: ParamDict, x: Tensor = x, y: Tensor = y) -> Tensor:
                return _loss(p, x, y)

            params, state = opt.step(params, closure, state)
        else:
            with torch.enable_grad():
                tracked = params.detach().requires_grad_()
                loss = _loss(tracked, x, y)
                grads = tracked.grad(loss)
            loss = loss.detach()
            step = opt.step_ if in_place else opt.step
            params, state = step(params, grads, state)
        if not isinstance(opt, optim.LBFGS) and opt.takes_metric:
            state = opt.step_schedule(state, loss)
        trajectory.append({k: v.detach().clone() for k, v in params.items()})
    return trajectory


def _where(step: int, in_place: bool, message: str) -> str:
    return f"step {step} (step_={in_place}): {message}"


@pytest.mark.parametrize(("cls", "kwargs", "schedulers"), _configs())
def test_optim_db_config(
    cls: type[Any], kwargs: dict[str, Any], schedulers: list[Any]
) -> None:
    """Our `step` (and `step_`) follow torch.optim, step by step."""
    data = _data()
    expected, made = _torch_run(cls, kwargs, schedulers, data)
    if cls is torch.optim.LBFGS and made:
        with pytest.raises(TypeError, match="`LBFGS` takes no schedule"):
            _ours(cls, kwargs, made)
        return
    opt = _ours(cls, kwargs, made)
    modes = [False] if isinstance(opt, optim.LBFGS) else [False, True]
    lr = kwargs.get("lr")
    float32_rate = made and isinstance(lr, Tensor) and lr.dtype == torch.float32
    rtol, atol = (1e-6, 1e-9) if float32_rate else (1e-12, 1e-14)
    for in_place in modes:
        got = _our_run(opt, data, cls.__name__, in_place=in_place)
        for i, (ours, theirs) in enumerate(zip(got, expected, strict=True)):
            torch.testing.assert_close(
                ours,
                theirs,
                rtol=rtol,
                atol=atol,
                msg=functools.partial(_where, i + 1, in_place),
            )
