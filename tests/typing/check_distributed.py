"""Never run: mypy checks that the collectives keep the ParamDict's type."""

from __future__ import annotations

from typing_extensions import assert_type

from paramdict import ParamDict
from paramdict.distributed import all_gather, all_reduce, broadcast


class MyParams(ParamDict):
    __slots__ = ()


def check_collectives(p: ParamDict, q: MyParams) -> None:
    assert_type(all_reduce(p), ParamDict)
    assert_type(all_reduce(p, op="mean", bucket_cap_mb=1.5), ParamDict)
    assert_type(all_reduce(q, op="max"), MyParams)
    assert_type(broadcast(p, src=1), ParamDict)
    assert_type(broadcast(q), MyParams)
    assert_type(all_gather(p), list[ParamDict])
    assert_type(all_gather(q), list[MyParams])
