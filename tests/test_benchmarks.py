"""The benchmark suite keeps working: its smoke mode runs and writes its report.

Nothing here is about speed: the quick mode takes few, short samples, and the test
checks only that every section ran (or said why it was skipped) and that the files
are complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _torch_versions import torch_at_least

from benchmarks._agree import check_agreement

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = [
    "update",
    "grad",
    "pytree",
    "optim",
    "optim-scale",
    "optim-papers",
    "adapter",
    "maml",
    "memory",
    "cnn",
    "cnn-memory",
    "imaml",
    "import",
    "gpu",
]
GOALS = [
    "`p.sub(g, alpha=lr)` within 1.10x of bare foreach",
    "`p - lr * g` at least 1.3x faster than the dict comprehension",
    "`p.grad(loss)` within 1.05x of `torch.autograd.grad`",
    "MAML meta-iteration within 1.05x of plain dicts",
    "MAML meta-iteration faster than higher",
    "MAML peak memory within 1.05x of plain dicts",
    "CNN MAML (second order, loop) within 1.02x of plain dicts",
    "CNN MAML (first order, loop) within 1.02x of plain dicts",
    "CNN MAML peak memory (second order, loop) within 1.02x of plain dicts",
    "iMAML peak memory flat from 5 to 100 inner steps",
    "`import paramdict` under 30 ms",
]


def test_quick_run_writes_the_report(tmp_path: Path) -> None:
    """`python -m benchmarks --quick --out DIR` runs each section, writes both files."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    payload = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert payload["meta"]["quick"] is True
    assert payload["meta"]["threads"] == 1
    assert [s["key"] for s in payload["sections"]] == SECTIONS
    for section in payload["sections"]:
        assert section["rows"] or section["notes"], section["key"]
        for row in section["rows"]:
            assert row["median"]["ParamDict"] > 0, (section["key"], row["case"])
    (optim,) = [s for s in payload["sections"] if s["key"] == "optim"]
    cases = {row["case"] for row in optim["rows"]}
    assert "LBFGS step, line_search_fn='strong_wolfe'" in cases
    # Muon's row needs torch.optim.Muon to time against (torch 2.9 on).
    assert ("Muon step" in cases) is torch_at_least(2, 9)
    goals = [t["goal"] for s in payload["sections"] for t in s["targets"]]
    for goal in GOALS:
        assert any(g.startswith(goal) for g in goals), goal
    report = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "## Targets" in report
    assert "### MAML meta-iteration" in report
    assert "second order, ParamDict, vmap: refused, not timed" in report
    assert report in done.stdout


def test_candidates_that_disagree_are_refused() -> None:
    """A candidate whose result differs from ParamDict's stops the run, named."""
    keys = ["a", "b"]
    ours = {"a": torch.zeros(2), "b": torch.ones(2)}
    theirs = {"a": torch.zeros(2), "b": torch.full((2,), 2.0)}
    with pytest.raises(AssertionError, match="other differs from ParamDict at 'b'"):
        check_agreement(
            {"ParamDict": ours, "other": theirs}, keys, reference="ParamDict"
        )


def test_results_given_as_lists_are_matched_by_position() -> None:
    """A list result is compared entry by entry in key order."""
    keys = ["a", "b"]
    ours = {"a": torch.zeros(2), "b": torch.ones(2)}
    check_agreement(
        {"ParamDict": ours, "lists": [torch.zeros(2), torch.ones(2)]},
        keys,
        reference="ParamDict",
    )
    with pytest.raises(AssertionError, match="lists differs from ParamDict at 'a'"):
        check_agreement(
            {"ParamDict": ours, "lists": [torch.ones(2), torch.zeros(2)]},
            keys,
            reference="ParamDict",
        )
