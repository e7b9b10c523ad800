"""Never run: mypy checks the second-order tools keep precise types."""

from __future__ import annotations

from torch import Tensor
from typing_extensions import assert_type

from paramdict import (
    CGInfo,
    ParamDict,
    cg,
    hvp,
    implicit_proximal,
    implicit_root,
    jvp,
    vjp,
)


class MyParams(ParamDict):
    __slots__ = ()


def loss(p: MyParams) -> Tensor:
    return p.dot(p)


def gradient(p: MyParams) -> ParamDict:
    return p.grad(loss(p), create_graph=True)


def check_products(p: MyParams, v: ParamDict, t: Tensor) -> None:
    assert_type(hvp(loss, p, v), MyParams)
    assert_type(hvp(loss, p, v, create_graph=True, allow_unused=True), MyParams)
    assert_type(jvp(loss, p, v), Tensor)
    assert_type(jvp(gradient, p, v), ParamDict)
    assert_type(vjp(loss, p, t), MyParams)
    assert_type(vjp(gradient, p, v), MyParams)


def check_cg(b: MyParams, v: ParamDict) -> None:
    x, info = cg(lambda u: u * 2, b, x0=v, rtol=1e-6, atol=0.0, maxiter=10)
    assert_type(x, MyParams)
    assert_type(info, CGInfo)
    assert_type(info.converged, bool)
    assert_type(info.iterations, int)
    assert_type(info.residual_norms, tuple[float, ...])


def check_implicit(phi: MyParams, theta: ParamDict) -> None:
    infos: list[CGInfo] = []
    assert_type(
        implicit_proximal(phi, theta, loss=loss, lam=1.0, on_solve=infos.append),
        MyParams,
    )
    assert_type(
        implicit_root(phi, theta, optimality=lambda p, t: p - t, maxiter=5), MyParams
    )
