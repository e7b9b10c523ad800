import gc
import math
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from _helpers import CountOps, MyParams
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from paramdict import ParamDict

F64 = torch.float64
KEYS = ["w", "b", "s"]


def _make(seed: int, *, shift: float = 0.5, cls: type[ParamDict] = ParamDict) -> Any:
    """Three entries (matrix, vector, 0-dim) in float64, in [shift, shift + 1)."""
    gen = torch.Generator().manual_seed(seed)
    return cls(
        w=torch.rand(3, 2, generator=gen, dtype=F64) + shift,
        b=torch.rand(2, generator=gen, dtype=F64) + shift,
        s=torch.rand((), generator=gen, dtype=F64) + shift,
    )


def _reordered(q: Mapping[str, Any]) -> dict[str, Any]:
    return {k: q[k] for k in reversed(list(q))}


# ---------------------------------------------------------------- fixed partners

END = _make(2)  # `lerp`'s end
T1 = _make(3)  # `addcmul`/`addcdiv`'s tensors
T2 = _make(4)
COND = ParamDict({k: v > 0.9 for k, v in _make(5).items()})  # `where`'s condition


def _operands() -> dict[str, tuple[Any, Callable[[str], Any]]]:
    """Every operand kind, and the matching plain-torch operand for a key."""
    q = _make(1)
    floats = {"w": 2.0, "b": 3.0, "s": 0.5}
    broadcast = {"w": torch.tensor([1.5, 0.75], dtype=F64), "b": q["b"], "s": q["s"]}
    zero_dim = torch.tensor(1.25, dtype=F64)
    return {
        "int": (2, lambda k: 2),
        "float": (0.75, lambda k: 0.75),
        "0-dim": (zero_dim, lambda k: zero_dim),
        "paramdict": (q, lambda k: q[k]),
        "mapping": (_reordered(q), lambda k: q[k]),
        "per-key-floats": (floats, lambda k: floats[k]),
        "broadcast": (broadcast, lambda k: broadcast[k]),
    }


def _t(x: Tensor, o: Any) -> Tensor:
    return o if isinstance(o, Tensor) else torch.tensor(o, dtype=x.dtype)


# name -> (ParamDict call, plain-torch reference for one key)
BINARY: dict[str, tuple[Callable[[ParamDict, Any], Any], Callable[..., Tensor]]] = {
    "add": (lambda p, o: p.add(o), lambda x, o, k: torch.add(x, o)),
    "add-alpha": (
        lambda p, o: p.add(o, alpha=-0.3),
        lambda x, o, k: torch.add(x, o, alpha=-0.3),
    ),
    "sub": (lambda p, o: p.sub(o), lambda x, o, k: torch.sub(x, o)),
    "sub-alpha": (
        lambda p, o: p.sub(o, alpha=2),
        lambda x, o, k: torch.sub(x, o, alpha=2),
    ),
    "mul": (lambda p, o: p.mul(o), lambda x, o, k: torch.mul(x, o)),
    "div": (lambda p, o: p.div(o), lambda x, o, k: torch.div(x, o)),
    "pow": (lambda p, o: p.pow(o), lambda x, o, k: torch.pow(x, o)),
    "maximum": (
        lambda p, o: p.maximum(o),
        lambda x, o, k: torch.maximum(x, _t(x, o)),
    ),
    "minimum": (
        lambda p, o: p.minimum(o),
        lambda x, o, k: torch.minimum(x, _t(x, o)),
    ),
    "clamp-min": (lambda p, o: p.clamp(o), lambda x, o, k: torch.clamp(x, min=o)),
    "clamp-max": (
        lambda p, o: p.clamp(max=o),
        lambda x, o, k: torch.clamp(x, max=o),
    ),
    "lerp-weight": (
        lambda p, o: p.lerp(END, o),
        lambda x, o, k: torch.lerp(x, END[k], _t(x, o)),
    ),
    "addcmul-value": (
        lambda p, o: p.addcmul(T1, T2, value=o),
        lambda x, o, k: x + o * T1[k] * T2[k],
    ),
    "addcdiv-value": (
        lambda p, o: p.addcdiv(T1, T2, value=o),
        lambda x, o, k: x + o * T1[k] / T2[k],
    ),
    "where-other": (
        lambda p, o: p.where(COND, o),
        lambda x, o, k: torch.where(COND[k], x, o),
    ),
}


@pytest.mark.parametrize("kind", list(_operands()))
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_fused_methods_match_torch(name: str, kind: str) -> None:
    """Each binary fused method equals torch per key, for every kind of operand."""
    method, ref = BINARY[name]
    operand, per_key = _operands()[kind]
    p = _make(0)
    out = method(p, operand)
    assert type(out) is ParamDict
    assert list(out) == KEYS
    for k in KEYS:
        torch.testing.assert_close(out[k], ref(p[k], per_key(k), k), msg=name)


def test_number_arguments_use_the_fused_kernels() -> None:
    """`addcmul`/`addcdiv` with numbers equal torch's own fused functions."""
    p = _make(0)
    for value in (1, -0.25):
        mul = p.addcmul(T1, T2, value=value)
        div = p.addcdiv(_reordered(T1), T2, value=value)
        for k in KEYS:
            want = torch.addcmul(p[k], T1[k], T2[k], value=value)
            torch.testing.assert_close(mul[k], want)
            want = torch.addcdiv(p[k], T1[k], T2[k], value=value)
            torch.testing.assert_close(div[k], want)


@pytest.mark.parametrize("end", [END, _reordered(END)], ids=["paramdict", "mapping"])
def test_lerp_end_and_where_condition_take_any_mapping(
    end: Mapping[str, Tensor],
) -> None:
    """`lerp`'s end and `where`'s condition align by key, in any order."""
    p = _make(0)
    out = p.lerp(end, 0.3)
    chosen = p.where(_reordered(COND), END)
    for k in KEYS:
        torch.testing.assert_close(out[k], torch.lerp(p[k], END[k], 0.3))
        torch.testing.assert_close(chosen[k], torch.where(COND[k], p[k], END[k]))


def test_clamp_with_both_bounds() -> None:
    """`clamp(min, max)` equals `torch.clamp`, also with per-key and tensor bounds."""
    p = _make(0, shift=-0.5)
    lo = {"w": -0.2, "b": 0.0, "s": -1.0}
    hi = torch.tensor(0.3, dtype=F64)
    out = p.clamp(lo, hi)
    for k in KEYS:
        want = torch.clamp(p[k], min=torch.tensor(lo[k], dtype=F64), max=hi)
        torch.testing.assert_close(out[k], want)


UNARY: dict[str, Callable[[Tensor], Tensor]] = {
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "exp": torch.exp,
    "log": torch.log,
    "sign": torch.sign,
    "abs": torch.abs,
    "neg": torch.neg,
    "reciprocal": torch.reciprocal,
}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_fused_methods_match_torch(name: str) -> None:
    """Each unary method equals the torch function per key."""
    shift = 0.5 if name in {"sqrt", "rsqrt", "log"} else -0.5
    p = _make(0, shift=shift)
    out = getattr(p, name)()
    assert type(out) is ParamDict
    assert list(out) == KEYS
    for k in KEYS:
        torch.testing.assert_close(out[k], UNARY[name](p[k]))


# ---------------------------------------------------------------- autograd

# name -> (ParamDict call with a 0-dim tensor `s`, the same on one plain tensor)
WITH_TENSOR: dict[str, tuple[Callable[..., Any], Callable[..., Tensor]]] = {
    "add": (lambda p, s: p.add(s), lambda x, s, k: x + s),
    "add-alpha": (lambda p, s: p.add(T1, alpha=s), lambda x, s, k: x + s * T1[k]),
    "sub-alpha": (lambda p, s: p.sub(T1, alpha=s), lambda x, s, k: x - s * T1[k]),
    "add-alpha-number": (lambda p, s: p.add(3.0, alpha=s), lambda x, s, k: x + s * 3),
    "add-alpha-floats": (
        lambda p, s: p.add({"w": 1.0, "b": 2.0, "s": 3.0}, alpha=s),
        lambda x, s, k: x + s * {"w": 1.0, "b": 2.0, "s": 3.0}[k],
    ),
    "add-tensor-alpha-number": (
        lambda p, s: p.add(s, alpha=-2),
        lambda x, s, k: x - 2 * s,
    ),
    "sub-tensor": (lambda p, s: p.sub(s, alpha=0.5), lambda x, s, k: x - 0.5 * s),
    "mul": (lambda p, s: p.mul(s), lambda x, s, k: x * s),
    "div": (lambda p, s: p.div(s), lambda x, s, k: x / s),
    "pow": (lambda p, s: p.pow(s), lambda x, s, k: x**s),
    "maximum": (lambda p, s: p.maximum(s), lambda x, s, k: torch.maximum(x, s)),
    "minimum": (lambda p, s: p.minimum(s), lambda x, s, k: torch.minimum(x, s)),
    "clamp": (lambda p, s: p.clamp(s), lambda x, s, k: torch.clamp(x, min=s)),
    "lerp": (lambda p, s: p.lerp(END, s), lambda x, s, k: torch.lerp(x, END[k], s)),
    "addcmul": (
        lambda p, s: p.addcmul(T1, T2, value=s),
        lambda x, s, k: x + s * T1[k] * T2[k],
    ),
    "addcdiv": (
        lambda p, s: p.addcdiv(T1, T2, value=s),
        lambda x, s, k: x + s * T1[k] / T2[k],
    ),
    "where": (
        lambda p, s: p.where(COND, s),
        lambda x, s, k: torch.where(COND[k], x, s),
    ),
}


@pytest.mark.parametrize("name", list(WITH_TENSOR))
def test_differentiable_zero_dim_operand_gets_gradients(name: str) -> None:
    """A 0-dim tensor that requires grad (a learnable rate) gets torch's gradient."""
    method, ref = WITH_TENSOR[name]
    base = _make(0)
    leaves = {k: v.clone().requires_grad_() for k, v in base.items()}
    s = torch.tensor(0.9, dtype=F64, requires_grad=True)
    out = method(ParamDict(leaves), s)
    weights = _make(6)  # a generic cotangent, not all ones
    loss = sum((out[k] * weights[k]).sum() for k in KEYS)
    got = torch.autograd.grad(loss, [s, *leaves.values()])

    leaves_ref = {k: v.clone().requires_grad_() for k, v in base.items()}
    s_ref = torch.tensor(0.9, dtype=F64, requires_grad=True)
    loss_ref = sum((ref(leaves_ref[k], s_ref, k) * weights[k]).sum() for k in KEYS)
    want = torch.autograd.grad(loss_ref, [s_ref, *leaves_ref.values()])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def _inner_loss(w: Tensor, b: Tensor, x: Tensor) -> Tensor:
    return torch.tanh(x @ w + b).pow(2).sum()


def test_add_with_tensor_alpha_is_second_order_differentiable() -> None:
    """A MAML step `p.add(g, alpha=-lr)` with a learnable `lr` matches plain torch."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(3, 2, dtype=F64, generator=gen, requires_grad=True)
    b = torch.randn(2, dtype=F64, generator=gen, requires_grad=True)
    lr = torch.tensor(0.1, dtype=F64, requires_grad=True)
    x = torch.randn(5, 3, dtype=F64, generator=gen)

    p = ParamDict(w=w, b=b)
    g = p.grad(_inner_loss(p["w"], p["b"], x), create_graph=True)
    fast = p.add(g, alpha=-lr)
    meta = torch.autograd.grad(_inner_loss(fast["w"], fast["b"], 2 * x), [w, b, lr])

    gw, gb = torch.autograd.grad(_inner_loss(w, b, x), [w, b], create_graph=True)
    want = torch.autograd.grad(_inner_loss(w - lr * gw, b - lr * gb, 2 * x), [w, b, lr])
    for got_i, want_i in zip(meta, want):
        torch.testing.assert_close(got_i, want_i, rtol=1e-12, atol=1e-12)


def test_addcmul_is_second_order_differentiable() -> None:
    """A step through `addcmul` (value number and tensor) matches plain torch."""
    gen = torch.Generator().manual_seed(8)
    w = torch.randn(3, 2, dtype=F64, generator=gen, requires_grad=True)
    b = torch.randn(2, dtype=F64, generator=gen, requires_grad=True)
    c = torch.tensor(-0.2, dtype=F64, requires_grad=True)
    x = torch.randn(5, 3, dtype=F64, generator=gen)

    p = ParamDict(w=w, b=b)
    g = p.grad(_inner_loss(p["w"], p["b"], x), create_graph=True)
    fast = p.addcmul(g, p, value=c).addcmul(g, g, value=-0.05)
    meta = torch.autograd.grad(_inner_loss(fast["w"], fast["b"], x), [w, b, c])

    gw, gb = torch.autograd.grad(_inner_loss(w, b, x), [w, b], create_graph=True)
    fw = torch.addcmul(w + c * gw * w, gw, gw, value=-0.05)
    fb = torch.addcmul(b + c * gb * b, gb, gb, value=-0.05)
    want = torch.autograd.grad(_inner_loss(fw, fb, x), [w, b, c])
    for got_i, want_i in zip(meta, want):
        torch.testing.assert_close(got_i, want_i, rtol=1e-12, atol=1e-12)


RECORDED_STEPS: dict[
    str, tuple[Callable[..., Any], Callable[[Tensor, Tensor], Tensor]]
] = {
    "p - other": (lambda p, o: p - o, lambda w, o: w - o),
    "p + other": (lambda p, o: p + o, lambda w, o: w + o),
    "other - p": (lambda p, o: o - p, lambda w, o: o - w),
    "p.sub(other, alpha=)": (
        lambda p, o: p.sub(o, alpha=0.1),
        lambda w, o: w - 0.1 * o,
    ),
    "lr * other": (lambda p, o: 0.1 * o, lambda w, o: 0.1 * o),
    "other / 4": (lambda p, o: o / 4, lambda w, o: o / 4),
}


@pytest.mark.parametrize("name", list(RECORDED_STEPS))
def test_recorded_steps_keep_no_operand_alive(name: str) -> None:
    """Under autograd, `p - lr * g` keeps no copy of `g` alive, as plain torch does."""
    step, reference = RECORDED_STEPS[name]
    w = torch.randn(3, 2, dtype=F64, requires_grad=True)
    p = ParamDict(w=w)
    other = ParamDict(w=w * 2)  # a non-leaf, as the gradients of a MAML inner step
    alive = weakref.ref(other["w"])
    out = step(p, other)
    del other
    gc.collect()
    assert alive() is None
    got = torch.autograd.grad(out["w"].sum(), w)[0]
    want = torch.autograd.grad(reference(w, w * 2).sum(), w)[0]
    torch.testing.assert_close(got, want)


# ---------------------------------------------------------------- bad input

CALLS_WITH_MAPPING: dict[str, Callable[[ParamDict, Any], Any]] = {
    "add": lambda p, m: p.add(m),
    "sub": lambda p, m: p.sub(m, alpha=0.1),
    "add-tensor-alpha": lambda p, m: p.add(m, alpha=torch.tensor(2.0, dtype=F64)),
    "mul": lambda p, m: p.mul(m),
    "div": lambda p, m: p.div(m),
    "pow": lambda p, m: p.pow(m),
    "maximum": lambda p, m: p.maximum(m),
    "minimum": lambda p, m: p.minimum(m),
    "clamp": lambda p, m: p.clamp(max=m),
    "lerp-end": lambda p, m: p.lerp(m, 0.5),
    "lerp-weight": lambda p, m: p.lerp(END, m),
    "addcmul": lambda p, m: p.addcmul(T1, m),
    "addcmul-tensor-value": lambda p, m: p.addcmul(m, T2, value=torch.tensor(2.0)),
    "addcdiv": lambda p, m: p.addcdiv(m, T2, value=0.5),
    "where-other": lambda p, m: p.where(COND, m),
    "allclose": lambda p, m: p.allclose(m),
}


@pytest.mark.parametrize("name", list(CALLS_WITH_MAPPING))
def test_key_mismatch_names_the_keys(name: str) -> None:
    """A mapping with other keys is a ValueError naming missing and unexpected keys."""
    p = _make(0)
    other = {"w": p["w"], "z": p["b"], "a": p["s"]}
    with pytest.raises(
        ValueError, match=r"missing \['b', 's'\], unexpected \['a', 'z'\]"
    ):
        CALLS_WITH_MAPPING[name](p, other)


@pytest.mark.parametrize("name", [n for n in CALLS_WITH_MAPPING if n != "allclose"])
def test_non_broadcastable_entry_is_named(name: str) -> None:
    """A per-key value whose shape does not broadcast is a ValueError naming its key."""
    p = _make(0)
    other = dict(_make(1))
    other["b"] = torch.ones(5, dtype=F64)
    with pytest.raises(
        ValueError, match=r"Entry 'b': shapes .*\(5,\).* do not broadcast"
    ):
        CALLS_WITH_MAPPING[name](p, other)


@pytest.mark.parametrize("name", [n for n in CALLS_WITH_MAPPING if n != "allclose"])
def test_entry_on_another_device_is_named(name: str) -> None:
    """A per-key value on another device is a ValueError naming its key."""
    p = _make(0)
    other = dict(_make(1))
    other["b"] = torch.ones(2, dtype=F64, device="meta")
    with pytest.raises(
        ValueError, match=r"Entry 'b': tensors are on different devices"
    ):
        CALLS_WITH_MAPPING[name](p, other)


def test_zero_dim_operand_on_another_device_is_named() -> None:
    """A shared 0-dim tensor on another device is named with both devices."""
    p = _make(0)
    with pytest.raises(
        ValueError,
        match=r"`sub` got a 0-dim tensor on meta, but the entries are on cpu",
    ):
        p.sub(torch.ones((), dtype=F64, device="meta"))


def test_dtypes_torch_refuses_to_mix_are_named() -> None:
    """`lerp` with an end of another dtype (torch refuses) names the entry."""
    p = _make(0)
    end = {k: v.float() for k, v in END.items()}
    with pytest.raises(ValueError, match=r"Entry 'w': the dtypes float32, float64"):
        p.lerp(end, 0.5)


def test_dtypes_torch_promotes_are_promoted() -> None:
    """Where torch promotes mixed dtypes, so does ParamDict (no error)."""
    p = _make(0)
    q = ParamDict({k: v.float() for k, v in _make(1).items()})
    out = q.add(p, alpha=0.5)
    for k in KEYS:
        torch.testing.assert_close(out[k], torch.add(q[k], p[k], alpha=0.5))
        assert out[k].dtype == F64


@pytest.mark.parametrize(
    "bad", ["x", [1.0, 2.0], torch.ones(2), None], ids=["str", "list", "1-dim", "None"]
)
@pytest.mark.parametrize(
    "call",
    [
        lambda p, o: p.add(o),
        lambda p, o: p.sub(o, alpha=2),
        lambda p, o: p.mul(o),
        lambda p, o: p.div(o),
        lambda p, o: p.pow(o),
        lambda p, o: p.maximum(o),
        lambda p, o: p.minimum(o),
        lambda p, o: p.lerp(END, o),
        lambda p, o: p.addcmul(T1, T2, value=o),
        lambda p, o: p.addcdiv(T1, T2, value=o),
        lambda p, o: p.where(COND, o),
    ],
    ids=[
        "add",
        "sub",
        "mul",
        "div",
        "pow",
        "maximum",
        "minimum",
        "lerp",
        "addcmul",
        "addcdiv",
        "where",
    ],
)
def test_wrong_kind_of_operand_is_a_type_error(call: Any, bad: Any) -> None:
    """A string, list, 1-dim tensor or None operand is a TypeError saying what fits."""
    with pytest.raises(TypeError, match="takes a number, a 0-dim tensor or a mapping"):
        call(_make(0), bad)


@pytest.mark.parametrize(
    "alpha", ["x", None, torch.ones(2)], ids=["str", "None", "1-dim"]
)
@pytest.mark.parametrize("method", ["add", "sub"])
def test_wrong_kind_of_alpha_is_a_type_error(method: str, alpha: Any) -> None:
    """`alpha` must be a number or a 0-dim tensor, for `add` and `sub` alike."""
    p = _make(0)
    with pytest.raises(TypeError, match="`alpha` must be a number or a 0-dim tensor"):
        getattr(p, method)(p, alpha=alpha)


def test_mapping_mixing_numbers_and_tensors_names_the_entries() -> None:
    """A per-key mapping must hold all tensors or all numbers."""
    p = _make(0)
    with pytest.raises(TypeError, match=r"the entries \['b', 's'\] are not tensors"):
        p.mul({"w": torch.ones(()), "b": 2.0, "s": 3.0})


def test_where_needs_boolean_conditions() -> None:
    """A non-boolean condition is a TypeError naming the entries."""
    p = _make(0)
    cond = {**COND, "b": torch.ones(2), "s": torch.tensor(1)}
    with pytest.raises(TypeError, match=r"the entries \['b', 's'\] are not"):
        p.where(cond, 0.0)


def test_clamp_needs_a_bound() -> None:
    """`clamp()` without bounds is a ValueError, as in torch."""
    with pytest.raises(ValueError, match="at least one of `min` and `max`"):
        _make(0).clamp()


# ---------------------------------------------------------------- contract

ALL_METHODS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda p, q: p.add(q, alpha=0.5),
    "add-tensor-alpha": lambda p, q: p.add(q, alpha=torch.tensor(0.5, dtype=F64)),
    "sub": lambda p, q: p.sub(q, alpha=0.5),
    "mul": lambda p, q: p.mul(q),
    "div": lambda p, q: p.div(2),
    "pow": lambda p, q: p.pow(q),
    "lerp": lambda p, q: p.lerp(q, 0.25),
    "addcmul": lambda p, q: p.addcmul(q, q, value=0.1),
    "addcdiv": lambda p, q: p.addcdiv(q, q, value=torch.tensor(0.1, dtype=F64)),
    "sqrt": lambda p, q: p.sqrt(),
    "rsqrt": lambda p, q: p.rsqrt(),
    "exp": lambda p, q: p.exp(),
    "log": lambda p, q: p.log(),
    "sign": lambda p, q: p.sign(),
    "abs": lambda p, q: p.abs(),
    "neg": lambda p, q: p.neg(),
    "reciprocal": lambda p, q: p.reciprocal(),
    "clamp": lambda p, q: p.clamp(0.6, q),
    "maximum": lambda p, q: p.maximum(q),
    "minimum": lambda p, q: p.minimum(0.7),
    "where": lambda p, q: p.where(p.map(lambda v: v > 0.8), q),
}


@pytest.mark.parametrize("name", list(ALL_METHODS))
def test_subclass_keeps_its_type(name: str) -> None:
    """Every fused method returns the subclass it was called on."""
    p = _make(0, cls=MyParams)
    assert type(ALL_METHODS[name](p, _make(1))) is MyParams


@pytest.mark.parametrize("name", list(ALL_METHODS))
def test_empty_paramdict_gives_empty_result(name: str) -> None:
    """On an empty ParamDict every fused method returns an empty one."""
    empty = MyParams()
    out = ALL_METHODS[name](empty, {})
    assert type(out) is MyParams
    assert len(out) == 0


def test_inputs_are_never_mutated() -> None:
    """No fused method writes to `self` or its operands."""
    p, q = _make(0), _make(1)
    before = [{k: v.clone() for k, v in d.items()} for d in (p, q, T1, T2, END)]
    for method in ALL_METHODS.values():
        method(p, q)
    p.addcmul(T1, T2)
    p.addcdiv(T1, T2, value={"w": 1.0, "b": 2.0, "s": 3.0})
    p.lerp(END, {"w": 0.1, "b": 0.2, "s": 0.3})
    for snapshot, d in zip(before, (p, q, T1, T2, END)):
        for k in KEYS:
            assert torch.equal(d[k], snapshot[k])


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda p, q: p.add(q), ["_foreach_add"]),
        (lambda p, q: p.sub(q, alpha=0.1), ["_foreach_sub"]),
        (lambda p, q: p.sub(0.5), ["_foreach_sub"]),
        (lambda p, q: p.mul(q), ["_foreach_mul"]),
        (lambda p, q: p.div(0.5), ["_foreach_div"]),
        (lambda p, q: p.pow(2), ["_foreach_pow"]),
        (lambda p, q: p.lerp(q, 0.1), ["_foreach_lerp"]),
        (lambda p, q: p.addcmul(q, q, value=0.1), ["_foreach_addcmul"]),
        (lambda p, q: p.addcdiv(q, q, value=-0.1), ["_foreach_addcdiv"]),
        (lambda p, q: p.sqrt(), ["_foreach_sqrt"]),
        (lambda p, q: p.maximum(q), ["_foreach_maximum"]),
        (lambda p, q: p.clamp(0.1, 0.9), ["_foreach_clamp_min", "_foreach_clamp_max"]),
    ],
)
def test_fused_methods_are_one_foreach_call(call: Any, expected: list[str]) -> None:
    """With number options, a fused method dispatches its foreach kernel(s) only."""
    p, q = _make(0), _make(1)
    with CountOps() as mode:
        call(p, q)
    assert mode.ops == expected


# ---------------------------------------------------------------- allclose


def test_allclose_matches_torch_per_entry() -> None:
    """`allclose` holds when every entry is close, in any key order."""
    p = _make(0)
    near = {k: v + 1e-9 for k, v in _reordered(p).items()}
    far = {**near, "s": p["s"] + 1e-3}
    assert p.allclose(near)
    assert not p.allclose(far)
    assert p.allclose(far, atol=1e-2)
    nan = ParamDict(w=torch.tensor([math.nan, 1.0]))
    assert not nan.allclose(nan)
    assert nan.allclose(nan, equal_nan=True)


def test_allclose_refuses_other_shapes_dtypes_devices() -> None:
    """Differing shape, dtype or device is a ValueError naming the keys."""
    p = _make(0)
    other = {**p, "b": p["b"].float(), "w": p["w"][:1], "s": p["s"].to("meta")}
    with pytest.raises(
        ValueError, match=r"differ for 'b' \(float64\[2\] cpu vs float32"
    ):
        p.allclose(other)
    with pytest.raises(
        ValueError, match=r"'s' \(float64\[\] cpu vs float64\[\] meta\)"
    ):
        p.allclose(other)
    with pytest.raises(TypeError, match=r"the entries \['s'\] of `other` are not"):
        p.allclose({**p, "s": 1.0})


# ---------------------------------------------------------------- the optimizers


def _adam_steps(p: ParamDict, grads: list[ParamDict], *, amsgrad: bool) -> ParamDict:
    lr, (beta1, beta2), eps, wd = 1e-2, (0.9, 0.99), 1e-8, 0.1
    m, v, vmax = p.zeros_like(), p.zeros_like(), p.zeros_like()
    for t, g in enumerate(grads, start=1):
        g = g.add(p, alpha=wd)
        m = m.lerp(g, 1 - beta1)
        v = v.mul(beta2).addcmul(g, g, value=1 - beta2)
        if amsgrad:
            vmax = vmax.maximum(v)
        second = vmax if amsgrad else v
        bc1, bc2 = 1 - beta1**t, 1 - beta2**t
        denom = second.sqrt().div(math.sqrt(bc2)).add(eps)
        p = p.addcdiv(m, denom, value=-lr / bc1)
    return p


def _adamw_steps(p: ParamDict, grads: list[ParamDict]) -> ParamDict:
    lr, (beta1, beta2), eps, wd = 1e-2, (0.9, 0.99), 1e-8, 0.1
    m, v = p.zeros_like(), p.zeros_like()
    for t, g in enumerate(grads, start=1):
        p = p.mul(1 - lr * wd)
        m = m.lerp(g, 1 - beta1)
        v = v.mul(beta2).addcmul(g, g, value=1 - beta2)
        denom = v.sqrt().div(math.sqrt(1 - beta2**t)).add(eps)
        p = p.addcdiv(m, denom, value=-lr / (1 - beta1**t))
    return p


def _sgd_steps(p: ParamDict, grads: list[ParamDict]) -> ParamDict:
    lr, momentum, dampening, wd = 0.1, 0.9, 0.0, 0.01
    buf = None
    for g in grads:
        g = g.neg().add(p, alpha=wd)  # maximize=True negates the gradient
        buf = (
            g.clone() if buf is None else buf.mul(momentum).add(g, alpha=1 - dampening)
        )
        p = p.add(g.add(buf, alpha=momentum), alpha=-lr)  # nesterov
    return p


def _rmsprop_steps(p: ParamDict, grads: list[ParamDict]) -> ParamDict:
    lr, alpha, eps, momentum = 1e-2, 0.9, 1e-8, 0.5
    square, mean, buf = p.zeros_like(), p.zeros_like(), p.zeros_like()
    for g in grads:
        square = square.mul(alpha).addcmul(g, g, value=1 - alpha)
        mean = mean.lerp(g, 1 - alpha)  # centered
        avg = square.addcmul(mean, mean, value=-1).sqrt().add(eps)
        buf = buf.mul(momentum).addcdiv(g, avg)
        p = p.add(buf, alpha=-lr)
    return p


def _adagrad_steps(p: ParamDict, grads: list[ParamDict]) -> ParamDict:
    lr, decay, eps = 0.1, 0.01, 1e-10
    total = p.full_like(0.1)
    for t, g in enumerate(grads, start=1):
        total = total.addcmul(g, g, value=1)
        p = p.addcdiv(g, total.sqrt().add(eps), value=-lr / (1 + (t - 1) * decay))
    return p


OPTIMIZERS: dict[str, tuple[Callable[..., ParamDict], Callable[..., Any]]] = {
    "adam-amsgrad": (
        lambda p, gs: _adam_steps(p, gs, amsgrad=True),
        lambda ts: torch.optim.Adam(
            ts, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, amsgrad=True, foreach=True
        ),
    ),
    "adam": (
        lambda p, gs: _adam_steps(p, gs, amsgrad=False),
        lambda ts: torch.optim.Adam(
            ts, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, foreach=True
        ),
    ),
    "adamw": (
        _adamw_steps,
        lambda ts: torch.optim.AdamW(
            ts, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, foreach=True
        ),
    ),
    "sgd": (
        _sgd_steps,
        lambda ts: torch.optim.SGD(
            ts,
            lr=0.1,
            momentum=0.9,
            weight_decay=0.01,
            nesterov=True,
            maximize=True,
            foreach=True,
        ),
    ),
    "rmsprop": (
        _rmsprop_steps,
        lambda ts: torch.optim.RMSprop(
            ts, lr=1e-2, alpha=0.9, momentum=0.5, centered=True, foreach=True
        ),
    ),
    "adagrad": (
        _adagrad_steps,
        lambda ts: torch.optim.Adagrad(
            ts, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1, foreach=True
        ),
    ),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_vocabulary_covers_torch_optim_foreach_steps(name: str) -> None:
    """SGD, Adam, AdamW, RMSprop, Adagrad in these methods match torch.optim."""
    keyed, make_torch = OPTIMIZERS[name]
    p = _make(0, shift=-0.5)
    grads = [_make(10 + i, shift=-0.5) for i in range(4)]
    tensors = [v.clone().requires_grad_() for v in p.values()]
    opt = make_torch(tensors)
    for g in grads:
        for t, gk in zip(tensors, g.values()):
            t.grad = gk.clone()
        opt.step()
    got = keyed(p, grads)
    for k, t in zip(KEYS, tensors):
        torch.testing.assert_close(got[k], t.detach(), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- properties

_finite = st.floats(-3, 3, allow_nan=False)


@st.composite
def _triples(draw: st.DrawFn) -> tuple[ParamDict, ParamDict, ParamDict]:
    keys = draw(
        st.lists(st.sampled_from("abcdef"), min_size=0, max_size=4, unique=True)
    )
    sizes = [draw(st.integers(0, 3)) for _ in keys]

    def make() -> ParamDict:
        return ParamDict(
            {
                k: torch.tensor(
                    draw(st.lists(_finite, min_size=n, max_size=n)), dtype=F64
                )
                for k, n in zip(keys, sizes)
            }
        )

    return make(), make(), make()


@given(_triples(), _finite, st.floats(0, 1))
def test_fused_identities(
    pqr: tuple[ParamDict, ParamDict, ParamDict], c: float, w: float
) -> None:
    """Fused methods equal their unfused definitions, and never mutate inputs."""
    p, q, r = pqr
    snapshot = [{k: v.clone() for k, v in d.items()} for d in pqr]
    assert p.add(q, alpha=c).allclose(p + c * q)
    assert p.sub(q, alpha=c).allclose(p - c * q)
    assert p.sub(q, alpha=torch.tensor(c, dtype=F64)).allclose(p - c * q)
    assert p.addcmul(q, r, value=c).allclose(p + c * q * r)
    assert p.lerp(q, w).allclose(p + w * (q - p))
    lo, hi = p.minimum(q), p.maximum(q)
    assert lo.add(hi).allclose(p + q)
    clamped = r.clamp(lo, hi.maximum(lo))
    assert clamped.maximum(lo).minimum(hi) == clamped
    for before, d in zip(snapshot, pqr):
        assert all(torch.equal(d[k], before[k]) for k in d)


@pytest.mark.parametrize(
    "dtypes",
    [
        (torch.float32,),
        (F64,),
        (torch.float16,),
        (torch.bfloat16,),
        (torch.float32, F64),
        (torch.float32, torch.int64),
    ],
    ids=str,
)
@pytest.mark.parametrize("number", [0.01, 1 / 3, -7, 1e-30])
def test_scaling_by_a_number_is_bitwise_torch(
    dtypes: tuple[torch.dtype, ...], number: float
) -> None:
    """`p * x`, `x * p`, `p / x`, `mul`, `div` equal torch bit for bit, any dtypes."""
    gen = torch.Generator().manual_seed(0)
    p = ParamDict(
        {
            f"e{i}": (torch.randn(n, generator=gen) * 50).to(dtypes[i % len(dtypes)])
            for i, n in enumerate([1, 7, 64, 1600])
        }
    )
    cases: list[tuple[ParamDict, Callable[[Tensor], Tensor]]] = [
        (p * number, lambda v: v * number),
        (number * p, lambda v: number * v),
        (p.mul(number), lambda v: torch.mul(v, number)),
        (p / number, lambda v: v / number),
        (p.div(number), lambda v: torch.div(v, number)),
    ]
    for out, ref in cases:
        for k in p:
            want = ref(p[k])
            assert out[k].dtype == want.dtype
            assert torch.equal(out[k], want)


@pytest.mark.skipif(
    torch.__version__ < "2.8",
    reason="torch.compile(fullgraph=True) traces a ParamDict from torch 2.8 on; older "
    "dynamo graph-breaks on dict subclasses (results stay correct)",
)
def test_an_optimizer_step_compiles_without_graph_breaks() -> None:
    """Fused math and reductions compile with `fullgraph=True` and match eager."""

    def step(p: ParamDict, g: ParamDict, m: ParamDict, v: ParamDict) -> Any:
        g = g.clip_norm(1.0)
        m = m.lerp(g, 0.1)
        v = v.mul(0.99).addcmul(g, g, value=0.01)
        p = p.addcdiv(m, v.sqrt().add(1e-8), value=-0.001).sub(g, alpha=0.1)
        return p, g.norm(), g.norm(math.inf), p.dot(g), (p / 2).sum()

    torch._dynamo.reset()
    p, g = _make(0), _make(1, shift=-0.5)
    m, v = p.zeros_like(), p.ones_like()
    assert torch._dynamo.explain(step)(p, g, m, v).graph_break_count == 0
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(p, g, m, v)
    want = step(p, g, m, v)
    assert got[0].allclose(want[0])
    for a, b in zip(got[1:], want[1:]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("value", [1.0, 0.25, {"w": 0.5, "b": -1.0, "s": 2.0}])
def test_addcdiv_differentiates_entries_of_different_shapes(value: Any) -> None:
    """The gradients of `addcdiv` equal per-tensor `torch.addcdiv`'s (float64).

    torch 2.13's derivative of `torch._foreach_addcdiv` raises an `IndexError`
    when the entries' shapes differ; ParamDict's must not.
    """
    p, a, b = (_make(i).map(lambda t: t.requires_grad_()) for i in (0, 1, 2))
    out = p.addcdiv(a, b, value=value)
    got = torch.autograd.grad(
        torch.stack([v.sum() for v in out.values()]).sum(),
        [*p.values(), *a.values(), *b.values()],
    )
    theirs = [
        torch.addcdiv(
            p[k], a[k], b[k], value=value[k] if isinstance(value, dict) else value
        )
        for k in KEYS
    ]
    expected = torch.autograd.grad(
        torch.stack([t.sum() for t in theirs]).sum(),
        [*p.values(), *a.values(), *b.values()],
    )
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
