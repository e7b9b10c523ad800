"""paramdict.optim against torch.optim's foreach implementations, step for step.

Run with `python -m benchmarks.optim` (add `--quick` for a short run). Single
thread; both sides run interleaved in one process on equal tensors; the figures
are medians over rounds of the time per `step`.

- paramdict: `params, state = opt.step(params, grads, state)` (out of place, new
  leaves that require grad, as in training).
- torch: `opt.step()` with `foreach=True` on parameters whose `.grad` is set.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from paramdict import ParamDict, optim

# name, paramdict optimizer, torch optimizer class, shared keyword arguments
CASES: list[tuple[str, Callable[..., optim.Optimizer[Any]], Any, dict[str, Any]]] = [
    ("Adam", optim.Adam, torch.optim.Adam, {"lr": 1e-3}),
    ("AdamW", optim.AdamW, torch.optim.AdamW, {"lr": 1e-3}),
    ("SGD momentum", optim.SGD, torch.optim.SGD, {"lr": 1e-3, "momentum": 0.9}),
    ("RMSprop", optim.RMSprop, torch.optim.RMSprop, {"lr": 1e-3}),
    ("Adagrad", optim.Adagrad, torch.optim.Adagrad, {"lr": 1e-3}),
]
SHAPES = [(160, 64), (8, 1600)]


def _median_seconds(
    runs: dict[str, Callable[[], None]], *, rounds: int, number: int, warmup: int
) -> dict[str, float]:
    """Time each callable `number` times per round, interleaved; return medians."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        # Alternate the order so neither side always runs on a warmer cache.
        for name in names if r % 2 == 0 else names[::-1]:
            run = runs[name]
            start = time.perf_counter()
            for _ in range(number):
                run()
            samples[name].append((time.perf_counter() - start) / number)
    return {name: statistics.median(s) for name, s in samples.items()}


def _case(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Any,
    kwargs: dict[str, Any],
    entries: int,
    size: int,
) -> dict[str, Callable[[], None]]:
    generator = torch.Generator().manual_seed(0)
    values = [torch.randn(size, generator=generator) for _ in range(entries)]
    grads = [torch.randn(size, generator=generator) for _ in range(entries)]
    keys = [f"layer{i}.weight" for i in range(entries)]

    params = ParamDict(zip(keys, [v.clone().requires_grad_() for v in values]))
    grad_dict = ParamDict(zip(keys, grads))
    opt = ours(**kwargs)
    box = [params, opt.init(params)]

    def run_ours() -> None:
        box[0], box[1] = opt.step(box[0], grad_dict, box[1])

    torch_params = [v.clone().requires_grad_() for v in values]
    for p, g in zip(torch_params, grads):
        p.grad = g.clone()
    torch_opt = theirs(torch_params, foreach=True, **kwargs)

    def run_torch() -> None:
        torch_opt.step()

    return {"paramdict": run_ours, "torch": run_torch}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Adam only, few rounds")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rounds, number, warmup = (7, 20, 20) if args.quick else (31, 50, 100)
    cases = CASES[:1] if args.quick else CASES
    shapes = SHAPES[:1] if args.quick else SHAPES
    print(
        f"torch {torch.__version__}, 1 thread, median of {rounds} rounds x {number} "
        "steps"
    )
    print(f"{'case':<16}{'entries x size':>16}{'paramdict':>12}{'torch':>12}{'ratio':>8}")
    with torch.inference_mode(False):
        for entries, size in shapes:
            for name, ours, theirs, kwargs in cases:
                runs = _case(ours, theirs, kwargs, entries, size)
                t = _median_seconds(runs, rounds=rounds, number=number, warmup=warmup)
                ratio = t["paramdict"] / t["torch"]
                print(
                    f"{name:<16}{f'{entries} x {size}':>16}"
                    f"{t['paramdict'] * 1e6:>10.1f}us{t['torch'] * 1e6:>10.1f}us"
                    f"{ratio:>7.2f}x"
                )


if __name__ == "__main__":
    main()
