"""Tampered pickles never load as a ParamDict that disagrees with itself.

A ParamDict pickles as `(cls, (dict(p),))`: no state. Files built by hand with
extra slot state, `__new__` without `__init__`, bad keys or bad values are refused
by `torch.load(weights_only=True)` and by `pickle`; whatever does load is a
consistent ParamDict (its kept keys and values are exactly its entries).
"""

from __future__ import annotations

import contextlib
import copyreg
import io
import math
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from paramdict import ParamDict


@contextlib.contextmanager
def _forged(reduced: tuple[Any, ...]) -> Iterator[ParamDict]:
    """A ParamDict that pickles as `reduced` while the block runs."""
    original = ParamDict.__reduce__
    ParamDict.__reduce__ = lambda self: reduced  # type: ignore[method-assign]  # forging a file on purpose
    try:
        yield ParamDict()
    finally:
        ParamDict.__reduce__ = original  # type: ignore[method-assign]  # restored


_NEWOBJ: Any = vars(copyreg)["__newobj__"]  # what pickle calls for `cls.__new__`


def _torch_load(reduced: tuple[Any, ...]) -> Any:
    buf = io.BytesIO()
    with _forged(reduced) as p:
        torch.save(p, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _pickle_load(reduced: tuple[Any, ...]) -> Any:
    with _forged(reduced) as p:
        data = pickle.dumps(p)
    return pickle.loads(data)


LOADERS = pytest.mark.parametrize(
    "load", [_torch_load, _pickle_load], ids=["torch.load", "pickle"]
)


def consistent(q: object) -> None:
    """A loaded ParamDict's kept keys and values are exactly its entries."""
    assert isinstance(q, ParamDict)
    assert list(q._keys) == list(dict.keys(q))
    assert len(q._vals) == len(q)
    assert all(a is b for a, b in zip(q._vals, dict.values(q)))
    assert all(isinstance(k, str) for k in q)
    assert all(isinstance(v, torch.Tensor) for v in q.values())
    for key, value in q.items():  # what arithmetic computes is what indexing shows
        torch.testing.assert_close((q * 1)[key], value * 1, equal_nan=True)


def _ones() -> dict[str, torch.Tensor]:
    return {"w": torch.ones(2)}


_HIDDEN = torch.full((2,), 666.0)
_TAMPERED: dict[str, tuple[Callable[[], tuple[Any, ...]], str]] = {
    "slot state _vals": (
        lambda: (ParamDict, (_ones(),), (None, {"_vals": [_HIDDEN]})),
        "extra state",
    ),
    "slot state _keys": (
        lambda: (ParamDict, (_ones(),), (None, {"_keys": ("x",)})),
        "extra state",
    ),
    "slot state both": (
        lambda: (
            ParamDict,
            (_ones(),),
            (None, {"_keys": ("x",), "_vals": [_HIDDEN]}),
        ),
        "extra state",
    ),
    "dict state": (
        lambda: (ParamDict, (_ones(),), {"_vals": [_HIDDEN]}),
        "extra state",
    ),
    "state with entries": (
        lambda: (ParamDict, (_ones(),), ({"w": _HIDDEN}, None)),
        "extra state",
    ),
    "newobj with state": (
        lambda: (_NEWOBJ, (ParamDict,), (None, {"_vals": [_HIDDEN]})),
        "extra state|Unsupported|Can only",
    ),
    "newobj with items": (
        lambda: (_NEWOBJ, (ParamDict,), None, None, iter(_ones().items())),
        "immutable|SETITEM",
    ),
    "int key": (lambda: (ParamDict, ({1: torch.ones(2)},)), "keys must be str"),
    "None key": (lambda: (ParamDict, ({None: torch.ones(2)},)), "keys must be str"),
    "None value": (lambda: (ParamDict, ({"w": None},)), "'w': NoneType"),
    "int value": (lambda: (ParamDict, ({"w": 3},)), "'w': int"),
    "str value": (lambda: (ParamDict, ({"w": "x"},)), "'w': str"),
    "list value": (lambda: (ParamDict, ({"w": [1.0]},)), "'w': list"),
    "two dicts": (lambda: (ParamDict, (_ones(), _ones())), "positional argument"),
    "a list argument": (lambda: (ParamDict, ([1, 2],)), "mapping or an iterable"),
    "an int argument": (lambda: (ParamDict, (5,)), "mapping or an iterable"),
}


@LOADERS
@pytest.mark.parametrize("name", list(_TAMPERED))
def test_tampered_pickles_are_refused(load: Callable[..., Any], name: str) -> None:
    """Each tampered file raises, naming what is wrong."""
    build, match = _TAMPERED[name]
    with pytest.raises(Exception, match=match) as info:
        load(build())
    assert isinstance(info.value, TypeError | ValueError | pickle.UnpicklingError)


@LOADERS
def test_new_without_init_loads_as_an_empty_consistent_paramdict(
    load: Callable[..., Any],
) -> None:
    """`cls.__new__(cls)` alone gives an empty ParamDict that works."""
    q = load((_NEWOBJ, (ParamDict,)))
    consistent(q)
    assert q == ParamDict()
    assert (q * 2) == ParamDict()
    with pytest.raises(TypeError, match="immutable"):
        q.update(w=torch.ones(1))


@LOADERS
def test_a_genuine_file_round_trips(load: Callable[..., Any]) -> None:
    """The reduce tuple a ParamDict writes itself loads back equal and consistent."""
    p = ParamDict(w=torch.ones(2), b=torch.zeros(()))
    q = load(p.__reduce__())
    consistent(q)
    assert q == p
    assert list(q) == list(p)


def test_a_serialized_treespec_with_bad_keys_is_refused() -> None:
    """Tree specs read back from JSON must hold str keys, once each."""
    from torch.utils import _pytree as pytree

    p = ParamDict(w=torch.ones(1), b=torch.ones(1))
    spec = pytree.tree_structure(p)
    text = pytree.treespec_dumps(spec)
    assert pytree.treespec_loads(text) == spec
    for bad, error in (('["w", 1]', TypeError), ('["w", "w"]', ValueError)):
        forged = text.replace('["w", "b"]', bad)
        assert forged != text
        with pytest.raises(error, match="ParamDict treespec"):
            pytree.treespec_loads(forged)


_keys = st.one_of(st.text(max_size=3), st.integers(-2, 2), st.none())
_values = st.one_of(
    st.builds(torch.full, st.just((2,)), st.floats(-1e3, 1e3) | st.just(math.nan)),
    st.none(),
    st.integers(),
    st.lists(st.floats(allow_nan=False), max_size=2),
)
_slot_states = st.dictionaries(
    st.sampled_from(["_keys", "_vals", "other"]),
    st.one_of(
        st.lists(_values, max_size=3),
        st.tuples(st.text(max_size=2)),
        st.none(),
    ),
    max_size=3,
)


@given(
    entries=st.dictionaries(_keys, _values, max_size=3),
    slots=st.one_of(st.none(), _slot_states),
    new=st.booleans(),
    loader=st.sampled_from([_torch_load, _pickle_load]),
)
def test_whatever_loads_never_disagrees_with_itself(
    entries: dict[Any, Any],
    slots: dict[str, Any] | None,
    new: bool,
    loader: Callable[..., Any],
) -> None:
    """Random forged reduce tuples either raise or load consistently."""
    if new:
        reduced: tuple[Any, ...] = (_NEWOBJ, (ParamDict,))
    else:
        reduced = (ParamDict, (entries,))
    if slots is not None:
        reduced = (*reduced, (None, slots))
    try:
        q = loader(reduced)
    except (TypeError, ValueError, pickle.UnpicklingError):
        return
    consistent(q)
    if not new:
        assert slots is None or not slots  # any state at all is refused
        assert list(q) == list(entries)
