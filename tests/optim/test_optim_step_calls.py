"""A step's Python calls stay within the bound of the design: `scripts/step_calls.py`.

A repeated `AdamW.step_` with a `SequentialLR` schedule at 50 x 16 enters at most 60
Python frames in paramdict's own files, and no more in all (torch's Python code
included) than torch's `AdamW(fused=True)` with its `SequentialLR`. Call counts are
deterministic, so this is a plain test, not a timing; a change that adds a frame per
schedule state or per tensor fails it. Every optimizer's `step_` makes no more calls
in all than torch's fastest step of the same optimizer.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
from _helpers import script

ROOT = Path(__file__).resolve().parents[2]
OURS_AT_MOST = 60


@pytest.fixture(scope="module")
def step_calls() -> ModuleType:
    """Import `scripts/step_calls.py` (not a package) as a module."""
    return script("step_calls")


@pytest.fixture(autouse=True)
def _no_other_profiler() -> None:
    if sys.getprofile() is not None:  # pragma: no cover - a profiler's own run
        pytest.skip("another profiler is installed; counts would include its frames")


@pytest.mark.parametrize("scheduled", [False, True], ids=["constant", "SequentialLR"])
def test_adamw_step_in_place_calls_are_bounded(
    step_calls: ModuleType, scheduled: bool
) -> None:
    ours = step_calls.ours("AdamW", "step_", scheduled)
    theirs = step_calls.theirs("AdamW", scheduled)
    assert ours.ours <= OURS_AT_MOST, (ours.ours, ours.all)
    assert ours.all <= theirs.all, (ours.all, theirs.all)


AT_MOST_TORCH = [
    "SGD",
    "Adam",
    "Adagrad",
    "Adadelta",
    "NAdam",
    "RAdam",
    "Adamax",
    "RMSprop",
    "Rprop",
    "ASGD",
    "Adafactor",
]


@pytest.mark.parametrize("scheduled", [False, True], ids=["constant", "SequentialLR"])
@pytest.mark.parametrize("name", AT_MOST_TORCH)
def test_step_in_place_makes_no_more_calls_than_torch(
    step_calls: ModuleType, name: str, scheduled: bool
) -> None:
    ours = step_calls.ours(name, "step_", scheduled)
    theirs = step_calls.theirs(name, scheduled)
    assert ours.all <= theirs.all, (ours.ours, ours.all, theirs.all)
