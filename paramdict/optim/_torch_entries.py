"""Checks of the entries torch saved for each parameter, before any is loaded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._torch_optimizer import TorchOptimizer

__all__ = ["NO_STEP", "check_entries", "check_first_buffers"]

NO_STEP = frozenset({"SGD", "Muon"})
"""The optimizers whose torch state keeps no step count."""


def check_entries(
    opt: TorchOptimizer[Any],
    saved: Mapping[str, Mapping[str, Any]],
    template: Any,
    fields: list[str],
    per_key: set[str],
) -> None:
    """Raise if a parameter with state lacks an entry torch's step reads.

    torch starts a parameter's state only when it has none; one with some
    entries reads every other (a missing one raises `KeyError`, a `None` one
    fails in the kernels). SGD alone starts a missing or `None` momentum buffer
    afresh; SGD and Muon save no step count.
    """
    kind = type(opt).__name__
    for name in sorted(n for n, entries in saved.items() if entries):
        needed = [
            f
            for f in fields
            if (name in getattr(template, f) if f in per_key else True)
            and not (f == "step" and kind in NO_STEP)
            and not (f == "momentum_buffer" and kind == "SGD")
        ]
        missing = [f for f in needed if f not in saved[name]]
        if missing:
            msg = (
                f"The state of {name!r} has no {missing} but other entries; "
                f"torch's {kind} reads them at its next step. Save the state dict "
                "again with `state_dict()`, or drop the parameter's state to "
                "start it afresh."
            )
            raise KeyError(msg)
        empty = [f for f in needed if saved[name][f] is None]
        if empty:
            msg = (
                f"The state of {name!r} holds None as {empty}; torch's {kind} "
                "needs tensors there. Save the state dict again with `state_dict()`."
            )
            raise TypeError(msg)


def check_first_buffers(
    opt: TorchOptimizer[Any],
    saved: Mapping[str, Mapping[str, Any]],
    names: list[str],
) -> None:
    """Raise if torch's SGD would start some buffers otherwise than paramdict's.

    torch's SGD (and Muon) keep no step count: a parameter without a momentum
    buffer starts one at its next step. paramdict's one count per group starts
    them alike where that start is the rule's step from a zero buffer (no
    dampening); with dampening, torch starts a buffer as a copy of the gradient,
    which paramdict does only at the group's first step.
    """
    if getattr(opt, "dampening", 0) == 0:
        return
    held = [n for n in names if saved.get(n, {}).get("momentum_buffer") is not None]
    lacking = sorted(set(names) - set(held))
    if held and lacking:
        msg = (
            f"The state dict holds momentum buffers for {sorted(held)} and none for "
            f"{lacking}: torch's SGD starts a damped buffer as a copy of the next "
            "gradient, and paramdict's one step count per group cannot start some "
            "buffers and continue others. Load a checkpoint in which every "
            "parameter of the group has taken a step (or none has)."
        )
        raise ValueError(msg)
