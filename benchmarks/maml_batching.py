"""MAML sinusoid demo: one meta-gradient, tasks in a Python loop vs `torch.func.vmap`.

Times `examples.maml_sinusoid.meta_gradient` on one meta-batch of 25 tasks, for
both batchings, both orders and 1 or 2 CPU threads, side by side in one process:
the cases run interleaved, round after round, and the table reports medians.
Run from the repository root:

    python -m benchmarks.maml_batching [--rounds 9] [--repeat 10]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch

from examples import maml_sinusoid as demo
from paramdict import ParamDict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = demo.make_model()
    params = ParamDict.from_module(model)
    tasks = demo.sample_tasks(
        demo.META_BATCH, generator=torch.Generator().manual_seed(0)
    )
    batchings: tuple[demo.Batching, ...] = ("loop", "vmap")
    cases = list(itertools.product((1, 2), batchings, (False, True)))

    # The two batchings agree (float32 rounding aside) before anything is timed.
    for first_order in (False, True):
        loop, vmap = (
            demo.meta_gradient(
                params, model, tasks, first_order=first_order, batching=b
            )
            for b in batchings
        )
        worst = max((loop[k] - vmap[k]).abs().max().item() for k in loop)
        print(f"first_order={first_order}: max |loop - vmap| = {worst:.2e}")

    times: dict[tuple[int, demo.Batching, bool], list[float]] = {c: [] for c in cases}
    for _ in range(args.rounds):
        for case in cases:
            threads, batching, first_order = case
            torch.set_num_threads(threads)
            demo.meta_gradient(
                params, model, tasks, first_order=first_order, batching=batching
            )
            start = time.perf_counter()
            for _ in range(args.repeat):
                demo.meta_gradient(
                    params, model, tasks, first_order=first_order, batching=batching
                )
            times[case].append((time.perf_counter() - start) / args.repeat)

    print(f"\nms per meta-gradient ({demo.META_BATCH} tasks), median of {args.rounds}")
    print(f"{'threads':>7}  {'batching':<8} {'order':<12} {'median':>8} {'min':>8}")
    for case, samples in times.items():
        threads, batching, first_order = case
        order = "first" if first_order else "second"
        print(
            f"{threads:>7}  {batching:<8} {order:<12} "
            f"{statistics.median(samples) * 1e3:>8.2f} {min(samples) * 1e3:>8.2f}"
        )


if __name__ == "__main__":
    main()
