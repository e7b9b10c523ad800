"""Python calls per optimizer step: paramdict's `step` and `step_` beside torch's.

For every optimizer of the table (and with a warm-up + cosine `SequentialLR`
schedule), one step after the first ones is run under `sys.setprofile`, counting
each Python frame entered ("call" events): those in paramdict's own files, and
all of them (torch's Python code included). torch's step is its fastest path for
the optimizer (`fused=True` where it has one, else `foreach=True`) followed by its
scheduler's `step()`. C functions (torch's kernels, builtins) are not Python calls.

    python scripts/step_calls.py                 # every optimizer
    python scripts/step_calls.py --names AdamW   # some
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from paramdict import ParamDict, optim

PACKAGE = str(Path(optim.__file__).resolve().parent.parent)
SHAPES = [(16,)] * 50  # 50 x 16, where a step is mostly its calls

# name -> (ours, theirs, torch's fastest flag)
TABLE: dict[str, tuple[Callable[..., Any], Callable[..., Any], dict[str, Any]]] = {
    "SGD": (optim.SGD, torch.optim.SGD, {"momentum": 0.9}),
    "Adam": (optim.Adam, torch.optim.Adam, {}),
    "AdamW": (optim.AdamW, torch.optim.AdamW, {}),
    "Adagrad": (optim.Adagrad, torch.optim.Adagrad, {}),
    "NAdam": (optim.NAdam, torch.optim.NAdam, {}),
    "RAdam": (optim.RAdam, torch.optim.RAdam, {}),
    "Adamax": (optim.Adamax, torch.optim.Adamax, {}),
    "RMSprop": (optim.RMSprop, torch.optim.RMSprop, {}),
    "Adadelta": (optim.Adadelta, torch.optim.Adadelta, {}),
    "Rprop": (optim.Rprop, torch.optim.Rprop, {}),
    "ASGD": (optim.ASGD, torch.optim.ASGD, {}),
    "Adafactor": (optim.Adafactor, torch.optim.Adafactor, {}),
}
FUSED = {"SGD", "Adam", "AdamW", "Adagrad"}


class Counter:
    """Count the Python frames entered, in paramdict's files and in all."""

    def __init__(self) -> None:
        self.ours = 0
        self.all = 0

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        """Count a frame entered (the `sys.setprofile` hook)."""
        if event == "call":
            self.all += 1
            if frame.f_code.co_filename.startswith(PACKAGE):
                self.ours += 1


def _count(run: Callable[[], None]) -> Counter:
    counter = Counter()
    sys.setprofile(counter)
    try:
        run()
    finally:
        sys.setprofile(None)
    return counter


def _values() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=gen) for s in SHAPES]


def _our_schedule(lr: float) -> optim.SequentialLR:
    return optim.SequentialLR(
        base_lr=lr,
        schedulers=[
            optim.LinearLR(start_factor=0.1, total_iters=5),
            optim.CosineAnnealingLR(T_max=100),
        ],
        milestones=[5],
    )


def _their_schedule(opt: torch.optim.Optimizer) -> Any:
    lrs = torch.optim.lr_scheduler
    return lrs.SequentialLR(
        opt,
        schedulers=[
            lrs.LinearLR(opt, start_factor=0.1, total_iters=5),
            lrs.CosineAnnealingLR(opt, T_max=100),
        ],
        milestones=[5],
    )


def ours(name: str, method: str, scheduled: bool) -> Counter:
    """Calls of one paramdict step (the fourth) of `name`."""
    make, _, options = TABLE[name]
    lr = 0.01
    opt = make(lr=_our_schedule(lr) if scheduled else lr, **options)
    params = ParamDict({f"p{i}": v for i, v in enumerate(_values())})
    grads = params.map(torch.ones_like)
    state = opt.init(params)
    step = getattr(opt, method)
    for _ in range(3):
        params, state = step(params, grads, state)
    held = (params, state)

    def run() -> None:
        step(held[0], grads, held[1])

    return _count(run)


def theirs(name: str, scheduled: bool) -> Counter:
    """Calls of one torch step (the fourth) of `name`, its scheduler's included."""
    _, make, options = TABLE[name]
    tensors = [v.requires_grad_() for v in _values()]
    for t in tensors:
        t.grad = torch.ones_like(t)
    path = {"fused": True} if name in FUSED else {"foreach": True}
    if name == "Adafactor":
        path = {"foreach": True}
    opt = make(tensors, lr=0.01, **options, **path)
    scheduler = _their_schedule(opt) if scheduled else None
    for _ in range(3):
        opt.step()
        if scheduler is not None:
            scheduler.step()

    def run() -> None:
        opt.step()
        if scheduler is not None:
            scheduler.step()

    return _count(run)


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--names", default=",".join(TABLE))
    names = parser.parse_args().names.split(",")
    header = (
        f"{'optimizer':<10} {'schedule':<9} {'step ours/all':>14} "
        f"{'step_ ours/all':>15} {'torch all':>10}"
    )
    print(header)
    print("-" * len(header))
    for name in names:
        for scheduled in (False, True):
            a = ours(name, "step", scheduled)
            b = ours(name, "step_", scheduled)
            t = theirs(name, scheduled)
            print(
                f"{name:<10} {'yes' if scheduled else 'no':<9} "
                f"{a.ours:>6} / {a.all:<6} {b.ours:>6} / {b.all:<7} {t.all:>10}"
            )


if __name__ == "__main__":
    main()
