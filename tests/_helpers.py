"""Pieces shared by the test modules: a user subclass and an aten-op recorder."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

from paramdict import ParamDict

__all__ = ["CountOps", "MyParams"]


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
