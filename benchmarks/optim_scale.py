"""Optimizer steps at model scale: `paramdict.optim` against torch.optim's kernels.

Sizes: 50 entries x 400,000 float32 (20M parameters) and the 148 parameter shapes
of GPT-2 small (124M parameters). The optimizers are the rows of the tests'
optimizer table (`tests/optim/optim_cases.py`, read through `benchmarks/_table.py`),
each with its row's benchmark options (`bench`), and all run through the same code
(`_model_rows`), each candidate stepping equal tensors with equal gradients and
carrying its own state:

- `ParamDict step_`: `params, state = opt.step_(params, grads, state)`, in place
  (torch's fused kernels where a step allows);
- `ParamDict`: the default out-of-place `opt.step`;
- torch's paths, read from the signature of torch's class (`torch_paths`), fastest
  first: `torch.optim (fused)` where it takes `fused`, `torch.optim (foreach)`
  where it takes `foreach`, else `torch.optim (for-loop)`; `opt.step()` on
  parameters whose `.grad` is set. torch has no Lion: its foreach candidate is the
  table's plain-torch reference, `TorchLion` with `foreach=True`;
- at 50 x 400,000 only: `ParamDict step_ compiled`, `torch.compile(opt.step_)`,
  against `torch.optim (foreach) compiled`, `torch.compile` of torch's foreach
  step; Adam, AdamW, SGD with momentum and Adagrad (`TARGETED`) also keep
  `ParamDict compiled`, `torch.compile(opt.step)`.

Targets, each printed beside its figures: `step_` within 1.10x of torch's fastest
path and the default `step` within 1.30x of it, at both sizes; the compiled `step_`
at least as fast as torch's compiled foreach step (ratio <= 1.00); for `TARGETED`,
the compiled `step` within 1.3x of the fastest path; each LBFGS row within 1.10x of
torch's. Before timing, three steps of every candidate from the same start must
agree with torch's fastest path (fused kernels round slightly differently from
foreach; the check allows float32 rounding). A compiled candidate that does not
agree is left out with a note, and its target reads "not measured"; any other
disagreement stops the run. Then the peak memory of a 20-step loop at 50 x 400,000
for every optimizer but Muon, each of ours and torch's paths in a fresh process:
the growth of the resident set's high-water mark from before the candidate (and its
state) is built, less its copy of the parameters (the working set over the
parameters and gradients), with the target `step_` within 1.10x of torch's fastest
path. Model-scale sizes are measured in full runs only; `--quick` notes that and
returns at once. Part of `python -m benchmarks`; `python -m benchmarks --only
optim-scale` runs it alone.

The table's matrix-only rows (Muon) run on GPT-2 small's 50 matrices only (the 2-D
entries: both embeddings and the 48 weights of the blocks, 124M of its parameters;
the 50 x 400,000 entries are vectors, which Muon refuses), against
`torch.optim (for-loop)`, since torch.optim.Muon has no foreach path, with 5 rounds
after one warm-up (Muon takes about 12 s a step there). They have no compiled
candidates and no peak-memory row, both measured at 50 x 400,000 only (at GPT-2
small, each compiled step would be one of 124M parameters in bfloat16 Newton-Schulz
iterations, and a peak-memory row 20 steps at about 12 s each, per candidate and
process). LBFGS, no row of the table (its step takes the loss), runs at
50 x 400,000 only, as in the `optim` section: each call one `step` from the
same start with a fresh state (`max_iter=5`, `history_size=5`, both line searches)
on a fixed quadratic, against `torch.optim (closure)`, with 5 rounds after one
warm-up. It has no compiled candidates (each iteration's stopping tests read
tensors' values, a graph break apiece) and no peak-memory row yet (each call starts
over from a fresh state rather than carrying one, which the memory workers assume).
At GPT-2 small it is left out: each candidate
keeps its history as `2 * history_size` flat vectors of all 124M parameters (5 GB
at `history_size=5`, 99 GB at torch's default of 100) on a machine of 23 GB shared
with other jobs, and a step would take tens of seconds; the 50 x 400,000 rows show
the costs per flat vector already.

The nanoGPT recipe (`--optimizers "nanoGPT recipe"`) times the optimizer work of
one training step at GPT-2 small's shapes, its 2 micro-batches' gradients given:
`MultiSteps(ClipGradNorm(ParamGroups(...)))` with AdamW groups (decay on the
entries of 2 or more dimensions) at a warm-up + cosine rate, then an EMA
(`WeightAverage.ema`), against torch.optim's `AdamW` (`fused=True`, and its default
`foreach=True`) + `LambdaLR` + `clip_grad_norm_(foreach=True)` and an `AveragedModel`
EMA (see `_recipe_row`).

On one thread of the 2-core machine of the docs, shared with other jobs, a full run
of this section took about 37 minutes before every optimizer carried peak-memory
rows and compiled candidates: 10 for Adam, AdamW, SGD with momentum and Adagrad
(compile and peak memory included), 27 for the others, of which Muon (about 12 s a
step, its Newton-Schulz iterations in bfloat16 on 124M parameters) and LBFGS take
half. The nine others now add about a minute of peak memory and one of compiling
each (`--optimizers RAdam --rounds 3`, compile and peak memory included, took 4
minutes on the loaded machine). The thirteen optimizers of the table, compile and
peak memory included, took 25 minutes on 4 December 2026; Muon, LBFGS and the two
schedule rows add about 20 more, estimated.
`--optimizers` picks some:
`python -m benchmarks --only optim-scale --optimizers Muon,LBFGS`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.optim import swa_utils

from paramdict import ParamDict, optim

from . import _device, _table
from . import optim as small
from ._device import placed
from ._report import OURS, Config, Row, Section, Target, format_bytes, ratio_target
from ._timing import run_fresh
from .maml import _peak, _reset_peak

__all__ = ["measure"]

IN_PLACE = "ParamDict step_"
FOR_LOOP = "torch.optim (for-loop)"
COMPILED = "ParamDict compiled"
FOREACH = "torch.optim (foreach)"
FUSED = "torch.optim (fused)"
IN_PLACE_COMPILED = "ParamDict step_ compiled"
FOREACH_COMPILED = "torch.optim (foreach) compiled"

TARGETED = ("Adam", "AdamW", "SGD momentum", "Adagrad")
"""The optimizers with targets; the rest of the table is measured only."""
CLOSURE = small.TORCH_CLOSURE
LBFGS: dict[str, Any] = {"max_iter": 5, "history_size": 5}
SCHEDULED = "AdamW warm-up + cosine"
"""AdamW whose rate follows a warm-up + cosine `LambdaLR`, stepped every call."""
RECIPE = "nanoGPT recipe"
"""The optimizer work of a nanoGPT step: clip, AdamW groups, EMA, 2 micro-batches."""
MEMORY_STEPS = 20
AVERAGE = "EMA of the weights"
AVERAGED_MODEL = "torch AveragedModel"
OTHERS = ("LBFGS", SCHEDULED, RECIPE, AVERAGE)
"""The rows of this section that are not rows of the table (see the docstring)."""
WIDE = "50 x 400,000"
SMALL = "50 x 16"
"""Where a step is its Python calls (the scheduled row's second size)."""
GPT2 = "GPT-2 small (148 tensors)"


def optimizers() -> tuple[str, ...]:
    """Return every optimizer of this section, the names `--optimizers` takes."""
    return (*_table.names(), *OTHERS)


def torch_paths(name: str) -> list[str]:
    """The paths torch.optim offers for `name`, fastest first: fused, foreach, loop.

    Read from the signature of torch's class (`_table.Entry.takes`), so a new row
    of the table needs no list kept by hand; a reference written in the tests has
    no fused kernel (`_table.Entry.fused`).
    """
    entry = _table.entry(name)
    paths: list[str] = []
    if entry.fused:
        paths.append(FUSED)
    if entry.takes("foreach"):
        paths.append(FOREACH)
    return paths or [FOR_LOOP]


def _gpt2_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """The parameter shapes of GPT-2 small (124M parameters, tied head)."""
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("wte.weight", (50257, 768)),
        ("wpe.weight", (1024, 768)),
    ]
    for i in range(12):
        h = f"h.{i}."
        shapes += [
            (h + "ln_1.weight", (768,)),
            (h + "ln_1.bias", (768,)),
            (h + "attn.c_attn.weight", (768, 2304)),
            (h + "attn.c_attn.bias", (2304,)),
            (h + "attn.c_proj.weight", (768, 768)),
            (h + "attn.c_proj.bias", (768,)),
            (h + "ln_2.weight", (768,)),
            (h + "ln_2.bias", (768,)),
            (h + "mlp.c_fc.weight", (768, 3072)),
            (h + "mlp.c_fc.bias", (3072,)),
            (h + "mlp.c_proj.weight", (3072, 768)),
            (h + "mlp.c_proj.bias", (768,)),
        ]
    return [*shapes, ("ln_f.weight", (768,)), ("ln_f.bias", (768,))]


def shapes(size: str) -> list[tuple[str, tuple[int, ...]]]:
    """The `(key, shape)` list of a size."""
    if size == GPT2:
        return _gpt2_shapes()
    elements = 16 if size == SMALL else 400_000
    return [(f"layers.{i}.weight", (elements,)) for i in range(50)]


def _data(size: str) -> tuple[list[str], list[Tensor], list[Tensor]]:
    gen = torch.Generator().manual_seed(0)
    keys, values, grads = [], [], []
    for key, shape in shapes(size):
        keys.append(key)
        values.append(placed(torch.randn(shape, generator=gen) * 0.02))
        grads.append(placed(torch.randn(shape, generator=gen) * 0.01))
    return keys, values, grads


def _ours(
    name: str, keys: list[str], values: list[Tensor], grads: list[Tensor], mode: str
) -> Callable[[], object]:
    entry = _table.entry(name)
    opt = entry.ours(**entry.options)
    params = ParamDict(zip(keys, [v.clone() for v in values]))
    grad_dict = ParamDict(zip(keys, grads))
    carried: list[Any] = [params, opt.init(params)]
    step = opt.step_ if mode in (IN_PLACE, IN_PLACE_COMPILED) else opt.step
    if mode in (COMPILED, IN_PLACE_COMPILED):
        step = torch.compile(step)

    def run() -> object:
        carried[0], carried[1] = step(carried[0], grad_dict, carried[1])
        return carried[0]

    return run


def _torch(
    name: str, values: list[Tensor], grads: list[Tensor], mode: str
) -> Callable[[], object]:
    entry = _table.entry(name)
    tensors = [v.clone().requires_grad_() for v in values]
    for tensor, grad in zip(tensors, grads):
        tensor.grad = grad
    flag = {"fused": True} if mode == FUSED else {"foreach": True}
    if mode == FOR_LOOP:
        flag = {}  # torch's default path (Muon takes no `foreach`)
    opt = entry.theirs(tensors, **flag, **entry.options)
    step = torch.compile(opt.step) if mode == FOREACH_COMPILED else opt.step

    def run() -> object:
        step()
        return tensors

    return run


def _agree(
    candidates: dict[str, Callable[[], object]],
    reference: str = FUSED,
    steps: int = 3,
    droppable: Sequence[str] = (),
) -> list[str]:
    """`steps` steps of each candidate give the same parameters (float32 rounding).

    Returns the candidates of `droppable` that differ; any other raises.
    """
    results: dict[str, list[Tensor]] = {}
    for mode, step in candidates.items():
        out: object = None
        for _ in range(steps):
            out = step()
        if isinstance(out, ParamDict):
            results[mode] = list(out.values())
        else:
            assert isinstance(out, list)  # torch's candidates return their tensors
            results[mode] = [t for t in out if isinstance(t, Tensor)]
    expected = results[reference]
    differing: list[str] = []
    for mode, values in results.items():
        try:
            for got, want in zip(values, expected, strict=True):
                torch.testing.assert_close(
                    got.detach(), want.detach(), rtol=1e-5, atol=1e-6, msg=mode
                )
        except AssertionError:
            if mode not in droppable:
                raise
            differing.append(mode)
    return differing


def _memory_worker(name: str, size: str, mode: str) -> dict[str, Any]:
    """Run 20 steps of one candidate in this process; return the peak growth.

    Measured from before the candidate is built (its state included, which
    torch.optim makes on the first step), less the candidate's own copy of the
    parameters: the working set over the parameters and gradients.
    """
    keys, values, grads = _data(size)
    gc.collect()
    accelerated = _device.accelerated()
    exact = True if accelerated else _reset_peak()
    before = _device.cuda_peak(reset=True) if accelerated else _peak()
    if mode in (OURS, IN_PLACE):
        step = _ours(name, keys, values, grads, mode)
    else:
        step = _torch(name, values, grads, mode)
    for _ in range(MEMORY_STEPS):
        step()
    peak = _device.cuda_peak() if accelerated else _peak()
    data = sum(v.numel() * v.element_size() for v in values)
    return {"bytes": peak - before - data, "reset": exact}


def memory_candidates(name: str) -> tuple[str, ...]:
    """The candidates of `name`'s peak-memory row: ours, then each torch path."""
    return (IN_PLACE, OURS, *torch_paths(name))


def _memory_row(name: str, size: str, config: Config) -> Row:
    candidates = memory_candidates(name)
    samples: dict[str, list[float]] = {m: [] for m in candidates}
    # The CPU's peak is the process's resident set: a fresh process apiece (the
    # peak varies little). A CUDA device's is the allocator's: exact, here.
    repeats = 1 if _device.accelerated() else min(config.processes, 3)
    for i in range(repeats):
        order = candidates if i % 2 == 0 else candidates[::-1]
        for mode in order:
            if _device.accelerated():
                result = _memory_worker(name, size, mode)
                gc.collect()
            else:
                result = run_fresh(
                    ["-m", "benchmarks.optim_scale", name, size, mode],
                    threads=config.threads,
                    what=f"The memory worker for {mode}",
                )
            samples[mode].append(float(result["bytes"]))
    medians = {m: statistics.median(s) for m, s in samples.items()}
    spreads = {
        m: (max(s) - min(s)) / medians[m] if medians[m] else 0.0
        for m, s in samples.items()
    }
    ordered = {OURS: medians.pop(OURS), **medians}
    return Row(
        f"{name}: 20-step loop, peak memory over the data",
        size,
        ordered,
        {OURS: spreads.pop(OURS), **spreads},
        {OURS: samples.pop(OURS), **samples},
        unit="B",
    )


def measure(config: Config) -> Section:
    """Time and measure each optimizer at model scale (full runs only)."""
    section = Section(
        "optim-scale",
        "Optimizer step at model scale",
        "One step per call on float32 entries, carrying the state forward; "
        "torch.optim steps in place, `step_` too, `ParamDict` returns new tensors.",
    )
    if config.quick:
        section.notes.append("Model-scale sizes are measured in full runs only.")
        return section
    rounds = max(5, min(config.rounds, 15))
    timing = dataclasses.replace(config, rounds=rounds, target=0.05, warmup=2)
    for name in _chosen(_table.names(), config):
        rows, targets, notes = _model_rows(name, timing)
        section.rows += rows
        section.targets += targets
        section.notes += notes
        if _table.entry(name).matrices_only:  # no 50 x 400,000 row: see the docstring
            continue
        mem = _memory_row(name, WIDE, config)
        section.rows.append(mem)
        fastest = torch_paths(name)[0]
        section.targets.append(
            ratio_target(
                f"{name}: `step_` loop peak memory within 1.10x of {fastest}, {WIDE}",
                mem,
                IN_PLACE,
                fastest,
                1.10,
            )
        )
        shown = ", ".join(f"{m} {format_bytes(v)}" for m, v in mem.medians.items())
        section.notes.append(f"{name} peak memory over the data: {shown}.")
    if SCHEDULED in _chosen([SCHEDULED], config):
        row = _scheduled_row(timing)
        small = _scheduled_row(timing, SMALL)
        section.rows += [row, small]
        section.targets += [
            ratio_target(
                f"{SCHEDULED}: `step_` within 1.10x of torch.optim fused with the "
                f"same LambdaLR, {WIDE}",
                row,
                IN_PLACE,
                FUSED,
                1.10,
            ),
            ratio_target(
                f"{SCHEDULED}: `step_` at most torch.optim fused's time with the "
                f"same LambdaLR, {SMALL}",
                small,
                IN_PLACE,
                FUSED,
                1.00,
            ),
        ]
    if RECIPE in _chosen([RECIPE], config):
        row = _recipe_row(timing)
        section.rows.append(row)
        section.targets += [
            ratio_target(
                f"{RECIPE}: `step_` within 1.10x of torch.optim fused with the same "
                f"clip, schedule and EMA, {GPT2}",
                row,
                IN_PLACE,
                FUSED,
                1.10,
            ),
            ratio_target(
                f"{RECIPE}: default `step` within 1.30x of torch.optim's default "
                f"(foreach) with the same clip, schedule and EMA, {GPT2}",
                row,
                OURS,
                FOREACH,
                1.30,
            ),
        ]
    if AVERAGE in _chosen([AVERAGE], config):
        row = _average_row(timing)
        section.rows.append(row)
        section.targets += [
            ratio_target(
                f"{AVERAGE}: `WeightAverage.update_` within 1.05x of "
                f"{AVERAGED_MODEL}'s `update_parameters` (EMA), {GPT2}",
                row,
                IN_PLACE,
                AVERAGED_MODEL,
                1.05,
            ),
            ratio_target(
                f"{AVERAGE}: `WeightAverage.update` within 1.30x of "
                f"{AVERAGED_MODEL}'s `update_parameters` (EMA), {GPT2}",
                row,
                OURS,
                AVERAGED_MODEL,
                1.30,
            ),
        ]
    if "LBFGS" in _chosen(["LBFGS"], config):
        lbfgs = _lbfgs_rows(config)
        section.rows += lbfgs
        section.targets += [
            ratio_target(
                f"{row.case}: within 1.10x of {CLOSURE}, {WIDE}",
                row,
                OURS,
                CLOSURE,
                1.10,
            )
            for row in lbfgs
        ]
    return section


def _warmup_cosine(epoch: Any, warmup: int = 100, total: int = 10_000) -> float:
    """The usual schedule's factor: linear warm-up, then a half cosine to zero."""
    e = float(epoch)
    if e < warmup:
        return (e + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(e - warmup, total) / total))


def _scheduled_row(timing: Config, size: str = WIDE) -> Row:
    """AdamW with warm-up + cosine: ours against torch.optim + `LambdaLR`."""
    keys, values, grads = _data(size)
    kwargs: dict[str, Any] = {"weight_decay": 0.01}
    candidates: dict[str, Callable[[], object]] = {}
    with torch.inference_mode(False):
        for mode in (OURS, IN_PLACE):
            schedule = optim.LambdaLR(base_lr=1e-3, lr_lambda=_warmup_cosine)
            opt = optim.AdamW(lr=schedule, **kwargs)
            params = ParamDict(zip(keys, [v.clone() for v in values]))
            candidates[mode] = _scheduled_ours(
                opt, params, ParamDict(zip(keys, grads)), mode
            )
        for mode in (FOREACH, FUSED):
            tensors = [v.clone().requires_grad_() for v in values]
            for tensor, grad in zip(tensors, grads):
                tensor.grad = grad
            flag: dict[str, Any] = (
                {"fused": True} if mode == FUSED else {"foreach": True}
            )
            theirs = torch.optim.AdamW(tensors, lr=1e-3, **flag, **kwargs)
            sched = torch.optim.lr_scheduler.LambdaLR(theirs, _warmup_cosine)
            candidates[mode] = _scheduled_torch(theirs, sched, tensors)
        _agree(candidates)
        return Row.from_timings(f"{SCHEDULED} step", size, timing.time(candidates))


def _scheduled_ours(
    opt: optim.Optimizer[Any], params: ParamDict, grads: ParamDict, mode: str
) -> Callable[[], object]:
    carried: list[Any] = [params, opt.init(params)]
    step = opt.step_ if mode == IN_PLACE else opt.step

    def run() -> object:
        carried[0], carried[1] = step(carried[0], grads, carried[1])
        return carried[0]

    return run


def _scheduled_torch(
    opt: torch.optim.Optimizer, sched: Any, tensors: list[Tensor]
) -> Callable[[], object]:
    def run() -> object:
        opt.step()
        sched.step()
        return tensors

    return run


RECIPE_ADAMW: dict[str, Any] = {"betas": (0.9, 0.95), "eps": 1e-8}
RECIPE_LR = 6e-4
RECIPE_DECAY = 0.1
RECIPE_EMA = 0.999
RECIPE_MICRO = 2


def _recipe_row(timing: Config, size: str = GPT2) -> Row:
    """One optimizer step of nanoGPT's recipe, its 2 micro-batches' gradients given.

    Each call takes one optimizer step: 2 micro-batches' gradients accumulated,
    clipped to a global norm of 1.0, AdamW in two groups (weight decay 0.1 on the
    entries of 2 or more dimensions, none on the others) at a warm-up + cosine
    rate, then an EMA (decay 0.999) of the parameters, each side written as its
    docs teach. Ours: `MultiSteps(ClipGradNorm(ParamGroups(...)), every_k=2)`
    called once per micro-batch and `WeightAverage.ema(0.999)`, with `step` and
    `update` or with `step_` and `update_`. torch's: one accumulating op per
    micro-batch into `.grad` (a copy, then an add: what backward does when it
    writes and then accumulates the micro-batch gradients, each scaled by 1/2 as
    the loss is), `clip_grad_norm_(foreach=True)`, `AdamW` (`fused=True`, and
    torch's default path `foreach=True`), `LambdaLR`, and
    `AveragedModel(multi_avg_fn=get_ema_multi_avg_fn(0.999))`.
    """
    keys, values, grads = _data(size)
    gen = torch.Generator().manual_seed(1)
    second = [placed(torch.randn(g.shape, generator=gen) * 0.01) for g in grads]
    micro = [ParamDict(zip(keys, grads)), ParamDict(zip(keys, second))]
    scaled = [[g / RECIPE_MICRO for g in grads], [g / RECIPE_MICRO for g in second]]
    candidates: dict[str, Callable[[], object]] = {}
    with torch.inference_mode(False):
        for mode in (OURS, IN_PLACE):
            params = ParamDict(zip(keys, [v.clone() for v in values]))
            candidates[mode] = _recipe_ours(params, micro, mode)
        del micro
        candidates[FUSED] = _recipe_torch(values, scaled, fused=True)
        candidates[FOREACH] = _recipe_torch(values, scaled, fused=False)
        del scaled
        _agree(candidates)
        return Row.from_timings(
            f"{RECIPE} step (clip, AdamW groups, warm-up + cosine, "
            f"{RECIPE_MICRO} micro-batches, EMA)",
            size,
            timing.time(candidates),
        )


def _recipe_optimizer() -> optim.Optimizer[Any]:
    def lr() -> optim.LambdaLR:
        return optim.LambdaLR(base_lr=RECIPE_LR, lr_lambda=_warmup_cosine)

    def decayed(key: str, value: Tensor) -> bool:
        return value.dim() >= 2

    groups = optim.ParamGroups(
        {decayed: optim.AdamW(lr=lr(), weight_decay=RECIPE_DECAY, **RECIPE_ADAMW)},
        default=optim.AdamW(lr=lr(), weight_decay=0.0, **RECIPE_ADAMW),
    )
    inner = optim.ClipGradNorm(groups, max_norm=1.0)
    return optim.MultiSteps(inner, every_k=RECIPE_MICRO)


def _recipe_ours(
    params: ParamDict, micro: list[ParamDict], mode: str
) -> Callable[[], object]:
    opt = _recipe_optimizer()
    ema = optim.WeightAverage.ema(RECIPE_EMA)
    carried: list[Any] = [params, opt.init(params), ema.init(params)]
    if mode == IN_PLACE:

        def run_() -> object:
            for grads in micro:
                carried[0], carried[1] = opt.step_(carried[0], grads, carried[1])
            ema.update_(carried[2], carried[0])
            return carried[0]

        return run_

    def run() -> object:
        for grads in micro:
            carried[0], carried[1] = opt.step(carried[0], grads, carried[1])
        carried[2] = ema.update(carried[2], carried[0])
        return carried[0]

    return run


class _Holder(nn.Module):
    """A module holding the tensors as parameters, for `AveragedModel`."""

    def __init__(self, tensors: list[Tensor]) -> None:
        super().__init__()
        self.values = nn.ParameterList([nn.Parameter(t) for t in tensors])


def _recipe_torch(
    values: list[Tensor], scaled: list[list[Tensor]], *, fused: bool
) -> Callable[[], object]:
    holder = _Holder([v.clone() for v in values])
    tensors = list(holder.values)
    for tensor in tensors:
        tensor.grad = torch.zeros_like(tensor)
    decay = [t for t in tensors if t.dim() >= 2]
    no_decay = [t for t in tensors if t.dim() < 2]
    path: dict[str, Any] = {"fused": True} if fused else {"foreach": True}
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": RECIPE_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=RECIPE_LR,
        **path,
        **RECIPE_ADAMW,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _warmup_cosine)
    grads = [cast(Tensor, t.grad) for t in tensors]
    average = swa_utils.AveragedModel(
        holder,
        multi_avg_fn=swa_utils.get_ema_multi_avg_fn(RECIPE_EMA),  # type: ignore[no-untyped-call]  # untyped in torch
    )

    def run() -> object:
        torch._foreach_copy_(grads, scaled[0])
        for more in scaled[1:]:
            torch._foreach_add_(grads, more)
        torch.nn.utils.clip_grad_norm_(tensors, 1.0, foreach=True)
        opt.step()
        sched.step()
        average.update_parameters(holder)
        return tensors

    return run


def _average_row(timing: Config, size: str = GPT2) -> Row:
    """One EMA update (decay 0.999) of the parameters, each side as its docs teach.

    Ours: `WeightAverage.ema(0.999)`, `update` (a new average) and `update_` (in
    place). torch's: `AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))`
    and its `update_parameters(model)`. The parameters move a little between
    calls (as training moves them), the same on both sides.
    """
    keys, values, _ = _data(size)
    ema = optim.WeightAverage.ema(RECIPE_EMA)
    params = ParamDict(zip(keys, [v.clone() for v in values]))
    carried: list[Any] = [ema.init(params)]

    def ours() -> object:
        carried[0] = ema.update(carried[0], params)
        return carried[0]

    held = ema.init(params)

    def ours_() -> object:
        return ema.update_(held, params)

    holder = _Holder([v.clone() for v in values])
    average = swa_utils.AveragedModel(
        holder,
        multi_avg_fn=swa_utils.get_ema_multi_avg_fn(RECIPE_EMA),  # type: ignore[no-untyped-call]  # untyped in torch
    )

    def theirs() -> object:
        average.update_parameters(holder)
        return average

    candidates: dict[str, Callable[[], object]] = {
        OURS: ours,
        IN_PLACE: ours_,
        AVERAGED_MODEL: theirs,
    }
    with torch.inference_mode(False):
        timings = timing.time(candidates)
    return Row.from_timings(f"{AVERAGE} update (decay {RECIPE_EMA})", size, timings)


def _chosen(names: Sequence[str], config: Config) -> list[str]:
    """The optimizers of `names` that `--optimizers` picked (all by default)."""
    return [n for n in names if not config.optimizers or n in config.optimizers]


def _matrices(
    data: tuple[list[str], list[Tensor], list[Tensor]],
) -> tuple[list[str], list[Tensor], list[Tensor]]:
    """Keep the 2-D entries of `(keys, values, grads)` (Muon's)."""
    kept = [i for i, v in enumerate(data[1]) if v.dim() == 2]
    keys, values, grads = data
    return [keys[i] for i in kept], [values[i] for i in kept], [grads[i] for i in kept]


def model_candidates(name: str, size: str, *, compiled: bool = True) -> list[str]:
    """The candidates timed for `name` at `size`.

    Ours in place and out of place, then torch's paths (`torch_paths`); at
    50 x 400,000 also (unless not `compiled`: `--no-compile`) `torch.compile`
    of our `step_` and of torch's foreach step (not for the matrix-only
    optimizers, which run at GPT-2 small only), and for the optimizers of
    `TARGETED` `torch.compile(opt.step)`.
    """
    names = [OURS, IN_PLACE, *torch_paths(name)]
    if compiled and size == WIDE and not _table.entry(name).matrices_only:
        if name in TARGETED:
            names.append(COMPILED)
        names += [IN_PLACE_COMPILED, FOREACH_COMPILED]
    return names


def _model_targets(name: str, row: Row, *, compiled: bool = True) -> list[Target]:
    """The issue's targets on one of `name`'s timed rows (see the docstring)."""
    fastest = torch_paths(name)[0]
    targets = [
        ratio_target(
            f"{name}: `step_` within 1.10x of {fastest}, {row.size}",
            row,
            IN_PLACE,
            fastest,
            1.10,
        ),
        ratio_target(
            f"{name}: default `step` within 1.30x of {fastest}, {row.size}",
            row,
            OURS,
            fastest,
            1.30,
        ),
    ]
    # a dropped one reads "not measured"
    planned = model_candidates(name, row.size, compiled=compiled)
    if IN_PLACE_COMPILED in planned:
        targets.append(
            ratio_target(
                f"{name}: `torch.compile(opt.step_)` at least as fast as "
                f"{FOREACH_COMPILED}, {row.size}",
                row,
                IN_PLACE_COMPILED,
                FOREACH_COMPILED,
                1.0,
            )
        )
    if COMPILED in planned:
        targets.append(
            ratio_target(
                f"{name}: `torch.compile(opt.step)` within 1.3x of {fastest}, "
                f"{row.size}",
                row,
                COMPILED,
                fastest,
                1.3,
            )
        )
    return targets


def _model_rows(name: str, timing: Config) -> tuple[list[Row], list[Target], list[str]]:
    """Time an optimizer at each size it applies to; its targets and notes beside."""
    rows: list[Row] = []
    targets: list[Target] = []
    notes: list[str] = []
    muon = _table.entry(name).matrices_only  # Muon: GPT-2 small's matrices only
    if muon:  # about 12 s a step on one thread
        timing = dataclasses.replace(timing, rounds=min(timing.rounds, 5), warmup=1)
    for size in (GPT2,) if muon else (WIDE, GPT2):
        data = _data(size)
        if muon:
            data = _matrices(data)
        keys, values, grads = data
        theirs = torch_paths(name)[0]
        with torch.inference_mode(False):
            candidates: dict[str, Callable[[], object]] = {}
            for mode in model_candidates(name, size, compiled=timing.compile):
                if mode in (OURS, IN_PLACE, COMPILED, IN_PLACE_COMPILED):
                    candidates[mode] = _ours(name, keys, values, grads, mode)
                else:
                    candidates[mode] = _torch(name, values, grads, mode)
            compiled = (COMPILED, IN_PLACE_COMPILED, FOREACH_COMPILED)
            for mode in _agree(candidates, reference=theirs, droppable=compiled):
                del candidates[mode]  # its target reads "not measured"
                notes.append(
                    f"{name}: {mode} not timed, its steps differ from {theirs}'s."
                )
            label = f"GPT-2 small ({len(keys)} matrices)" if muon else size
            row = Row.from_timings(f"{name} step", label, timing.time(candidates))
        rows.append(row)
        targets += _model_targets(name, row, compiled=timing.compile)
        del candidates
        gc.collect()
    return rows, targets, notes


def _lbfgs_rows(config: Config) -> list[Row]:
    """Time one LBFGS step from a fixed start at 50 x 400,000, both line searches."""
    keys = [key for key, _ in shapes(WIDE)]
    elements = shapes(WIDE)[0][1][0]
    timing = dataclasses.replace(
        config, rounds=min(config.rounds, 5), warmup=1, target=0.05
    )
    rows = []
    for line_search_fn in (None, "strong_wolfe"):
        with torch.inference_mode(False):
            candidates = small._lbfgs_candidates(keys, elements, line_search_fn, LBFGS)
            _agree(candidates, reference=CLOSURE, steps=2)  # each starts over
            rows.append(
                Row.from_timings(
                    f"LBFGS step, line_search_fn={line_search_fn!r}",
                    WIDE,
                    timing.time(candidates),
                )
            )
        del candidates
        gc.collect()
    return rows


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=_table.names())
    parser.add_argument("size", choices=[WIDE, GPT2])
    parser.add_argument("mode", choices=[IN_PLACE, OURS, FUSED, FOREACH, FOR_LOOP])
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(json.dumps(_memory_worker(args.name, args.size, args.mode)))


if __name__ == "__main__":
    _main()
