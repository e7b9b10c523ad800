"""Never run: mypy checks that the toolkit keeps precise types (`Self` included)."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from typing_extensions import assert_type

from paramdict import ParamDict


class MyParams(ParamDict):
    __slots__ = ()


def check_fused_math(p: ParamDict, q: MyParams, t: Tensor) -> None:
    floats = {"w": 0.1}
    assert_type(p.add(p), ParamDict)
    assert_type(p.add(q, alpha=0.5), ParamDict)
    assert_type(p.add(1.0, alpha=t), ParamDict)
    assert_type(p.sub(floats, alpha=2), ParamDict)
    assert_type(p.mul(t), ParamDict)
    assert_type(p.div({"w": t}), ParamDict)
    assert_type(p.pow(2), ParamDict)
    assert_type(p.lerp(q, 0.1), ParamDict)
    assert_type(p.lerp(q, t), ParamDict)
    assert_type(p.addcmul(q, q, value=0.5), ParamDict)
    assert_type(p.addcdiv(q, q, value=t), ParamDict)
    assert_type(p.addcdiv(q, q, value=floats), ParamDict)
    assert_type(p.sqrt(), ParamDict)
    assert_type(p.rsqrt(), ParamDict)
    assert_type(p.exp(), ParamDict)
    assert_type(p.log(), ParamDict)
    assert_type(p.sign(), ParamDict)
    assert_type(p.abs(), ParamDict)
    assert_type(p.neg(), ParamDict)
    assert_type(p.reciprocal(), ParamDict)
    assert_type(p.clamp(0.0), ParamDict)
    assert_type(p.clamp(max=t), ParamDict)
    assert_type(p.clamp(floats, q), ParamDict)
    assert_type(p.maximum(q), ParamDict)
    assert_type(p.minimum(0.0), ParamDict)
    assert_type(p.where(q.map(torch.isfinite), 0.0), ParamDict)
    assert_type(p.allclose(q, atol=1e-6, equal_nan=True), bool)


def check_fused_math_keeps_subclass(q: MyParams, p: ParamDict, t: Tensor) -> None:
    assert_type(q.add(p, alpha=t), MyParams)
    assert_type(q.sub(p, alpha=0.1), MyParams)
    assert_type(q.mul(2), MyParams)
    assert_type(q.div(p), MyParams)
    assert_type(q.pow(t), MyParams)
    assert_type(q.lerp(p, 0.9), MyParams)
    assert_type(q.addcmul(p, p), MyParams)
    assert_type(q.addcdiv(p, p, value=-0.1), MyParams)
    assert_type(q.sqrt(), MyParams)
    assert_type(q.rsqrt(), MyParams)
    assert_type(q.exp(), MyParams)
    assert_type(q.log(), MyParams)
    assert_type(q.sign(), MyParams)
    assert_type(q.abs(), MyParams)
    assert_type(q.neg(), MyParams)
    assert_type(q.reciprocal(), MyParams)
    assert_type(q.clamp(-1, 1), MyParams)
    assert_type(q.maximum(p), MyParams)
    assert_type(q.minimum(p), MyParams)
    assert_type(q.where(p, t), MyParams)


def check_selection(p: ParamDict, q: MyParams) -> None:
    assert_type(p.select("*.bias"), ParamDict)
    assert_type(p.select("a", "b.*", missing_ok=True), ParamDict)
    assert_type(p.exclude("*.bias"), ParamDict)
    assert_type(p.exclude("x", missing_ok=True), ParamDict)
    assert_type(p.filter(lambda key, value: value.dim() > 1), ParamDict)
    assert_type(p.trainable(), ParamDict)
    assert_type(p.prefixed("encoder"), ParamDict)
    assert_type(p.scoped("encoder"), ParamDict)
    assert_type(p.scoped("encoder", missing_ok=True), ParamDict)
    assert_type(q.select("*"), MyParams)
    assert_type(q.exclude("*"), MyParams)
    assert_type(q.filter(lambda key, value: key.endswith("bias")), MyParams)
    assert_type(q.trainable(), MyParams)
    assert_type(q.prefixed("x"), MyParams)
    assert_type(q.scoped("x"), MyParams)


def check_per_tensor(p: ParamDict, q: MyParams, t: Tensor) -> None:
    gen = torch.Generator()
    assert_type(p.detach(), ParamDict)
    assert_type(p.clone(), ParamDict)
    assert_type(p.clone(memory_format=torch.contiguous_format), ParamDict)
    assert_type(p.to(torch.float64), ParamDict)
    assert_type(p.to("cpu"), ParamDict)
    assert_type(p.to(torch.device("cpu"), torch.float16, non_blocking=True), ParamDict)
    assert_type(p.to(device=0, dtype=torch.float32, copy=True), ParamDict)
    assert_type(p.to(t), ParamDict)
    assert_type(p.requires_grad_(), ParamDict)
    assert_type(p.requires_grad_(False), ParamDict)
    assert_type(p.zeros_like(), ParamDict)
    assert_type(p.ones_like(dtype=torch.float64), ParamDict)
    assert_type(p.full_like(0.1, device="cpu"), ParamDict)
    assert_type(p.randn_like(generator=gen), ParamDict)
    assert_type(p.empty_like(requires_grad=True), ParamDict)
    assert_type(q.detach(), MyParams)
    assert_type(q.clone(), MyParams)
    assert_type(q.to(torch.float64), MyParams)
    assert_type(q.to(t, copy=True), MyParams)
    assert_type(q.requires_grad_(), MyParams)
    assert_type(q.zeros_like(), MyParams)
    assert_type(q.ones_like(), MyParams)
    assert_type(q.full_like(1), MyParams)
    assert_type(q.randn_like(), MyParams)
    assert_type(q.empty_like(), MyParams)


def check_map(p: ParamDict, q: MyParams) -> None:
    assert_type(p.map(torch.tanh), ParamDict)
    assert_type(p.map(torch.add, q), ParamDict)
    assert_type(p.map(torch.lerp, q, {"w": torch.ones(1)}), ParamDict)
    assert_type(q.map(lambda v: v * 2), MyParams)
    assert_type(p.map_to_dict(lambda v: v.numel()), dict[str, int])
    assert_type(p.map_to_dict(lambda v, o: v.dim() * o, {"w": 0.5}), dict[str, float])
    assert_type(
        p.map_to_dict(lambda v, o, n: (v, o, n), q, {"w": 1}),
        dict[str, tuple[Tensor, Tensor, int]],
    )
    assert_type(p.map_to_dict(lambda *vs: len(vs), q, q, q), dict[str, int])
    assert_type(q.map_to_dict(str), dict[str, str])
    assert_type(p.map(lambda v, o: v * o, {"w": 2.0}), ParamDict)
    assert_type(p.map(lambda v, a, b: v + a * b, q, q), ParamDict)
    assert_type(p.map(lambda *vs: vs[0], q, q, q), ParamDict)


def check_stack(p: ParamDict, q: MyParams) -> None:
    assert_type(ParamDict.stack([p, p]), ParamDict)
    assert_type(ParamDict.stack(d for d in [p, q]), ParamDict)
    assert_type(ParamDict.stack([{"w": torch.ones(1)}]), ParamDict)
    assert_type(MyParams.stack([q, q]), MyParams)
    assert_type(p.unstack(), list[ParamDict])
    assert_type(q.unstack(), list[MyParams])


def check_reductions(p: ParamDict, q: MyParams, t: Tensor) -> None:
    assert_type(p.dot(q), Tensor)
    assert_type(p.dot({"w": t}), Tensor)
    assert_type(p.norm(), Tensor)
    assert_type(p.norm(1), Tensor)
    assert_type(p.norm(math.inf), Tensor)
    assert_type(p.sum(), Tensor)
    assert_type(p.numel(), int)
    assert_type(p.isfinite(), bool)
    assert_type(p.clip_norm(1.0), ParamDict)
    assert_type(p.clip_norm(t, p=math.inf), ParamDict)
    assert_type(q.clip_norm(1.0), MyParams)
    assert_type(p.to_vector(), Tensor)
    assert_type(ParamDict.from_vector(t, like=p), ParamDict)
    assert_type(ParamDict.from_vector(t, like={"w": t}), ParamDict)
    assert_type(MyParams.from_vector(t, like=p), MyParams)
