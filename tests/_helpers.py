"""Pieces shared by the test modules: a user subclass, an aten-op recorder, scripts."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from torch.utils._python_dispatch import TorchDispatchMode

from paramdict import ParamDict

__all__ = ["CountOps", "MyParams", "script"]


class MyParams(ParamDict):
    """A user subclass: every operation must keep this type."""

    __slots__ = ()


class CountOps(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves this base untyped
    """Record the name of every aten op that runs while the mode is active."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # untyped torch base
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]  # torch's dispatch signature
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def script(name: str) -> ModuleType:
    """Import `scripts/<name>.py` of this repository (not a package) as a module."""
    path = Path(__file__).resolve().parent.parent / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
