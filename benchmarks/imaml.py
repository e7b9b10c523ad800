"""Peak memory of one meta-iteration against the inner steps: iMAML and MAML.

Both candidates are the sinusoid example's own code (`examples/imaml_sinusoid.py`):
one meta-gradient on a meta-batch of 25 tasks (K = 10, MLP 1-40-40-1, float32,
the tasks batched with `torch.func.vmap`), with N inner steps:

- `ParamDict` (iMAML): N proximal steps recorded nowhere, then the implicit
  meta-gradient from `implicit_proximal` (5 CG iterations of keyed HVPs);
- `MAML (second order)`: N SGD steps unrolled in the graph, differentiated through.

Each sample runs in a fresh process (`python -m benchmarks.imaml --peak-memory NAME
--steps N`), which reports the growth of the resident set's high-water mark over one
meta-iteration after a warm-up, as the `memory` section does. The workers run with
glibc's mmap threshold fixed (`MALLOC_MMAP_THRESHOLD_=65536`): left dynamic, it moves
with the sizes freed before, and the growth of the same computation varied by 20 to
40% between processes (a few percent with it fixed).

Part of `python -m benchmarks` (run only this with `--only imaml`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from paramdict import ParamDict

from ._report import OURS, Config, Row, Section, Target, format_bytes
from ._timing import run_fresh
from .maml import _peak, _reset_peak

__all__ = ["measure"]

MAML = "MAML (second order)"
STEPS = (5, 10, 25, 50, 100)
QUICK_STEPS = (5, 100)
FLAT = 1.10
"""iMAML's peak at the most steps over its peak at the fewest stays within this."""


def _meta_gradient(name: str, steps: int, tasks: int = 25) -> Callable[[], ParamDict]:
    from examples import imaml_sinusoid as demo
    from examples.maml_sinusoid import make_model, sample_tasks

    torch.manual_seed(0)
    model = make_model()
    params = ParamDict.from_module(model)
    batch = sample_tasks(tasks, generator=torch.Generator().manual_seed(1))
    if name == OURS:
        return lambda: params.grad(demo.meta_loss(params, model, batch, steps=steps))
    return lambda: params.grad(demo.maml_loss(params, model, batch, steps=steps))


def _memory_worker(name: str, steps: int) -> dict[str, Any]:
    """Run one meta-iteration in this process; return the peak growth."""
    warm = _meta_gradient(name, 1, tasks=1)
    fn = _meta_gradient(name, steps)
    warm()  # first calls initialize lazily (dispatcher tables, autograd engine)
    gc.collect()
    exact = _reset_peak()
    before = _peak()
    grads = fn()
    after = _peak()
    del grads
    return {"name": name, "steps": steps, "bytes": after - before, "reset": exact}


MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""Set for the workers: a fixed mmap threshold makes the high-water mark repeatable."""


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block (the fresh processes inherit them)."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def measure(config: Config) -> Section:
    """Measure the peak-memory growth at each number of inner steps, fresh processes."""
    steps = QUICK_STEPS if config.quick else STEPS
    section = Section(
        "imaml",
        "iMAML and MAML: peak memory against the inner steps",
        "Growth of the resident set's high-water mark over one float32 "
        "meta-gradient of the sinusoid example (25 tasks batched with vmap, K = 10, "
        "MLP 1-40-40-1) with N inner steps: iMAML (`implicit_proximal`, 5 CG "
        "iterations) as ParamDict, and second-order MAML unrolled; each sample in a "
        "fresh process after a warm-up, with glibc's mmap threshold fixed at 64 KiB; "
        "medians.",
    )
    names = (OURS, MAML)
    medians: dict[str, dict[int, float]] = {name: {} for name in names}
    exact = True
    for n in steps:
        samples: dict[str, list[float]] = {name: [] for name in names}
        for i in range(config.processes):
            for name in names if i % 2 == 0 else names[::-1]:
                with _environment(MALLOC):
                    result = run_fresh(
                        [
                            "-m",
                            "benchmarks.imaml",
                            "--peak-memory",
                            name,
                            "--steps",
                            str(n),
                        ],
                        threads=config.threads,
                        what=f"The memory worker for {name} at {n} steps",
                    )
                samples[name].append(float(result["bytes"]))
                exact = exact and bool(result["reset"])
        row_medians = {name: statistics.median(s) for name, s in samples.items()}
        for name in names:
            medians[name][n] = row_medians[name]
        section.rows.append(
            Row(
                "peak memory growth",
                f"{n} inner steps",
                row_medians,
                {
                    name: (max(s) - min(s)) / row_medians[name]
                    if row_medians[name]
                    else 0.0
                    for name, s in samples.items()
                },
                samples,
                unit="B",
            )
        )
    if not exact:
        section.notes.append(
            "The high-water mark could not be reset on this system; growths are "
            "measured against the lifetime peak and may be too low."
        )
    low, high = steps[0], steps[-1]
    ours = medians[OURS][high] / medians[OURS][low]
    theirs = medians[MAML][high] / medians[MAML][low]
    section.targets.append(
        Target(
            f"iMAML peak memory flat from {low} to {high} inner steps (within "
            f"{FLAT:.2f}x)",
            f"{ours:.2f}x ({format_bytes(medians[OURS][low])} -> "
            f"{format_bytes(medians[OURS][high])})",
            ours <= FLAT,
        )
    )
    section.targets.append(
        Target(
            f"second-order MAML peak memory grows from {low} to {high} inner steps",
            f"{theirs:.2f}x ({format_bytes(medians[MAML][low])} -> "
            f"{format_bytes(medians[MAML][high])})",
            theirs > FLAT,
        )
    )
    section.notes.append(
        f"{config.processes} process(es) per candidate and size; the spread is "
        "(max - min) / median."
    )
    return section


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-memory", choices=[OURS, MAML], required=True)
    parser.add_argument("--steps", type=int, default=STEPS[0])
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    print(json.dumps(_memory_worker(args.peak_memory, args.steps)))


if __name__ == "__main__":
    _main()
