"""Bad input to reductions, selection, per-tensor methods and stacking is refused.

Each case builds its operands fresh, makes one call with a bad input and expects a
clear error naming the argument or key; the operands are bit-identical afterwards.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from _unchanged import Case, check, unique_ids

from paramdict import ParamDict


def _p() -> ParamDict:
    return ParamDict(
        w=torch.arange(6.0).reshape(2, 3), b=torch.tensor([0.5, -1.0, 2.0])
    )


def _mixed() -> ParamDict:
    return ParamDict(w=torch.ones(2), i=torch.ones(2, dtype=torch.int64))


def _devices() -> ParamDict:
    return ParamDict(w=torch.ones(2), m=torch.ones(2, device="meta"))


def _c(name: str, build: Any, call: Any, error: Any, match: str) -> Case:
    return Case(name, build, call, error, match)


# ---------------------------------------------------------------- reductions

_BAD_P: dict[str, tuple[Any, type[BaseException], str]] = {
    "0": (0, ValueError, "positive `p`"),
    "-1": (-1, ValueError, "positive `p`"),
    "-inf": (-math.inf, ValueError, "positive `p`"),
    "nan": (math.nan, ValueError, "positive `p`"),
    "str": ("2", TypeError, "number as `p`, got str"),
    "None": (None, TypeError, "number as `p`, got NoneType"),
    "bool": (True, TypeError, "number as `p`, got bool"),
    "tensor": (torch.tensor(2.0), TypeError, "number as `p`, got Tensor"),
    "list": ([2], TypeError, "number as `p`, got list"),
    "numpy array": (np.array([2.0]), TypeError, "number as `p`, got ndarray"),
    "complex": (2j, TypeError, "number as `p`, got complex"),
}
_BAD_MAX_NORM: dict[str, tuple[Any, type[BaseException], str]] = {
    "nan": (math.nan, ValueError, "non-negative `max_norm`, got nan"),
    "-1": (-1.0, ValueError, "non-negative `max_norm`, got -1.0"),
    "-inf": (-math.inf, ValueError, "non-negative `max_norm`"),
    "str": ("1", TypeError, "`max_norm`, got str"),
    "None": (None, TypeError, "`max_norm`, got NoneType"),
    "bool": (True, TypeError, "`max_norm`, got bool"),
    "1-dim tensor": (torch.ones(2), TypeError, r"shape \(2,\)"),
    "list": ([1.0], TypeError, "`max_norm`, got list"),
    "numpy array": (np.ones(2), TypeError, "`max_norm`, got ndarray"),
    "complex": (1j, TypeError, "`max_norm`, got complex"),
}

REDUCTIONS = [
    *(
        _c(f"norm p={name}", lambda: (_p(),), lambda q, v=v: q.norm(v), e, m)
        for name, (v, e, m) in _BAD_P.items()
    ),
    *(
        _c(
            f"clip_norm p={name}",
            lambda: (_p(),),
            lambda q, v=v: q.clip_norm(1.0, p=v),
            e,
            m,
        )
        for name, (v, e, m) in _BAD_P.items()
    ),
    *(
        _c(
            f"clip_norm max_norm={name}",
            lambda: (_p(),),
            lambda q, v=v: q.clip_norm(v),
            e,
            m,
        )
        for name, (v, e, m) in _BAD_MAX_NORM.items()
    ),
    _c(
        "norm int entries",
        lambda: (_mixed(),),
        lambda q: q.norm(),
        TypeError,
        r"\['i'\]",
    ),
    _c(
        "norm two devices",
        lambda: (_devices(),),
        lambda q: q.norm(),
        ValueError,
        r"\['m'\]",
    ),
    _c(
        "sum two devices",
        lambda: (_devices(),),
        lambda q: q.sum(),
        ValueError,
        r"\['m'\]",
    ),
    _c(
        "isfinite two devices",
        lambda: (_devices(),),
        lambda q: q.isfinite(),
        ValueError,
        r"\['m'\]",
    ),
    _c(
        "to_vector two devices",
        lambda: (_devices(),),
        lambda q: q.to_vector(),
        ValueError,
        r"\['m'\]",
    ),
    _c(
        "to_vector two dtypes",
        lambda: (_mixed(),),
        lambda q: q.to_vector(),
        ValueError,
        r"\['i'\]",
    ),
    _c("dot None", lambda: (_p(),), lambda q: q.dot(None), TypeError, "mapping"),
    _c(
        "dot a list",
        lambda: (_p(), [torch.ones(2)]),
        lambda q, o: q.dot(o),
        TypeError,
        "mapping",
    ),
    _c(
        "dot a tensor",
        lambda: (_p(), torch.ones(2)),
        lambda q, o: q.dot(o),
        TypeError,
        "mapping",
    ),
    _c(
        "dot wrong keys",
        lambda: (_p(), {"w": torch.ones(2, 3)}),
        lambda q, o: q.dot(o),
        ValueError,
        r"missing \['b'\]",
    ),
    _c(
        "dot None values",
        lambda: (_p(), {"w": None, "b": None}),
        lambda q, o: q.dot(o),
        TypeError,
        r"\['b', 'w'\]",
    ),
    _c(
        "dot shapes",
        lambda: (_p(), {"w": torch.ones(3, 2), "b": torch.ones(3)}),
        lambda q, o: q.dot(o),
        ValueError,
        "'w'",
    ),
    _c(
        "dot dtypes",
        lambda: (_p(), {"w": torch.ones(2, 3), "b": torch.ones(3).double()}),
        lambda q, o: q.dot(o),
        ValueError,
        "'b'",
    ),
    _c(
        "dot meta",
        lambda: (_p(), {"w": torch.ones(2, 3, device="meta"), "b": torch.ones(3)}),
        lambda q, o: q.dot(o),
        ValueError,
        r"\['w'\]",
    ),
    _c(
        "dot numpy values",
        lambda: (_p(), {"w": np.ones((2, 3)), "b": np.ones(3)}),
        lambda q, o: q.dot(o),
        TypeError,
        r"\['b', 'w'\]",
    ),
]

_LIKE = _p
FROM_VECTOR = [
    _c(
        "from_vector list",
        lambda: ([1.0] * 9, _LIKE()),
        lambda v, like: ParamDict.from_vector(v, like=like),
        TypeError,
        "takes a tensor, got list",
    ),
    _c(
        "from_vector numpy",
        lambda: (np.ones(9), _LIKE()),
        lambda v, like: ParamDict.from_vector(v, like=like),
        TypeError,
        "got ndarray",
    ),
    _c(
        "from_vector None",
        lambda: (None, _LIKE()),
        lambda v, like: ParamDict.from_vector(v, like=like),
        TypeError,
        "got NoneType",
    ),
    _c(
        "from_vector 2-dim",
        lambda: (torch.ones(3, 3), _LIKE()),
        lambda v, like: ParamDict.from_vector(v, like=like),
        ValueError,
        "1-dim",
    ),
    _c(
        "from_vector 0-dim",
        lambda: (torch.ones(()), _LIKE()),
        lambda v, like: ParamDict.from_vector(v, like=like),
        ValueError,
        "1-dim",
    ),
    _c(
        "from_vector short",
        lambda: (torch.ones(8), _LIKE()),
        lambda v, like: ParamDict.from_vector(v, like=like),
        ValueError,
        "8 elements.*holds 9",
    ),
    _c(
        "from_vector long",
        lambda: (torch.ones(10), _LIKE()),
        lambda v, like: ParamDict.from_vector(v, like=like),
        ValueError,
        "10 elements",
    ),
    _c(
        "from_vector sparse",
        lambda: (torch.ones(9).to_sparse(), _LIKE()),
        lambda v, like: ParamDict.from_vector(v, like=like),
        TypeError,
        "dense",
    ),
    _c(
        "from_vector like list",
        lambda: (torch.ones(9), [torch.ones(9)]),
        lambda v, like: ParamDict.from_vector(v, like=like),
        TypeError,
        "mapping as `like`",
    ),
    _c(
        "from_vector like None",
        lambda: (torch.ones(9), None),
        lambda v, like: ParamDict.from_vector(v, like=like),
        TypeError,
        "mapping as `like`",
    ),
    _c(
        "from_vector like int key",
        lambda: (torch.ones(9), {1: torch.ones(9)}),
        lambda v, like: ParamDict.from_vector(v, like=like),
        TypeError,
        "must be str",
    ),
    _c(
        "from_vector like None value",
        lambda: (torch.ones(9), {"w": None}),
        lambda v, like: ParamDict.from_vector(v, like=like),
        TypeError,
        r"\['w'\]",
    ),
    _c(
        "from_vector like numpy value",
        lambda: (torch.ones(9), {"w": np.ones(9)}),
        lambda v, like: ParamDict.from_vector(v, like=like),
        TypeError,
        r"\['w'\]",
    ),
]

# ---------------------------------------------------------------- selection

SELECTION = [
    _c("select int", lambda: (_p(),), lambda q: q.select(1), TypeError, "got int"),
    _c(
        "select list",
        lambda: (_p(),),
        lambda q: q.select(["w"]),
        TypeError,
        r"got list.*\*patterns",
    ),
    _c(
        "select None",
        lambda: (_p(),),
        lambda q: q.select(None),
        TypeError,
        "got NoneType",
    ),
    _c(
        "select bytes",
        lambda: (_p(),),
        lambda q: q.select(b"w"),
        TypeError,
        "got bytes",
    ),
    _c(
        "select no match",
        lambda: (_p(),),
        lambda q: q.select("x*"),
        ValueError,
        r"\['x\*'\] match no key",
    ),
    _c("select case", lambda: (_p(),), lambda q: q.select("W"), ValueError, r"\['W'\]"),
    _c(
        "select one of two",
        lambda: (_p(),),
        lambda q: q.select("w", "zz"),
        ValueError,
        r"\['zz'\]",
    ),
    _c("exclude int", lambda: (_p(),), lambda q: q.exclude(0), TypeError, "got int"),
    _c(
        "exclude tuple",
        lambda: (_p(),),
        lambda q: q.exclude(("w",)),
        TypeError,
        "got tuple",
    ),
    _c(
        "exclude no match",
        lambda: (_p(),),
        lambda q: q.exclude("nope"),
        ValueError,
        r"\['nope'\]",
    ),
    _c(
        "filter returns a tensor",
        lambda: (_p(),),
        lambda q: q.filter(lambda k, v: v.sum() > 0),
        TypeError,
        "returned a tensor for 'w'",
    ),
    _c(
        "filter not callable",
        lambda: (_p(),),
        lambda q: q.filter("w"),
        TypeError,
        "`filter` takes a function of the key and the value as `pred`, got str",
    ),
    _c(
        "prefixed trailing dot",
        lambda: (_p(),),
        lambda q: q.prefixed("enc."),
        ValueError,
        "pass 'enc'",
    ),
    _c(
        "prefixed int",
        lambda: (_p(),),
        lambda q: q.prefixed(1),
        TypeError,
        "str prefix, got int",
    ),
    _c(
        "prefixed None",
        lambda: (_p(),),
        lambda q: q.prefixed(None),
        TypeError,
        "got NoneType",
    ),
    _c(
        "scoped no key",
        lambda: (_p(),),
        lambda q: q.scoped("enc"),
        ValueError,
        "'enc.'",
    ),
    _c(
        "scoped trailing dot",
        lambda: (_p(),),
        lambda q: q.scoped("w."),
        ValueError,
        "pass 'w'",
    ),
    _c(
        "scoped list", lambda: (_p(),), lambda q: q.scoped(["w"]), TypeError, "got list"
    ),
]

# ---------------------------------------------------------------- per-tensor methods

TENSORS = [
    _c(
        "to a bad device string",
        lambda: (_p(),),
        lambda q: q.to("nodevice"),
        (RuntimeError, ValueError),
        "device|nodevice",
    ),
    _c(
        "to a bad dtype",
        lambda: (_p(),),
        lambda q: q.to(dtype="float32"),
        TypeError,
        "dtype",
    ),
    _c(
        "requires_grad_ int entry",
        lambda: (_mixed(),),
        lambda q: q.requires_grad_(),
        ValueError,
        r"\['i'\]",
    ),
    _c(
        "requires_grad_(False) non-leaf",
        lambda: (ParamDict(w=torch.ones(2, requires_grad=True) * 2),),
        lambda q: q.requires_grad_(False),
        ValueError,
        r"\['w'\]",
    ),
    _c(
        "full_like str",
        lambda: (_p(),),
        lambda q: q.full_like("1"),
        TypeError,
        "got str",
    ),
    _c(
        "full_like None",
        lambda: (_p(),),
        lambda q: q.full_like(None),
        TypeError,
        "got NoneType",
    ),
    _c(
        "full_like bool",
        lambda: (_p(),),
        lambda q: q.full_like(True),
        TypeError,
        "got bool",
    ),
    _c(
        "full_like tensor",
        lambda: (_p(),),
        lambda q: q.full_like(torch.ones(())),
        TypeError,
        "got Tensor",
    ),
    _c(
        "full_like numpy",
        lambda: (_p(),),
        lambda q: q.full_like(np.ones(2)),
        TypeError,
        "got ndarray",
    ),
    _c(
        "randn_like int entry",
        lambda: (_mixed(),),
        lambda q: q.randn_like(),
        ValueError,
        "'i'",
    ),
    _c(
        "zeros_like bad dtype",
        lambda: (_p(),),
        lambda q: q.zeros_like(dtype="x"),
        TypeError,
        "dtype",
    ),
    _c(
        "map returns a number",
        lambda: (_p(),),
        lambda q: q.map(lambda v: 1.0),
        TypeError,
        r"'b': float, 'w': float",
    ),
    _c(
        "map returns None",
        lambda: (_p(),),
        lambda q: q.map(lambda v: None),
        TypeError,
        "'b': NoneType",
    ),
    _c(
        "map returns numpy",
        lambda: (_p(),),
        lambda q: q.map(lambda v: v.numpy()),
        TypeError,
        "ndarray",
    ),
    _c(
        "map other wrong keys",
        lambda: (_p(), {"w": 1}),
        lambda q, o: q.map(torch.add, o),
        ValueError,
        r"missing \['b'\]",
    ),
    _c(
        "map other a list",
        lambda: (_p(), [1, 2]),
        lambda q, o: q.map(torch.add, o),
        TypeError,
        "mapping",
    ),
    _c(
        "map_to_dict other None",
        lambda: (_p(),),
        lambda q: q.map_to_dict(torch.add, None),
        TypeError,
        "mapping",
    ),
]

# ---------------------------------------------------------------- stacking

_S = torch.ones(2)
STACKING = [
    _c("stack empty", lambda: ([],), ParamDict.stack, ValueError, "at least one"),
    _c(
        "stack None",
        lambda: (None,),
        ParamDict.stack,
        TypeError,
        "iterable of mappings",
    ),
    _c(
        "stack a ParamDict",
        lambda: (_p(),),
        ParamDict.stack,
        TypeError,
        "iterable of mappings|got str",
    ),
    _c("stack ints", lambda: ([1, 2],), ParamDict.stack, TypeError, "got int"),
    _c(
        "stack a tensor first",
        lambda: ([_S, {"w": _S}],),
        ParamDict.stack,
        TypeError,
        "got Tensor",
    ),
    _c(
        "stack a list second",
        lambda: ([{"w": _S}, [_S]],),
        ParamDict.stack,
        TypeError,
        "position 1",
    ),
    _c(
        "stack int key", lambda: ([{1: _S}],), ParamDict.stack, TypeError, "must be str"
    ),
    _c(
        "stack None key",
        lambda: ([{None: _S}],),
        ParamDict.stack,
        TypeError,
        "must be str",
    ),
    _c(
        "stack keys differ",
        lambda: ([{"w": _S}, {"v": _S}],),
        ParamDict.stack,
        ValueError,
        r"position 1.*missing \['w'\]",
    ),
    _c(
        "stack extra key",
        lambda: ([{"w": _S}, {"w": _S, "v": _S}],),
        ParamDict.stack,
        ValueError,
        r"unexpected \['v'\]",
    ),
    _c(
        "stack shapes differ",
        lambda: ([{"w": _S}, {"w": torch.ones(3)}],),
        ParamDict.stack,
        ValueError,
        "'w' has",
    ),
    _c(
        "stack dtypes differ",
        lambda: ([{"w": _S}, {"w": _S.double()}],),
        ParamDict.stack,
        ValueError,
        "'w' has",
    ),
    _c(
        "stack devices differ",
        lambda: ([{"w": _S}, {"w": torch.ones(2, device="meta")}],),
        ParamDict.stack,
        ValueError,
        "'w' has",
    ),
    _c(
        "stack None value",
        lambda: ([{"w": None}],),
        ParamDict.stack,
        TypeError,
        "'w' is not always",
    ),
    _c(
        "stack numpy value",
        lambda: ([{"w": np.ones(2)}],),
        ParamDict.stack,
        TypeError,
        "'w' is not always",
    ),
    _c(
        "unstack empty",
        lambda: (ParamDict(),),
        lambda q: q.unstack(),
        ValueError,
        "empty",
    ),
    _c(
        "unstack 0-dim",
        lambda: (ParamDict(w=torch.ones(()), v=torch.ones(2)),),
        lambda q: q.unstack(),
        ValueError,
        r"\['w'\] are",
    ),
    _c(
        "unstack sizes differ",
        lambda: (ParamDict(w=torch.ones(2), v=torch.ones(3)),),
        lambda q: q.unstack(),
        ValueError,
        "'v': 3, 'w': 2",
    ),
]

ALL = unique_ids(REDUCTIONS + FROM_VECTOR + SELECTION + TENSORS + STACKING)


@pytest.mark.parametrize("case", [c.param() for c in ALL])
def test_bad_input_is_refused_and_nothing_changes(case: Case) -> None:
    """The call raises a clear error and every operand is bit-identical after."""
    check(case)
