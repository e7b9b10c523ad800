import copy
import io
import pickle

import pytest
import torch
from _helpers import MyParams
from _torch_versions import ONE_GRAPH
from hypothesis import given
from hypothesis import strategies as st
from torch.utils import _pytree as pytree

from paramdict import ParamDict


def _p() -> ParamDict:
    return ParamDict(w=torch.randn(3, 2), b=torch.randn(2), s=torch.tensor(1.5))


_keys = st.lists(st.text(min_size=1, max_size=6), min_size=0, max_size=6, unique=True)


@given(_keys, st.integers(0, 3))
def test_flatten_unflatten_round_trip(keys: list[str], size: int) -> None:
    """Flattening gives the values in key order; unflattening restores type and keys."""
    p = ParamDict({k: torch.full((size,), float(i)) for i, k in enumerate(keys)})
    leaves, spec = pytree.tree_flatten(p)
    assert len(leaves) == len(keys)
    assert all(a is b for a, b in zip(leaves, p.values()))
    back = pytree.tree_unflatten(leaves, spec)
    assert type(back) is ParamDict
    assert list(back) == keys
    assert back == p


def test_key_paths_are_mapping_keys() -> None:
    """`tree_flatten_with_path` names each leaf by its key."""
    p = _p()
    paths, _ = pytree.tree_flatten_with_path({"params": p})
    assert [pytree.keystr(path) for path, _ in paths] == [
        "['params']['w']",
        "['params']['b']",
        "['params']['s']",
    ]


def test_treespec_serializes_with_type_name() -> None:
    """The treespec round-trips through `treespec_dumps` under `paramdict.ParamDict`."""
    _, spec = pytree.tree_flatten(_p())
    dumped = pytree.treespec_dumps(spec)
    assert "paramdict._paramdict.ParamDict" in dumped
    assert pytree.treespec_loads(dumped) == spec


def test_unflatten_accepts_non_tensor_leaves() -> None:
    """`tree_map` may produce non-tensor leaves (torch.func's `in_dims`)."""
    dims = pytree.tree_map(lambda _: 0, _p())
    assert type(dims) is ParamDict
    assert dict(dims) == {"w": 0, "b": 0, "s": 0}


def test_tree_map_keeps_subclass() -> None:
    """A subclass is its own registered node and survives `tree_map`."""
    p = MyParams(w=torch.ones(2))
    out = pytree.tree_map(lambda v: v * 2, p)
    assert type(out) is MyParams
    torch.testing.assert_close(out["w"], torch.full((2,), 2.0))


def test_func_grad_returns_paramdict() -> None:
    """`torch.func.grad` over a ParamDict argument returns a ParamDict."""
    p = ParamDict(
        w=torch.randn(3, dtype=torch.float64), b=torch.randn((), dtype=torch.float64)
    )
    x = torch.randn(4, 3, dtype=torch.float64)

    def loss(q: ParamDict) -> torch.Tensor:
        return torch.tanh(x @ q["w"] + q["b"]).sum()

    g = torch.func.grad(loss)(p)
    assert type(g) is ParamDict
    ref = ParamDict({k: v.requires_grad_() for k, v in p.items()})
    expected = ref.grad(loss(ref))
    assert g.allclose(expected, rtol=1e-12, atol=1e-12)


def test_vmap_over_stacked_paramdict() -> None:
    """`torch.func.vmap` maps over a ParamDict of stacked tensors, in and out."""
    stacked = ParamDict(w=torch.randn(5, 3), b=torch.randn(5))
    x = torch.randn(3)

    def f(q: ParamDict) -> ParamDict:
        return q * (q["w"] @ x + q["b"])

    out = torch.func.vmap(f)(stacked)
    assert type(out) is ParamDict
    for i in range(5):
        row = ParamDict(w=stacked["w"][i], b=stacked["b"][i])
        expected = f(row)
        torch.testing.assert_close(out["w"][i], expected["w"])
        torch.testing.assert_close(out["b"][i], expected["b"])


def _step(p: ParamDict, g: ParamDict, lr: float) -> ParamDict:
    q = ParamDict({"w": p["w"] * 2, "b": p["b"]})
    return abs(q - lr * g) / 2 + (q * g) ** 2 - (1 - q)


@ONE_GRAPH
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_builds_and_combines_paramdicts(backend: str) -> None:
    """Building ParamDicts and doing arithmetic compiles with no graph break."""
    torch._dynamo.reset()
    p = ParamDict(w=torch.randn(3), b=torch.randn(2))
    g = ParamDict(w=torch.randn(3), b=torch.randn(2))
    compiled = torch.compile(_step, fullgraph=True, backend=backend)
    out = compiled(p, g, 0.1)
    assert type(out) is ParamDict
    assert out.allclose(_step(p, g, 0.1))
    explanation = torch._dynamo.explain(_step)(p, g, 0.1)
    assert explanation.graph_break_count == 0


def test_compile_matches_eager_on_every_torch() -> None:
    """`torch.compile` without `fullgraph` gives the eager result on every torch."""
    torch._dynamo.reset()
    p = ParamDict(w=torch.randn(3), b=torch.randn(2))
    g = ParamDict(w=torch.randn(3), b=torch.randn(2))
    out = torch.compile(_step, backend="aot_eager")(p, g, 0.1)
    assert type(out) is ParamDict
    assert list(out) == ["w", "b"]
    assert out.allclose(_step(p, g, 0.1))


def test_pickle_and_deepcopy_round_trip() -> None:
    """`pickle` and `deepcopy` give an equal ParamDict with the same order and type."""
    p = MyParams(z=torch.randn(2), a=torch.randn(3, dtype=torch.float64))
    for back in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p)):
        assert type(back) is MyParams
        assert list(back) == ["z", "a"]
        assert back == p
        assert back["z"] is not p["z"]


def test_deepcopy_keeps_parameters_and_sharing() -> None:
    """`deepcopy` copies Parameters as Parameters and keeps shared tensors shared."""
    w = torch.nn.Parameter(torch.randn(2))
    p = ParamDict(a=w, b=w)
    back = copy.deepcopy(p)
    assert isinstance(back["a"], torch.nn.Parameter)
    assert back["a"] is back["b"]


def test_torch_save_load_weights_only() -> None:
    """`torch.save` then `torch.load(weights_only=True)` restores the ParamDict."""
    p = ParamDict(z=torch.randn(2), a=torch.arange(3))
    buf = io.BytesIO()
    torch.save({"params": p, "step": 3}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    assert type(back["params"]) is ParamDict
    assert list(back["params"]) == ["z", "a"]
    assert back["params"] == p


def test_torch_load_weights_only_subclass() -> None:
    """A user subclass is registered as a safe global when it is defined."""
    p = MyParams(w=torch.randn(2))
    buf = io.BytesIO()
    torch.save(p, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    assert type(back) is MyParams
    assert back == p


def test_unpickling_validates() -> None:
    """A pickle whose payload is not str -> Tensor is rejected with TypeError."""
    forged = pickle.dumps((ParamDict, ({"w": 1.0},)))
    func, args = pickle.loads(forged)
    with pytest.raises(TypeError, match=r"'w': float"):
        func(*args)


def test_inner_step_arithmetic_under_vmap_matches_loop() -> None:
    """A batched MAML inner step (`torch.func.grad` inside `vmap`) equals a loop."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
    ).double()
    params = ParamDict({k: v.detach() for k, v in model.named_parameters()})
    xs = torch.randn(4, 5, 1, dtype=torch.float64)
    ys = torch.sin(xs)

    def inner_loss(p: ParamDict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = p.call(model, x)
        return ((out - y) ** 2).mean()

    def adapt(x: torch.Tensor, y: torch.Tensor) -> ParamDict:
        g: ParamDict = torch.func.grad(inner_loss)(params, x, y)
        return params.sub(g, alpha=0.1) * 1.0 - 0.0 * abs(g)

    batched = torch.func.vmap(adapt)(xs, ys)
    assert type(batched) is ParamDict
    for i in range(4):
        looped = adapt(xs[i], ys[i])
        for k in params:
            torch.testing.assert_close(batched[k][i], looped[k])
