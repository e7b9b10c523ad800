"""A small timing harness: candidates measured side by side in one process.

Every candidate is a no-argument callable. `compare` times them interleaved (each
round runs every candidate once, in a rotating order, so drift in machine load hits
all of them alike), after a warm-up, on one thread unless told otherwise, with the
garbage collector paused while a sample runs, and reports the median time per call
over the rounds.

    timings = compare({"fast": lambda: f(x), "slow": lambda: g(x)})
    print(format_table([("case", timings)], baseline="slow"))
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "Timing",
    "compare",
    "format_seconds",
    "format_table",
    "run_fresh",
    "single_thread",
    "torch_threads",
]


@dataclass(frozen=True)
class Timing:
    """The samples of one candidate.

    Attributes:
        name: The candidate's name.
        samples: Seconds per call, one value per round.
        number: Calls per round (chosen so a round lasts about the target time).
    """

    name: str
    samples: tuple[float, ...]
    number: int

    @property
    def median(self) -> float:
        """The median seconds per call over the rounds."""
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """The interquartile range relative to the median (0.05 means 5%)."""
        if len(self.samples) < 4:
            return (max(self.samples) - min(self.samples)) / self.median
        q1, _, q3 = statistics.quantiles(self.samples, n=4)
        return (q3 - q1) / self.median


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with torch on `count` intra-op threads, then restore it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def single_thread() -> contextlib.AbstractContextManager[None]:
    """Run the block with torch on one intra-op thread, then restore the setting."""
    return torch_threads(1)


Clock = Callable[[], float]


def _time(fn: Callable[[], object], number: int, clock: Clock) -> float:
    start = clock()
    for _ in range(number):
        fn()
    return clock() - start


def _calibrate(fn: Callable[[], object], target: float, clock: Clock) -> int:
    """Return how many calls take about `target` seconds (at least one)."""
    number = 1
    while True:
        elapsed = _time(fn, number, clock)
        if elapsed >= target / 4 or number >= 1 << 20:
            return max(1, round(number * target / max(elapsed, 1e-9)))
        number *= 4


def compare(
    candidates: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 15,
    target: float = 0.01,
    warmup: int = 2,
    threads: int = 1,
    clock: Clock = time.perf_counter,
) -> dict[str, Timing]:
    """Time `candidates` interleaved on one thread; return each one's `Timing`.

    Args:
        candidates: Names and no-argument callables to time.
        rounds: How many samples each candidate gets (the median is over them).
        target: Roughly how long one sample lasts, in seconds.
        warmup: Untimed rounds run first.
        threads: Torch intra-op threads while timing.
        clock: The clock: wall time (`time.perf_counter`) or the process's CPU
            time (`time.process_time`, less sensitive to other processes).

    Returns:
        The timings, in the order of `candidates`.
    """
    names = list(candidates)
    with torch_threads(threads):
        numbers = {name: _calibrate(candidates[name], target, clock) for name in names}
        for _ in range(warmup):
            for name in names:
                _time(candidates[name], numbers[name], clock)
        samples: dict[str, list[float]] = {name: [] for name in names}
        gc_was_enabled = gc.isenabled()
        # Everything alive now (torch's own objects included) is set aside, so the
        # collection before each sample only walks what the candidates left behind.
        gc.collect()
        gc.freeze()
        try:
            for i in range(rounds):
                shift = i % len(names)
                for name in names[shift:] + names[:shift]:
                    gc.collect()
                    gc.disable()
                    elapsed = _time(candidates[name], numbers[name], clock)
                    if gc_was_enabled:
                        gc.enable()
                    samples[name].append(elapsed / numbers[name])
        finally:
            gc.unfreeze()
            if gc_was_enabled:
                gc.enable()
    return {name: Timing(name, tuple(samples[name]), numbers[name]) for name in names}


def format_seconds(seconds: float) -> str:
    """Format a duration with a unit that keeps three significant digits."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_table(
    cases: Sequence[tuple[str, Mapping[str, Timing]]], *, baseline: str | None = None
) -> str:
    """Return a Markdown table of medians, spreads and ratios.

    Args:
        cases: Pairs of a case label and its timings (from `compare`).
        baseline: The candidate name to divide by in the ratio column; `None`
            uses each case's first candidate.

    Returns:
        The table, one row per candidate, as Markdown text.
    """
    lines = [
        "| case | candidate | median | spread | ratio |",
        "|---|---|---:|---:|---:|",
    ]
    for label, timings in cases:
        base_name = next(iter(timings))
        if baseline is not None and baseline in timings:
            base_name = baseline
        base = timings[base_name].median
        for name, timing in timings.items():
            lines.append(
                f"| {label} | {name} | {format_seconds(timing.median)} | "
                f"{timing.spread:.1%} | {timing.median / base:.2f}x |"
            )
    return "\n".join(lines)


def run_fresh(
    args: Sequence[str], *, threads: int, what: str, bytecode: bool = False
) -> Any:
    """Run `python ARGS` in a fresh process from the repository root; parse its answer.

    The process sees the checkout on `PYTHONPATH` and `threads` intra-op threads, and
    answers with JSON on its last line of output. With `bytecode`, it may write and
    read compiled bytecode (`__pycache__`) even where `PYTHONDONTWRITEBYTECODE` is
    set, as an installed package has it: import times then measure the import, not
    the compilation of the sources.

    Raises:
        RuntimeError: If the process fails; the message holds its standard error.
    """
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        check=False,
    )
    if done.returncode != 0:
        msg = f"{what} in a fresh process failed:\n{done.stderr}"
        raise RuntimeError(msg)
    return json.loads(done.stdout.strip().splitlines()[-1])
