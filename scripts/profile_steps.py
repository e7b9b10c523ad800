"""Where an optimizer step's time goes: host time, kernel launches, syncs.

A diagnostic beside the benchmarks (their ratios are the claims): for each
optimizer of the table, ours (`step_`, `step`) and torch's paths at
50 x 400,000 on `--device`, it prints per step the host time to submit the step
(no wait), the time with a wait for the device, and from one profiled step the
number of aten operations, of kernel launches and of host-device
synchronizations, and the device's kernel time; on CUDA also where in Python each
synchronization of a step starts (`torch.cuda.set_sync_debug_mode`). Besides the
table's optimizers, `--names` takes "AdamW warm-up + cosine" and "nanoGPT recipe"
(the benchmark's two composed rows: the first at 50 x 400,000, the recipe at
GPT-2 small's shapes).

Usage: python scripts/profile_steps.py --device cuda [--names NAdam,RMSprop] [--top 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _device, optim_scale
from paramdict import ParamDict, optim

SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
LAUNCHES = (
    "cudaLaunchKernel",
    "cuLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernelEx",
)


def _wait() -> None:
    if _device.accelerated():
        torch.cuda.synchronize()


def _measure(run, rounds: int) -> tuple[float, float]:
    submit, waited = [], []
    for _ in range(rounds):
        _wait()
        start = time.perf_counter()
        run()
        submit.append(time.perf_counter() - start)
        _wait()
        waited.append(time.perf_counter() - start)
    return statistics.median(submit), statistics.median(waited)


def _profiled(run, top: int) -> str:
    activities = [ProfilerActivity.CPU]
    if _device.accelerated():
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        run()
        _wait()
    events = prof.key_averages()
    aten = sum(e.count for e in events if e.key.startswith("aten::"))
    launches = sum(e.count for e in events if e.key in LAUNCHES)
    syncs = sum(e.count for e in events if e.key in SYNCS)
    copies = sum(e.count for e in events if "Memcpy" in e.key and "DtoH" in e.key)
    kernels = sum(
        getattr(e, "self_device_time_total", 0)
        for e in events
        if not e.key.startswith(("aten::", "cuda"))
    )
    line = (
        f"aten ops {aten}, launches {launches}, syncs {syncs}, DtoH {copies}, "
        f"kernel time {kernels / 1e3:.3f} ms"
    )
    if top:
        rows = sorted(
            (e for e in events if e.key.startswith("aten::")),
            key=lambda e: e.self_cpu_time_total,
            reverse=True,
        )[:top]
        line += "".join(
            f"\n      {e.key:<32} x{e.count:<4} "
            f"self cpu {e.self_cpu_time_total / 1e3:.3f} ms"
            for e in rows
        )
    return line


def _syncs(run: Callable[[], object]) -> str:
    """Where one step waits for the device: `file:line (count)` of each wait."""
    if not _device.accelerated():
        return "-"
    _wait()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    places = Counter(
        f"{Path(w.filename).name}:{w.lineno}"
        for w in caught
        if "synchroniz" in str(w.message)
    )
    return ", ".join(f"{k} ({n})" for k, n in places.items()) or "none"


def _candidates(name: str, keys, values, grads) -> dict[str, Callable[[], object]]:
    modes = {"ours step_": optim_scale.IN_PLACE, "ours step": optim_scale.OURS}
    if name == optim_scale.SCHEDULED:
        made = {}
        for label, mode in modes.items():
            schedule = optim.LambdaLR(
                base_lr=1e-3, lr_lambda=optim_scale._warmup_cosine
            )
            opt = optim.AdamW(lr=schedule, weight_decay=0.01)
            params = ParamDict(zip(keys, [v.clone() for v in values]))
            made[label] = optim_scale._scheduled_ours(
                opt, params, ParamDict(zip(keys, grads)), mode
            )
        return made
    if name == optim_scale.RECIPE:  # at GPT-2 small's shapes: its groups need matrices
        keys, values, grads = optim_scale._data(optim_scale.GPT2)
        micro = [
            ParamDict(zip(keys, grads)),
            ParamDict(zip(keys, [g * 0.5 for g in grads])),
        ]
        return {
            label: optim_scale._recipe_ours(
                ParamDict(zip(keys, [v.clone() for v in values])), micro, mode
            )
            for label, mode in modes.items()
        }
    made = {
        label: optim_scale._ours(name, keys, values, grads, mode)
        for label, mode in modes.items()
    }
    for path in optim_scale.torch_paths(name):
        made[path] = optim_scale._torch(name, values, grads, path)
    return made


def main() -> None:
    """Print, for each optimizer, each candidate's step: times and profile."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--names", default="NAdam,RMSprop,Adadelta,Lion,Adamax,RAdam,Adafactor,Adam"
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args()
    _device.use(args.device)
    keys, values, grads = optim_scale._data(optim_scale.WIDE)
    for name in args.names.split(","):
        print(f"== {name}", flush=True)
        for label, run in _candidates(name, keys, values, grads).items():
            for _ in range(3):
                run()
            submit, waited = _measure(run, args.rounds)
            detail = _profiled(
                run,
                args.top if label.startswith("ours step_") or "foreach" in label else 0,
            )
            waits = _syncs(run) if label.startswith("ours") else "-"
            times = f"submit {submit * 1e3:.3f} ms, waited {waited * 1e3:.3f} ms"
            print(f"  {label:<24} {times}; {detail}", flush=True)
            if waits != "-":
                print(f"      waits for the device at: {waits}", flush=True)


if __name__ == "__main__":
    main()
