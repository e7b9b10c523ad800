"""Bad input to the container, its operators and its per-entry methods is refused.

Every case builds its operands fresh, makes one call with a bad input, and expects a
clear error (its type and a message naming the argument or key); the operands
(ParamDicts, tensors, mappings, numpy arrays) are bit-identical afterwards.
"""

from __future__ import annotations

import copy
import operator
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from _unchanged import Case, check, equal, operands, state, unique_ids
from hypothesis import given
from hypothesis import strategies as st

from paramdict import ParamDict


def _p() -> ParamDict:
    return ParamDict(
        w=torch.arange(6.0).reshape(2, 3), b=torch.tensor([0.5, -1.0, 2.0])
    )


# ---------------------------------------------------------------- construction

_T = torch.ones(2)
_BAD_BUILD: dict[str, tuple[Callable[[], Any], type[BaseException], str]] = {
    "int key": (lambda: {1: _T}, TypeError, "keys must be str, got 1"),
    "None key": (lambda: {None: _T}, TypeError, "keys must be str, got None"),
    "tuple key": (lambda: {("a",): _T}, TypeError, r"keys must be str, got \('a',\)"),
    "bytes key": (lambda: {b"w": _T}, TypeError, "keys must be str, got b'w'"),
    "float key": (lambda: {1.5: _T}, TypeError, "keys must be str, got 1.5"),
    "None value": (lambda: {"w": None}, TypeError, "'w': NoneType"),
    "float value": (lambda: {"w": 1.0}, TypeError, "'w': float"),
    "int value": (lambda: {"w": 3}, TypeError, "'w': int"),
    "bool value": (lambda: {"w": True}, TypeError, "'w': bool"),
    "numpy value": (lambda: {"w": np.ones(2)}, TypeError, "'w': ndarray"),
    "numpy scalar value": (lambda: {"w": np.float32(1)}, TypeError, "'w': float32"),
    "list value": (lambda: {"w": [1.0, 2.0]}, TypeError, "'w': list"),
    "str value": (lambda: {"w": "x"}, TypeError, "'w': str"),
    "module value": (lambda: {"w": torch.nn.Linear(1, 1)}, TypeError, "'w': Linear"),
    "paramdict value": (lambda: {"w": _p()}, TypeError, "'w': ParamDict"),
    "two bad values sorted": (
        lambda: {"z": None, "a": 1},
        TypeError,
        "'a': int, 'z': NoneType",
    ),
    "short pairs": (lambda: [("w",)], TypeError, "mapping or an iterable of"),
    "long pairs": (lambda: [("w", _T, _T)], TypeError, "mapping or an iterable of"),
    "ints": (lambda: [1, 2], TypeError, "mapping or an iterable of"),
    "a str": (lambda: "ab", TypeError, "mapping or an iterable of"),
    "an int": (lambda: 5, TypeError, "mapping or an iterable of"),
    "None": (lambda: None, TypeError, "mapping or an iterable of"),
    "a tensor": (lambda: torch.ones(2), TypeError, "mapping or an iterable of"),
    "a numpy array": (lambda: np.ones(2), TypeError, "mapping or an iterable of"),
}

CONSTRUCTION = [
    Case(f"ParamDict({name})", operands(build), ParamDict, error, match)
    for name, (build, error, match) in _BAD_BUILD.items()
] + [
    Case(
        "ParamDict(**{'w': None})",
        lambda: ({"w": None},),
        lambda d: ParamDict(**d),
        TypeError,
        "'w': NoneType",
    ),
    Case(
        "fromkeys int key",
        lambda: ([1], _T),
        ParamDict.fromkeys,
        TypeError,
        "keys must be str",
    ),
    Case(
        "fromkeys None value",
        lambda: (["w"], None),
        ParamDict.fromkeys,
        TypeError,
        "'w': NoneType",
    ),
    Case(
        "fromkeys numpy value",
        lambda: (["w"], np.ones(2)),
        ParamDict.fromkeys,
        TypeError,
        "'w': ndarray",
    ),
    Case(
        "fromkeys float value",
        lambda: (["w", "b"], 0.5),
        ParamDict.fromkeys,
        TypeError,
        "'b': float, 'w': float",
    ),
]

# ---------------------------------------------------------------- mutation

_IMMUTABLE: dict[str, Callable[[ParamDict], Any]] = {
    "p[k] = v": lambda p: p.__setitem__("w", torch.zeros(2, 3)),
    "p[new] = v": lambda p: p.__setitem__("z", torch.zeros(1)),
    "del p[k]": lambda p: p.__delitem__("w"),
    "del p[missing]": lambda p: p.__delitem__("missing"),
    "pop": lambda p: p.pop("w"),
    "pop default": lambda p: p.pop("missing", None),
    "popitem": lambda p: p.popitem(),
    "clear": lambda p: p.clear(),
    "setdefault": lambda p: p.setdefault("z", torch.zeros(1)),
    "update new key": lambda p: p.update(z=torch.zeros(1)),
    "update None": lambda p: p.update({"z": None}),
    "update existing None": lambda p: p.update({"w": None}),
    "update other tensor": lambda p: p.update({"w": torch.zeros(2, 3)}),
    "update pairs": lambda p: p.update([("b", torch.zeros(3))]),
    "p |= other": lambda p: p.__ior__({"z": torch.zeros(1)}),
    "__init__ again": lambda p: ParamDict.__init__(p, {"z": torch.zeros(1)}),
}
MUTATION = [
    Case(f"immutable {name}", lambda: (_p(),), fn, TypeError, "immutable")
    for name, fn in _IMMUTABLE.items()
] + [
    Case("missing key", lambda: (_p(),), lambda p: p["missing"], KeyError, "missing"),
    Case("int key lookup", lambda: (_p(),), lambda p: p[0], KeyError, "0"),
    Case(
        "union with int key",
        lambda: (_p(), {1: _T}),
        operator.or_,
        TypeError,
        "keys must be str",
    ),
    Case(
        "union with None value",
        lambda: (_p(), {"z": None}),
        operator.or_,
        TypeError,
        "'z': NoneType",
    ),
    Case(
        "reflected union with None value",
        lambda: ({"z": None}, _p()),
        operator.or_,
        TypeError,
        "'z': NoneType",
    ),
    Case(
        "union with a list",
        lambda: (_p(), [("z", _T)]),
        operator.or_,
        TypeError,
        "unsupported operand",
    ),
    Case(
        "union with None", lambda: (_p(), None), operator.or_, TypeError, "unsupported"
    ),
]

# ---------------------------------------------------------------- operators

_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "**": operator.pow,
    "r+": lambda p, o: o + p,
    "r-": lambda p, o: o - p,
    "r*": lambda p, o: o * p,
    "r/": lambda p, o: o / p,
    "r**": lambda p, o: o**p,
    "add": lambda p, o: p.add(o),
    "sub": lambda p, o: p.sub(o),
    "mul": lambda p, o: p.mul(o),
    "div": lambda p, o: p.div(o),
    "pow": lambda p, o: p.pow(o),
    "maximum": lambda p, o: p.maximum(o),
    "minimum": lambda p, o: p.minimum(o),
    "clamp min": lambda p, o: p.clamp(min=o),
    "clamp max": lambda p, o: p.clamp(max=o),
    "lerp weight": lambda p, o: p.lerp(p, o),
    "where other": lambda p, o: p.where(p.map(lambda v: v > 0), o),
    "add alpha": lambda p, o: p.add(p, alpha=o),
    "sub alpha": lambda p, o: p.sub(p, alpha=o),
    "addcmul value": lambda p, o: p.addcmul(p, p, value=o),
    "addcdiv value": lambda p, o: p.addcdiv(p, p.ones_like(), value=o),
}
_ALPHA_LIKE = {"add alpha", "sub alpha", "addcmul value", "addcdiv value"}
_METHODS = {
    "add", "sub", "mul", "div", "pow", "maximum", "minimum", "clamp min",
    "clamp max", "lerp weight", "where other",
}  # fmt: skip

# (operand builder, error message pattern when refused by a method we own)
_BAD_OPERANDS: dict[str, Callable[[], Any]] = {
    "numpy array": lambda: np.array([1.0, 2.0]),
    "numpy 0-dim array": lambda: np.array(2.0),
    "numpy bool": lambda: np.bool_(True),
    "list": lambda: [1.0, 2.0],
    "tuple": lambda: (1.0,),
    "None": lambda: None,
    "str": lambda: "2",
    "set": lambda: {1.0},
    "object": object,
    "1-dim tensor": lambda: torch.ones(3),
    "2-dim tensor": lambda: torch.ones(2, 3),
    "module": lambda: torch.nn.Linear(1, 1),
}
_BAD_MAPPINGS: dict[str, tuple[Callable[[], Any], type[BaseException], str]] = {
    "missing key": (
        lambda: {"w": torch.ones(2, 3)},
        ValueError,
        r"missing \['b'\]",
    ),
    "unexpected key": (
        lambda: {"w": torch.ones(2, 3), "b": torch.ones(3), "z": torch.ones(1)},
        ValueError,
        r"unexpected \['z'\]",
    ),
    "other keys": (
        lambda: {"x": torch.ones(2, 3), "y": torch.ones(3)},
        ValueError,
        r"missing \['b', 'w'\], unexpected \['x', 'y'\]",
    ),
    "other keys ParamDict": (
        lambda: ParamDict(x=torch.ones(2, 3), y=torch.ones(3)),
        ValueError,
        r"missing \['b', 'w'\]",
    ),
    "empty mapping": (lambda: {}, ValueError, r"missing \['b', 'w'\]"),
    "None values": (
        lambda: {"w": None, "b": None},
        TypeError,
        r"\['b', 'w'\] are not tensors",
    ),
    "mixed tensors and numbers": (
        lambda: {"w": torch.ones(2, 3), "b": 2.0},
        TypeError,
        r"\['b'\] are not tensors",
    ),
    "numpy values": (
        lambda: {"w": np.ones((2, 3)), "b": np.ones(3)},
        TypeError,
        r"\['b', 'w'\] are not tensors",
    ),
    "shape that does not broadcast": (
        lambda: {"w": torch.ones(4), "b": torch.ones(3)},
        ValueError,
        "Entry 'w': shapes",
    ),
    "meta device": (
        lambda: {"w": torch.ones(2, 3, device="meta"), "b": torch.ones(3)},
        ValueError,
        "Entry 'w'.*different devices",
    ),
}


def _with_p(build: Callable[[], Any]) -> Callable[[], tuple[Any, ...]]:
    return lambda: (_p(), build())


def _operator_cases() -> list[Case]:
    cases = []
    for op_name, op in _BINARY.items():
        alpha = op_name in _ALPHA_LIKE
        for bad_name, build in _BAD_OPERANDS.items():
            if alpha and bad_name == "module":
                continue
            if bad_name.startswith("numpy"):
                match = "numpy" if not alpha else "alpha|value|numpy|number"
            elif op_name in _METHODS or alpha:
                match = r"number|0-dim|tensor|alpha|value"
            else:
                match = "unsupported operand|0-dim tensor|number"
            if op_name.startswith("clamp") and bad_name == "None":
                continue  # `clamp(min=None)` means no lower bound
            cases.append(
                Case(
                    f"{op_name} {bad_name}",
                    _with_p(build),
                    op,
                    TypeError,
                    match,
                )
            )
        if alpha:
            continue
        for bad_name, (build, error, match) in _BAD_MAPPINGS.items():
            if op_name.startswith("r") and bad_name == "other keys ParamDict":
                match = r"missing \['x', 'y'\], unexpected \['b', 'w'\]"  # the left's
            cases.append(
                Case(
                    f"{op_name} mapping {bad_name}",
                    _with_p(build),
                    op,
                    error,
                    match,
                )
            )
    return cases


OPERATORS = _operator_cases()

# ---------------------------------------------------------------- other methods

_P = _p


def _method_cases() -> list[Case]:
    p = _P
    return [
        Case("clamp no bound", lambda: (p(),), lambda q: q.clamp(), ValueError, "min"),
        Case(
            "where non-bool condition",
            lambda: (p(), p()),
            lambda q, c: q.where(c, 0.0),
            TypeError,
            r"\['b', 'w'\] are not",
        ),
        Case(
            "where condition wrong keys",
            lambda: (p(), {"w": torch.ones(2, 3, dtype=torch.bool)}),
            lambda q, c: q.where(c, 0.0),
            ValueError,
            r"missing \['b'\]",
        ),
        Case(
            "where condition a list",
            lambda: (p(), [True]),
            lambda q, c: q.where(c, 0.0),
            TypeError,
            "mapping",
        ),
        Case(
            "where condition None",
            lambda: (p(), None),
            lambda q, c: q.where(c, 0.0),
            TypeError,
            "mapping",
        ),
        Case(
            "lerp end a number",
            lambda: (p(),),
            lambda q: q.lerp(1.0, 0.5),
            TypeError,
            "mapping",
        ),
        Case(
            "lerp end wrong keys",
            lambda: (p(), {"w": torch.ones(2, 3)}),
            lambda q, e: q.lerp(e, 0.5),
            ValueError,
            r"missing \['b'\]",
        ),
        Case(
            "addcmul tensor1 None",
            lambda: (p(),),
            lambda q: q.addcmul(None, q),
            TypeError,
            "mapping",
        ),
        Case(
            "addcdiv tensor2 wrong keys",
            lambda: (p(), {"b": torch.ones(3)}),
            lambda q, t: q.addcdiv(q, t),
            ValueError,
            r"missing \['w'\]",
        ),
        Case(
            "allclose a list",
            lambda: (p(), [torch.ones(2)]),
            lambda q, o: q.allclose(o),
            TypeError,
            "mapping",
        ),
        Case(
            "allclose wrong keys",
            lambda: (p(), {"w": torch.ones(2, 3)}),
            lambda q, o: q.allclose(o),
            ValueError,
            r"missing \['b'\]",
        ),
        Case(
            "allclose shape",
            lambda: (p(), {"w": torch.ones(3, 2), "b": torch.ones(3)}),
            lambda q, o: q.allclose(o),
            ValueError,
            "'w'",
        ),
        Case(
            "allclose dtype",
            lambda: (p(), {"w": torch.ones(2, 3).double(), "b": torch.ones(3)}),
            lambda q, o: q.allclose(o),
            ValueError,
            "'w'",
        ),
        Case(
            "allclose None values",
            lambda: (p(), {"w": None, "b": torch.ones(3)}),
            lambda q, o: q.allclose(o),
            TypeError,
            r"\['w'\]",
        ),
    ]


METHODS = _method_cases()


ALL = unique_ids(CONSTRUCTION + MUTATION + OPERATORS + METHODS)


@pytest.mark.parametrize("case", [c.param() for c in ALL])
def test_bad_input_is_refused_and_nothing_changes(case: Case) -> None:
    """The call raises a clear error and every operand is bit-identical after."""
    check(case)


def test_numpy_defers_to_paramdict() -> None:
    """Numpy does not broadcast a ParamDict into an object array."""
    p = _p()
    array: Any = np.ones(2)  # the operators under test are not typed for this
    with pytest.raises(TypeError, match="numpy"):
        p + array
    with pytest.raises(TypeError, match="numpy"):
        array + p
    with pytest.raises(TypeError, match="numpy"):
        array * p
    # numpy scalars that are numbers still work as numbers
    torch.testing.assert_close((p * np.float64(2.0))["w"], p["w"] * 2)
    torch.testing.assert_close((np.float32(2.0) * p)["w"], p["w"] * 2)


def test_copy_module_round_trips_keep_one_consistent_paramdict() -> None:
    """`copy.copy` and `copy.deepcopy` never disagree with themselves."""
    p = _p()
    for q in (copy.copy(p), copy.deepcopy(p)):
        assert list(q._keys) == list(q)
        assert all(a is b for a, b in zip(q._vals, dict.values(q)))


_KEYS = ["a", "b", "c", "d"]


@given(
    mine=st.lists(st.sampled_from(_KEYS), min_size=1, unique=True),
    theirs=st.lists(st.sampled_from([*_KEYS, "x", "y"]), unique=True),
    op=st.sampled_from(["+", "-", "*", "/", "add", "sub", "lerp", "maximum"]),
    as_paramdict=st.booleans(),
)
def test_random_key_mismatches_name_exactly_the_keys(
    mine: list[str], theirs: list[str], op: str, as_paramdict: bool
) -> None:
    """Any key mismatch raises naming the missing and unexpected keys, sorted."""
    p = ParamDict({k: torch.ones(2) for k in mine})
    other: Any = {k: torch.full((2,), 2.0) for k in theirs}
    if as_paramdict:
        other = ParamDict(other)
    before = state((p, other))
    run: dict[str, Callable[[], Any]] = {
        "+": lambda: p + other,
        "-": lambda: p - other,
        "*": lambda: p * other,
        "/": lambda: p / other,
        "add": lambda: p.add(other, alpha=0.5),
        "sub": lambda: p.sub(other, alpha=0.5),
        "lerp": lambda: p.lerp(other, 0.5),
        "maximum": lambda: p.maximum(other),
    }
    missing = sorted(set(mine) - set(theirs))
    unexpected = sorted(set(theirs) - set(mine))
    if not missing and not unexpected:
        run[op]()
    else:
        parts = []
        if missing:
            parts.append(f"missing {missing!r}")
        if unexpected:
            parts.append(f"unexpected {unexpected!r}")
        with pytest.raises(ValueError, match=re.escape(", ".join(parts) + ".")):
            run[op]()
    assert equal(before, state((p, other)))
