"""Boolean, integer, sparse, complex and meta entries: torch's answer or a clear error.

Where torch refuses an operation on a kind of tensor, the error names the entry,
its kind and torch's reason (never torch's bare `RuntimeError` or
`NotImplementedError`); where torch answers, so does ParamDict, with the same
values and flags. Nothing given changes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from _unchanged import Case, check, unique_ids

from paramdict import ParamDict


def _p() -> ParamDict:
    return ParamDict(w=torch.tensor([[0.5, -1.0], [2.0, 3.0]]), b=torch.tensor([1.5]))


def _with(key: str, value: torch.Tensor) -> ParamDict:
    return _p() | {key: value}


def _flags() -> ParamDict:
    return _with("w", torch.tensor([[True, False], [False, True]]))


def _sparse() -> ParamDict:
    return _with("w", _p()["w"].to_sparse())


def _meta() -> ParamDict:
    return _with("w", torch.empty(2, 2, device="meta"))


def _c(name: str, build: Any, call: Any, error: Any, match: str) -> Case:
    return Case(name, build, call, error, match)


_REFUSED_BY_TORCH = r"torch refuses the entry 'w' \((bool|float32)\[2, 2\] cpu"

CASES = unique_ids(
    [
        # booleans: torch refuses `-`, `abs`, `addcmul`, `lerp` on them
        _c(
            "bool p - q",
            lambda: (_flags(),),
            lambda p: p - p,
            TypeError,
            rf"{_REFUSED_BY_TORCH}\) here: Subtraction",
        ),
        _c(
            "bool -p",
            lambda: (_flags(),),
            lambda p: -p,
            TypeError,
            rf"{_REFUSED_BY_TORCH}\) here: Negation",
        ),
        _c(
            "bool +p",
            lambda: (_flags(),),
            lambda p: +p,
            TypeError,
            r"`\+p` is not defined for the boolean entries \['w'\]",
        ),
        _c(
            "bool abs",
            lambda: (_flags(),),
            lambda p: p.abs(),
            TypeError,
            rf"{_REFUSED_BY_TORCH}\) here: \"abs_cpu\" not implemented",
        ),
        _c(
            "bool addcmul",
            lambda: (_flags(),),
            lambda p: p.addcmul(p, p),
            TypeError,
            rf"{_REFUSED_BY_TORCH}\) here",
        ),
        _c(
            "bool lerp",
            lambda: (_flags(),),
            lambda p: p.lerp(p, 0.5),
            TypeError,
            rf"{_REFUSED_BY_TORCH}\) here",
        ),
        _c(
            "bool sub with alpha",
            lambda: (_flags(), _p()),
            lambda p, q: p.sub(q, alpha=0.5),
            TypeError,
            r"`sub` is not defined for the boolean entries \['w'\]",
        ),
        _c(
            "bool sub of a number",
            lambda: (_flags(),),
            lambda p: p.sub(0.5),
            TypeError,
            r"torch refuses the entry 'w' \(bool\[2, 2\] cpu\) here: Subtr",
        ),
        _c(
            "bool sub with a tensor alpha",
            lambda: (_flags(), torch.tensor(0.5)),
            lambda p, a: p.sub(0.5, alpha=a),
            TypeError,
            r"`sub` is not defined for the boolean entries \['w'\]",
        ),
        _c(
            "bool dot",
            lambda: (_flags(),),
            lambda p: p.dot(p),
            TypeError,
            r"`dot` needs floating point entries; \['w'\] are not",
        ),
        # integers: a float `alpha` is refused by torch for integral results
        _c(
            "int add with a float alpha",
            lambda: (_with("w", torch.ones(2, 2, dtype=torch.int64)),),
            lambda p: p.add(2, alpha=0.5),
            TypeError,
            r"`add`'s `alpha` is a float, but the entries \['w'\] stay integral",
        ),
        # sparse: the kernels torch has no sparse implementation of
        _c(
            "sparse addcmul",
            lambda: (_sparse(),),
            lambda p: p.addcmul(p, p),
            TypeError,
            r"'w' \(float32\[2, 2\] cpu sparse_coo\) here: Could not run",
        ),
        _c(
            "sparse lerp",
            lambda: (_sparse(), _p()),
            lambda p, q: p.lerp(q, 0.5),
            TypeError,
            r"'w' \(float32\[2, 2\] cpu sparse_coo(?s:.*)\.to_dense\(\)",
        ),
        _c(
            "sparse clamp",
            lambda: (_sparse(),),
            lambda p: p.clamp(0, 1),
            TypeError,
            r"torch refuses the entry 'w' \(float32\[2, 2\] cpu sparse_coo\)",
        ),
        _c(
            "sparse p + dense",
            lambda: (_sparse(), _p()),
            lambda p, q: p + q,
            TypeError,
            r"'w' \(float32\[2, 2\] cpu sparse_coo, float32\[2, 2\] cpu\)",
        ),
        _c(
            "sparse exp",
            lambda: (_sparse(),),
            lambda p: p.exp(),
            TypeError,
            r"torch refuses the entry 'w'",
        ),
        _c(
            "sparse rsqrt",
            lambda: (_sparse(),),
            lambda p: p.rsqrt(),
            TypeError,
            r"`rsqrt` takes dense entries(?s:.*)\['w'\]",
        ),
        _c(
            "sparse norm",
            lambda: (_sparse(),),
            lambda p: p.norm(),
            TypeError,
            r"`norm` combines dense tensors; the entries \['w'\] are sparse",
        ),
        _c(
            "sparse dot",
            lambda: (_p(), _sparse()),
            lambda p, q: p.dot(q),
            TypeError,
            r"`dot` combines dense tensors; the entries \['w'\] are sparse",
        ),
        _c(
            "sparse clip_norm",
            lambda: (_sparse(),),
            lambda p: p.clip_norm(1.0),
            TypeError,
            r"`clip_norm` combines dense tensors; the entries \['w'\]",
        ),
        _c(
            "sparse isfinite",
            lambda: (_sparse(),),
            lambda p: p.isfinite(),
            TypeError,
            r"`isfinite` combines dense tensors; the entries \['w'\]",
        ),
        _c(
            "sparse to_vector",
            lambda: (_sparse(),),
            lambda p: p.to_vector(),
            TypeError,
            r"`to_vector` combines dense tensors; the entries \['w'\]",
        ),
        _c(
            "sparse allclose",
            lambda: (_sparse(),),
            lambda p: p.allclose(p),
            TypeError,
            r"`allclose` compares dense tensors(?s:.*)\['w'\]",
        ),
        _c(
            "sparse full_like",
            lambda: (_sparse(),),
            lambda p: p.full_like(1.0),
            ValueError,
            r"`full_like` failed for the entry 'w' \(float32\[2, 2\] cpu "
            r"sparse_coo\): Could not run 'aten::fill_\.Scalar'",
        ),
        _c(
            "sparse and dense stacked",
            lambda: (_sparse(), _p()),
            lambda p, q: ParamDict.stack([q, p]),
            ValueError,
            r"same shape, dtype, device and layout for each key; 'w' has",
        ),
        # meta: no values to compare, send or copy
        _c(
            "meta ==",
            lambda: (_meta(),),
            lambda p: p == p,
            ValueError,
            r"Cannot compare the entries \['w'\]: they are meta tensors",
        ),
        _c(
            "meta allclose",
            lambda: (_meta(),),
            lambda p: p.allclose(p),
            ValueError,
            r"`allclose` cannot compare the entries \['w'\]: they are meta",
        ),
        _c(
            "meta to cpu",
            lambda: (_meta(),),
            lambda p: p.to("cpu"),
            ValueError,
            r"`to` failed for the entry 'w' \(float32\[2, 2\] meta\): Cannot copy "
            r"out of meta tensor\.$",
        ),
        _c(
            "meta 0-dim operand",
            lambda: (_p(), torch.tensor(2.0, device="meta")),
            lambda p, t: p * t,
            ValueError,
            r"`\*` got a 0-dim tensor on meta, but the entries are on cpu",
        ),
        _c(
            "meta 0-dim base of a power",
            lambda: (_meta(), torch.tensor(2.0, device="meta")),
            lambda p, t: t**p,
            ValueError,
            r"Entry 'b': tensors are on different devices \(cpu, meta\) \(one a "
            r"0-dim operand\)",
        ),
        _c(
            "meta 0-dim alpha",
            lambda: (_p(), torch.tensor(2.0, device="meta")),
            lambda p, t: p.add(p, alpha=t),
            ValueError,
            r"`add`'s `alpha` got a 0-dim tensor on meta",
        ),
        _c(
            "meta 0-dim max_norm",
            lambda: (_p(), torch.tensor(2.0, device="meta")),
            lambda p, t: p.clip_norm(t),
            ValueError,
            r"`clip_norm` got `max_norm` on meta, but the entries are on cpu",
        ),
    ]
)


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_kinds_torch_refuses_are_named(case: Case) -> None:
    """A kind of entry torch refuses is named with torch's reason; nothing changes."""
    check(case)


def test_sparse_entries_compare_by_value() -> None:
    """`==` compares sparse entries as dense ones, and tells layouts apart."""
    p = _sparse()
    assert p == _sparse()
    assert p != _p()
    assert p != _sparse() | {"w": _p()["w"].mul(2).to_sparse()}


def test_sparse_entries_clone() -> None:
    """`clone` copies sparse entries (torch refuses them a memory format)."""
    p = _sparse()
    q = p.clone()
    assert q["w"] is not p["w"]
    assert q == p


def test_rsub_of_complex_entries_is_torch_s() -> None:
    """`number - p` gives `torch.rsub`'s complex values, also for infinities."""
    p = ParamDict(z=torch.tensor([1.0 + 2.0j, -0.5 + 0.0j]))
    for number in (math.inf, 1e308, 2.0):
        torch.testing.assert_close((number - p)["z"], number - p["z"], equal_nan=True)


def test_float_alpha_with_float_results_is_accepted() -> None:
    """A float `alpha` is refused only where the result stays integral."""
    p = ParamDict(i=torch.tensor([1, 2]))
    torch.testing.assert_close(p.add(0.5, alpha=0.5)["i"], torch.tensor([1.25, 2.25]))


@pytest.mark.parametrize(
    "method",
    ["__add__", "__mul__", "lerp", "addcmul", "clamp", "maximum", "where"],
)
def test_results_require_grad_only_where_torch_s_do(method: str) -> None:
    """Only the entries whose own operands require grad give results that do."""
    p = ParamDict(w=torch.ones(2), b=torch.ones(2, requires_grad=True))
    q = ParamDict(w=torch.full((2,), 0.5), b=torch.full((2,), 0.5))
    calls = {
        "__add__": lambda: p + q,
        "__mul__": lambda: p * q,
        "lerp": lambda: p.lerp(q, 0.5),
        "addcmul": lambda: p.addcmul(q, q, value=0.5),
        "clamp": lambda: p.clamp(q, 2.0),
        "maximum": lambda: p.maximum(q),
        "where": lambda: p.where(q.map(lambda v: v > 0), q),
    }
    out = calls[method]()
    assert not out["w"].requires_grad
    assert out["b"].requires_grad


def test_add_of_paramdicts_requires_grad_only_where_torch_s_does() -> None:
    """The fused `p.add(q, alpha=...)` marks only entries whose operands do."""
    p = ParamDict(w=torch.ones(2), b=torch.ones(2))
    q = ParamDict(w=torch.ones(2), b=torch.ones(2, requires_grad=True))
    for out in (p.add(q, alpha=0.5), p.sub(q, alpha=0.5)):
        assert not out["w"].requires_grad
        assert out["b"].requires_grad
