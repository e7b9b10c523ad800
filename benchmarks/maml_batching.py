"""The MAML demo's meta-gradient: tasks in a Python loop against `torch.func.vmap`.

Run `python -m benchmarks.maml_batching` (add `--quick` for a smoke run of a few
seconds). It times `examples.maml_sinusoid.meta_gradient` on one meta-batch of 25
sinusoid tasks with the demo's 1-40-40-1 MLP, for both batchings and both orders,
single-threaded and interleaved, after checking that the two batchings agree, and
prints the medians with the loop as the baseline of each order.
"""

from __future__ import annotations

import argparse
import functools
import platform
from collections.abc import Callable, Sequence

import torch

from examples import maml_sinusoid as demo
from paramdict import ParamDict

from ._timing import Timing, compare, format_table

BATCHINGS: tuple[demo.Batching, ...] = ("loop", "vmap")


def run(*, rounds: int, target: float) -> None:
    """Check agreement, time both batchings for each order, print the table."""
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}; 1 thread, {rounds} interleaved rounds, medians\n"
    )
    torch.manual_seed(0)
    model = demo.make_model()
    params = ParamDict.from_module(model)
    tasks = demo.sample_tasks(
        demo.META_BATCH, generator=torch.Generator().manual_seed(0)
    )
    rows: list[tuple[str, dict[str, Timing]]] = []
    for first_order in (False, True):
        order = "first order" if first_order else "second order"
        loop, vmap = (
            demo.meta_gradient(
                params, model, tasks, first_order=first_order, batching=batching
            )
            for batching in BATCHINGS
        )
        torch.testing.assert_close(vmap, loop)  # refuse to time different results
        worst = max((loop[k] - vmap[k]).abs().max().item() for k in loop)
        print(f"{order}: the batchings agree, max |loop - vmap| = {worst:.1e}")
        candidates: dict[str, Callable[[], object]] = {
            batching: functools.partial(
                demo.meta_gradient,
                params,
                model,
                tasks,
                first_order=first_order,
                batching=batching,
            )
            for batching in BATCHINGS
        }
        timings = compare(candidates, rounds=rounds, target=target)
        rows.append((f"{order}, {demo.META_BATCH} tasks", timings))
    print()
    print(format_table(rows, baseline="loop"))


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of a few seconds (few, short rounds); numbers are rough",
    )
    parser.add_argument("--rounds", type=int, default=None, help="samples per case")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 25)
    target = 0.02 if args.quick else 0.2
    run(rounds=rounds, target=target)


if __name__ == "__main__":
    main()
