"""The device the optimizer sections measure on (`--device`).

The data are drawn on the CPU from fixed seeds, the same values on every device,
then `placed` on the device. On a CUDA device the timing clock waits for the
device's queued work before it reads the time (`clock`), and a peak-memory row
reads the caching allocator's high-water mark in this process (`cuda_peak`):
exact, so one sample per candidate and no fresh process. The other sections
always run on the CPU.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "accelerated",
    "allocated",
    "clock",
    "cuda_peak",
    "current",
    "fused_on_device",
    "placed",
    "use",
]

_CHOSEN: list[torch.device] = [torch.device("cpu")]


def use(device: str) -> None:
    """Measure the optimizer sections on `device` (`"cpu"` or `"cuda"`, ...).

    Raises:
        ValueError: If the device is not a CPU or an available CUDA device.
    """
    chosen = torch.device(device)
    if chosen.type == "cuda" and not torch.cuda.is_available():
        msg = f"--device {device}: torch sees no CUDA device here."
        raise ValueError(msg)
    if chosen.type not in ("cpu", "cuda"):
        msg = f"--device {device}: the benchmarks measure on 'cpu' or 'cuda'."
        raise ValueError(msg)
    _CHOSEN[0] = chosen


def current() -> torch.device:
    """The device chosen with `use` (the CPU by default)."""
    return _CHOSEN[0]


def accelerated() -> bool:
    """Whether the chosen device is an accelerator (its work runs asynchronously)."""
    return current().type != "cpu"


def placed(tensor: Tensor) -> Tensor:
    """`tensor`, drawn on the CPU, on the chosen device."""
    return tensor.to(current())


def clock(base: Callable[[], float]) -> Callable[[], float]:
    """`base`, made to wait for the chosen device's queued work first."""
    if not accelerated():
        return base
    device = current()

    def synchronized() -> float:
        torch.cuda.synchronize(device)
        return base()

    return synchronized


def cuda_peak(reset: bool = False) -> int:
    """The caching allocator's high-water mark in bytes; with `reset`, reset first."""
    device = current()
    torch.cuda.synchronize(device)
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
    return int(torch.cuda.max_memory_allocated(device))


def allocated() -> int:
    """Bytes the caching allocator has handed out on the chosen device now."""
    return int(torch.cuda.memory_allocated(current()))


@functools.cache
def _fused_on(theirs: Callable[..., Any], device: torch.device) -> bool:
    probe = torch.zeros(1, device=device, requires_grad=True)
    probe.grad = torch.ones(1, device=device)
    try:  # torch's Adagrad takes `fused=True` on CUDA and refuses at its first step
        theirs([probe], fused=True).step()
    except (RuntimeError, ValueError):  # torch has no kernel for that device
        return False
    return True


def fused_on_device(theirs: Callable[..., Any]) -> bool:
    """Whether torch's class `theirs` runs `fused=True` on the chosen device."""
    return _fused_on(theirs, current())
