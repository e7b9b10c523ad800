"""Fuzzing the collectives on one process: `all_reduce`, `broadcast`, `all_gather`.

A one-process gloo group stands in for the real thing (the argument checks and the
agreement step run the same; every collective of one process returns its input).
Each meets hostile arguments (see `fuzz.py`) and must give that result, or a clear
error naming the argument or key, with nothing changed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch
import torch.distributed as dist
from fuzz import (
    FUZZ,
    Arg,
    Entry,
    Value,
    base,
    check_entry,
    constant,
    entry_values,
    number_values,
    params,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor
from torch._C._distributed_c10d import HashStore  # typed; `dist.HashStore` is not

from paramdict import ParamDict
from paramdict.distributed import all_gather, all_reduce, broadcast


@pytest.fixture(scope="module", autouse=True)
def _one_process_group() -> Iterator[None]:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


_P = Arg(
    "p",
    (
        Value("p", lambda b: base()),
        Value("requiring grad", lambda b: base(requires_grad=True)),
        Value("empty", lambda b: ParamDict()),
    ),
    (
        Value(
            "an int64 entry 'n'", lambda b: base() | {"n": torch.arange(3)}, ("'n'",)
        ),
        *entry_values(
            lambda b: base(),
            kinds=(
                "0-dim",
                "zero-size",
                "meta",
                "sparse",
                "complex64",
                "float16",
                "int64",
                "bool",
                "nan",
                "non-contiguous",
                "non-leaf",
            ),
        ),
        Value(
            "p=dict",
            lambda b: dict(base()),
            ("p", "`all_reduce`", "`broadcast`", "`all_gather`"),
        ),
        Value(
            "p=None",
            lambda b: None,
            ("p", "`all_reduce`", "`broadcast`", "`all_gather`"),
        ),
    ),
)
_CAP = Arg(
    "bucket_cap_mb",
    *number_values("bucket_cap_mb", (25.0, 1e-6), tensors_ok=False),
    keyword=True,
)
_GROUP = Arg(
    "group",
    (Value("default group", lambda b: None),),
    (
        Value("group='world'", lambda b: "world", ("group",)),
        Value("group=0", lambda b: 0, ("group",)),
    ),
    keyword=True,
)
_OPS = ("sum", "mean", "max", "min", "product")


def _same_values(p: Mapping[str, Tensor], **kw: Any) -> dict[str, Tensor]:
    """What a collective of one process returns: the values, detached."""
    return {k: v.detach() for k, v in p.items()}


ENTRIES = [
    Entry(
        "all_reduce",
        all_reduce,
        (
            _P,
            Arg(
                "op",
                tuple(Value(f"op={o!r}", constant(o)) for o in _OPS),
                (
                    Value("op='SUM'", lambda b: "SUM", ("op",)),
                    Value("op=None", lambda b: None, ("op",)),
                    Value("op=ReduceOp.SUM", lambda b: dist.ReduceOp.SUM, ("op",)),
                ),
                keyword=True,
            ),
            _GROUP,
            _CAP,
        ),
        reference=_same_values,
    ),
    Entry(
        "broadcast",
        broadcast,
        (
            _P,
            Arg(
                "src",
                (Value("src=0", lambda b: 0),),
                (
                    Value("src=1", lambda b: 1, ("src",)),
                    Value("src=-1", lambda b: -1, ("src",)),
                    Value("src=None", lambda b: None, ("src",)),
                    Value("src=0.0", lambda b: 0.0, ("src",)),
                    Value("src=True", lambda b: True, ("src",)),
                ),
                keyword=True,
            ),
            _GROUP,
            _CAP,
        ),
        reference=_same_values,
    ),
    Entry(
        "all_gather",
        all_gather,
        (_P, _GROUP, _CAP),
        reference=lambda p, **kw: [_same_values(p)],
    ),
]


@pytest.mark.parametrize("entry", params(ENTRIES))
@FUZZ
@given(data=st.data())
def test_fuzz_collectives(entry: Entry, data: st.DataObject) -> None:
    """Hostile arguments give the one-process result or a clear error, unchanged."""
    check_entry(entry, data)
