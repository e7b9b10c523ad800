"""The optimizers from papers: `paramdict.optim` against the packages people use.

Schedule-Free AdamW against `schedulefree.AdamWScheduleFree`, and AdEMAMix, Adan
and SOAP against `pytorch_optimizer`'s classes, each package measured when it
imports (`pip install --no-deps schedulefree pytorch-optimizer` beside this torch)
and left out with a note otherwise. Candidates, each stepping equal tensors with
equal gradients and carrying its own state from step to step:

- `ParamDict`: `params, state = opt.step(params, grads, state)`, out of place, new
  leaves that require grad, as the docs teach;
- `ParamDict step_`: `opt.step_(params, grads, state)`, in place;
- the package's optimizer: `opt.step()` on parameters whose `.grad` is set, with
  `foreach=True` where it takes it (all but SOAP); Schedule-Free's in `train()`
  mode, where its parameters are the point `y` the gradient is taken at, as ours.
  `schedulefree` divides the gradients in place (it uses their buffers as
  scratch), so its calls first copy fresh gradients in, as a backward pass would
  make them; the copy alone is timed beside it, to subtract.

Float32; the options of `OPTIONS` on both sides. Every candidate takes one step
on other gradients before the timed calls, which all take the same gradients:
SOAP's first call builds its preconditioner from them, and a basis built from the
gradient it then rotates would leave that gradient's rotation zero, up to
rounding, off a diagonal (its singular vectors), where rounding then decides the
step. SOAP's entries are matrices
(as square as each size's element count allows, as for Muon in `optim`), so that
every entry is preconditioned; its bases are refreshed every 10 calls, inside the
timed calls. Before timing, three steps of every candidate from the same start,
in float64, must give the same parameters to 1e-9.

Part of `python -m benchmarks`; `python -m benchmarks --only optim-papers` runs it
alone, `--optimizers AdEMAMix,SOAP` only those rows.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch
from torch import Tensor, nn

from paramdict import ParamDict, optim

from . import _peers
from ._agree import check_agreement
from ._device import placed
from ._report import OURS, Config, Row, Section
from .optim import matrix_shape

__all__ = ["OPTIONS", "measure"]

IN_PLACE = "ParamDict step_"
STEPS = 3

OPTIONS: dict[str, dict[str, Any]] = {
    "ScheduleFreeAdamW": {"lr": 1e-3, "warmup_steps": 10, "weight_decay": 0.01},
    "AdEMAMix": {"lr": 1e-3, "alpha": 5.0, "t_alpha_beta3": 1000, "weight_decay": 0.01},
    "Adan": {"lr": 1e-3, "weight_decay": 0.02},
    "SOAP": {"lr": 3e-3, "weight_decay": 0.01},
}
"""Each optimizer's options, the same on both sides (the names are the package's
but for SOAP's, renamed in `_package`)."""

WRITES_GRADS = ("ScheduleFreeAdamW",)
"""The optimizers whose package writes into the gradients it is given."""

_PACKAGE = {
    "ScheduleFreeAdamW": "schedulefree",
    "AdEMAMix": "pytorch_optimizer",
    "Adan": "pytorch_optimizer",
    "SOAP": "pytorch_optimizer",
}
_DISTRIBUTION = {
    "schedulefree": "schedulefree",
    "pytorch_optimizer": "pytorch-optimizer",
}


def _package(name: str, module: Any) -> tuple[str, Callable[[list[Tensor]], Any]]:
    """The package's candidate for `name`: its column's title and its factory."""
    options = OPTIONS[name]
    if name == "ScheduleFreeAdamW":

        def schedule_free(tensors: list[Tensor]) -> Any:
            opt = module.AdamWScheduleFree(tensors, foreach=True, **options)
            opt.train()
            return opt

        return "schedulefree (foreach)", schedule_free
    if name == "AdEMAMix":
        return "pytorch_optimizer (foreach)", lambda t: module.AdEMAMix(
            t, weight_decouple=True, foreach=True, **options
        )
    if name == "Adan":
        return "pytorch_optimizer (foreach)", lambda t: module.Adan(
            t, foreach=True, **options
        )
    return "pytorch_optimizer", lambda t: module.SOAP(t, **options)


def _data(
    keys: list[str], shape: tuple[int, ...], dtype: torch.dtype
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Values, the first call's gradients and every later call's, from seed 0."""
    gen = torch.Generator().manual_seed(0)

    def draw() -> list[Tensor]:
        return [placed(torch.randn(shape, generator=gen).to(dtype)) for _ in keys]

    return draw(), draw(), draw()


def _candidates(
    name: str,
    keys: list[str],
    shape: tuple[int, ...],
    module: Any,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Callable[[], object]]:
    """One step of ours (`step`, `step_`) and of the package's, each on its own copy."""
    values, first, grads = _data(keys, shape, dtype)
    first_dict = ParamDict(zip(keys, first))
    grad_dict = ParamDict(zip(keys, grads))
    opt: optim.Optimizer[Any] = getattr(optim, name)(**OPTIONS[name])

    fresh = ParamDict(zip(keys, [v.clone().requires_grad_() for v in values]))
    carried: list[Any] = list(opt.step(fresh, first_dict, opt.init(fresh)))

    def step() -> ParamDict:
        carried[0], carried[1] = opt.step(carried[0], grad_dict, carried[1])
        new: ParamDict = carried[0]
        return new

    # Another optimizer object: each keeps the binding of its own loop.
    in_place: optim.Optimizer[Any] = getattr(optim, name)(**OPTIONS[name])
    owned = ParamDict(zip(keys, [v.clone() for v in values]))
    written: list[Any] = list(in_place.step_(owned, first_dict, in_place.init(owned)))

    def step_() -> ParamDict:
        written[0], written[1] = in_place.step_(written[0], grad_dict, written[1])
        new: ParamDict = written[0]
        return new

    candidates: dict[str, Callable[[], object]] = {OURS: step, IN_PLACE: step_}
    if module is not None:
        title, make = _package(name, module)
        leaves = [nn.Parameter(v.clone()) for v in values]
        for leaf, grad in zip(leaves, first):
            leaf.grad = grad.clone()
        theirs = make(list(leaves))
        theirs.step()
        for leaf, grad in zip(leaves, grads):
            leaf.grad = grad.clone()
        if name in WRITES_GRADS:
            # It divides the gradients in place (their buffers are its scratch):
            # each call hands it fresh ones, as a backward pass would.
            held = [leaf.grad for leaf in leaves if leaf.grad is not None]

            def restore() -> list[Tensor]:
                torch._foreach_copy_(held, grads)
                return held

            def step_theirs() -> list[Tensor]:
                restore()
                theirs.step()
                return list(leaves)

            candidates[title] = step_theirs
            candidates[f"{title}: the gradients' copy alone"] = restore
        else:

            def step_plain() -> list[Tensor]:
                theirs.step()
                return list(leaves)

            candidates[title] = step_plain
    return candidates


def _check(name: str, keys: list[str], shape: tuple[int, ...], module: Any) -> None:
    """Take `STEPS` steps with each candidate in float64: the same parameters.

    In float64, where what each computes shows through the rounding: SOAP's
    float32 eigenvectors move with the last bits of its factors.
    """
    results: dict[str, object] = {}
    candidates = _candidates(name, keys, shape, module, torch.float64)
    for candidate, step in candidates.items():
        if candidate.endswith("alone"):
            continue
        for _ in range(STEPS):
            results[candidate] = step()
    check_agreement(results, keys, reference=OURS, rtol=1e-9, atol=1e-12)


def _version(module: str) -> str:
    try:
        return metadata.version(_DISTRIBUTION[module])
    except metadata.PackageNotFoundError:
        return "unknown"


def measure(config: Config) -> Section:
    """Time each optimizer's step against its package at every size."""
    section = Section(
        "optim-papers",
        "Optimizers from papers",
        "One step per call, carrying the state forward; float32, no autograd "
        "history; the packages step in place (`foreach=True` where they take it).",
    )
    chosen = [n for n in OPTIONS if not config.optimizers or n in config.optimizers]
    for name in chosen:
        module = _peers.load(_PACKAGE[name])
        if module is None:
            section.notes.append(
                _peers.skipped(_PACKAGE[name], what=f"{name}'s package column")
            )
        for entries, elements in config.sizes:
            keys = [f"layers.{i}.weight" for i in range(entries)]
            if name == "SOAP":
                shape: tuple[int, ...] = matrix_shape(elements)
                size = f"{entries} x {shape[0]} x {shape[1]}"
            else:
                shape = (elements,)
                size = f"{entries} x {elements:,}"
            with torch.inference_mode(False):
                _check(name, keys, shape, module)
                candidates = _candidates(name, keys, shape, module)
            section.rows.append(
                Row.from_timings(f"{name} step", size, config.time(candidates))
            )
    used = sorted({_PACKAGE[n] for n in chosen if _peers.load(_PACKAGE[n])})
    if used:
        section.notes.append(
            "Packages: " + ", ".join(f"{m} {_version(m)}" for m in used) + "."
        )
    return section
