"""Never run: mypy checks that the core API keeps precise types (`Self` included)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import Tensor, nn
from typing_extensions import assert_type

import paramdict
from paramdict import ParamDict


class MyParams(ParamDict):
    __slots__ = ()


def check_version() -> None:
    assert_type(paramdict.__version__, str)


def check_construction(t: Tensor, m: nn.Module) -> None:
    assert_type(ParamDict(), ParamDict)
    assert_type(ParamDict({"w": t}), ParamDict)
    assert_type(ParamDict([("w", t)]), ParamDict)
    assert_type(ParamDict(w=t), ParamDict)
    assert_type(MyParams(w=t), MyParams)
    assert_type(ParamDict.from_module(m), ParamDict)
    assert_type(ParamDict.from_module(m, buffers=True), ParamDict)
    assert_type(MyParams.from_module(m), MyParams)
    assert_type(MyParams.fromkeys(["a"], t), MyParams)


def check_mapping(p: ParamDict, q: MyParams) -> None:
    assert_type(p["w"], Tensor)
    assert_type(len(p), int)
    assert_type(iter(p), Iterator[str])
    m: Mapping[str, Tensor] = p
    d: dict[str, Tensor] = dict(p)
    assert_type(p | {"x": torch.zeros(1)}, ParamDict)
    assert_type(q | {"x": torch.zeros(1)}, MyParams)
    assert_type(q.copy(), dict[str, Tensor])
    assert_type(p == q, bool)
    assert_type(p.allclose(q, rtol=1e-3), bool)
    del m, d


def check_operators(p: ParamDict, q: MyParams, t: Tensor) -> None:
    assert_type(p + p, ParamDict)
    assert_type(p + 1.0, ParamDict)
    assert_type(1.0 + p, ParamDict)
    assert_type(p - {"w": t}, ParamDict)
    assert_type(2 - p, ParamDict)
    assert_type(p * t, ParamDict)
    assert_type(0.1 * p, ParamDict)
    assert_type(p / 2, ParamDict)
    assert_type(2 / p, ParamDict)
    assert_type(p**2, ParamDict)
    assert_type(2**p, ParamDict)
    assert_type(-p, ParamDict)
    assert_type(+p, ParamDict)
    assert_type(abs(p), ParamDict)
    assert_type(q + q, MyParams)
    assert_type(q - 0.1 * q, MyParams)
    assert_type(q * {"w": 2.0}, MyParams)
    assert_type(-q, MyParams)
    assert_type(abs(q), MyParams)


def check_autograd(p: ParamDict, q: MyParams, loss: Tensor) -> None:
    assert_type(p.grad(loss), ParamDict)
    assert_type(p.grad(loss, create_graph=True, allow_unused=True), ParamDict)
    assert_type(p.grad([loss, loss], grad_outputs=[loss, loss]), ParamDict)
    assert_type(q.grad(loss), MyParams)
    assert_type(p.backward(loss), ParamDict)
    assert_type(q.backward(loss, retain_graph=True), MyParams)


def check_modules(p: ParamDict, m: nn.Module, x: Tensor) -> None:
    out = p.call(m, x)
    with p.swapped_into(m) as inside:
        assert_type(inside, nn.Module)
    assert_type(p.to_module(m, strict=False), None)
    del out
