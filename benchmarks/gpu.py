"""Every optimizer's step on a CUDA GPU: time and kernel launches against torch.optim.

`python -m benchmarks --only gpu` (on a machine with a CUDA device; the section
chooses `cuda` itself). At GPT-2 small's 148 float32 entries, for each optimizer of
the table: ParamDict's `step` and `step_` beside torch.optim's foreach and fused
steps (those it has), timed side by side in interleaved rounds (medians, the clock
waiting for the device), and the kernels one steady-state step launches, counted
by `torch.profiler` (every CUDA kernel, memcpy and memset event). Then the nanoGPT
recipe row of `optim_scale` on the GPU. Targets: `step_` within 1.05x of torch's
fused step (its foreach step where it has none), `step` within 1.10x of its foreach
step, and no more kernels than torch's foreach step. Without a CUDA device the
section says so and measures nothing.
"""

from __future__ import annotations

import dataclasses
import gc
from collections.abc import Callable

import torch

from . import _device, _table, optim_scale
from ._report import OURS, Config, Row, Section, Target, ratio_target

__all__ = ["kernels", "measure"]

STEP = optim_scale.IN_PLACE
FOREACH = optim_scale.FOREACH
FUSED = optim_scale.FUSED


def kernels(step: Callable[[], object]) -> int:
    """The CUDA kernels (and copies, fills) one call of `step` launches."""
    step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        step()
        torch.cuda.synchronize()
    cuda = torch.profiler.DeviceType.CUDA
    return len([e for e in prof.events() if e.device_type == cuda])


def _candidates(name: str) -> dict[str, Callable[[], object]]:
    data = optim_scale._data(optim_scale.GPT2)
    if _table.entry(name).matrices_only:
        data = optim_scale._matrices(data)
    keys, values, grads = data
    made: dict[str, Callable[[], object]] = {}
    for mode in (OURS, STEP):
        made[mode] = optim_scale._ours(name, keys, values, grads, mode)
    for mode in optim_scale.torch_paths(name):
        made[mode] = optim_scale._torch(name, values, grads, mode)
    return made


def _targets(name: str, row: Row, counts: dict[str, int]) -> list[Target]:
    paths = optim_scale.torch_paths(name)
    fastest = paths[0]
    default = FOREACH if FOREACH in paths else fastest
    limit = 1.05 if fastest == FUSED else 1.10
    found = [
        ratio_target(
            f"{name}: `step_` within {limit:.2f}x of {fastest} on the GPU",
            row,
            STEP,
            fastest,
            limit,
        ),
        ratio_target(
            f"{name}: default `step` within 1.10x of {default} on the GPU",
            row,
            OURS,
            default,
            1.10,
        ),
    ]
    if default in counts:
        ours, theirs = counts[STEP], counts[default]
        found.append(
            Target(
                f"{name}: `step_` launches no more kernels than {default}",
                f"{ours} kernels against {theirs}",
                ours <= theirs,
            )
        )
    return found


def measure(config: Config) -> Section:
    """Time and count each optimizer's step on the GPU (full runs only)."""
    section = Section(
        "gpu",
        "Optimizer steps on a CUDA GPU",
        "One step per call at GPT-2 small's shapes, float32, on `cuda`; kernels "
        "per step from `torch.profiler`.",
    )
    if not torch.cuda.is_available():
        section.notes.append("No CUDA device here: nothing measured.")
        return section
    if config.quick:
        section.notes.append("Measured in full runs only.")
        return section
    _device.use("cuda")
    section.notes.append(f"Device: {torch.cuda.get_device_name()}.")
    rounds = max(5, min(config.rounds, 11))
    timing = dataclasses.replace(
        config, rounds=rounds, target=0.02, warmup=2, clock="wall"
    )
    for name in optim_scale._chosen(_table.names(), config):
        with torch.inference_mode(False):
            candidates = _candidates(name)
            counts = {mode: kernels(step) for mode, step in candidates.items()}
            row = Row.from_timings(
                f"{name} step", optim_scale.GPT2, timing.time(candidates)
            )
        section.rows.append(row)
        section.targets += _targets(name, row, counts)
        shown = ", ".join(f"{mode} {n}" for mode, n in counts.items())
        section.notes.append(f"{name} kernels per step: {shown}.")
        del candidates
        gc.collect()
    if optim_scale.RECIPE in optim_scale._chosen([optim_scale.RECIPE], config):
        row = optim_scale._recipe_row(timing)
        section.rows.append(row)
        section.targets += [
            ratio_target(
                f"{optim_scale.RECIPE}: `step_` within 1.05x of torch.optim fused "
                "on the GPU",
                row,
                STEP,
                FUSED,
                1.05,
            ),
            ratio_target(
                f"{optim_scale.RECIPE}: default `step` within 1.10x of torch.optim's "
                "foreach recipe on the GPU",
                row,
                OURS,
                FOREACH,
                1.10,
            ),
        ]
    return section
