"""One optimizer step: `paramdict.optim` against `torch.optim` (foreach) and torchopt.

Candidates, each stepping equal tensors with equal gradients and carrying its own
state from step to step:

- `ParamDict`: `params, state = opt.step(params, grads, state)`: out of place, new
  leaves that require grad, as in training;
- `torch.optim (foreach)`: `opt.step()` with `foreach=True`, in place, on
  parameters whose `.grad` is set;
- `torchopt (functional)`: `updates, state = tx.update(grads, state, params=params,
  inplace=False)` and `torchopt.apply_updates(params, updates, inplace=False)`, on
  plain dicts of tensors that do not require grad (torchopt's functional style).

Adam, AdamW, SGD with momentum, RMSprop and Adagrad, with the same hyperparameters
everywhere. Before timing, three steps of every candidate from the same start must
give the same parameters; a torchopt transformation that does not is left out, with
a note. Part of `python -m benchmarks`; `python -m benchmarks --only optim` runs
only this section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from paramdict import ParamDict, optim

from . import _peers
from ._agree import check_agreement
from ._report import OURS, Config, Row, Section, ratio_target

__all__ = ["measure"]

TORCH = "torch.optim (foreach)"
TORCHOPT = "torchopt (functional)"
STEPS = 3

# name, paramdict.optim class, torch.optim class, torchopt function name, kwargs
SETTINGS: list[
    tuple[str, Callable[..., optim.Optimizer[Any]], Any, str, dict[str, Any]]
]
SETTINGS = [
    ("Adam", optim.Adam, torch.optim.Adam, "adam", {"lr": 1e-3}),
    ("AdamW", optim.AdamW, torch.optim.AdamW, "adamw", {"lr": 1e-3}),
    ("SGD momentum", optim.SGD, torch.optim.SGD, "sgd", {"lr": 1e-3, "momentum": 0.9}),
    ("RMSprop", optim.RMSprop, torch.optim.RMSprop, "rmsprop", {"lr": 1e-3}),
    ("Adagrad", optim.Adagrad, torch.optim.Adagrad, "adagrad", {"lr": 1e-3}),
]
TARGET = ("Adam", (160, 64), 1.10)


def _candidates(
    setting: tuple[str, Callable[..., optim.Optimizer[Any]], Any, str, dict[str, Any]],
    keys: list[str],
    elements: int,
) -> dict[str, Callable[[], object]]:
    _, ours, theirs, torchopt_name, kwargs = setting
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(elements, generator=gen) for _ in keys]
    grads = [torch.randn(elements, generator=gen) for _ in keys]

    opt = ours(**kwargs)
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
    torch_opt = theirs(tensors, foreach=True, **kwargs)

    def step_torch() -> list[Tensor]:
        torch_opt.step()
        return tensors

    candidates: dict[str, Callable[[], object]] = {OURS: step_ours, TORCH: step_torch}
    torchopt = _peers.load("torchopt")
    if torchopt is not None:
        tx = getattr(torchopt, torchopt_name)(**kwargs)
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
    check_agreement({n: results[n] for n in (OURS, TORCH)}, keys, reference=OURS)
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
    settings = SETTINGS[:1] + SETTINGS[2:3] if config.quick else SETTINGS
    target_row = None
    for setting in settings:
        for entries, elements in config.sizes:
            keys = [f"layers.{i}.weight" for i in range(entries)]
            with torch.inference_mode(False):
                candidates = _agreeing(
                    setting[0], _candidates(setting, keys, elements), keys, section
                )
            row = Row.from_timings(
                f"{setting[0]} step",
                f"{entries} x {elements:,}",
                config.time(candidates),
            )
            if (setting[0], (entries, elements)) == TARGET[:2]:
                target_row = row
            section.rows.append(row)
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
