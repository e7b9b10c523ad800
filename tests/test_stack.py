import pytest
import torch
from _helpers import MyParams
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from paramdict import ParamDict


def _models(n: int) -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)) for _ in range(n)
    ]


def test_stack_matches_torch_stack_per_key() -> None:
    """Entry `k` of the result is `torch.stack([d[k] for d in ds])`."""
    members = [ParamDict.from_module(m) for m in _models(3)]
    reordered = {k: members[2][k] for k in reversed(list(members[2]))}
    stacked = ParamDict.stack([members[0], dict(members[1]), reordered])
    assert type(stacked) is ParamDict
    assert list(stacked) == list(members[0])
    for k in stacked:
        want = torch.stack([members[0][k], members[1][k], members[2][k]])
        torch.testing.assert_close(stacked[k], want)


def test_stack_agrees_with_stack_module_state() -> None:
    """The values equal `torch.func.stack_module_state`'s parameters."""
    models = _models(3)
    stacked = ParamDict.stack(ParamDict.from_module(m) for m in models)
    params, _ = torch.func.stack_module_state(models)
    assert list(stacked) == list(params)
    for k in params:
        torch.testing.assert_close(stacked[k], params[k])


def test_vmap_runs_the_ensemble() -> None:
    """`vmap(lambda q: q.call(model, x))(stacked)` equals running each model."""
    models = _models(4)
    x = torch.randn(5, 3)
    stacked = ParamDict.stack(ParamDict.from_module(m) for m in models)
    out = torch.func.vmap(lambda q: q.call(models[0], x))(stacked)
    want = torch.stack([m(x) for m in models])
    torch.testing.assert_close(out, want)


def test_vmap_ensemble_gradients_reach_each_member() -> None:
    """`stack` is differentiable: each member gets its own model's gradient."""
    models = _models(2)
    x = torch.randn(5, 3)
    members = [ParamDict.from_module(m) for m in models]
    stacked = ParamDict.stack(members)
    loss = torch.func.vmap(lambda q: q.call(models[0], x))(stacked).pow(2).sum()
    grads = [m.grad(loss, retain_graph=True) for m in members]
    for model, g in zip(models, grads):
        params = ParamDict.from_module(model)
        want = params.grad(model(x).pow(2).sum())
        assert g.allclose(want, rtol=1e-5, atol=1e-6)


def test_unstack_inverts_stack() -> None:
    """`unstack` gives back the members, as views into the stacked values."""
    members = [ParamDict.from_module(m).detach() for m in _models(3)]
    stacked = MyParams.stack(members)
    assert type(stacked) is MyParams
    back = stacked.unstack()
    assert len(back) == 3
    for got, want in zip(back, members):
        assert type(got) is MyParams
        assert got == want
        assert got["0.weight"].data_ptr() >= stacked["0.weight"].data_ptr()
        assert got["0.weight"]._base is stacked["0.weight"]


def test_stack_errors_name_what_differs() -> None:
    """Key, shape and dtype differences are ValueErrors naming position or key."""
    a = ParamDict(w=torch.ones(2), b=torch.ones(1))
    with pytest.raises(ValueError, match=r"position 1\): missing \['b'\], unexpected"):
        ParamDict.stack([a, {"w": torch.ones(2), "c": torch.ones(1)}])
    with pytest.raises(ValueError, match=r"'w' has float32\[2\] cpu, float32\[3\] cpu"):
        ParamDict.stack([a, {"w": torch.ones(3), "b": torch.ones(1)}])
    with pytest.raises(ValueError, match=r"'b' has float32\[1\] cpu, float64\[1\] cpu"):
        ParamDict.stack(
            [a, {"w": torch.ones(2), "b": torch.ones(1, dtype=torch.float64)}]
        )
    with pytest.raises(ValueError, match="at least one mapping"):
        ParamDict.stack([])
    with pytest.raises(TypeError, match="got list at position 1"):
        ParamDict.stack([a, [torch.ones(2)]])  # type: ignore[list-item]  # the wrong kind on purpose
    with pytest.raises(TypeError, match="'w' is not always one"):
        ParamDict.stack([a, {"w": 1.0, "b": torch.ones(1)}])  # type: ignore[dict-item]  # the wrong kind on purpose


def test_unstack_errors() -> None:
    """Empty, 0-dim and ragged ParamDicts cannot be unstacked."""
    with pytest.raises(ValueError, match="cannot tell how many"):
        ParamDict().unstack()
    with pytest.raises(ValueError, match=r"\['s'\] are 0-dim"):
        ParamDict(w=torch.ones(2), s=torch.ones(())).unstack()
    with pytest.raises(ValueError, match=r"got 'a': 3, 'w': 2"):
        ParamDict(w=torch.ones(2), a=torch.ones(3, 1)).unstack()


_shapes = st.lists(st.integers(1, 3), max_size=2)


@given(
    st.integers(1, 4),
    st.dictionaries(st.sampled_from("abcd"), _shapes, min_size=1, max_size=3),
    st.integers(0, 2**16),
)
def test_stack_unstack_round_trip(
    n: int, spec: dict[str, list[int]], seed: int
) -> None:
    """`stack(ds).unstack() == ds` and `stack(p.unstack()) == p`, inputs untouched."""
    gen = torch.Generator().manual_seed(seed)
    members = [
        ParamDict({k: torch.randn(shape, generator=gen) for k, shape in spec.items()})
        for _ in range(n)
    ]
    snapshot = [m.clone() for m in members]
    stacked = ParamDict.stack(members)
    assert stacked.unstack() == members
    assert ParamDict.stack(stacked.unstack()) == stacked
    assert members == snapshot
