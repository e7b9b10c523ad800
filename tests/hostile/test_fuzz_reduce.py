"""Fuzzing the reductions, and the vector pair `to_vector` / `from_vector`.

The reductions are `norm`, `dot`, `sum`, `numel`, `isfinite` and `clip_norm`.

Each meets hostile arguments (see `fuzz.py`) and must give what the same reduction
written with plain torch over the flattened entries gives, or a clear error naming
the argument or key, with nothing changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
    paramdict_values,
    params,
    positive,
    self_values,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from paramdict import ParamDict

SELF = Arg("self", *self_values(grad=lambda: base(requires_grad=True)))

# torch builds `vector_norm` with `_add_docstr`, which leaves it untyped.
_vector_norm: Any = torch.linalg.vector_norm


def _flat(p: Mapping[str, Tensor]) -> Tensor:
    return torch.cat([v.reshape(-1) for v in p.values()])


def _norm_reference(p: Mapping[str, Tensor], order: float = 2) -> Tensor:
    """The norm of the entries' norms (dtypes promoted as `torch.stack` does)."""
    values = [v for v in p.values() if v.numel()]
    if not values:
        return torch.zeros(())
    norms = [_vector_norm(v, float(order)) for v in values]
    total: Tensor = _vector_norm(torch.stack(norms), float(order))
    return total


def _dot_reference(p: Mapping[str, Tensor], other: Mapping[str, Tensor]) -> Tensor:
    if not p:
        return torch.zeros(())
    return torch.dot(_flat(p), torch.cat([other[k].reshape(-1) for k in p]))


def _sum_reference(p: Mapping[str, Tensor]) -> Tensor:
    return torch.stack([v.sum() for v in p.values()]).sum() if p else torch.zeros(())


def _clip(q: ParamDict, max_norm: Any, **kw: Any) -> dict[str, Tensor]:
    return dict(q.clip_norm(max_norm, **kw).detach())


def _clip_reference(
    q: Mapping[str, Tensor], max_norm: Any, **kw: Any
) -> dict[str, Tensor]:
    """`torch.nn.utils.clip_grad_norm_` on leaves whose `.grad` are the entries."""
    leaves = []
    for v in q.values():
        leaf = torch.zeros_like(v, requires_grad=True)
        leaf.grad = v.detach().clone()
        leaves.append(leaf)
    if isinstance(max_norm, Tensor):
        max_norm = max_norm.item()
    # Empty entries add nothing to any norm (documented); torch's foreach norm
    # refuses them for the infinity norm, so they are left out of its call.
    filled = [leaf for leaf in leaves if leaf.numel()]
    torch.nn.utils.clip_grad_norm_(filled, max_norm, norm_type=kw.get("p", 2))
    return {k: leaf.grad for k, leaf in zip(q, leaves) if leaf.grad is not None}


def _vector_like(b: dict[str, Any]) -> Tensor:
    return torch.arange(9.0)


def _from_vector_reference(
    vector: Tensor, *, like: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    sizes = [v.numel() for v in like.values()]
    pieces = torch.split(vector, sizes)
    return {k: piece.reshape(v.shape) for (k, v), piece in zip(like.items(), pieces)}


_ORDERS = number_values("p", (2, 1), tensors_ok=False)
_ORDER_VALID = (*_ORDERS[0], Value("p=inf", lambda b: math.inf))

ENTRIES = [
    Entry(
        "p.norm",
        ParamDict.norm,
        (SELF, Arg("p", _ORDER_VALID, _ORDERS[1])),
        reference=_norm_reference,
    ),
    Entry(
        "p.dot",
        ParamDict.dot,
        (
            SELF,
            Arg(
                "other",
                (
                    *paramdict_values("other", lambda b: positive(), also=("`dot`",))[
                        0
                    ],
                    Value("alias of self", lambda b: b["self"], alias_of="self"),
                ),
                paramdict_values("other", lambda b: positive(), also=("`dot`",))[1],
            ),
        ),
        reference=_dot_reference,
    ),
    Entry("p.sum()", ParamDict.sum, (SELF,), reference=_sum_reference),
    Entry(
        "p.numel()",
        ParamDict.numel,
        (SELF,),
        reference=lambda p: sum(v.numel() for v in p.values()),
    ),
    Entry(
        "p.isfinite()",
        ParamDict.isfinite,
        (SELF,),
        reference=lambda p: all(bool(torch.isfinite(v).all()) for v in p.values()),
    ),
    Entry(
        "p.clip_norm",
        _clip,
        (
            SELF,
            Arg("max_norm", *number_values("max_norm", (1.0, 100.0))),
            Arg("p", _ORDER_VALID, _ORDERS[1], keyword=True),
        ),
        reference=_clip_reference,
    ),
    Entry(
        "p.to_vector()",
        ParamDict.to_vector,
        (SELF,),
        reference=lambda p: _flat(p) if p else torch.empty(0),
    ),
    Entry(
        "ParamDict.from_vector",
        ParamDict.from_vector,
        (
            Arg(
                "vector",
                (Value("arange(9)", _vector_like),),
                (
                    Value("None", lambda b: None, ("vector", "NoneType")),
                    Value("a list", lambda b: list(range(9)), ("vector", "list")),
                    Value("2-dim", lambda b: torch.ones(3, 3), ("vector", "1-dim")),
                    Value("too short", lambda b: torch.ones(8), ("vector", "elements")),
                    Value(
                        "sparse",
                        lambda b: _vector_like(b).to_sparse(),
                        ("vector", "dense"),
                    ),
                    Value("meta", lambda b: torch.ones(9, device="meta"), ("vector",)),
                    Value("int64", lambda b: torch.arange(9), ("vector",)),
                    Value("0-dim", lambda b: torch.tensor(1.0), ("vector", "1-dim")),
                ),
            ),
            Arg(
                "like",
                paramdict_values("like", lambda b: base())[0],
                paramdict_values(
                    "like",
                    lambda b: base(),
                    kinds=("0-dim", "zero-size", "None", "str"),
                )[1][:4],
                keyword=True,
            ),
        ),
        reference=_from_vector_reference,
    ),
]


@pytest.mark.parametrize("entry", params(ENTRIES))
@FUZZ
@given(data=st.data())
def test_fuzz_reductions(entry: Entry, data: st.DataObject) -> None:
    """Hostile arguments give torch's answer or a clear error, and change nothing."""
    check_entry(entry, data)
