"""One optimizer step: `paramdict.optim` against `torch.optim` (foreach) and torchopt.

Candidates, each stepping equal tensors with equal gradients and carrying its own
state from step to step:

- `ParamDict`: `params, state = opt.step(params, grads, state)`: out of place, new
  leaves that require grad, as in training;
- `torch.optim (foreach)`: `opt.step()` with `foreach=True`, in place, on
  parameters whose `.grad` is set (`torch.optim (for-loop)`, torch's default, for a
  class that takes no `foreach`);
- `torchopt (functional)`: `updates, state = tx.update(grads, state, params=params,
  inplace=False)` and `torchopt.apply_updates(params, updates, inplace=False)`, on
  plain dicts of tensors that do not require grad (torchopt's functional style);
- `ParamDict step_` and `torch.optim (fused)`, for the optimizers whose torch class
  takes `fused` (read from its signature): ours in place, against torch's fused
  kernels.

The optimizers are the rows of the tests' optimizer table
(`tests/optim/optim_cases.py`, read through `benchmarks/_table.py`), in its order,
each with its row's benchmark options (`bench`) on every side, and torchopt where
the row names its function; of those, a `--quick` run times Adam and SGD with
momentum only, unless `--optimizers` names others. torch has no Lion: its
`torch.optim (foreach)` candidate is the table's plain-torch reference, `TorchLion`
with `foreach=True` (one foreach call per operation). Before timing, three steps of
every candidate from the same start must give the same parameters; a torchopt
transformation that does not is left out, with a note.

Two kinds of optimizer need other inputs:

- The table's matrix-only rows (Muon) update 2-D entries only (ours and torch's
  refuse others), so their entries are matrices with each size's element count:
  the rows are the largest divisor of the count at most its square root
  (8 x 40 x 40, 160 x 8 x 8, 1000 x 4 x 4). torch.optim.Muon has no foreach path
  (it refuses `foreach=True`), so the candidate is torch's default, its per-tensor
  loop on CPU, `torch.optim (for-loop)`.
- LBFGS is no row of the table (its step takes the loss rather than gradients, and
  its tests are its own). It re-evaluates the loss, so each call is one `step` from
  the same start with a fresh state (`max_iter=20`, `history_size=10`,
  `line_search_fn` None and `"strong_wolfe"`) on a fixed quadratic
  `0.5 * sum(d * (x - c) ** 2)` over all
  entries flattened in key order, with `d` log-uniform in [0.1, 10] and `c` standard
  normal, drawn from a seed. A step stops at `max_iter` iterations (with the line
  search, at `max_eval`, 25 evaluations) well before the minimum, the same work in
  every call. Before timing, both steps must give the same parameters (float32
  rounding allowed). `paramdict.optim.LBFGS` steps the keyed params with the loss
  as its closure; `torch.optim (closure)` first writes the start back into its
  tensors and clears its state, then calls `opt.step(closure)`, where the closure
  zeroes the gradients and runs `loss.backward()`. Both evaluate the same loss
  function. LBFGS rows take at most 31 rounds (a step takes up to a second at
  1000 entries).

Targets, each beside its figures: Adam's default step within 1.10x of torch's
foreach and its `step_` within 1.05x of torch's fused step at 160 x 64; Adafactor
and LBFGS (both line searches) within 1.10x of torch at every size.

Part of `python -m benchmarks`; `python -m benchmarks --only optim` runs only this
section, and `--optimizers Muon,LBFGS` (any names of `optimizers()`) only those rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from paramdict import ParamDict, optim

from . import _peers, _table
from ._agree import check_agreement
from ._device import placed
from ._report import OURS, Config, Row, Section, Target, ratio_target

__all__ = ["measure"]

TORCH = "torch.optim (foreach)"
TORCH_LOOP = "torch.optim (for-loop)"
IN_PLACE = "ParamDict step_"
FUSED = "torch.optim (fused)"
TORCHOPT = "torchopt (functional)"
STEPS = 3

QUICK = ("Adam", "SGD momentum")
"""The table's optimizers (but the matrix-only ones) that a `--quick` run times
when `--optimizers` names none."""
TARGET = ("Adam", (160, 64), 1.10)

TORCH_CLOSURE = "torch.optim (closure)"
LBFGS: dict[str, Any] = {"max_iter": 20, "history_size": 10}
LINE_SEARCHES = (None, "strong_wolfe")
LBFGS_ROUNDS = 31
OTHERS = ("LBFGS",)
"""The optimizers of this section that are not rows of the table (see the module's
docstring)."""


def optimizers() -> tuple[str, ...]:
    """Return every optimizer of this section, the names `--optimizers` takes."""
    return (*_table.names(), *OTHERS)


def _data(keys: list[str], shape: tuple[int, ...]) -> tuple[list[Tensor], list[Tensor]]:
    """Values and gradients of `shape` for each key, from the seed 0."""
    gen = torch.Generator().manual_seed(0)
    values = [placed(torch.randn(shape, generator=gen)) for _ in keys]
    grads = [placed(torch.randn(shape, generator=gen)) for _ in keys]
    return values, grads


def _pair(
    opt: optim.Optimizer[Any],
    make_torch: Callable[[list[Tensor]], torch.optim.Optimizer],
    keys: list[str],
    values: list[Tensor],
    grads: list[Tensor],
) -> tuple[Callable[[], ParamDict], Callable[[], list[Tensor]]]:
    """One step of `opt` and of torch's optimizer, each on its own copy of `values`.

    Each carries its state from call to call; torch's steps parameters whose
    `.grad` is set.
    """
    start = ParamDict(zip(keys, [v.clone().requires_grad_() for v in values]))
    grad_dict = ParamDict(zip(keys, grads))
    current: list[Any] = [start, opt.init(start)]

    def step_ours() -> ParamDict:
        current[0], current[1] = opt.step(current[0], grad_dict, current[1])
        new: ParamDict = current[0]
        return new

    tensors = [v.clone().requires_grad_() for v in values]
    for tensor, grad in zip(tensors, grads):
        tensor.grad = grad.clone()
    torch_opt = make_torch(tensors)

    def step_torch() -> list[Tensor]:
        torch_opt.step()
        return tensors

    return step_ours, step_torch


def _candidates(
    entry: _table.Entry, keys: list[str], elements: int
) -> dict[str, Callable[[], object]]:
    ours, theirs, kwargs = entry.ours, entry.theirs, entry.options
    values, grads = _data(keys, (elements,))
    # torch's foreach path where its class has one, else its default loop
    path, flag = (
        (TORCH, {"foreach": True}) if entry.takes("foreach") else (TORCH_LOOP, {})
    )
    step_ours, step_torch = _pair(
        ours(**kwargs), lambda t: theirs(t, **flag, **kwargs), keys, values, grads
    )
    candidates: dict[str, Callable[[], object]] = {OURS: step_ours, path: step_torch}
    if entry.fused:  # ours in place against torch's fused kernels
        opt = ours(**kwargs)
        start = ParamDict(zip(keys, [v.clone() for v in values]))
        grad_dict = ParamDict(zip(keys, grads))
        current: list[Any] = [start, opt.init(start)]

        def step_in_place() -> ParamDict:
            current[0], current[1] = opt.step_(current[0], grad_dict, current[1])
            new: ParamDict = current[0]
            return new

        _, step_fused = _pair(
            ours(**kwargs),
            lambda t: theirs(t, fused=True, **kwargs),
            keys,
            values,
            grads,
        )
        candidates[IN_PLACE] = step_in_place
        candidates[FUSED] = step_fused
    torchopt = _peers.load("torchopt")
    if torchopt is not None and entry.torchopt:  # "": torchopt has no such optimizer
        tx = getattr(torchopt, entry.torchopt)(**kwargs)
        plain = dict(zip(keys, [v.clone() for v in values]))
        plain_grads = dict(zip(keys, grads))
        carried: list[Any] = [plain, tx.init(plain)]

        def step_torchopt() -> dict[str, Tensor]:
            params, state = carried
            updates, carried[1] = tx.update(
                plain_grads, state, params=params, inplace=False
            )
            carried[0] = torchopt.apply_updates(params, updates, inplace=False)
            new: dict[str, Tensor] = carried[0]
            return new

        candidates[TORCHOPT] = step_torchopt
    return candidates


def _agreeing(
    name: str,
    candidates: dict[str, Callable[[], object]],
    keys: list[str],
    section: Section,
) -> dict[str, Callable[[], object]]:
    """Take `STEPS` steps with each; drop a torchopt candidate that disagrees."""
    results: dict[str, object] = {}
    for candidate, step in candidates.items():
        for _ in range(STEPS):
            results[candidate] = step()
    torch_ = {n: results[n] for n in (OURS, TORCH, TORCH_LOOP) if n in results}
    check_agreement(torch_, keys, reference=OURS)
    fused = {n: results[n] for n in (OURS, IN_PLACE, FUSED) if n in results}
    check_agreement(fused, keys, reference=OURS, rtol=1e-5, atol=1e-6)
    if TORCHOPT in results:
        try:
            check_agreement(
                {OURS: results[OURS], TORCHOPT: results[TORCHOPT]}, keys, reference=OURS
            )
        except AssertionError as err:
            note = (
                f"{TORCHOPT} {name}: not timed, its steps differ from torch.optim's "
                f"({str(err).splitlines()[0]})"
            )
            if not any(n.startswith(f"{TORCHOPT} {name}:") for n in section.notes):
                section.notes.append(note)
            return {n: c for n, c in candidates.items() if n != TORCHOPT}
    return candidates


def matrix_shape(elements: int) -> tuple[int, int]:
    """Return `(rows, cols)` with `rows * cols == elements`, as square as can be."""
    rows = max(r for r in range(1, math.isqrt(elements) + 1) if elements % r == 0)
    return rows, elements // rows


def _matrix_candidates(
    entry: _table.Entry, keys: list[str], elements: int
) -> dict[str, Callable[[], object]]:
    """A matrix-only optimizer on matrices of `elements` entries: ours and torch's.

    torch's candidate is its default path (Muon takes no `foreach`), its per-tensor
    loop on CPU.
    """
    values, grads = _data(keys, matrix_shape(elements))
    step_ours, step_torch = _pair(
        entry.ours(**entry.options),
        lambda t: entry.theirs(t, **entry.options),
        keys,
        values,
        grads,
    )
    return {OURS: step_ours, TORCH_LOOP: step_torch}


def quadratic(values: list[Tensor], scale: Tensor, center: Tensor) -> Tensor:
    """Return `0.5 * sum(scale * (x - center) ** 2)`, `x` the entries flattened."""
    flat = torch.cat([v.reshape(-1) for v in values])
    return 0.5 * (scale * (flat - center) ** 2).sum()


def _lbfgs_candidates(
    keys: list[str],
    elements: int,
    line_search_fn: str | None,
    settings: dict[str, Any] = LBFGS,
) -> dict[str, Callable[[], object]]:
    """One LBFGS step from the same start and a fresh state per call, both sides."""
    gen = torch.Generator().manual_seed(0)
    count = len(keys) * elements
    scale = torch.empty(count).uniform_(math.log(0.1), math.log(10), generator=gen)
    scale = placed(scale.exp())
    center = placed(torch.randn(count, generator=gen))
    values = [placed(torch.randn(elements, generator=gen)) for _ in keys]

    opt = optim.LBFGS(line_search_fn=line_search_fn, **settings)
    start = ParamDict(zip(keys, [v.clone().requires_grad_() for v in values]))

    def loss(params: ParamDict) -> Tensor:
        return quadratic(list(params.values()), scale, center)

    def step_ours() -> ParamDict:
        new, _ = opt.step(start, loss, opt.init(start))
        return new

    tensors = [v.clone().requires_grad_() for v in values]
    torch_opt = torch.optim.LBFGS(tensors, line_search_fn=line_search_fn, **settings)

    def closure() -> Tensor:
        torch_opt.zero_grad()
        value = quadratic(tensors, scale, center)
        value.backward()  # type: ignore[no-untyped-call]  # torch's annotation
        return value

    def step_torch() -> list[Tensor]:
        with torch.no_grad():
            torch._foreach_copy_(tensors, values)
        torch_opt.state.clear()
        torch_opt.step(closure)  # type: ignore[no-untyped-call]  # torch's annotation
        return tensors

    return {OURS: step_ours, TORCH_CLOSURE: step_torch}


def _agree_once(
    candidates: dict[str, Callable[[], object]], keys: list[str], steps: int
) -> None:
    """Take `steps` calls of each candidate; their parameters must agree."""
    results: dict[str, object] = {}
    for candidate, step in candidates.items():
        for _ in range(steps):
            results[candidate] = step()
    check_agreement(results, keys, reference=OURS)


def _extra_rows(config: Config) -> list[Row]:
    """The matrix-only optimizers on matrices and LBFGS on a quadratic, every size."""
    rows: list[Row] = []
    matrix = [
        e for e in _table.entries() if e.matrices_only and _chosen(e.name, config)
    ]
    lbfgs = _chosen("LBFGS", config)
    lbfgs_timing = dataclasses.replace(config, rounds=min(config.rounds, LBFGS_ROUNDS))
    for entries, elements in config.sizes:
        keys = [f"layers.{i}.weight" for i in range(entries)]
        rows_, cols = matrix_shape(elements)
        for entry in matrix:
            with torch.inference_mode(False):
                candidates = _matrix_candidates(entry, keys, elements)
                _agree_once(candidates, keys, STEPS)
            rows.append(
                Row.from_timings(
                    f"{entry.name} step",
                    f"{entries} x {rows_} x {cols}",
                    config.time(candidates),
                )
            )
        for line_search_fn in LINE_SEARCHES if lbfgs else ():
            with torch.inference_mode(False):
                candidates = _lbfgs_candidates(keys, elements, line_search_fn)
                _agree_once(candidates, keys, 2)  # a second call starts over too
            rows.append(
                Row.from_timings(
                    f"LBFGS step, line_search_fn={line_search_fn!r}",
                    f"{entries} x {elements:,}",
                    lbfgs_timing.time(candidates),
                )
            )
    return rows


def _chosen(name: str, config: Config) -> bool:
    """Whether `--optimizers` picked `name` (all are picked by default)."""
    return not config.optimizers or name in config.optimizers


def measure(config: Config) -> Section:
    """Time every optimizer's step at every size."""
    section = Section(
        "optim",
        "Optimizer step",
        "One step per call, carrying the state forward; float32, no autograd "
        "history (`torch.optim` steps in place, the others return new tensors).",
    )
    if _peers.load("torchopt") is None:
        section.notes.append(_peers.skipped("torchopt", what="torchopt"))
    # `--quick` alone times the optimizers of `QUICK`; named ones are timed anyway
    quick = config.quick and not config.optimizers
    timed = [
        e
        for e in _table.entries()
        if not e.matrices_only
        and (e.name in QUICK or not quick)
        and _chosen(e.name, config)
    ]
    target_row: Row | None = None
    for entry in timed:
        for entries, elements in config.sizes:
            keys = [f"layers.{i}.weight" for i in range(entries)]
            with torch.inference_mode(False):
                candidates = _agreeing(
                    entry.name, _candidates(entry, keys, elements), keys, section
                )
            row = Row.from_timings(
                f"{entry.name} step",
                f"{entries} x {elements:,}",
                config.time(candidates),
            )
            if (entry.name, (entries, elements)) == TARGET[:2]:
                target_row = row
            section.rows.append(row)
    section.rows += _extra_rows(config)
    section.targets += _small_targets(section.rows, config)
    section.targets.append(
        ratio_target(
            "`paramdict.optim.Adam` step within 1.10x of `torch.optim.Adam` "
            "(foreach), 160 x 64",
            target_row,
            OURS,
            TORCH,
            TARGET[2],
        )
    )
    return section


def _small_targets(rows: list[Row], config: Config) -> list[Target]:
    """The issue's targets on this section's rows, each beside its figure.

    Adam's `step_` within 1.05x of torch's fused step at 160 x 64; Adafactor and
    LBFGS (both line searches) within 1.10x of torch at every size.
    """
    by_case = {(r.case, r.size): r for r in rows}
    targets = [
        ratio_target(
            "`paramdict.optim.Adam` `step_` within 1.05x of `torch.optim.Adam` "
            "(fused), 160 x 64",
            by_case.get(("Adam step", "160 x 64")),
            IN_PLACE,
            FUSED,
            1.05,
        )
    ]
    for entries, elements in config.sizes:
        size = f"{entries} x {elements:,}"
        targets.append(
            ratio_target(
                f"Adafactor step within 1.10x of {TORCH}, {size}",
                by_case.get(("Adafactor step", size)),
                OURS,
                TORCH,
                1.10,
            )
        )
        for line_search_fn in LINE_SEARCHES:
            case = f"LBFGS step, line_search_fn={line_search_fn!r}"
            targets.append(
                ratio_target(
                    f"{case} within 1.10x of {TORCH_CLOSURE}, {size}",
                    by_case.get((case, size)),
                    OURS,
                    TORCH_CLOSURE,
                    1.10,
                )
            )
    return targets
