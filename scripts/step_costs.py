"""What an optimizer step pays besides its arithmetic: checks, frames, page faults.

A diagnostic beside the benchmarks (their ratios are the claims), on the CPU, one
thread, with `benchmarks.optim_scale`'s data and candidates:

- `compiled`: `torch.compile(opt.step_)` split into its parts, interleaved round
  by round at 50 x 400,000: the whole compiled call (a frame up to the eager
  checks, the checks, the frame of the update), the eager checks followed by
  the compiled update alone (`_checked_to_write`, then `torch.compile` of
  `_write_traced`: one frame), the compiled update without the checks, and
  torch's compiled foreach step. Medians in ms.
- `faults`: each candidate (ours `step` and `step_`, torch's foreach step) in a
  fresh process: CPU ms per step and the minor page faults per step (from
  `getrusage`), which count fresh memory the operating system hands over.

Usage:
    python scripts/step_costs.py compiled --names Adagrad,RMSprop [--rounds 21]
    python scripts/step_costs.py faults --names Adamax [--size gpt2]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import _table, optim_scale
from benchmarks._report import OURS
from paramdict import ParamDict
from paramdict.optim._writable import twinned  # the compiled `step_`'s own call

SIZES = {"wide": optim_scale.WIDE, "gpt2": optim_scale.GPT2}
FAULT_MODES = (OURS, optim_scale.IN_PLACE, optim_scale.FOREACH)


def _compiled_parts(name: str) -> dict[str, Callable[[], object]]:
    """The four calls `compiled` times for `name`, each on its own tensors."""
    keys, values, grads = optim_scale._data(optim_scale.WIDE)
    entry = _table.entry(name)
    opt = entry.ours(**entry.options)
    params = ParamDict(zip(keys, [v.clone() for v in values]))
    grad_dict = ParamDict(zip(keys, grads))
    state = opt.init(params)
    update = torch.compile(opt._write_traced)

    def checks_then_update() -> object:
        aligned = opt._checked_to_write(params, grad_dict, state)
        return update(params._twin(), aligned, twinned(state))

    def update_alone() -> object:
        return update(params._twin(), grad_dict, twinned(state))

    ours = optim_scale._ours(name, keys, values, grads, optim_scale.IN_PLACE_COMPILED)
    theirs = optim_scale._torch(name, values, grads, optim_scale.FOREACH_COMPILED)
    return {
        "torch.compile(opt.step_)": ours,
        "checks, then the compiled update": checks_then_update,
        "the compiled update alone": update_alone,
        "torch's compiled foreach step": theirs,
    }


def compiled(names: list[str], rounds: int) -> None:
    """Print the parts of each optimizer's compiled `step_`, interleaved."""
    for name in names:
        parts = _compiled_parts(name)
        for part in parts.values():
            for _ in range(3):  # compile, then warm
                part()
        times: dict[str, list[float]] = {label: [] for label in parts}
        for _ in range(rounds):
            for label, part in parts.items():
                start = time.process_time()
                part()
                times[label].append(time.process_time() - start)
        print(f"{name} at {optim_scale.WIDE}, medians of {rounds} rounds:")
        for label, samples in times.items():
            print(f"  {label:36s} {statistics.median(samples) * 1e3:8.2f} ms")


def _one(name: str, size: str, mode: str, steps: int) -> None:
    """One candidate in this process: CPU ms and minor page faults per step."""
    keys, values, grads = optim_scale._data(SIZES[size])
    if mode == optim_scale.FOREACH:
        step = optim_scale._torch(name, values, grads, mode)
    else:
        step = optim_scale._ours(name, keys, values, grads, mode)
    for _ in range(3):
        step()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.process_time()
    for _ in range(steps):
        step()
    elapsed = (time.process_time() - start) / steps
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps
    print(f"  {mode:24s} {elapsed * 1e3:8.1f} ms/step {faults:10.0f} faults/step")


def faults(names: list[str], size: str, steps: int) -> None:
    """Print each candidate's CPU time and page faults per step, fresh processes."""
    for name in names:
        print(f"{name} at {SIZES[size]}, each in a fresh process, {steps} steps:")
        for mode in FAULT_MODES:
            command = [sys.executable, __file__, "one", "--names", name]
            command += ["--size", size, "--mode", mode, "--steps", str(steps)]
            subprocess.run(command, check=True)


def main() -> None:
    """Parse the command line and run what it asks for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("what", choices=("compiled", "faults", "one"))
    parser.add_argument("--names", required=True, help="comma-separated optimizers")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--size", choices=tuple(SIZES), default="wide")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--mode", choices=FAULT_MODES, default=OURS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.names.split(",")
    if args.what == "compiled":
        compiled(names, args.rounds)
    elif args.what == "faults":
        faults(names, args.size, args.steps)
    else:
        _one(names[0], args.size, args.mode, args.steps)


if __name__ == "__main__":
    main()
