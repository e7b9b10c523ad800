"""Fuzzing the container: construction, merging, equality, selection and stacking.

Also the per-entry methods (`to`, `requires_grad_`, the `*_like` family, `map`).

Each entry point meets hostile arguments (see `fuzz.py`) and must give what torch
(or a plain `dict`) gives, or a clear error naming the argument or key, with
nothing changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
import torch
from fuzz import (
    ENTRY_KINDS,
    FUZZ,
    KEYS,
    OMIT,
    Arg,
    Entry,
    Value,
    base,
    check_entry,
    entry_values,
    flag_values,
    not_callables,
    number_values,
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
KEYED = tuple(repr(k) for k in KEYS)


def _other(b: dict[str, Any]) -> ParamDict:
    return positive()


# ---------------------------------------------------------------- construction


_MAPPING = Arg(
    "mapping_or_pairs",
    (
        Value("a dict", lambda b: dict(base())),
        Value("a ParamDict", lambda b: base()),
        Value("pairs", lambda b: list(base().items())),
        Value("nothing", lambda b: OMIT),
    ),
    (
        *entry_values(lambda b: base(), make=dict),
        Value("None", lambda b: None, ("mapping",)),
        Value("a str", lambda b: "wb", ("mapping",)),
        Value("an int", lambda b: 5, ("mapping",)),
        Value("a tensor", lambda b: torch.ones(2), ("mapping",)),
        Value("short pairs", lambda b: [("w",)], ("mapping",)),
        Value("an int key", lambda b: {1: torch.ones(2)}, ("1",)),
        Value("a None key", lambda b: {None: torch.ones(2)}, ("None",)),
        Value("a tuple key", lambda b: {("w",): torch.ones(2)}, ("('w',)",)),
        Value("numpy", lambda b: np.ones(2), ("mapping",)),
    ),
)


def _equal_reference(p: Mapping[str, Tensor], other: Any) -> bool:
    """What `p == other` promises: a mapping with the same keys and equal tensors."""
    if not isinstance(other, Mapping) or set(other) != set(p):
        return False
    for key, value in p.items():
        theirs = other[key]
        if not isinstance(theirs, Tensor):
            return False
        if (theirs.shape, theirs.dtype, theirs.device) != (
            value.shape,
            value.dtype,
            value.device,
        ):
            return False
        if theirs.layout != value.layout:
            return False
        if value.is_meta:
            continue
        if not torch.equal(value.to_dense(), theirs.to_dense()):
            return False
    return True


def _allclose_reference(p: Mapping[str, Tensor], other: Any, **kw: Any) -> bool:
    return all(torch.allclose(v, other[k], **kw) for k, v in p.items())


_PATTERNS = (
    Value("'w'", lambda b: "w"),
    Value("'*'", lambda b: "*"),
    Value("'[wb]'", lambda b: "[wb]"),
)
_BAD_PATTERNS = (
    Value("None", lambda b: None, ("patterns", "NoneType")),
    Value("1", lambda b: 1, ("patterns", "int")),
    Value("a list", lambda b: ["w"], ("patterns", "list")),
    Value("'nothing'", lambda b: "nothing", ("'nothing'",)),
    Value("''", lambda b: "", ("''",)),
    Value("'w.'", lambda b: "w.", ("'w.'",)),
)


def _select_reference(
    p: Mapping[str, Tensor], *patterns: str, missing_ok: bool = False
) -> dict[str, Tensor]:
    import fnmatch

    return {
        k: v for k, v in p.items() if any(fnmatch.fnmatchcase(k, x) for x in patterns)
    }


def _exclude_reference(
    p: Mapping[str, Tensor], *patterns: str, missing_ok: bool = False
) -> dict[str, Tensor]:
    import fnmatch

    return {
        k: v
        for k, v in p.items()
        if not any(fnmatch.fnmatchcase(k, x) for x in patterns)
    }


_PREFIXES = (Value("'enc'", lambda b: "enc"), Value("'a.b'", lambda b: "a.b"))
_BAD_PREFIXES = (
    Value("None", lambda b: None, ("prefix", "NoneType")),
    Value("1", lambda b: 1, ("prefix", "int")),
    Value("'enc.'", lambda b: "enc.", ("'enc.'",)),
    Value("''", lambda b: "", ("''", "prefix")),
)


def _scoped_self() -> ParamDict:
    return base().prefixed("enc") | {"head": torch.ones(2)}


def _second(value: Value) -> Value:
    """`[base(), value]`: a second member with a hostile entry."""
    return Value(
        f"second with {value.label}", lambda b: [base(), value.build(b)], value.blame
    )


def _stack_members(b: dict[str, Any]) -> list[ParamDict]:
    return [base(), base(shift=1.0)]


_STACK = Arg(
    "paramdicts",
    (
        Value("two", lambda b: _stack_members(b)),
        Value("a generator", lambda b: (q for q in _stack_members(b))),
        Value("dicts", lambda b: [dict(q) for q in _stack_members(b)]),
        Value("one twice", lambda b: [base()] * 2),
    ),
    (
        Value("None", lambda b: None, ("paramdicts", "NoneType")),
        Value("none", lambda b: [], ("none", "at least one")),
        Value("a ParamDict", lambda b: base(), ("paramdicts",)),
        Value("a None among them", lambda b: [base(), None], ("position 1",)),
        Value(
            "a tensor among them", lambda b: [base(), torch.ones(2)], ("position 1",)
        ),
        Value("a missing key", lambda b: [base(), base().exclude("b")], ("'b'",)),
        Value(
            "an extra key", lambda b: [base(), base() | {"x": torch.ones(1)}], ("'x'",)
        ),
        *(_second(v) for v in entry_values(lambda b: base())),
    ),
)


def _stack_reference(ds: Any) -> dict[str, Tensor]:
    members = list(ds)
    return {k: torch.stack([d[k] for d in members]) for k in members[0]}


# ---------------------------------------------------------------- per-entry methods

_DTYPES = (
    Value("float64", lambda b: torch.float64),
    Value("float16", lambda b: torch.float16),
    Value("complex64", lambda b: torch.complex64),
    Value("left out", lambda b: OMIT),
)
# `p.to(x)` is `Tensor.to(x)` per entry: torch's refusal is named with the entry.
_BAD_DTYPES = (
    Value("dtype=int32", lambda b: torch.int32, ("requires_grad", "int32")),
    Value("dtype='float64'", lambda b: "float64", ("dtype", *KEYED)),
    Value("dtype=float", lambda b: float, ("dtype", *KEYED)),
    Value("dtype=None", lambda b: None, ("dtype", *KEYED)),
    Value("dtype=1", lambda b: 1, ("dtype", *KEYED)),
)
_DEVICES = (
    Value("'cpu'", lambda b: "cpu"),
    Value("torch.device('cpu')", lambda b: torch.device("cpu")),
    Value("'meta'", lambda b: "meta"),
    Value("left out", lambda b: OMIT),
)
_BAD_DEVICES = (
    Value("device='nowhere'", lambda b: "nowhere", ("device", "'nowhere'", *KEYED)),
    Value("device=1.5", lambda b: 1.5, ("device", *KEYED)),
    Value("device=[]", lambda b: [], ("device", *KEYED)),
)


def _like(name: str, fn: Any, *, fill: bool = False) -> Entry:
    args = [SELF]
    if fill:
        valid, hostile = number_values("fill_value", (0.5, 3), tensors_ok=False)
        # A number the entries' dtype cannot hold is named with the entry.
        hostile = tuple(Value(v.label, v.build, (*v.blame, *KEYED)) for v in hostile)
        args.append(Arg("fill_value", valid, hostile))
    args += [
        Arg("dtype", _DTYPES, _BAD_DTYPES, keyword=True),
        Arg("device", _DEVICES, _BAD_DEVICES, keyword=True),
        Arg("requires_grad", *flag_values("requires_grad"), keyword=True),
    ]
    return Entry(
        f"p.{name}", getattr(ParamDict, name), tuple(args), reference=per_entry(fn)
    )


def _kinds(p: Mapping[str, Tensor]) -> dict[str, Any]:
    """What an uninitialized result can be compared by: everything but values."""
    return {k: (v.dtype, v.shape, v.device, v.requires_grad) for k, v in p.items()}


def _empty_like(p: ParamDict, **kw: Any) -> dict[str, Any]:
    return _kinds(p.empty_like(**kw))


def _empty_like_reference(p: Mapping[str, Tensor], **kw: Any) -> dict[str, Any]:
    return _kinds({k: torch.empty_like(v, **kw) for k, v in p.items()})


def _randn_like_reference(
    p: Mapping[str, Tensor], *, requires_grad: bool = False, **kw: Any
) -> dict[str, Tensor]:
    """Normal samples drawn entry by entry in key order, from the same seed."""
    return {
        k: torch.empty_like(v, **kw).normal_().requires_grad_(requires_grad)
        for k, v in p.items()
    }


def _same_tensors(b: dict[str, Any]) -> dict[str, Tensor]:
    return dict(b["self"])


_UPDATE = Arg(
    "mapping",
    (Value("the same tensors", _same_tensors), Value("nothing", lambda b: {})),
    (
        Value("a new tensor at 'w'", lambda b: {"w": torch.ones(2, 3)}, ("'w'",)),
        Value("None at 'w'", lambda b: {"w": None}, ("'w'",)),
        Value("a new key 'x'", lambda b: {"x": torch.ones(1)}, ("'x'",)),
    ),
)


def _requires_grad_(p: ParamDict, *args: Any) -> dict[str, Any]:
    return {k: v.requires_grad for k, v in p.requires_grad_(*args).items()}


def _requires_grad_reference(p: ParamDict, *args: Any) -> dict[str, Any]:
    return {k: v.requires_grad_(*args).requires_grad for k, v in p.items()}


_MAP_FNS = (
    Value("torch.neg", lambda b: torch.neg),
    Value("torch.add", lambda b: torch.add),
)
_BAD_MAP_FNS = (
    *not_callables("fn"),
    Value("fn gives None", lambda b: lambda *v: None, ("'w'", "'b'")),
    Value("fn gives an int", lambda b: lambda *v: 1, ("'w'", "'b'")),
)


# What `fn` raises propagates unchanged, with a note naming the entry (documented).
_PASSED_ON = (RuntimeError,)


def _map_reference(p: Mapping[str, Tensor], fn: Any, *others: Any) -> dict[str, Any]:
    return {k: fn(v, *(o[k] for o in others)) for k, v in p.items()}


ENTRIES = [
    Entry("ParamDict(...)", ParamDict, (_MAPPING,), reference=lambda m=(): dict(m)),
    Entry(
        "p | other",
        lambda p, o: p | o,
        (SELF, Arg("other", *paramdict_values("other", _other, also=("|",)))),
        reference=lambda p, o: {**p, **o},
    ),
    Entry(
        "other | p",
        lambda p, o: o | p,
        (SELF, Arg("other", *paramdict_values("other", _other, also=("|",)))),
        reference=lambda p, o: {**o, **p},
    ),
    Entry(
        "p == other",
        lambda p, o: p == o,
        (
            Arg(
                "self",
                SELF.valid,
                tuple(v for v in SELF.hostile if "meta" not in v.label),
            ),
            Arg(
                "other",
                (Value("alias of self", lambda b: b["self"], alias_of="self"),)
                + paramdict_values("other", _other)[0],
                paramdict_values("other", _other)[1],
            ),
        ),
        reference=_equal_reference,
    ),
    Entry(
        "p.allclose",
        ParamDict.allclose,
        (
            SELF,
            Arg("other", *paramdict_values("other", _other, also=("`allclose`",))),
            Arg(
                "rtol", *number_values("rtol", (1e-5,), tensors_ok=False), keyword=True
            ),
            Arg(
                "atol", *number_values("atol", (1e-8,), tensors_ok=False), keyword=True
            ),
            Arg("equal_nan", *flag_values("equal_nan"), keyword=True),
        ),
        reference=_allclose_reference,
    ),
    Entry(
        "ParamDict.fromkeys",
        ParamDict.fromkeys,
        (
            Arg(
                "keys",
                (
                    Value("['w', 'b']", lambda b: ["w", "b"]),
                    Value("a ParamDict", lambda b: base()),
                ),
                (
                    Value("[1]", lambda b: [1], ("1",)),
                    Value("None", lambda b: None, ("keys", "NoneType")),
                    Value("5", lambda b: 5, ("keys", "int")),
                ),
            ),
            Arg(
                "value",
                (Value("ones", lambda b: torch.ones(2)),),
                (
                    Value("None", lambda b: None, ("NoneType", "value")),
                    Value("1.5", lambda b: 1.5, ("float", "value")),
                ),
            ),
        ),
        reference=lambda keys, value: dict.fromkeys(keys, value),
    ),
    Entry(
        "p[key]",
        lambda p, k: p[k],
        (
            SELF,
            Arg(
                "key",
                (Value("'w'", lambda b: "w"),),
                (
                    Value("'x'", lambda b: "x", ("'x'",)),
                    Value("1", lambda b: 1, ("1",)),
                    Value("None", lambda b: None, ("None",)),
                ),
            ),
        ),
        errors=(KeyError,),
        reference=lambda p, k: dict(p)[k],
    ),
    Entry(
        "p.select",
        lambda p, x, **kw: p.select(x, **kw),
        (
            SELF,
            Arg("patterns", _PATTERNS, _BAD_PATTERNS),
            Arg("missing_ok", *flag_values("missing_ok"), keyword=True),
        ),
        reference=_select_reference,
    ),
    Entry(
        "p.exclude",
        lambda p, x, **kw: p.exclude(x, **kw),
        (
            SELF,
            Arg("patterns", _PATTERNS, _BAD_PATTERNS),
            Arg("missing_ok", *flag_values("missing_ok"), keyword=True),
        ),
        reference=_exclude_reference,
    ),
    Entry(
        "p.prefixed",
        ParamDict.prefixed,
        (SELF, Arg("prefix", _PREFIXES, _BAD_PREFIXES)),
        reference=lambda p, x: {f"{x}.{k}" if x else k: v for k, v in p.items()},
    ),
    Entry(
        "p.scoped",
        ParamDict.scoped,
        (
            Arg("self", (Value("self", lambda b: _scoped_self()),)),
            Arg("prefix", (Value("'enc'", lambda b: "enc"),), _BAD_PREFIXES),
            Arg("missing_ok", *flag_values("missing_ok"), keyword=True),
        ),
    ),
    Entry(
        "p.filter",
        ParamDict.filter,
        (
            SELF,
            Arg(
                "pred",
                (
                    Value(
                        "keys starting with w", lambda b: lambda k, v: k.startswith("w")
                    ),
                ),
                (
                    *not_callables("pred"),
                    Value(
                        "pred gives a tensor", lambda b: lambda k, v: v, ("'w'", "'b'")
                    ),
                ),
            ),
        ),
    ),
    Entry("p.trainable()", ParamDict.trainable, (SELF,)),
    Entry("ParamDict.stack", ParamDict.stack, (_STACK,), reference=_stack_reference),
    Entry(
        "p.unstack()",
        ParamDict.unstack,
        (
            Arg(
                "self",
                (
                    Value(
                        "stacked", lambda b: ParamDict.stack([base(), base(shift=1.0)])
                    ),
                ),
                (
                    *(v for v in SELF.hostile if v.label != "self=empty"),
                    Value("first sizes differ", lambda b: base(), ("'w'", "'b'")),
                    Value("empty", lambda b: ParamDict(), ("empty",)),
                ),
            ),
        ),
        reference=lambda p: [
            dict(zip(p, row)) for row in zip(*(v.unbind(0) for v in p.values()))
        ],
    ),
    Entry("p.detach()", ParamDict.detach, (SELF,), reference=per_entry(Tensor.detach)),
    Entry("p.clone()", ParamDict.clone, (SELF,), reference=per_entry(Tensor.clone)),
    Entry(
        "p.to(dtype)",
        lambda p, d: p.to(d),
        (SELF, Arg("dtype", _DTYPES[:-1], _BAD_DTYPES)),
        reference=per_entry(Tensor.to),
    ),
    Entry(
        "p.to(device)",
        lambda p, d: p.to(d),
        (SELF, Arg("device", _DEVICES[:-1], _BAD_DEVICES)),
        reference=per_entry(Tensor.to),
    ),
    Entry(
        "p.requires_grad_",
        _requires_grad_,
        (SELF, Arg("requires_grad", *flag_values("requires_grad"))),
        reference=_requires_grad_reference,
        pure=False,
    ),
    _like("zeros_like", torch.zeros_like),
    Entry(
        "p.empty_like",
        _empty_like,
        _like("empty_like", torch.empty_like).args,
        reference=_empty_like_reference,
    ),
    Entry(
        "p.randn_like",
        ParamDict.randn_like,
        _like("randn_like", torch.randn_like).args,
        reference=_randn_like_reference,
    ),
    Entry(
        "p.update",
        lambda p, m: p.update(m),
        (SELF, _UPDATE),
        reference=lambda p, m: None,
    ),
    _like("ones_like", torch.ones_like),
    _like("full_like", torch.full_like, fill=True),
    Entry(
        "p.map",
        ParamDict.map,
        (
            SELF,
            Arg("fn", _MAP_FNS[:1], _BAD_MAP_FNS),
        ),
        passed_on=_PASSED_ON,
        reference=_map_reference,
    ),
    Entry(
        "p.map with another",
        ParamDict.map,
        (
            SELF,
            Arg("fn", _MAP_FNS[1:], _BAD_MAP_FNS),
            Arg(
                "other",
                *paramdict_values(
                    "other", _other, kinds=ENTRY_KINDS[:3], also=("`map`",)
                ),
            ),
        ),
        passed_on=_PASSED_ON,
        reference=_map_reference,
    ),
    Entry(
        "p.map_to_dict",
        ParamDict.map_to_dict,
        (
            SELF,
            Arg(
                "fn",
                (Value("shape", lambda b: lambda v: tuple(v.shape)),),
                not_callables("fn"),
            ),
        ),
        reference=lambda p, fn: {k: fn(v) for k, v in p.items()},
    ),
]


@pytest.mark.parametrize("entry", params(ENTRIES))
@FUZZ
@given(data=st.data())
def test_fuzz_container(entry: Entry, data: st.DataObject) -> None:
    """Hostile arguments give torch's answer or a clear error, and change nothing."""
    check_entry(entry, data)
