"""One optimizer step: `paramdict.optim` against `torch.optim` (foreach) and torchopt.

Candidates, each stepping equal tensors with equal gradients and carrying its own
state from step to step:

- `ParamDict`: `params, state = opt.step(params, grads, state)` with
  `paramdict.optim.Adam` or `SGD`: out of place, new leaves that require grad, as in
  training;
- `torch.optim (foreach)`: `opt.step()` with `foreach=True`, in place, on
  parameters whose `.grad` is set;
- `torchopt (functional)`: `updates, state = tx.update(grads, state, params=params,
  inplace=False)` and `torchopt.apply_updates(params, updates, inplace=False)` with
  `torchopt.adam` or `torchopt.sgd`, on plain dicts of tensors that do not require
  grad (torchopt's functional style).

Before timing, one step of each candidate from the same start must give the same
parameters. Part of `python -m benchmarks` (run only this with `--only optim`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from paramdict import ParamDict

from . import _peers
from ._agree import check_agreement
from ._report import OURS, Config, Row, Section, Target, ratio_target

__all__ = ["measure"]

# name, paramdict.optim class name, torch.optim class, torchopt function, kwargs
SETTINGS: list[tuple[str, str, Any, str, dict[str, float]]] = [
    ("Adam", "Adam", torch.optim.Adam, "adam", {"lr": 1e-3}),
    ("SGD momentum", "SGD", torch.optim.SGD, "sgd", {"lr": 1e-3, "momentum": 0.9}),
]


def _optim() -> Any:
    """Return `paramdict.optim`, or `None` where this paramdict has no optimizers."""
    try:
        return importlib.import_module("paramdict.optim")
    except ImportError:
        return None


def _candidates(
    setting: tuple[str, str, Any, str, dict[str, float]],
    entries: int,
    elements: int,
) -> dict[str, Callable[[], object]]:
    _, ours_name, theirs, torchopt_name, kwargs = setting
    gen = torch.Generator().manual_seed(0)
    keys = [f"layers.{i}.weight" for i in range(entries)]
    values = [torch.randn(elements, generator=gen) for _ in range(entries)]
    grads = [torch.randn(elements, generator=gen) for _ in range(entries)]

    opt = getattr(_optim(), ours_name)(**kwargs)
    start = ParamDict(zip(keys, [v.clone().requires_grad_() for v in values]))
    grad_dict = ParamDict(zip(keys, grads))
    box: list[Any] = [start, opt.init(start)]

    def run_ours() -> ParamDict:
        box[0], box[1] = opt.step(box[0], grad_dict, box[1])
        return box[0]  # type: ignore[no-any-return]  # a ParamDict, from `step`

    torch_params = [v.clone().requires_grad_() for v in values]
    for p, g in zip(torch_params, grads):
        p.grad = g.clone()
    torch_opt = theirs(torch_params, foreach=True, **kwargs)

    def run_torch() -> list[Tensor]:
        torch_opt.step()
        return torch_params

    candidates: dict[str, Callable[[], object]] = {
        OURS: run_ours,
        "torch.optim (foreach)": run_torch,
    }
    torchopt = _peers.load("torchopt")
    if torchopt is not None:
        tx = getattr(torchopt, torchopt_name)(**kwargs)
        plain = dict(zip(keys, [v.clone() for v in values]))
        plain_grads = dict(zip(keys, grads))
        carried: list[Any] = [plain, tx.init(plain)]

        def run_torchopt() -> dict[str, Tensor]:
            params, state = carried
            updates, state = tx.update(plain_grads, state, params=params, inplace=False)
            carried[0] = torchopt.apply_updates(params, updates, inplace=False)
            carried[1] = state
            return carried[0]  # type: ignore[no-any-return]  # a dict of tensors

        candidates["torchopt (functional)"] = run_torchopt
    return candidates


def measure(config: Config) -> Section:
    """Time Adam and SGD steps at every size (skipped without `paramdict.optim`)."""
    section = Section(
        "optim",
        "Optimizer step",
        "One step per call, carrying the state forward; float32, no autograd "
        "history (`torch.optim` steps in place, the others return new tensors).",
    )
    if _optim() is None:
        section.notes.append(
            "Optimizer step: skipped, this paramdict has no `paramdict.optim`."
        )
        section.targets.append(
            Target(
                "`paramdict.optim.Adam` step within 1.10x of `torch.optim.Adam` "
                "(foreach), 160 x 64",
                "no `paramdict.optim`",
                None,
            )
        )
        return section
    if _peers.load("torchopt") is None:
        section.notes.append(_peers.skipped("torchopt", what="torchopt"))
    adam_row = None
    for setting in SETTINGS:
        for entries, elements in config.sizes:
            candidates = _candidates(setting, entries, elements)
            keys = [f"layers.{i}.weight" for i in range(entries)]
            check_agreement(
                {name: fn() for name, fn in candidates.items()}, keys, reference=OURS
            )
            row = Row.from_timings(
                f"{setting[0]} step",
                f"{entries} x {elements:,}",
                config.time(candidates),
            )
            if setting[0] == "Adam" and (entries, elements) == (160, 64):
                adam_row = row
            section.rows.append(row)
    section.targets.append(
        ratio_target(
            "`paramdict.optim.Adam` step within 1.10x of `torch.optim.Adam` "
            "(foreach), 160 x 64",
            adam_row,
            OURS,
            "torch.optim (foreach)",
            1.10,
        )
    )
    return section
