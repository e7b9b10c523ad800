import sys
from typing import Any

import pytest
import torch
from _helpers import MyParams
from torch import Tensor, nn

from paramdict import ParamDict


def _params(cls: type[ParamDict] = ParamDict) -> Any:
    gen = torch.Generator().manual_seed(0)
    return cls(
        w=torch.randn(3, 2, generator=gen),
        b=torch.randn(2, generator=gen),
        n=torch.tensor([1, 2, 3]),
    )


def _floats(cls: type[ParamDict] = ParamDict) -> Any:
    return _params(cls).exclude("n")


# ---------------------------------------------------------------- detach, clone, to


def test_detach_cuts_the_graph_and_shares_storage() -> None:
    """`detach` equals `Tensor.detach` per entry: same storage, no grad."""
    w = torch.ones(2, requires_grad=True)
    p = ParamDict(w=w * 2, b=w)
    out = p.detach()
    for k in p:
        assert not out[k].requires_grad
        assert out[k].data_ptr() == p[k].data_ptr()
        torch.testing.assert_close(out[k], p[k].detach())
    assert p["w"].requires_grad  # self unchanged


def test_clone_copies_and_stays_differentiable() -> None:
    """`clone` gives new storage with equal values, and gradients flow through it."""
    w = torch.ones(2, 2, requires_grad=True)
    p = ParamDict(w=w)
    out = p.clone()
    assert out["w"].data_ptr() != w.data_ptr()
    torch.testing.assert_close(out["w"], w.detach())
    (g,) = torch.autograd.grad(out["w"].sum() * 3, w)
    torch.testing.assert_close(g, torch.full((2, 2), 3.0))
    image = ParamDict(x=torch.ones(1, 3, 2, 2))
    last = image.clone(memory_format=torch.channels_last)["x"]
    assert last.is_contiguous(memory_format=torch.channels_last)


def test_to_takes_what_tensor_to_takes() -> None:
    """`to` applies `Tensor.to(*args, **kwargs)` to every entry, integers included."""
    p = _params()
    ref = torch.ones((), dtype=torch.float16)
    cases: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((torch.float64,), {}),
        (("cpu",), {"dtype": torch.float64}),
        ((), {"device": "meta"}),
        ((ref,), {}),
        ((torch.float32,), {"copy": True}),
    ]
    for args, kwargs in cases:
        out = p.to(*args, **kwargs)
        for k in p:
            want = p[k].to(*args, **kwargs)
            assert (out[k].dtype, out[k].device) == (want.dtype, want.device)
            if want.device.type == "cpu":
                torch.testing.assert_close(out[k], want)


def test_to_returns_matching_entries_as_they_are() -> None:
    """Like `Tensor.to`, an entry that already matches is not copied."""
    p = _params()
    out = p.to(torch.float32)
    assert out["w"] is p["w"]
    assert out["n"] is not p["n"]
    assert p.to(torch.float32, copy=True)["w"] is not p["w"]


def test_to_is_differentiable() -> None:
    """A dtype conversion keeps the graph, as `Tensor.to` does."""
    w = torch.ones(2, dtype=torch.float32, requires_grad=True)
    out = ParamDict(w=w).to(torch.float64)
    (g,) = torch.autograd.grad(out["w"].sum(), w)
    torch.testing.assert_close(g, torch.ones(2))


def test_to_names_the_entry_torch_refuses() -> None:
    """A conversion torch refuses is a ValueError naming the entry."""
    p = ParamDict(x=torch.ones(1, 2, 2, 2), y=torch.ones(2))
    with pytest.raises(ValueError, match=r"`to` failed for the entry 'y'"):
        p.to(memory_format=torch.channels_last)


# ---------------------------------------------------------------- requires_grad_


def test_requires_grad_sets_the_flag_in_place() -> None:
    """Like `Tensor.requires_grad_`, it sets flags in place and returns `self`."""
    p = _floats()
    before = dict(p)
    assert p.requires_grad_() is p
    assert all(v.requires_grad for v in p.values())
    assert all(p[k] is before[k] for k in p)
    assert p.requires_grad_(False) is p
    assert not any(v.requires_grad for v in p.values())


def test_requires_grad_freezes_a_module() -> None:
    """On `from_module` values it freezes and unfreezes the module's parameters."""
    model = nn.Linear(2, 2)
    ParamDict.from_module(model).requires_grad_(False)
    assert not any(q.requires_grad for q in model.parameters())
    ParamDict.from_module(model).select("bias").requires_grad_()
    assert [q.requires_grad for q in model.parameters()] == [False, True]


def test_requires_grad_fresh_leaves_recipe() -> None:
    """`detach().requires_grad_()` gives new leaves and leaves the originals alone."""
    p = _floats()
    leaves = p.detach().requires_grad_()
    assert all(v.is_leaf and v.requires_grad for v in leaves.values())
    assert not any(v.requires_grad for v in p.values())


def test_requires_grad_refuses_integers_without_changing_anything() -> None:
    """An integer entry cannot require grad: ValueError naming it, no flag changed."""
    p = _params()
    with pytest.raises(
        ValueError, match=r"cannot set the flag on \['n'\]: only floating"
    ):
        p.requires_grad_()
    assert not any(v.requires_grad for v in p.values())


def test_requires_grad_false_refuses_non_leaves() -> None:
    """A non-leaf cannot stop requiring grad: ValueError naming it, nothing changed."""
    w = torch.ones(2, requires_grad=True)
    p = ParamDict(w=w, twice=w * 2)
    with pytest.raises(
        ValueError, match=r"\['twice'\]: they are results of operations"
    ):
        p.requires_grad_(False)
    assert w.requires_grad
    assert p.requires_grad_() is p  # already requiring grad: fine


# ---------------------------------------------------------------- *_like


@pytest.mark.parametrize(
    ("name", "ref"),
    [
        ("zeros_like", torch.zeros_like),
        ("ones_like", torch.ones_like),
        ("empty_like", torch.empty_like),
    ],
)
def test_like_constructors_match_torch(name: str, ref: Any) -> None:
    """Each `*_like` gives torch's result per entry, with its options."""
    p = _params()
    options: list[dict[str, Any]] = [{}, {"dtype": torch.float64}, {"device": "meta"}]
    for kwargs in options:
        out = getattr(p, name)(**kwargs)
        assert list(out) == list(p)
        for k in p:
            want = ref(p[k], **kwargs)
            assert (out[k].shape, out[k].dtype) == (want.shape, want.dtype)
            assert out[k].device == want.device
            if name != "empty_like" and want.device.type == "cpu":
                torch.testing.assert_close(out[k], want)
    grads = getattr(_floats(), name)(requires_grad=True)
    assert all(v.requires_grad and v.is_leaf for v in grads.values())


def test_full_like_matches_torch() -> None:
    """`full_like` fills every entry with the number."""
    p = _params()
    out = p.full_like(3)
    for k in p:
        torch.testing.assert_close(out[k], torch.full_like(p[k], 3))
    out = p.full_like(0.25, dtype=torch.float64)
    torch.testing.assert_close(out["n"], torch.full((3,), 0.25, dtype=torch.float64))
    with pytest.raises(TypeError, match="takes a number as `fill_value`, got Tensor"):
        p.full_like(torch.tensor(1.0))


def test_randn_like_follows_the_generator_in_key_order() -> None:
    """A seeded `randn_like` equals `torch.randn` drawn in key order."""
    p = _floats()
    out = p.randn_like(generator=torch.Generator().manual_seed(3))
    gen = torch.Generator().manual_seed(3)
    for k in p:
        expected = torch.randn(p[k].shape, dtype=p[k].dtype, generator=gen)
        torch.testing.assert_close(out[k], expected, rtol=0, atol=0)
    assert p.randn_like(dtype=torch.float64)["w"].dtype == torch.float64


def test_randn_like_names_integer_entries() -> None:
    """Normal samples cannot be integers: ValueError naming the entry."""
    with pytest.raises(ValueError, match=r"`randn_like` failed for the entry 'n'"):
        _params().randn_like()


def test_per_tensor_methods_keep_the_subclass_and_leave_self_alone() -> None:
    """Each method returns the subclass; `self`'s tensors are unchanged."""
    p = _floats(MyParams)
    snapshot = {k: v.clone() for k, v in p.items()}
    outs = [
        p.detach(),
        p.clone(),
        p.to(torch.float64),
        p.zeros_like(),
        p.ones_like(),
        p.full_like(2.0),
        p.randn_like(),
        p.empty_like(),
        p.map(torch.tanh),
        p.requires_grad_(False),
    ]
    assert all(type(out) is MyParams for out in outs)
    assert all(torch.equal(p[k], snapshot[k]) for k in p)


# ---------------------------------------------------------------- map


def test_map_applies_fn_with_matching_values() -> None:
    """`map(fn, *others)` calls `fn(value, *others[key])` in key order."""
    p = _floats()
    q = {k: v + 1 for k, v in reversed(list(p.items()))}
    seen: list[tuple[int, ...]] = []

    def fn(v: Tensor, a: Tensor, b: Tensor) -> Tensor:
        seen.append(tuple(v.shape))
        return torch.addcmul(v, a, b)

    out = p.map(fn, q, ParamDict(q))
    assert seen == [(3, 2), (2,)]
    for k in p:
        torch.testing.assert_close(out[k], torch.addcmul(p[k], q[k], q[k]))
    assert list(p.map(torch.tanh)) == ["w", "b"]


def test_map_refuses_non_tensor_results() -> None:
    """`map` names the entries whose result is not a tensor and points elsewhere."""
    p = _floats()
    with pytest.raises(
        TypeError, match=r"got 'b': float, 'w': float\. Use `map_to_dict`"
    ):
        p.map(lambda v: v.sum().item())


def test_map_key_mismatch() -> None:
    """An `others` mapping with other keys is a ValueError naming them."""
    with pytest.raises(ValueError, match=r"Keys differ in `map`: missing \['b'\]"):
        _floats().map(torch.add, {"w": torch.ones(3, 2)})


def test_map_errors_propagate_unchanged() -> None:
    """An exception from `fn` propagates as it is (with a note naming the entry)."""
    p = _floats()
    with pytest.raises(RuntimeError, match="size of tensor") as info:
        p.map(torch.add, {"w": torch.ones(3, 2), "b": torch.ones(5)})
    if sys.version_info >= (3, 11):
        assert info.value.__notes__ == ["(raised by `map` for the entry 'b')"]


def test_map_to_dict_collects_anything() -> None:
    """`map_to_dict` returns a plain dict of whatever `fn` returns, in key order."""
    p = _params()
    out = p.map_to_dict(lambda v, o: (tuple(v.shape), o), {"n": 1, "b": 2, "w": 3})
    assert type(out) is dict
    assert out == {"w": ((3, 2), 3), "b": ((2,), 2), "n": ((3,), 1)}
    norms = p.exclude("n").map_to_dict(torch.linalg.vector_norm)
    torch.testing.assert_close(norms["w"], p["w"].norm())
