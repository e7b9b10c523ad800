import operator
from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from _helpers import CountOps, MyParams
from hypothesis import given
from hypothesis import strategies as st

from paramdict import ParamDict


def _pair() -> tuple[ParamDict, ParamDict]:
    gen = torch.Generator().manual_seed(0)
    p = ParamDict(
        w=torch.rand(3, 2, generator=gen) + 0.5,
        b=torch.rand(2, generator=gen) + 0.5,
        s=torch.rand((), generator=gen) + 0.5,
    )
    q = ParamDict(
        w=torch.rand(3, 2, generator=gen) + 0.5,
        b=torch.rand(2, generator=gen) + 0.5,
        s=torch.rand((), generator=gen) + 0.5,
    )
    return p, q


BINARY = [
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.pow,
]


@pytest.mark.parametrize("op", BINARY, ids=lambda f: f.__name__)
def test_binary_with_paramdict_matches_reference(op: Callable[[Any, Any], Any]) -> None:
    """`p op q` equals the per-key plain-torch result, in `p`'s key order."""
    p, q = _pair()
    out = op(p, q)
    assert type(out) is ParamDict
    assert list(out) == list(p)
    for k in p:
        torch.testing.assert_close(out[k], op(p[k], q[k]))


@pytest.mark.parametrize("op", BINARY, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    "scalar", [2, 0.5, torch.tensor(1.5)], ids=["int", "float", "0-dim"]
)
def test_binary_with_scalar_both_directions(
    op: Callable[[Any, Any], Any], scalar: Any
) -> None:
    """Numbers and 0-dim tensors work on either side of every operator."""
    p, _ = _pair()
    right = op(p, scalar)
    for k in p:
        torch.testing.assert_close(right[k], op(p[k], scalar))
    if isinstance(scalar, torch.Tensor):
        left = getattr(p, f"__r{op.__name__.strip('_')}__")(scalar)
    else:
        left = op(scalar, p)
    assert type(left) is ParamDict
    for k in p:
        torch.testing.assert_close(left[k], op(scalar, p[k]))


@pytest.mark.parametrize("op", BINARY, ids=lambda f: f.__name__)
def test_plain_mapping_in_any_order_on_either_side(
    op: Callable[[Any, Any], Any],
) -> None:
    """A plain dict with the same keys in another order aligns by key."""
    p, q = _pair()
    reordered = {k: q[k] for k in reversed(list(q))}
    right = op(p, reordered)
    left = op(reordered, p)
    assert list(right) == list(p)
    assert list(left) == list(p)
    for k in p:
        torch.testing.assert_close(right[k], op(p[k], q[k]))
        torch.testing.assert_close(left[k], op(q[k], p[k]))


def test_tensor_on_the_left_gives_paramdict() -> None:
    """`lr * p` with a 0-dim tensor `lr` returns a ParamDict, not an error."""
    p, _ = _pair()
    lr = torch.tensor(0.1)
    out = lr * p
    assert type(out) is ParamDict
    torch.testing.assert_close(out["w"], 0.1 * p["w"])
    out = lr - p
    assert type(out) is ParamDict
    torch.testing.assert_close(out["w"], 0.1 - p["w"])


def test_unary_operators() -> None:
    """`-p`, `+p` and `abs(p)` match torch."""
    p, _ = _pair()
    p = p - 1
    for k in p:
        torch.testing.assert_close((-p)[k], -p[k])
        torch.testing.assert_close(abs(p)[k], p[k].abs())
        torch.testing.assert_close((+p)[k], p[k])


def test_rsqrt_matches_torch_with_gradients_and_under_vmap() -> None:
    """`p.rsqrt()` equals `torch.rsqrt` per entry, in value, gradient and under vmap."""
    p, _ = _pair()
    p = ParamDict({k: v.double().requires_grad_() for k, v in p.items()})
    out = p.rsqrt()
    for k in p:
        torch.testing.assert_close(out[k], torch.rsqrt(p[k]))
    grads = p.grad(torch.stack([v.sum() for v in out.values()]).sum())
    expected = torch.autograd.grad(
        torch.stack([torch.rsqrt(v).sum() for v in p.values()]).sum(),
        tuple(p.values()),
    )
    for k, e in zip(p, expected):
        torch.testing.assert_close(grads[k], e)
    stacked = ParamDict(w=torch.rand(4, 3) + 0.5)
    batched = torch.func.vmap(lambda q: q.rsqrt())(stacked)
    torch.testing.assert_close(batched["w"], torch.rsqrt(stacked["w"]))


def test_key_mismatch_names_missing_and_unexpected() -> None:
    """A mapping with other keys is a ValueError listing both sides, sorted."""
    p, _ = _pair()
    other = {"w": torch.zeros(3, 2), "b": torch.zeros(2), "head.bias": torch.zeros(1)}
    with pytest.raises(
        ValueError, match=r"missing \['s'\], unexpected \['head.bias'\].*select"
    ):
        p + other
    with pytest.raises(ValueError, match=r"missing \['s'\]"):
        other - p
    with pytest.raises(ValueError, match=r"unexpected \['extra'\]"):
        p * (dict(p) | {"extra": torch.zeros(1)})


def test_non_broadcastable_entry_is_named() -> None:
    """A per-key value that does not broadcast raises ValueError naming its key."""
    p, _ = _pair()
    bad = dict(p) | {"b": torch.zeros(5)}
    with pytest.raises(ValueError, match=r"Entry 'b': shapes \(2,\), \(5,\)"):
        p + bad


def test_wrong_kind_of_operand() -> None:
    """A tensor with dimensions, a string or a list is refused with TypeError."""
    p, _ = _pair()
    with pytest.raises(TypeError, match=r"0-dim tensor.*shape \(2,\)"):
        p * torch.ones(2)
    with pytest.raises(TypeError, match="unsupported operand"):
        p + "x"  # type: ignore[operator]  # the error under test
    with pytest.raises(TypeError, match="not tensors"):
        p + cast(Any, {"w": torch.zeros(3, 2), "b": "x", "s": torch.zeros(())})


def test_per_key_numbers() -> None:
    """A mapping of numbers gives per-entry scalars (per-parameter learning rates)."""
    p, _ = _pair()
    out = p * {"w": 2.0, "b": 3.0, "s": 4.0}
    torch.testing.assert_close(out["w"], p["w"] * 2)
    torch.testing.assert_close(out["s"], p["s"] * 4)
    out = 1.0 - p
    torch.testing.assert_close(out["b"], 1.0 - p["b"])
    out = {"w": 1.0, "b": 2.0, "s": 3.0} - p
    torch.testing.assert_close(out["b"], 2.0 - p["b"])
    out = {"w": 1.0, "b": 2.0, "s": 3.0} / p
    torch.testing.assert_close(out["s"], 3.0 / p["s"])
    out = {"w": 2.0, "b": 2.0, "s": 3.0} ** p
    torch.testing.assert_close(out["s"], 3.0 ** p["s"])


def test_operands_are_never_mutated() -> None:
    """Operators leave both operands' tensors untouched."""
    p, q = _pair()
    snapshot = (
        {k: v.clone() for k, v in p.items()},
        {k: v.clone() for k, v in q.items()},
    )
    for op in BINARY:
        op(p, q)
        op(p, 2.0)
        op(2.0, p)
    _ = -p, abs(p)
    for k in p:
        assert torch.equal(p[k], snapshot[0][k])
        assert torch.equal(q[k], snapshot[1][k])


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (lambda p, q: p + q, ["_foreach_add"]),
        (lambda p, q: p - q, ["_foreach_sub"]),
        (lambda p, q: p * q, ["_foreach_mul"]),
        (lambda p, q: p / q, ["_foreach_div"]),
        (lambda p, q: p**q, ["_foreach_pow"]),
        (lambda p, q: p * 0.5, ["_foreach_mul"]),
        (lambda p, q: p - 0.5, ["_foreach_sub"]),
        (lambda p, q: p - q["s"], ["_foreach_sub"]),
        (lambda p, q: 2.0**p, ["_foreach_pow"]),
        (lambda p, q: q - p, ["_foreach_sub"]),
        (lambda p, q: -p, ["_foreach_neg"]),
        (lambda p, q: abs(p), ["_foreach_abs"]),
        (lambda p, q: p.rsqrt(), ["_foreach_pow"]),
    ],
)
def test_each_operator_is_one_foreach_call(expr: Any, expected: list[str]) -> None:
    """The operator dispatches exactly one foreach kernel and nothing else."""
    p, q = _pair()
    with CountOps() as mode:
        expr(p, q)
    assert mode.ops == expected


def test_operators_are_differentiable_second_order() -> None:
    """A MAML-style step `p - lr * g` with `create_graph=True` keeps second order."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(3, dtype=torch.float64, generator=gen, requires_grad=True)
    p = ParamDict(w=w)
    x = torch.randn(5, 3, dtype=torch.float64, generator=gen)
    g = p.grad(torch.tanh(x @ p["w"]).pow(2).sum(), create_graph=True)
    fast = p - 0.1 * g
    meta = p.grad(torch.tanh(x @ fast["w"]).sum())["w"]
    (g_ref,) = torch.autograd.grad(torch.tanh(x @ w).pow(2).sum(), w, create_graph=True)
    (meta_ref,) = torch.autograd.grad(torch.tanh(x @ (w - 0.1 * g_ref)).sum(), w)
    torch.testing.assert_close(meta, meta_ref, rtol=1e-12, atol=1e-12)


def test_subclass_type_survives_operators() -> None:
    """Every operator returns the subclass of its ParamDict operand."""
    p = MyParams(w=torch.ones(2))
    for out in (p + p, p - 1, 1 - p, 2 * p, p / 2, 2 / p, p**2, 2**p, -p, abs(p)):
        assert type(out) is MyParams


_finite = st.floats(-4, 4, allow_nan=False, width=32)
_vectors = st.lists(_finite, min_size=1, max_size=5)


@st.composite
def _paramdicts(draw: st.DrawFn) -> tuple[ParamDict, ParamDict]:
    keys = draw(
        st.lists(
            st.text("abc.", min_size=1, max_size=4), min_size=1, max_size=4, unique=True
        )
    )
    sizes = [draw(st.integers(1, 4)) for _ in keys]

    def make() -> ParamDict:
        return ParamDict(
            {
                k: torch.tensor(draw(st.lists(_finite, min_size=n, max_size=n)))
                for k, n in zip(keys, sizes)
            }
        )

    return make(), make()


@given(_paramdicts(), _finite)
def test_algebra_properties(pq: tuple[ParamDict, ParamDict], c: float) -> None:
    """Commutativity, inverses and distributivity hold key by key."""
    p, q = pq
    snapshot = {k: v.clone() for k, v in p.items()}
    assert (p + q).allclose(q + p, rtol=1e-5, atol=1e-5)
    assert ((p - q) + q).allclose(p, rtol=1e-5, atol=1e-5)
    assert (c * (p + q)).allclose(c * p + c * q, rtol=1e-4, atol=1e-4)
    assert p.neg().neg() == p
    assert (p * 1) == p
    assert (p + p).allclose(2 * p, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(p[k], snapshot[k]) for k in p)


@pytest.mark.parametrize(
    "expr",
    [
        lambda p, lr: p - lr * p,
        lambda p, lr: p * lr,
        lambda p, lr: p / lr,
        lambda p, lr: p + lr,
        lambda p, lr: p - lr,
        lambda p, lr: lr - p,
        lambda p, lr: lr / p,
        lambda p, lr: p**lr,
        lambda p, lr: lr**p,
    ],
)
def test_learnable_scalar_tensor_gets_gradients(expr: Any) -> None:
    """A 0-dim tensor operand that requires grad (Meta-SGD's lr) is differentiated."""
    p = ParamDict(
        w=torch.rand(3, dtype=torch.float64) + 0.5,
        b=torch.rand(2, dtype=torch.float64) + 0.5,
    )
    lr = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    out = expr(p, lr)
    (got,) = torch.autograd.grad(sum(v.sum() for v in out.values()), lr)
    lr_ref = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    total = sum(expr(v, lr_ref).sum() for v in p.values())  # the same ops on tensors
    (want,) = torch.autograd.grad(total, lr_ref)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_scaling_by_numbers_matches_torch_bit_for_bit_in_every_mode() -> None:
    """Signed zeros, inference mode and a default-device context scale as torch does.

    On CPU, numbers reach the kernels as cached 0-dim tensors; none of these may
    change a result or leak into a later recorded step.
    """
    w = torch.tensor([1.5, -2.0, 0.0])
    p = ParamDict(w=w)
    for number in (0.0, -0.0, 3.25, -7, float("inf"), float("nan")):
        got = (p * number)["w"]
        want = w * number
        assert torch.equal(got.isnan(), want.isnan()), number
        kept = ~want.isnan()
        assert torch.equal(got[kept], want[kept]), number
        assert torch.equal(got[kept].signbit(), want[kept].signbit()), number
    with torch.inference_mode():
        inferred = p * 0.3141
    assert torch.equal(inferred["w"], w * 0.3141)
    leaf = ParamDict(w=w.clone().requires_grad_())
    (g,) = torch.autograd.grad((leaf * 0.3141)["w"].sum(), leaf["w"])  # after it
    assert torch.equal(g, torch.full((3,), 0.3141))
    with torch.device("meta"):
        scaled = p * 0.2718
    assert scaled["w"].device.type == "cpu"
    assert torch.equal(scaled["w"], w * 0.2718)
