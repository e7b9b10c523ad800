"""Which of torch.optim's implementations a paramdict step repeats, as group flags.

torch's implementations round differently (on the CPU its default loop, the
foreach path and the fused kernels), and `load_state_dict` takes a saved group's
flags over the constructor's: an exported dict names the path paramdict's `step`
runs, so torch continues on it (`docs/coming-from-torch-optim.md`).
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
"""The rules that round as torch's single-tensor loop, the others as its foreach path
(RAdam's loop differs). Measured: 100 float32 steps of every option set of
`tests/optim/optim_cases.py`, bit for bit."""


def _entries(state: Any) -> ParamDict | None:
    """A buffer of `state` keyed like the parameters, or None without a state."""
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
    """Return the `FLAGS` among torch's `defaults` that run `opt.step`'s kernels."""
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
