"""The parameter update and the global norm: ParamDict against plain-torch code.

Run `python -m benchmarks.update` (add `--quick` for a smoke run of a few seconds).
Each case times a ParamDict expression beside the plain-torch code it replaces, at
160 entries of 64 elements and at 8 entries of 1,600, single-threaded, interleaved,
and prints the medians, the ratio and whether the target holds:

- `p.sub(g, alpha=lr)` within 1.10x of a bare `torch._foreach_add(values, grads,
  alpha=-lr)` on prepared lists plus rebuilding the dict;
- `p - lr * g` at least 1.3x faster than `{k: p[k] - lr * g[k] for k in p}`;
- `p.norm()` at least 3x faster than
  `torch.stack([v.norm() for v in p.values()]).norm()`.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from paramdict import ParamDict

from ._timing import Timing, compare, format_seconds, format_table

SIZES = ((160, 64), (8, 1600))
LR = 0.01


@dataclass(frozen=True)
class Case:
    """Two candidates and the target their ratio must meet.

    Attributes:
        name: What is measured.
        ours: The ParamDict expression.
        reference: The plain-torch code it replaces.
        limit: The target for `ours / reference` (at most) when `faster` is false,
            or for `reference / ours` (at least) when it is true.
        faster: Whether the target is a speed-up rather than an overhead bound.
    """

    name: str
    ours: Callable[[], object]
    reference: Callable[[], object]
    limit: float
    faster: bool

    def verdict(self, timings: dict[str, Timing]) -> tuple[float, bool, str]:
        """Return the ratio, whether the target holds, and the target in words."""
        ours = timings["ParamDict"].median
        ref = timings["reference"].median
        if self.faster:
            ratio = ref / ours
            return ratio, ratio >= self.limit, f">= {self.limit:.2f}x faster"
        ratio = ours / ref
        return ratio, ratio <= self.limit, f"<= {self.limit:.2f}x the reference"


def _data(entries: int, elements: int) -> tuple[ParamDict, ParamDict]:
    gen = torch.Generator().manual_seed(0)

    def make() -> ParamDict:
        return ParamDict(
            {
                f"layers.{i}.weight": torch.randn(elements, generator=gen)
                for i in range(entries)
            }
        )

    return make(), make()


def cases(entries: int, elements: int) -> list[Case]:
    """Return the cases at one size."""
    p, g = _data(entries, elements)
    keys = list(p)
    values = list(p.values())
    grads = list(g.values())

    def bare_sub() -> dict[str, torch.Tensor]:
        return dict(zip(keys, torch._foreach_add(values, grads, alpha=-LR)))

    def comprehension() -> dict[str, torch.Tensor]:
        return {k: p[k] - LR * g[k] for k in p}

    def stacked_norm() -> torch.Tensor:
        norm: torch.Tensor = torch.stack([v.norm() for v in p.values()]).norm()
        return norm

    return [
        Case("p.sub(g, alpha=lr)", lambda: p.sub(g, alpha=LR), bare_sub, 1.10, False),
        Case("p - lr * g", lambda: p - LR * g, comprehension, 1.3, True),
        Case("p.norm()", p.norm, stacked_norm, 3.0, True),
    ]


def _check_agreement(case: Case) -> None:
    """Refuse to time candidates that compute different things."""
    ours, ref = case.ours(), case.reference()
    if isinstance(ours, torch.Tensor) and isinstance(ref, torch.Tensor):
        torch.testing.assert_close(ours, ref)
        return
    assert isinstance(ours, ParamDict)
    assert isinstance(ref, dict)
    assert ours.allclose(ref)


def run(*, sizes: Sequence[tuple[int, int]], rounds: int, target: float) -> bool:
    """Time every case at every size, print tables; return whether all targets hold."""
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.machine()}; 1 thread, {rounds} interleaved rounds, medians\n"
    )
    rows: list[tuple[str, dict[str, Timing]]] = []
    summary = []
    all_met = True
    for entries, elements in sizes:
        for case in cases(entries, elements):
            _check_agreement(case)
            timings = compare(
                {"ParamDict": case.ours, "reference": case.reference},
                rounds=rounds,
                target=target,
            )
            label = f"{case.name} @ {entries}x{elements}"
            rows.append((label, timings))
            ratio, met, goal = case.verdict(timings)
            all_met = all_met and met
            summary.append(
                f"| {label} | {format_seconds(timings['ParamDict'].median)} | "
                f"{format_seconds(timings['reference'].median)} | {ratio:.2f}x | "
                f"{goal} | {'met' if met else 'MISSED'} |"
            )
    print(format_table(rows, baseline="reference"))
    print()
    print("| case | ParamDict | reference | ratio | target | result |")
    print("|---|---:|---:|---:|---|---|")
    print("\n".join(summary))
    return all_met


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
    target = 0.002 if args.quick else 0.02
    run(sizes=SIZES, rounds=rounds, target=target)


if __name__ == "__main__":
    main()
