"""paramdict: an immutable, keyed tensor mapping for functional PyTorch.

`ParamDict` keeps parameters, gradients and optimizer state keyed by name end to
end, so `torch.func.functional_call`, autograd and optimizers meet without
`dict -> tuple -> dict` conversions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._autograd import Outputs
from ._paramdict import ParamDict
from ._pointwise import Operand
from ._tensors import Device

if TYPE_CHECKING:
    from . import distributed, optim
    from ._implicit import implicit_proximal, implicit_root
    from ._products import hvp, jvp, vjp
    from ._solve import CGInfo, cg

    __version__: str

__all__ = [
    "CGInfo",
    "Device",
    "Operand",
    "Outputs",
    "ParamDict",
    "__version__",
    "cg",
    "distributed",
    "hvp",
    "implicit_proximal",
    "implicit_root",
    "jvp",
    "optim",
    "vjp",
]


_LAZY = {
    "implicit_proximal": "._implicit",
    "implicit_root": "._implicit",
    "hvp": "._products",
    "jvp": "._products",
    "vjp": "._products",
    "CGInfo": "._solve",
    "cg": "._solve",
}
"""Where each name loaded on first use lives."""


def __getattr__(name: str) -> Any:
    # `optim` is imported on first use: its import registers the optimizers'
    # state classes with `torch.load` (its optimizers load on their own first use).
    # So is `distributed`: it builds the collectives' helpers and is only needed by
    # programs that run on several processes.
    if name in {"distributed", "optim"}:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    # The products, the solver and implicit differentiation load on first use
    # too: most programs train with `ParamDict` and its operators alone.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    # Read lazily: importing importlib.metadata costs more than the rest of the
    # package together.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("torch-paramdict")
        except PackageNotFoundError:  # running from a source tree
            return "0+unknown"
    msg = f"module 'paramdict' has no attribute {name!r}"
    raise AttributeError(msg)
