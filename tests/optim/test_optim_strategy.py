"""One table picks every step's path, and the steps follow it."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path as FilePath
from typing import Any

import pytest
import torch

import paramdict.optim
from paramdict import ParamDict, optim
from paramdict.optim import _strategy
from paramdict.optim._strategy import Choice, Path

OPTIM = FilePath(paramdict.optim.__file__).parent


def _params() -> ParamDict:
    torch.manual_seed(0)
    return ParamDict(w=torch.randn(3, 2), b=torch.randn(2))


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The paths `choose` gave, in order, wherever a step asked it."""
    paths: list[Path] = []
    original = _strategy.choose

    def recorded(*args: Any, **kwargs: Any) -> Choice:
        choice = original(*args, **kwargs)
        paths.append(choice.path)
        return choice

    monkeypatch.setattr("paramdict.optim._protocol.choose", recorded)
    return paths


def _step(opt: optim.Optimizer[Any], params: ParamDict) -> None:
    opt.step(params, params.map(torch.ones_like), opt.init(params))


def _step_(opt: optim.Optimizer[Any], params: ParamDict) -> None:
    opt.step_(params, params.map(torch.ones_like), opt.init(params))


def _strided(params: ParamDict) -> ParamDict:
    """`w` as a view with gaps (`base[:, ::2]`): not writable by a fused kernel."""
    base = torch.zeros(3, 4)
    base[:, ::2] = params["w"]
    return ParamDict(w=base[:, ::2], b=params["b"])


ROWS: list[tuple[str, Callable[[], optim.Optimizer[Any]], Any, Any, Path]] = [
    ("recorded", lambda: optim.Adam(differentiable=True), _step, None, Path.RECORDED),
    ("fused copies", lambda: optim.Adam(), _step, None, Path.FUSED_COPIES),
    (
        "fused copies, strided",
        lambda: optim.Adam(),
        _step,
        _strided,
        Path.FUSED_COPIES,
    ),
    ("SGD: copies do not pay", lambda: optim.SGD(momentum=0.9), _step, None, Path.RULE),
    ("SGD fused=True", lambda: optim.SGD(fused=True), _step, None, Path.FUSED_COPIES),
    ("no kernel", lambda: optim.RMSprop(), _step, None, Path.RULE),
    ("fused=False", lambda: optim.Adam(fused=False), _step, None, Path.RULE),
    ("fused in place", lambda: optim.Adam(), _step_, None, Path.FUSED),
    ("in place, strided", lambda: optim.Adam(), _step_, _strided, Path.RULE),
    ("in place, no kernel", lambda: optim.NAdam(), _step_, None, Path.RULE),
    (
        "in place, tensor rate",
        lambda: optim.Adam(lr=torch.tensor(0.1)),
        _step_,
        None,
        Path.FUSED,
    ),
    (
        "fused copies, tensor rate",
        lambda: optim.Adam(lr=torch.tensor(0.1, dtype=torch.float64)),
        _step,
        None,
        Path.FUSED_COPIES,
    ),
    (
        "in place, per-key rate",
        lambda: optim.Adam(lr=_params().full_like(0.1)),
        _step_,
        None,
        Path.RULE,
    ),
    (
        "in place, tensor weight decay",
        lambda: optim.Adam(weight_decay=torch.tensor(0.1)),
        _step_,
        None,
        Path.RULE,
    ),
]


@pytest.mark.parametrize(
    ("opt", "run", "layout", "path"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_each_step_takes_the_path_the_table_gives(
    taken: list[Path],
    opt: Callable[[], optim.Optimizer[Any]],
    run: Callable[[optim.Optimizer[Any], ParamDict], None],
    layout: Callable[[ParamDict], ParamDict] | None,
    path: Path,
) -> None:
    params = _params()
    run(opt(), layout(params) if layout else params)
    assert taken == [path]


def test_a_transform_takes_the_traced_path(taken: list[Path]) -> None:
    opt = optim.Adam(lr=0.1)

    def one(w: torch.Tensor) -> torch.Tensor:
        params = ParamDict(w=w)
        return opt.step(params, params, opt.init(params))[0]["w"]

    out = torch.func.vmap(one)(torch.ones(4, 3))
    assert taken == [Path.TRACED]
    torch.testing.assert_close(out, torch.full((4, 3), 0.9))


def test_a_compiled_step_in_place_takes_the_traced_path() -> None:
    opt = optim.Adam(lr=0.1)
    params = _params()
    state = opt.init(params)

    def chosen(p: ParamDict) -> torch.Tensor:
        path = _strategy.choose(opt, p, state, in_place=True).path
        return p["w"] + (1.0 if path is Path.TRACED else 0.0)

    out = torch.compile(chosen, backend="eager", fullgraph=True)(params)
    torch.testing.assert_close(out, params["w"] + 1.0)


def test_the_fused_refusal_names_the_keys_and_writes_nothing() -> None:
    params = _strided(_params())
    opt = optim.Adam(lr=0.1, fused=True)
    state = opt.init(params)
    before = [t.clone() for t in (*params.values(), state.step)]
    with pytest.raises(ValueError, match=r"\['w'\].*fused=None"):
        opt.step_(params, params.map(torch.ones_like), state)
    for old, new in zip(before, (*params.values(), state.step), strict=True):
        assert torch.equal(old, new)


@pytest.mark.parametrize("transform", ["vmap", "grad"])
def test_step_in_place_under_a_transform_is_refused_and_writes_nothing(
    transform: str,
) -> None:
    params = _params()
    opt = optim.Adam(lr=0.1)
    state = opt.init(params)
    before = [t.clone() for t in (*params.values(), state.step)]

    def inside(x: torch.Tensor) -> torch.Tensor:
        opt.step_(params, params.map(lambda t: t * x.sum()), state)
        return x.sum()

    run = torch.func.vmap(inside) if transform == "vmap" else torch.func.grad(inside)
    with pytest.raises(ValueError, match=r"`torch.func` transform.*Call `step`"):
        run(torch.ones(2, 3))
    for old, new in zip(before, (*params.values(), state.step), strict=True):
        assert torch.equal(old, new)


# Calls that pick a path or test one of its conditions: only `_strategy.py`.
_DECIDERS = {"_fused_rates", "not_writable_by_kernel", "peek_interpreter_stack"}


def _calls(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else getattr(func, "id", "")
            )
            found.add(name)
    return found


def test_only_the_table_decides_a_path() -> None:
    offenders = {
        path.name: sorted(
            _calls(ast.parse(path.read_text(encoding="utf-8"))) & _DECIDERS
        )
        for path in sorted(OPTIM.rglob("*.py"))
        if path.name != "_strategy.py"
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert _calls(ast.parse((OPTIM / "_strategy.py").read_text())) >= _DECIDERS
