"""What a benchmark section returns, and how the runner writes it as Markdown and JSON.

A `Section` holds rows of medians (one row per case and size, one column per
candidate), the targets it checked and notes (peers that were skipped). Ratios are
always "this candidate over ParamDict", taken round by round (see `Row.ratio`): above
1 means slower (or bigger) than ParamDict.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import _device
from ._timing import Timing, compare, format_seconds

__all__ = [
    "OURS",
    "Config",
    "Row",
    "Section",
    "Target",
    "format_bytes",
    "format_value",
    "ratio_target",
    "render_markdown",
]

OURS = "ParamDict"
"""The candidate every ratio divides by."""

Unit = Literal["s", "B"]


@dataclass(frozen=True)
class Config:
    """How long and how often to measure.

    Attributes:
        quick: A smoke run: few, short samples; the numbers are rough.
        rounds: Interleaved samples per candidate (the median is over them).
        target: Roughly how long one timing sample lasts, in seconds.
        warmup: Untimed rounds before the samples.
        threads: Torch intra-op threads (also for the subprocesses).
        processes: Fresh processes per candidate for memory and import times.
        sizes: `(entries, elements)` pairs for the per-size cases.
        clock: `"wall"` (elapsed time) or `"cpu"` (this process's CPU time, less
            disturbed by other processes on a shared machine).
        optimizers: The optimizers the optimizer sections measure, by name
            (`--optimizers`); empty for all.
        compile: Whether the model-scale section times `torch.compile`d steps
            (`--no-compile` leaves them out: each compiles for minutes on a GPU).
    """

    quick: bool
    rounds: int
    target: float
    warmup: int
    threads: int
    processes: int
    sizes: tuple[tuple[int, int], ...]
    clock: Literal["wall", "cpu"] = "wall"
    optimizers: tuple[str, ...] = ()
    compile: bool = True

    def time(self, candidates: Mapping[str, Callable[[], object]]) -> dict[str, Timing]:
        """Time `candidates` side by side with these settings (see `compare`)."""
        return compare(
            candidates,
            rounds=self.rounds,
            target=self.target,
            warmup=self.warmup,
            threads=self.threads,
            clock=_device.clock(
                time.process_time if self.clock == "cpu" else time.perf_counter
            ),
        )


@dataclass(frozen=True)
class Row:
    """One case at one size: every candidate's median and spread.

    Attributes:
        case: What is computed.
        size: The problem size, in words.
        medians: Candidate name to median (seconds or bytes).
        spreads: Candidate name to interquartile range over the median.
        samples: Candidate name to every sample, for the JSON file.
        unit: `"s"` for seconds, `"B"` for bytes.
    """

    case: str
    size: str
    medians: dict[str, float]
    spreads: dict[str, float]
    samples: dict[str, list[float]]
    unit: Unit = "s"

    @classmethod
    def from_timings(cls, case: str, size: str, timings: Mapping[str, Timing]) -> Row:
        """Build a row from `compare`'s result."""
        return cls(
            case,
            size,
            {name: t.median for name, t in timings.items()},
            {name: t.spread for name, t in timings.items()},
            {name: list(t.samples) for name, t in timings.items()},
        )

    def ratio(self, name: str, /, over: str = OURS) -> float:
        """Return how many times `over`'s cost `name`'s is, round by round.

        The median over rounds of `name`'s sample divided by `over`'s sample of the
        same round: samples of one round are taken back to back, under the same
        load, so a burst of load on a shared machine cancels out of each quotient.
        Falls back to the quotient of the medians where a sample is zero.
        """
        pairs = list(zip(self.samples[name], self.samples[over]))
        if pairs and all(below > 0 for _, below in pairs):
            return statistics.median(above / below for above, below in pairs)
        return self.medians[name] / self.medians[over]


@dataclass(frozen=True)
class Target:
    """A goal from the issue, and whether this run met it.

    Attributes:
        goal: The goal, in words.
        measured: What was measured, in words (ratio and medians).
        met: Whether the goal holds; `None` when it could not be measured.
    """

    goal: str
    measured: str
    met: bool | None

    @property
    def verdict(self) -> str:
        """`met`, `MISSED` or `not measured`."""
        if self.met is None:
            return "not measured"
        return "met" if self.met else "MISSED"


@dataclass
class Section:
    """A group of related cases, as one table.

    Attributes:
        key: Short name, for `--only`.
        title: Heading.
        method: What exactly is timed, in a sentence or two.
        rows: The measurements.
        targets: The goals checked on them.
        notes: Anything left out and why.
    """

    key: str
    title: str
    method: str
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """Return the section as JSON-ready data."""
        return {
            "key": self.key,
            "title": self.title,
            "method": self.method,
            "rows": [
                {
                    "case": r.case,
                    "size": r.size,
                    "unit": r.unit,
                    "median": r.medians,
                    "spread": r.spreads,
                    "samples": r.samples,
                }
                for r in self.rows
            ],
            "targets": [
                {"goal": t.goal, "measured": t.measured, "met": t.met}
                for t in self.targets
            ],
            "notes": self.notes,
        }


def format_bytes(count: float) -> str:
    """Format a byte count in KiB (below 10 MiB) or MiB."""
    if abs(count) >= 10 * 2**20:
        return f"{count / 2**20:,.1f} MiB"
    return f"{count / 2**10:,.0f} KiB"


def format_value(value: float, unit: Unit) -> str:
    """Format a median in its unit."""
    return format_bytes(value) if unit == "B" else format_seconds(value)


def _section_markdown(section: Section) -> list[str]:
    lines = [f"### {section.title}", "", section.method, ""]
    if section.rows:
        lines += [
            f"| case | size | candidate | median | spread | vs {OURS} |",
            "|---|---|---|---:|---:|---:|",
        ]
        for row in section.rows:
            for name, median in row.medians.items():
                ratio = f"{row.ratio(name):.2f}x" if OURS in row.medians else ""
                lines.append(
                    f"| {row.case} | {row.size} | {name} | "
                    f"{format_value(median, row.unit)} | {row.spreads[name]:.1%} | "
                    f"{ratio} |"
                )
        lines.append("")
    lines += [f"- {note}" for note in section.notes]
    if section.notes:
        lines.append("")
    return lines


def render_markdown(header: list[str], sections: list[Section]) -> str:
    """Return the whole report: header lines, the targets, then every section."""
    lines = [*header, "", "## Targets", ""]
    lines += ["| target | measured | result |", "|---|---|---|"]
    for section in sections:
        lines += [f"| {t.goal} | {t.measured} | {t.verdict} |" for t in section.targets]
    lines += ["", "## Results", ""]
    for section in sections:
        lines += _section_markdown(section)
    return "\n".join(lines).rstrip() + "\n"


def ratio_target(
    goal: str,
    row: Row | None,
    numerator: str,
    denominator: str,
    limit: float,
    *,
    at_least: bool = False,
) -> Target:
    """Check `numerator / denominator` against `limit` on one row.

    Args:
        goal: The goal, in words.
        row: The measurements; `None` (or a missing candidate) means not measured.
        numerator: The candidate on top of the ratio.
        denominator: The candidate below.
        limit: The bound on the ratio.
        at_least: Whether the ratio must reach `limit` (a speed-up) rather than
            stay within it (an overhead).

    Returns:
        The verdict, with the ratio and both medians in words.
    """
    if row is None or numerator not in row.medians or denominator not in row.medians:
        return Target(goal, "a candidate was not measured", None)
    ratio = row.ratio(numerator, over=denominator)
    met = ratio >= limit if at_least else ratio <= limit
    measured = (
        f"{ratio:.2f}x (medians: {numerator} "
        f"{format_value(row.medians[numerator], row.unit)}, {denominator} "
        f"{format_value(row.medians[denominator], row.unit)})"
    )
    return Target(goal, measured, met)
