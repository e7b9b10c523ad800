"""`optim.as_torch_optimizer`: what its `step` costs over the `step_` it wraps.

At the model-scale sizes of the `optim-scale` section (50 entries x 400,000
float32, and GPT-2 small's 148 parameter shapes), each row times one optimizer
two ways on equal tensors with the same gradients, each candidate carrying its
own state:

- `ParamDict`: `opt.step_(params, grads, state)`, the in-place step, on a
  ParamDict of `nn.Parameter`s, as `ParamDict.from_module` gives them (torch's
  fused kernel where the step allows);
- `as_torch_optimizer`: `opt.step()` of the adapter around the same optimizer,
  on `nn.Parameter`s whose `.grad` is set: what a training loop calls.

The rows: AdamW (torch's fused kernel), AdamW with `fused=False` (the foreach
rule), SGD with momentum (fused), and AdamW under a warm-up + cosine schedule,
where the adapter's candidate also steps torch's `LambdaLR` (which writes the
group's `lr` each step) and `ParamDict`'s uses paramdict's `LambdaLR` of the
same factors. Before timing, three steps of each candidate must agree (float32
rounding). Target: the adapter's `step` within 1.05x of the `step_` it wraps, on
every row. Model-scale sizes are measured in full runs only; `--quick` notes that
and returns at once. `python -m benchmarks --only adapter` runs it alone (about
25 minutes on one thread of the docs' 2-core machine).
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from paramdict import ParamDict, optim

from ._report import OURS, Config, Row, Section, ratio_target
from .optim_scale import GPT2, WIDE, _agree, _data, _warmup_cosine

__all__ = ["measure"]

ADAPTER = "as_torch_optimizer"
SCHEDULED = "AdamW warm-up + cosine"

Make = Callable[[], optim.Optimizer[Any]]
ROWS: dict[str, Make] = {
    "AdamW": lambda: optim.AdamW(lr=1e-3, weight_decay=0.01),
    "AdamW fused=False": lambda: optim.AdamW(lr=1e-3, weight_decay=0.01, fused=False),
    "SGD momentum": lambda: optim.SGD(lr=1e-3, momentum=0.9),
}


def _in_place(
    opt: optim.Optimizer[Any],
    keys: list[str],
    values: list[Tensor],
    grads: list[Tensor],
) -> Callable[[], object]:
    # A module's parameters, as the adapter's: leaves that require grad.
    params = ParamDict(zip(keys, [nn.Parameter(v.clone()) for v in values]))
    grad_dict = ParamDict(zip(keys, grads))
    state = opt.init(params)

    def run() -> object:
        opt.step_(params, grad_dict, state)
        return params

    return run


def _adapted(
    opt: optim.Optimizer[Any],
    keys: list[str],
    values: list[Tensor],
    grads: list[Tensor],
    *,
    scheduled: bool = False,
) -> Callable[[], object]:
    tensors = [nn.Parameter(v.clone()) for v in values]
    for tensor, grad in zip(tensors, grads):
        tensor.grad = grad  # the same gradient tensors as `_in_place`'s
    adapter = optim.as_torch_optimizer(opt, list(zip(keys, tensors)))
    sched = (
        torch.optim.lr_scheduler.LambdaLR(adapter, _warmup_cosine)
        if scheduled
        else None
    )

    def run() -> object:
        adapter.step()
        if sched is not None:
            sched.step()
        return tensors

    return run


def _row(name: str, size: str, timing: Config) -> Row:
    keys, values, grads = _data(size)
    candidates: dict[str, Callable[[], object]] = {}
    with torch.inference_mode(False):
        if name == SCHEDULED:
            schedule = optim.LambdaLR(base_lr=1e-3, lr_lambda=_warmup_cosine)
            ours = optim.AdamW(lr=schedule, weight_decay=0.01)
            candidates[OURS] = _in_place(ours, keys, values, grads)
            theirs = optim.AdamW(lr=1e-3, weight_decay=0.01)
            candidates[ADAPTER] = _adapted(theirs, keys, values, grads, scheduled=True)
        else:
            candidates[OURS] = _in_place(ROWS[name](), keys, values, grads)
            candidates[ADAPTER] = _adapted(ROWS[name](), keys, values, grads)
        _agree(candidates, reference=OURS)
        row = Row.from_timings(f"{name} step", size, timing.time(candidates))
    del candidates
    gc.collect()
    return row


def measure(config: Config) -> Section:
    """Time the adapter's `step` against the `step_` it wraps (full runs only)."""
    section = Section(
        "adapter",
        "A paramdict optimizer as a torch.optim.Optimizer",
        "One step per call on float32 entries: `ParamDict` is `opt.step_(params, "
        "grads, state)`, `as_torch_optimizer` is the adapter's `step()` around the "
        "same optimizer, reading `.grad`; the scheduled row also steps the schedule.",
    )
    if config.quick:
        section.notes.append("Model-scale sizes are measured in full runs only.")
        return section
    # Each sample is one call of 25 ms to 3 s: more rounds than `optim-scale`'s,
    # since the ratios sought are within a few percent of noise of 10% or more.
    rounds = max(5, min(config.rounds, 61))
    timing = dataclasses.replace(config, rounds=rounds, target=0.05, warmup=2)
    for size in (WIDE, GPT2):
        for name in (*ROWS, SCHEDULED):
            row = _row(name, size, timing)
            section.rows.append(row)
            section.targets.append(
                ratio_target(
                    f"{name}: the adapter's `step` within 1.05x of `step_`, {size}",
                    row,
                    ADAPTER,
                    OURS,
                    1.05,
                )
            )
    return section
