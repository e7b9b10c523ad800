"""The optimizer sections build, check and time every optimizer (at tiny sizes here).

Nothing here is about speed: model-scale shapes are swapped for tiny ones, and the
tests check that each optimizer's candidates agree and come back as a row.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from benchmarks import _runner, optim_scale
from benchmarks import optim as small
from benchmarks._report import OURS, Config, Row
from paramdict import ParamDict, optim

TINY_GPT2 = [
    ("wte.weight", (40, 8)),
    ("h.0.ln_1.weight", (8,)),
    ("h.0.attn.c_attn.weight", (8, 24)),
    ("h.0.attn.c_attn.bias", (24,)),
]


def _tiny(size: str) -> list[tuple[str, tuple[int, ...]]]:
    if size == optim_scale.GPT2:
        return TINY_GPT2
    return [(f"layers.{i}.weight", (50,)) for i in range(3)]


def _config() -> Config:
    return Config(
        quick=False,
        rounds=1,
        target=1e-4,
        warmup=0,
        threads=1,
        processes=1,
        sizes=((3, 50),),
        clock="cpu",
    )


def test_every_optimizer_is_in_a_section() -> None:
    """Both sections name every optimizer `paramdict.optim` exports (found, not listed).

    An optimizer is an exported class with `init` and `step` that wraps no other
    (`ParamGroups`, `ClipGradNorm` and `MultiSteps` take optimizers); SGD runs
    with momentum.
    """
    wrappers = {"ParamGroups", "ClipGradNorm", "MultiSteps", "TorchOptimizer"}
    found = {
        name
        for name in optim.__all__
        if isinstance(getattr(optim, name), type)
        and hasattr(getattr(optim, name), "init")
        and hasattr(getattr(optim, name), "step")
        and not issubclass(getattr(optim, name), optim.LRSchedule)
        and name not in wrappers | {"Optimizer", "ReduceLROnPlateau"}
    }
    everything = {"SGD momentum" if n == "SGD" else n for n in found}
    assert {"Adam", "SGD momentum", "LBFGS", "Lion"} <= everything
    assert set(small.OPTIMIZERS) == everything
    assert set(optim_scale.OPTIMIZERS) == everything | {
        optim_scale.SCHEDULED,
        optim_scale.RECIPE,
    }


@pytest.mark.parametrize("name", [n for n in optim_scale.SETTINGS if n != "Muon"])
def test_model_scale_rows_agree_and_carry_their_targets(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each optimizer is timed at both sizes against torch's paths, targets beside."""
    monkeypatch.setattr(optim_scale, "shapes", _tiny)
    paths = optim_scale.torch_paths(name)
    for size in (optim_scale.WIDE, optim_scale.GPT2):
        wanted = optim_scale.model_candidates(name, size)
        assert wanted[:2] == [OURS, optim_scale.IN_PLACE]
        assert wanted[2 : 2 + len(paths)] == paths
    uncompiled = [optim_scale.WIDE, optim_scale.GPT2]

    def eager(name: str, size: str) -> list[str]:
        return [OURS, optim_scale.IN_PLACE, *optim_scale.torch_paths(name)]

    # compiling each optimizer takes minutes here
    monkeypatch.setattr(optim_scale, "model_candidates", eager)
    rows, targets, notes = optim_scale._model_rows(name, _config())
    assert notes == []
    assert [r.size for r in rows] == uncompiled
    for row in rows:
        assert row.case == f"{name} step"
        assert list(row.medians) == [OURS, optim_scale.IN_PLACE, *paths]
        assert all(m > 0 for m in row.medians.values())
    assert [t.goal for t in targets] == [
        f"{name}: {what} within {limit} of {paths[0]}, {size}"
        for size in uncompiled
        for what, limit in (("`step_`", "1.10x"), ("default `step`", "1.30x"))
    ]
    assert all(t.met is not None for t in targets)


def test_torch_paths_are_read_from_torch_s_signatures() -> None:
    """Fused where torch's class takes `fused`, else foreach, else its loop."""
    assert optim_scale.torch_paths("Adam") == [optim_scale.FUSED, optim_scale.FOREACH]
    assert optim_scale.torch_paths("RAdam") == [optim_scale.FOREACH]
    assert optim_scale.torch_paths("Lion") == [optim_scale.FOREACH]  # _lion.py's
    assert optim_scale.torch_paths("Muon") == [optim_scale.FOR_LOOP]


def test_compiled_candidates_cover_every_optimizer_that_compiles() -> None:
    """At 50 x 400,000 every optimizer but Muon gets both compiled candidates."""
    for name in optim_scale.SETTINGS:
        wide = optim_scale.model_candidates(name, optim_scale.WIDE)
        gpt2 = optim_scale.model_candidates(name, optim_scale.GPT2)
        both = {optim_scale.IN_PLACE_COMPILED, optim_scale.FOREACH_COMPILED}
        assert both <= set(wide) or name in optim_scale.UNCOMPILED
        assert not both & set(gpt2)
    assert optim_scale.UNCOMPILED == ("Muon",)


def test_model_scale_muon_rows_agree_and_carry_their_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Muon runs on GPT-2 small's matrices only, against torch's loop."""
    monkeypatch.setattr(optim_scale, "shapes", _tiny)
    rows, targets, notes = optim_scale._model_rows("Muon", _config())
    assert notes == []
    assert [r.size for r in rows] == ["GPT-2 small (2 matrices)"]
    assert list(rows[0].medians) == [OURS, optim_scale.IN_PLACE, optim_scale.FOR_LOOP]
    assert len(targets) == 2


@pytest.mark.parametrize("name", ["RAdam", "Adam"])
def test_memory_rows_take_every_torch_path(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The peak-memory row measures ours and each of torch's paths, in workers."""
    calls: list[list[str]] = []

    def fake(args: list[str], **kwargs: object) -> dict[str, float]:
        calls.append(args)
        return {"bytes": 1000.0 + len(calls)}

    monkeypatch.setattr(optim_scale, "run_fresh", fake)
    row = optim_scale._memory_row(name, optim_scale.WIDE, _config())
    assert next(iter(row.medians)) == OURS
    assert set(row.medians) == set(optim_scale.memory_candidates(name))
    assert [c[-1] for c in calls] == list(optim_scale.memory_candidates(name))
    assert row.unit == "B"


def test_memory_worker_measures_a_foreach_only_optimizer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker runs a torch path other than fused and reports bytes."""
    monkeypatch.setattr(optim_scale, "shapes", _tiny)
    for mode in optim_scale.memory_candidates("RAdam"):
        result = optim_scale._memory_worker("RAdam", optim_scale.WIDE, mode)
        assert isinstance(result["bytes"], int | float)


def test_model_scale_lbfgs_rows_agree_and_are_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LBFGS gets one row per line search, against torch's closure-based step."""
    monkeypatch.setattr(optim_scale, "shapes", _tiny)
    rows = optim_scale._lbfgs_rows(_config())
    assert [r.case for r in rows] == [
        "LBFGS step, line_search_fn=None",
        "LBFGS step, line_search_fn='strong_wolfe'",
    ]
    for row in rows:
        assert list(row.medians) == [OURS, optim_scale.CLOSURE]


def test_model_scale_scheduled_row_agrees_and_is_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AdamW with warm-up + cosine is timed against torch's foreach and fused."""
    monkeypatch.setattr(optim_scale, "shapes", _tiny)
    row = optim_scale._scheduled_row(_config())
    assert row.case == f"{optim_scale.SCHEDULED} step"
    assert list(row.medians) == [
        OURS,
        optim_scale.IN_PLACE,
        optim_scale.FOREACH,
        optim_scale.FUSED,
    ]
    assert all(m > 0 for m in row.medians.values())


def test_model_scale_recipe_row_agrees_and_is_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The nanoGPT recipe is timed, `step` and `step_` against torch's fused path."""
    monkeypatch.setattr(optim_scale, "shapes", _tiny)
    row = optim_scale._recipe_row(_config())
    assert row.case.startswith(f"{optim_scale.RECIPE} step")
    assert row.size == optim_scale.GPT2
    assert list(row.medians) == [OURS, optim_scale.IN_PLACE, optim_scale.FUSED]
    assert all(m > 0 for m in row.medians.values())


def test_model_scale_recipe_candidates_agree_with_torch_over_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ours and torch's recipe give the same parameters over 5 steps (1e-5)."""
    monkeypatch.setattr(optim_scale, "shapes", _tiny)
    keys, values, grads = optim_scale._data(optim_scale.GPT2)
    second = [g.flip(0) for g in grads]
    micro = [dict(zip(keys, grads)), dict(zip(keys, second))]
    scaled = [[g / 2 for g in grads], [g / 2 for g in second]]
    ours = {
        mode: optim_scale._recipe_ours(
            ParamDict(zip(keys, [v.clone() for v in values])),
            [ParamDict(m) for m in micro],
            mode,
        )
        for mode in (OURS, optim_scale.IN_PLACE)
    }
    theirs = optim_scale._recipe_torch(values, scaled)
    for _ in range(5):
        expected = theirs()
        assert isinstance(expected, list)
        for run in ours.values():
            got = run()
            assert isinstance(got, ParamDict)
            for a, b in zip(got.values(), expected, strict=True):
                torch.testing.assert_close(a, b.detach(), rtol=1e-5, atol=1e-6)


def test_muon_matrices_keep_each_size_s_element_count() -> None:
    """Muon's matrices are as square as each element count allows."""
    assert [small.matrix_shape(n) for n in (1600, 64, 16, 12, 7)] == [
        (40, 40),
        (8, 8),
        (4, 4),
        (3, 4),
        (1, 7),
    ]


def test_optimizers_option_picks_rows(tmp_path: Path) -> None:
    """`--optimizers Muon,LBFGS` times only those two in the optim section."""
    picked = ["--optimizers", "Muon,LBFGS"]
    _runner.main(["--quick", "--only", "optim", *picked, "--out", str(tmp_path)])
    payload = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"))
    assert payload["meta"]["optimizers"] == ["Muon", "LBFGS"]
    (section,) = payload["sections"]
    assert [r["case"] for r in section["rows"]] == [
        "Muon step",
        "LBFGS step, line_search_fn=None",
        "LBFGS step, line_search_fn='strong_wolfe'",
    ]
    assert list(section["rows"][0]["median"]) == [OURS, small.TORCH_LOOP]
    assert list(section["rows"][1]["median"]) == [OURS, small.TORCH_CLOSURE]
    assert section["targets"][0]["met"] is None  # Adam, the target's row, not run


def test_unknown_optimizers_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """An optimizer name neither section knows stops the command, named."""
    with pytest.raises(SystemExit, match="2"):
        _runner.main(["--quick", "--only", "optim", "--optimizers", "Adam,Lamb"])
    assert "unknown optimizers ['Lamb']" in capsys.readouterr().err


def test_a_differing_compiled_candidate_is_dropped_and_others_raise() -> None:
    """`_agree` returns a droppable candidate that differs and raises for others."""
    same = [torch.ones(3)]
    other = [torch.zeros(3)]
    candidates: dict[str, Callable[[], object]] = {
        optim_scale.FOREACH: lambda: same,
        optim_scale.IN_PLACE_COMPILED: lambda: other,
    }
    dropped = optim_scale._agree(
        candidates,
        reference=optim_scale.FOREACH,
        droppable=[optim_scale.IN_PLACE_COMPILED],
    )
    assert dropped == [optim_scale.IN_PLACE_COMPILED]
    with pytest.raises(AssertionError, match="compiled"):
        optim_scale._agree(candidates, reference=optim_scale.FOREACH)


def test_small_section_targets_sit_beside_their_rows() -> None:
    """Adam's `step_`, Adafactor and both LBFGS searches get a target per size."""
    config = dataclasses.replace(_config(), sizes=((160, 64),))

    def row(case: str, medians: dict[str, float]) -> Row:
        samples = {n: [m] for n, m in medians.items()}
        return Row(case, "160 x 64", medians, dict.fromkeys(medians, 0.0), samples)

    rows = [
        row("Adam step", {OURS: 2.0, small.IN_PLACE: 1.0, small.FUSED: 1.0}),
        row("Adafactor step", {OURS: 1.2, small.TORCH: 1.0}),
    ]
    targets = small._small_targets(rows, config)
    assert [t.met for t in targets] == [True, False, None, None]
    assert targets[0].goal.endswith("(fused), 160 x 64")
    assert targets[2].goal.startswith("LBFGS step, line_search_fn=None")


def test_a_dropped_compiled_candidate_s_target_reads_not_measured() -> None:
    """At 50 x 400,000 the compiled target is printed even when its row lacks it."""
    medians = {OURS: 2.0, optim_scale.IN_PLACE: 1.0, optim_scale.FOREACH: 1.0}
    samples = {n: [m] for n, m in medians.items()}
    row = Row(
        "RAdam step", optim_scale.WIDE, medians, dict.fromkeys(medians, 0.0), samples
    )
    targets = optim_scale._model_targets("RAdam", row)
    assert [t.met for t in targets] == [True, False, None]
    assert "torch.compile(opt.step_)" in targets[2].goal
