"""paramdict.optim against torch.optim's foreach implementations, step for step.

Run `python -m benchmarks.optim` (add `--quick` for a smoke run of a few seconds).
Each optimizer's `step` is timed beside `torch.optim`'s with `foreach=True` on equal
tensors, single-threaded, interleaved, at 160 entries of 64 elements and at 8 of
1,600; the medians, ratios and the target are printed:

- `paramdict.optim.Adam.step` within 1.10x of `torch.optim.Adam(foreach=True).step()`
  at 160 entries of 64 (the other rows are for information).

The paramdict side is the full pure step, `params, state = opt.step(params, grads,
state)`: new parameters (fresh leaves that require grad, as in training) and a new
state every call. The torch side updates in place parameters whose `.grad` is set.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable, Sequence
from typing import Any

import torch

from paramdict import ParamDict, optim

from ._timing import Timing, compare, format_seconds, format_table

SIZES = ((160, 64), (8, 1600))
# name, paramdict optimizer, torch.optim class, shared keyword arguments
CASES: list[tuple[str, Callable[..., optim.Optimizer[Any]], Any, dict[str, Any]]] = [
    ("Adam", optim.Adam, torch.optim.Adam, {"lr": 1e-3}),
    ("AdamW", optim.AdamW, torch.optim.AdamW, {"lr": 1e-3}),
    ("SGD momentum", optim.SGD, torch.optim.SGD, {"lr": 1e-3, "momentum": 0.9}),
    ("RMSprop", optim.RMSprop, torch.optim.RMSprop, {"lr": 1e-3}),
    ("Adagrad", optim.Adagrad, torch.optim.Adagrad, {"lr": 1e-3}),
]
TARGET = ("Adam", (160, 64), 1.10)


def candidates(
    ours: Callable[..., optim.Optimizer[Any]],
    theirs: Any,
    kwargs: dict[str, Any],
    entries: int,
    elements: int,
) -> dict[str, Callable[[], object]]:
    """Return the two steps on equal tensors, after checking they agree."""
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(elements, generator=gen) for _ in range(entries)]
    grads = [torch.randn(elements, generator=gen) for _ in range(entries)]
    keys = [f"layers.{i}.weight" for i in range(entries)]

    opt = ours(**kwargs)
    params = ParamDict(zip(keys, [v.clone().requires_grad_() for v in values]))
    grad_dict = ParamDict(zip(keys, grads))
    current: list[Any] = [params, opt.init(params)]

    def step_ours() -> None:
        current[0], current[1] = opt.step(current[0], grad_dict, current[1])

    tensors = [v.clone().requires_grad_() for v in values]
    for tensor, grad in zip(tensors, grads):
        tensor.grad = grad.clone()
    torch_opt = theirs(tensors, foreach=True, **kwargs)

    # Same tensors, same steps: refuse to time two different computations.
    for _ in range(3):
        step_ours()
        torch_opt.step()
    torch.testing.assert_close(dict(current[0]), dict(zip(keys, tensors)))
    return {"paramdict": step_ours, "torch.optim": torch_opt.step}


def run(
    *,
    rounds: int,
    target: float,
    sizes: Sequence[tuple[int, int]] = SIZES,
    cases: Sequence[tuple[str, Any, Any, dict[str, Any]]] = CASES,
) -> bool:
    """Time every case at every size, print tables; return whether the target holds."""
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}; 1 thread, {rounds} interleaved rounds, medians\n"
    )
    rows: list[tuple[str, dict[str, Timing]]] = []
    summary = []
    met = True
    for entries, elements in sizes:
        for name, ours, theirs, kwargs in cases:
            with torch.inference_mode(False):
                runs = candidates(ours, theirs, kwargs, entries, elements)
            timings = compare(runs, rounds=rounds, target=target)
            label = f"{name}.step @ {entries}x{elements}"
            rows.append((label, timings))
            ratio = timings["paramdict"].median / timings["torch.optim"].median
            goal, verdict = "", ""
            if (name, (entries, elements)) == TARGET[:2]:
                goal = f"<= {TARGET[2]:.2f}x"
                ok = ratio <= TARGET[2]
                met = met and ok
                verdict = "met" if ok else "MISSED"
            summary.append(
                f"| {label} | {format_seconds(timings['paramdict'].median)} | "
                f"{format_seconds(timings['torch.optim'].median)} | {ratio:.2f}x | "
                f"{goal} | {verdict} |"
            )
    print(format_table(rows, baseline="torch.optim"))
    print()
    print("| case | paramdict | torch.optim foreach | ratio | target | result |")
    print("|---|---:|---:|---:|---|---|")
    print("\n".join(summary))
    return met


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of a few seconds (Adam only, short rounds); rough numbers",
    )
    parser.add_argument("--rounds", type=int, default=None, help="samples per case")
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 25)
    target = 0.005 if args.quick else 0.05
    if args.quick:
        run(rounds=rounds, target=target, sizes=SIZES[:1], cases=CASES[:1])
    else:
        run(rounds=rounds, target=target)


if __name__ == "__main__":
    main()
