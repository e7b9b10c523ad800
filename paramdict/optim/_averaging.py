"""The arithmetic of `WeightAverage`: one foreach kernel per group of tensors.

As `AveragedModel.update_parameters`: per device and dtype, EMA's `lerp` by
`1 - decay`; SWA's `lerp` by `1 / (n + 1)` (float32-rounded) on a device with
foreach kernels, `avg + (value - avg) / (n + 1)` on the CPU. Integer entries
and mixed dtypes take torch's per-tensor formula (`entry`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

__all__ = ["averaged", "entry"]


def averaged(
    kind: str,
    decay: float,
    averages: list[Tensor],
    values: list[Tensor],
    n: int,
    *,
    in_place: bool,
) -> list[Tensor]:
    """The averages after `values` were averaged in the `n + 1`-th time (`in_place`)."""
    values = [
        v.detach() if v.device == a.device else v.detach().to(a.device)
        for a, v in zip(averages, values)
    ]
    groups: dict[tuple[torch.device, torch.dtype, torch.dtype], list[int]] = {}
    for i, (a, v) in enumerate(zip(averages, values)):
        groups.setdefault((a.device, a.dtype, v.dtype), []).append(i)
    out: list[Tensor] = list(averages)
    for (device, dtype, value_dtype), index in groups.items():
        group = [averages[i] for i in index]
        given = [values[i] for i in index]
        if n == 0:  # the first update copies
            made = group if in_place else [torch.empty_like(a) for a in group]
            torch._foreach_copy_(made, given)
        elif (dtype.is_floating_point or dtype.is_complex) and dtype == value_dtype:
            made = _floating(kind, decay, group, given, n, device, in_place=in_place)
        else:
            made = [
                entry(kind, decay, a, v, n, in_place=in_place)
                for a, v in zip(group, given)
            ]
        for i, tensor in zip(index, made):
            out[i] = tensor
    return out


def _floating(
    kind: str,
    decay: float,
    group: list[Tensor],
    given: list[Tensor],
    n: int,
    device: torch.device,
    *,
    in_place: bool,
) -> list[Tensor]:
    if kind == "ema" or device.type in _get_foreach_kernels_supported_devices():
        weight = 1 - decay if kind == "ema" else (1 / torch.tensor(n + 1)).item()
        if in_place:
            torch._foreach_lerp_(group, given, weight)
            return group
        return list(torch._foreach_lerp(group, given, weight))
    steps = torch._foreach_sub(given, group)
    torch._foreach_div_(steps, n + 1)
    if in_place:
        torch._foreach_add_(group, steps)
        return group
    return list(torch._foreach_add(group, steps))


def entry(
    kind: str,
    decay: float,
    avg: Tensor,
    value: Tensor,
    n: int | Tensor,
    *,
    in_place: bool = False,
) -> Tensor:
    """Torch's per-tensor formula, cast to the average's dtype."""
    mixed: Any
    if kind == "ema":
        if avg.is_floating_point() or avg.is_complex():
            # In the wider of the two dtypes, then back to the average's, as
            # `swa`'s arithmetic promotes and casts (`lerp` takes one dtype).
            work = torch.promote_types(avg.dtype, value.dtype)
            mixed = torch.lerp(avg.to(work), value.to(work), 1 - decay)
        else:
            mixed = avg * decay + value * (1 - decay)
    else:
        mixed = avg + (value - avg) / (n + 1)
    result: Tensor = avg.copy_(mixed) if in_place else mixed.to(avg.dtype)
    return result
