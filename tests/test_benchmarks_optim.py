"""The optimizer sections build, check and time every optimizer (at tiny sizes here).

Nothing here is about speed: model-scale shapes are swapped for tiny ones, and the
tests check that each optimizer's candidates agree and come back as a row.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _torch_versions import needs_torch

from benchmarks import _device, _runner, _table, optim_papers, optim_scale
from benchmarks import optim as small
from benchmarks._report import OURS, Config, Row
from paramdict import ParamDict, optim

# The table drops Muon's row on a torch without torch.optim.Muon (nothing to time
# it against): the tests that expect the row need that torch.
TORCH_MUON = needs_torch(
    2, 9, "torch.optim.Muon, which the benchmarks time Muon against"
)

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


@TORCH_MUON
def test_both_sections_time_the_table_s_optimizers() -> None:
    """Each section's optimizers are the table's rows plus its own extra rows.

    The table names every optimizer `paramdict.optim` exports (found, not listed)
    but LBFGS, which the sections time on inputs of their own, and the papers'
    optimizers (section optim-papers, against their packages): an optimizer is an
    exported class with `init` and `step` that wraps no other (`ParamGroups`,
    `ClipGradNorm` and `MultiSteps` take optimizers).
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
    rows = _table.entries()
    papers = set(optim_papers.OPTIONS)  # timed against their packages there
    assert {e.ours.__name__ for e in rows} | {"LBFGS"} | papers == found
    table = set(_table.names())
    assert {"Adam", "SGD momentum", "Muon", "Lion"} <= table
    assert set(small.optimizers()) == table | {"LBFGS"}
    assert set(optim_scale.optimizers()) == table | {
        "LBFGS",
        optim_scale.SCHEDULED,
        optim_scale.RECIPE,
        optim_scale.AVERAGE,
    }


@TORCH_MUON
def test_the_optim_section_times_every_row_of_the_table() -> None:
    """A run of the section at a tiny size has a row for each row of the table."""
    section = small.measure(_config())
    assert sorted(r.case for r in section.rows) == sorted(
        [
            *(f"{n} step" for n in _table.names()),
            "LBFGS step, line_search_fn=None",
            "LBFGS step, line_search_fn='strong_wolfe'",
        ]
    )
    by_case = {r.case: r for r in section.rows}
    assert list(by_case["Lion step"].medians) == [OURS, small.TORCH]  # TorchLion's
    assert list(by_case["Adam step"].medians) == [
        OURS,
        small.TORCH,
        small.IN_PLACE,
        small.FUSED,
    ]
    assert list(by_case["Muon step"].medians) == [OURS, small.TORCH_LOOP]
    assert by_case["Muon step"].size == "3 x 5 x 10"


def test_the_table_is_the_tests_own_module() -> None:
    """The benchmarks load the table under the tests' name: one table per process."""
    cases = sys.modules["optim_cases"]
    assert _table.entry("Lion").theirs is cases.TorchLion
    assert _table.entry("SGD momentum").options == {"lr": 1e-3, "momentum": 0.9}
    with pytest.raises(KeyError, match="'Lamb'"):
        _table.entry("Lamb")


def test_a_missing_pytest_is_named_when_the_table_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without pytest the table does not load, and the error says what to install."""
    monkeypatch.setattr(_table, "_NAME", "optim_cases_without_pytest")
    monkeypatch.setitem(sys.modules, "pytest", None)  # `import pytest` fails
    with pytest.raises(ImportError, match=r"imports pytest: install the test extra"):
        _table._load()
    assert "optim_cases_without_pytest" not in sys.modules


@pytest.mark.parametrize(
    "name", [e.name for e in _table.entries() if not e.matrices_only]
)
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
    eager = [OURS, optim_scale.IN_PLACE, *paths]
    assert optim_scale.model_candidates(name, optim_scale.WIDE, compiled=False) == eager
    # compiling each optimizer takes minutes here: `--no-compile`
    config = dataclasses.replace(_config(), compile=False)
    rows, targets, notes = optim_scale._model_rows(name, config)
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
    assert optim_scale.torch_paths("Lion") == [optim_scale.FOREACH]  # TorchLion's


@TORCH_MUON
def test_muon_s_torch_path_is_its_loop() -> None:
    """torch.optim.Muon takes neither `fused` nor `foreach`: its loop is timed."""
    assert optim_scale.torch_paths("Muon") == [optim_scale.FOR_LOOP]


@TORCH_MUON
def test_compiled_candidates_cover_every_optimizer_that_compiles() -> None:
    """At 50 x 400,000 every optimizer but Muon gets both compiled candidates."""
    for entry in _table.entries():
        wide = optim_scale.model_candidates(entry.name, optim_scale.WIDE)
        gpt2 = optim_scale.model_candidates(entry.name, optim_scale.GPT2)
        both = {optim_scale.IN_PLACE_COMPILED, optim_scale.FOREACH_COMPILED}
        assert both <= set(wide) or entry.matrices_only
        assert not both & set(gpt2)
    assert [e.name for e in _table.entries() if e.matrices_only] == ["Muon"]


@TORCH_MUON
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
    """The nanoGPT recipe is timed, `step` and `step_` against two torch paths."""
    monkeypatch.setattr(optim_scale, "shapes", _tiny)
    row = optim_scale._recipe_row(_config())
    assert row.case.startswith(f"{optim_scale.RECIPE} step")
    assert row.size == optim_scale.GPT2
    assert list(row.medians) == [
        OURS,
        optim_scale.IN_PLACE,
        optim_scale.FUSED,
        optim_scale.FOREACH,
    ]
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
    both = [optim_scale._recipe_torch(values, scaled, fused=f) for f in (True, False)]
    for _ in range(5):
        expected, foreach = (theirs() for theirs in both)
        assert isinstance(expected, list)
        assert isinstance(foreach, list)
        for a, b in zip(expected, foreach, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
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


@TORCH_MUON
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


def test_device_option_is_checked_and_defaults_to_the_cpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--device` names where the optimizer sections run; a missing one is refused."""
    assert _device.current() == torch.device("cpu")
    assert _device.clock(time.perf_counter) is time.perf_counter  # nothing to wait for
    assert _table.entry("Adagrad").fused  # torch's Adagrad kernel is the CPU's
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            _runner.main(["--only", "optim", "--device", "cuda"])
        assert "torch sees no CUDA device" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _runner.main(["--only", "optim", "--device", "mps:7"])
    assert "measure on 'cpu' or 'cuda'" in capsys.readouterr().err
    assert _device.current() == torch.device("cpu")  # left as it was


def test_compare_reads_each_row_against_its_torch_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`benchmarks.compare` divides each row's ratio in the new runs by the old's."""
    from benchmarks import compare

    def run(name: str, ours: list[float], foreach: list[float]) -> Path:
        row = {
            "case": "Adam step",
            "size": "160 x 64",
            "unit": "s",
            "samples": {
                "ParamDict": ours,
                "torch.optim (foreach)": foreach,
                "torch.optim (fused)": [1.0] * len(ours),
            },
        }
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"sections": [{"rows": [row]}]}), encoding="utf-8")
        return path

    old = run("old", [2.0, 2.0, 2.0], [1.0, 1.0, 1.0])  # ratio 2.0
    new = run("new", [3.0, 3.0, 3.0], [2.0, 2.0, 2.0])  # ratio 1.5
    assert compare.row_ratios(old) == {
        ("Adam step", "160 x 64"): ("torch.optim (foreach)", 2.0)
    }
    compare.main(["--old", str(old), "--new", str(new)])
    out = capsys.readouterr().out
    assert (
        "| Adam step | 160 x 64 | torch.optim (foreach) | 2.00 | 1.50 | 0.750 |" in out
    )
