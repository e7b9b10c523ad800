"""MAML on the Omniglot-shaped CNN with BatchNorm: the task loop against vmap.

One meta-iteration on the 4-conv network of `_omniglot` (Conv-BatchNorm-ReLU-MaxPool
x4, BatchNorm with `track_running_stats=False`, 64 channels, 28 x 28 images), 5-way
1-shot tasks with 5 query images per class, one inner SGD step (lr 0.4) per task,
second order and first order. Candidates:

- `ParamDict`: the task loop, `params.grad(loss, create_graph=True)`, `params - lr *
  grads` and `params.call(model, x)`;
- `ParamDict, vmap`: all tasks at once, `torch.func.vmap(torch.func.grad(loss))` with
  `params.call` inside; at second order `call` refuses it (torch's vmap rule for the
  batch-norm backward would make that meta-gradient wrong), which the report says;
- `plain dicts` and `plain dicts, vmap`: the same with `dict`s,
  `torch.func.functional_call` and `torch.autograd.grad`;
- `torchopt (MetaSGD)`, `torchopt (functional)` and `higher`, written as in
  `benchmarks.maml` (second order; torchopt's functional form also first order).

Before anything is timed, every candidate's float64 meta-gradient is compared with
ParamDict's loop (`torch.testing.assert_close`). A loop candidate that differs stops
the run; a vmap candidate that differs is reported with its error and not timed (at
second order, plain dicts under vmap are silently wrong). Timing is in float32, on
fewer rounds than the small cases (a meta-iteration takes a fraction of a second).
Peak memory is measured in fresh processes, as in `benchmarks.maml`:
`python -m benchmarks.maml_cnn --peak-memory NAME --order second` prints one sample.

Part of `python -m benchmarks` (run only this with `--only cnn,cnn-memory`).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from paramdict import ParamDict

from . import _peers
from ._agree import check_agreement
from ._omniglot import CHANNELS, INNER_LR, TASKS, Task, make_model, sample_tasks
from ._omniglot import stacked as stack_tasks
from ._report import OURS, Config, Row, Section, format_bytes, ratio_target
from ._timing import run_fresh
from .maml import _peak, _reset_peak, higher_variant

__all__ = ["VARIANTS", "measure", "measure_memory"]

Order = Literal["second", "first"]
MetaGradient = Callable[[], dict[str, Tensor]]
Variant = Callable[[nn.Module, list[Task], bool], MetaGradient]
PLAIN = "plain dicts"
OURS_VMAP = "ParamDict, vmap"
PLAIN_VMAP = "plain dicts, vmap"
QUICK_CHANNELS = 8
QUICK_TASKS = 2
ROUNDS = 41
"""At most this many timing rounds (a sample is one meta-iteration)."""
LIMIT = 1.02
"""The issue's bound on the loop form's cost over plain dicts."""


def _cross_entropy(params: ParamDict, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(params.call(model, x), y)


def paramdict_loop(
    model: nn.Module, tasks: list[Task], first_order: bool
) -> MetaGradient:
    """MAML written with ParamDict, one task after the other."""
    params = ParamDict.from_module(model)

    def meta_gradient() -> dict[str, Tensor]:
        losses = []
        for x, y, x_query, y_query in tasks:
            loss = _cross_entropy(params, model, x, y)
            fast = params - INNER_LR * params.grad(loss, create_graph=not first_order)
            losses.append(_cross_entropy(fast, model, x_query, y_query))
        return params.grad(torch.stack(losses).mean())

    return meta_gradient


def paramdict_vmap(
    model: nn.Module, tasks: list[Task], first_order: bool
) -> MetaGradient:
    """MAML written with ParamDict, the tasks batched with `torch.func.vmap`."""
    params = ParamDict.from_module(model)
    x, y, x_query, y_query = stack_tasks(tasks)
    inner = torch.func.vmap(torch.func.grad(_cross_entropy), in_dims=(None, None, 0, 0))
    outer = torch.func.vmap(_cross_entropy, in_dims=(0, None, 0, 0))

    def meta_gradient() -> dict[str, Tensor]:
        with torch.set_grad_enabled(not first_order):
            grads = inner(params, model, x, y)
        fast = params - INNER_LR * grads
        return params.grad(outer(fast, model, x_query, y_query).mean())

    return meta_gradient


def plain_loop(model: nn.Module, tasks: list[Task], first_order: bool) -> MetaGradient:
    """MAML written with plain dicts and `torch.func.functional_call`."""
    params: dict[str, Tensor] = dict(model.named_parameters())
    call = torch.func.functional_call

    def meta_gradient() -> dict[str, Tensor]:
        losses = []
        for x, y, x_query, y_query in tasks:
            loss = F.cross_entropy(call(model, params, (x,)), y)
            grads = torch.autograd.grad(
                loss, tuple(params.values()), create_graph=not first_order
            )
            fast = {k: v - INNER_LR * g for (k, v), g in zip(params.items(), grads)}
            losses.append(F.cross_entropy(call(model, fast, (x_query,)), y_query))
        meta = torch.autograd.grad(torch.stack(losses).mean(), tuple(params.values()))
        return dict(zip(params, meta))

    return meta_gradient


def plain_vmap(model: nn.Module, tasks: list[Task], first_order: bool) -> MetaGradient:
    """MAML written with plain dicts, the tasks batched with `torch.func.vmap`."""
    params: dict[str, Tensor] = dict(model.named_parameters())
    x, y, x_query, y_query = stack_tasks(tasks)

    def loss(p: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(torch.func.functional_call(model, p, (x,)), y)

    inner = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    outer = torch.func.vmap(loss)

    def meta_gradient() -> dict[str, Tensor]:
        with torch.set_grad_enabled(not first_order):
            grads = inner(params, x, y)
        fast = {k: v - INNER_LR * grads[k] for k, v in params.items()}
        total = outer(fast, x_query, y_query).mean()
        meta = torch.autograd.grad(total, tuple(params.values()))
        return dict(zip(params, meta))

    return meta_gradient


def torchopt_metasgd(
    model: nn.Module, tasks: list[Task], first_order: bool
) -> MetaGradient:
    """MAML written with `torchopt.MetaSGD` on the module (second order)."""
    torchopt = _peers.load("torchopt")
    inner = torchopt.MetaSGD(model, lr=INNER_LR)
    named = dict(model.named_parameters())

    def meta_gradient() -> dict[str, Tensor]:
        model.zero_grad(set_to_none=True)
        start = torchopt.extract_state_dict(model)
        losses = []
        for x, y, x_query, y_query in tasks:
            inner.step(F.cross_entropy(model(x), y))
            losses.append(F.cross_entropy(model(x_query), y_query))
            torchopt.recover_state_dict(model, start)
        torch.autograd.backward(torch.stack(losses).mean())
        return {k: v.grad for k, v in named.items() if v.grad is not None}

    return meta_gradient


def torchopt_functional(
    model: nn.Module, tasks: list[Task], first_order: bool
) -> MetaGradient:
    """MAML written with torchopt's functional SGD on plain dicts."""
    torchopt = _peers.load("torchopt")
    params: dict[str, Tensor] = dict(model.named_parameters())
    inner = torchopt.sgd(lr=INNER_LR)
    state = inner.init(params)
    call = torch.func.functional_call

    def meta_gradient() -> dict[str, Tensor]:
        losses = []
        for x, y, x_query, y_query in tasks:
            loss = F.cross_entropy(call(model, params, (x,)), y)
            grads = torch.autograd.grad(
                loss, tuple(params.values()), create_graph=not first_order
            )
            updates, _ = inner.update(dict(zip(params, grads)), state, inplace=False)
            fast = torchopt.apply_updates(params, updates, inplace=False)
            losses.append(F.cross_entropy(call(model, fast, (x_query,)), y_query))
        meta = torch.autograd.grad(torch.stack(losses).mean(), tuple(params.values()))
        return dict(zip(params, meta))

    return meta_gradient


def higher_loop(model: nn.Module, tasks: list[Task], first_order: bool) -> MetaGradient:
    """MAML written with `higher.innerloop_ctx` (second order only)."""
    return higher_variant(model, tasks, F.cross_entropy, INNER_LR)


VARIANTS: dict[str, tuple[Variant, str | None, tuple[Order, ...]]] = {
    OURS: (paramdict_loop, None, ("second", "first")),
    OURS_VMAP: (paramdict_vmap, None, ("second", "first")),
    PLAIN: (plain_loop, None, ("second", "first")),
    PLAIN_VMAP: (plain_vmap, None, ("second", "first")),
    "torchopt (MetaSGD)": (torchopt_metasgd, "torchopt", ("second",)),
    "torchopt (functional)": (torchopt_functional, "torchopt", ("second", "first")),
    "higher": (higher_loop, "higher", ("second",)),
}
"""Candidate name to its builder, the peer it needs and the orders it runs."""

BATCHED = (OURS_VMAP, PLAIN_VMAP)
"""The vmap candidates: refused or differing is reported, not fatal."""


@dataclasses.dataclass(frozen=True)
class Size:
    """The network's width and the meta-batch."""

    channels: int
    tasks: int

    @property
    def label(self) -> str:
        """The size in words, for the tables."""
        return f"{self.tasks} tasks, {self.channels} channels"


def _size(quick: bool) -> Size:
    return Size(QUICK_CHANNELS, QUICK_TASKS) if quick else Size(CHANNELS, TASKS)


def _build(
    names: Sequence[str], order: Order, size: Size, dtype: torch.dtype
) -> dict[str, MetaGradient]:
    # Each candidate gets its own model (same initial weights): some write `.grad`
    # or swap tensors into the module while they run.
    data = sample_tasks(size.tasks, dtype=dtype)
    return {
        name: VARIANTS[name][0](
            make_model(channels=size.channels, dtype=dtype), data, order == "first"
        )
        for name in names
    }


def _names(order: Order, section: Section | None = None) -> list[str]:
    found, missing = [], set()
    for name, (_, peer, orders) in VARIANTS.items():
        if order not in orders:
            continue
        if peer is None or _peers.load(peer) is not None:
            found.append(name)
        else:
            missing.add(peer)
    if section is not None:
        for peer in sorted(missing):
            note = _peers.skipped(peer, what=f"{peer}'s MAML on the CNN ({order})")
            if note not in section.notes:
                section.notes.append(note)
    return found


def _first_sentence(text: str) -> str:
    return text.split(". ")[0].rstrip(".") + "."


def _agreeing(order: Order, size: Size, section: Section) -> list[str]:
    """Compute every candidate's float64 meta-gradient; keep those equal to ours.

    Raises:
        AssertionError: If a loop candidate differs from ParamDict's loop.
    """
    names = _names(order, section)
    exact = _build(names, order, size, torch.float64)
    keys = list(dict(make_model(channels=size.channels).named_parameters()))
    reference = exact[OURS]()
    kept = [OURS]
    for name in names[1:]:
        try:
            got = exact[name]()
        except ValueError as err:
            if name not in BATCHED:
                raise
            section.notes.append(
                f"{order} order, {name}: refused, not timed. "
                f"{_first_sentence(str(err))}"
            )
            continue
        try:
            check_agreement({OURS: reference, name: got}, keys, reference=OURS)
        except AssertionError:
            if name not in BATCHED:
                raise
            worst = max((got[k] - reference[k]).abs().max().item() for k in keys)
            scale = max(reference[k].abs().max().item() for k in keys)
            section.notes.append(
                f"{order} order, {name}: the float64 meta-gradient differs from the "
                f"loop's by up to {worst:.1e} (the largest entry is {scale:.1e}), "
                "silently; not timed."
            )
            continue
        kept.append(name)
    return kept


def measure(config: Config) -> Section:
    """Check the candidates in float64, then time them in float32, both orders."""
    size = _size(config.quick)
    section = Section(
        "cnn",
        "MAML on a CNN with BatchNorm",
        f"One meta-iteration of the 4-conv Omniglot-shaped network (BatchNorm with "
        f"batch statistics), {size.label}, 5-way 1-shot with 5 queries per class, "
        f"one inner SGD step (lr {INNER_LR}), float32; at most {ROUNDS} rounds. "
        "Every timed candidate's float64 meta-gradient equals ParamDict's loop.",
    )
    timing = dataclasses.replace(config, rounds=min(config.rounds, ROUNDS))
    rows = {}
    for order in ("second", "first"):
        names = _agreeing(order, size, section)
        candidates = _build(names, order, size, torch.float32)
        row = Row.from_timings(
            f"{order} order", size.label, timing.time(dict(candidates.items()))
        )
        section.rows.append(row)
        rows[order] = row
        section.targets.append(
            ratio_target(
                f"CNN MAML ({order} order, loop) within {LIMIT}x of plain dicts",
                row,
                OURS,
                PLAIN,
                LIMIT,
            )
        )
    first = rows["first"]
    if OURS_VMAP in first.medians:
        section.notes.append(
            f"First order, vmap over the loop: {first.ratio(OURS_VMAP):.2f}x the "
            "time (ParamDict), "
            + (
                f"{first.ratio(PLAIN_VMAP, over=PLAIN):.2f}x (plain dicts)."
                if PLAIN_VMAP in first.medians and PLAIN in first.medians
                else "plain dicts not measured."
            )
        )
    return section


# ------------------------------------------------------------------- peak memory


def _memory_worker(name: str, order: Order, quick: bool) -> dict[str, Any]:
    """Run one meta-iteration of `name` in this process; return the peak growth."""
    size = _size(quick)
    warm = _build([name], order, Size(size.channels, 1), torch.float32)[name]
    fn = _build([name], order, size, torch.float32)[name]
    warm()  # first calls initialize lazily (dispatcher tables, autograd engine)
    gc.collect()
    exact = _reset_peak()
    before = _peak()
    grads = fn()
    after = _peak()
    del grads
    return {"name": name, "bytes": after - before, "reset": exact}


def _memory_names(order: Order, quick: bool) -> list[str]:
    if quick:
        return [OURS, PLAIN] if order == "second" else []
    names = _names(order)
    if order == "second":  # refused under vmap (see the timing section)
        names = [n for n in names if n not in BATCHED]
    return names


def measure_memory(config: Config) -> Section:
    """Measure the peak-memory growth of one meta-iteration in fresh processes."""
    size = _size(config.quick)
    section = Section(
        "cnn-memory",
        "MAML on a CNN with BatchNorm: peak memory",
        f"Growth of the resident set's high-water mark over one float32 "
        f"meta-iteration of the CNN case ({size.label}), each sample in a fresh "
        "process after a one-task warm-up; processes of the candidates alternate; "
        "medians. Under vmap only first order runs (second order is refused).",
    )
    exact = True
    for order in ("second", "first"):
        names = _memory_names(order, config.quick)
        if not names:
            continue
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(config.processes):
            for name in names if i % 2 == 0 else names[::-1]:
                result = run_fresh(
                    ["-m", "benchmarks.maml_cnn", "--peak-memory", name]
                    + ["--order", order]
                    + (["--quick"] if config.quick else []),
                    threads=config.threads,
                    what=f"The memory worker for {name} ({order} order)",
                )
                samples[name].append(float(result["bytes"]))
                exact = exact and bool(result["reset"])
        medians = {name: statistics.median(s) for name, s in samples.items()}
        spreads = {
            name: (max(s) - min(s)) / medians[name] if medians[name] else 0.0
            for name, s in samples.items()
        }
        row = Row(
            f"peak memory, {order} order", size.label, medians, spreads, samples, "B"
        )
        section.rows.append(row)
        shown = ", ".join(f"{n} {format_bytes(m)}" for n, m in medians.items())
        section.notes.append(f"{order} order medians: {shown}.")
        section.targets.append(
            ratio_target(
                f"CNN MAML peak memory ({order} order, loop) within {LIMIT}x of "
                "plain dicts",
                row,
                OURS,
                PLAIN,
                LIMIT,
            )
        )
    if not exact:
        section.notes.append(
            "The high-water mark could not be reset on this system; the growth is "
            "measured against the process's lifetime peak and may be too low."
        )
    section.notes.append(
        f"{config.processes} process(es) per candidate; the spread is "
        "(max - min) / median."
    )
    return section


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--peak-memory",
        choices=list(VARIANTS),
        required=True,
        help="run one meta-iteration of this candidate and print its peak growth",
    )
    parser.add_argument("--order", choices=["second", "first"], default="second")
    parser.add_argument("--quick", action="store_true", help="the smoke run's size")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(json.dumps(_memory_worker(args.peak_memory, args.order, args.quick)))


if __name__ == "__main__":
    _main()
