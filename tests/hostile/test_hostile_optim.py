"""Hostile input to the optimizers: a clear error naming the culprit, nothing changed.

Every case hands an optimizer (each row of the shared case table, `ParamGroups`,
`ClipGradNorm`) or `step_module` something a careless or hostile caller might,
and checks that the error is of the right kind, names the key or argument, and
that params, grads, state (and the module) are bit-identical afterwards.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.utils import _pytree as pytree

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "optim"))
from optim_cases import TABLE as ROWS  # the shared optimizer case table

from paramdict import ParamDict, optim

# Optimizers of 2-D entries (Muon) have a section of their own below.
TABLE = [case for case in ROWS if not case.matrices_only]
MATRIX_ROWS = [case for case in ROWS if case.matrices_only]

np: Any
try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy ships with every torch wheel we test
    np = None


def _params() -> ParamDict:
    return ParamDict(w=torch.tensor([1.0, -2.0, 3.0]), b=torch.tensor([0.5, 0.25]))


def _grads() -> ParamDict:
    return ParamDict(w=torch.tensor([0.1, 0.2, -0.3]), b=torch.tensor([1.0, -1.0]))


def _optimizers() -> list[tuple[str, Callable[[], optim.Optimizer[Any]]]]:
    rows: list[tuple[str, Callable[[], optim.Optimizer[Any]]]] = [
        (case.name, case.make) for case in TABLE
    ]
    rows.append(
        (
            "groups",
            lambda: optim.ParamGroups(
                {"b": optim.Adam()}, default=optim.SGD(lr=0.1, momentum=0.9)
            ),
        )
    )
    rows.append(("clip", lambda: optim.ClipGradNorm(optim.Adam(), max_norm=1.0)))
    return rows


def _snapshot(tree: Any) -> list[Any]:
    return [
        leaf.clone() if isinstance(leaf, Tensor) else leaf
        for leaf in pytree.tree_leaves(tree)
    ]


def _assert_unchanged(before: list[Any], tree: Any) -> None:
    after = pytree.tree_leaves(tree)
    assert len(after) == len(before)
    for old, new in zip(before, after):
        if isinstance(old, Tensor):
            assert isinstance(new, Tensor)
            torch.testing.assert_close(new, old, rtol=0, atol=0, equal_nan=True)


# ------------------------------------------------------------ bad step arguments

# Each: (id, how to spoil the `(params, grads, state)` triple, error, match).
Spoil = Callable[[ParamDict, ParamDict, Any], tuple[Any, Any, Any]]


def _with(grads: ParamDict, **entries: Any) -> dict[str, Any]:
    return {**grads, **entries}


def _other_state(params: ParamDict, state: Any = None) -> Any:
    """A state of another optimizer (RMSprop's, or SGD's for RMSprop)."""
    if isinstance(state, optim.RMSpropState):
        return optim.SGD(momentum=0.5).init(params)
    return optim.RMSprop(momentum=0.5, centered=True).init(params)


def _tampered(state: Any, key: str, value: Tensor) -> Any:
    """The state with `value` under `key` in its first non-empty buffer."""
    if isinstance(state, tuple) and not hasattr(state, "_fields"):  # ParamGroups
        return tuple(_tampered(sub, key, value) for sub in state)
    fields = list(state)
    for i, field in enumerate(fields):
        if isinstance(field, ParamDict) and key in field:
            fields[i] = field | {key: value}
            break
    return type(state)(*fields)


STEP_CASES: list[tuple[str, Spoil, type[Exception], str]] = [
    (
        "grads-extra-key",
        lambda p, g, s: (p, _with(g, x=torch.ones(1)), s),
        ValueError,
        r"'x'",
    ),
    ("grads-missing-key", lambda p, g, s: (p, {"w": g["w"]}, s), ValueError, r"'b'"),
    ("grads-empty", lambda p, g, s: (p, {}, s), ValueError, r"'b', 'w'"),
    (
        "grads-shape-3x1",
        lambda p, g, s: (p, _with(g, w=g["w"][:, None]), s),
        ValueError,
        r"'w'",
    ),
    (
        "grads-shape-1x3",
        lambda p, g, s: (p, _with(g, w=g["w"][None]), s),
        ValueError,
        r"'w'",
    ),
    (
        "grads-0-dim",
        lambda p, g, s: (p, _with(g, w=torch.tensor(1.0)), s),
        ValueError,
        r"'w'",
    ),
    (
        "grads-float64",
        lambda p, g, s: (p, _with(g, w=g["w"].double()), s),
        ValueError,
        r"'w'",
    ),
    (
        "grads-float16",
        lambda p, g, s: (p, _with(g, w=g["w"].half()), s),
        ValueError,
        r"'w'",
    ),
    (
        "grads-complex64",
        lambda p, g, s: (p, _with(g, w=g["w"].to(torch.complex64)), s),
        ValueError,
        r"'w'",
    ),
    (
        "grads-int64",
        lambda p, g, s: (p, _with(g, w=torch.ones(3, dtype=torch.int64)), s),
        ValueError,
        r"'w'",
    ),
    (
        "grads-meta",
        lambda p, g, s: (p, _with(g, w=torch.empty(3, device="meta")), s),
        ValueError,
        r"'w'",
    ),
    (
        "grads-sparse",
        lambda p, g, s: (p, _with(g, w=g["w"].to_sparse()), s),
        (TypeError, ValueError),  # type: ignore[list-item]  # either names the key
        r"'w'",
    ),
    (
        "grads-value-none",
        lambda p, g, s: (p, _with(g, w=None), s),
        TypeError,
        r"'w'",
    ),
    (
        "grads-value-list",
        lambda p, g, s: (p, _with(g, w=[0.1, 0.2, 0.3]), s),
        TypeError,
        r"'w'",
    ),
    (
        "grads-value-float",
        lambda p, g, s: (p, _with(g, w=0.5), s),
        TypeError,
        r"'w'",
    ),
    ("grads-none", lambda p, g, s: (p, None, s), TypeError, r"`grads`"),
    ("grads-list", lambda p, g, s: (p, list(g.values()), s), TypeError, r"`grads`"),
    ("grads-tensor", lambda p, g, s: (p, g["w"], s), TypeError, r"`grads`"),
    ("params-dict", lambda p, g, s: (dict(p), g, s), TypeError, r"ParamDict"),
    ("params-none", lambda p, g, s: (None, g, s), TypeError, r"ParamDict"),
    ("params-list", lambda p, g, s: (list(p.values()), g, s), TypeError, r"ParamDict"),
    ("state-none", lambda p, g, s: (p, g, None), TypeError, r"state"),
    ("state-dict", lambda p, g, s: (p, g, {"step": 0}), TypeError, r"state"),
    ("state-list", lambda p, g, s: (p, g, [s]), TypeError, r"state"),
    ("state-other", lambda p, g, s: (p, g, _other_state(p, s)), TypeError, r"state"),
    (
        "state-buffer-shape",
        lambda p, g, s: (p, g, _tampered(s, "w", torch.zeros(3, 1))),
        ValueError,
        r"'w'",
    ),
    (
        "state-buffer-dtype",
        lambda p, g, s: (p, g, _tampered(s, "w", torch.zeros(3).double())),
        ValueError,
        r"'w'",
    ),
    (
        "state-buffer-meta",
        lambda p, g, s: (p, g, _tampered(s, "w", torch.empty(3, device="meta"))),
        ValueError,
        r"'w'",
    ),
]


def _step_params() -> list[Any]:
    return [
        pytest.param(make, spoil, error, match, id=f"{name}-{case}")
        for name, make in _optimizers()
        for case, spoil, error, match in STEP_CASES
    ]


@pytest.mark.parametrize(("make", "spoil", "error", "match"), _step_params())
def test_bad_step_input_is_refused_and_nothing_changes(
    make: Callable[[], optim.Optimizer[Any]],
    spoil: Spoil,
    error: type[Exception],
    match: str,
) -> None:
    """A bad argument to `step` raises naming it; inputs are bit-identical after."""
    opt = make()
    params = _params()
    state = opt.init(params)
    args = spoil(params, _grads(), state)
    before = _snapshot(args)
    with pytest.raises(error, match=match):
        opt.step(*args)
    _assert_unchanged(before, args)


@pytest.mark.parametrize(("make", "spoil", "error", "match"), _step_params())
def test_bad_in_place_step_input_is_refused_and_nothing_changes(
    make: Callable[[], optim.Optimizer[Any]],
    spoil: Spoil,
    error: type[Exception],
    match: str,
) -> None:
    """A bad argument to `step_` raises as for `step`; nothing is written."""
    opt = make()
    params = _params()
    state = opt.init(params)
    args = spoil(params, _grads(), state)
    before = _snapshot(args)
    with pytest.raises(error, match=match):
        opt.step_(*args)
    _assert_unchanged(before, args)


def test_numpy_gradients_are_refused() -> None:
    """A numpy array is not a gradient; the key is named."""
    if np is None:
        pytest.skip("numpy is not installed")
    for _, make in _optimizers():
        opt = make()
        params = _params()
        state = opt.init(params)
        before = _snapshot((params, state))
        with pytest.raises(TypeError, match=r"'w'"):
            opt.step(params, {"w": np.ones(3), "b": torch.ones(2)}, state)
        _assert_unchanged(before, (params, state))


def test_state_of_a_smaller_param_set_is_refused() -> None:
    """A state built for other keys is refused naming the keys."""
    params = _params()
    for case in TABLE:
        opt = case.make()
        state = opt.init(params.select("w"))
        if all(isinstance(b, ParamDict) and not b for b in list(state)[1:]):
            continue  # no buffers to compare
        with pytest.raises(ValueError, match=r"'b'"):
            opt.step(params, _grads(), state)


# ------------------------------------------------------------ bad configurations

BAD_CONFIG: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("lr-nan", {"lr": math.nan}, ValueError, r"`lr`"),
    ("lr-inf", {"lr": math.inf}, ValueError, r"`lr`"),
    ("lr-negative", {"lr": -1.0}, ValueError, r"`lr`"),
    ("lr-string", {"lr": "0.1"}, TypeError, r"`lr`"),
    ("lr-none", {"lr": None}, TypeError, r"`lr`"),
    ("lr-list", {"lr": [0.1]}, TypeError, r"`lr`"),
    ("lr-bool", {"lr": True}, TypeError, r"`lr`"),
    ("lr-1d-tensor", {"lr": torch.ones(1)}, ValueError, r"`lr`"),
    ("lr-int-tensor", {"lr": torch.tensor(1)}, TypeError, r"`lr`"),
    ("lr-complex", {"lr": 1j}, TypeError, r"`lr`"),
    ("weight-decay-nan", {"weight_decay": math.nan}, ValueError, r"`weight_decay`"),
    ("weight-decay-inf", {"weight_decay": math.inf}, ValueError, r"`weight_decay`"),
    ("weight-decay-negative", {"weight_decay": -0.1}, ValueError, r"`weight_decay`"),
    ("weight-decay-dict", {"weight_decay": {"w": 0.1}}, TypeError, r"`weight_decay`"),
    ("maximize-string", {"maximize": "yes"}, TypeError, r"`maximize`"),
    ("maximize-none", {"maximize": None}, TypeError, r"`maximize`"),
    ("differentiable-int", {"differentiable": 1}, TypeError, r"`differentiable`"),
    ("unknown-option", {"learning_rate": 0.1}, TypeError, r"learning_rate"),
]

EXTRA_CONFIG: dict[str, list[tuple[str, dict[str, Any], type[Exception], str]]] = {
    "sgd": [
        ("momentum-nan", {"momentum": math.nan}, ValueError, r"`momentum`"),
        ("momentum-negative", {"momentum": -0.9}, ValueError, r"`momentum`"),
        ("dampening-string", {"dampening": "0"}, TypeError, r"`dampening`"),
        ("nesterov-no-momentum", {"nesterov": True}, ValueError, r"`nesterov"),
    ],
    "adam": [
        ("betas-above-one", {"betas": (1.5, 0.9)}, ValueError, r"`betas\[0\]`"),
        ("betas-negative", {"betas": (0.9, -0.1)}, ValueError, r"`betas\[1\]`"),
        ("betas-nan", {"betas": (math.nan, 0.9)}, ValueError, r"`betas\[0\]`"),
        ("betas-list", {"betas": [0.9, 0.999]}, TypeError, r"`betas`"),
        ("betas-triple", {"betas": (0.9, 0.9, 0.9)}, TypeError, r"`betas`"),
        ("eps-negative", {"eps": -1e-8}, ValueError, r"`eps`"),
        ("eps-nan", {"eps": math.nan}, ValueError, r"`eps`"),
        ("eps-inf", {"eps": math.inf}, ValueError, r"`eps`"),
    ],
    "adamw": [
        ("betas-one", {"betas": (0.9, 1.0)}, ValueError, r"`betas\[1\]`"),
        ("eps-string", {"eps": "1e-8"}, TypeError, r"`eps`"),
        ("decoupled-option", {"decoupled_weight_decay": False}, TypeError, r"decoup"),
    ],
    "rmsprop": [
        ("alpha-above-one", {"alpha": 1.5}, ValueError, r"`alpha`"),
        ("alpha-nan", {"alpha": math.nan}, ValueError, r"`alpha`"),
        ("eps-negative", {"eps": -1.0}, ValueError, r"`eps`"),
        ("momentum-inf", {"momentum": math.inf}, ValueError, r"`momentum`"),
    ],
    "nadam": [
        ("momentum-decay-negative", {"momentum_decay": -1e-3}, ValueError, r"`mom"),
        ("momentum-decay-nan", {"momentum_decay": math.nan}, ValueError, r"`mom"),
        ("betas-one", {"betas": (1.0, 0.9)}, ValueError, r"`betas\[0\]`"),
        ("decoupled-string", {"decoupled_weight_decay": "yes"}, TypeError, r"`dec"),
    ],
    "radam": [
        ("betas-negative", {"betas": (0.9, -0.5)}, ValueError, r"`betas\[1\]`"),
        ("eps-negative", {"eps": -1.0}, ValueError, r"`eps`"),
        ("decoupled-none", {"decoupled_weight_decay": None}, TypeError, r"`dec"),
    ],
    "adamax": [
        ("betas-list", {"betas": [0.9, 0.999]}, TypeError, r"`betas`"),
        ("eps-inf", {"eps": math.inf}, ValueError, r"`eps`"),
    ],
    "adadelta": [
        ("rho-above-one", {"rho": 1.5}, ValueError, r"`rho`"),
        ("rho-negative", {"rho": -0.1}, ValueError, r"`rho`"),
        ("eps-negative", {"eps": -1e-6}, ValueError, r"`eps`"),
    ],
    "asgd": [
        ("lambd-string", {"lambd": "1e-4"}, TypeError, r"`lambd`"),
        ("alpha-none", {"alpha": None}, TypeError, r"`alpha`"),
        ("t0-bool", {"t0": True}, TypeError, r"`t0`"),
    ],
    "rprop": [
        ("weight-decay-unknown", {"weight_decay": 0.1}, TypeError, r"weight_decay"),
        ("etas-swapped", {"etas": (1.2, 0.5)}, ValueError, r"`etas`"),
        ("etas-one", {"etas": (0.5, 1.0)}, ValueError, r"`etas`"),
        ("etas-nan", {"etas": (math.nan, 1.2)}, ValueError, r"`etas`"),
        ("etas-list", {"etas": [0.5, 1.2]}, TypeError, r"`etas`"),
        ("step-sizes-swapped", {"step_sizes": (1.0, 0.1)}, ValueError, r"`step_sizes`"),
        ("step-sizes-negative", {"step_sizes": (-1.0, 1.0)}, ValueError, r"`step_s"),
        ("step-sizes-inf", {"step_sizes": (0.0, math.inf)}, ValueError, r"`step_s"),
        ("step-sizes-single", {"step_sizes": (1.0,)}, TypeError, r"`step_sizes`"),
    ],
    "adagrad": [
        ("lr-decay-negative", {"lr_decay": -0.1}, ValueError, r"`lr_decay`"),
        (
            "initial-accumulator-negative",
            {"initial_accumulator_value": -1.0},
            ValueError,
            r"`initial_accumulator_value`",
        ),
        ("eps-nan", {"eps": math.nan}, ValueError, r"`eps`"),
    ],
}


def _takes(cls: Any, option: str) -> bool:
    """Whether the class has `option` (Rprop has no `weight_decay`, as in torch)."""
    field = attrs.fields_dict(cls).get(option)
    return field is not None and field.init


def _config_params() -> list[Any]:
    return [
        pytest.param(case.ours, kwargs, error, match, id=f"{case.name}-{name}")
        for case in TABLE
        for name, kwargs, error, match in BAD_CONFIG + EXTRA_CONFIG.get(case.name, [])
        if name == "unknown-option"
        or name in {n for n, *_ in EXTRA_CONFIG.get(case.name, [])}
        or all(_takes(case.ours, option) for option in kwargs)
    ]


@pytest.mark.parametrize(("cls", "kwargs", "error", "match"), _config_params())
def test_bad_hyperparameter_is_refused_by_name(
    cls: Callable[..., optim.Optimizer[Any]],
    kwargs: dict[str, Any],
    error: type[Exception],
    match: str,
) -> None:
    """A bad hyperparameter raises at construction, naming the argument."""
    with pytest.raises(error, match=match):
        cls(**kwargs)


# ------------------------------------------------------------ bad params at init

BAD_INIT: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("params-dict", lambda: {"w": torch.ones(2)}, TypeError, r"ParamDict"),
    ("params-none", lambda: None, TypeError, r"ParamDict"),
    ("params-list", lambda: [torch.ones(2)], TypeError, r"ParamDict"),
    (
        "params-complex",
        lambda: ParamDict(w=torch.ones(2, dtype=torch.complex64)),
        TypeError,
        r"'w'",
    ),
    (
        "params-int",
        lambda: ParamDict(w=torch.ones(2, dtype=torch.int64)),
        TypeError,
        r"'w'",
    ),
]
BAD_RATE: list[tuple[str, str, Callable[[], ParamDict]]] = [
    ("shape-3x1", "lr", lambda: ParamDict(w=torch.ones(3, 1), b=torch.ones(2))),
    ("shape-wide", "lr", lambda: ParamDict(w=torch.ones(4), b=torch.ones(2))),
    ("keys", "lr", lambda: ParamDict(w=torch.ones(3))),
    (
        "dtype-0dim",
        "lr",
        lambda: ParamDict(w=torch.ones(()), b=torch.ones((), dtype=torch.float64)),
    ),
    (
        "wd-shape-3x1",
        "weight_decay",
        lambda: ParamDict(w=torch.ones(3, 1), b=torch.ones(2)),
    ),
    ("wd-keys", "weight_decay", lambda: ParamDict(w=torch.ones(3), c=torch.ones(2))),
]


def _init_params() -> list[Any]:
    return [
        pytest.param(case.make, make, error, match, id=f"{case.name}-{name}")
        for case in TABLE
        for name, make, error, match in BAD_INIT
    ]


@pytest.mark.parametrize(("make_opt", "make", "error", "match"), _init_params())
def test_bad_params_are_refused_by_init(
    make_opt: Callable[[], optim.Optimizer[Any]],
    make: Callable[[], Any],
    error: type[Exception],
    match: str,
) -> None:
    """`init` refuses what is not a ParamDict of real floating-point tensors."""
    with pytest.raises(error, match=match):
        make_opt().init(make())


def _rate_params() -> list[Any]:
    return [
        pytest.param(case.ours, case.rich, field, make, id=f"{case.name}-{name}")
        for case in TABLE
        for name, field, make in BAD_RATE
        if _takes(case.ours, field)
    ]


@pytest.mark.parametrize(("cls", "rich", "field", "make"), _rate_params())
def test_per_key_rate_that_would_reshape_or_retype_is_refused(
    cls: Callable[..., optim.Optimizer[Any]],
    rich: dict[str, Any],
    field: str,
    make: Callable[[], ParamDict],
) -> None:
    """A per-key rate that would change a parameter's shape or dtype is named."""
    params = ParamDict(w=torch.ones(3), b=torch.ones(2))
    rate = make()
    if "b" in rate and rate["b"].dim() == 0:  # the dtype case: 0-dim params
        params = ParamDict(w=torch.ones(()), b=torch.ones(()))
    opt = cls(**{**rich, field: rate})
    with pytest.raises(ValueError, match=rf"(?s)`{field}`.*'[bcw]'|'[bcw]'.*`{field}`"):
        opt.init(params)


# ------------------------------------------------------------ shape and dtype kept


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("name", "make"), _optimizers()[:5])
def test_half_precision_scalars_keep_their_dtype(
    name: str, make: Callable[[], optim.Optimizer[Any]], dtype: torch.dtype
) -> None:
    """0-dim half-precision parameters come back in their dtype and shape."""
    opt = make()
    params = ParamDict(s=torch.tensor(1.0, dtype=dtype), v=torch.ones(2, dtype=dtype))
    grads = params.full_like(0.5)
    new, _ = opt.step(params, grads, opt.init(params))
    assert {k: (v.dtype, v.shape) for k, v in new.items()} == {
        k: (v.dtype, v.shape) for k, v in params.items()
    }


@settings(max_examples=25, deadline=None)
@given(
    index=st.integers(0, len(TABLE) - 1),
    shape=st.lists(st.integers(1, 3), min_size=0, max_size=3),
)
def test_random_wrong_gradient_shapes_are_refused(index: int, shape: list[int]) -> None:
    """Any gradient shape other than the parameter's is refused, nothing changed."""
    opt = TABLE[index].make()
    params = ParamDict(w=torch.ones(2, 2))
    state = opt.init(params)
    grads = {"w": torch.ones(shape)}
    before = _snapshot((params, grads, state))
    if tuple(shape) == (2, 2):
        opt.step(params, grads, state)
    else:
        with pytest.raises(ValueError, match=r"'w'"):
            opt.step(params, grads, state)
    _assert_unchanged(before, (params, grads, state))


# ------------------------------------------------------------ combinators

BAD_COMBINATORS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    (
        "groups-not-optimizer",
        lambda: optim.ParamGroups({"w": torch.optim.SGD}),  # type: ignore[dict-item]  # the bad input under test
        TypeError,
        r"optimizer",
    ),
    (
        "groups-pattern-int",
        lambda: optim.ParamGroups({1: optim.SGD()}),  # type: ignore[dict-item]  # the bad input under test
        TypeError,
        r"pattern",
    ),
    (
        "groups-empty-tuple",
        lambda: optim.ParamGroups({(): optim.SGD()}),
        TypeError,
        r"pattern",
    ),
    (
        "groups-mixed-differentiable",
        lambda: optim.ParamGroups(
            {"w": optim.SGD(differentiable=True)}, default=optim.SGD()
        ),
        ValueError,
        r"differentiable",
    ),
    (
        "groups-default-not-optimizer",
        lambda: optim.ParamGroups({"w": optim.SGD()}, default="adam"),  # type: ignore[arg-type]  # the bad input under test
        TypeError,
        r"optimizer",
    ),
    (
        "clip-not-optimizer",
        lambda: optim.ClipGradNorm("sgd", max_norm=1.0),  # type: ignore[arg-type]  # the bad input under test
        TypeError,
        r"optimizer",
    ),
    (
        "clip-max-norm-negative",
        lambda: optim.ClipGradNorm(optim.SGD(), max_norm=-1.0),
        ValueError,
        r"`max_norm`",
    ),
    (
        "clip-max-norm-nan",
        lambda: optim.ClipGradNorm(optim.SGD(), max_norm=math.nan),
        ValueError,
        r"`max_norm`",
    ),
    (
        "clip-max-norm-string",
        lambda: optim.ClipGradNorm(optim.SGD(), max_norm="1"),  # type: ignore[arg-type]  # the bad input under test
        TypeError,
        r"`max_norm`",
    ),
    (
        "clip-norm-type-zero",
        lambda: optim.ClipGradNorm(optim.SGD(), max_norm=1.0, norm_type=0),
        ValueError,
        r"`norm_type`",
    ),
    (
        "clip-norm-type-nan",
        lambda: optim.ClipGradNorm(optim.SGD(), max_norm=1.0, norm_type=math.nan),
        ValueError,
        r"`norm_type`",
    ),
]


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        pytest.param(build, error, match, id=name)
        for name, build, error, match in BAD_COMBINATORS
    ],
)
def test_bad_combinator_is_refused(
    build: Callable[[], Any], error: type[Exception], match: str
) -> None:
    """`ParamGroups` and `ClipGradNorm` refuse bad members and settings by name."""
    with pytest.raises(error, match=match):
        build()


def test_groups_patterns_matching_nothing_are_named() -> None:
    """A group pattern that matches no key is named at `init`."""
    opt = optim.ParamGroups({"nothing*": optim.SGD()}, default=optim.SGD())
    with pytest.raises(ValueError, match=r"'nothing\*'"):
        opt.init(_params())


# ------------------------------------------------------------ step_module


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(3, 2)


BAD_MODULE: list[
    tuple[str, Callable[[nn.Module, Any], tuple[Any, ...]], type[Exception], str]
] = [
    (
        "module-paramdict",
        lambda m, s: (ParamDict.from_module(m), lambda: torch.ones(()), s),
        TypeError,
        r"nn\.Module",
    ),
    (
        "module-none",
        lambda m, s: (None, lambda: torch.ones(()), s),
        TypeError,
        r"nn\.Module",
    ),
    ("loss-fn-none", lambda m, s: (m, None, s), TypeError, r"`loss_fn`"),
    ("loss-fn-tensor", lambda m, s: (m, torch.ones(()), s), TypeError, r"`loss_fn`"),
    (
        "state-none",
        lambda m, s: (m, lambda: m(torch.ones(1, 3)).sum(), None),
        TypeError,
        r"state",
    ),
    (
        "state-other",
        lambda m, s: (
            m,
            lambda: m(torch.ones(1, 3)).sum(),
            _other_state(ParamDict.from_module(m)),
        ),
        TypeError,
        r"state",
    ),
    (
        "state-other-keys",
        lambda m, s: (
            m,
            lambda: m(torch.ones(1, 3)).sum(),
            optim.Adam().init(ParamDict(x=torch.ones(2))),
        ),
        (TypeError, ValueError),  # type: ignore[list-item]  # either names the key
        r"'bias'|'weight'|state",
    ),
]


@pytest.mark.parametrize(
    ("spoil", "error", "match"),
    [pytest.param(s, e, m, id=n) for n, s, e, m in BAD_MODULE],
)
def test_bad_step_module_input_leaves_the_module_alone(
    spoil: Callable[[nn.Module, Any], tuple[Any, ...]],
    error: type[Exception],
    match: str,
) -> None:
    """`step_module` refuses bad input before touching the module's parameters."""
    model = _model()
    opt = optim.Adam(lr=0.1)
    state = opt.init(ParamDict.from_module(model))
    identities = [id(p) for p in model.parameters()]
    values = [p.detach().clone() for p in model.parameters()]
    args = spoil(model, state)
    with pytest.raises(error, match=match):
        opt.step_module(*args)
    assert [id(p) for p in model.parameters()] == identities
    for old, new in zip(values, model.parameters()):
        torch.testing.assert_close(new.detach(), old, rtol=0, atol=0)


# ------------------------------------------------------------ matrices only (Muon)


def _matrix_optimizers() -> list[Any]:
    return [
        pytest.param(case.classes[0], case.rich, id=case.name)
        for case in MATRIX_ROWS
        if case.classes is not None
    ]


@pytest.mark.parametrize(("cls", "rich"), _matrix_optimizers())
def test_entries_that_are_not_matrices_are_refused_by_name(
    cls: Callable[..., optim.Optimizer[Any]], rich: dict[str, Any]
) -> None:
    """Entries that are not 2-D are named, sorted, with the ParamGroups fix."""
    params = ParamDict(
        w=torch.ones(2, 2), b=torch.ones(2), a=torch.ones(()), c=torch.ones(1, 2, 2)
    )
    with pytest.raises(ValueError, match=r"\['a', 'b', 'c'\] are not 2-D.*ParamGroups"):
        cls(**rich).init(params)


def _matrix_step_params() -> list[Any]:
    return [
        pytest.param(cls, rich, spoil, error, match, id=f"{name.id}-{case}")
        for name in _matrix_optimizers()
        for cls, rich in [name.values]
        for case, spoil, error, match in STEP_CASES
    ]


@pytest.mark.parametrize(
    ("cls", "rich", "spoil", "error", "match"), _matrix_step_params()
)
def test_bad_step_input_to_a_matrix_optimizer_is_refused(
    cls: Callable[..., optim.Optimizer[Any]],
    rich: dict[str, Any],
    spoil: Spoil,
    error: type[Exception],
    match: str,
) -> None:
    """Each bad `step` argument is named for Muon too; inputs are unchanged."""
    opt = cls(**rich)
    params = ParamDict(w=torch.ones(1, 3), b=torch.ones(2, 1))
    grads = ParamDict(w=torch.full((1, 3), 0.5), b=torch.full((2, 1), -0.5))
    args = spoil(params, grads, opt.init(params))
    before = _snapshot(args)
    with pytest.raises(error, match=match):
        opt.step(*args)
    _assert_unchanged(before, args)


BAD_MUON: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"ns_steps": 100}, ValueError, r"`ns_steps` must be in \[0, 100\)"),
    ({"ns_steps": 2.0}, TypeError, r"`ns_steps` must be an int"),
    ({"ns_coefficients": (1.0, 2.0)}, TypeError, r"`ns_coefficients` must be a tuple"),
    ({"ns_coefficients": (1.0, math.nan, 2.0)}, TypeError, r"`ns_coefficients`"),
    ({"adjust_lr_fn": "rms"}, ValueError, r"`adjust_lr_fn` must be None, 'original'"),
    ({"momentum": -0.1}, ValueError, r"`momentum` must be non-negative"),
    ({"eps": -1.0}, ValueError, r"`eps` must be non-negative"),
    ({"nesterov": 1}, TypeError, r"`nesterov` must be True or False"),
    ({"lr": -1.0}, ValueError, r"`lr`"),
    ({"weight_decay": math.nan}, ValueError, r"`weight_decay`"),
    ({"maximize": True}, TypeError, r"maximize"),
]


@pytest.mark.parametrize(("kwargs", "error", "match"), BAD_MUON)
def test_bad_muon_hyperparameter_is_refused_by_name(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Muon's own options are checked at construction, naming the argument."""
    with pytest.raises(error, match=match):
        optim.Muon(**kwargs)


# ------------------------------------------------------------------ fused=True

FUSED_CLASSES = [optim.Adam, optim.AdamW, optim.SGD, optim.Adagrad]


@pytest.mark.parametrize("cls", FUSED_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("value", ["yes", 1, 0.0, torch.tensor(True)])
def test_fused_flag_of_the_wrong_kind_is_refused(cls: Any, value: object) -> None:
    """`fused` takes None, True or False, named in the error."""
    with pytest.raises(TypeError, match=r"`fused` must be None, True or False"):
        cls(fused=value)


@pytest.mark.parametrize("cls", FUSED_CLASSES, ids=lambda c: c.__name__)
def test_fused_with_differentiable_is_refused(cls: Any) -> None:
    """Fused kernels write outside autograd: `fused=True` refuses differentiable."""
    with pytest.raises(ValueError, match=r"`fused=True` needs `differentiable=False`"):
        cls(fused=True, differentiable=True)


UNFUSABLE = [
    (
        "float16",
        lambda: ParamDict(w=torch.ones(3, dtype=torch.float16)),
        {},
        r"do not all share float32 or float64",
    ),
    (
        "mixed-dtypes",
        lambda: ParamDict(w=torch.ones(3), b=torch.ones(2, dtype=torch.float64)),
        {},
        r"do not all share float32 or float64",
    ),
    (
        "per-key-lr",
        lambda: ParamDict(w=torch.ones(3)),
        {"lr": ParamDict(w=torch.tensor(0.1))},
        r"`lr` is a per-key ParamDict",
    ),
    (
        "tensor-weight-decay",
        lambda: ParamDict(w=torch.ones(3)),
        {"weight_decay": torch.tensor(0.1)},
        r"`weight_decay` is a tensor or a per-key ParamDict",
    ),
]


@pytest.mark.parametrize("cls", FUSED_CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("make_params", "kwargs", "match"),
    [pytest.param(*case[1:], id=case[0]) for case in UNFUSABLE],
)
@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
def test_fused_true_refuses_a_step_the_kernel_cannot_take(
    cls: Any,
    make_params: Callable[[], ParamDict],
    kwargs: dict[str, Any],
    match: str,
    in_place: bool,
) -> None:
    """`fused=True` says why a step cannot be fused and how to fall back; no writes."""
    params = make_params()
    opt = cls(fused=True, **kwargs)
    state = opt.init(params)
    grads = params.zeros_like().add(0.5)
    before = _snapshot((params, grads, state))
    with pytest.raises(
        ValueError, match=rf"fused=True\)` cannot take.*{match}.*fused=None"
    ):
        (opt.step_ if in_place else opt.step)(params, grads, state)
    _assert_unchanged(before, (params, grads, state))
    # `fused=None` falls back to the foreach rule for the same step.
    fallback = cls(**kwargs)
    fallback.step(params, grads, fallback.init(params))


@pytest.mark.parametrize("in_place", [False, True], ids=["step", "step_"])
@pytest.mark.parametrize("cls", [optim.Adam, optim.AdamW], ids=["Adam", "AdamW"])
def test_fused_true_refuses_a_schedule_that_cycles_the_momentum(
    cls: Any, in_place: bool
) -> None:
    """The kernel takes its betas as numbers: a cycled first beta is refused."""
    params = ParamDict(w=torch.ones(3))
    opt = cls(fused=True, lr=optim.OneCycleLR(max_lr=0.1, total_steps=10))
    state = opt.init(params)
    grads = params.zeros_like().add(0.5)
    before = _snapshot((params, grads, state))
    with pytest.raises(ValueError, match=r"fused=True\)` cannot take.*cycles the"):
        (opt.step_ if in_place else opt.step)(params, grads, state)
    _assert_unchanged(before, (params, grads, state))


def test_fused_sgd_refuses_dampening() -> None:
    """A damped buffer cannot start in fused SGD: refused, naming the fix."""
    params = _params()
    opt = optim.SGD(lr=0.1, momentum=0.9, dampening=0.5, fused=True)
    state = opt.init(params)
    before = _snapshot((params, state))
    with pytest.raises(ValueError, match=r"`SGD\(fused=True\)`.*`dampening=0`"):
        opt.step(params, _grads(), state)
    _assert_unchanged(before, (params, state))
