"""What an optimizer step pays besides its arithmetic: page faults.

A diagnostic beside the benchmarks (their ratios are the claims), on the CPU, one
thread, with `benchmarks.optim_scale`'s data and candidates:

- `faults`: each candidate (ours `step` and `step_`, torch's foreach step) in a
  fresh process: CPU ms per step and the minor page faults per step (from
  `getrusage`), which count fresh memory the operating system hands over.

Usage:
    python scripts/step_costs.py faults --names Adamax [--size gpt2]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import optim_scale
from benchmarks._report import OURS

SIZES = {"wide": optim_scale.WIDE, "gpt2": optim_scale.GPT2}
FAULT_MODES = (OURS, optim_scale.IN_PLACE, optim_scale.FOREACH)


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
    parser.add_argument("what", choices=("faults", "one"))
    parser.add_argument("--names", required=True, help="comma-separated optimizers")
    parser.add_argument("--size", choices=tuple(SIZES), default="wide")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--mode", choices=FAULT_MODES, default=OURS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.names.split(",")
    if args.what == "faults":
        faults(names, args.size, args.steps)
    else:
        _one(names[0], args.size, args.mode, args.steps)


if __name__ == "__main__":
    main()
