"""Bad input to the collectives is refused with a clear error, on one process.

A one-process gloo group stands in for the real thing (the argument checks and the
agreement step run the same); every case expects a clear error naming the argument,
and the ParamDict is bit-identical afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _unchanged import Case, check, operands, unique_ids
from torch._C._distributed_c10d import HashStore  # typed; `dist.HashStore` is not

from paramdict import ParamDict
from paramdict.distributed import all_gather, all_reduce, broadcast


@pytest.fixture
def one_process_group() -> Iterator[None]:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _p() -> ParamDict:
    return ParamDict(
        w=torch.arange(6.0).reshape(2, 3), n=torch.ones(2, dtype=torch.int64)
    )


_COLLECTIVES: dict[str, Any] = {
    "all_reduce": all_reduce,
    "broadcast": broadcast,
    "all_gather": all_gather,
}

_NOT_PARAMDICTS: dict[str, Any] = {
    "dict": lambda: {"w": torch.ones(2)},
    "None": lambda: None,
    "tensor": lambda: torch.ones(2),
    "list": lambda: [torch.ones(2)],
    "numpy": lambda: np.ones(2),
}

_BAD_CAPS: dict[str, tuple[Any, type[BaseException], str]] = {
    "0": (0, ValueError, "`bucket_cap_mb` > 0, got 0"),
    "-1": (-1.0, ValueError, "got -1.0"),
    "nan": (math.nan, ValueError, "got nan"),
    "str": ("25", TypeError, "number for `bucket_cap_mb`, got str"),
    "None": (None, TypeError, "got NoneType"),
    "bool": (True, TypeError, "got bool"),
    "tensor": (torch.tensor(25.0), TypeError, "got Tensor"),
}

_BAD_OPS: dict[str, tuple[Any, str]] = {
    "avg": ("avg", r"`op` in \['sum', 'mean', 'max', 'min', 'product'\], got 'avg'"),
    "upper case": ("SUM", "got 'SUM'"),
    "None": (None, "got None"),
    "int": (0, "got 0"),
    "list": (["sum"], r"got \['sum'\]"),
    "ReduceOp": (dist.ReduceOp.SUM, "instead of a `torch.distributed.ReduceOp`"),
}

_BAD_SRC: dict[str, tuple[Any, type[BaseException], str]] = {
    "-1": (-1, ValueError, r"got -1; the group holds the ranks \[0\]"),
    "1": (1, ValueError, "got 1"),
    "99": (99, ValueError, "got 99"),
    "str": ("0", TypeError, "int global rank as `src`, got str"),
    "float": (0.0, TypeError, "got float"),
    "None": (None, TypeError, "got NoneType"),
    "bool": (False, TypeError, "got bool"),
    "tensor": (torch.tensor(0), TypeError, "got Tensor"),
}

_BAD_GROUPS: dict[str, Any] = {"str": "world", "int": 0, "dict": {}, "list": [0]}


def _cases() -> list[Case]:
    cases = []
    for name, fn in _COLLECTIVES.items():
        for bad, build in _NOT_PARAMDICTS.items():
            cases.append(
                Case(
                    f"{name} {bad}",
                    operands(build),
                    fn,
                    TypeError,
                    f"`{name}` takes a ParamDict",
                )
            )
        for bad, (cap, error, match) in _BAD_CAPS.items():
            cases.append(
                Case(
                    f"{name} bucket_cap_mb={bad}",
                    lambda: (_p(),),
                    lambda p, f=fn, c=cap: f(p, bucket_cap_mb=c),
                    error,
                    match,
                )
            )
        for bad, group in _BAD_GROUPS.items():
            cases.append(
                Case(
                    f"{name} group={bad}",
                    lambda: (_p(),),
                    lambda p, f=fn, g=group: f(p, group=g),
                    TypeError,
                    "ProcessGroup",
                )
            )
        cases.append(
            Case(
                f"{name} sparse entry",
                lambda: (ParamDict(s=torch.ones(2).to_sparse()),),
                fn,
                TypeError,
                r"dense tensors.*\['s'\]",
            )
        )
        cases.append(
            Case(
                f"{name} meta entry",
                lambda: (_p() | {"m": torch.ones(2, device="meta")},),
                fn,
                ValueError,
                r"the entries \['m'\] are meta tensors, which hold none",
            )
        )
    for bad, (op, match) in _BAD_OPS.items():
        cases.append(
            Case(
                f"all_reduce op={bad}",
                lambda: (_p(),),
                lambda p, o=op: all_reduce(p, op=o),
                TypeError,
                match,
            )
        )
    cases += [
        Case(
            "all_reduce mean of integers",
            lambda: (_p(),),
            lambda p: all_reduce(p, op="mean"),
            TypeError,
            r"\['n'\]",
        ),
        Case(
            "all_reduce product of complex",
            lambda: (ParamDict(c=torch.ones(2, dtype=torch.complex64)),),
            lambda p: all_reduce(p, op="product"),
            TypeError,
            r"real entries for `op=\"product\"`; \['c'\] are not",
        ),
        Case(
            "all_reduce max of complex",
            lambda: (ParamDict(c=torch.ones(2, dtype=torch.complex64)),),
            lambda p: all_reduce(p, op="max"),
            TypeError,
            r"\['c'\]",
        ),
    ]
    for bad, (src, error, match) in _BAD_SRC.items():
        cases.append(
            Case(
                f"broadcast src={bad}",
                lambda: (_p(),),
                lambda p, s=src: broadcast(p, src=s),
                error,
                match,
            )
        )
    return cases


ALL = unique_ids(_cases())


@pytest.mark.usefixtures("one_process_group")
@pytest.mark.parametrize("case", [c.param() for c in ALL])
def test_bad_input_is_refused_and_nothing_changes(case: Case) -> None:
    """The call raises a clear error and the ParamDict is bit-identical after."""
    check(case)


@pytest.mark.parametrize("name", list(_COLLECTIVES))
def test_without_a_process_group_the_error_says_what_to_call(name: str) -> None:
    """No process group: a ValueError naming `init_process_group`."""
    with pytest.raises(ValueError, match="init_process_group"):
        _COLLECTIVES[name](_p())
