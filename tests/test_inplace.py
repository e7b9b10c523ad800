"""The in-place methods: each writes what its out-of-place twin returns, bit for bit."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paramdict import ParamDict

SHAPES = [(3,), (2, 3), (4, 1, 2), ()]


def _params(seed: int, dtype: torch.dtype = torch.float32) -> ParamDict:
    gen = torch.Generator().manual_seed(seed)
    return ParamDict(
        {
            f"k{i}": torch.randn(s, generator=gen, dtype=dtype)
            for i, s in enumerate(SHAPES)
        }
    )


def _rate(kind: str, p: ParamDict, value: float) -> Any:
    if kind == "number":
        return value
    if kind == "tensor":
        return torch.tensor(value, dtype=torch.float64)
    return {k: torch.tensor(value * (i + 1)) for i, k in enumerate(p)}


def _entry_rate(rate: Any, key: str) -> Any:
    """The rate one entry sees: the number it holds.

    The methods read 0-dim CPU tensors that autograd does not record as numbers.
    """
    value = rate[key] if isinstance(rate, dict) else rate
    return float(value) if isinstance(value, torch.Tensor) else value


# name -> (the ParamDict call, torch's in-place call on one entry), each over
# (values, other, positive other, rate); the entry's rate is a number, except
# per-key rates (tensors), which multiply the operand first.
CASES: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "add_": (
        lambda p, o, q, r: p.add_(o, alpha=r),
        lambda v, o, q, r: (
            v.add_(o * r) if isinstance(r, torch.Tensor) else v.add_(o, alpha=r)
        ),
    ),
    "sub_": (
        lambda p, o, q, r: p.sub_(o, alpha=r),
        lambda v, o, q, r: (
            v.add_(o * -r) if isinstance(r, torch.Tensor) else v.sub_(o, alpha=r)
        ),
    ),
    "mul_": (lambda p, o, q, r: p.mul_(r), lambda v, o, q, r: v.mul_(r)),
    "div_": (lambda p, o, q, r: p.div_(q), lambda v, o, q, r: v.div_(q)),
    "lerp_": (lambda p, o, q, r: p.lerp_(o, r), lambda v, o, q, r: v.lerp_(o, r)),
    "addcmul_": (
        lambda p, o, q, r: p.addcmul_(o, q, value=r),
        lambda v, o, q, r: (
            v.addcmul_(o * r, q)
            if isinstance(r, torch.Tensor)
            else v.addcmul_(o, q, value=r)
        ),
    ),
    "addcdiv_": (
        lambda p, o, q, r: p.addcdiv_(o, q, value=r),
        lambda v, o, q, r: (
            v.addcdiv_(o * r, q)
            if isinstance(r, torch.Tensor)
            else v.addcdiv_(o, q, value=r)
        ),
    ),
    "maximum_": (
        lambda p, o, q, r: p.maximum_(o),
        lambda v, o, q, r: v.copy_(torch.maximum(v, o)),
    ),
    "minimum_": (
        lambda p, o, q, r: p.minimum_(o),
        lambda v, o, q, r: v.copy_(torch.minimum(v, o)),
    ),
    "clamp_": (
        lambda p, o, q, r: p.clamp_(-0.5, 0.5),
        lambda v, o, q, r: v.clamp_(-0.5, 0.5),
    ),
    "sqrt_": (lambda p, o, q, r: p.sqrt_(), lambda v, o, q, r: v.sqrt_()),
    "neg_": (lambda p, o, q, r: p.neg_(), lambda v, o, q, r: v.neg_()),
    "abs_": (lambda p, o, q, r: p.abs_(), lambda v, o, q, r: v.abs_()),
    "sign_": (lambda p, o, q, r: p.sign_(), lambda v, o, q, r: v.sign_()),
    "reciprocal_": (
        lambda p, o, q, r: p.reciprocal_(),
        lambda v, o, q, r: v.reciprocal_(),
    ),
    "exp_": (lambda p, o, q, r: p.exp_(), lambda v, o, q, r: v.exp_()),
    "log_": (lambda p, o, q, r: p.log_(), lambda v, o, q, r: v.log_()),
    "pow_": (lambda p, o, q, r: p.pow_(2.0), lambda v, o, q, r: v.pow_(2.0)),
    "zero_": (lambda p, o, q, r: p.zero_(), lambda v, o, q, r: v.zero_()),
    "copy_": (lambda p, o, q, r: p.copy_(o), lambda v, o, q, r: v.copy_(o)),
}
RATED = {"add_", "sub_", "mul_", "lerp_", "addcmul_", "addcdiv_"}


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(CASES)),
    seed=st.integers(0, 2**16),
    kind=st.sampled_from(["number", "tensor", "mapping"]),
    value=st.floats(-2.0, 2.0, allow_nan=False, width=32),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_in_place_writes_what_torch_writes_entry_by_entry(
    name: str, seed: int, kind: str, value: float, dtype: torch.dtype
) -> None:
    """`p.op_(...)` writes into `p`'s own tensors what torch's `Tensor.op_` writes."""
    in_place, reference = CASES[name]
    p, o = _params(seed, dtype), _params(seed + 1, dtype)
    q = _params(seed + 2, dtype).abs().add(0.5)
    if name in ("sqrt_", "log_"):
        p = p.abs().add(0.1)
    rate = _rate(kind if name in RATED else "number", p, value)
    if kind == "mapping" and name in RATED:
        rate = {k: v.to(dtype) for k, v in rate.items()}
    if name == "lerp_" and kind == "tensor":  # a weight of the entries' dtype
        rate = rate.to(dtype)
    expected = {
        k: reference(v.clone(), o[k], q[k], _entry_rate(rate, k)) for k, v in p.items()
    }
    before = list(p.values())
    out = in_place(p, o, q, rate)
    assert out is p
    assert all(a is b for a, b in zip(p.values(), before, strict=True))
    torch.testing.assert_close(dict(p), expected, rtol=0, atol=0)


def _row(v: torch.Tensor, *, i: int) -> torch.Tensor:
    return v[i]


def test_in_place_under_vmap_matches_a_loop() -> None:
    """Under `torch.func.vmap` the in-place methods run per entry, same values."""
    p, g = (
        _params(0).map(lambda v: torch.stack([v, 2 * v])),
        _params(1).map(lambda v: torch.stack([v, -v])),
    )

    def step(p: ParamDict, g: ParamDict) -> ParamDict:
        c = p.clone()
        return c.mul_(0.9).add_(g, alpha=0.1).lerp_(g, 0.5).addcmul_(g, g, value=0.1)

    out = torch.func.vmap(step)(p, g)
    for i in range(2):
        one = step(p.map(partial(_row, i=i)), g.map(partial(_row, i=i)))
        torch.testing.assert_close(
            {k: v[i] for k, v in out.items()}, dict(one), rtol=0, atol=0
        )


def test_writing_into_leaves_that_require_grad_names_them() -> None:
    """A leaf that requires grad is refused by name, and nothing is written."""
    p = ParamDict(a=torch.ones(2), w=torch.ones(2, requires_grad=True))
    with pytest.raises(ValueError, match=r"\['w'\]: they are leaves"):
        p.mul_(2.0)
    assert torch.equal(p["w"].detach(), torch.ones(2))


def test_in_place_is_recorded_by_autograd_on_copies() -> None:
    """On recorded copies, in-place arithmetic differentiates like torch's."""
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    g = torch.tensor([3.0, -1.0], requires_grad=True)
    p = ParamDict(w=w).clone()
    p.mul_(3.0).addcmul_({"w": g}, {"w": g}, value=0.5).lerp_({"w": g}, 0.25)
    got = torch.autograd.grad(p["w"].sum(), (w, g))
    expected = torch.autograd.grad(
        torch.lerp(w * 3 + 0.5 * g * g, g, 0.25).sum(), (w, g)
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_mismatched_entries_name_the_key() -> None:
    """An entry whose operand does not broadcast is named."""
    p = ParamDict(b=torch.ones(3), w=torch.ones(2))
    with pytest.raises(ValueError, match="Entry 'b'"):
        p.add_(ParamDict(b=torch.ones(2), w=torch.ones(2)))


def test_empty_is_a_no_op() -> None:
    """An empty ParamDict comes back as it is."""
    p = ParamDict()
    assert p.add_(1.0) is p
    assert p.lerp_({}, 0.5) is p
