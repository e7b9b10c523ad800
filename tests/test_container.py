import collections.abc
import copy
from typing import Any, cast

import pytest
import torch
from _helpers import MyParams

from paramdict import ParamDict


def _p() -> ParamDict:
    return ParamDict(w=torch.tensor([1.0, 2.0]), b=torch.tensor(3.0))


def test_construct_from_mapping_pairs_and_kwargs_keeps_order() -> None:
    """Mappings, pairs and keyword arguments all build, in insertion order."""
    w, b, c = torch.zeros(2), torch.ones(1), torch.full((3,), 2.0)
    assert list(ParamDict({"w": w, "b": b})) == ["w", "b"]
    assert list(ParamDict([("b", b), ("w", w)])) == ["b", "w"]
    p = ParamDict({"w": w}, c=c, b=b)
    assert list(p) == ["w", "c", "b"]
    assert p["w"] is w
    assert p["c"] is c
    assert len(ParamDict()) == 0


def test_values_can_be_parameters() -> None:
    """`nn.Parameter` values are stored as they are."""
    w = torch.nn.Parameter(torch.zeros(2))
    assert ParamDict(w=w)["w"] is w


def test_non_str_key_is_type_error_naming_key() -> None:
    """A non-str key raises TypeError naming it."""
    with pytest.raises(TypeError, match=r"keys must be str, got 3"):
        ParamDict(cast(Any, {3: torch.zeros(1)}))


def test_non_tensor_value_is_type_error_naming_keys() -> None:
    """Non-tensor values raise TypeError naming each offending key, sorted."""
    with pytest.raises(TypeError, match=r"'a': float, 'z': list"):
        ParamDict(z=[1.0], ok=torch.zeros(1), a=1.0)  # type: ignore[arg-type]  # under test


def test_mapping_protocol() -> None:
    """Indexing, len, iteration, views, `in` and `dict(p)` behave like a dict."""
    p = _p()
    assert isinstance(p, collections.abc.Mapping)
    assert isinstance(p, dict)
    assert len(p) == 2
    assert list(p.keys()) == ["w", "b"]
    assert [k for k, _ in p.items()] == ["w", "b"]
    assert p.values() is not None
    assert "w" in p
    assert "x" not in p
    assert p.get("x") is None
    d = dict(p)
    assert type(d) is dict
    assert d["w"] is p["w"]
    with pytest.raises(KeyError, match="x"):
        p["x"]


@pytest.mark.parametrize(
    ("action", "match"),
    [
        (lambda p: p.__setitem__("w", torch.zeros(2)), r"p \| \{key: value\}"),
        (lambda p: p.__delitem__("w"), r"exclude"),
        (lambda p: p.update(w=torch.zeros(2)), r"would change \['w'\]"),
        (lambda p: p.update({"new": torch.zeros(2)}), r"would change \['new'\]"),
        (lambda p: p.pop("w"), r"`pop` is not supported"),
        (lambda p: p.popitem(), r"`popitem` is not supported"),
        (lambda p: p.clear(), r"`clear` is not supported"),
        (lambda p: p.setdefault("x", torch.zeros(1)), r"`setdefault`"),
        (lambda p: p.__ior__({"w": torch.zeros(2)}), r"p = p \| other"),
        (lambda p: p.__init__({"w": torch.zeros(2)}), r"immutable"),
    ],
)
def test_every_mutation_is_refused(action, match) -> None:  # type: ignore[no-untyped-def]  # parametrized callables
    """Each mutating method raises TypeError and leaves the ParamDict as it was."""
    p = _p()
    before = dict(p)
    with pytest.raises(TypeError, match=match):
        action(p)
    assert dict(p) == before
    assert list(p) == ["w", "b"]


def test_inplace_union_statement_is_refused() -> None:
    """`p |= other` raises and the name still refers to the unchanged ParamDict."""
    p = _p()
    original = p
    with pytest.raises(TypeError, match="immutable"):
        p |= {"w": torch.zeros(2)}
    assert p is original
    assert torch.equal(p["w"], torch.tensor([1.0, 2.0]))


def test_update_with_the_same_objects_is_a_no_op() -> None:
    """`update` writing back the stored objects succeeds and changes nothing."""
    p = _p()
    p.update({"w": p["w"]}, b=p["b"])
    assert p == _p()


def test_union_returns_new_paramdict() -> None:
    """`p | other` and `other | p` return new ParamDicts; right-hand side wins."""
    p = _p()
    new_w = torch.zeros(2)
    q = p | {"w": new_w, "c": torch.ones(1)}
    assert type(q) is ParamDict
    assert list(q) == ["w", "b", "c"]
    assert q["w"] is new_w
    r = {"w": new_w, "c": torch.ones(1)} | p
    assert type(r) is ParamDict
    assert list(r) == ["w", "c", "b"]
    assert r["w"] is p["w"]
    assert p == _p()
    with pytest.raises(TypeError, match=r"values must be torch\.Tensor"):
        p | {"c": 1.0}


def test_equality_is_keywise_torch_equal_and_order_insensitive() -> None:
    """`==` compares keys and exact values, ignores order, is never elementwise."""
    p = _p()
    same = ParamDict(b=torch.tensor(3.0), w=torch.tensor([1.0, 2.0]))
    assert p == same
    assert p == dict(same)
    assert not (p != same)  # noqa: SIM202  # `__ne__` is under test
    assert p != ParamDict(w=torch.tensor([1.0, 2.5]), b=torch.tensor(3.0))
    assert p != ParamDict(
        w=torch.tensor([1.0, 2.0]), b=torch.tensor(3.0, dtype=torch.float64)
    )
    assert p != ParamDict(w=torch.tensor([[1.0, 2.0]]), b=torch.tensor(3.0))
    assert p != ParamDict(w=torch.tensor([1.0, 2.0]))
    assert p != {"w": torch.tensor([1.0, 2.0]), "b": 3.0}
    assert (p == 3) is False
    assert isinstance(p == same, bool)


def test_allclose() -> None:
    """`allclose` uses tolerances and rejects different keys."""
    p = _p()
    q = p + 1e-7
    assert p.allclose(q)
    assert not p.allclose(q, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        p.allclose({"w": torch.zeros(2)})


def test_repr_lists_entries_and_totals() -> None:
    """The repr shows one line per entry with shape, dtype, device and grad state."""
    w = torch.zeros(40, 1, requires_grad=True)
    p = ParamDict(w=w, y=w * 2, b=torch.zeros(3, dtype=torch.float64))
    text = repr(p)
    assert text.startswith("ParamDict(  # 3 entries, 83 elements")
    assert "'w': float32[40, 1] cpu requires_grad," in text
    assert "'y': float32[40, 1] cpu grad_fn=MulBackward0," in text
    assert "'b': float64[3] cpu," in text
    assert repr(ParamDict()) == "ParamDict()"


def test_repr_abbreviates_long_dicts() -> None:
    """Long ParamDicts show the first and last entries and how many are hidden."""
    p = ParamDict({f"k{i}": torch.zeros(1) for i in range(100)})
    text = repr(p)
    assert "... 85 more entries ..." in text
    assert "'k0'" in text
    assert "'k99'" in text
    assert "'k50'" not in text
    assert len(text.splitlines()) < 20


def test_subclass_keeps_type_through_construction_and_copy() -> None:
    """A subclass survives constructors, `|`, copy and fromkeys."""
    p = MyParams(w=torch.zeros(2))
    assert type(p | {"b": torch.zeros(1)}) is MyParams
    assert type(p.copy()) is MyParams
    assert type(copy.copy(p)) is MyParams
    assert type(MyParams.fromkeys(["a", "b"], torch.zeros(1))) is MyParams
    assert "MyParams(" in repr(p)


def test_copy_is_shallow() -> None:
    """`copy()` shares the tensor objects and is a distinct ParamDict."""
    p = _p()
    q = p.copy()
    assert q is not p
    assert q["w"] is p["w"]
    assert type(q) is ParamDict


def test_every_way_of_building_keeps_the_value_order_in_step() -> None:
    """The values kept in key order for the kernels match the mapping, every path.

    ParamDict hands the foreach kernels a list of its values kept beside the dict;
    whichever way a ParamDict is built, that list must be exactly its values.
    """
    import io
    import pickle

    import torch.utils._pytree as pytree

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3)).eval()
    p = ParamDict.from_module(model).detach().requires_grad_()
    x = torch.randn(4, 2)
    loss = p.call(model, x).sum()
    buf = io.BytesIO()
    torch.save(p.detach(), buf)
    buf.seek(0)
    stacked = ParamDict.stack([p.detach(), p.detach() * 2])
    built: dict[str, ParamDict] = {
        "init": ParamDict(a=torch.ones(1), b=torch.zeros(2)),
        "subclass": MyParams(a=torch.ones(1)),
        "from_module": p,
        "buffers": ParamDict.from_module(model, buffers=True),
        "copy": p.copy(),
        "copy.copy": copy.copy(p),
        "deepcopy": copy.deepcopy(p),
        "pickle": pickle.loads(pickle.dumps(p.detach())),
        "torch.load": torch.load(buf, weights_only=True),
        "union": p | {"0.bias": torch.zeros(3)},
        "reflected union": {"extra": torch.zeros(1)} | p,
        "fromkeys": ParamDict.fromkeys(p, torch.zeros(())),
        "select": p.select("*.weight"),
        "exclude": p.exclude("*.weight"),
        "scoped": p.scoped("0"),
        "prefixed": p.prefixed("net"),
        "grad": p.grad(loss, retain_graph=True),
        "grad unused": (p | {"extra": torch.ones(1, requires_grad=True)}).grad(
            loss, allow_unused=True
        ),
        "tree_map": pytree.tree_map(lambda t: t * 2, p),
        "func.grad": torch.func.grad(lambda q: q.call(model, x).sum())(p.detach()),
        "vmap": torch.func.vmap(lambda q: q * 2)(stacked),
        "stack": stacked,
        "unstack": stacked.unstack()[1],
        "from_vector": ParamDict.from_vector(p.to_vector(), like=p),
        "map": p.map(torch.neg),
        "operator": p - 0.1 * p,
        "fused": p.sub(p, alpha=0.5),
        "norm clip": p.clip_norm(0.1),
        "to": p.to(torch.float64),
        "detach": p.detach(),
    }
    for how, q in built.items():
        assert len(q._vals) == len(q), how
        assert all(a is b for a, b in zip(q._vals, q.values())), how
