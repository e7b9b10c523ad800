"""Compare benchmark runs of two trees: each row's ratio to its reference, new over old.

    python -m benchmarks.compare --old old/results.json --new new/results.json

Each run times ParamDict beside torch in one process, so a row's ratio (ParamDict's
median over round-by-round quotients against the row's torch candidate) is
steadier across runs than either time. For every row present in all runs this
prints the mean ratio of the new runs over the mean of the old runs, the new tree's
cost relative to the old one's (above 1.00 slower), with each run's ratio beside it,
sorted from the largest.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "row_ratios"]

OURS = "ParamDict"


def _reference(candidates: Sequence[str]) -> str | None:
    """The row's torch candidate: its first that is not torch's fused kernel."""
    torch_paths = [c for c in candidates if c.startswith("torch")]
    unfused = [c for c in torch_paths if "fused" not in c]
    found = unfused or torch_paths
    return found[0] if found else None


def row_ratios(path: Path) -> dict[tuple[str, str], tuple[str, float]]:
    """Each row's `(reference, ParamDict / reference)` from one `results.json`."""
    payload: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    ratios: dict[tuple[str, str], tuple[str, float]] = {}
    for section in payload["sections"]:
        for row in section["rows"]:
            samples: dict[str, list[float]] = row["samples"]
            reference = _reference(list(samples))
            if OURS not in samples or reference is None or row.get("unit") == "B":
                continue
            quotients = [
                a / b for a, b in zip(samples[OURS], samples[reference], strict=True)
            ]
            ratios[(row["case"], row["size"])] = (
                reference,
                statistics.median(quotients),
            )
    return ratios


def main(argv: Sequence[str] | None = None) -> None:
    """Print, for every row in all runs, the new runs' ratio over the old ones'."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description="Each row's ratio to its torch path, new runs over old runs.",
    )
    parser.add_argument("--old", type=Path, nargs="+", required=True)
    parser.add_argument("--new", type=Path, nargs="+", required=True)
    args = parser.parse_args(argv)
    old = [row_ratios(p) for p in args.old]
    new = [row_ratios(p) for p in args.new]
    shared: set[tuple[str, str]] = set(old[0])
    for ratios in [*old, *new]:
        shared &= set(ratios)
    lines: list[tuple[float, str]] = []
    for key in shared:
        before = statistics.fmean(r[key][1] for r in old)
        after = statistics.fmean(r[key][1] for r in new)
        each = ", ".join(f"{r[key][1]:.2f}" for r in old)
        each_new = ", ".join(f"{r[key][1]:.2f}" for r in new)
        lines.append(
            (
                after / before,
                f"| {key[0]} | {key[1]} | {new[0][key][0]} | {each} | {each_new} | "
                f"{after / before:.3f} |",
            )
        )
    print("| case | size | against | old runs | new runs | new / old |")
    print("|---|---|---|---:|---:|---:|")
    for _, line in sorted(lines, reverse=True):
        print(line)


if __name__ == "__main__":
    main()
