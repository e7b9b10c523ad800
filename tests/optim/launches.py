"""Counting the kernels and host syncs of a step on fake CUDA tensors (no GPU needed).

`FakeTensorMode` makes tensors on device `cuda` that carry no memory, so a step of
an optimizer runs its whole Python logic and dispatches every aten call, on a
machine without a GPU. `DeviceOps` records each call that touches a CUDA tensor
and launches work on the device: every such call is at least one kernel launch
(a foreach kernel over many tensors counts once, as it is one call of the
library). Calls that only allocate or make views launch nothing and are left out.
A host sync (`.item()` of a device tensor) cannot run on fake tensors:
`aten._local_scalar_dense` raises, and a blocking copy from the host is counted
apart (`syncs`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["DeviceOps", "count", "cuda_tensors"]

# Calls that allocate, make views or read metadata: no kernel runs on the device.
_FREE = frozenset(
    {
        "_has_compatible_shallow_copy_type",
        "_record_function_enter_new",
        "_record_function_exit",
        "_reshape_alias",
        "_unsafe_view",
        "alias",
        "as_strided",
        "detach",
        "device",
        "empty",
        "empty_like",
        "empty_strided",
        "expand",
        "is_contiguous",
        "is_same_size",
        "lift_fresh",
        "new_empty",
        "new_empty_strided",
        "permute",
        "select",
        "slice",
        "squeeze",
        "sym_numel",
        "sym_size",
        "sym_storage_offset",
        "sym_stride",
        "t",
        "transpose",
        "unbind",
        "unsqueeze",
        "view",
    }
)


def _devices(tree: Any) -> set[str]:
    return {
        t.device.type for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)
    }


class DeviceOps(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves this base untyped
    """Record each aten call that launches work on a CUDA tensor."""

    def __init__(self, *, everywhere: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # untyped torch base
        self.ops: list[str] = []
        self.syncs: list[str] = []
        # Count the calls on every device (a step on CPU tensors, as if on CUDA).
        self.everywhere = everywhere

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]  # torch's dispatch signature
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        out = func(*args, **kwargs)
        if name in _FREE:
            return out
        inputs, outputs = _devices((args, kwargs)), _devices(out)
        if not self.everywhere and "cuda" not in inputs | outputs:
            return out
        if name in ("_to_copy", "copy_") and "cpu" in inputs and "cuda" in outputs:
            # A blocking copy from pageable host memory waits for the stream.
            non_blocking = kwargs.get("non_blocking", False)
            if not non_blocking:
                self.syncs.append(name)
        self.ops.append(name)
        return out

    def summary(self) -> str:
        """The calls by name and count, for assertion messages."""
        return ", ".join(f"{n} x{c}" for n, c in Counter(self.ops).most_common())


def cuda_tensors(
    shapes: Sequence[tuple[int, ...]], *, seed: int = 0
) -> list[torch.Tensor]:
    """Fake tensors of `shapes` on `cuda` (no GPU needed).

    Made inside a `FakeTensorMode` and used outside it: operations on them stay
    fake (their own mode runs them), while tensors a step makes from Python
    numbers (torch.optim's step counters, paramdict's) are real CPU tensors,
    as on a machine with a GPU.
    """
    del seed  # fake tensors hold no values
    with FakeTensorMode(allow_non_fake_inputs=True):
        return [torch.randn(s, device="cuda") for s in shapes]


def count(
    step: Callable[[], Any], *, warm: int = 2, everywhere: bool = False
) -> DeviceOps:
    """Run `step` `warm` times, then once more under a `DeviceOps`; return it."""
    for _ in range(warm):
        step()
    ops = DeviceOps(everywhere=everywhere)
    with ops:
        step()
    return ops
