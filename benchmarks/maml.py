"""One MAML meta-iteration, written five ways, timed and measured for peak memory.

The meta-iteration is MAML's meta-gradient on sinusoid regression: for each of 25
tasks, one inner SGD step (lr 0.01) on K = 10 support points of the MLP 1-40-40-1,
kept in the graph (second order), then the MSE on K = 10 query points; the mean
query loss is differentiated with respect to the meta-parameters. The tasks run in
a Python loop, as each library's own MAML example writes them. Candidates:

- `ParamDict`: `fast = params - lr * params.grad(loss, create_graph=True)`, the
  model run with `params.call(model, x)`, the meta-gradient from `params.grad`;
- `ParamDict, fused sub`: the same with the fused step
  `params.sub(params.grad(loss, create_graph=True), alpha=lr)`;
- `plain dicts`: the same with `dict`s, `torch.func.functional_call`,
  `torch.autograd.grad` on a tuple and a dict comprehension for the step;
- `torchopt (MetaSGD)`: `torchopt.MetaSGD` stepping the module, with
  `extract_state_dict`/`recover_state_dict` between tasks, then `.backward()`;
- `torchopt (functional)`: `torchopt.sgd` as a gradient transformation and
  `torchopt.apply_updates` on plain dicts;
- `higher`: `higher.innerloop_ctx` with a differentiable SGD, a `.backward()` per
  task.

Before anything is timed, every candidate's meta-gradient is computed in float64 and
must equal ParamDict's (`torch.testing.assert_close`), so all of them do the same
computation. Timing is in float32. Peak memory (both ParamDict forms and plain
dicts) is measured in fresh processes: `python -m benchmarks.maml --peak-memory NAME`
prints the growth of the resident set's high-water mark over one meta-iteration.

Part of `python -m benchmarks` (run only this with `--only maml,memory`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from paramdict import ParamDict

from . import _peers
from ._agree import check_agreement
from ._report import OURS, Config, Row, Section, format_bytes, ratio_target
from ._sinusoid import INNER_LR, TASKS, Task, make_model, sample_tasks
from ._timing import run_fresh

__all__ = ["VARIANTS", "measure", "measure_memory"]

MetaGradient = Callable[[], dict[str, Tensor]]
Variant = Callable[[nn.Module, list[Task]], MetaGradient]
PLAIN = "plain dicts"
FUSED = "ParamDict, fused sub"


def paramdict_variant(model: nn.Module, tasks: list[Task]) -> MetaGradient:
    """MAML written with ParamDict."""
    params = ParamDict.from_module(model)

    def meta_gradient() -> dict[str, Tensor]:
        losses = []
        for x, y, x_query, y_query in tasks:
            loss = F.mse_loss(params.call(model, x), y)
            fast = params - INNER_LR * params.grad(loss, create_graph=True)
            losses.append(F.mse_loss(fast.call(model, x_query), y_query))
        return params.grad(torch.stack(losses).mean())

    return meta_gradient


def paramdict_fused_variant(model: nn.Module, tasks: list[Task]) -> MetaGradient:
    """MAML written with ParamDict, the inner step as the fused `sub(alpha=)`."""
    params = ParamDict.from_module(model)

    def meta_gradient() -> dict[str, Tensor]:
        losses = []
        for x, y, x_query, y_query in tasks:
            loss = F.mse_loss(params.call(model, x), y)
            fast = params.sub(params.grad(loss, create_graph=True), alpha=INNER_LR)
            losses.append(F.mse_loss(fast.call(model, x_query), y_query))
        return params.grad(torch.stack(losses).mean())

    return meta_gradient


def plain_variant(model: nn.Module, tasks: list[Task]) -> MetaGradient:
    """MAML written with plain dicts and `torch.func.functional_call`."""
    params: dict[str, Tensor] = dict(model.named_parameters())
    call = torch.func.functional_call

    def meta_gradient() -> dict[str, Tensor]:
        losses = []
        for x, y, x_query, y_query in tasks:
            loss = F.mse_loss(call(model, params, (x,)), y)
            grads = torch.autograd.grad(loss, tuple(params.values()), create_graph=True)
            fast = {k: v - INNER_LR * g for (k, v), g in zip(params.items(), grads)}
            losses.append(F.mse_loss(call(model, fast, (x_query,)), y_query))
        meta = torch.autograd.grad(torch.stack(losses).mean(), tuple(params.values()))
        return dict(zip(params, meta))

    return meta_gradient


def torchopt_metasgd_variant(model: nn.Module, tasks: list[Task]) -> MetaGradient:
    """MAML written with `torchopt.MetaSGD` on the module, as torchopt's examples."""
    torchopt = _peers.load("torchopt")
    inner = torchopt.MetaSGD(model, lr=INNER_LR)
    named = dict(model.named_parameters())

    def meta_gradient() -> dict[str, Tensor]:
        model.zero_grad(set_to_none=True)
        start = torchopt.extract_state_dict(model)
        losses = []
        for x, y, x_query, y_query in tasks:
            inner.step(F.mse_loss(model(x), y))
            losses.append(F.mse_loss(model(x_query), y_query))
            torchopt.recover_state_dict(model, start)
        torch.autograd.backward(torch.stack(losses).mean())
        return {k: v.grad for k, v in named.items() if v.grad is not None}

    return meta_gradient


def torchopt_functional_variant(model: nn.Module, tasks: list[Task]) -> MetaGradient:
    """MAML written with torchopt's functional SGD on plain dicts."""
    torchopt = _peers.load("torchopt")
    params: dict[str, Tensor] = dict(model.named_parameters())
    inner = torchopt.sgd(lr=INNER_LR)
    state = inner.init(params)
    call = torch.func.functional_call

    def meta_gradient() -> dict[str, Tensor]:
        losses = []
        for x, y, x_query, y_query in tasks:
            loss = F.mse_loss(call(model, params, (x,)), y)
            grads = torch.autograd.grad(loss, tuple(params.values()), create_graph=True)
            updates, _ = inner.update(dict(zip(params, grads)), state, inplace=False)
            fast = torchopt.apply_updates(params, updates, inplace=False)
            losses.append(F.mse_loss(call(model, fast, (x_query,)), y_query))
        meta = torch.autograd.grad(torch.stack(losses).mean(), tuple(params.values()))
        return dict(zip(params, meta))

    return meta_gradient


def higher_variant(
    model: nn.Module,
    tasks: Sequence[tuple[Tensor, Tensor, Tensor, Tensor]],
    loss: Callable[[Tensor, Tensor], Tensor] = F.mse_loss,
    inner_lr: float = INNER_LR,
) -> MetaGradient:
    """MAML written with `higher.innerloop_ctx`, as higher's examples (second order).

    `tasks` are `(x, y, x_query, y_query)`; `loss` scores a prediction and
    `inner_lr` is the inner step (the CNN case passes its own).
    """
    higher = _peers.load("higher")
    inner = torch.optim.SGD(model.parameters(), lr=inner_lr)
    named = dict(model.named_parameters())

    def meta_gradient() -> dict[str, Tensor]:
        model.zero_grad(set_to_none=True)
        for x, y, x_query, y_query in tasks:
            with higher.innerloop_ctx(model, inner, copy_initial_weights=False) as (
                fmodel,
                diffopt,
            ):
                diffopt.step(loss(fmodel(x), y))
                query = loss(fmodel(x_query), y_query)
                torch.autograd.backward(query / len(tasks))
        return {k: v.grad for k, v in named.items() if v.grad is not None}

    return meta_gradient


VARIANTS: dict[str, tuple[Variant, str | None]] = {
    OURS: (paramdict_variant, None),
    FUSED: (paramdict_fused_variant, None),
    PLAIN: (plain_variant, None),
    "torchopt (MetaSGD)": (torchopt_metasgd_variant, "torchopt"),
    "torchopt (functional)": (torchopt_functional_variant, "torchopt"),
    "higher": (higher_variant, "higher"),
}
"""Candidate name to its builder and the peer it needs (`None`: none)."""


def _available(section: Section) -> dict[str, Variant]:
    found = {}
    missing = set()
    for name, (build, peer) in VARIANTS.items():
        if peer is None or _peers.load(peer) is not None:
            found[name] = build
        else:
            missing.add(peer)
    for peer in sorted(missing):
        section.notes.append(_peers.skipped(peer, what=f"{peer}'s MAML"))
    return found


def _build(
    variants: dict[str, Variant], dtype: torch.dtype, tasks: int = TASKS
) -> dict[str, MetaGradient]:
    # Each candidate gets its own model (same initial weights): two of them write
    # `.grad` or swap tensors into the module while they run.
    data = sample_tasks(tasks, dtype=dtype)
    return {
        name: build(make_model(dtype=dtype), data) for name, build in variants.items()
    }


def measure(config: Config) -> Section:
    """Check that the candidates agree in float64, then time them in float32."""
    section = Section(
        "maml",
        "MAML meta-iteration",
        f"The meta-gradient of one meta-batch: {TASKS} sinusoid tasks, one inner SGD "
        f"step (lr {INNER_LR}, second order) on K = 10 points, the MLP 1-40-40-1, "
        "float32. Every candidate's float64 meta-gradient equals ParamDict's.",
    )
    variants = _available(section)
    exact = _build(variants, torch.float64)
    keys = list(dict(make_model().named_parameters()))
    check_agreement({name: fn() for name, fn in exact.items()}, keys, reference=OURS)
    candidates = _build(variants, torch.float32)
    row = Row.from_timings(
        "meta-gradient", f"{TASKS} tasks", config.time(dict(candidates.items()))
    )
    section.rows.append(row)
    section.targets.append(
        ratio_target(
            "MAML meta-iteration within 1.05x of plain dicts",
            row,
            OURS,
            PLAIN,
            1.05,
        )
    )
    for peer in ("torchopt (MetaSGD)", "torchopt (functional)", "higher"):
        section.targets.append(
            ratio_target(
                f"MAML meta-iteration faster than {peer}",
                row if peer in row.medians else None,
                peer,
                OURS,
                1.0,
                at_least=True,
            )
        )
    return section


# ------------------------------------------------------------------- peak memory


def _reset_peak() -> bool:
    """Reset the resident set's high-water mark to the current size, if possible.

    Linux resets it when 5 is written to `/proc/self/clear_refs`. Returns whether
    that worked; without it, `_peak` is the lifetime peak, and a growth measured
    from it may be too low.
    """
    try:
        with Path("/proc/self/clear_refs").open("w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


def _peak() -> int:
    """Return the resident set's high-water mark, in bytes."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _memory_worker(name: str) -> dict[str, Any]:
    """Run one meta-iteration of `name` in this process; return the peak growth."""
    build, _ = VARIANTS[name]
    warm = _build({name: build}, torch.float32, tasks=1)[name]
    fn = _build({name: build}, torch.float32)[name]
    warm()  # first calls initialize lazily (dispatcher tables, autograd engine)
    gc.collect()
    exact = _reset_peak()
    before = _peak()
    grads = fn()
    after = _peak()
    del grads
    return {"name": name, "bytes": after - before, "reset": exact}


def _run_worker(name: str, threads: int) -> dict[str, Any]:
    result: dict[str, Any] = run_fresh(
        ["-m", "benchmarks.maml", "--peak-memory", name],
        threads=threads,
        what=f"The memory worker for {name}",
    )
    return result


def measure_memory(config: Config) -> Section:
    """Measure the peak-memory growth of one meta-iteration in fresh processes."""
    section = Section(
        "memory",
        "MAML meta-iteration: peak memory",
        "Growth of the resident set's high-water mark over one float32 "
        "meta-iteration (as timed above), each sample in a fresh process after a "
        "one-task warm-up; processes of the candidates alternate; medians.",
    )
    names = (OURS, PLAIN) if config.quick else (OURS, FUSED, PLAIN)
    samples: dict[str, list[float]] = {name: [] for name in names}
    exact = True
    for i in range(config.processes):
        for name in names if i % 2 == 0 else names[::-1]:
            result = _run_worker(name, config.threads)
            samples[name].append(float(result["bytes"]))
            exact = exact and bool(result["reset"])
    medians = {name: statistics.median(s) for name, s in samples.items()}
    spreads = {
        name: (max(s) - min(s)) / medians[name] if medians[name] else 0.0
        for name, s in samples.items()
    }
    row = Row(
        "peak memory growth",
        f"{TASKS} tasks",
        medians,
        spreads,
        samples,
        unit="B",
    )
    section.rows.append(row)
    if not exact:
        section.notes.append(
            "The high-water mark could not be reset on this system; the growth is "
            "measured against the process's lifetime peak and may be too low."
        )
    shown = ", ".join(f"{n} {format_bytes(m)}" for n, m in medians.items())
    section.notes.append(
        f"{config.processes} processes per candidate; the spread is (max - min) / "
        f"median. Medians: {shown}."
    )
    section.targets.append(
        ratio_target(
            "MAML peak memory within 1.05x of plain dicts",
            row,
            OURS,
            PLAIN,
            1.05,
        )
    )
    return section


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--peak-memory",
        choices=[OURS, FUSED, PLAIN],
        required=True,
        help="run one meta-iteration of this candidate and print its peak growth",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(json.dumps(_memory_worker(args.peak_memory)))


if __name__ == "__main__":
    _main()
