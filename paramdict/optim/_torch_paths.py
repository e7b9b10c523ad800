"""Which of torch.optim's implementations a paramdict step repeats, as group flags.

torch.optim picks its implementation from four settings of each parameter group
(`foreach`, `fused`, `capturable`, `differentiable`), and its implementations round
differently: on the CPU its default (`foreach=None`) is the single-tensor loop,
which for some optimizers rounds otherwise than the foreach path, and the fused
kernels round otherwise than both. A state dict carries those settings, and
`load_state_dict` takes the saved ones over the constructor's; so the dict that
`to_torch_state_dict` exports says which implementation paramdict's `step` runs,
and torch continues on the same one (`docs/coming-from-torch-optim.md` lists
where that is bit for bit).
"""

from __future__ import annotations

# pyright: reportPrivateUsage=false
# (the optimizers' own `_fused_plan`, of this package)
from collections.abc import Mapping
from typing import Any

from .._paramdict import ParamDict
from ._torch_optimizer import TorchOptimizer

__all__ = ["FLAGS", "torch_flags"]

FLAGS = frozenset({"foreach", "fused", "capturable", "differentiable"})
"""Group settings that choose torch's implementation, not the arithmetic."""

_LOOP = frozenset({"NAdam", "ASGD", "Adafactor"})
"""The optimizers whose rule rounds as torch's single-tensor loop (`foreach=False`).

The others' rule rounds as torch's foreach path (`foreach=True`); for most of
them the loop rounds the same, for `RAdam` it does not. Measured: 100 steps of
every option set of `tests/optim/optim_cases.py` in float32, bit for bit.
"""


def _entries(state: Any) -> ParamDict | None:
    """A buffer of `state` keyed like the parameters (their dtypes and devices).

    None without a state (settings read before there is one).
    """
    for field in getattr(state, "_fields", ()):
        value = getattr(state, field)
        if field != "schedule" and isinstance(value, ParamDict) and value:
            return value
    return None


def _runs_fused(opt: TorchOptimizer[Any], state: Any) -> bool:
    """Whether `opt.step` on `state`'s parameters runs torch's fused kernel."""
    fused: object = getattr(opt, "fused", False)
    if fused is True:
        return True
    if fused is not None or not type(opt).copies_fused:
        return False
    entries = _entries(state)  # the buffers stand in for the parameters
    return entries is not None and opt._fused_plan(entries, state) is not None


def torch_flags(
    opt: TorchOptimizer[Any], state: Any, defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """Return the settings among `FLAGS` that make torch run `opt.step`'s kernels.

    `defaults` are torch's class's settings (only those it has are returned):
    `fused=True` where paramdict's step runs the fused kernel; otherwise
    `foreach` True or False, whichever path rounds as paramdict's rule;
    `differentiable=True` (and the single-tensor loop, torch's only
    differentiable path) for a differentiable optimizer; `capturable` as the
    optimizer's, else torch's default.
    """
    flags = {name: defaults[name] for name in FLAGS if name in defaults}
    if "capturable" in flags and getattr(opt, "capturable", None) is True:
        flags["capturable"] = True
    if "differentiable" in flags:
        flags["differentiable"] = opt.differentiable
    if opt.differentiable:
        if "foreach" in flags:
            flags["foreach"] = False
        return flags
    if "fused" in flags and _runs_fused(opt, state):
        flags["fused"] = True
        return flags
    if "foreach" in flags:
        flags["foreach"] = type(opt).__name__ not in _LOOP
    return flags
