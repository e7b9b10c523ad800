import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from _helpers import CountOps, MyParams
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor, nn

from paramdict import ParamDict

F64 = torch.float64


def _params(seed: int = 0, dtype: torch.dtype = torch.float32) -> ParamDict:
    gen = torch.Generator().manual_seed(seed)
    return ParamDict(
        w=torch.randn(4, 3, generator=gen, dtype=dtype),
        b=torch.randn(3, generator=gen, dtype=dtype),
        s=torch.randn((), generator=gen, dtype=dtype),
    )


def _flat(p: ParamDict) -> Tensor:
    """The plain-torch reference vector: every entry flattened and concatenated."""
    return torch.cat([v.reshape(-1) for v in p.values()])


@pytest.fixture(params=["flattened", "per-entry"])
def strategy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a test on both ways of reducing: one flattened copy, or per entry."""
    if request.param == "per-entry":
        monkeypatch.setattr("paramdict._reduce._FLAT_TOTAL_LIMIT", -1)
    return str(request.param)


def test_small_cpu_entries_are_reduced_through_one_copy(strategy: str) -> None:
    """The two strategies are what runs: one `cat`, or one `_foreach_norm`."""
    with CountOps() as mode:
        _params().norm()
    flattened = "cat" in mode.ops and "_foreach_norm" not in mode.ops
    assert flattened == (strategy == "flattened")


# ---------------------------------------------------------------- dot, norm, sum


def test_dot_matches_flattened_dot(strategy: str) -> None:
    """`p.dot(q)` is the dot product of the two flattened vectors, in any key order."""
    p, q = _params(0), _params(1)
    reordered = {k: q[k] for k in reversed(list(q))}
    torch.testing.assert_close(p.dot(reordered), torch.dot(_flat(p), _flat(q)))
    torch.testing.assert_close(p.dot(p), _flat(p).pow(2).sum())


def test_dot_refuses_entries_that_differ() -> None:
    """Different keys, shapes or dtypes are ValueErrors naming the keys."""
    p = _params()
    with pytest.raises(ValueError, match=r"missing \['s'\]"):
        p.dot({"w": p["w"], "b": p["b"]})
    with pytest.raises(ValueError, match=r"differ for 'b' \(torch.float32\[3\] vs"):
        p.dot({**p, "b": p["b"].double()})
    with pytest.raises(ValueError, match=r"differ for 'w' .*\[1, 12\]"):
        p.dot({**p, "w": p["w"].reshape(1, 12)})
    with pytest.raises(TypeError, match=r"\['s'\] are not tensors"):
        p.dot({**p, "s": 1.0})  # type: ignore[dict-item]  # the wrong kind on purpose


@pytest.mark.parametrize("order", [2, 1, 3, 0.5, math.inf], ids=str)
def test_norm_is_the_norm_of_the_flattened_entries(order: float, strategy: str) -> None:
    """`p.norm(order)` equals `vector_norm` of all entries concatenated."""
    p = _params()
    torch.testing.assert_close(p.norm(order), torch.linalg.vector_norm(_flat(p), order))


def test_norm_promotes_mixed_dtypes_like_torch() -> None:
    """Entries of several float dtypes give a norm in the promoted dtype."""
    p = _params(dtype=F64) | {"h": torch.ones(4, dtype=torch.float16)}
    want = torch.linalg.vector_norm(
        torch.cat([_flat(p.exclude("h")), torch.ones(4, dtype=F64)])
    )
    got = p.norm()
    assert got.dtype == F64
    torch.testing.assert_close(got, want)


def test_norm_skips_empty_entries_for_inf(strategy: str) -> None:
    """Empty entries add nothing, also to the max norm (which has no identity)."""
    p = _params() | {"e": torch.ones(0)}
    torch.testing.assert_close(p.norm(math.inf), _flat(p).abs().max())
    torch.testing.assert_close(p.norm(), _flat(p).norm())
    torch.testing.assert_close(
        ParamDict(e=torch.ones(0)).norm(math.inf), torch.tensor(0.0)
    )


def test_norm_argument_and_entry_errors() -> None:
    """Bad orders and integer entries are refused with the reason."""
    p = _params()
    for bad in (0, -1.0, math.nan):
        with pytest.raises(ValueError, match="takes a positive `p`"):
            p.norm(bad)
    for wrong in ("2", True, None):
        with pytest.raises(TypeError, match="takes a number as `p`"):
            p.norm(wrong)  # type: ignore[arg-type]  # the wrong kind on purpose
    with pytest.raises(
        TypeError, match=r"needs floating point entries; \['n'\] are not"
    ):
        (p | {"n": torch.tensor([1, 2])}).norm()


def test_sum_and_numel(strategy: str) -> None:
    """`sum` adds every element; `numel` counts them as a Python int."""
    p = _params() | {"n": torch.tensor([1, 2])}
    torch.testing.assert_close(p.sum(), _flat(p.exclude("n")).sum() + 3)
    assert p.numel() == 12 + 3 + 1 + 2
    assert type(p.numel()) is int


def test_isfinite(strategy: str) -> None:
    """`isfinite` is False exactly when some float entry holds an inf or a NaN."""
    p = _params() | {"n": torch.tensor([1, 2]), "e": torch.ones(0)}
    assert p.isfinite() is True
    for bad in (math.inf, -math.inf, math.nan):
        broken = p | {"b": torch.tensor([0.0, bad, 1.0])}
        assert broken.isfinite() is False
    assert ParamDict().isfinite() is True


def test_empty_reductions(strategy: str) -> None:
    """An empty ParamDict reduces to zero (and an empty vector)."""
    e = ParamDict()
    for value in (e.norm(), e.norm(math.inf), e.sum(), e.dot({})):
        torch.testing.assert_close(value, torch.tensor(0.0))
    assert e.numel() == 0
    assert e.to_vector().shape == (0,)
    assert e.clip_norm(1.0) == e


# ---------------------------------------------------------------- one device

REDUCTIONS: dict[str, Callable[[ParamDict], Any]] = {
    "dot": lambda p: p.dot(p),
    "norm": lambda p: p.norm(),
    "norm-inf": lambda p: p.norm(math.inf),
    "sum": lambda p: p.sum(),
    "isfinite": lambda p: p.isfinite(),
    "clip_norm": lambda p: p.clip_norm(1.0),
    "to_vector": lambda p: p.to_vector(),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions_need_one_device(name: str) -> None:
    """Entries on two devices are a ValueError naming the strays, before any work."""
    p = _params() | {
        "m": torch.ones(2, device="meta"),
        "a": torch.ones(2, device="meta"),
    }
    with pytest.raises(
        ValueError, match=r"share one device; \['a', 'm'\] are not on cpu"
    ):
        REDUCTIONS[name](p)


@pytest.mark.parametrize("name", [n for n in REDUCTIONS if n != "isfinite"])
def test_reductions_do_not_read_values(name: str, strategy: str) -> None:
    """No reduction returning a tensor calls `.item()` (no device synchronization)."""
    p = _params()
    with CountOps() as mode:
        REDUCTIONS[name](p)
    assert mode.ops
    assert "_local_scalar_dense" not in mode.ops


def test_reductions_under_vmap(strategy: str) -> None:
    """Reductions work inside `torch.func.vmap` over a stacked ParamDict."""
    members = [_params(i) for i in range(3)]
    stacked = ParamDict.stack(members)
    for name in ("dot", "norm", "norm-inf", "sum", "to_vector"):
        got = torch.func.vmap(REDUCTIONS[name])(stacked)
        want = torch.stack([REDUCTIONS[name](m) for m in members])
        torch.testing.assert_close(got, want)
    clipped = torch.func.vmap(REDUCTIONS["clip_norm"])(stacked)
    assert ParamDict.stack([m.clip_norm(1.0) for m in members]).allclose(clipped)


# ---------------------------------------------------------------- clip_norm


@pytest.mark.parametrize("order", [2, 1, math.inf], ids=str)
@pytest.mark.parametrize("max_norm", [0.5, 3.0, 100.0])
def test_clip_norm_matches_clip_grad_norm(
    order: float, max_norm: float, strategy: str
) -> None:
    """`clip_norm` gives what `clip_grad_norm_` leaves in `.grad` (eps included)."""
    grads = _params()
    out = grads.clip_norm(max_norm, p=order)
    tensors = [torch.zeros_like(v, requires_grad=True) for v in grads.values()]
    for t, g in zip(tensors, grads.values()):
        t.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(tensors, max_norm, norm_type=order)
    for k, t in zip(grads, tensors):
        torch.testing.assert_close(out[k], t.grad)
    assert grads == _params()  # unchanged
    assert out.norm(order) <= max_norm * (1 + 1e-5)


def test_clip_norm_keeps_the_subclass_and_checks_arguments() -> None:
    """`clip_norm` returns the subclass; bad limits are refused."""
    p = MyParams(_params())
    assert type(p.clip_norm(1.0)) is MyParams
    assert type(p.clip_norm(torch.tensor(1.0))) is MyParams
    with pytest.raises(ValueError, match=r"non-negative `max_norm`, got -1\.0"):
        p.clip_norm(-1.0)
    with pytest.raises(TypeError, match="got str"):
        p.clip_norm("1")  # type: ignore[arg-type]  # the wrong kind on purpose
    with pytest.raises(TypeError, match=r"got a tensor of shape \(2,\)"):
        p.clip_norm(torch.ones(2))


# ---------------------------------------------------------------- second order


def _loss(w: Tensor, b: Tensor, x: Tensor) -> Tensor:
    return torch.tanh(x @ w + b).pow(2).sum()


def _setup(seed: int) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(3, 2, dtype=F64, generator=gen, requires_grad=True)
    b = torch.randn(2, dtype=F64, generator=gen, requires_grad=True)
    x = torch.randn(6, 3, dtype=F64, generator=gen)
    return w, b, x


@pytest.mark.parametrize("order", [2, 3, math.inf], ids=str)
def test_norm_and_dot_are_second_order_differentiable(
    order: float, strategy: str
) -> None:
    """Gradient penalties through `norm` and `dot` match plain torch in float64."""
    w, b, x = _setup(9)
    p = ParamDict(w=w, b=b)
    g = p.grad(_loss(w, b, x), create_graph=True)
    penalty = g.norm(order) + g.dot(p) ** 2
    got = torch.autograd.grad(penalty, [w, b])

    gw, gb = torch.autograd.grad(_loss(w, b, x), [w, b], create_graph=True)
    flat = torch.cat([gw.reshape(-1), gb])
    dot = (gw * w).sum() + (gb * b).sum()
    want = torch.autograd.grad(torch.linalg.vector_norm(flat, order) + dot**2, [w, b])
    for got_i, want_i in zip(got, want):
        torch.testing.assert_close(got_i, want_i, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("max_norm", [0.05, 100.0])
def test_clip_norm_is_second_order_differentiable(
    max_norm: float, strategy: str
) -> None:
    """A MAML step with clipped inner gradients matches plain torch in float64."""
    w, b, x = _setup(10)
    limit = torch.tensor(max_norm, dtype=F64, requires_grad=True)
    p = ParamDict(w=w, b=b)
    g = p.grad(_loss(w, b, x), create_graph=True).clip_norm(limit)
    fast = p.sub(g, alpha=0.5)
    got = torch.autograd.grad(_loss(fast["w"], fast["b"], 2 * x), [w, b, limit])

    gw, gb = torch.autograd.grad(_loss(w, b, x), [w, b], create_graph=True)
    total = torch.cat([gw.reshape(-1), gb]).norm()
    coef = torch.clamp(limit / (total + 1e-6), max=1.0)
    want = torch.autograd.grad(
        _loss(w - 0.5 * coef * gw, b - 0.5 * coef * gb, 2 * x), [w, b, limit]
    )
    for got_i, want_i in zip(got, want):
        torch.testing.assert_close(got_i, want_i, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- vectors


def test_to_vector_matches_parameters_to_vector() -> None:
    """`to_vector` equals `parameters_to_vector` on the same tensors, in key order."""
    first = nn.Linear(3, 4)
    model = nn.Sequential(first, nn.Linear(4, 2))
    p = ParamDict.from_module(model)
    want = torch.nn.utils.parameters_to_vector(model.parameters())
    torch.testing.assert_close(p.to_vector(), want)
    (g,) = torch.autograd.grad(p.to_vector().sum(), [first.weight])
    torch.testing.assert_close(g, torch.ones(4, 3))


def test_from_vector_matches_vector_to_parameters() -> None:
    """`from_vector` cuts the vector as `vector_to_parameters` does, out of place."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    like = ParamDict.from_module(model).detach().clone()
    vector = torch.arange(like.numel(), dtype=torch.float32)
    got = MyParams.from_vector(vector, like=like)
    assert type(got) is MyParams
    torch.nn.utils.vector_to_parameters(vector, model.parameters())
    assert got == ParamDict.from_module(model).detach()
    assert got["0.weight"]._base is vector  # views: no copy


def test_from_vector_is_differentiable() -> None:
    """Gradients of the entries flow back into the vector."""
    vector = torch.arange(5.0, requires_grad=True)
    q = ParamDict.from_vector(
        vector, like={"a": torch.zeros(2, 1), "b": torch.zeros(3)}
    )
    (g,) = torch.autograd.grad((q["a"].sum() * 2) + q["b"].sum(), vector)
    torch.testing.assert_close(g, torch.tensor([2.0, 2.0, 1.0, 1.0, 1.0]))


def test_vector_errors() -> None:
    """Mixed dtypes, bad lengths, shapes and kinds are refused with the reason."""
    p = _params()
    with pytest.raises(
        ValueError, match=r"\['b'\] are not torch.float32 \(as 'w' is\)"
    ):
        (p | {"b": p["b"].double()}).to_vector()
    with pytest.raises(ValueError, match="a vector of 3 elements, but `like` holds 16"):
        ParamDict.from_vector(torch.ones(3), like=p)
    with pytest.raises(ValueError, match=r"got one of shape \(4, 4\)"):
        ParamDict.from_vector(torch.ones(4, 4), like=p)
    with pytest.raises(TypeError, match="takes a tensor, got list"):
        ParamDict.from_vector([1.0], like=p)  # type: ignore[arg-type]  # the wrong kind on purpose
    with pytest.raises(
        TypeError, match=r"the entries \['x'\] of `like` are not tensors"
    ):
        ParamDict.from_vector(torch.ones(1), like={"x": 1.0})  # type: ignore[dict-item]  # the wrong kind on purpose


_shape = st.lists(st.integers(0, 3), max_size=3)


@given(
    st.dictionaries(st.text("abc", min_size=1, max_size=3), _shape, max_size=4),
    st.integers(0, 2**16),
)
def test_vector_round_trip(spec: dict[str, list[int]], seed: int) -> None:
    """`from_vector(p.to_vector(), like=p) == p`, and the reverse, inputs untouched."""
    gen = torch.Generator().manual_seed(seed)
    p = ParamDict({k: torch.randn(shape, generator=gen) for k, shape in spec.items()})
    snapshot = p.clone()
    vector = p.to_vector()
    assert vector.shape == (p.numel(),)
    back = ParamDict.from_vector(vector, like=p)
    assert back == p
    assert torch.equal(back.to_vector(), vector)
    assert p == snapshot
    torch.testing.assert_close(p.norm(), torch.linalg.vector_norm(vector))
    torch.testing.assert_close(p.sum(), vector.sum())


def test_vector_entries_are_concatenated_without_views(strategy: str) -> None:
    """All-1-dim entries go to `cat` as they are; the results are the same."""
    gen = torch.Generator().manual_seed(4)
    p = ParamDict({f"v{i}": torch.randn(5 + i, generator=gen) for i in range(6)})
    q = ParamDict({k: torch.randn(v.shape, generator=gen) for k, v in p.items()})
    with CountOps() as mode:
        norm = p.norm()
    if strategy == "flattened":
        assert mode.ops == ["cat", "linalg_vector_norm"]
    torch.testing.assert_close(norm, _flat(p).norm())
    torch.testing.assert_close(p.norm(math.inf), _flat(p).abs().max())
    torch.testing.assert_close(p.dot(q), torch.dot(_flat(p), _flat(q)))
    torch.testing.assert_close(p.sum(), _flat(p).sum())
    assert p.isfinite()
    assert not (p | {"v3": torch.tensor([1.0, math.nan])}).isfinite()
