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


def _runs_fused(opt: TorchOptimizer[Any], state: Any) -> bool:
    """Whether `opt.step` on `state`'s parameters runs torch's fused kernel."""
    fused: object = getattr(opt, "fused", False)
    if fused is True:
        return True
    if fused is not None or not type(opt).copies_fused:
        return False
    entries = [  # the buffers keyed like the parameters stand in for them
        v
        for f in getattr(state, "_fields", ())
        if f != "schedule" and isinstance(v := getattr(state, f), ParamDict) and v
    ]
    return bool(entries) and opt._fused_plan(entries[0], state) is not None


def torch_flags(
    opt: TorchOptimizer[Any], state: Any, defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """Return the `FLAGS` among torch's `defaults` that run `opt.step`'s kernels."""
    flags = {name: defaults[name] for name in FLAGS if name in defaults}
    if "capturable" in flags and getattr(opt, "capturable", None) is True:
        flags["capturable"] = True
    if "differentiable" in flags:
        flags["differentiable"] = opt.differentiable
    if not opt.differentiable and "fused" in flags and _runs_fused(opt, state):
        flags["fused"] = True
    elif "foreach" in flags:
        flags["foreach"] = not opt.differentiable and type(opt).__name__ not in _LOOP
    return flags
