"""Fuzzing the arithmetic: operators, torch-named methods and elementwise functions.

Each entry point meets hostile operands (see `fuzz.py`) and must give what the same
torch function gives entry by entry, or a clear error naming the operand or key,
with nothing changed.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
from fuzz import (
    FUZZ,
    Arg,
    Entry,
    Value,
    base,
    check_entry,
    number_values,
    operand_values,
    paramdict_values,
    params,
    per_entry,
    positive,
    self_values,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from paramdict import ParamDict

SELF = Arg("self", *self_values(grad=lambda: base(requires_grad=True)))


def _operator(
    symbol: str, op: Callable[[Any, Any], Any], *, reflected: bool = False
) -> Entry:
    other = Arg("other", *operand_values("other", also=(symbol,)))
    if reflected:
        return Entry(
            f"other {symbol} p",
            lambda p, o: op(o, p),
            (SELF, other),
            reference=per_entry(lambda v, o: op(o, v)),
        )
    return Entry(f"p {symbol} other", op, (SELF, other), reference=per_entry(op))


def _method(name: str, fn: Callable[..., Tensor], *, alpha: bool = False) -> Entry:
    args = [SELF, Arg("other", *operand_values("other", also=(f"`{name}`",)))]
    if alpha:
        args.append(Arg("alpha", *number_values("alpha"), keyword=True))
    return Entry(
        f"p.{name}",
        getattr(ParamDict, name),
        tuple(args),
        reference=per_entry(fn),
    )


def _unary(name: str, fn: Callable[[Tensor], Tensor]) -> Entry:
    return Entry(
        f"p.{name}()", getattr(ParamDict, name), (SELF,), reference=per_entry(fn)
    )


def _add(v: Tensor, o: Any, alpha: Any = 1) -> Tensor:
    # A tensor `alpha` is documented as kept in the graph: `v + alpha * o`.
    return v + alpha * o if isinstance(alpha, Tensor) else torch.add(v, o, alpha=alpha)


def _sub(v: Tensor, o: Any, alpha: Any = 1) -> Tensor:
    return v - alpha * o if isinstance(alpha, Tensor) else torch.sub(v, o, alpha=alpha)


def _addcmul(v: Tensor, a: Tensor, c: Tensor, value: Any = 1) -> Tensor:
    if isinstance(value, Tensor):  # kept in the graph: `v + value * (a * c)`
        return v + value * (a * c)
    return torch.addcmul(v, a, c, value=value)


def _addcdiv(v: Tensor, a: Tensor, c: Tensor, value: Any = 1) -> Tensor:
    if isinstance(value, Tensor):
        return v + value * (a / c)
    return torch.addcdiv(v, a, c, value=value)


def _clamp(v: Tensor, min: Any = None, max: Any = None) -> Tensor:
    # The documented order: `min` first, then `max` (as `torch.clamp` for numbers).
    # `clamp_min`/`clamp_max`: `torch.clamp` with one bound, NaN, returns its input
    # unchanged on torch 2.6 (NaN on 2.13, as `clamp_min` everywhere).
    out = v if min is None else torch.clamp_min(v, min)
    return out if max is None else torch.clamp_max(out, max)


def _max(v: Tensor, o: Any) -> Tensor:
    return torch.maximum(v, o) if isinstance(o, Tensor) else torch.clamp_min(v, o)


def _min(v: Tensor, o: Any) -> Tensor:
    return torch.minimum(v, o) if isinstance(o, Tensor) else torch.clamp_max(v, o)


def _like_positive(b: dict[str, Any]) -> ParamDict:
    return positive()


def _conditions(b: dict[str, Any]) -> ParamDict:
    return ParamDict(
        w=torch.tensor([[True, False, True], [False, True, False]]),
        b=torch.tensor([False, True, True]),
    )


_CONDITION = Arg(
    "condition",
    (
        *paramdict_values("condition", _conditions)[0],
        Value("condition=all true", lambda b: _conditions(b).map(torch.ones_like)),
    ),
    paramdict_values("condition", _conditions)[1],
)

ENTRIES = [
    _operator("+", operator.add),
    _operator("-", operator.sub),
    _operator("*", operator.mul),
    _operator("/", operator.truediv),
    _operator("**", operator.pow),
    _operator("+", operator.add, reflected=True),
    _operator("-", operator.sub, reflected=True),
    _operator("*", operator.mul, reflected=True),
    _operator("/", operator.truediv, reflected=True),
    _operator("**", operator.pow, reflected=True),
    _method("add", _add, alpha=True),
    _method("sub", _sub, alpha=True),
    _method("mul", torch.mul),
    _method("div", torch.div),
    _method("pow", torch.pow),
    _method("maximum", _max),
    _method("minimum", _min),
    Entry(
        "p.lerp",
        ParamDict.lerp,
        (
            SELF,
            Arg("end", *paramdict_values("end", _like_positive)),
            Arg("weight", *operand_values("weight")),
        ),
        reference=per_entry(torch.lerp),
    ),
    *(
        Entry(
            f"p.{name}",
            getattr(ParamDict, name),
            (
                SELF,
                Arg("tensor1", *paramdict_values("tensor1", _like_positive)),
                Arg("tensor2", *paramdict_values("tensor2", _like_positive)),
                Arg("value", *operand_values("value"), keyword=True),
            ),
            reference=per_entry(fn),
        )
        for name, fn in (("addcmul", _addcmul), ("addcdiv", _addcdiv))
    ),
    Entry(
        "p.clamp",
        ParamDict.clamp,
        (
            SELF,
            Arg("min", *operand_values("min"), keyword=True),
            Arg("max", *operand_values("max"), keyword=True),
        ),
        reference=per_entry(_clamp),
    ),
    Entry(
        "p.where",
        ParamDict.where,
        (SELF, _CONDITION, Arg("other", *operand_values("other"))),
        reference=per_entry(lambda v, c, o: torch.where(c, v, o)),
    ),
    Entry("-p", operator.neg, (SELF,), reference=per_entry(operator.neg)),
    Entry("+p", operator.pos, (SELF,), reference=per_entry(operator.pos)),
    Entry("abs(p)", operator.abs, (SELF,), reference=per_entry(operator.abs)),
    _unary("neg", torch.neg),
    _unary("abs", torch.abs),
    _unary("sqrt", torch.sqrt),
    _unary("rsqrt", torch.rsqrt),
    _unary("exp", torch.exp),
    _unary("log", torch.log),
    _unary("sign", torch.sign),
    _unary("reciprocal", torch.reciprocal),
]


@pytest.mark.parametrize("entry", params(ENTRIES))
@FUZZ
@given(data=st.data())
def test_fuzz_arithmetic(entry: Entry, data: st.DataObject) -> None:
    """Hostile operands give torch's answer or a clear error, and change nothing."""
    check_entry(entry, data)
